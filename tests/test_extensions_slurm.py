"""Extension allocations on the real dev cluster (issue 10): a job grows onto GPUs another job
half-uses without restarting a worker, shrinks and moves in place, survives a cancelled
extension, and is refused cleanly when an extension cannot start.

The job's own records (``--hpcsched-record-samples``) prove that every sample of every epoch was
processed exactly once; their ``pid`` fields, that no worker was restarted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.protocol import files as ctl
from hpcsched.protocol.extensions import parse_extension_comment, read_extensions
from hpcsched.protocol.jobdir import JobDir
from hpcsched.slurm.devcluster.base import LEND_QOS
from tests.conftest import cli, paced, unpace, wait_for
from tests.jobrecords import (
    check_exactly_once,
    check_positions_exactly_once,
    epochs_trained,
    generations,
    load_records,
    mean_loss_by_step,
)

DIGITS = 1797
# Training lengths keep a margin for a loaded machine: the suite runs four dev clusters side by
# side on 2 cores (tools/test.sh), where a grow took several times as long and shorter jobs
# ended before their resize applied. Once a test has seen what it checks while the job runs, it
# ends the job with the epoch in progress (conftest.unpace): the margin costs nothing.
#: the job whose extension is cancelled: 60 x 1.45 s of training, which outlasts the grow and
#: the fault timeout that finds the lost workers
EPOCHS_LOST = 60
#: the job whose extension Slurm preempts: outlasts the grow (about 3 s) and the preemption
EPOCHS_PREEMPTED = 30

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _hold(tmp_path, slurm_jobs, node: str, gpus: int) -> str:
    """A plain job holding ``gpus`` GPUs of ``node`` for the test."""
    out = subprocess.run(["sbatch", "--parsable", "-w", node, f"--gres=gpu:{gpus}",
                          f"--output={tmp_path}/hold-{node}.out", "--wrap", "sleep 900"],
                         capture_output=True, text=True, check=True)
    job = out.stdout.strip()
    slurm_jobs.append(job)
    wait_for(lambda: (i := slurm.job_info(job)) and i.state == "RUNNING", 60, f"the job on {node}")
    return job


def _submit(tmp_path, slurm_jobs, epochs: int, env=None,
            minimum=("--hpcsched-min-nodes", "1")) -> tuple[str, JobDir]:
    out = cli("hpcsub", "--parsable", "-N", "1", "-w", "n1", "--gres=gpu:4", *minimum,
              f"--output={tmp_path}/slurm-%j.out",
              "--hpcsched-max-nodes", "4", "--hpcsched-batch-size", "64",
              "--hpcsched-max-batch-size", "512", "--hpcsched-record-samples",
              *paced(tmp_path / "unpaced"), "--epochs", str(epochs), "--min-step-time", "0.05",
              cwd=tmp_path, env=env)
    job_id = out.stdout.strip()
    slurm_jobs.append(job_id)
    jd = JobDir.for_job(job_id)
    wait_for(lambda: jd.ack_path.exists(), 120, f"job {job_id} to start training")
    return job_id, jd


def _layout(job_id: str, layout: str, reason: str) -> str:
    return cli("hpcsched", "resize", job_id, "--layout", layout, "--reason", reason).stdout


def _extensions(jd: JobDir):
    return read_extensions(jd.extensions_path, jd.uid).extensions


def _finish(job_id: str, tmp_path) -> slurm.JobInfo:
    log = tmp_path / f"slurm-{job_id}.out"
    return wait_for(lambda: (i := slurm.job_info(job_id)) and not i.active and i, 300,
                    f"job {job_id} to finish\n{log.read_text() if log.exists() else ''}",
                    interval=0.5)


def _kill_workers(job_id: str, node: str) -> None:
    """``SIGKILL`` the tasks of ``job_id``'s step 0 on ``node``, as a lost node does (every
    Slurm cancel sends ``SIGTERM`` first: scancel(1))."""
    out = subprocess.run(["scontrol", "listpids", job_id, node], capture_output=True, text=True,
                         check=True).stdout
    pids = [int(f[0]) for f in (ln.split() for ln in out.splitlines()[1:])
            if len(f) >= 3 and f[2] == "0" and f[3] != "-"]
    assert pids, out
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def _none_active(jd: JobDir) -> bool:
    jobs = slurm.squeue()
    return not [e.job_id for e in _extensions(jd) if e.job_id in jobs and jobs[e.job_id].active]


def test_grow_onto_a_shared_node_then_grow_shrink_and_move_without_restarting_a_worker(
        devcluster, control_dir, tmp_path, slurm_jobs):
    """Issue 10's sequence: 4 GPUs of n1, grown to 6 on a node another job half-uses, to 8,
    extensions shrunk and moved in place, then shrunk to 2 and moved to another node, which
    gives back GPUs of the primary job: by requeue (Slurm cannot release part of a running
    job's GRES), the extensions ending with it."""
    _hold(tmp_path, slurm_jobs, "n2", 2)               # n2: 2 of its 4 GPUs taken
    job_id, jd = _submit(tmp_path, slurm_jobs, epochs=120, minimum=("--hpcsched-min-gpus", "2"))

    steps = [("n1:4,n2:2", 6), ("n1:4,n2:2,n3:2", 8), ("n1:4,n3:2", 6), ("n1:4,n4:2", 6),
             ("n1:2", 2), ("n3:2", 2)]
    for generation, (layout, gpus) in enumerate(steps, start=1):
        out = _layout(job_id, layout, f"test: {layout}")
        assert f"generation {generation} in force" in out, out
        ack = ctl.read_ack(jd.ack_path, jd.uid)
        assert (ack.generation, ack.state, ack.world_size) == (generation, "applied", gpus), ack
        if generation <= 4:
            assert "no worker restarted" in ack.message
        else:
            assert "by requeue" in out
            assert slurm.job_info(job_id).restarts == generation - 4
        if generation == 1:   # the extension is the user's job, named and tagged as such
            (ext,) = _extensions(jd)
            info = slurm.job_info(ext.job_id)
            assert (ext.node, ext.gpus, info.state, info.user) == ("n2", 2, "RUNNING", "root")
            assert info.name.endswith("+ext")
            assert parse_extension_comment(info.comment) == (job_id, jd.uid, 1)

    unpace(tmp_path / "unpaced")
    final = _finish(job_id, tmp_path)
    assert final.state == "COMPLETED"
    wait_for(lambda: _none_active(jd), 30, "every extension job to end")
    states = [e.state for e in _extensions(jd)]
    assert states == ["released"] * 3, states   # n2, n3, n4 (the move): all given back

    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, epochs_trained(recs, 120))
    assert [g["world_size"] for g in generations(recs).values()] == [4, 6, 8, 6, 6, 2, 2]
    files = sorted(p.name for p in jd.metrics_dir.iterdir())
    assert [f for f in files if "-ext-" not in f] == (
        [f"launch-1-rank-{r}.jsonl" for r in range(4)] + ["launch-2-rank-0.jsonl",
                                                          "launch-2-rank-1.jsonl",
                                                          "launch-3-rank-0.jsonl",
                                                          "launch-3-rank-1.jsonl"])
    for f in files:   # one process per file: no grow, shrink or move in place restarted one
        pids = {json.loads(line)["pid"] for line in (jd.metrics_dir / f).read_text().splitlines()}
        assert len(pids) == 1, (f, pids)
    by_node_gen = {(r["generation"], r["device"]["node"]) for r in recs}
    assert {(1, "n2"), (2, "n3"), (3, "n3"), (4, "n4"), (5, "n1"), (6, "n3")} <= by_node_gen
    assert not any(n == "n2" for g, n in by_node_gen if g >= 3)   # n2 released at 3
    assert {n for g, n in by_node_gen if g == 6} == {"n3"}
    losses = mean_loss_by_step(recs)
    assert losses[-1] < losses[0] / 10


