"""``hpcsched resize JOBID``: plan a resize and carry it out, waiting for the job by default.

The same state machine as the daemon (:mod:`hpcsched.daemon.phases`), stepped in a loop here
(:func:`resize`): the control and ack files are read every ``poll`` seconds, Slurm's view of the
job (one ``squeue --json``) when a step may need it fresh (the phase changed, or a grow waits for
its requeue to show), else every :data:`SLURM_CHECK_S` seconds.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field

import click

from hpcsched import slurm
from hpcsched.daemon.access import Caller, NotYourJob
from hpcsched.daemon.actuator import (
    NOOP,
    Action,
    Actuator,
    Advance,
    ResizeFailed,
    ResizePlan,
    ResizeRefused,
    plan_for,
)
from hpcsched.daemon.phases import History, ResizePhase, Timeouts
from hpcsched.protocol import files as ctl
from hpcsched.protocol.extensions import layout_pairs, parse_layout
from hpcsched.protocol.jobdir import JobDir, JobNotFound, JobSpec
from hpcsched.protocol.kinds import AckState, ChangeKind
from hpcsched.slurm.control import CLISlurmControl, SlurmControl

log = logging.getLogger("hpcsched.daemon.resize")

#: Seconds between looks at Slurm while nothing calls for a fresh one (the job still exists?)
SLURM_CHECK_S = 1.0


@dataclass
class ResizeResult:
    """What happened, with Unix timestamps (seconds) of each phase (``benchmarks/``)."""

    job_id: str
    plan: ResizePlan
    started: float
    checkpointed: float | None = None   # the job's checkpoint acknowledgement
    requeued: float | None = None
    applied: float | None = None        # first step at the new configuration (the job's ack)
    phase: ResizePhase = ResizePhase.REQUESTED
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float | None:
        return None if self.applied is None else self.applied - self.started

    def record(self, adv: Advance, generation: int) -> None:
        """Take the timestamps and notes of one step."""
        self.phase = adv.phase
        self.notes += adv.notes
        ack = adv.observed.ack
        mine = ack is not None and ack.generation == generation
        if self.checkpointed is None and mine and ack.state == AckState.CHECKPOINTED:
            self.checkpointed = ack.time
        self.requeued = adv.history.entered(ResizePhase.REQUEUED)
        if adv.phase == ResizePhase.RUNNING and mine and ack.state == AckState.APPLIED:
            self.applied = ack.time


def resize(job_id: str, nodes: int | None = None, batch_size: int | None = None,
           reason: str = "", issued_by: str = "hpcsched resize", wait: bool = True,
           timeouts: Timeouts | None = None, control: SlurmControl | None = None,
           poll: float = 0.05, info: slurm.JobInfo | None = None,
           layout: dict[str, int] | None = None) -> ResizeResult:
    """Plan and apply a resize of Slurm job ``job_id``.

    With ``wait``, returns once the job runs at the new size; without, once the request is
    written (a grow: once the job is requeued and released, since it needs a resizer until
    then). ``info``: Slurm's view of the job if the caller has just asked (saves one squeue).

    Raises:
        JobNotFound: not an hpcsched job.
        ResizeRefused: the job's limits or state forbid it, or another process is resizing it
            (nothing changed).
        ResizeFailed: the job did not follow through (it keeps running at its old size).
        slurm.SlurmError: Slurm refused or did not answer.
    """
    control = control if control is not None else CLISlurmControl()
    info = info if info is not None else control.job(str(job_id))
    jd = JobDir.for_job(job_id, user=info.user if info is not None else None)
    spec = jd.read_spec()
    try:
        lock = jd.resize_lock()
        lock.__enter__()
    except BlockingIOError:
        raise ResizeRefused(f"job {job_id} is being resized by another process") from None
    try:
        plan = plan_for(jd, spec, info, nodes, batch_size, layout)
        result = ResizeResult(str(job_id), plan, time.time())
        log.info("job %s: %s (%s)", job_id, plan.describe(spec), reason or "no reason given")
        if plan.kind == NOOP:
            return result
        action = Action(str(job_id), ChangeKind(plan.kind), plan.generation, plan.nodes,
                        plan.batch.global_batch_size, info.restarts, reason, issued_by,
                        layout_pairs(plan.layout))
        actuator = Actuator(control, timeouts if timeouts is not None else Timeouts())
        _drive(actuator, action, jd, spec, info, result, wait, poll)
        return result
    finally:
        lock.__exit__(None, None, None)


def _drive(actuator: Actuator, action: Action, jd: JobDir, spec: JobSpec,
           info: slurm.JobInfo | None, result: ResizeResult, wait: bool, poll: float) -> None:
    """Step ``action`` until it is done for the caller (see :func:`resize`).

    Raises:
        ResizeFailed: the action failed (its reason).
    """
    history = History.begin(result.started)
    seen = time.monotonic()
    while True:
        adv = actuator.advance(action, history, jd, spec, info)
        changed = adv.phase != history.phase
        history = adv.history
        result.record(adv, action.generation)
        if adv.phase == ResizePhase.FAILED:
            raise ResizeFailed(adv.why)
        if adv.phase == ResizePhase.RUNNING or (not wait and _requested_enough(action, adv)):
            if not wait and action.kind == ChangeKind.PENDING:
                result.applied = result.applied or time.time()
            return
        time.sleep(poll)
        if changed or _hot(action, adv.phase) or time.monotonic() - seen >= SLURM_CHECK_S:
            info, seen = actuator.slurm.job(action.job_id), time.monotonic()


def _requested_enough(action: Action, adv: Advance) -> bool:
    """``--no-wait``: the request is written; a grow's job is requeued and released."""
    if action.kind == ChangeKind.GROW:
        return adv.phase == ResizePhase.RESCHEDULED
    return adv.observed.control_generation == action.generation or bool(adv.effects)


