"""Preemption by the daemon on the real dev cluster, and the guard that needs no daemon.

A running elastic job is given 0 GPUs by the plan: the daemon checkpoints it, requeues it and
sets its begin time to ``daemon.preemption_deadline`` seconds ahead (``StartTime=now+<s>``). In
the first test a later plan gives it GPUs again and the daemon releases it (``StartTime=now``);
in the second no daemon round comes after the preemption (the daemon is gone), and Slurm itself
starts the job once its begin time passes. Either way the job finishes and its own records show
every sample of every epoch processed exactly once (``tests/jobrecords.py``).

The policy is scripted (a fixed number of nodes for the job, set by the test), so the test does
not depend on a policy's model; the rest of the round is the daemon's own: the view builder
(the held job is eligible and ``held``), reconcile with the daemon's costs (a plan's 0 nodes is
a ``preempt``, a held job's nodes a ``pending`` release) and the actuator.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import replace

import pytest

from hpcsched import slurm
from hpcsched.daemon.config import load
from hpcsched.daemon.phases import PATHS
from hpcsched.daemon.round import Daemon
from hpcsched.daemon.store import Store
from hpcsched.model.snapshot import JobTarget, Plan
from hpcsched.policies.base import PolicyBase
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import ChangeKind
from tests.conftest import EXAMPLE, paced, submit, unpace, wait_for
from tests.jobrecords import check_exactly_once, epochs_trained, load_records

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

DIGITS = 1797
EPOCHS = 25     # 29 steps of 0.05 s per epoch: about 36 s of training
# A job that runs again after its preemption has shown what the test checks while it runs: it
# ends with its epoch in progress (conftest.unpace).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


class Scripted(PolicyBase):
    """A policy giving job ``job_id`` ``nodes`` nodes at batch 64 (the test sets ``nodes``);
    every snapshot it is shown is kept."""

    name = "scripted"

    def __init__(self, job_id: str, nodes: int = 1):
        self.job_id, self.nodes = job_id, nodes
        self.seen = []

    def decide(self, snapshot, seed=0):
        self.seen.append(snapshot)
        return Plan(self.name, (JobTarget(self.job_id, self.nodes, 64, f"test: {self.nodes} node(s)"),))


def _ack(jd: JobDir):
    return ctl.read_ack(jd.ack_path, jd.uid)


def _begin_time(job_id: str) -> str:
    """squeue's begin time of a pending job (``%S``), as Slurm prints it."""
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%S"], capture_output=True,
                          text=True, timeout=60).stdout.strip()


def _daemon(deadline: float) -> tuple[Daemon, Store]:
    settings = load()
    settings = replace(settings, daemon=replace(settings.daemon, preemption_deadline=deadline))
    store = Store(settings.daemon.database_url)
    store.upgrade()
    return Daemon(settings, store=store), store


def _start(tmp_path, slurm_jobs) -> tuple[str, JobDir]:
    job = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-batch-size", "64",
                 *paced(tmp_path / "unpaced"), "--epochs", str(EPOCHS), "--min-step-time", "0.05")
    slurm_jobs.append(job)
    jd = JobDir.for_job(job)
    wait_for(lambda: (a := _ack(jd)) and a.state == "applied", 240, f"job {job} to report",
             interval=1)
    wait_for(lambda: sum(1 for r in load_records(jd.path) if r["rank"] == 0) > 20, 240,
             f"job {job} to take some steps", interval=1)
    return job, jd


def _preempt(daemon: Daemon, store: Store, job: str) -> None:
    """Rounds 1 s apart until the daemon's preemption of ``job`` is in force (held)."""
    daemon.policy.nodes = 0
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        rep = daemon.round()
        assert rep.error is None, rep.error
        assert not any(str(o).startswith("failed") for o in rep.outcomes.values()), rep.outcomes
        acts = store.actions(job)
        if acts and acts[0].kind == "preempt" and acts[0].phase == "running":
            return
        time.sleep(1.0)
    pytest.fail(f"job {job} not preempted in 300 s: {store.actions(job)}")


def _finish(job: str, jd: JobDir, tmp_path) -> list[dict]:
    final = wait_for(lambda: (i := slurm.job_info(job)) and i.state in ENDED and i, 600,
                     f"job {job} to finish", interval=1)
    log = tmp_path / f"slurm-{job}.out"
    assert final.state == "COMPLETED", log.read_text() if log.exists() else final
    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, epochs_trained(recs, EPOCHS))
    return recs


