"""The resize actuator: change a running or pending hpcsched job's batch size and node count.

Planning (:func:`plan_resize`) is a pure function of the job's spec, its Slurm state and the
control generation in force. Carrying a plan out is the state machine of
:mod:`hpcsched.daemon.phases` (pure :func:`~hpcsched.daemon.phases.next_step`), whose effects
:class:`Actuator` executes through control files and an injected
:class:`~hpcsched.slurm.control.SlurmControl`. The protocol (``docs/control-protocol.md``),
measured on Slurm 22.05:

* **batch size only** (same nodes): write a new control generation; the workers switch local
  batch size / accumulation / learning-rate scale at their next step boundary. No restart.
* **shrink** (fewer nodes): control generation with ``checkpoint-and-shrink``; the job
  checkpoints, acknowledges, and shrinks its allocation from inside (in place, or by relaunch).
  No requeue.
* **grow** (more nodes; Slurm 22.05 cannot grow a GRES job in place): control generation with
  ``checkpoint-and-requeue``; once the job acknowledges its checkpoint, ``scontrol requeue``;
  once it is PENDING, ``scontrol update NumNodes=<n>-<n> NumTasks=...`` and
  ``StartTime=now+2``, then ``StartTime=now`` once 2 s have passed since the requeue (without it
  a requeued job waits 121 s; started within the second of the requeue it is killed for a
  revoked credential; an update sent while the job is still COMPLETING is lost). It resumes
  from the checkpoint at the new size.
* **pending** job: ``scontrol update NumNodes=<n>`` before it starts, then a control generation
  so the launcher starts with the new batch configuration (a job hpcsched preempted: then
  ``StartTime=now``, its release).
* **preempt** (0 GPUs for a running job): a grow's first half: ``checkpoint-and-requeue`` at the
  job's size, ``scontrol requeue``, and once PENDING ``NumNodes=<size>`` and
  ``StartTime=now+<daemon.preemption_deadline>``: the job pends (reason ``BeginTime``) until a
  plan releases it, or Slurm starts it at that deadline whether or not a daemon still runs.

A job that does not acknowledge within the timeout gets a further ``continue`` generation at its
current size, so a late acknowledgement never triggers a stale resize.

:meth:`Actuator.advance` takes one step and returns: the daemon calls it once per open action
per round (nothing waits inside a round); ``hpcsched resize`` (:mod:`hpcsched.daemon.resize_cli`)
calls it in a loop until the job runs at the new size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import ClassVar

from hpcsched import slurm
from hpcsched.daemon.layouts import batch_layout, layout_in_force
from hpcsched.daemon.phases import (
    ENDED,
    REQUEUE_START_DELAY_S,
    TRANSITIONS,
    Action,
    CancelGeneration,
    Effect,
    History,
    Observed,
    Requeue,
    ResizePendingJob,
    ResizePhase,
    SetStartTime,
    Step,
    Timeouts,
    WriteControl,
    next_step,
)
from hpcsched.policies.realise import Mechanism
from hpcsched.policies.reconcile import Change
from hpcsched.protocol import files as ctl
from hpcsched.protocol.batching import BatchConfig, BatchSizeError
from hpcsched.protocol.extensions import format_layout, layout_pairs, parse_layout
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.kinds import AckState, ChangeKind, ControlAction, SlurmState
from hpcsched.protocol.limits import JobLimits
from hpcsched.slurm.control import (
    CLISlurmControl,
    SlurmControl,
    resize_pending_job,
    set_start_time,
)

log = logging.getLogger("hpcsched.daemon.actuator")

NOOP = "noop"   # ResizePlan.kind when nothing changes


class ResizeRefused(ValueError):
    """The request breaks the job's limits or cannot apply in the job's state (``str`` = reason)."""


class ResizeFailed(RuntimeError):
    """The resize was attempted and did not complete (``str`` = what happened)."""


@dataclass(frozen=True)
class Current:
    """What the job is running with now (from Slurm and the control/ack files)."""

    state: str                 # Slurm job state
    nodes: int
    global_batch_size: int
    generation: int            # highest generation written or acknowledged


@dataclass(frozen=True)
class ResizePlan:
    """A resize to apply. ``kind``: a :class:`~hpcsched.protocol.kinds.ChangeKind` (``batch``,
    ``shrink``, ``grow``, ``pending``) or :data:`NOOP`."""

    kind: str
    nodes: int
    from_nodes: int
    batch: BatchConfig
    from_global_batch_size: int
    lr_scale: float
    generation: int
    layout: dict[str, int] = field(default_factory=dict)   # a reform's target

    def describe(self, spec: JobSpec) -> str:
        wpn = spec.limits.workers_per_node
        parts = []
        if self.layout:
            how = "by requeue, " if self.kind == ChangeKind.GROW else ""
            parts.append(f"{how}{self.batch.world_size} GPUs on {format_layout(self.layout)}")
        elif self.nodes != self.from_nodes:
            parts.append(f"{self.from_nodes} -> {self.nodes} node(s) "
                         f"({self.from_nodes * wpn} -> {self.nodes * wpn} GPUs)")
        if self.batch.global_batch_size != self.from_global_batch_size:
            parts.append(f"global batch {self.from_global_batch_size} -> "
                         f"{self.batch.global_batch_size}")
        else:
            parts.append(f"global batch {self.batch.global_batch_size}")
        parts.append(f"local {self.batch.local_batch_size} x {self.batch.accumulation_steps} "
                     f"accumulation, lr x{self.lr_scale:.3g}")
        return f"{self.kind}: " + ", ".join(parts)


def plan_resize(spec: JobSpec, current: Current, nodes: int | None = None,
                batch_size: int | None = None, layout: dict[str, int] | None = None,
                primary: dict[str, int] | None = None) -> ResizePlan:
    """Decide how to move the job to ``nodes`` nodes and global batch ``batch_size`` (pure).

    ``None`` keeps the current value. A node change keeps the global batch size (refitted to
    the new world size, with gradient accumulation above the per-GPU limit). ``layout``
    (``{node: GPUs}``): exactly those GPUs, by extension allocations (``reform``), or by requeue
    when it gives back GPUs of the primary job; ``primary``: the primary job's GPUs per node
    (:func:`~hpcsched.daemon.layouts.layout_in_force`).

    Raises:
        ResizeRefused: outside ``[min_nodes, max_nodes]`` (a layout: ``[min_gpus, max_gpus]``)
            or ``[min_batch_size, max_batch_size]``, or the job is in a state that cannot be
            resized.
    """
    if current.state not in (SlurmState.RUNNING, SlurmState.PENDING):
        raise ResizeRefused(f"the job is {current.state}; only RUNNING or PENDING jobs can be resized")
    if layout:
        return _plan_reform(spec, current, batch_size, layout, primary or {})
    lim = spec.limits
    target_nodes = current.nodes if nodes is None else nodes
    if not lim.allows_nodes(target_nodes):
        raise ResizeRefused(
            f"{target_nodes} node(s) is outside the job's limits [{lim.min_nodes}, "
            f"{lim.max_nodes}] nodes ([{lim.min_gpus}, {lim.max_gpus}] GPUs)")
    if batch_size is not None:
        _check_batch_size(lim, batch_size)
    world = target_nodes * lim.workers_per_node
    want = current.global_batch_size if batch_size is None else batch_size
    try:
        batch = lim.fit_batch(want, target_nodes)
    except BatchSizeError as exc:
        raise ResizeRefused(str(exc)) from None
    if batch_size is not None and batch.global_batch_size != batch_size:
        raise ResizeRefused(
            f"global batch size {batch_size} cannot be cut evenly over {world} GPUs "
            f"(nearest: {batch.global_batch_size})")
    if current.state == SlurmState.PENDING:
        kind = ChangeKind.PENDING
    elif target_nodes != current.nodes:
        kind = ChangeKind.between(current.nodes, target_nodes)
    elif batch.global_batch_size != current.global_batch_size:
        kind = ChangeKind.BATCH
    else:
        kind = NOOP
    return ResizePlan(kind, target_nodes, current.nodes, batch, current.global_batch_size,
                      lim.lr_scale(batch.global_batch_size), current.generation + 1)


def _check_batch_size(lim: JobLimits, batch_size: int) -> None:
    """Raises :class:`ResizeRefused` when ``batch_size`` is outside the job's limits."""
    if not lim.allows_batch_size(batch_size):
        raise ResizeRefused(f"global batch size {batch_size} is outside the job's limits "
                            f"[{lim.min_batch_size}, {lim.max_batch_size}]")


