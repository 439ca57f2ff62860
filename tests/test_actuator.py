"""The resize actuator without Slurm: every transition of the pure state machine
(:func:`hpcsched.daemon.phases.next_step`, table-driven), its invariants (hypothesis), the
executor over a fake :class:`~hpcsched.slurm.control.SlurmControl` with real job files and a
real journal, a daemon killed between (or within) any two transitions, and the planning
functions ``plan_resize`` and ``current_from``."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcsched import slurm
from hpcsched.daemon import actuator as act
from hpcsched.daemon.actuator import (
    Actuator,
    Current,
    ResizeRefused,
    current_from,
    plan_resize,
)
from hpcsched.daemon.layouts import batch_layout, continue_layout
from hpcsched.daemon.phases import (
    ENDED,
    PATHS,
    REQUEUE_START_DELAY_S,
    TRANSITIONS,
    Action,
    CancelGeneration,
    History,
    IllegalTransition,
    Observed,
    Requeue,
    ResizePendingJob,
    ResizePhase,
    SetStartTime,
    Timeouts,
    WriteControl,
    next_step,
)
from hpcsched.daemon.store import Store
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir, JobSpec, current_user
from hpcsched.protocol.kinds import AckState, ChangeKind, ControlAction
from hpcsched.protocol.limits import JobLimits
from tests.fakes import FakeSlurm

ME = current_user()   # Slurm's user of the test jobs: they live in this user's subtree

P = ResizePhase
GEN = 3
T0 = 1000.0
TO = Timeouts(ack=180.0, start=300.0)
JOB = "7"


def info(state="RUNNING", restarts=0, node_count=1, cpus_per_task=1, **kw) -> slurm.JobInfo:
    fields = {"job_id": JOB, "name": "", "user": ME, "state": state, "state_reason": "None",
              "partition": "gpu", "nodes": "n1" if node_count == 1 else "n[1-2]",
              "node_count": node_count, "gpus_per_node": 2, "restarts": restarts,
              "batch_host": "n1", "priority": 1, "cpus_per_task": cpus_per_task}
    return slurm.JobInfo(**{**fields, **kw})


def ack(generation=GEN, state="checkpointed", nodes=1, gbs=64, message="") -> ctl.Ack:
    return ctl.Ack(job_uid="u", generation=generation, state=AckState(state), world_size=2 * nodes,
                   nodes=nodes, global_batch_size=gbs, local_batch_size=gbs // (2 * nodes),
                   accumulation_steps=1, step=5, time=T0 + 1, message=message)


def action(kind="grow", nodes=2, batch=64, restarts=0, placement=()) -> Action:
    return Action(JOB, ChangeKind(kind), GEN, nodes, batch, restarts, "why", "test", placement)


def history(*phases_at) -> History:
    """``history(P.CHECKPOINTED, 10)``: requested at T0, then each phase at T0 + its offset."""
    entries = [(P.REQUESTED, T0)]
    for phase, dt in zip(phases_at[::2], phases_at[1::2]):
        entries.append((phase, T0 + dt))
    return History(tuple(entries))


def seen(control=GEN, ack=None, job="running", now=T0 + 5) -> Observed:
    job = info() if job == "running" else job
    return Observed(now, control, ack, job)


# -- next_step, one row per transition rule ------------------------------------------------------

RUNNING_NOTE = "Slurm started the job on 1 node(s), not 2"
CASES = {
    # requested: write the generation (again) until the job's file holds it
    "grow: nothing written yet": (
        action(), history(), seen(control=None),
        P.REQUESTED, (WriteControl(GEN, ControlAction.CHECKPOINT_AND_REQUEUE, 2, 64),), ""),
    "batch: an older generation on disk": (
        action("batch", nodes=1, batch=128), history(), seen(control=GEN - 1),
        P.REQUESTED, (WriteControl(GEN, ControlAction.CONTINUE, 1, 128),), ""),
    "shrink: written as checkpoint-and-shrink": (
        action("shrink", nodes=1), history(), seen(control=None, job=info(node_count=2)),
        P.REQUESTED, (WriteControl(GEN, ControlAction.CHECKPOINT_AND_SHRINK, 1, 64),), ""),
    "pending: resized in Slurm before its generation": (
        action("pending", placement=("n3", "n4")), history(),
        seen(control=None, job=info("PENDING", cpus_per_task=2)),
        P.REQUESTED, (ResizePendingJob(2, ("n3", "n4"), 2, required=True),
                      WriteControl(GEN, ControlAction.CONTINUE, 2, 64)), ""),
    "pending: Slurm already has the size": (
        action("pending"), history(), seen(control=None, job=info("PENDING", node_count=2)),
        P.REQUESTED, (WriteControl(GEN, ControlAction.CONTINUE, 2, 64),), ""),
    "pending: written while it pends -> running": (
        action("pending"), history(), seen(job=info("PENDING")), P.RUNNING, (), ""),
    "pending: it started meanwhile, waits for its ack": (
        action("pending"), history(), seen(ack=ack(GEN - 1, "applied")), P.REQUESTED, (), ""),
    "batch: applied -> running": (
        action("batch", nodes=1), history(), seen(ack=ack(state="applied")), P.RUNNING, (), ""),
    "grow: applied on fewer nodes than asked (noted)": (
        action(), history(), seen(ack=ack(state="applied", nodes=1)), P.RUNNING, (), ""),
    "grow: checkpointed": (
        action(), history(), seen(ack=ack()), P.CHECKPOINTED, (), ""),
    "no answer yet, within the ack timeout": (
        action("batch", nodes=1), history(), seen(ack=ack(GEN - 1, "applied"), now=T0 + 180),
        P.REQUESTED, (), ""),
    "no answer within the ack timeout: cancelled at what runs": (
        action("batch", nodes=1), history(),
        seen(ack=ack(GEN - 1, "applied", nodes=1, gbs=32), now=T0 + 181),
        P.FAILED, (CancelGeneration(GEN + 1, 1, 32, 16, 1, "job 7 did not acknowledge generation 3 "
                                    "within 180 s (does the script use hpcsched.elastic?)",
                                    ("n1:2",)),),
        "did not acknowledge generation 3 within 180 s"),
    "never answered anything: nothing to cancel with": (
        action("batch", nodes=1), history(), seen(ack=None, now=T0 + 181),
        P.FAILED, (), "did not acknowledge generation 3"),
    # failures common to every open phase
    "rejected": (
        action("batch", nodes=1), history(), seen(ack=ack(state="rejected", message="too big")),
        P.FAILED, (), "rejected generation 3: too big"),
    "superseded by a newer control generation": (
        action(), history(P.CHECKPOINTED, 1), seen(control=GEN + 1, ack=ack()),
        P.FAILED, (), "generation 3 was superseded by 4"),
    "superseded by a newer acknowledgement": (
        action("shrink", nodes=1), history(), seen(ack=ack(GEN + 1, "applied")),
        P.FAILED, (), "superseded by 4"),
    "the job ended": (
        action(), history(P.CHECKPOINTED, 1, P.REQUEUED, 2),
        seen(ack=ack(), job=info("COMPLETED", restarts=1)),
        P.FAILED, (), "job 7 ended (COMPLETED) before it applied generation 3"),
    "Slurm forgot the job": (
        action("batch", nodes=1), history(), seen(job=None), P.FAILED, (), "ended (gone)"),
    # preempt: a grow's first half, then held with a deadline (nodes: the size it resumes at)
    "preempt: written as checkpoint-and-requeue at its size": (
        action("preempt", nodes=1), history(), seen(control=None),
        P.REQUESTED, (WriteControl(GEN, ControlAction.CHECKPOINT_AND_REQUEUE, 1, 64),), ""),
    "preempt: checkpointed": (
        action("preempt", nodes=1), history(), seen(ack=ack()), P.CHECKPOINTED, (), ""),
    "preempt: the launcher resumed before any requeue -> failed, not preempted": (
        action("preempt", nodes=1), history(P.CHECKPOINTED, 1), seen(ack=ack(state="applied")),
        P.FAILED, (), "runs again at generation 3: not preempted"),
    # pending: a job hpcsched preempted and holds (reason BeginTime) is released after its generation
    "pending: a held job: its generation, then StartTime=now": (
        action("pending", nodes=1), history(),
        seen(control=None, job=info("PENDING", state_reason="BeginTime")),
        P.REQUESTED, (WriteControl(GEN, ControlAction.CONTINUE, 1, 64), SetStartTime("now")), ""),
    "pending: a held job at another size: resized, its generation, released": (
        action("pending", nodes=2), history(),
        seen(control=None, job=info("PENDING", state_reason="BeginTime")),
        P.REQUESTED, (ResizePendingJob(2, (), 1, required=True),
                      WriteControl(GEN, ControlAction.CONTINUE, 2, 64), SetStartTime("now")), ""),
    "pending: held, reason not yet BeginTime (just requeued: squeue says None) -> released": (
        action("pending", nodes=1), history(),
        seen(job=info("PENDING", restarts=1, state_reason="None")),
        P.RUNNING, (SetStartTime("now"),), ""),
    "pending: never requeued, reason None: a plain pending job, no StartTime": (
        action("pending", nodes=1), history(), seen(job=info("PENDING", state_reason="None")),
        P.RUNNING, (), ""),
    "pending: held, generation written (a daemon died before the release) -> released": (
        action("pending", nodes=1), history(), seen(job=info("PENDING", state_reason="BeginTime")),
        P.RUNNING, (SetStartTime("now"),), ""),
    # checkpointed
    "grow: requeued at the restart count of the plan": (
        action(restarts=4), history(P.CHECKPOINTED, 1), seen(ack=ack(), job=info(restarts=4)),
        P.REQUEUED, (Requeue(),), ""),
    "preempt: requeued at the restart count of the plan": (
        action("preempt", nodes=1, restarts=4), history(P.CHECKPOINTED, 1),
        seen(ack=ack(), job=info(restarts=4)), P.REQUEUED, (Requeue(),), ""),
    "preempt: requeued before (restart count moved): never twice": (
        action("preempt", nodes=1, restarts=4), history(P.CHECKPOINTED, 1),
        seen(ack=ack(), job=info("PENDING", restarts=5)), P.REQUEUED, (), ""),
    "grow: requeued before (restart count moved): never twice": (
        action(restarts=4), history(P.CHECKPOINTED, 1),
        seen(ack=ack(), job=info("PENDING", restarts=5)), P.REQUEUED, (), ""),
    "grow: restart count below the plan's (a stale view): never requeue": (
        action(restarts=1), history(P.CHECKPOINTED, 1), seen(ack=ack(), job=info(restarts=0)),
        P.CHECKPOINTED, (), ""),
    "grow: not RUNNING (completing): wait": (
        action(), history(P.CHECKPOINTED, 1), seen(ack=ack(), job=info("COMPLETING")),
        P.CHECKPOINTED, (), ""),
    "shrink: the job finishes it": (
        action("shrink", nodes=1), history(P.CHECKPOINTED, 1),
        seen(ack=ack(nodes=2), job=info(node_count=2)), P.CHECKPOINTED, (), ""),
    "shrink: applied -> running": (
        action("shrink", nodes=1), history(P.CHECKPOINTED, 1),
        seen(ack=ack(state="applied", nodes=1)), P.RUNNING, (), ""),
    "shrink: not applied within the ack timeout: no cancel after a checkpoint": (
        action("shrink", nodes=1), history(P.CHECKPOINTED, 1),
        seen(ack=ack(nodes=2), job=info(node_count=2), now=T0 + 181),
        P.FAILED, (), "did not run again at generation 3 in time"),
    # requeued, released, rescheduled
    "requeued: PENDING -> resized and released (StartTime=now+2)": (
        action(placement=("n1", "n2")), history(P.CHECKPOINTED, 1, P.REQUEUED, 2),
        seen(ack=ack(), job=info("PENDING", restarts=1, cpus_per_task=3)),
        P.RELEASED, (ResizePendingJob(2, ("n1", "n2"), 3, required=False),
                     SetStartTime("now+2")), ""),
    "preempt: PENDING 2 s after the requeue -> its size, held until the deadline (done)": (
        action("preempt", nodes=2), history(P.CHECKPOINTED, 1, P.REQUEUED, 20.4),
        seen(ack=ack(nodes=2), job=info("PENDING", restarts=1, cpus_per_task=3,
                                        state_reason="BeginTime"), now=T0 + 22.1),
        P.RUNNING, (ResizePendingJob(2, (), 3, required=False), SetStartTime("now+1800")), ""),
    "preempt: PENDING, not yet 2 s after the requeue (Slurm's 121 s hold meanwhile)": (
        action("preempt", nodes=2), history(P.CHECKPOINTED, 1, P.REQUEUED, 20.4),
        seen(ack=ack(nodes=2), job=info("PENDING", restarts=1), now=T0 + 22.0),
        P.REQUEUED, (), ""),
    "preempt: still COMPLETING: wait": (
        action("preempt", nodes=1), history(P.CHECKPOINTED, 1, P.REQUEUED, 2),
        seen(ack=ack(), job=info("COMPLETING", restarts=1)), P.REQUEUED, (), ""),
    "preempt: not pending within the start timeout": (
        action("preempt", nodes=1), history(P.CHECKPOINTED, 1, P.REQUEUED, 2),
        seen(ack=ack(), job=info("COMPLETING", restarts=1), now=T0 + 303),
        P.FAILED, (), "did not run again at generation 3 in time"),
    "preempt: Slurm started it before the hold (no daemon for 121 s) -> failed, it runs": (
        action("preempt", nodes=1), history(P.CHECKPOINTED, 1, P.REQUEUED, 2),
        seen(ack=ack(state="applied"), job=info(restarts=1)),
        P.FAILED, (), "not preempted"),
    "requeued: still COMPLETING (an update now would be lost)": (
        action(), history(P.CHECKPOINTED, 1, P.REQUEUED, 2),
        seen(ack=ack(), job=info("COMPLETING", restarts=1)), P.REQUEUED, (), ""),
    "requeued: not running again within the start timeout": (
        action(), history(P.CHECKPOINTED, 1, P.REQUEUED, 2),
        seen(ack=ack(), job=info("COMPLETING", restarts=1), now=T0 + 303),
        P.FAILED, (), "did not run again at generation 3 in time"),
    "requeued: Slurm started it by itself and it applied": (
        action(), history(P.CHECKPOINTED, 1, P.REQUEUED, 2),
        seen(ack=ack(state="applied", nodes=2), job=info(restarts=1, node_count=2)),
        P.RUNNING, (), ""),
    "released: not yet 2 s after the requeue (at T0+20.4; due T0+22.05)": (
        action(), history(P.CHECKPOINTED, 1, P.REQUEUED, 20.4, P.RELEASED, 20.5),
        seen(ack=ack(), job=info("PENDING", restarts=1), now=T0 + 22.0), P.RELEASED, (), ""),
    "released: 2 s after the requeue -> StartTime=now": (
        action(), history(P.CHECKPOINTED, 1, P.REQUEUED, 20.4, P.RELEASED, 20.5),
        seen(ack=ack(), job=info("PENDING", restarts=1), now=T0 + 22.1),
        P.RESCHEDULED, (SetStartTime("now"),), ""),
    "released: it started already: wait for its ack": (
        action(), history(P.CHECKPOINTED, 1, P.REQUEUED, 20.4, P.RELEASED, 20.5),
        seen(ack=ack(), job=info(restarts=1, node_count=2), now=T0 + 30), P.RELEASED, (), ""),
    "rescheduled: applied -> running": (
        action(), history(P.CHECKPOINTED, 1, P.REQUEUED, 2, P.RELEASED, 3, P.RESCHEDULED, 5),
        seen(ack=ack(state="applied", nodes=2), job=info(restarts=1, node_count=2)),
        P.RUNNING, (), ""),
    "rescheduled: within the start timeout": (
        action(), history(P.CHECKPOINTED, 1, P.REQUEUED, 2, P.RELEASED, 3, P.RESCHEDULED, 5),
        seen(ack=ack(), job=info("PENDING", restarts=1), now=T0 + 302), P.RESCHEDULED, (), ""),
    "rescheduled: past the start timeout (from the requeue)": (
        action(), history(P.CHECKPOINTED, 1, P.REQUEUED, 2, P.RELEASED, 3, P.RESCHEDULED, 5),
        seen(ack=ack(), job=info("PENDING", restarts=1), now=T0 + 303),
        P.FAILED, (), "did not run again"),
    # terminal phases stay, whatever is observed
    "running stays running": (
        action(), history(P.RUNNING, 1), seen(control=None, job=None), P.RUNNING, (), ""),
    "failed stays failed": (
        action(), history(P.FAILED, 1), seen(control=None), P.FAILED, (), ""),
}


@pytest.mark.parametrize("name", list(CASES))
def test_next_step(name):
    a, h, obs, phase, effects, why = CASES[name]
    step = next_step(a, h, obs, TO)
    assert (step.phase, step.effects) == (phase, effects)
    assert why in step.why and bool(step.why) == (phase == P.FAILED and h.phase != P.FAILED)
    assert step.phase == h.phase or step.phase in TRANSITIONS[h.phase], "an illegal transition"


def test_next_step_notes_a_smaller_start():
    step = next_step(action(), history(), seen(ack=ack(state="applied", nodes=1)), TO)
    assert step.note == RUNNING_NOTE


def test_every_path_is_legal_and_every_phase_has_a_rule():
    for kind, path in PATHS.items():
        assert path[0] == P.REQUESTED and path[-1].terminal, kind
        for a, b in itertools.pairwise(path):
            assert b in TRANSITIONS[a], (kind, a, b)
    assert {p for p in P if not p.terminal} == set(act.next_step.__globals__["_RULES"])


@pytest.mark.parametrize("old, new", [
    (P.REQUESTED, P.REQUEUED), (P.CHECKPOINTED, P.RELEASED), (P.RUNNING, P.FAILED),
    (P.FAILED, P.RUNNING), (P.RELEASED, P.REQUEUED)])
def test_history_refuses_illegal_transitions(old, new):
    h = History(((old, T0),))
    with pytest.raises(IllegalTransition):
        h.then(new, T0 + 1)


def test_history_times_and_timeouts():
    h = history(P.CHECKPOINTED, 1, P.REQUEUED, 2)
    assert h.then(P.REQUEUED, T0 + 9) is h, "staying adds nothing"
    assert (h.phase, h.started, h.entered(P.REQUEUED), h.entered(P.RELEASED)) == (
        P.REQUEUED, T0, T0 + 2, None)
    assert h.has_timeout(P.REQUEUED, 10, T0 + 12.5) and not h.has_timeout(P.REQUEUED, 10, T0 + 12)
    assert not h.has_timeout(P.RELEASED, 0, T0 + 1e9), "never entered: no timeout"
    assert History.parse([["requested", 1], ["checkpointed", 2.5]]).entries == (
        (P.REQUESTED, 1.0), (P.CHECKPOINTED, 2.5))


_phases = st.sampled_from([p for p in P if not p.terminal])
_jobs = st.one_of(st.none(), st.builds(
    info, state=st.sampled_from(["RUNNING", "PENDING", "COMPLETING", *sorted(ENDED)]),
    restarts=st.integers(0, 3), node_count=st.integers(1, 3)))
_acks = st.one_of(st.none(), st.builds(
    ack, generation=st.integers(GEN - 1, GEN + 1),
    state=st.sampled_from(list(AckState)), nodes=st.integers(1, 3)))


@settings(max_examples=400, deadline=None)
@given(kind=st.sampled_from(list(ChangeKind)), phase=_phases, job=_jobs, a=_acks,
       control=st.one_of(st.none(), st.integers(GEN - 1, GEN + 1)),
       restarts=st.integers(0, 3), now=st.floats(T0, T0 + 1000))
def test_next_step_invariants(kind, phase, job, a, control, restarts, now):
    """Any reading, any open phase: a legal transition; a requeue only of a RUNNING job at the
    restart count of the plan; a generation written only when the file does not hold it;
    failed always says why."""
    path = PATHS[ChangeKind.GROW]   # every open phase lies on it
    h = History(tuple((p, T0 + i) for i, p in enumerate(path[:path.index(phase) + 1])))
    step = next_step(action(kind, restarts=restarts), h, Observed(now, control, a, job), TO)
    assert step.phase == phase or step.phase in TRANSITIONS[phase]
    if any(isinstance(e, Requeue) for e in step.effects):
        assert job.state == "RUNNING" and job.restarts == restarts and kind in (
            ChangeKind.GROW, ChangeKind.PREEMPT)
    if any(isinstance(e, WriteControl) for e in step.effects):
        assert control is None or control < GEN
    if any(isinstance(e, SetStartTime | ResizePendingJob) for e in step.effects):
        assert job.state == "PENDING"
    assert (step.phase == P.FAILED) == bool(step.why)


# -- the executor: real job files, a fake Slurm (tests/fakes.py), a real journal ----------------


def job_side(jd: JobDir, sl: FakeSlurm) -> None:
    """What ElasticJob and the launcher do with a new generation (docs/control-protocol.md)."""
    c = ctl.read_control(jd.control_path, jd.uid)
    a = ctl.read_ack(jd.ack_path, jd.uid)
    if c is None or (a is not None and a.generation > c.generation):
        return
    answer = None
    if a is None or a.generation < c.generation:
        answer = ("applied" if c.action in (ControlAction.CONTINUE, ControlAction.REFORM)
                  else "checkpointed")
    elif a.state == "checkpointed" and c.action == ControlAction.CHECKPOINT_AND_SHRINK:
        answer = "applied"
    elif a.state == "checkpointed" and sl.info.state == "RUNNING" and sl.info.restarts > 0:
        answer = "applied"   # the requeued job runs again from its checkpoint
    if answer is not None:
        wpn = 2
        ctl.write_ack(jd.ack_path, ctl.Ack(
            job_uid=jd.uid, generation=c.generation, state=answer, world_size=c.nodes * wpn,
            nodes=c.nodes, global_batch_size=c.global_batch_size,
            local_batch_size=c.local_batch_size, accumulation_steps=c.accumulation_steps,
            step=10, time=T0))


@pytest.fixture
def jd(control_dir):
    d = JobDir.create(control_dir)
    d.write_spec(JobSpec(job_uid=d.uid, script="/s/train.py", script_args=(), python="python3",
                         submit_dir="/s", sbatch_args=(), nodes=1,
                         limits=JobLimits(2, 1, 4, 16, 512, None, 64, "linear"),
                         checkpoint_dir=str(d.path / "checkpoints"), user="alice"))
    d.link_job_id(JOB)
    ctl.write_ack(d.ack_path, ctl.Ack(job_uid=d.uid, generation=0, state="applied",
                                      world_size=2, nodes=1, global_batch_size=64,
                                      local_batch_size=32, accumulation_steps=1, step=0, time=T0))
    return d


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'h.db'}")
    s.upgrade()
    s.upsert_job(job_id=JOB, job_uid="u", workers_per_node=2, min_nodes=1, max_nodes=4,
                 min_batch_size=16, max_batch_size=512, base_batch_size=64)
    yield s
    s.close()


class Clock:
    def __init__(self, t=T0):
        self.t = t

    def __call__(self):
        return self.t


class Crash(Exception):
    """The daemon dies here."""


def run_action(jd, spec, sl, store, kind, nodes, batch, crash_at=None, crash_before_commit=False,
               clock=None, steps=40, generation=1, placement=()):
    """Journal a change as the daemon does, then advance it once per 'round' (1.5 s apart) with
    the job answering in between, until it ends. ``crash_at``: the daemon dies at its n-th
    journal write (after committing it, or just before: its effects done, the journal not), and
    a fresh actuator resumes from the journal. A ``preempt`` is journaled as reconcile makes it
    (to 0 nodes) and its action asks for ``nodes``, the job's size now."""
    clock = clock or Clock()
    a = Action(JOB, ChangeKind(kind), generation, nodes, batch, sl.info.restarts, "test", "test",
               tuple(placement))
    aid = store.plan_action(job_id=JOB, kind=kind, generation=generation,
                            from_nodes=sl.info.node_count,
                            to_nodes=0 if kind == "preempt" else nodes, from_batch_size=64,
                            to_batch_size=batch, restarts_at_plan=sl.info.restarts, reason="test",
                            placement=tuple(placement), created_at=clock())
    writes = [0]

    def journal(phase, at, why):
        writes[0] += 1
        if writes[0] == crash_at and crash_before_commit:
            raise Crash
        store.set_action_phase(aid, phase, error=why or None, at=at)
        if writes[0] == crash_at:
            raise Crash

    actuator = Actuator(sl, TO, clock)
    for _ in range(steps):
        (row,) = [r for r in store.actions() if r.id == aid]
        if P(row.phase).terminal:
            return row
        action, hist = act.journaled(row, "test")
        assert action == a
        try:
            actuator.advance(action, hist, jd, spec, sl.info, journal)
        except Crash:
            actuator = Actuator(sl, TO, clock)   # a new daemon process
        clock.t += 1.5
        job_side(jd, sl)
    raise AssertionError(f"not finished in {steps} rounds: {store.actions()}")


