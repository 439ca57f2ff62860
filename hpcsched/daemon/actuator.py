"""The resize actuator: change a running or pending hpcsched job's batch size and node count.

``hpcsched resize JOBID [--nodes N | --gpus N] [--batch-size B]`` calls :func:`resize`, and so
does the daemon. Planning (:func:`plan_resize`) is a pure function of the job's spec, its Slurm
state and the control generation in force; applying a plan follows the protocol of
``shared/DESIGN.md`` ("Resizing on Slurm"), measured on Slurm 22.05
(``shared/slurm-22.05-notes.md`` §3):

* **batch size only** (same nodes): write a new control generation; the workers switch local
  batch size / accumulation / learning-rate scale at their next step boundary. No restart.
* **shrink** (fewer nodes): control generation with ``checkpoint-and-shrink``; the job
  checkpoints, acknowledges, and its launcher runs ``scontrol update NumNodes=`` from inside the
  job and relaunches on what remains. No requeue.
* **grow** (more nodes; Slurm 22.05 cannot grow a GRES job in place): control generation with
  ``checkpoint-and-requeue``; once the job acknowledges its checkpoint, ``scontrol requeue``;
  once it is PENDING, ``scontrol update NumNodes=<n>-<n> NumTasks=...`` and
  ``StartTime=now+2`` (without it a requeued job waits 121 s; with plain ``now`` it may start
  within the second of the requeue and be killed for a revoked credential; an update sent while
  the job is still COMPLETING is lost). It resumes from the checkpoint at the new size.
* **pending** job: ``scontrol update NumNodes=<n>`` before it starts, plus a control generation so
  the launcher starts with the new batch configuration.

A job that does not acknowledge within the timeout gets a further ``continue`` generation at its
current size, so a late acknowledgement never triggers a stale resize.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field

import click

from hpcsched.protocol import files as ctl
from hpcsched import slurm
from hpcsched.protocol.batching import BatchConfig, BatchSizeError, fit_batch, lr_scale
from hpcsched.protocol.jobdir import JobDir, JobNotFound, JobSpec

log = logging.getLogger("hpcsched.daemon.actuator")


# Seconds between a requeue and the job's next start. Slurm holds a requeued job for 121 s
# (credential expiry) unless told otherwise, but a job started again within the second of the
# requeue is killed by slurmd: "Killing non-startable batch JobId=N: Job credential revoked",
# and ends FAILED (measured on 22.05.8, dev cluster). Credential times have 1 s resolution, so
# 2 s is the least that is always safe.
REQUEUE_START_DELAY_S = 2


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
    """A resize to apply. ``kind``: ``noop``, ``batch``, ``shrink``, ``grow`` or ``pending``."""

    kind: str
    nodes: int
    from_nodes: int
    batch: BatchConfig
    from_global_batch_size: int
    lr_scale: float
    generation: int

    def describe(self, spec: JobSpec) -> str:
        wpn = spec.workers_per_node
        parts = []
        if self.nodes != self.from_nodes:
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
                batch_size: int | None = None) -> ResizePlan:
    """Decide how to move the job to ``nodes`` nodes and global batch ``batch_size`` (pure).

    ``None`` keeps the current value. A node change keeps the global batch size (refitted to
    the new world size, with gradient accumulation above the per-GPU limit).

    Raises:
        ResizeRefused: outside ``[min_nodes, max_nodes]`` or ``[min_batch_size,
            max_batch_size]``, or the job is in a state that cannot be resized.
    """
    if current.state not in ("RUNNING", "PENDING"):
        raise ResizeRefused(f"the job is {current.state}; only RUNNING or PENDING jobs can be resized")
    target_nodes = current.nodes if nodes is None else nodes
    if not spec.min_nodes <= target_nodes <= spec.max_nodes:
        raise ResizeRefused(
            f"{target_nodes} node(s) is outside the job's limits [{spec.min_nodes}, "
            f"{spec.max_nodes}] nodes ([{spec.min_gpus}, {spec.max_gpus}] GPUs)")
    if batch_size is not None and not spec.min_batch_size <= batch_size <= spec.max_batch_size:
        raise ResizeRefused(
            f"global batch size {batch_size} is outside the job's limits "
            f"[{spec.min_batch_size}, {spec.max_batch_size}]")
    world = target_nodes * spec.workers_per_node
    want = current.global_batch_size if batch_size is None else batch_size
    try:
        batch = fit_batch(want, world, min_global=spec.min_batch_size,
                          max_global=spec.max_batch_size,
                          max_local_batch_size=spec.max_local_batch_size)
    except BatchSizeError as exc:
        raise ResizeRefused(str(exc)) from None
    if batch_size is not None and batch.global_batch_size != batch_size:
        raise ResizeRefused(
            f"global batch size {batch_size} cannot be cut evenly over {world} GPUs "
            f"(nearest: {batch.global_batch_size})")
    if current.state == "PENDING":
        kind = "pending"
    elif target_nodes < current.nodes:
        kind = "shrink"
    elif target_nodes > current.nodes:
        kind = "grow"
    elif batch.global_batch_size != current.global_batch_size:
        kind = "batch"
    else:
        kind = "noop"
    return ResizePlan(kind, target_nodes, current.nodes, batch, current.global_batch_size,
                      lr_scale(spec.lr_scaling, batch.global_batch_size, spec.batch_size),
                      current.generation + 1)


@dataclass
class ResizeResult:
    """What happened, with Unix timestamps (seconds) of each phase for the benchmark."""

    job_id: str
    plan: ResizePlan | None      # None when resuming a journaled action (the daemon)
    started: float
    checkpointed: float | None = None
    requeued: float | None = None
    applied: float | None = None
    ack: ctl.Ack | None = None
    released: bool = False       # a requeued job was given its new size and start time
    slurm_checked: float = 0.0   # time.monotonic() of the last look at Slurm (Actuator.step)
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float | None:
        return None if self.applied is None else self.applied - self.started


def current_of(jd: JobDir, spec: JobSpec, info: slurm.JobInfo) -> Current:
    """The job's :class:`Current` from Slurm's view and the control/ack files."""
    return current_from(spec, info, _read(ctl.read_control, jd.control_path, jd.uid),
                        _read(ctl.read_ack, jd.ack_path, jd.uid))


def current_from(spec: JobSpec, info: slurm.JobInfo, control: ctl.Control | None,
                 ack: ctl.Ack | None) -> Current:
    """:func:`current_of` for control and ack files already read (pure)."""
    generation = max(control.generation if control else 0, ack.generation if ack else 0)
    if ack is not None and ack.state == "applied":
        gbs = ack.global_batch_size
    elif control is not None:
        gbs = control.global_batch_size
    else:
        gbs = spec.batch_size
    if info.state == "PENDING":
        nodes = control.nodes if control is not None else (info.node_count or spec.nodes)
    else:
        nodes = info.node_count
    return Current(info.state, nodes, gbs, generation)


def _read(fn, path, uid):
    try:
        return fn(path, uid)
    except ctl.ProtocolError as exc:
        log.warning("%s", exc)
        return None


# Seconds between checks that a job being resized still exists. The files answer every poll;
# Slurm (one squeue --json of every job) is asked when a decision needs it, else this often.
SLURM_CHECK_S = 1.0

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE")


@dataclass(frozen=True)
class Action:
    """A resize in flight: what it takes to resume it after a crash (the daemon journals it).

    ``restarts_at_plan`` is Slurm's restart count of the job when the action was planned: a grow
    requeues the job only while the count is unchanged, so a resumed action never requeues twice.
    """

    job_id: str
    kind: str
    generation: int
    nodes: int
    batch_size: int
    restarts_at_plan: int
    reason: str = ""
    issued_by: str = "hpcsched resize"
    placement: tuple[str, ...] = ()   # nodes to start on (pending job, or a grow's requeue)


class Actuator:
    """Applies resizes through control files and Slurm, in idempotent steps.

    :meth:`start` writes the request; :meth:`step` looks at the job (control file, ack, Slurm
    state) and takes the next action the resize needs, if any; :meth:`drive` steps until the
    job runs at the new size. Each step is safe to repeat, and takes its decisions from the
    observed state alone, so a process killed at any point (the daemon) resumes an
    :class:`Action` by calling :meth:`drive` again: nothing is done twice.

    Args:
        ack_timeout: seconds to wait for the job to checkpoint or apply a generation.
        start_timeout: seconds to wait for a requeued job to run again.
        poll: seconds between looks at the job.
    """

    def __init__(self, ack_timeout: float = 180.0, start_timeout: float = 300.0, poll: float = 0.05):
        self.ack_timeout = ack_timeout
        self.start_timeout = start_timeout
        self.poll = poll

    def resize(self, job_id: str, nodes: int | None = None, batch_size: int | None = None,
               reason: str = "", issued_by: str = "hpcsched resize", wait: bool = True) -> ResizeResult:
        """Plan and apply a resize of Slurm job ``job_id`` (what ``hpcsched resize`` does).

        Raises:
            JobNotFound: not an hpcsched job.
            ResizeRefused: the job's limits or state forbid it (nothing changed).
            ResizeFailed: the job did not follow through (it keeps running at its old size).
            slurm.SlurmError: Slurm refused or did not answer.
        """
        jd = JobDir.for_job(job_id)
        spec = jd.read_spec()
        try:
            lock = jd.resize_lock()
            lock.__enter__()
        except BlockingIOError:
            raise ResizeRefused(f"job {job_id} is being resized by another process") from None
        try:
            info = slurm.job_info(job_id)
            plan = self.plan(jd, spec, info, nodes, batch_size)
            result = ResizeResult(str(job_id), plan, time.time())
            log.info("job %s: %s (%s)", job_id, plan.describe(spec), reason or "no reason given")
            if plan.kind == "noop":
                return result
            action = Action(str(job_id), plan.kind, plan.generation, plan.nodes,
                            plan.batch.global_batch_size, info.restarts, reason, issued_by)
            self.start(action, jd, spec)
            if wait or plan.kind == "grow":  # a grow needs us until the job is requeued
                self.drive(action, jd, spec, result, until_requeued=not wait)
            elif plan.kind == "pending":
                result.applied = time.time()
            return result
        finally:
            lock.__exit__(None, None, None)

    @staticmethod
    def plan(jd: JobDir, spec: JobSpec, info: slurm.JobInfo | None, nodes: int | None,
             batch_size: int | None) -> ResizePlan:
        """:func:`plan_resize` for a job as it is now.

        Raises:
            ResizeRefused: see :func:`plan_resize`; also when Slurm has forgotten the job or a
                running job has never reported (its script does not use hpcsched.elastic).
        """
        if info is None:
            raise ResizeRefused(f"Slurm no longer knows job {jd.slurm_job_id}")
        if info.state == "RUNNING" and not jd.ack_path.exists():
            raise ResizeRefused(
                f"job {info.job_id} has not reported to hpcsched yet: it is still starting, or "
                "its script does not use hpcsched.elastic (then it runs, but cannot be "
                "resized in place)")
        return plan_resize(spec, current_of(jd, spec, info), nodes, batch_size)

    # ------------------------------------------------------------------ steps
    def start(self, action: Action, jd: JobDir, spec: JobSpec) -> None:
        """Write the request for ``action`` unless it is already written (idempotent).

        Raises:
            ResizeFailed: a newer generation has already been written for the job.
            slurm.SlurmError: a pending job's size could not be set.
        """
        control = _read(ctl.read_control, jd.control_path, jd.uid)
        if control is not None and control.generation > action.generation:
            raise ResizeFailed(f"job {action.job_id}: generation {action.generation} was "
                               f"superseded by {control.generation}")
        if control is not None and control.generation == action.generation:
            return
        if action.kind == "pending":
            info = slurm.job_info(action.job_id)
            if info is not None and info.state == "PENDING" and info.node_count != action.nodes:
                try:
                    resize_pending_job(action.job_id, action.nodes, spec.workers_per_node,
                                       action.placement, info.cpus_per_task)
                except slurm.SlurmError as exc:
                    raise ResizeFailed(f"job {action.job_id} could not be resized while "
                                       f"pending: {exc} (it may just have started)") from None
        kind_action = {"batch": "continue", "pending": "continue",
                       "shrink": "checkpoint-and-shrink", "grow": "checkpoint-and-requeue"}
        batch = fit_batch(action.batch_size, action.nodes * spec.workers_per_node,
                          min_global=spec.min_batch_size, max_global=spec.max_batch_size,
                          max_local_batch_size=spec.max_local_batch_size)
        ctl.write_control(jd.control_path, ctl.Control(
            job_uid=jd.uid, generation=action.generation, action=kind_action[action.kind],
            nodes=action.nodes, workers_per_node=spec.workers_per_node,
            global_batch_size=batch.global_batch_size, local_batch_size=batch.local_batch_size,
            accumulation_steps=batch.accumulation_steps,
            lr_scale=lr_scale(spec.lr_scaling, batch.global_batch_size, spec.batch_size),
            issued_at=time.time(), issued_by=action.issued_by, reason=action.reason,
        ))

    def step(self, action: Action, jd: JobDir, spec: JobSpec, result: ResizeResult) -> str:
        """Look at the job once and take the next action ``action`` needs, if any.

        Returns ``"applied"`` once the job runs at the generation, else ``"waiting"``.

        Raises:
            ResizeFailed: the job ended, rejected the generation, or a newer one superseded it.
        """
        gen = action.generation
        cached: list[slurm.JobInfo] = []

        def job() -> slurm.JobInfo:
            """Slurm's view of the job, asked at most once per step (one squeue --json)."""
            if not cached:
                info = slurm.job_info(action.job_id)
                result.slurm_checked = time.monotonic()
                if info is None or info.state in ENDED:
                    raise ResizeFailed(f"job {action.job_id} ended "
                                       f"({info.state if info else 'gone'}) before it applied "
                                       f"generation {gen}")
                cached.append(info)
            return cached[0]

        if time.monotonic() - result.slurm_checked >= SLURM_CHECK_S:
            job()  # is the job still there?
        control = _read(ctl.read_control, jd.control_path, jd.uid)
        if control is None or control.generation < gen:
            job()
            self.start(action, jd, spec)
            return "waiting"
        if action.kind == "pending" and job().state == "PENDING":
            return "applied"  # the launcher starts with this generation
        ack = _read(ctl.read_ack, jd.ack_path, jd.uid)
        if ack is None or ack.generation < gen:
            return "waiting"
        if ack.generation > gen or control.generation > gen:
            raise ResizeFailed(f"job {action.job_id}: generation {gen} was superseded")
        if ack.state == "rejected":
            raise ResizeFailed(f"job {action.job_id} rejected generation {gen}: {ack.message}")
        if ack.state == "applied":
            result.ack, result.applied = ack, ack.time
            if ack.nodes != action.nodes:
                result.notes.append(f"Slurm started the job on {ack.nodes} node(s), "
                                    f"not {action.nodes}")
            return "applied"
        result.checkpointed = result.checkpointed or ack.time  # state == "checkpointed"
        if action.kind != "grow":
            return "waiting"  # the job's own launcher or workers finish a shrink
        info = job()
        if info.state == "RUNNING" and info.restarts == action.restarts_at_plan:
            slurm.requeue(action.job_id)
            result.requeued = time.time()
            log.info("job %s: checkpointed for generation %d, requeued", action.job_id, gen)
        elif info.state == "PENDING" and not result.released:
            try:
                resize_pending_job(action.job_id, action.nodes, spec.workers_per_node,
                                   action.placement, info.cpus_per_task)
            except slurm.SlurmError as exc:
                # the job is requeued either way: it must not sit out the 121 s hold
                result.notes.append(f"could not resize the requeued job ({exc}); it resumes "
                                    f"at {action.nodes} node(s) only if Slurm allows")
                log.error("job %s: %s", action.job_id, result.notes[-1])
            finally:
                release_requeued_job(action.job_id, result.requeued or time.time())
                result.released = True
        return "waiting"

    def drive(self, action: Action, jd: JobDir, spec: JobSpec, result: ResizeResult,
              until_requeued: bool = False) -> ResizeResult:
        """Step ``action`` until applied (or, with ``until_requeued``, until a grow's job is
        released after its requeue).

        A job that never acknowledges the generation within ``ack_timeout`` gets a further
        ``continue`` generation at its current size, so a late acknowledgement never starts a
        stale resize. After a checkpoint the job is never cancelled: its launcher resumes it
        by itself if no requeue comes.

        Raises:
            ResizeFailed: see :meth:`step`, or a timeout.
        """
        deadline = time.monotonic() + self.ack_timeout
        while True:
            if self.step(action, jd, spec, result) == "applied":
                return result
            if until_requeued and result.released:
                return result
            if result.requeued and deadline < time.monotonic() + self.start_timeout - self.ack_timeout:
                deadline = time.monotonic() + self.start_timeout  # a requeued job gets longer
            if time.monotonic() > deadline:
                why = (f"job {action.job_id} did not acknowledge generation {action.generation} "
                       f"within {self.ack_timeout:.0f} s (does the script use hpcsched.elastic?)")
                if result.checkpointed is None:
                    self._cancel_generation(action, jd, spec, why)
                raise ResizeFailed(why if result.checkpointed is None else
                                   f"job {action.job_id} did not run again at generation "
                                   f"{action.generation} in time")
            time.sleep(self.poll)

    def _cancel_generation(self, action: Action, jd: JobDir, spec: JobSpec, why: str) -> None:
        """Supersede an unanswered generation with a 'stay as you are' one."""
        try:
            ack = ctl.read_ack(jd.ack_path, jd.uid)
            c = ctl.read_control(jd.control_path, jd.uid)
            if ack is None or c is None or c.generation != action.generation:
                return
            ctl.write_control(jd.control_path, ctl.Control(
                job_uid=jd.uid, generation=c.generation + 1, action="continue",
                nodes=ack.nodes, workers_per_node=spec.workers_per_node,
                global_batch_size=ack.global_batch_size, local_batch_size=ack.local_batch_size,
                accumulation_steps=ack.accumulation_steps,
                lr_scale=lr_scale(spec.lr_scaling, ack.global_batch_size, spec.batch_size),
                issued_at=time.time(), issued_by=action.issued_by, reason=f"cancelled: {why}"))
        except ctl.ProtocolError as exc:
            log.error("could not write the cancelling generation: %s", exc)