def test_a_killed_extension_is_a_shrink_the_job_did_not_ask_for(
        devcluster, control_dir, tmp_path, slurm_jobs):
    """Its workers killed without warning (``SIGKILL``, as when its node is lost; a plain
    ``scancel`` sends ``SIGTERM`` first, and they leave at a step boundary, as when preempted):
    the survivors find them lost and go on without them."""
    job_id, jd = _submit(tmp_path, slurm_jobs, epochs=EPOCHS_LOST)
    out = _layout(job_id, "n1:4,n2:2", "test: grow")
    assert "generation 1 in force" in out, out
    (ext,) = _extensions(jd)
    time.sleep(1.0)
    cancelled = time.time()
    _kill_workers(ext.job_id, ext.node)
    ack = wait_for(lambda: (a := ctl.read_ack(jd.ack_path, jd.uid)) and a.world_size == 4
                   and "lost" in a.message and a, 60, "the job to go on without the extension")
    assert ack.time - cancelled < 60
    assert ack.layout == {}   # the primary's GPUs only

    unpace(tmp_path / "unpaced")
    assert _finish(job_id, tmp_path).state == "COMPLETED"
    (ext,) = _extensions(jd)
    assert ext.state == "lost"
    recs = load_records(jd.path)
    check_positions_exactly_once(recs, DIGITS, epochs_trained(recs, EPOCHS_LOST))
    assert _none_active(jd)