@pytest.fixture
def writes(monkeypatch):
    """Every control generation written, in order."""
    written = []
    real = ctl.write_control

    def counting(path, control):
        written.append(control.generation)
        real(path, control)

    monkeypatch.setattr(act.ctl, "write_control", counting)
    return written


@pytest.mark.parametrize("kind, nodes, batch, start", [
    ("batch", 1, 128, info()),
    ("shrink", 1, 64, info(node_count=2)),
    ("grow", 2, 64, info()),
    ("pending", 2, 64, info("PENDING")),
])
def test_each_kind_runs_its_path_once(jd, store, writes, kind, nodes, batch, start):
    sl = FakeSlurm(start)
    row = run_action(jd, jd.read_spec(), sl, store, kind, nodes, batch)
    assert (row.phase, tuple(p for p, _ in row.history)) == ("running", PATHS[ChangeKind(kind)])
    assert writes == [1]
    expected = {"batch": {}, "shrink": {},
                "grow": {"requeue": 1, "update": 3},   # resize + StartTime=now+2, StartTime=now
                "pending": {"update": 1}}[kind]
    assert {k: sl.count(k) for k in ("requeue", "update")} == {
        "requeue": expected.get("requeue", 0), "update": expected.get("update", 0)}
    assert sl.count("job") == 0, "the actuator asks Slurm nothing: the round observed it"