def resize_pending_job(job_id: str, nodes: int, workers_per_node: int,
                       placement: tuple[str, ...] = (), cpus_per_task: int = 1) -> None:
    """Set a PENDING job's size: ``scontrol update NumNodes=<n>-<n> NumTasks=<n * wpn>
    [ReqNodeList=<nodes>]``.

    Measured on Slurm 22.05: ``NumNodes=3`` alone is refused ("Node count specification
    invalid") for a job submitted with ``-N 2``, whose node range is 2-2; the range form sets
    both bounds. ``NumTasks`` must follow, or ``--ntasks-per-node`` no longer fits.
    ``ReqNodeList`` in the same update steers the job onto the placement's nodes (Slurm still
    picks the GPUs within each node). Without a placement an earlier one is cleared.
    ``NumCPUs`` must follow a shrink: a job submitted with ``-N 2 --ntasks-per-node=2`` keeps
    ``NumCPUs=4`` and, set to one node, stays pending forever with ``BadConstraints``
    ("Requested node configuration is not available"; measured).
    """
    tasks = nodes * workers_per_node
    fields = {"NumNodes": f"{nodes}-{nodes}", "NumTasks": tasks, "NumCPUs": tasks * cpus_per_task}
    fields["ReqNodeList"] = ",".join(placement) if placement else ""
    slurm.update_job(job_id, **fields)