def test_an_extension_slurm_preempts_leaves_at_a_step_boundary(
        plugins, control_dir, tmp_path, slurm_jobs):
    """The site puts extension jobs in a preemptible QOS (the plugin's ``extension_qos``);
    another job that needs the lent GPUs starts at once: Slurm preempts the extension, whose
    workers leave at the next step boundary (no voided step, no sample lost)."""
    plugins(f"extension_qos = {LEND_QOS}\n")
    job_id, jd = _submit(tmp_path, slurm_jobs, epochs=EPOCHS_PREEMPTED)
    out = _layout(job_id, "n1:4,n2:2", "test: grow")
    assert "generation 1 in force" in out, out
    (ext,) = _extensions(jd)
    assert slurm.job_info(ext.job_id).qos == LEND_QOS
    time.sleep(1.0)
    submitted = time.time()
    plain = subprocess.run(["sbatch", "--parsable", "-w", "n2", "--gres=gpu:4",
                            f"--output={tmp_path}/plain.out", "--wrap", "sleep 2"],
                           capture_output=True, text=True, check=True).stdout.strip()
    slurm_jobs.append(plain)
    wait_for(lambda: (i := slurm.job_info(plain)) and i.state in ("RUNNING", "COMPLETED"), 60,
             "the other job to start on the lent GPUs")
    waited = time.time() - submitted
    ack = wait_for(lambda: (a := ctl.read_ack(jd.ack_path, jd.uid)) and a.world_size == 4
                   and "Slurm ended their job" in a.message and a, 30, "the job to go on without it")
    print(f"the other job started {waited:.1f} s after its submission; {ack.message}")
    assert waited < 10, waited
    assert ack.layout == {} and ack.generation == 1

    unpace(tmp_path / "unpaced")
    assert _finish(job_id, tmp_path).state == "COMPLETED"
    (ext,) = _extensions(jd)
    assert ext.state == "released" and "SIGTERM: preempted or cancelled" in ext.reason, ext
    assert "collective failed" not in (tmp_path / f"slurm-{job_id}.out").read_text()  # not void
    recs = load_records(jd.path)
    check_positions_exactly_once(recs, DIGITS, epochs_trained(recs, EPOCHS_PREEMPTED))
    assert _none_active(jd)


def _ext_log(jd: JobDir, job_id: str) -> str:
    path = jd.extensions_dir / f"slurm-{job_id}.out"
    return path.read_text() if path.exists() else ""


def test_an_extension_slurm_ends_while_its_workers_join_joins_then_leaves(
        devcluster, control_dir, tmp_path, slurm_jobs):
    """Slurm ends an extension (preemption, ``scancel``: ``SIGTERM``) after its workers have
    told rank 0 they are ready, before the grow's form is entered. They join, then leave at
    the form's first step boundary: the grow's other newcomers and the job go on, and nobody
    waits the fault timeout for workers that left (seen in the QOS replay: a form waited 30 s
    and lost all four newcomers of a grow). n3 is held so that n2's newcomers wait."""
    holder = _hold(tmp_path, slurm_jobs, "n3", 4)
    job_id, jd = _submit(tmp_path, slurm_jobs, epochs=EPOCHS_PREEMPTED,
                         env={**os.environ, "HPCSCHED_EXTENSION_BLOCKED": "600",
                              "HPCSCHED_LOG_LEVEL": "info"})      # the workers' info lines
    resize = subprocess.Popen(
        [str(Path(sys.executable).parent / "hpcsched"), "resize", job_id,
         "--layout", "n1:4,n2:2,n3:1", "--reason", "test: grow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    n2 = wait_for(lambda: jd.extensions_path.exists() and [
        e for e in _extensions(jd) if e.node == "n2"], 60, "n2's extension")[0]
    wait_for(lambda: _ext_log(jd, n2.job_id).count("waiting for rank 0's invitation") == 2, 120,
             "n2's newcomers to be ready")
    subprocess.run(["scancel", "--signal=TERM", n2.job_id], check=True)   # its workers only
    time.sleep(2)   # delivered; Python runs the handler once the wait for the invitation returns
    subprocess.run(["scancel", holder], check=True)        # n3's extension may start now
    out, err = resize.communicate(timeout=300)
    assert resize.returncode == 0 and "generation 1 in force" in out, (out, err)
    ack = wait_for(lambda: (a := ctl.read_ack(jd.ack_path, jd.uid)) and a.world_size == 5
                   and "Slurm ended their job" in a.message and a, 60, "n2's workers to leave")
    assert ack.layout == {"n1": 4, "n3": 1} and ack.generation == 1, ack
    unpace(tmp_path / "unpaced")
    assert _finish(job_id, tmp_path).state == "COMPLETED"
    log = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert "did not form" not in log and "lost" not in log, log
    by_node = {e.node: e for e in _extensions(jd)}
    assert by_node["n2"].state == "released" and "SIGTERM" in by_node["n2"].reason, by_node
    n2_log = _ext_log(jd, n2.job_id)
    assert n2_log.count("SIGTERM while joining") == 2 and n2_log.count("joined generation 1") == 2
    recs = load_records(jd.path)
    check_positions_exactly_once(recs, DIGITS, epochs_trained(recs, EPOCHS_PREEMPTED))
    assert _none_active(jd)