#: the simulator's outcome of each kind for the Slurm job (sim/apply.py): its state, restarts
#: and node count after the change, from a job running on 1 node (pending: submitted for 1)
SIM_OUTCOME = {
    ChangeKind.BATCH: ("RUNNING", 0, 1),
    ChangeKind.SHRINK: ("RUNNING", 0, 2),       # the job releases its nodes itself
    ChangeKind.GROW: ("RUNNING", 1, 2),         # requeued, restarted at the new size
    ChangeKind.PENDING: ("PENDING", 0, 2),      # resized while pending; Slurm starts it
    ChangeKind.PREEMPT: ("PENDING", 1, 1),      # requeued and held until a plan gives GPUs
    ChangeKind.REFORM: ("RUNNING", 0, 1),       # a new layout, no restart
}


@pytest.mark.parametrize("kind", list(ChangeKind))
def test_every_kind_runs_its_path_on_the_fake_slurm(jd, store, writes, kind):
    """The resize state machine (phases + actuator) on the one Slurm fake (tests/fakes.py),
    whose clock is the daemon's: each kind visits exactly PATHS[kind], and leaves the Slurm job
    as the simulator's rules do. A requeued job would wait out Slurm's 121 s hold: only the
    actuator's StartTime=now starts it (a grow), and a preemption's StartTime=now+1800 holds
    it."""
    clock = Clock()
    start = {ChangeKind.SHRINK: info(node_count=2), ChangeKind.PENDING: info("PENDING")}
    sl = FakeSlurm(start.get(kind, info()), clock=clock)
    nodes = {ChangeKind.SHRINK: 1, ChangeKind.GROW: 2, ChangeKind.PENDING: 2}.get(kind, 1)
    placement = ("n1:1",) if kind == ChangeKind.REFORM else ()
    row = run_action(jd, jd.read_spec(), sl, store, kind.value, nodes, 64, clock=clock,
                     placement=placement)
    assert (row.phase, tuple(p for p, _ in row.history)) == ("running", PATHS[kind])
    assert writes == [1]
    assert (sl.info.state, sl.info.restarts, sl.info.node_count) == SIM_OUTCOME[kind]
    if kind == ChangeKind.GROW:
        assert sl.info.nodes == "n[1-2]" and sl.info.start_time >= T0 + REQUEUE_START_DELAY_S
    if kind == ChangeKind.PREEMPT:
        assert sl.info.state_reason == "BeginTime" and sl.info.start_time >= T0 + 1800
    assert sl.count("job") == 0, "the actuator asks Slurm nothing: the round observed it"