def _plan_reform(spec: JobSpec, current: Current, batch_size: int | None,
                 layout: dict[str, int], primary: dict[str, int]) -> ResizePlan:
    """A layout: in place by extension allocations when the primary keeps its GPUs; else by
    requeue onto a layout of the same GPUs on every node (Slurm cannot release part of a
    running job's GRES; a pending job takes ``TresPerNode``); the extensions end with it."""
    lim = spec.limits
    if current.state != SlurmState.RUNNING:
        raise ResizeRefused("a layout applies to a running job (a pending one: --nodes)")
    gpus = sum(layout.values())
    if not lim.min_gpus <= gpus <= lim.max_gpus:
        raise ResizeRefused(f"{gpus} GPUs is outside the job's limits [{lim.min_gpus}, "
                            f"{lim.max_gpus}] GPUs")
    want = current.global_batch_size if batch_size is None else batch_size
    try:
        batch = lim.fit_batch_gpus(want, gpus)
    except BatchSizeError as exc:
        raise ResizeRefused(str(exc)) from None
    kind = ChangeKind.REFORM
    if any(layout.get(n, 0) < g for n, g in primary.items()):
        # extension workers stop at the requeue's checkpoint too, and their jobs end
        if len(set(layout.values())) != 1:
            raise ResizeRefused("this layout gives back GPUs of the primary job, which needs a "
                                "requeue, and a requeued job has the same GPUs on every node: "
                                f"{format_layout(layout)} does not")
        kind = ChangeKind.GROW   # the requeue path: checkpoint, requeue, resume on the layout
    return ResizePlan(kind, len(layout), current.nodes, batch,
                      current.global_batch_size, lim.lr_scale(batch.global_batch_size),
                      current.generation + 1, dict(layout))