def _hot(action: Action, phase: ResizePhase) -> bool:
    """A grow waiting for Slurm to show its requeue acts on the first fresh look."""
    return action.kind == ChangeKind.GROW and phase in (ResizePhase.CHECKPOINTED,
                                                        ResizePhase.REQUEUED)


@click.command("resize")
@click.argument("job_id")
@click.option("--nodes", type=click.IntRange(min=1), help="Target node count.")
@click.option("--gpus", type=click.IntRange(min=1),
              help="Target GPU count (a multiple of the job's GPUs per node).")
@click.option("--layout", metavar="NODE:GPUS,...",
              help="Target GPUs per node, e.g. n1:4,n2:2: reached without restarting a worker "
                   "(GPUs added through extension allocations, extension GPUs released); one "
                   "that gives back GPUs of the job's first allocation, by requeue.")
@click.option("--batch-size", type=click.IntRange(min=1), help="Target global batch size (samples).")
@click.option("--reason", default="", help="Recorded with the request and shown by status.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the job runs at the new size.")
@click.option("--timeout", type=click.FloatRange(min=1), default=180.0, show_default=True,
              help="Seconds to wait for each step of the job's acknowledgement.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result as JSON (plan and Unix timestamps of each phase).")
def resize_command(job_id, nodes, gpus, layout, batch_size, reason, wait, timeout, as_json):
    """Resize hpcsched job JOB_ID: batch size in place, shrink in place, grow by requeue, or
    any layout through extension allocations (--layout; docs/extensions.md)."""
    layout = _checked_request(job_id, nodes, gpus, layout, batch_size)
    try:
        control = CLISlurmControl()
        info = _owned_job(job_id, control)     # before anything of the job's is read
        spec = JobDir.for_job(job_id, user=info.user).read_spec()
        nodes = nodes if gpus is None else _nodes_for(gpus, spec)
        result = resize(job_id, nodes=nodes, batch_size=batch_size, reason=reason, wait=wait,
                        timeouts=Timeouts(ack=timeout, start=max(timeout, 300.0)),
                        control=control, info=info, layout=layout)
    except (JobNotFound, ResizeRefused, ctl.ProtocolError, NotYourJob) as exc:
        click.echo(f"hpcsched resize: refused: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:   # a job directory this user may not read or write
        click.echo(f"hpcsched resize: refused: job {job_id}: {exc.strerror or exc}: "
                   f"{exc.filename or ''}".rstrip(": "), err=True)
        sys.exit(2)
    except (ResizeFailed, slurm.SlurmError) as exc:
        click.echo(f"hpcsched resize: failed: {exc}", err=True)
        sys.exit(1)
    click.echo(_as_json(result) if as_json else _as_text(result, spec, wait))
    if not as_json:
        for note in result.notes:
            click.echo(f"  note: {note}")


def _checked_request(job_id: str, nodes: int | None, gpus: int | None, layout: str | None,
                     batch_size: int | None) -> dict[str, int] | None:
    """Check the command line of ``hpcsched resize``: a numeric job id, at most one of
    ``--nodes``, ``--gpus`` and ``--layout``, and something to do; returns ``--layout``
    parsed (:func:`parse_layout`), ``None`` without one.

    Raises:
        click.UsageError: a bad job id, sizes given twice, or nothing to do.
        click.BadParameter: a ``--layout`` that does not parse.
    """
    if not (job_id.isascii() and job_id.isdigit()):
        raise click.UsageError(f"{job_id!r} is not a Slurm job id (a number, as squeue shows)")
    if sum(x is not None for x in (nodes, gpus, layout)) > 1:
        raise click.UsageError("give one of --nodes, --gpus and --layout")
    if nodes is None and gpus is None and layout is None and batch_size is None:
        raise click.UsageError("nothing to do: give --nodes, --gpus, --layout and/or --batch-size")
    try:
        return parse_layout(layout) if layout is not None else None
    except ctl.ProtocolError as exc:
        raise click.BadParameter(str(exc), param_hint="--layout") from None


def _owned_job(job_id: str, control: SlurmControl) -> slurm.JobInfo:
    """Slurm's view of the job, if it is the caller's (:mod:`hpcsched.daemon.access`: Slurm
    says whose it is).

    Raises:
        ResizeRefused: Slurm does not know the job.
        NotYourJob: the caller is neither its owner nor an admin.
    """
    info = control.job(str(job_id))
    if info is None:
        raise ResizeRefused(f"Slurm does not know job {job_id}")
    Caller.current().check(job_id, info.user)
    return info


def _nodes_for(gpus: int, spec: JobSpec) -> int:
    if gpus % spec.limits.workers_per_node:
        raise ResizeRefused(f"--gpus {gpus} is not a multiple of the job's "
                            f"{spec.limits.workers_per_node} GPUs per node")
    return gpus // spec.limits.workers_per_node


def _as_json(result: ResizeResult) -> str:
    plan = result.plan
    return json.dumps({
        "job_id": result.job_id, "kind": str(plan.kind), "generation": plan.generation,
        "nodes": plan.nodes, "from_nodes": plan.from_nodes, "layout": plan.layout,
        "global_batch_size": plan.batch.global_batch_size,
        "local_batch_size": plan.batch.local_batch_size,
        "accumulation_steps": plan.batch.accumulation_steps, "lr_scale": plan.lr_scale,
        "started": result.started, "checkpointed": result.checkpointed,
        "requeued": result.requeued, "applied": result.applied, "seconds": result.seconds,
        "phase": str(result.phase), "notes": result.notes})


def _as_text(result: ResizeResult, spec: JobSpec, wait: bool) -> str:
    plan = result.plan
    line = f"job {result.job_id}: {plan.describe(spec)}"
    if plan.kind == NOOP:
        line += " (nothing to change)"
    elif result.seconds is not None:
        line += f"; generation {plan.generation} in force after {result.seconds:.1f} s"
        if result.checkpointed:
            line += f" (checkpoint after {result.checkpointed - result.started:.1f} s)"
    elif not wait:
        line += f"; generation {plan.generation} requested"
    return line