def test_grow_updates_are_the_measured_recipe(jd, store, writes):
    sl = FakeSlurm(info(cpus_per_task=2))
    run_action(jd, jd.read_spec(), sl, store, "grow", 2, 64)
    updates = [dict(c[2]) for c in sl.calls if c[0] == "update"]
    assert updates == [
        {"NumNodes": "2-2", "NumTasks": 4, "NumCPUs": 8, "ReqNodeList": ""},
        {"StartTime": "now+2"},
        {"StartTime": "now"},
    ]
    hist = dict(store.actions()[0].history)
    assert hist["rescheduled"] >= int(hist["requeued"]) + 2, "StartTime=now 2 s after the requeue"


GROW_TRANSITIONS = len(PATHS[ChangeKind.GROW]) - 1


@pytest.mark.parametrize("before_commit", [False, True], ids=["after-commit", "before-commit"])
@pytest.mark.parametrize("crash_at", range(1, GROW_TRANSITIONS + 1))
def test_grow_killed_at_any_transition_resumes_without_doing_anything_twice(
        jd, store, writes, crash_at, before_commit):
    sl = FakeSlurm(info())
    row = run_action(jd, jd.read_spec(), sl, store, "grow", 2, 64, crash_at=crash_at,
                     crash_before_commit=before_commit)
    path = tuple(p for p, _ in row.history)
    assert sl.count("requeue") == 1, "requeued twice"
    assert sl.info.restarts == 1 and writes == [1], "a generation written twice"
    if not before_commit:   # between two transitions: not one effect repeated
        assert (row.phase, path) == ("running", PATHS[ChangeKind.GROW])
        assert sl.count("update") == 3
    else:
        # its effects done, the transition not journaled: the resumed step sees their result
        # (the requeue in the restart count, a started job) or repeats an idempotent update
        assert row.phase == "running"
        assert path == tuple(p for p in PATHS[ChangeKind.GROW] if p in path)
        assert len(path) >= len(PATHS[ChangeKind.GROW]) - 1


