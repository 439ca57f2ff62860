"""The step-boundary protocol of the workers (``docs/control-protocol.md``).

At a step boundary rank 0 looks at ``control.json`` (one ``stat``) and at the checkpoint
interval, and broadcasts what it found as a :class:`Decision`, so that every rank applies a new
generation at the same step. Rank 0 answers in ``ack.json`` and reports where training is in
``progress.json`` (:class:`Reporter`).

The ranks do not agree at every step: the broadcast costs about 1 ms on gloo, 4% of a 25 ms
step. Each decision also says in how many steps the next boundary is (:class:`Pace`: about
every :data:`AGREE_INTERVAL` seconds of training, at least every step, at most every
:data:`MAX_STEPS_BETWEEN`), so every rank knows the step number of the next one in advance and
the boundaries stay collective. A new generation, or a re-formed group, agrees again at the
next step.
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass, replace
from typing import ClassVar

from hpcsched.protocol import files as ctl
from hpcsched.protocol.batching import BatchConfig, split_global_batch
from hpcsched.protocol.env import LaunchEnv
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import AckState, ControlAction

log = logging.getLogger(__name__)

#: seconds between two progress reports
PROGRESS_INTERVAL = 2.0
#: seconds of training between two step boundaries, once the step time is known: what a
#: control request waits at most, beyond its step (module docstring)
AGREE_INTERVAL = 0.2
#: steps between two step boundaries at most (very short steps)
MAX_STEPS_BETWEEN = 256


@dataclass
class InForce:
    """The configuration a rank runs with; it changes only at a step boundary.

    Attributes:
        generation: control generation in force. nodes: nodes of the job.
        batch: the batch configuration (its ``world_size`` is the number of workers).
        lr_scale: factor on the base learning rate.
    """

    generation: int
    nodes: int
    batch: BatchConfig
    lr_scale: float

    @property
    def world_size(self) -> int:
        return self.batch.world_size

    @classmethod
    def at_launch(cls, launch: LaunchEnv, world_size: int, batch_size: int) -> InForce:
        """The launcher's configuration; without one (not run by hpcsched) ``batch_size``
        split over ``world_size`` workers and lr scale 1."""
        if launch.local_batch_size is not None:
            batch = BatchConfig(world_size, launch.local_batch_size, launch.accumulation_steps)
            return cls(launch.generation, launch.nodes, batch, launch.lr_scale)
        batch = split_global_batch(max(batch_size, world_size), world_size)
        return cls(launch.generation, launch.nodes, batch, 1.0)

    def record(self) -> dict:
        """The fields of a metrics record that come from the configuration."""
        return {"world_size": self.world_size, "nodes": self.nodes,
                "global_batch_size": self.batch.global_batch_size}


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bits_float(n: int) -> float:
    return struct.unpack("<d", struct.pack("<q", n))[0]


@dataclass(frozen=True)
class Decision:
    """What every rank does at a step boundary, as rank 0 found it.

    Attributes:
        generation: a control generation newer than the one in force, 0 = none.
        action, nodes, workers_per_node, local_batch_size, accumulation_steps, lr_scale,
            world_size: that generation's request (see :class:`hpcsched.protocol.files.Control`).
        checkpoint_due: the checkpoint interval has passed.
        form: for ``reform``: the form to enter (:mod:`hpcsched.job.reform`).
        next_in: optimizer steps from this boundary to the next one (>= 1; :class:`Pace`).
        stop: Slurm signalled the job (its time limit is near): every rank checkpoints and
            stops at this boundary, and no new generation is applied (the next launch reads
            the newest one).

    Travels as 12 int64 values (:meth:`encode`, :meth:`decode`): the action as its index in
    :class:`~hpcsched.protocol.kinds.ControlAction`, ``lr_scale`` as the bits of its float64.
    """

    generation: int = 0
    action: ControlAction = ControlAction.CONTINUE
    nodes: int = 0
    workers_per_node: int = 0
    local_batch_size: int = 0
    accumulation_steps: int = 0
    lr_scale: float = 0.0
    world_size: int = 0
    checkpoint_due: bool = False
    form: int = 0
    next_in: int = 1
    stop: bool = False

    _ACTIONS: ClassVar[tuple[ControlAction, ...]] = tuple(ControlAction)

    @classmethod
    def of(cls, control: ctl.Control | None, checkpoint_due: bool) -> Decision:
        """The decision for a new ``control`` generation (None: no new generation)."""
        if control is None:
            return cls(checkpoint_due=checkpoint_due)
        return cls(control.generation, ControlAction(control.action), control.nodes,
                   control.workers_per_node, control.local_batch_size,
                   control.accumulation_steps, float(control.lr_scale), control.world_size,
                   checkpoint_due)

    def encode(self) -> list[int]:
        return [self.generation, self._ACTIONS.index(self.action), self.nodes,
                self.workers_per_node, self.local_batch_size, self.accumulation_steps,
                _float_bits(self.lr_scale), int(self.checkpoint_due), self.world_size, self.form,
                self.next_in, int(self.stop)]

    @classmethod
    def decode(cls, values: list[int]) -> Decision:
        gen, code, nodes, wpn, local, accum, lr_bits, due, world, form, next_in, stop = (
            int(v) for v in values)
        return cls(gen, cls._ACTIONS[code], nodes, wpn, local, accum, _bits_float(lr_bits),
                   world, bool(due), form, next_in, bool(stop))


class Pace:
    """Rank 0's choice of :attr:`Decision.next_in`: enough steps that about ``interval``
    seconds pass between two boundaries, from the mean step time since the previous boundary
    (monotonic clock; it includes whatever else ran between them, a checkpoint say, which only
    makes the next gap shorter). The first boundary, and one that hands out a new generation,
    is followed by one at the next step: the step time is not known yet, or changes.

    Args:
        interval: seconds of training between boundaries (> 0).
        max_steps: the most steps between two boundaries (>= 1).
    """

    def __init__(self, interval: float = AGREE_INTERVAL, max_steps: int = MAX_STEPS_BETWEEN):
        self.interval, self.max_steps = interval, max_steps
        self._last: tuple[float, int] | None = None

    def next_in(self, step: int, new_generation: bool = False) -> int:
        """Steps to the next boundary, for a boundary at optimizer step ``step`` (the number of
        steps trained so far)."""
        now = time.monotonic()
        last, self._last = self._last, (now, step)
        if new_generation or last is None or step <= last[1] or now <= last[0]:
            return 1
        per_step = (now - last[0]) / (step - last[1])
        return max(1, min(self.max_steps, round(self.interval / per_step)))


class ControlWatcher:
    """Rank 0's view of ``control.json``: the request when the file changed since the last
    look (its ``stat`` signature) and is valid; an invalid file is logged and ignored."""

    def __init__(self, jd: JobDir | None):
        self.path = jd.control_path if jd is not None else None
        self.job_uid = jd.uid if jd is not None else ""
        self._sig: tuple | None = None

    def changed(self) -> ctl.Control | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        except OSError as exc:   # e.g. a link the job may not follow: the file is not usable
            if self._sig != ("unusable", exc.errno):
                log.warning("ignoring control file %s: %s", self.path, exc.strerror or exc)
                self._sig = ("unusable", exc.errno)
            return None
        sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        if sig == self._sig:
            return None
        self._sig = sig
        try:
            return ctl.read_control(self.path, self.job_uid)
        except ctl.ProtocolError as exc:
            log.warning("ignoring control file: %s", exc)
            return None


def agree(watcher: ControlWatcher, group, torch, rank: int, generation: int,
          checkpoint_due: bool, decide=None, pace: Pace | None = None, step: int = 0,
          stop: bool = False) -> Decision:
    """Collective: every rank gets rank 0's decision (a control generation newer than
    ``generation``, whether a checkpoint is due, and ``pace``'s steps to the next boundary
    from optimizer step ``step``; without ``pace``, the next step); ``group`` None = one rank.
    ``decide`` (rank 0): ``decide(new_control_or_None, checkpoint_due) -> Decision`` instead of
    :meth:`Decision.of` (the job's reform logic). ``stop`` (rank 0's): Slurm signalled the
    job; the decision is to checkpoint and stop (:attr:`Decision.stop`), whatever else is due.

    Raises:
        RuntimeError: the broadcast failed (a peer was lost)."""
    d = Decision()
    if rank == 0 and stop:
        d = Decision(stop=True)
    elif rank == 0:
        c = watcher.changed()
        c = c if c is not None and c.generation > generation else None
        d = decide(c, checkpoint_due) if decide is not None else Decision.of(c, checkpoint_due)
        if pace is not None:
            d = replace(d, next_in=pace.next_in(step, new_generation=d.generation > 0))
    if group is not None:
        d = Decision.decode(group.broadcast_ints(torch, d.encode()))
    return d


def resize_line(generation: int, cfg: InForce, layout: dict | None, reason: str) -> str:
    """The job-output line of an applied resize, e.g. ``hpcsched: generation 3: 6 GPU(s) on
    n1:4,n2:2, global batch 384 (64 x 1 per GPU): grow by extend ...``."""
    where = f" on {','.join(f'{n}:{g}' for n, g in layout.items())}" if layout else (
        f" on {cfg.nodes} node(s)")
    b = cfg.batch
    return (f"hpcsched: generation {generation}: {cfg.world_size} GPU(s){where}, global batch "
            f"{b.global_batch_size} ({b.local_batch_size} x {b.accumulation_steps} per GPU)"
            + (f": {reason}" if reason else ""))


class Reporter:
    """Rank 0's acknowledgements (``ack.json``) and progress reports (``progress.json``);
    other ranks, and a job without a job directory, write nothing.

    Args:
        jd: the job directory (None: not run by hpcsched).
        rank: this process's rank.
        total_samples: samples the whole run trains on.

    Attributes:
        work: ``(done, total)`` samples when the job measures its work itself
            (:meth:`hpcsched.elastic.ElasticJob.set_work`): reported instead of the data
            position's ``samples_processed`` and ``total_samples``. None: not set.
    """

    def __init__(self, jd: JobDir | None, rank: int, total_samples: int):
        self._jd = jd
        self.jd = jd if rank == 0 else None
        self.total_samples = total_samples
        self.work: tuple[float, float] | None = None
        self._last = 0.0
        self._mark = (time.monotonic(), 0)

    def rank_changed(self, rank: int) -> None:
        """The process's rank changed (a re-formed group): only rank 0 reports."""
        self.jd = self._jd if rank == 0 else None

    def ack(self, state: AckState, generation: int, cfg: InForce, step: int,
            checkpoint: str = "", message: str = "", layout: dict | None = None) -> None:
        """Write ``ack.json``; a resize applied (``applied`` for a generation > 0 that the file
        did not already say was applied) is also one line on the job's output
        (:func:`resize_line`), so users see what happened to their job without asking."""
        if self.jd is None:
            return
        if state == AckState.APPLIED and generation > 0 and self._newly_applied(generation):
            print(resize_line(generation, cfg, layout, self._reason(generation)), flush=True)
        ctl.write_ack(self.jd.ack_path, ctl.Ack(
            job_uid=self.jd.uid, generation=generation, state=state,
            world_size=cfg.world_size, nodes=cfg.nodes,
            global_batch_size=cfg.batch.global_batch_size,
            local_batch_size=cfg.batch.local_batch_size,
            accumulation_steps=cfg.batch.accumulation_steps, step=step,
            time=time.time(), checkpoint=checkpoint, message=message, layout=layout or {},
        ))

    def _newly_applied(self, generation: int) -> bool:
        """The ack file does not already say ``applied`` (or ``stopped``) for ``generation``: a
        relaunch after a requeue for Slurm's signal acknowledges the generation it resumes at
        again, which is no resize."""
        try:
            before = ctl.read_ack(self.jd.ack_path, self.jd.uid)
        except ctl.ProtocolError:
            return True
        return before is None or before.generation != generation or before.state not in (
            AckState.APPLIED, AckState.STOPPED)

    def _reason(self, generation: int) -> str:
        """The reason hpcsched gave for ``generation`` (``control.json``), "" where unknown."""
        try:
            c = ctl.read_control(self.jd.control_path, self.jd.uid)
        except ctl.ProtocolError:
            return ""
        return c.reason if c is not None and c.generation == generation else ""

    @property
    def work_done(self) -> bool:
        """The work set by the job is done (``done >= total``)."""
        return self.work is not None and self.work[0] >= self.work[1]

    @property
    def progress_due(self) -> bool:
        return self.jd is not None and time.monotonic() - self._last >= PROGRESS_INTERVAL

    def progress(self, cfg: InForce, data, noise: tuple[float, float] | None,
                 finished: bool = False) -> None:
        """Report ``data`` (a :class:`hpcsched.job.data.DataPosition`), or :attr:`work` where
        set; ``throughput`` is the data's samples/s since the last report."""
        if self.jd is None:
            return
        now = time.monotonic()
        t0, s0 = self._mark
        rate = (data.samples_processed - s0) / (now - t0) if now > t0 else 0.0
        self._mark = (now, data.samples_processed)
        self._last = now
        done, total = ((round(self.work[0]), round(self.work[1])) if self.work is not None
                       else (data.samples_processed, self.total_samples))
        ctl.write_progress(self.jd.progress_path, ctl.Progress(
            job_uid=self.jd.uid, generation=cfg.generation, step=data.step,
            epoch=data.epoch, samples_processed=done,
            epoch_position=data.position, throughput=rate, world_size=cfg.world_size,
            global_batch_size=cfg.batch.global_batch_size, time=time.time(), finished=finished,
            total_samples=total,
            grad_sqr=noise[0] if noise else None, grad_var=noise[1] if noise else None,
        ))