def test_daemon_preempts_a_running_job_and_resumes_it(daemon_env, devcluster, slurm_jobs,
                                                      tmp_path):
    job, jd = _start(tmp_path, slurm_jobs)
    daemon, store = _daemon(deadline=900)
    daemon.policy = policy = Scripted(job)
    assert daemon.costs.preemption

    t0 = time.time()
    _preempt(daemon, store, job)
    (pre,) = store.actions(job)
    assert tuple(p for p, _ in pre.history) == PATHS[ChangeKind.PREEMPT]
    info = slurm.job_info(job)
    assert (info.state, info.restarts) == ("PENDING", 1), info
    c = ctl.read_control(jd.control_path, jd.uid)
    assert (c.generation, c.action, c.nodes) == (1, "checkpoint-and-requeue", 1)
    assert _ack(jd).state == "checkpointed"
    # the begin time is the guard: 900 s ahead of the hold (squeue prints local time)
    begin = time.mktime(time.strptime(_begin_time(job), "%Y-%m-%dT%H:%M:%S"))
    held_at = dict(pre.history)["running"]
    assert 890 <= begin - held_at <= 910, (begin, held_at)

    # rounds that still give it 0 GPUs leave it held: in the snapshot, pending, not busy
    for _ in range(3):
        time.sleep(1.0)
        assert daemon.round().error is None
    assert len(store.actions(job)) == 1 and slurm.job_info(job).state == "PENDING"
    views = [s.job(job) for s in policy.seen[-3:]]
    assert all(v is not None and v.held and v.state == "PENDING" and not v.busy for v in views)

    # a plan gives it GPUs again: released at once (its generation, then StartTime=now)
    policy.nodes = 1
    released = time.monotonic()
    while time.monotonic() - released < 300:
        rep = daemon.round()
        assert rep.error is None and not any(
            str(o).startswith("failed") for o in rep.outcomes.values()), rep
        if store.actions(job)[0].phase == "running" and store.actions(job)[0].kind == "pending":
            break
        time.sleep(1.0)
    rel = store.actions(job)[0]
    assert (rel.kind, tuple(p for p, _ in rel.history)) == ("pending", PATHS[ChangeKind.PENDING])
    running = wait_for(lambda: (i := slurm.job_info(job)) and i.state != "PENDING" and i, 120,
                       "the released job to start", interval=0.5)
    print(f"preempted and held {held_at - t0:.1f} s after the decision; running again "
          f"{time.monotonic() - released:.1f} s after the plan released it")
    assert running.restarts == 1, "released, not requeued again"
    a = wait_for(lambda: (x := _ack(jd)) and x.generation == 2 and x.state == "applied" and x,
                 240, "the released job to apply generation 2", interval=0.5)
    assert a.world_size == 2

    unpace(tmp_path / "unpaced")
    recs = _finish(job, jd, tmp_path)
    assert {r["restart"] for r in recs if r["generation"] == 0} == {0}
    assert {r["restart"] for r in recs if r["generation"] == 2} == {1}
    assert not [r for r in recs if r["generation"] == 1], "nothing trained at the preemption's generation"


def test_guard_starts_a_held_job_when_no_daemon_is_left(daemon_env, devcluster, slurm_jobs,
                                                         tmp_path):
    hold = 20.0
    job, jd = _start(tmp_path, slurm_jobs)
    daemon, store = _daemon(deadline=hold)
    daemon.policy = Scripted(job)
    _preempt(daemon, store, job)
    held_at = dict(store.actions(job)[0].history)["running"]
    store.close()
    del daemon   # the daemon is gone: no round will ever release the job

    info = slurm.job_info(job)
    assert (info.state, info.restarts) == ("PENDING", 1), info
    # Slurm starts it itself once the begin time has passed, at its next scheduling pass
    # (sched_interval 60 s, bf_interval 30 s by default)
    started = wait_for(lambda: (i := slurm.job_info(job)) and i.state != "PENDING" and i,
                       hold + 120, "Slurm to start the held job by itself", interval=0.5)
    waited = time.time() - held_at
    print(f"held {waited:.1f} s with a {hold:.0f} s deadline: Slurm started it "
          f"{waited - hold:.1f} s after its begin time")
    assert started.restarts == 1 and waited >= hold - 1.5, waited
    a = wait_for(lambda: (x := _ack(jd)) and x.state == "applied" and x.generation == 1 and x,
                 240, "the job to resume at the preemption's generation", interval=0.5)
    assert a.world_size == 2

    unpace(tmp_path / "unpaced")
    recs = _finish(job, jd, tmp_path)
    assert {r["restart"] for r in recs if r["generation"] == 1} == {1}