@pytest.mark.parametrize("crash_at", range(1, 3))
def test_shrink_killed_at_any_transition(jd, store, writes, crash_at):
    sl = FakeSlurm(info(node_count=2))
    row = run_action(jd, jd.read_spec(), sl, store, "shrink", 1, 64, crash_at=crash_at)
    assert row.phase == "running" and writes == [1] and sl.calls == []


PREEMPT_TRANSITIONS = len(PATHS[ChangeKind.PREEMPT]) - 1


def test_preempt_holds_the_job_with_a_deadline_then_a_pending_change_releases_it(jd, store, writes):
    sl = FakeSlurm(info(node_count=2))
    clock = Clock()
    row = run_action(jd, jd.read_spec(), sl, store, "preempt", 2, 64, clock=clock)
    assert (row.phase, tuple(p for p, _ in row.history)) == ("running", PATHS[ChangeKind.PREEMPT])
    c = ctl.read_control(jd.control_path, jd.uid)
    assert (c.generation, c.action, c.nodes) == (1, "checkpoint-and-requeue", 2), "its own size"
    assert [c[0] for c in sl.calls] == ["requeue", "update", "update"]
    assert [dict(c[2]) for c in sl.calls[1:]] == [
        {"NumNodes": "2-2", "NumTasks": 4, "NumCPUs": 4, "ReqNodeList": ""},
        {"StartTime": "now+1800"}]
    assert (sl.info.state, sl.info.state_reason, sl.info.restarts) == ("PENDING", "BeginTime", 1)
    hist = dict(row.history)
    assert hist["running"] >= int(hist["requeued"]) + 2, "held 2 s after the requeue, not sooner"
    # a later plan gives it GPUs: a pending change writes its generation, then StartTime=now
    row = run_action(jd, jd.read_spec(), sl, store, "pending", 2, 64, clock=clock, generation=2)
    assert (row.phase, tuple(p for p, _ in row.history)) == ("running", PATHS[ChangeKind.PENDING])
    assert sl.calls[-1] == ("update", JOB, {"StartTime": "now"}) and sl.info.state == "RUNNING"
    assert writes == [1, 2] and sl.count("requeue") == 1


@pytest.mark.parametrize("before_commit", [False, True], ids=["after-commit", "before-commit"])
@pytest.mark.parametrize("crash_at", range(1, PREEMPT_TRANSITIONS + 1))
def test_preempt_killed_at_any_transition_requeues_once_and_holds(jd, store, writes, crash_at,
                                                                   before_commit):
    sl = FakeSlurm(info())
    row = run_action(jd, jd.read_spec(), sl, store, "preempt", 1, 64, crash_at=crash_at,
                     crash_before_commit=before_commit)
    path = tuple(p for p, _ in row.history)
    assert sl.count("requeue") == 1 and sl.info.restarts == 1 and writes == [1]
    assert row.phase == "running" and sl.info.state == "PENDING"
    assert sl.count("update", StartTime="now+1800") >= 1 and sl.count("update", StartTime="now") == 0
    if not before_commit:
        assert path == PATHS[ChangeKind.PREEMPT] and sl.count("update") == 2
    else:   # the hold's idempotent updates may be sent again; the requeue never is
        assert path == tuple(p for p in PATHS[ChangeKind.PREEMPT] if p in path)


