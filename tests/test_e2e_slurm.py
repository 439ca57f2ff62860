"""End to end on the real dev cluster: hpcsub -> batch-size change -> shrink -> grow -> done.

The job's own records (``--hpcsched-record-samples``) prove that every sample of every epoch was
processed exactly once, which configuration was in force after each generation, that the loss
fell, and that the shrink happened in place (same Slurm run and the same worker processes, on
the first node only) while the grow requeued.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import pytest

from hpcsched import slurm
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from tests.conftest import EXAMPLE, cli, paced, unpace, wait_for
from tests.jobrecords import check_exactly_once, epochs_trained, generations, load_records, mean_loss_by_step

DIGITS = 1797
EPOCHS = 60

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _ack(jd: JobDir, generation: int, state: str = "applied"):
    a = ctl.read_ack(jd.ack_path, jd.uid)
    return a if a is not None and a.generation == generation and a.state == state else None


def test_submit_batch_change_shrink_grow_finish(devcluster, control_dir, tmp_path, slurm_jobs):
    out = cli("hpcsub", "-N", "2", "--gres=gpu:2", f"--output={tmp_path}/slurm-%j.out",
              "--hpcsched-min-nodes", "1", "--hpcsched-max-nodes", "3",
              "--hpcsched-batch-size", "64", "--hpcsched-min-batch-size", "32",
              "--hpcsched-max-batch-size", "192", "--hpcsched-record-samples",
              *paced(tmp_path / "unpaced"), "--epochs", str(EPOCHS), "--min-step-time", "0.02",
              cwd=tmp_path)
    assert out.stdout.startswith("Submitted batch job "), out.stdout
    job_id = out.stdout.split()[-1]
    slurm_jobs.append(job_id)
    jd = JobDir.for_job(job_id)
    log = tmp_path / f"slurm-{job_id}.out"

    def job_log():
        return log.read_text() if log.exists() else "(no output yet)"

    wait_for(lambda: _ack(jd, 0), 120, f"job {job_id} to start training\n{job_log()}")
    assert slurm.job_info(job_id).node_count == 2

    # 1. batch size only: in place, at the next step boundary
    r = cli("hpcsched", "resize", job_id, "--batch-size", "128", "--reason", "test: batch")
    assert "generation 1 in force" in r.stdout, r.stdout
    a1 = _ack(jd, 1)
    assert (a1.world_size, a1.global_batch_size, a1.local_batch_size) == (4, 128, 32)

    # 2. shrink to 1 node: in place, no requeue
    r = cli("hpcsched", "resize", job_id, "--nodes", "1", "--reason", "test: shrink")
    assert "generation 2 in force" in r.stdout, r.stdout
    info = slurm.job_info(job_id)
    assert (info.state, info.node_count, info.restarts) == ("RUNNING", 1, 0)
    assert (_ack(jd, 2).world_size, _ack(jd, 2).global_batch_size) == (2, 128)

    # 3. grow to 3 nodes: checkpoint, requeue, resume at the new size
    r = cli("hpcsched", "resize", job_id, "--gpus", "6", "--reason", "test: grow")
    assert "generation 3 in force" in r.stdout, r.stdout
    info = slurm.job_info(job_id)
    assert (info.state, info.node_count, info.restarts) == ("RUNNING", 3, 1)
    assert _ack(jd, 3).world_size == 6

    status = json.loads(cli("hpcsched", "status", "--json").stdout)
    (row,) = [j for j in status["jobs"] if j["job_id"] == job_id]
    assert (row["generation"], row["gpus"], row["last_reason"]) == (3, 6, "test: grow")

    unpace(tmp_path / "unpaced")   # all resizes seen: the remaining epochs are only a margin
    final = wait_for(lambda: (i := slurm.job_info(job_id)) and i.state in
                     ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") and i, 300,
                     f"job {job_id} to finish\n{job_log()}", interval=0.5)
    assert final.state == "COMPLETED", job_log()
    assert '"final_loss"' in job_log()

    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, epochs := epochs_trained(recs, EPOCHS))
    gens = generations(recs)
    assert gens == {
        0: dict(world_size=4, global_batch_size=64, local_batch_size=16, accumulation_steps=1),
        1: dict(world_size=4, global_batch_size=128, local_batch_size=32, accumulation_steps=1),
        2: dict(world_size=2, global_batch_size=128, local_batch_size=64, accumulation_steps=1),
        3: dict(world_size=6, global_batch_size=126, local_batch_size=21, accumulation_steps=1),
    }
    runs = {g: {(r["launch"], r["restart"]) for r in recs if r["generation"] == g} for g in gens}
    assert runs[0] == runs[1] == {(1, 0)}, "the batch-size change restarted the workers"
    assert runs[2] == {(1, 0)}, "the shrink restarted the workers or requeued the job"
    assert runs[3] == {(2, 1)}, "the grow did not go through a requeue"
    # the shrink kept the allocation's first node, where rank 0 ran (Slurm picks the nodes:
    # n1 when it is idle, another while a node of the test before is still completing)
    first = {r["device"]["node"] for r in recs if r["generation"] == 0 and r["rank"] == 0}
    assert len(first) == 1
    assert {r["device"]["node"] for r in recs if r["generation"] == 2} == first
    assert {r["rank"] for r in recs if r["generation"] == 2} == {0, 1}
    nodes_seen = {r["device"]["node"] for r in recs if r["generation"] == 3}
    assert len(nodes_seen) == 3
    losses = mean_loss_by_step(recs)
    assert sum(losses[-20:]) / 20 < 0.25 * sum(losses[:20]) / 20

    status = json.loads(cli("hpcsched", "status", "--json", job_id).stdout)
    (row,) = status["jobs"]
    assert row["state"] == "COMPLETED" and row["samples_processed"] == DIGITS * epochs


def test_unmodified_torch_distributed_script_runs_and_is_not_resized(devcluster, control_dir,
                                                                     tmp_path, slurm_jobs):
    """A script that reads only the torch.distributed environment runs under hpcsub (one
    process per GPU slot over 2 nodes); hpcsched refuses to resize it, with the reason."""
    script = EXAMPLE.parent / "plain_ddp.py"
    out = cli("hpcsub", "--parsable", "-N", "2", "--gres=gpu:2", f"--output={tmp_path}/o-%j.out",
              "--hpcsched-max-nodes", "3", str(script), cwd=tmp_path)
    job_id = out.stdout.strip()
    slurm_jobs.append(job_id)
    running = wait_for(lambda: (i := slurm.job_info(job_id)) and i.state != "PENDING" and i, 60,
                       "the job to start")
    if running.state == "RUNNING":
        r = cli("hpcsched", "resize", job_id, "--batch-size", "64", check=False)
        assert r.returncode == 2 and "does not use hpcsched.elastic" in r.stderr, r.stderr
    final = wait_for(lambda: (i := slurm.job_info(job_id)) and i.state not in
                     ("PENDING", "RUNNING", "COMPLETING") and i, 120, "the job to finish",
                     interval=0.5)
    text = (tmp_path / f"o-{job_id}.out").read_text()
    assert final.state == "COMPLETED", text
    lines = [ln for ln in text.splitlines() if ln.startswith("rank ")]
    assert sorted(ln.split()[1] for ln in lines) == ["0/4", "1/4", "2/4", "3/4"], text
    assert all("in_sync=True" in ln for ln in lines)
    # two nodes, two ranks each; which two depends on what the test before left completing
    per_node = Counter(ln.split()[2] for ln in lines)
    assert sorted(per_node.values()) == [2, 2], text


def test_pending_job_resized_before_it_starts(devcluster, control_dir, tmp_path, slurm_jobs):
    """A pending 2-node job set to 1 node (and its batch) before it starts runs on 1 node with
    that configuration. Slurm 22.05 needs NumCPUs with the shrink, or the job stays pending
    forever with BadConstraints."""
    out = cli("hpcsub", "--parsable", "--hold", "-N", "2", "--gres=gpu:2",
              f"--output={tmp_path}/o-%j.out", "--hpcsched-batch-size", "64",
              "--hpcsched-max-batch-size", "128", str(EXAMPLE), "--epochs", "2", cwd=tmp_path)
    job_id = out.stdout.strip()
    slurm_jobs.append(job_id)
    r = cli("hpcsched", "resize", job_id, "--nodes", "1", "--batch-size", "128")
    assert "pending: 2 -> 1 node(s)" in r.stdout, r.stdout
    subprocess.run(["scontrol", "release", job_id], check=True)
    final = wait_for(lambda: (i := slurm.job_info(job_id)) and not i.active and i, 120,
                     "the job to run and finish", interval=0.5)
    text = (tmp_path / f"o-{job_id}.out").read_text()
    assert final.state == "COMPLETED" and final.node_count == 1, text
    a = ctl.read_ack(JobDir.for_job(job_id).ack_path)
    assert (a.generation, a.nodes, a.global_batch_size) == (1, 1, 128)


def test_a_job_started_at_its_fewest_gpus_takes_a_batch_change(devcluster, control_dir,
                                                               tmp_path, slurm_jobs):
    """A job asking 4 GPUs per node that the daemon starts at its fewest (1 GPU: the start a
    round journals for ``jct``, ``realise.start``) runs 1 worker; a batch change then reaches it
    as a ``continue`` of world size 1 and is applied in place (the demo had it rejected:
    'continue' asks for world size 4 but the job runs 1 workers)."""
    import time

    from hpcsched.daemon.actuator import Actuator, Timeouts
    from hpcsched.daemon.phases import Action, History
    from hpcsched.protocol.kinds import ChangeKind
    from hpcsched.slurm.control import CLISlurmControl

    out = cli("hpcsub", "--parsable", "--hold", "-N", "1", "--gres=gpu:4",
              "--hpcsched-min-gpus", "1", f"--output={tmp_path}/o-%j.out",
              "--hpcsched-batch-size", "64", "--hpcsched-max-batch-size", "256",
              "--hpcsched-record-samples", *paced(tmp_path / "unpaced"), "--epochs", "30",
              "--min-step-time", "0.05", cwd=tmp_path)
    job_id = out.stdout.strip()
    slurm_jobs.append(job_id)
    jd = JobDir.for_job(job_id)
    start = Action(job_id, ChangeKind.PENDING, 1, 1, 64, 0, "test: start at 1 GPU", "test",
                   ("n1:1",))
    Actuator(CLISlurmControl(), Timeouts()).advance(start, History.begin(time.time()), jd,
                                                    jd.read_spec(), slurm.job_info(job_id))
    subprocess.run(["scontrol", "release", job_id], check=True)
    first = wait_for(lambda: _ack(jd, 1), 120, f"job {job_id} to start at generation 1")
    assert (first.world_size, slurm.job_info(job_id).gpus_per_node) == (1, 1), first
    r = cli("hpcsched", "resize", job_id, "--batch-size", "128", "--reason", "test: batch")
    assert "1 GPUs on n1:1" in r.stdout and "generation 2 in force" in r.stdout, r.stdout
    second = ctl.read_ack(jd.ack_path, jd.uid)
    assert (second.generation, second.state, second.world_size, second.global_batch_size) == \
        (2, "applied", 1, 128), second
    unpace(tmp_path / "unpaced")
    final = wait_for(lambda: (i := slurm.job_info(job_id)) and not i.active and i, 300,
                     f"job {job_id} to finish", interval=0.5)
    assert final.state == "COMPLETED", (tmp_path / f"o-{job_id}.out").read_text()[-2000:]
    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, epochs_trained(recs, 30))