def current_of(jd: JobDir, spec: JobSpec, info: slurm.JobInfo) -> Current:
    """The job's :class:`Current` from Slurm's view and the control/ack files."""
    return current_from(spec, info, read_or_none(ctl.read_control, jd.control_path, jd.uid),
                        read_or_none(ctl.read_ack, jd.ack_path, jd.uid))


def current_from(spec: JobSpec, info: slurm.JobInfo, control: ctl.Control | None,
                 ack: ctl.Ack | None) -> Current:
    """:func:`current_of` for control and ack files already read (pure).

    The generation is the highest written or acknowledged. The global batch size is the
    acknowledged one once the job applied a generation, else the requested one, else the
    submitted one. A running job's nodes are Slurm's; a pending job's are the requested ones
    (its launcher starts with the generation in force), else Slurm's, else the submitted ones.
    """
    generation = max(control.generation if control else 0, ack.generation if ack else 0)
    if ack is not None and ack.state == AckState.APPLIED:
        gbs = ack.global_batch_size
    elif control is not None:
        gbs = control.global_batch_size
    else:
        gbs = spec.limits.base_batch_size
    if info.state == SlurmState.PENDING:
        nodes = control.nodes if control is not None else (info.node_count or spec.nodes)
    else:
        nodes = info.node_count
    return Current(info.state, nodes, gbs, generation)


def plan_for(jd: JobDir, spec: JobSpec, info: slurm.JobInfo | None, nodes: int | None,
             batch_size: int | None, layout: dict[str, int] | None = None) -> ResizePlan:
    """:func:`plan_resize` for a job as it is now; a batch-only change of a running job on a
    layout other than nodes x its GPUs per node is cut over the GPUs it runs
    (:func:`~hpcsched.daemon.layouts.batch_layout`).

    Raises:
        ResizeRefused: see :func:`plan_resize`; also when Slurm has forgotten the job or a
            running job has never reported (its script does not use hpcsched.elastic).
    """
    if info is None:
        raise ResizeRefused(f"Slurm no longer knows job {jd.slurm_job_id}")
    if info.state == SlurmState.RUNNING and not jd.ack_path.exists():
        raise ResizeRefused(
            f"job {info.job_id} has not reported to hpcsched yet: it is still starting, or "
            "its script does not use hpcsched.elastic (then it runs, but cannot be "
            "resized in place)")
    primary = None
    if layout and info.state == SlurmState.RUNNING:
        ack = read_or_none(ctl.read_ack, jd.ack_path, jd.uid)
        _, primary = layout_in_force(info, ack, info.gpus_per_node or spec.limits.workers_per_node)
    current = current_of(jd, spec, info)
    if info.state == SlurmState.RUNNING and batch_size is not None and nodes is None and not layout:
        kind, pairs = batch_layout(info, read_or_none(ctl.read_ack, jd.ack_path, jd.uid),
                                   spec.limits.workers_per_node)
        if pairs:   # the world size it runs is its layout's (batch_layout), not nodes x per node
            return _plan_batch_on(spec, current, batch_size, kind, parse_layout(",".join(pairs)))
    return plan_resize(spec, current, nodes, batch_size, layout, primary)