def test_release_interrupted_between_generation_and_start_time_is_completed(jd, store, writes):
    """Slurm does not answer the release's StartTime=now: the next step sees the generation
    written and sends only StartTime=now."""
    sl = FakeSlurm(info("PENDING", restarts=1, state_reason="BeginTime"))
    spec = jd.read_spec()
    a = Action(JOB, ChangeKind.PENDING, 1, 1, 64, 1)
    actuator = Actuator(sl, TO, Clock())
    sl.refuse["update"] = slurm.SlurmUnavailable("timed out")
    with pytest.raises(slurm.SlurmUnavailable):
        actuator.advance(a, History.begin(T0), jd, spec, sl.info)
    assert writes == [1] and sl.info.state == "PENDING"
    sl.refuse.clear()
    adv = actuator.advance(a, History.begin(T0), jd, spec, sl.info)
    assert adv.phase == P.RUNNING and writes == [1]
    assert sl.calls[-1] == ("update", JOB, {"StartTime": "now"}) and sl.info.state == "RUNNING"


def test_refused_effects_fail_the_action_with_slurms_reason(jd, store, writes):
    sl = FakeSlurm(info(), refuse={"requeue": slurm.SlurmError("scontrol requeue 7: Invalid job")})
    row = run_action(jd, jd.read_spec(), sl, store, "grow", 2, 64)
    assert row.phase == "failed" and "Invalid job" in row.error
    assert [p for p, _ in row.history] == ["requested", "checkpointed", "failed"]


def test_refused_pending_resize_fails_before_writing(jd, store, writes):
    sl = FakeSlurm(info("PENDING"), refuse={"update": slurm.SlurmError("not pending")})
    row = run_action(jd, jd.read_spec(), sl, store, "pending", 2, 64)
    assert row.phase == "failed" and "could not be resized while pending" in row.error
    assert writes == [], "no generation for a size Slurm refused"


def test_refused_resize_after_requeue_still_releases(jd, store, writes):
    class Picky(FakeSlurm):
        def update(self, job_id, **fields):
            if "NumNodes" in fields:
                self.calls.append(("update", job_id, {}))
                raise slurm.SlurmError("Requested node configuration is not available")
            super().update(job_id, **fields)

    sl = Picky(info())
    row = run_action(jd, jd.read_spec(), sl, store, "grow", 2, 64)
    assert row.phase == "running" and sl.count("requeue") == 1
    assert sl.count("update", StartTime="now") == 1, "the hold must go"


def test_slurm_unavailable_leaves_the_step_for_the_next_round(jd, store, writes):
    sl = FakeSlurm(info(), refuse={"requeue": slurm.SlurmUnavailable("timed out")})
    spec = jd.read_spec()
    a = Action(JOB, ChangeKind.GROW, 1, 2, 64, 0)
    h = History.begin(T0)
    actuator = Actuator(sl, TO, Clock())
    h = actuator.advance(a, h, jd, spec, sl.info).history
    job_side(jd, sl)
    journaled = []
    with pytest.raises(slurm.SlurmUnavailable):
        actuator.advance(a, h, jd, spec, sl.info, lambda *x: journaled.append(x))
    assert [p for p, _, _ in journaled] == [P.CHECKPOINTED], "the requeue's step is not journaled"
    sl.refuse.clear()
    h = actuator.advance(a, h.then(P.CHECKPOINTED, T0 + 1), jd, spec, sl.info).history
    assert h.phase == P.REQUEUED and sl.count("requeue") == 2  # one refused, one done


@pytest.mark.parametrize("job, acked, action, layout, world", [
    # on its primary at the GPUs per node it asked: nodes x those, no layout (as ever)
    (info(), {"world_size": 2, "nodes": 1}, "continue", {}, 2),
    # started at 1 of the 2 per node it asked: the primary's layout, world size 1
    (info(gpus_per_node=1), {"world_size": 1, "nodes": 1}, "continue", {"n1": 1}, 1),
    # on extensions: a re-form onto the layout it runs
    (info(gpus_per_node=1), {"world_size": 3, "nodes": 2, "layout": {"n1": 1, "n2": 2}},
     "reform", {"n1": 1, "n2": 2}, 3),
])
def test_a_cancel_goes_on_at_the_world_size_the_job_runs(jd, writes, job, acked, action, layout,
                                                         world):
    """The generation that supersedes an unanswered one is one the job takes: the world size
    it runs (it refuses a ``continue`` of another), from its acknowledgement and Slurm's GPUs
    per node (:func:`~hpcsched.daemon.layouts.running_layout`)."""
    clock = Clock()
    spec = jd.read_spec()
    ctl.write_ack(jd.ack_path, ctl.Ack(
        job_uid=jd.uid, generation=0, state="applied", global_batch_size=60,
        local_batch_size=60 // acked["world_size"], accumulation_steps=1, step=0, time=T0,
        **acked))
    a = Action(JOB, ChangeKind.BATCH, 1, 1, 120, 0, "bigger", "test")
    actuator = Actuator(FakeSlurm(job), TO, clock)
    h = actuator.advance(a, History.begin(T0), jd, spec, job).history
    clock.t += 181
    assert actuator.advance(a, h, jd, spec, job).phase == P.FAILED
    c = ctl.read_control(jd.control_path, jd.uid)
    assert (c.generation, c.action, c.layout, c.world_size, c.global_batch_size) == \
        (2, action, layout, world, 60)


def test_cancel_after_ack_timeout_writes_a_continue_generation(jd, store, writes):
    clock = Clock()
    spec = jd.read_spec()
    a = Action(JOB, ChangeKind.BATCH, 1, 1, 128, 0, "bigger", "test")
    actuator = Actuator(FakeSlurm(info()), TO, clock)
    h = actuator.advance(a, History.begin(T0), jd, spec, info()).history
    first = ctl.read_control(jd.control_path, jd.uid)
    assert first.ack_by == first.issued_at + TO.ack   # the deadline the job answers by
    clock.t += 181
    adv = actuator.advance(a, h, jd, spec, info())
    assert adv.phase == P.FAILED and "did not acknowledge" in adv.why
    c = ctl.read_control(jd.control_path, jd.uid)
    assert (c.generation, c.action, c.nodes, c.global_batch_size) == (2, "continue", 1, 64)
    assert c.reason.startswith("cancelled: ") and writes == [1, 2]
    assert c.ack_by == 0.0   # nothing waits for the cancelling generation's answer