def test_tiresias_preempts_a_job_for_a_newer_one_and_resumes_it(daemon_env, devcluster,
                                                                slurm_jobs, tmp_path):
    """Tiresias itself (2D-LAS, Gu et al., NSDI'19) decides: with 4 GPUs left by an unmanaged
    job, A (4 GPUs) runs until it has attained more than the first queue's 20 GPU-seconds; B (4
    GPUs) then arrives in the top queue, so A is preempted for B, held, and released when B has
    finished. Both finish with every sample exactly once."""
    from hpcsched.policies import make_policy

    filler = subprocess.run(["sbatch", "--parsable", "-N3", "--gres=gpu:4", "-w", "n[2-4]",
                             f"--output={tmp_path}/filler.out", "--wrap", "sleep 900"],
                            capture_output=True, text=True, check=True).stdout.strip()
    slurm_jobs.append(filler)
    wait_for(lambda: (i := slurm.job_info(filler)) and i.state == "RUNNING", 120,
             "the unmanaged job holding n[2-4]", interval=0.5)
    a = submit(tmp_path, "-N", "1", "--gres=gpu:4", "--hpcsched-batch-size", "64",
               *paced(tmp_path / "unpaced"), "--epochs", str(EPOCHS), "--min-step-time", "0.05")
    slurm_jobs.append(a)
    jd_a = JobDir.for_job(a)
    wait_for(lambda: (x := _ack(jd_a)) and x.state == "applied", 240, "job A to report",
             interval=1)
    daemon, store = _daemon(deadline=900)
    daemon.policy = make_policy("tiresias", {"queue_thresholds": [20.0]})
    # A's service grows past the first queue (its measured steps reach the store by ingest)
    wait_for(lambda: daemon.round().error is None and any(
        p.steps * p.step_time * p.world_size > 20.0 for p in store.profile(a)) or None, 300,
        "job A to attain 20 GPU-seconds", interval=1)
    b = submit(tmp_path, "-N", "1", "--gres=gpu:4", "--hpcsched-batch-size", "64",
               str(EXAMPLE), "--epochs", "6", "--min-step-time", "0.05")
    slurm_jobs.append(b)
    wait_for(lambda: (i := slurm.job_info(b)) and i.state == "PENDING", 60, "B to wait")

    phases = []
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        rep = daemon.round()
        assert rep.error is None, rep.error
        assert not any(str(o).startswith("failed") for o in rep.outcomes.values()), rep.outcomes
        kinds = [(x.kind, x.phase) for x in store.actions(a)]
        phases.append((slurm.job_info(a).state, slurm.job_info(b).state, kinds))
        if slurm.job_info(a).state in ENDED:
            break
        if phases[-1][:2] == ("RUNNING", "COMPLETED") and ("pending", "running") in kinds:
            unpace(tmp_path / "unpaced")   # A runs again, B has ended: all that is checked
        time.sleep(1.0)
    kinds = [x.kind for x in reversed(store.actions(a))]
    assert kinds[:2] == ["preempt", "pending"], (kinds, phases[-5:])
    # B ran while A was held, and A ran again only after B had ended
    assert any(sa == "PENDING" and sb == "RUNNING" for sa, sb, _ in phases), phases[-5:]
    first_a_again = next(i for i, (sa, _, k) in enumerate(phases)
                         if sa == "RUNNING" and ("pending", "running") in k)
    assert all(sb != "RUNNING" for _, sb, _ in phases[first_a_again:]), phases[-5:]
    for job, epochs in ((a, EPOCHS), (b, 6)):
        final = wait_for(lambda j=job: (i := slurm.job_info(j)) and i.state in ENDED and i, 600,
                         f"job {job} to finish", interval=1)
        assert final.state == "COMPLETED", final
        recs = load_records(JobDir.for_job(job).path)
        check_exactly_once(recs, DIGITS, epochs_trained(recs, epochs))
