"""The DDP classifier example (ElasticDataLoader + ElasticDDP, made from a torchrun script by
the diff in docs/training-api.md) on the real dev cluster: grown, moved and shrunk through
extension allocations without restarting a worker, every sample of every epoch processed
exactly once, from the job's own records (``--hpcsched-record-samples``).

Written with issue 14 by a helper that could not run Slurm tests: first run by the coordinator.
"""

from __future__ import annotations

import json

import pytest

from hpcsched import slurm
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from tests.conftest import ROOT, cli, wait_for
from tests.jobrecords import check_exactly_once, generations, load_records

EXAMPLE = ROOT / "jobscripts" / "examples" / "ddp_classifier.py"
DIGITS = 1797
EPOCHS = 60

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_the_ddp_example_grows_moves_and_shrinks_without_restarting_a_worker(
        devcluster, control_dir, tmp_path, slurm_jobs):
    out = cli("hpcsub", "--parsable", "-N", "1", "-w", "n1", "--gres=gpu:2",
              "--hpcsched-min-gpus", "2", f"--output={tmp_path}/slurm-%j.out",
              "--hpcsched-max-nodes", "4", "--hpcsched-batch-size", "64",
              "--hpcsched-max-batch-size", "512", "--hpcsched-record-samples", str(EXAMPLE),
              "--epochs", str(EPOCHS), "--batch-time", "0.03", "--workers", "1", cwd=tmp_path)
    job_id = out.stdout.strip()
    slurm_jobs.append(job_id)
    jd = JobDir.for_job(job_id)
    wait_for(lambda: jd.ack_path.exists(), 120, f"job {job_id} to start training")

    steps = [("n1:2,n2:2", 4), ("n1:2,n3:2", 4), ("n1:2", 2)]   # grow, move, shrink
    for generation, (layout, gpus) in enumerate(steps, start=1):
        out = cli("hpcsched", "resize", job_id, "--layout", layout, "--reason", f"test: {layout}")
        assert f"generation {generation} in force" in out.stdout, out.stdout
        ack = ctl.read_ack(jd.ack_path, jd.uid)
        assert (ack.generation, ack.state, ack.world_size) == (generation, "applied", gpus), ack
        assert "no worker restarted" in ack.message, ack.message

    log = tmp_path / f"slurm-{job_id}.out"
    final = wait_for(lambda: (i := slurm.job_info(job_id)) and not i.active and i, 600,
                     f"job {job_id} to finish\n{log.read_text() if log.exists() else ''}",
                     interval=0.5)
    assert final.state == "COMPLETED"
    assert '"final_loss"' in log.read_text()

    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, EPOCHS)
    assert [g["world_size"] for g in generations(recs).values()] == [2, 4, 4, 2]
    for f in jd.metrics_dir.iterdir():   # one process per file: no resize restarted a worker
        pids = {json.loads(line)["pid"] for line in f.read_text().splitlines()}
        assert len(pids) == 1, (f.name, pids)
    nodes = {(r["generation"], r["device"]["node"]) for r in recs}
    assert {(1, "n2"), (2, "n3"), (3, "n1")} <= nodes
    assert not any(n != "n1" for g, n in nodes if g == 3)
    assert all(r["grad_sqr"] is not None for r in recs if r["step"] > 50)   # the comm hook's