# -- planning --------------------------------------------------------------------------------------

SPEC = JobSpec(job_uid="u", script="t.py", script_args=(), python="python3", submit_dir="/",
               sbatch_args=(), nodes=2, limits=JobLimits(4, 1, 4, 32, 512, 32, 128, "linear"),
               checkpoint_dir="/c")


@pytest.mark.parametrize("state, nodes_now, gbs_now, nodes, batch, kind, to_nodes, split", [
    ("RUNNING", 2, 128, None, 256, "batch", 2, (256, 32, 1)),
    ("RUNNING", 2, 128, 1, None, "shrink", 1, (128, 32, 1)),
    ("RUNNING", 2, 128, 4, None, "grow", 4, (128, 8, 1)),
    ("RUNNING", 1, 512, None, None, "noop", 1, (512, 32, 4)),    # accumulation above 32/GPU
    ("PENDING", 2, 128, 3, 96, "pending", 3, (96, 8, 1)),
])
def test_plan_resize(state, nodes_now, gbs_now, nodes, batch, kind, to_nodes, split):
    plan = plan_resize(SPEC, Current(state, nodes_now, gbs_now, 5), nodes, batch)
    b = plan.batch
    assert (plan.kind, plan.nodes, plan.from_nodes, plan.generation) == (kind, to_nodes,
                                                                         nodes_now, 6)
    assert (b.global_batch_size, b.local_batch_size, b.accumulation_steps) == split
    assert plan.lr_scale == pytest.approx(b.global_batch_size / 128)


