"""The resize state machine, pure: phases, legal transitions, and :func:`next_step`.

A resize (an :class:`Action`) moves through :class:`ResizePhase` phases, each journaled by the
daemon with its time (:class:`History`). :func:`next_step` takes what was read this round
(:class:`Observed`: the job's control generation and acknowledgement, Slurm's view of the job,
the time) and returns the next phase with the effects that carry it out, as data
(:data:`Effect`); :class:`hpcsched.daemon.actuator.Actuator` executes them. Nothing here reads a
file, asks Slurm or looks at a clock, so every transition has a table-driven test
(``tests/test_actuator.py``). The design follows Ray autoscaler v2's instance manager: an
explicit table of legal transitions, a history with timestamps, timeouts computed from the
history (``has_timeout``), and a reconciler that runs one pass per tick and never waits.

Paths by change kind (:class:`~hpcsched.protocol.kinds.ChangeKind`)::

    batch, pending   requested -> running
    shrink           requested -> checkpointed -> running
    grow             requested -> checkpointed -> requeued -> released -> rescheduled -> running
    preempt          requested -> checkpointed -> requeued -> running (= held with a deadline)
    reform           requested -> running (the job re-formed on the layout; no restart)
    any              ... -> failed

A **preemption** (a running job a plan gives 0 GPUs) is a grow's first half: the job checkpoints
(``checkpoint-and-requeue`` at the size it resumes at, :attr:`Action.nodes`), is requeued, and
once PENDING (and :data:`REQUEUE_START_DELAY_S` after the requeue) gets ``StartTime=now+<hold>``
(``Timeouts.hold``, ``daemon.preemption_deadline``): the action is then done (``running``: the
preemption is in force) and the job pends with reason ``BeginTime``. That begin time is the
guard: Slurm itself starts the job when it passes, whether or not a daemon runs. A plan that
gives the job GPUs again releases it early with a ``pending`` change, whose first step sends
``StartTime=now`` after the generation is written.

=============  =========================================================================
phase          meaning (what has been done; what the next step waits for)
=============  =========================================================================
requested      journaled; the control generation is written by the first step (and again
               by any later step that does not see it); waits for the job's ack
checkpointed   the job acknowledged ``checkpointed``: a shrink finishes by itself; a grow
               is requeued once Slurm shows it RUNNING at the restart count of the plan
requeued       ``scontrol requeue`` done (Slurm's restart count went up); waits for PENDING
released       PENDING job resized (``NumNodes``...) and ``StartTime=now+2`` set
rescheduled    ``StartTime=now`` sent, at least :data:`REQUEUE_START_DELAY_S` after the requeue
running        the job acknowledged ``applied`` for the generation (a pending job: the
               generation is written and the job still pends, so its launcher starts with it;
               a preemption: the requeued job pends with ``StartTime=now+<hold>``)
failed         ended, superseded, rejected, refused by Slurm, or timed out (``why`` says)
=============  =========================================================================

Timeouts (:class:`Timeouts`), from the history: ``ack`` seconds from ``requested`` until the job
checkpoints or applies (then a generation never acknowledged is cancelled by a ``continue``
generation at the job's current size, so a late acknowledgement never starts a stale resize);
``start`` seconds from ``requeued`` until the job runs again (a preemption: until it pends).
``hold`` is a preempted job's deadline, not a timeout of the action.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from hpcsched.daemon.layouts import running_layout
from hpcsched.protocol.kinds import ACTION_FOR_KIND, AckState, ChangeKind, ControlAction, SlurmState

if TYPE_CHECKING:
    from hpcsched.protocol.files import Ack
    from hpcsched.slurm import JobInfo

#: Seconds between a requeue and the job's next start. Slurm holds a requeued job for 121 s
#: (credential expiry) unless told otherwise, but a job started again within the second of the
#: requeue is killed by slurmd ("Killing non-startable batch JobId=N: Job credential revoked")
#: and ends FAILED (measured on 22.05.8, dev cluster). Credential times have 1 s resolution, so
#: 2 s is the least that is always safe.
REQUEUE_START_DELAY_S = 2

#: Slurm job states after which a job runs no more (``squeue --json`` ``job_state``)
ENDED = SlurmState.ENDED


class ResizePhase(StrEnum):
    """Where a resize is (the journal's ``actions.phase``; module docstring for each)."""

    REQUESTED = "requested"
    CHECKPOINTED = "checkpointed"
    REQUEUED = "requeued"
    RELEASED = "released"
    RESCHEDULED = "rescheduled"
    RUNNING = "running"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return not TRANSITIONS[self]


P = ResizePhase
#: The legal transitions. A step may also stay in its phase (with or without effects).
TRANSITIONS: dict[ResizePhase, frozenset[ResizePhase]] = {
    # the job checkpointed (shrink, grow); applied (batch, pending: straight to running)
    P.REQUESTED: frozenset({P.CHECKPOINTED, P.RUNNING, P.FAILED}),
    # a grow's requeue; a shrink applied in place or by relaunch
    P.CHECKPOINTED: frozenset({P.REQUEUED, P.RUNNING, P.FAILED}),
    # released once PENDING; running if Slurm started it by itself (the 121 s hold passed
    # while no daemon ran) and it applied
    P.REQUEUED: frozenset({P.RELEASED, P.RUNNING, P.FAILED}),
    P.RELEASED: frozenset({P.RESCHEDULED, P.RUNNING, P.FAILED}),
    P.RESCHEDULED: frozenset({P.RUNNING, P.FAILED}),
    P.RUNNING: frozenset(),
    P.FAILED: frozenset(),
}
OPEN_PHASES = tuple(p for p in ResizePhase if TRANSITIONS[p])
TERMINAL_PHASES = tuple(p for p in ResizePhase if not TRANSITIONS[p])

#: the phases each kind passes through when all goes well (documentation and tests)
PATHS: dict[ChangeKind, tuple[ResizePhase, ...]] = {
    ChangeKind.BATCH: (P.REQUESTED, P.RUNNING),
    ChangeKind.PENDING: (P.REQUESTED, P.RUNNING),
    ChangeKind.SHRINK: (P.REQUESTED, P.CHECKPOINTED, P.RUNNING),
    ChangeKind.GROW: (P.REQUESTED, P.CHECKPOINTED, P.REQUEUED, P.RELEASED, P.RESCHEDULED,
                      P.RUNNING),
    ChangeKind.PREEMPT: (P.REQUESTED, P.CHECKPOINTED, P.REQUEUED, P.RUNNING),
    ChangeKind.REFORM: (P.REQUESTED, P.RUNNING),
}

#: the kinds that checkpoint and then requeue a running job
REQUEUES = (ChangeKind.GROW, ChangeKind.PREEMPT)



class IllegalTransition(ValueError):
    """A transition that :data:`TRANSITIONS` does not allow."""


def check_transition(old: str, new: str) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is legal (strings or phases).

    Raises:
        IllegalTransition: ``new`` is not a phase, or not a legal successor of ``old``.
    """
    try:
        a, b = ResizePhase(old), ResizePhase(new)
    except ValueError:
        raise IllegalTransition(f"unknown phase in {old!r} -> {new!r}; valid: "
                                f"{'|'.join(ResizePhase)}") from None
    if b not in TRANSITIONS[a]:
        raise IllegalTransition(f"illegal transition {a} -> {b}")


@dataclass(frozen=True)
class History:
    """The phases an action has been in, with the Unix time (s) it entered each, oldest first."""

    entries: tuple[tuple[ResizePhase, float], ...]

    @classmethod
    def begin(cls, at: float) -> History:
        """A new action, ``requested`` at ``at``."""
        return cls(((ResizePhase.REQUESTED, float(at)),))

    @classmethod
    def parse(cls, pairs) -> History:
        """From the journal's ``[[phase, time], ...]``."""
        return cls(tuple((ResizePhase(p), float(t)) for p, t in pairs))

    @property
    def phase(self) -> ResizePhase:
        return self.entries[-1][0]

    @property
    def started(self) -> float:
        """When the action was requested (Unix s)."""
        return self.entries[0][1]

    def entered(self, phase: ResizePhase) -> float | None:
        """When the action last entered ``phase`` (Unix s), or None."""
        for p, t in reversed(self.entries):
            if p == phase:
                return t
        return None

    def then(self, phase: ResizePhase, at: float) -> History:
        """This history followed by ``phase`` at ``at``; the same history for a stay.

        Raises:
            IllegalTransition: see :data:`TRANSITIONS`.
        """
        if phase == self.phase:
            return self
        check_transition(self.phase, phase)
        return History(self.entries + ((ResizePhase(phase), float(at)),))

    def has_timeout(self, since: ResizePhase, timeout: float, now: float) -> bool:
        """More than ``timeout`` s have passed since the action entered ``since``."""
        t = self.entered(since)
        return t is not None and now - t > timeout


@dataclass(frozen=True)
class Action:
    """A resize in flight: what it takes to resume it after a crash (the daemon journals it).

    Sizes in nodes, ``batch_size`` in samples (global). ``restarts_at_plan`` is Slurm's restart
    count of the job when the action was planned: a grow requeues the job only while the count
    is unchanged, so a resumed action never requeues twice. ``placement``: nodes to start on (a
    pending job, or a grow after its requeue); empty lets Slurm choose. For a ``preempt``,
    ``nodes`` is the size the job resumes at (its size now; the plan's 0 is in the journal's
    ``to_nodes``): the control generation asks for it, and the requeued job is given it.
    A ``reform``'s ``placement`` is its layout, ``node:GPUs`` pairs (``("n1:4", "n2:2")``); so
    is a grow's that requeues the job onto another number of GPUs per node (``("n4:2",)``).
    """

    job_id: str
    kind: ChangeKind
    generation: int
    nodes: int
    batch_size: int
    restarts_at_plan: int
    reason: str = ""
    issued_by: str = "hpcsched resize"
    placement: tuple[str, ...] = ()

    @property
    def layout(self) -> tuple[str, ...]:
        """The ``node:GPUs`` pairs of a layout (empty: ``placement`` names nodes only)."""
        return self.placement if self.placement and ":" in self.placement[0] else ()

    @property
    def nodes_placed(self) -> tuple[str, ...]:
        """The nodes to start on."""
        return tuple(p.split(":")[0] for p in self.placement)

    @property
    def gpus_per_node(self) -> int:
        """A layout's GPUs per node for a requeue onto it (0: the job's own)."""
        return int(self.layout[0].split(":")[1]) if self.layout else 0


@dataclass(frozen=True)
class Observed:
    """What was read for one step.

    Attributes:
        now: Unix time (s) of the reading.
        control_generation: the generation in ``control.json``; None when there is none (or it
            cannot be read: it is then written again).
        ack: ``ack.json``, or None (none yet, or unreadable).
        job: Slurm's view of the job; None when Slurm no longer knows it.
    """

    now: float
    control_generation: int | None
    ack: Ack | None
    job: JobInfo | None


@dataclass(frozen=True)
class Timeouts:
    """Seconds: ``ack`` from the request to the job's checkpoint or application; ``start`` from
    the requeue to the job's first step at the new size (a preemption: to its hold); ``hold``:
    how long a preempted job pends at most (its ``StartTime=now+<hold>``; Slurm starts it then,
    daemon or not)."""

    ack: float = 180.0
    start: float = 300.0
    hold: float = 1800.0


# -- effects: what a step asks the executor to do, in order -----------------------------------


@dataclass(frozen=True)
class WriteControl:
    """Write ``control.json`` generation ``generation`` (batch refitted to the job's limits)."""

    generation: int
    action: ControlAction
    nodes: int
    global_batch_size: int
    layout: tuple[str, ...] = ()   # a reform's ``node:GPUs`` pairs


@dataclass(frozen=True)
class CancelGeneration:
    """Supersede an unanswered generation by one at what the job runs now (the acknowledged
    configuration's nodes and batch split): a ``continue``, or, for a job on extension
    allocations, a ``reform`` onto the layout it runs; ``layout``: its ``node:GPUs`` pairs
    where they are not nodes x the GPUs per node it was submitted with
    (:func:`~hpcsched.daemon.layouts.running_layout`), so that the job, which refuses another world size, takes it."""

    generation: int
    nodes: int
    global_batch_size: int
    local_batch_size: int
    accumulation_steps: int
    why: str
    layout: tuple[str, ...] = ()
    action: ControlAction = ControlAction.CONTINUE


@dataclass(frozen=True)
class ResizePendingJob:
    """``scontrol update NumNodes=<n>-<n> NumTasks NumCPUs ReqNodeList`` on a PENDING job.
    ``required``: a refusal fails the action (else it is a note, and the job starts at what
    Slurm allows)."""

    nodes: int
    placement: tuple[str, ...]
    cpus_per_task: int
    required: bool
    workers_per_node: int = 0   # GPUs (= tasks) per node; 0: the job's own


@dataclass(frozen=True)
class Requeue:
    """``scontrol requeue`` the job (only ever emitted at the restart count of the plan)."""


@dataclass(frozen=True)
class SetStartTime:
    """``scontrol update StartTime=<when>``; a job already started is not an error."""

    when: str


Effect = WriteControl | CancelGeneration | ResizePendingJob | Requeue | SetStartTime


@dataclass(frozen=True)
class Step:
    """:func:`next_step`'s answer: the phase to journal (the same one: stay), the effects to
    execute first, ``why`` for ``failed``, and a ``note`` worth logging."""

    phase: ResizePhase
    effects: tuple[Effect, ...] = ()
    why: str = ""
    note: str = ""


def requeue_start_due(requeued_at: float) -> float:
    """The earliest Unix time for ``StartTime=now`` after a requeue at ``requeued_at``: slurmd
    revokes the credential within the second the requeue reached it, and a credential dated at
    least one whole second later is valid (measured, Slurm 22.05.8)."""
    return math.floor(requeued_at) + REQUEUE_START_DELAY_S + 0.05


# -- the step ------------------------------------------------------------------------------------


def next_step(action: Action, history: History, obs: Observed,
              timeouts: Timeouts = Timeouts()) -> Step:
    """The next phase of ``action`` given ``history`` and this reading (pure).

    Checks in order: terminal phase (stay); the job ended or is gone; a newer generation
    superseded this one; the job rejected or applied it; then the phase's own rule
    (:data:`_RULES`), which may time out.
    """
    phase = history.phase
    if phase.terminal:
        return Step(phase)
    return (_ended(action, obs) or _superseded(action, obs)
            or _answered(action, obs) or _RULES[phase](action, history, obs, timeouts))


def _ended(a: Action, obs: Observed) -> Step | None:
    if obs.job is None or obs.job.state in ENDED:
        state = obs.job.state if obs.job is not None else "gone"
        return Step(P.FAILED, why=f"job {a.job_id} ended ({state}) before it applied generation "
                                  f"{a.generation}")
    return None


def _job(obs: Observed) -> JobInfo:
    """Slurm's view of the job, for a phase's rule: :func:`next_step` ends an action whose job
    is gone (:func:`_ended`) before any rule runs."""
    assert obs.job is not None, "a phase rule for a job Slurm no longer knows"
    return obs.job


def _requeued_at(h: History) -> float:
    """When the action was requeued, for the rules of the phases after ``requeued``."""
    at = h.entered(P.REQUEUED)
    assert at is not None, "no requeue in the history"
    return at


def _superseded(a: Action, obs: Observed) -> Step | None:
    newer = max(obs.control_generation or 0, obs.ack.generation if obs.ack else 0)
    if newer > a.generation:
        return Step(P.FAILED, why=f"job {a.job_id}: generation {a.generation} was superseded by "
                                  f"{newer}")
    return None


def _answered(a: Action, obs: Observed) -> Step | None:
    ack = obs.ack
    if ack is None or ack.generation != a.generation:
        return None
    if ack.state == AckState.REJECTED:
        return Step(P.FAILED, why=f"job {a.job_id} rejected generation {a.generation}: "
                                  f"{ack.message}")
    if ack.state == AckState.APPLIED and a.kind == ChangeKind.PREEMPT:
        # its launcher gave up waiting for the requeue, or Slurm started it before the hold
        return Step(P.FAILED, why=f"job {a.job_id} runs again at generation {a.generation}: "
                                  "not preempted")
    if ack.state == AckState.APPLIED:
        note = (f"Slurm started the job on {ack.nodes} node(s), not {a.nodes}"
                if ack.nodes != a.nodes else "")
        return Step(P.RUNNING, note=note)
    return None  # checkpointed: the phase's rule


def _requested(a: Action, h: History, obs: Observed, t: Timeouts) -> Step:
    if obs.control_generation is None or obs.control_generation < a.generation:
        return _request(a, obs)
    job = _job(obs)
    if a.kind == ChangeKind.PENDING and job.state == SlurmState.PENDING:
        # the launcher starts with this generation; a job hpcsched preempted is released (again,
        # if a daemon died between the generation and the release: StartTime is idempotent)
        return Step(P.RUNNING, _release_held(job))
    if obs.ack is not None and obs.ack.generation == a.generation:  # checkpointed
        return Step(P.CHECKPOINTED)
    if h.has_timeout(P.REQUESTED, t.ack, obs.now):
        return _unanswered(a, obs, t)
    return Step(P.REQUESTED)


def _request(a: Action, obs: Observed) -> Step:
    """Write the generation; a pending job is given its size first (it may start any moment,
    and its launcher starts with the generation in force), and a held one (preempted, or held
    for placement by job_submit.lua) the plan's nodes."""
    job = _job(obs)
    effects: list[Effect] = []
    placed = a.nodes_placed and held_by_begin_time(job)   # released where the plan puts it
    per_node = a.gpus_per_node and a.gpus_per_node != job.gpus_per_node
    if a.kind == ChangeKind.PENDING and job.state == SlurmState.PENDING and (job.node_count != a.nodes
                                                                     or placed or per_node):
        effects.append(ResizePendingJob(a.nodes, a.nodes_placed, job.cpus_per_task, required=True,
                                        workers_per_node=a.gpus_per_node))
    effects.append(WriteControl(a.generation, ACTION_FOR_KIND[a.kind], a.nodes, a.batch_size,
                                a.layout))
    if a.kind == ChangeKind.PENDING:
        effects += _release_held(job)   # after the generation: the launcher starts with it
    return Step(P.REQUESTED, tuple(effects))


def held_by_begin_time(job: JobInfo) -> bool:
    """The job pends until its begin time: reason ``BeginTime`` (a preempted job under its
    guard, or a requeued one in Slurm's 121 s hold), or a requeued job (restart count above 0)
    whose reason is still ``None``: right after ``StartTime=now+<s>`` squeue shows ``None``
    until the scheduler's next pass (about 2 s, measured on 22.05.8)."""
    if job.state != SlurmState.PENDING:
        return False
    return job.state_reason.startswith("BeginTime") or (job.restarts > 0
                                                        and job.state_reason == "None")


def _release_held(job: JobInfo) -> tuple[Effect, ...]:
    """``StartTime=now`` for a job waiting for its begin time (a pending change is planned for
    such a job only when hpcsched preempted it: :func:`hpcsched.daemon.views.eligible`)."""
    return (SetStartTime("now"),) if held_by_begin_time(job) else ()


def _unanswered(a: Action, obs: Observed, t: Timeouts) -> Step:
    """No acknowledgement in time: cancel the generation by a ``continue`` at what the job runs
    (when it has ever acknowledged anything), so a late acknowledgement starts nothing stale."""
    why = (f"job {a.job_id} did not acknowledge generation {a.generation} within "
           f"{t.ack:.0f} s (does the script use hpcsched.elastic?)")
    ack = obs.ack
    if ack is None:
        return Step(P.FAILED, (), why=why)
    action, layout = running_layout(ack, _job(obs))
    return Step(P.FAILED, (CancelGeneration(
        a.generation + 1, len(layout) or ack.nodes, ack.global_batch_size, ack.local_batch_size,
        ack.accumulation_steps, why, layout, action),), why=why)


def _late(a: Action) -> Step:
    """After a checkpoint the job is never cancelled: its launcher resumes it by itself."""
    return Step(P.FAILED, why=f"job {a.job_id} did not run again at generation {a.generation} "
                              "in time")


def _checkpointed(a: Action, h: History, obs: Observed, t: Timeouts) -> Step:
    job = _job(obs)
    if a.kind in REQUEUES:
        if job.restarts > a.restarts_at_plan:   # requeued already (by a daemon that died)
            return Step(P.REQUEUED, note=f"requeued before (restart count {job.restarts})")
        if job.state == SlurmState.RUNNING and job.restarts == a.restarts_at_plan:
            return Step(P.REQUEUED, (Requeue(),))
    if h.has_timeout(P.REQUESTED, t.ack, obs.now):
        return _late(a)
    return Step(P.CHECKPOINTED)   # a shrink: the job's launcher or workers finish it


def _requeued(a: Action, h: History, obs: Observed, t: Timeouts) -> Step:
    if a.kind == ChangeKind.PREEMPT:
        return _hold(a, h, obs, t)
    job = _job(obs)
    if job.state == SlurmState.PENDING:
        # the hold must go whether or not Slurm takes the new size
        return Step(P.RELEASED, (ResizePendingJob(a.nodes, a.nodes_placed, job.cpus_per_task,
                                                  required=False,
                                                  workers_per_node=a.gpus_per_node),
                                 SetStartTime(f"now+{REQUEUE_START_DELAY_S}")))
    return _waiting_to_start(a, h, obs, t, P.REQUEUED)


def _hold(a: Action, h: History, obs: Observed, t: Timeouts) -> Step:
    """A preempted job, once PENDING and :data:`REQUEUE_START_DELAY_S` after its requeue (so that
    a release soon after cannot start it with a revoked credential): its resume size, and
    ``StartTime=now+<hold>``, the guard that starts it without any daemon. Until then it is in
    Slurm's own 121 s hold, which releases it too."""
    job = _job(obs)
    if job.state == SlurmState.PENDING and obs.now >= requeue_start_due(_requeued_at(h)):
        return Step(P.RUNNING, (ResizePendingJob(a.nodes, (), job.cpus_per_task, required=False),
                                SetStartTime(f"now+{math.ceil(t.hold)}")),
                    note=f"job {a.job_id} preempted: held until Slurm starts it in "
                         f"{math.ceil(t.hold)} s, or a plan gives it GPUs")
    return _waiting_to_start(a, h, obs, t, P.REQUEUED)


def _released(a: Action, h: History, obs: Observed, t: Timeouts) -> Step:
    if _job(obs).state == SlurmState.PENDING and obs.now >= requeue_start_due(_requeued_at(h)):
        # an update wakes the scheduler at once; a begin time that merely passes waits for its
        # next periodic pass (13 s measured)
        return Step(P.RESCHEDULED, (SetStartTime("now"),))
    return _waiting_to_start(a, h, obs, t, P.RELEASED)


def _rescheduled(a: Action, h: History, obs: Observed, t: Timeouts) -> Step:
    return _waiting_to_start(a, h, obs, t, P.RESCHEDULED)


def _waiting_to_start(a: Action, h: History, obs: Observed, t: Timeouts,
                      phase: ResizePhase) -> Step:
    if h.has_timeout(P.REQUEUED, t.start, obs.now):
        return _late(a)
    return Step(phase)


#: each open phase's own rule, after the checks common to all
_RULES = {
    P.REQUESTED: _requested,
    P.CHECKPOINTED: _checkpointed,
    P.REQUEUED: _requeued,
    P.RELEASED: _released,
    P.RESCHEDULED: _rescheduled,
}

__all__ = [
    "ENDED",
    "OPEN_PHASES",
    "PATHS",
    "REQUEUES",
    "REQUEUE_START_DELAY_S",
    "TERMINAL_PHASES",
    "TRANSITIONS",
    "Action",
    "CancelGeneration",
    "Effect",
    "History",
    "IllegalTransition",
    "Observed",
    "Requeue",
    "ResizePendingJob",
    "ResizePhase",
    "SetStartTime",
    "Step",
    "Timeouts",
    "WriteControl",
    "check_transition",
    "held_by_begin_time",
    "next_step",
    "requeue_start_due",
]
