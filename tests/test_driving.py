"""A round's resize steps side by side (:class:`hpcsched.daemon.driving.Steps`), over a fake Slurm
(tests/fakes.py) with real job files and a real journal: the steps of different jobs wait for
Slurm together, their transitions are journaled in one commit and in order, and a step that
fails (Slurm not answering, or a bug) leaves the others' journaled; a step still under way when
the round stops waiting is carried over, journaled once it ends and never taken twice at once.
The same path against the real Slurm: ``tests/test_daemon_actuation_slurm.py`` (two resizes in
one round) and ``tests/test_driving_slurm.py`` (a step carried over a stopped slurmctld)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import event

from hpcsched import slurm
from hpcsched.daemon.actuator import Action, Actuator
from hpcsched.daemon.driving import IN_FLIGHT, STEP_THREADS, Drive, Steps
from hpcsched.daemon.phases import History, ResizePhase, Timeouts
from hpcsched.daemon.store import Store
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir, JobSpec, current_user
from hpcsched.protocol.kinds import ChangeKind, ControlAction
from hpcsched.protocol.limits import JobLimits
from tests.fakes import FakeSlurm

GEN = 1


def _pending(job_id: str) -> slurm.JobInfo:
    return slurm.JobInfo(job_id=job_id, name="", user=current_user(), state="PENDING",
                         state_reason="Resources", partition="gpu", nodes="", node_count=1,
                         gpus_per_node=2, restarts=0, batch_host="", priority=1, cpus_per_task=1)


class _Slurm(FakeSlurm):
    """The fake Slurm whose ``scontrol update`` waits at ``barrier`` (every job's update must
    be under way at once to pass it) and raises ``errors[job_id]`` for a job given one."""

    def __init__(self, *infos, barrier=None, errors=None):
        super().__init__(*infos)
        self.barrier, self.errors = barrier, dict(errors or {})

    def update(self, job_id, **fields):
        if self.barrier is not None:
            self.barrier.wait()
        if job_id in self.errors:
            raise self.errors[job_id]
        super().update(job_id, **fields)


def _drives(control_dir, store: Store, n: int, *, written: bool = False) -> list[Drive]:
    """``n`` pending jobs ("1".."n"), each with a change to start it on 2 nodes journaled
    ``requested`` (``written``: its control file already holds the generation)."""
    out = []
    for i in range(1, n + 1):
        job_id = str(i)
        jd = JobDir.create(control_dir)
        spec = JobSpec(job_uid=jd.uid, script="/s/train.py", script_args=(), python="python3",
                       submit_dir="/s", sbatch_args=(), nodes=1,
                       limits=JobLimits(2, 1, 4, 16, 512, None, 64, "linear"),
                       checkpoint_dir=str(jd.path / "checkpoints"), user="alice")
        jd.write_spec(spec)
        jd.link_job_id(job_id)
        if written:
            ctl.write_control(jd.control_path, ctl.Control(
                job_uid=jd.uid, generation=GEN, action=ControlAction.CONTINUE, nodes=2,
                workers_per_node=2, global_batch_size=64, local_batch_size=16,
                accumulation_steps=1, lr_scale=1.0, issued_at=1.0, issued_by="test",
                reason="test"))
        store.upsert_job(job_id=job_id, job_uid=jd.uid, workers_per_node=2, min_nodes=1,
                         max_nodes=4, min_batch_size=16, max_batch_size=512, base_batch_size=64)
        action = Action(job_id, ChangeKind.PENDING, GEN, 2, 64, 0, "test", "test", ())
        aid = store.plan_action(job_id=job_id, kind="pending", generation=GEN, from_nodes=1,
                                to_nodes=2, from_batch_size=64, to_batch_size=64,
                                reason="test", created_at=1.0)
        out.append(Drive(aid, action, History.begin(1.0), jd, spec, _pending(job_id)))
    return out


def drive_all(actuator: Actuator, store: Store, drives: list[Drive]) -> list[str]:
    """The steps of ``drives``, waited for until all are done (no wait limit)."""
    steps = Steps()
    try:
        return steps.take(actuator, store, drives, None)
    finally:
        steps.close(store, 0.0)


def _phases(store: Store) -> dict[str, str]:
    return {a.job_id: a.phase for a in store.actions()}


def test_steps_of_different_jobs_wait_for_slurm_together(control_dir, store):
    """Every job's ``scontrol update`` is under way at once: the barrier lets none through
    until all are at it (taken in turn, the first would wait there alone and time out)."""
    n = STEP_THREADS
    drives = _drives(control_dir, store, n)
    sl = _Slurm(*(d.info for d in drives), barrier=threading.Barrier(n, timeout=30))
    outcomes = drive_all(Actuator(sl, Timeouts()), store, drives)
    assert outcomes == ["requested"] * n
    assert sl.count("update") == n
    for d in drives:   # each job's own generation, to its own file
        c = ctl.read_control(d.jd.control_path, d.jd.uid)
        assert c is not None and c.generation == GEN and c.nodes == 2


def test_transitions_journaled_in_one_commit_in_order(control_dir, store):
    """Three jobs whose generation is written while they pend: each goes requested -> running
    (a passive step), and the three transitions are one commit."""
    drives = _drives(control_dir, store, 3, written=True)
    commits = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    outcomes = drive_all(Actuator(FakeSlurm(*(d.info for d in drives)), Timeouts()), store,
                         drives)
    assert outcomes == ["running"] * 3
    assert len(commits) == 1
    assert _phases(store) == {"1": "running", "2": "running", "3": "running"}
    for a in store.actions():
        assert [p for p, _ in History.parse(a.history).entries] == [ResizePhase.REQUESTED,
                                                                     ResizePhase.RUNNING]


def test_steps_that_change_nothing_take_no_write_transaction(control_dir, store):
    """Jobs still pending with their generation not yet written take the step again each
    round or tick; nothing to journal, so no transaction (nor its write lock) is taken."""
    drives = _drives(control_dir, store, 2)
    sl = _Slurm(*(d.info for d in drives), errors={d.action.job_id: slurm.SlurmUnavailable("x")
                                                   for d in drives})
    commits = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    assert drive_all(Actuator(sl, Timeouts()), store, drives) == ["interrupted"] * 2
    assert drive_all(Actuator(sl, Timeouts()), store, []) == []
    assert commits == []


def test_slurm_not_answering_interrupts_its_step_alone(control_dir, store):
    drives = _drives(control_dir, store, 3)
    sl = _Slurm(*(d.info for d in drives),
                errors={"2": slurm.SlurmUnavailable("timed out after 20 s")})
    outcomes = drive_all(Actuator(sl, Timeouts()), store, drives)
    assert outcomes == ["requested", "interrupted", "requested"]
    assert sl.count("update") == 2
    assert ctl.read_control(drives[1].jd.control_path, drives[1].jd.uid) is None
    assert _phases(store) == {"1": "requested", "2": "requested", "3": "requested"}


def test_a_bug_in_one_step_is_raised_after_the_others_are_journaled(control_dir, store):
    drives = _drives(control_dir, store, 3, written=True)
    sl = FakeSlurm(*(d.info for d in drives))

    class Broken(Actuator):
        def advance(self, action, *args, **kw):
            if action.job_id == "1":
                raise RuntimeError("a bug")
            return super().advance(action, *args, **kw)

    with pytest.raises(RuntimeError, match="a bug"):
        drive_all(Broken(sl, Timeouts()), store, drives)
    assert _phases(store) == {"1": "requested", "2": "running", "3": "running"}


class _Gated(Actuator):
    """The real actuator, whose step of job ``held`` waits until ``gate`` is set (a control
    file on a file system that stalls, say); ``steps`` counts each job's steps."""

    def __init__(self, sl, held: str):
        super().__init__(sl, Timeouts())
        self.held, self.gate, self.steps = held, threading.Event(), {}

    def advance(self, action, *args, **kw):
        self.steps[action.job_id] = self.steps.get(action.job_id, 0) + 1
        if action.job_id == self.held:
            assert self.gate.wait(30), "the test never let the step go"
        return super().advance(action, *args, **kw)