@pytest.mark.parametrize("rule", ["timeout", "deadline", "blocked"])
def test_an_extension_that_cannot_start_is_reported_and_the_job_keeps_its_size(
        devcluster, control_dir, tmp_path, slurm_jobs, rule):
    """``timeout``: the extension did not start in time (Slurm's reason is reported);
    ``deadline``: nor before hpcsched's deadline for an answer (the control's ``ack_by``,
    here ``resize --timeout 26``), long before the job's own timeout: the job answers with
    Slurm's reason rather than hpcsched timing it out without one;
    ``blocked``: it pends on a node another job holds, found by the job at once (the grow's
    other extension, on n3, would otherwise hold its GPU idle until the timeout; its
    newcomer, ready and waiting to join, leaves as soon as rank 0 calls the grow off)."""
    _hold(tmp_path, slurm_jobs, "n2", 4)               # n2 full: the extension must wait
    env = {**os.environ, **{
        "timeout": {"HPCSCHED_EXTENSION_TIMEOUT": "6", "HPCSCHED_EXTENSION_BLOCKED": "600"},
        "deadline": {"HPCSCHED_EXTENSION_BLOCKED": "600"},
        "blocked": {"HPCSCHED_EXTENSION_BLOCKED": "15", "HPCSCHED_LOG_LEVEL": "info"}}[rule]}
    job_id, jd = _submit(tmp_path, slurm_jobs, epochs=20, env=env)
    layout = "n1:4,n2:2,n3:1" if rule == "blocked" else "n1:4,n2:2"
    timeout = ["--timeout", "26"] if rule == "deadline" else []
    r = cli("hpcsched", "resize", job_id, "--layout", layout, *timeout, check=False)
    assert r.returncode == 1 and "rejected generation 1" in r.stderr, r.stderr
    if rule == "timeout":
        assert "did not start within 6 s" in r.stderr, r.stderr
        assert "Resources" in r.stderr      # Slurm's reason for the pending extension
    elif rule == "deadline":
        assert "by when hpcsched needs the job's answer" in r.stderr, r.stderr
        assert "Resources" in r.stderr and "did not acknowledge" not in r.stderr, r.stderr
    else:
        assert "cannot start: n2 has 0 free GPU(s), it needs 2" in r.stderr, r.stderr
    assert {e.state for e in _extensions(jd)} == {"refused"}, _extensions(jd)
    wait_for(lambda: _none_active(jd), 30, "the refused extensions to be cancelled")
    if rule == "blocked":
        (n3,) = [e for e in _extensions(jd) if e.node == "n3"]
        assert "the grow of generation 1 was given up; this worker leaves" in _ext_log(jd, n3.job_id)
    status = json.loads(cli("hpcsched", "status", "--json").stdout)
    (row,) = [j for j in status["jobs"] if j["job_id"] == job_id]
    assert row["gpus"] == 4
    unpace(tmp_path / "unpaced")
    assert _finish(job_id, tmp_path).state == "COMPLETED"
    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, epochs_trained(recs, 20))


def test_cancelling_the_primary_ends_its_extensions(devcluster, control_dir, tmp_path,
                                                     slurm_jobs):
    job_id, jd = _submit(tmp_path, slurm_jobs, epochs=200)
    out = _layout(job_id, "n1:4,n2:2,n3:1", "test: grow")
    assert "generation 1 in force" in out, out
    assert len(_extensions(jd)) == 2 and not _none_active(jd)
    subprocess.run(["scancel", job_id], check=True)
    wait_for(lambda: _none_active(jd), 60, "the extensions to end with their primary")