@pytest.mark.parametrize("current, nodes, batch, message", [
    (Current("COMPLETED", 2, 128, 0), 1, None, "only RUNNING or PENDING"),
    (Current("RUNNING", 2, 128, 0), 5, None, "outside the job's limits [1, 4] nodes"),
    (Current("RUNNING", 2, 128, 0), None, 1024, "outside the job's limits [32, 512]"),
    (Current("RUNNING", 2, 128, 0), 3, 100, "cannot be cut evenly over 12 GPUs"),
])
def test_plan_resize_refusals(current, nodes, batch, message):
    with pytest.raises(ResizeRefused, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan_resize(SPEC, current, nodes, batch)


def _control(gen, nodes=2, gbs=256):
    return ctl.Control(job_uid="u", generation=gen, action="continue", nodes=nodes,
                       workers_per_node=4, global_batch_size=gbs,
                       local_batch_size=gbs // (4 * nodes), accumulation_steps=1, lr_scale=1.0,
                       issued_at=0.0)


@pytest.mark.parametrize("job, control, ack_, expected", [
    # nothing written: Slurm's nodes, the submitted batch
    (info(node_count=2), None, None, Current("RUNNING", 2, 128, 0)),
    # requested, not applied: the batch applied last, the highest generation
    (info(node_count=2), _control(2), ack(1, "applied", nodes=2, gbs=64),
     Current("RUNNING", 2, 64, 2)),
    # checkpointed for it (no applied ack in the file): the requested batch
    (info(node_count=2), _control(2), ack(2, "checkpointed", nodes=2, gbs=64),
     Current("RUNNING", 2, 256, 2)),
    # applied: what the job acknowledged
    (info(node_count=2), _control(2), ack(2, "applied", nodes=2, gbs=192),
     Current("RUNNING", 2, 192, 2)),
    # a running job's nodes are Slurm's, whatever was requested
    (info(node_count=1), _control(3, nodes=2), None, Current("RUNNING", 1, 256, 3)),
    # a pending job's nodes: the requested ones, else Slurm's, else the submitted ones
    (info("PENDING", node_count=3), _control(1, nodes=1, gbs=128), None,
     Current("PENDING", 1, 128, 1)),
    (info("PENDING", node_count=3), None, None, Current("PENDING", 3, 128, 0)),
    (info("PENDING", node_count=0), None, None, Current("PENDING", 2, 128, 0)),
])
def test_current_from(job, control, ack_, expected):
    assert current_from(SPEC, job, control, ack_) == expected


# -- hpcsched resize: the same steps in a loop ------------------------------------------------------


class AnsweringSlurm(FakeSlurm):
    """A fake Slurm whose job answers its control file whenever Slurm is asked about it."""

    def __init__(self, job, jd):
        super().__init__(job)
        self.jd = jd

    def job(self, job_id):
        job_side(self.jd, self)
        return super().job(job_id)


@pytest.fixture
def cli_slurm(jd, monkeypatch):
    from hpcsched.daemon import resize_cli

    sl = AnsweringSlurm(info(), jd)
    monkeypatch.setattr(resize_cli, "CLISlurmControl", lambda: sl)
    monkeypatch.setattr(resize_cli, "SLURM_CHECK_S", 0.0)
    return sl


def _resize(*args):
    from click.testing import CliRunner

    from hpcsched.daemon.resize_cli import resize_command

    return CliRunner().invoke(resize_command, [JOB, *args])


def test_resize_command_grows_by_requeue(cli_slurm, jd, writes):
    import json

    res = _resize("--gpus", "4", "--json", "--reason", "more")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert (out["kind"], out["nodes"], out["from_nodes"], out["phase"]) == ("grow", 2, 1, "running")
    assert out["checkpointed"] and out["requeued"] and out["seconds"] is not None
    assert cli_slurm.count("requeue") == 1 and cli_slurm.count("update", StartTime="now") == 1
    assert cli_slurm.info.node_count == 2 and writes == [1]
    c = ctl.read_control(jd.control_path, jd.uid)
    assert (c.action, c.issued_by, c.reason) == ("checkpoint-and-requeue", "hpcsched resize", "more")


def test_resize_command_no_wait_returns_once_requested(cli_slurm, jd, writes):
    res = _resize("--batch-size", "128", "--no-wait")
    assert res.exit_code == 0, res.output
    assert "batch: global batch 64 -> 128" in res.output and "generation 1 requested" in res.output
    assert writes == [1] and cli_slurm.calls == [("job", JOB)]


@pytest.mark.parametrize("args, code, message", [
    (["--gpus", "3"], 2, "refused: --gpus 3 is not a multiple of the job's 2 GPUs per node"),
    (["--nodes", "9"], 2, "refused: 9 node(s) is outside the job's limits [1, 4]"),
    (["--nodes", "1", "--gpus", "2"], 2, "give one of --nodes, --gpus and --layout"),
    (["--layout", "n1:4", "--gpus", "2"], 2, "give one of --nodes, --gpus and --layout"),
    (["--layout", "n1:4,n1:2"], 2, "node n1 named twice"),
    (["--layout", "n1:0"], 2, "must be >= 1"),
    (["--layout", "n1:99"], 2, "refused: 99 GPUs is outside the job's limits"),
    (["--batch-size", "64"], 0, "(nothing to change)"),
])
def test_resize_command_refusals(cli_slurm, args, code, message):
    res = _resize(*args)
    assert (res.exit_code, message in res.output) == (code, True), res.output


def test_resize_command_reports_a_rejection(cli_slurm, jd, monkeypatch):
    def reject(jd_, sl):
        c = ctl.read_control(jd_.control_path, jd_.uid)
        if c is not None:
            ctl.write_ack(jd_.ack_path, ctl.Ack(
                job_uid=jd_.uid, generation=c.generation, state="rejected", world_size=2,
                nodes=1, global_batch_size=64, local_batch_size=32, accumulation_steps=1,
                step=1, time=T0, message="world size differs"))

    monkeypatch.setitem(globals(), "job_side", reject)
    res = _resize("--batch-size", "128")
    assert res.exit_code == 1
    assert "failed: job 7 rejected generation 1: world size differs" in res.output


def _first_step(store, jd, job: slurm.JobInfo, kind: str, nodes: int, batch: tuple[int, int],
                placement: tuple[str, ...]) -> ctl.Control:
    """The control file written by the first step of a journaled ``kind`` action to ``nodes``
    nodes, batch ``batch[0] -> batch[1]``, ``placement``, of ``job`` on a fake Slurm."""
    sl = FakeSlurm(job)
    aid = store.plan_action(job_id=JOB, kind=kind, generation=1, from_nodes=nodes,
                            to_nodes=nodes, from_batch_size=batch[0], to_batch_size=batch[1],
                            restarts_at_plan=0, reason="test", placement=placement, created_at=T0)
    (row,) = [r for r in store.actions() if r.id == aid]
    action, hist = act.journaled(row, "test")
    act.Actuator(sl, TO, Clock()).advance(action, hist, jd, jd.read_spec(), sl.info,
                                          lambda *x: store.set_action_phase(aid, x[0], at=x[1]))
    c = ctl.read_control(jd.control_path, jd.uid)
    assert c is not None
    return c


def test_a_batch_change_of_a_job_on_extensions_is_a_reform_onto_its_layout(jd, store, writes):
    """A job on extension allocations runs layout-sum workers, not nodes x GPUs per node: a
    batch-only change re-forms it on the layout it runs (``continue_layout``; the daemon
    journals a ``reform``), so the job, which refuses a ``continue`` of another world size,
    applies it (seen on the dev cluster: 'continue' asks for world size 8 but the job runs 16
    workers), and a launcher that starts again ignores the layout (a reform's)."""
    from hpcsched.job.launcher import effective_config

    layout = {"n1": 2, "n2": 2, "n3": 1}
    ctl.write_ack(jd.ack_path, ctl.Ack(job_uid=jd.uid, generation=0, state="applied",
                                       world_size=5, nodes=3, global_batch_size=60,
                                       local_batch_size=12, accumulation_steps=1, step=0,
                                       time=T0, layout=layout))
    running = info(node_count=1)
    pairs = continue_layout(running, ctl.read_ack(jd.ack_path, jd.uid), 2)
    assert pairs == ("n1:2", "n2:2", "n3:1")
    assert continue_layout(running, None, 2) == ()
    c = _first_step(store, jd, running, "reform", 3, (60, 120), pairs)
    assert (c.action, c.layout, c.nodes, c.world_size) == (ControlAction.REFORM, layout, 3, 5)
    assert c.global_batch_size == 120 and c.local_batch_size * c.accumulation_steps == 24
    assert effective_config(jd.read_spec(), c, 1).workers_per_node == 2, "the job's own"


def test_a_start_at_fewer_gpus_per_node_launches_that_many(jd, store, writes):
    """The daemon's start of a pending job at its fewest GPUs (1 of the 2 per node it asked):
    the generation's layout sets the workers per node its launcher starts."""
    from hpcsched.job.launcher import effective_config

    c = _first_step(store, jd, info("PENDING"), "pending", 1, (64, 64), ("n1:1",))
    assert (c.action, c.layout, c.workers_per_node) == (ControlAction.CONTINUE, {"n1": 1}, 1)
    assert effective_config(jd.read_spec(), c, 1).workers_per_node == 1


def test_a_batch_change_of_a_job_started_at_fewer_gpus_per_node_keeps_its_world_size(jd, store,
                                                                                     writes):
    """A job the daemon started at 1 of the 2 GPUs per node it asked runs 1 worker: a
    batch-only change is a ``continue`` carrying the primary's layout, so its world size is 1,
    not nodes x 2 (seen in the demo: 'continue' asks for world size 4 but the job runs 1
    workers), and its batch is cut over 1 GPU; a job on the GPUs per node it asked, or on
    extensions, is as before."""
    from hpcsched.job.launcher import effective_config

    started_small = info(gpus_per_node=1)
    assert batch_layout(started_small, None, 2) == (ChangeKind.BATCH, ("n1:1",))
    assert batch_layout(info(node_count=2, gpus_per_node=1), None, 2) == \
        (ChangeKind.BATCH, ("n1:1", "n2:1"))
    assert batch_layout(info(), None, 2) == (ChangeKind.BATCH, ())
    on_extensions = ctl.Ack(job_uid=jd.uid, generation=0, state="applied", world_size=3,
                            nodes=2, global_batch_size=60, local_batch_size=20,
                            accumulation_steps=1, step=0, time=T0, layout={"n1": 1, "n2": 2})
    assert batch_layout(started_small, on_extensions, 2) == \
        (ChangeKind.REFORM, ("n1:1", "n2:2"))

    c = _first_step(store, jd, started_small, "batch", 1, (64, 48), ("n1:1",))
    assert (c.action, c.layout, c.world_size) == (ControlAction.CONTINUE, {"n1": 1}, 1)
    assert (c.global_batch_size, c.local_batch_size * c.accumulation_steps) == (48, 48)
    assert effective_config(jd.read_spec(), c, 1).workers_per_node == 1


def test_resize_command_changes_the_batch_of_a_job_started_at_fewer_gpus_per_node(cli_slurm, jd,
                                                                                  writes):
    """``hpcsched resize --batch-size`` of a job running 1 of the 2 GPUs per node it asked:
    the batch is cut over its 1 GPU and the ``continue`` carries its layout (world size 1),
    as the daemon's batch changes (:func:`~hpcsched.daemon.layouts.batch_layout`)."""
    spec = jd.read_spec()
    jd.write_spec(replace(spec, limits=replace(spec.limits, min_gpu_count=1)))
    cli_slurm.info = info(gpus_per_node=1)
    res = _resize("--batch-size", "48", "--no-wait")
    assert res.exit_code == 0, res.output
    assert "1 GPUs on n1:1" in res.output and "local 48 x 1" in res.output, res.output
    c = ctl.read_control(jd.control_path, jd.uid)
    assert (c.action, c.layout, c.world_size, c.global_batch_size) == \
        (ControlAction.CONTINUE, {"n1": 1}, 1, 48)