def _landed(steps: Steps, store: Store) -> dict[str, str]:
    deadline = time.monotonic() + 30
    while not (out := steps.land(store)):
        assert time.monotonic() < deadline, "the carried-over step never landed"
        time.sleep(0.01)
    return out


def test_a_step_still_under_way_is_carried_over_and_journaled_once_it_ends(control_dir, store):
    """Job 2's step waits: the call returns after its wait with job 1's step journaled and job
    2's action as it was; once the step ends, :meth:`Steps.land` journals its transition."""
    drives = _drives(control_dir, store, 2, written=True)
    act = _Gated(FakeSlurm(*(d.info for d in drives)), held="2")
    steps = Steps()
    t = time.monotonic()
    assert steps.take(act, store, drives, 0.2) == ["running", IN_FLIGHT]
    assert time.monotonic() - t < 10
    assert _phases(store) == {"1": "running", "2": "requested"}
    assert steps.in_flight() == {drives[1].action_id}
    assert steps.land(store) == {}, "nothing has ended"
    act.gate.set()
    assert _landed(steps, store) == {"2": "running"}
    assert _phases(store) == {"1": "running", "2": "running"}
    assert steps.in_flight() == frozenset()
    assert act.steps == {"1": 1, "2": 1}
    steps.close(store, 0.0)


def test_a_carried_over_step_lands_with_the_next_steps_in_one_commit(control_dir, store):
    drives = _drives(control_dir, store, 3, written=True)
    act = _Gated(FakeSlurm(*(d.info for d in drives)), held="1")
    steps = Steps()
    assert steps.take(act, store, drives[:1], 0.05) == [IN_FLIGHT]
    act.gate.set()
    while not all(f.done() for _, _, f in steps._flying.values()):
        time.sleep(0.01)
    commits = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    assert steps.take(act, store, drives[1:], None) == ["running", "running"]
    assert len(commits) == 1
    assert _phases(store) == {"1": "running", "2": "running", "3": "running"}
    steps.close(store, 0.0)


def test_the_stop_journals_the_steps_that_end_within_its_wait(control_dir, store):
    drives = _drives(control_dir, store, 2, written=True)
    act = _Gated(FakeSlurm(*(d.info for d in drives)), held="2")
    steps = Steps()
    assert steps.take(act, store, drives, 0.05) == ["running", IN_FLIGHT]
    threading.Timer(0.2, act.gate.set).start()
    steps.close(store, 30.0)
    assert _phases(store) == {"1": "running", "2": "running"}
    assert steps.in_flight() == frozenset()