def release_requeued_job(job_id: str, requeued_at: float) -> None:
    """Let a requeued job start again as soon as it safely can.

    First ``StartTime=now+2``: should anything stop us now, the job still starts soon instead of
    after Slurm's 121 s requeue hold. Then, once :data:`REQUEUE_START_DELAY_S` have passed
    since the requeue, ``StartTime=now``: a job update wakes the scheduler at once, where a begin
    time that merely passes waits for the next periodic scheduling pass (13 s measured).
    """
    slurm.update_job(job_id, StartTime=f"now+{REQUEUE_START_DELAY_S}")
    # slurmd revokes the credential within the second the requeue reached it; a new
    # credential dated at least one whole second later is valid
    delay = math.floor(requeued_at) + REQUEUE_START_DELAY_S + 0.05 - time.time()
    if delay > 0:
        time.sleep(delay)
    try:
        slurm.update_job(job_id, StartTime="now")
    except slurm.SlurmError as exc:
        if "no longer pending" not in str(exc):  # already started: nothing left to do
            raise


def resize(job_id: str, nodes: int | None = None, batch_size: int | None = None,
           **kwargs) -> ResizeResult:
    """Convenience wrapper around :meth:`Actuator.resize` with default timeouts."""
    return Actuator().resize(job_id, nodes=nodes, batch_size=batch_size, **kwargs)