def _plan_batch_on(spec: JobSpec, current: Current, batch_size: int, kind: ChangeKind,
                   layout: dict[str, int]) -> ResizePlan:
    """A batch-only change of a running job on ``layout`` (:func:`batch_layout`'s ``kind``):
    the batch cut over the layout's GPUs; :data:`NOOP` when it is the batch in force.

    Raises:
        ResizeRefused: the batch size is outside the job's limits or cannot be cut over them.
    """
    _check_batch_size(spec.limits, batch_size)
    plan = replace(_plan_reform(spec, current, batch_size, layout, layout), kind=kind)
    return plan if plan.batch.global_batch_size != current.global_batch_size else \
        replace(plan, kind=NOOP)


def read_or_none(fn, path, uid):
    """``fn(path, uid)``, or None (logged) when the file breaks the protocol."""
    try:
        return fn(path, uid)
    except ctl.ProtocolError as exc:
        log.warning("%s", exc)
        return None


def journaled(row, issued_by: str = "hpcsched daemon (resumed)") -> tuple[Action, History]:
    """The :class:`Action` and :class:`History` of a journal row
    (:class:`hpcsched.daemon.store.ActionRow`). A preemption's ``nodes`` is the size it resumes
    at, the journal's ``from_nodes`` (its ``to_nodes`` is the plan's 0)."""
    kind = ChangeKind(row.kind)
    nodes = row.from_nodes if kind == ChangeKind.PREEMPT else row.to_nodes
    action = Action(row.job_id, kind, row.generation, nodes,
                    row.to_batch_size, row.restarts_at_plan, row.reason, issued_by,
                    tuple(row.placement))
    return action, History.parse(row.history or [(ResizePhase.REQUESTED, row.created_at)])


# -- the executor ---------------------------------------------------------------------------------

#: called once per transition, after its effects: (new phase, Unix time, why it failed or "")
Journal = Callable[[ResizePhase, float, str], None]


class _Refused(Exception):
    """An effect that failed in a way that fails the action (``str`` = why)."""


@dataclass
class Advance:
    """What one :meth:`Actuator.advance` did: the new history, what it read, the effects it
    executed, why the action failed (if it did) and notes worth reporting."""

    history: History
    observed: Observed
    effects: tuple[Effect, ...] = ()
    why: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def phase(self) -> ResizePhase:
        return self.history.phase