@click.command("resize")
@click.argument("job_id")
@click.option("--nodes", type=click.IntRange(min=1), help="Target node count.")
@click.option("--gpus", type=click.IntRange(min=1),
              help="Target GPU count (a multiple of the job's GPUs per node).")
@click.option("--batch-size", type=click.IntRange(min=1), help="Target global batch size (samples).")
@click.option("--reason", default="", help="Recorded with the request and shown by status.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the job runs at the new size.")
@click.option("--timeout", type=click.FloatRange(min=1), default=180.0, show_default=True,
              help="Seconds to wait for each step of the job's acknowledgement.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result as JSON (plan and Unix timestamps of each phase).")
def resize_command(job_id, nodes, gpus, batch_size, reason, wait, timeout, as_json):
    """Resize hpcsched job JOB_ID: batch size in place, shrink in place, grow by requeue."""
    if nodes is not None and gpus is not None:
        raise click.UsageError("give --nodes or --gpus, not both")
    if nodes is None and gpus is None and batch_size is None:
        raise click.UsageError("nothing to do: give --nodes, --gpus and/or --batch-size")
    try:
        jd = JobDir.for_job(job_id)
        spec = jd.read_spec()
        if gpus is not None:
            if gpus % spec.workers_per_node:
                raise ResizeRefused(f"--gpus {gpus} is not a multiple of the job's "
                                    f"{spec.workers_per_node} GPUs per node")
            nodes = gpus // spec.workers_per_node
        result = Actuator(ack_timeout=timeout, start_timeout=max(timeout, 300.0)).resize(
            job_id, nodes=nodes, batch_size=batch_size, reason=reason, wait=wait)
    except (JobNotFound, ResizeRefused, ctl.ProtocolError) as exc:
        click.echo(f"hpcsched resize: refused: {exc}", err=True)
        sys.exit(2)
    except (ResizeFailed, slurm.SlurmError) as exc:
        click.echo(f"hpcsched resize: failed: {exc}", err=True)
        sys.exit(1)
    plan = result.plan
    if as_json:
        click.echo(json.dumps({
            "job_id": result.job_id, "kind": plan.kind, "generation": plan.generation,
            "nodes": plan.nodes, "from_nodes": plan.from_nodes,
            "global_batch_size": plan.batch.global_batch_size,
            "local_batch_size": plan.batch.local_batch_size,
            "accumulation_steps": plan.batch.accumulation_steps, "lr_scale": plan.lr_scale,
            "started": result.started, "checkpointed": result.checkpointed,
            "requeued": result.requeued, "applied": result.applied, "seconds": result.seconds,
            "notes": result.notes}))
        return
    line = f"job {job_id}: {plan.describe(spec)}"
    if plan.kind == "noop":
        line += " (nothing to change)"
    elif result.seconds is not None:
        line += f"; generation {plan.generation} in force after {result.seconds:.1f} s"
        if result.checkpointed:
            line += f" (checkpoint after {result.checkpointed - result.started:.1f} s)"
    elif not wait:
        line += f"; generation {plan.generation} requested"
    click.echo(line)
    for note in result.notes:
        click.echo(f"  note: {note}")