class Actuator:
    """Executes :func:`~hpcsched.daemon.phases.next_step` for actions in flight.

    Each :meth:`advance` reads the job's control and ack files once, takes every transition that
    needs no effect (a passive one: the job checkpointed, applied, ended...), then at most one
    step with effects, and journals each transition through the caller's ``journal`` after its
    effects. Decisions come from what is observed, so re-running a step after a crash repeats no
    effect that is not idempotent (a grow requeues only at the restart count of the plan; a
    generation is written only when the job's file does not hold it).

    Args:
        control: how to act on Slurm (default: its commands).
        timeouts: see :class:`~hpcsched.daemon.phases.Timeouts`.
        clock: Unix time in seconds (tests pass a fake one).
    """

    def __init__(self, control: SlurmControl | None = None, timeouts: Timeouts | None = None,
                 clock: Callable[[], float] = time.time):
        self.slurm = control if control is not None else CLISlurmControl()
        self.timeouts = timeouts if timeouts is not None else Timeouts()
        self.clock = clock

    def observe(self, jd: JobDir, job: slurm.JobInfo | None) -> Observed:
        """The job's control generation and ack as on disk now, with Slurm's ``job``."""
        control = read_or_none(ctl.read_control, jd.control_path, jd.uid)
        ack = read_or_none(ctl.read_ack, jd.ack_path, jd.uid)
        return Observed(self.clock(), control.generation if control else None, ack, job)

    def advance(self, action: Action, history: History, jd: JobDir, spec: JobSpec,
                job: slurm.JobInfo | None, journal: Journal | None = None) -> Advance:
        """One step of ``action`` (see the class docstring); ``job`` is Slurm's view of it.

        Raises:
            slurm.SlurmUnavailable: Slurm did not answer an effect; nothing is journaled for
                that step, and the next call takes it again.
        """
        out = Advance(history, self.observe(jd, job))
        for _ in TRANSITIONS:   # passive transitions, at most one per phase
            step = next_step(action, out.history, out.observed, self.timeouts)
            if step.note:
                out.notes.append(step.note)
            if step.effects:
                out.effects = step.effects
                try:
                    out.notes += self.execute(action, step.effects, jd, spec)
                except _Refused as exc:
                    step = Step(ResizePhase.FAILED, why=str(exc))
                self._enter(action, out, step, journal)
                return out
            if step.phase == out.history.phase:
                return out
            self._enter(action, out, step, journal)
        return out

    def _enter(self, action: Action, out: Advance, step: Step, journal: Journal | None) -> None:
        if step.phase == out.history.phase:
            return
        at = self.clock()
        new = out.history.then(step.phase, at)
        if journal is not None:
            journal(step.phase, at, step.why)
        out.history, out.why = new, step.why
        level = logging.ERROR if step.phase == ResizePhase.FAILED else logging.INFO
        log.log(level, "job %s: %s to %d node(s), batch %d, generation %d: %s%s",
                action.job_id, action.kind, action.nodes, action.batch_size, action.generation,
                step.phase, f": {step.why}" if step.why else "")

    # -- effects -------------------------------------------------------------------------------

    def execute(self, action: Action, effects: tuple[Effect, ...], jd: JobDir,
                spec: JobSpec) -> list[str]:
        """Carry out ``effects`` in order; returns notes (effects that failed harmlessly).

        Raises:
            slurm.SlurmUnavailable: Slurm did not answer (the step is to be taken again).
            _Refused: Slurm refused an effect the action needs, or the control file could not
                be written; the action fails.
        """
        notes: list[str] = []
        for e in effects:
            try:
                self._EXECUTE[type(e)](self, action, e, jd, spec)
            except slurm.SlurmUnavailable:
                raise
            except slurm.SlurmError as exc:
                if isinstance(e, ResizePendingJob) and not e.required:
                    # the job is requeued either way: it must not sit out the 121 s hold
                    notes.append(f"could not resize the requeued job ({exc}); it resumes at "
                                 f"{action.nodes} node(s) only if Slurm allows")
                    log.error("job %s: %s", action.job_id, notes[-1])
                    continue
                if isinstance(e, ResizePendingJob):
                    raise _Refused(f"job {action.job_id} could not be resized while pending: "
                                   f"{exc} (it may just have started)") from None
                raise _Refused(str(exc)) from None
            except (ctl.ProtocolError, BatchSizeError) as exc:
                if isinstance(e, CancelGeneration):
                    log.error("could not write the cancelling generation: %s", exc)
                    continue
                raise _Refused(f"job {action.job_id}: {exc}") from None
        return notes

    def _write_control(self, action: Action, e: WriteControl, jd: JobDir, spec: JobSpec) -> None:
        layout, wpn = _control_layout(e.layout, e.action, spec.limits.workers_per_node)
        batch = (spec.limits.fit_batch_gpus(e.global_batch_size, sum(layout.values())) if layout
                 else spec.limits.fit_batch(e.global_batch_size, e.nodes))
        now = self.clock()
        ctl.write_control(jd.control_path, ctl.Control(
            job_uid=jd.uid, generation=e.generation, action=e.action, nodes=e.nodes,
            workers_per_node=wpn, global_batch_size=batch.global_batch_size,
            local_batch_size=batch.local_batch_size, accumulation_steps=batch.accumulation_steps,
            lr_scale=spec.limits.lr_scale(batch.global_batch_size),
            issued_at=now, issued_by=action.issued_by, reason=action.reason,
            layout=layout, ack_by=now + self.timeouts.ack))

    def _cancel(self, action: Action, e: CancelGeneration, jd: JobDir, spec: JobSpec) -> None:
        layout, wpn = _control_layout(e.layout, e.action, spec.limits.workers_per_node)
        if e.action != ControlAction.REFORM and set(layout.values()) == {spec.limits.workers_per_node}:
            layout = {}   # the GPUs per node it was submitted with: nodes x those, as always
        ctl.write_control(jd.control_path, ctl.Control(
            job_uid=jd.uid, generation=e.generation, action=e.action,
            nodes=e.nodes, workers_per_node=wpn,
            global_batch_size=e.global_batch_size, local_batch_size=e.local_batch_size,
            accumulation_steps=e.accumulation_steps,
            lr_scale=spec.limits.lr_scale(e.global_batch_size),
            issued_at=self.clock(), issued_by=action.issued_by, reason=f"cancelled: {e.why}",
            layout=layout))

    def _resize_pending(self, action: Action, e: ResizePendingJob, jd: JobDir,
                        spec: JobSpec) -> None:
        resize_pending_job(self.slurm, action.job_id, e.nodes,
                           e.workers_per_node or spec.limits.workers_per_node, e.placement,
                           e.cpus_per_task, gpus_per_node=e.workers_per_node or None)

    def _requeue(self, action: Action, e: Requeue, jd: JobDir, spec: JobSpec) -> None:
        self.slurm.requeue(action.job_id)

    def _start_time(self, action: Action, e: SetStartTime, jd: JobDir, spec: JobSpec) -> None:
        set_start_time(self.slurm, action.job_id, e.when)

    _EXECUTE: ClassVar[dict[type, Callable]] = {WriteControl: _write_control, CancelGeneration: _cancel,
                ResizePendingJob: _resize_pending, Requeue: _requeue, SetStartTime: _start_time}


def _control_layout(pairs: tuple[str, ...], action: ControlAction, workers_per_node: int
                    ) -> tuple[dict[str, int], int]:
    """A generation's layout (``{node: GPUs}`` from ``node:GPUs`` pairs; ``{}``: none) and its
    workers per node: a ``reform`` keeps the job's own (``workers_per_node``), any other action
    onto a layout (a start or requeue onto k per node, a ``continue`` of a job started smaller)
    runs the layout's."""
    layout = parse_layout(",".join(pairs)) if pairs else {}
    if layout and action != ControlAction.REFORM:
        return layout, next(iter(layout.values()))
    return layout, workers_per_node


def realised_action(c: Change, workers_per_node: int) -> tuple[ChangeKind, int, tuple[str, ...]]:
    """``(kind, nodes, placement)`` of the journal's action carrying out GPU-granular change
    ``c`` by its mechanism (:mod:`hpcsched.policies.realise`; pure): a start sets the pending
    primary's nodes and, when they differ from the job's ``workers_per_node``, its GPUs per node
    (``node:GPUs`` pairs; else the nodes alone, as a node-granular start); an extension
    grow or a release is a ``reform`` onto the layout; a shrink of primary nodes is a
    ``shrink`` in place to its node count; a requeue is the ``grow`` path (checkpoint, requeue)
    onto the layout's GPUs per node."""
    pairs = layout_pairs(dict(c.layout))
    nodes = len(c.layout) or c.to_nodes
    if c.mechanism == Mechanism.START:
        if all(g == workers_per_node for _, g in c.layout):
            return ChangeKind.PENDING, nodes, tuple(n for n, _ in c.layout)
        return ChangeKind.PENDING, nodes, pairs
    if c.mechanism in (Mechanism.EXTEND, Mechanism.RELEASE):
        return ChangeKind.REFORM, nodes, pairs
    if c.mechanism == Mechanism.SHRINK_PRIMARY:
        return ChangeKind.SHRINK, nodes, ()
    return ChangeKind.GROW, nodes, pairs


__all__ = [
    "ENDED", "NOOP", "REQUEUE_START_DELAY_S", "Action", "Actuator", "Advance", "Current",
    "History", "Journal", "ResizeFailed", "ResizePhase", "ResizePlan", "ResizeRefused",
    "Timeouts", "current_from", "current_of", "journaled", "next_step", "plan_for",
    "plan_resize", "read_or_none", "realised_action",
]
