"""``tiresias``: Discretized Two-Dimensional Least-Attained-Service (2D-LAS) of Gu et al.,
"Tiresias: A GPU Cluster Manager for Distributed Deep Learning", NSDI'19, §3.2 (2DAS, priority
discretization, starvation) and §4 (the scheduler: preemption by checkpoint and requeue).

A job's *attained service* is GPUs x time it has run (``JobView.attained_gpu_seconds``): the
"two dimensions" are how many GPUs and for how long (§3.2.1). Jobs are not told apart by how long
they *will* run (unknown for DL training); least attained service first favours short jobs without
knowing which they are.

Discretization (§3.2.2, a multi-level feedback queue). ``K = len(queue_thresholds) + 1`` queues;
queue ``i`` holds jobs with attained service in ``[T_{i-1}, T_i)`` (``T_{-1} = 0``,
``T_{K-1} = inf``). A new job starts in queue 0 and moves down as it runs. Lower queues run only
on what higher ones leave. Default: ``K = 2`` with the threshold at 3200 GPU-seconds (about 53
GPU-minutes; the authors' simulator uses 3250, github.com/SymbioticLab/Tiresias ``jobs.py``;
Pollux's re-implementation of the baseline uses 2 queues at 16 GPU-hours, ``simulator/tiresias.py``
in github.com/petuum/adaptdl). The thresholds are a parameter.

Each round, from scratch (pure: nothing kept between rounds):

1. Order the jobs by queue, then within a queue: jobs that are running before jobs that wait
   (no preemption inside a queue, as the authors' simulator, which moves waiting jobs behind
   running ones every round; preempting within a queue would bring back the churn discretization
   exists to avoid), then FIFO by submit time (``preempt_within_queue=True``: strict FIFO by submit
   time, running or not).
2. Walk the order handing out GPUs: a job that fits gets its *requested* size -- Tiresias is not
   elastic: a running job keeps its current node count, a pending one gets the count it asked
   for, clamped to ``[min_nodes, max_nodes]`` -- and its current batch size. A job that does not
   fit waits (target 0 nodes) and the walk goes on, so a smaller job further down may use GPUs a
   larger one cannot (work-conserving, as the authors' simulator).
3. A running job that is not handed GPUs is preempted (target 0 nodes; the mechanism
   checkpoints and requeues it, §4): the reason names the first higher-priority job that starts
   in its stead when the starting jobs are what took its GPUs (otherwise, e.g. a node went down,
   it says how many GPUs it needed and how many were left).

Starvation (§3.2.2, ``PROMOTEKNOB``): with ``promote_knob = P``, a job in a lower queue that has
been waiting ``P`` times longer than it has run goes back to queue 0. The paper resets both clocks
on promotion; a pure policy keeps no clocks, so both are taken from the snapshot since submission:
run time ``t = attained / GPUs`` and waiting time ``w = now - submit - t``; the job counts as
queue 0 while ``w >= P * t``. Once promoted it keeps running until ``t`` has grown to ``w / P``,
so every job gets at least about ``1 / (1 + P)`` of the wall-clock time. ``None`` (default, as the
authors' simulator's ``solve_starvation = 0``) disables it.

Capacity is :func:`hpcsched.policies.common.capacity` (usable nodes' GPUs minus unmanaged jobs'),
counted in GPUs; whether a start also fits node by node is checked when the plan is reconciled,
as for the other policies. Busy jobs (a resize or start in flight) keep what they have and get no
target. The seed is not used: the policy is deterministic.

Objective reported: GPUs handed out (running targets plus busy jobs).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, Plan
from hpcsched.policies.base import Params, PolicyBase
from hpcsched.policies.common import capacity
from hpcsched.protocol.kinds import SlurmState

DEFAULT_QUEUE_THRESHOLDS = (3200.0,)   # GPU-seconds: 2 queues


@dataclass(frozen=True)
class _Entry:
    job: JobView
    nodes: int
    gpus: int
    queue: int
    base_queue: int
    promoted: bool
    running: bool


@dataclass(frozen=True)
class TiresiasParams(Params):
    """``tiresias``'s parameters.

    Attributes:
        queue_thresholds: attained-service limits of queues ``0..K-2`` in GPU-seconds, strictly
            increasing, positive and finite (``K - 1`` numbers for ``K`` queues).
        promote_knob: ``PROMOTEKNOB``: a waiting job returns to queue 0 once it has waited this
            many times longer than it has run (> 0); ``None`` disables it.
        preempt_within_queue: order each queue strictly by submit time, so an earlier job of the
            same queue may preempt a later one (default: running jobs first).

    Raises (when made):
        ValueError: a value out of range or of the wrong type.
    """

    queue_thresholds: tuple[float, ...] = DEFAULT_QUEUE_THRESHOLDS
    promote_knob: float | None = None
    preempt_within_queue: bool = False

    def check(self) -> None:
        th = self.queue_thresholds
        if any(not math.isfinite(t) or t <= 0 for t in th) or any(
                a >= b for a, b in itertools.pairwise(th)):
            raise ValueError(f"queue_thresholds must be positive, finite and strictly "
                             f"increasing, got {list(th)}")
        if self.promote_knob is not None and not self.promote_knob > 0:
            raise ValueError(f"promote_knob must be > 0 or None, got {self.promote_knob}")


def _left_out_reason(e: _Entry, why: str, k: int, free: int, started: list[_Entry]) -> str:
    """The reason of a job that gets no GPUs this round (``why``: its queue, ``k``: the
    cluster's GPUs, ``free``: those left after the higher-priority jobs, ``started``: the
    pending jobs that start ahead of it, in priority order): a running job is preempted, named
    by the first job that started ahead of it when those jobs are what took its GPUs; a pending
    one waits."""
    if e.gpus > k:
        short = f"needs {e.gpus} GPU(s), the cluster has {k}"
    else:
        short = f"needs {e.gpus} GPU(s), {free} free after higher-priority jobs"
    if not e.running:
        return f"tiresias: waits: {short}; {why}"
    # named when the jobs that started ahead of it are what took its GPUs
    taken = sum(s.gpus for s in started)
    by = started[0] if started and free + taken >= e.gpus else None
    if by is not None:
        return (f"tiresias: preempted by job {by.job.job_id} (queue {by.queue}); "
                f"{why}, {short}")
    return f"tiresias: preempted: {why}, {short}"


class Tiresias(PolicyBase):
    """Discretized 2D-LAS (module docstring). Parameters: :class:`TiresiasParams`.

    Raises (constructor):
        PolicyError: an unknown key or a bad value (the message lists the valid keys).
    """

    name = "tiresias"
    Params = TiresiasParams

    def __init__(self, **values):
        super().__init__(**values)
        self.queue_thresholds = self.params.queue_thresholds
        self.promote_knob = self.params.promote_knob
        self.preempt_within_queue = self.params.preempt_within_queue

    @property
    def num_queues(self) -> int:
        return len(self.queue_thresholds) + 1

    def queue_of(self, attained_gpu_seconds: float) -> int:
        """Queue index for an attained service (0 = highest priority)."""
        return sum(1 for t in self.queue_thresholds if attained_gpu_seconds >= t)

    def _entry(self, job: JobView, now: float) -> _Entry:
        nodes = min(max(job.nodes, job.min_nodes), job.max_nodes)
        gpus = nodes * job.workers_per_node
        attained = max(0.0, job.attained_gpu_seconds)
        base = self.queue_of(attained)
        queue, promoted = base, False
        if self.promote_knob is not None and base > 0 and gpus > 0:
            ran = attained / gpus
            waited = max(0.0, now - job.submit_time - ran)
            if ran > 0 and waited >= self.promote_knob * ran:
                queue, promoted = 0, True
        return _Entry(job, nodes, gpus, queue, base, promoted, job.state == SlurmState.RUNNING)

    def _why_queue(self, e: _Entry, now: float) -> str:
        a = max(0.0, e.job.attained_gpu_seconds)
        if e.promoted:
            ran = a / e.gpus
            waited = max(0.0, now - e.job.submit_time - ran)
            return (f"queue 0, promoted from queue {e.base_queue} (waited {waited:.0f} s >= "
                    f"{self.promote_knob:g} x {ran:.0f} s run)")
        th = self.queue_thresholds
        if e.queue < len(th):
            return f"queue {e.queue} (attained {a:.0f} GPU-s < {th[e.queue]:g})"
        return f"queue {e.queue} (attained {a:.0f} GPU-s >= {th[-1]:g})"

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        """One round of discretized 2D-LAS (module docstring). ``seed`` is unused."""
        k = capacity(snapshot)
        now = snapshot.time
        held = sum(j.gpus for j in snapshot.jobs if j.busy)
        entries = [self._entry(j, now) for j in snapshot.jobs if not j.busy]
        if self.preempt_within_queue:
            order = sorted(entries, key=lambda e: (e.queue, e.job.submit_time, e.job.job_id))
        else:
            order = sorted(entries, key=lambda e: (e.queue, not e.running, e.job.submit_time,
                                                   e.job.job_id))
        free = max(0, k - held)
        targets: list[JobTarget] = []
        started: list[_Entry] = []      # pending jobs that start, in priority order
        n_run = n_wait = n_pre = 0
        for e in order:
            j = e.job
            why = self._why_queue(e, now)
            if e.gpus > 0 and e.gpus <= free:
                free -= e.gpus
                n_run += 1
                if not e.running:
                    started.append(e)
                targets.append(JobTarget(j.job_id, e.nodes, j.batch_size,
                                         f"tiresias: {why}: runs on {e.gpus} GPU(s)"))
                continue
            if e.running:
                n_pre += 1
            else:
                n_wait += 1
            targets.append(JobTarget(j.job_id, 0, j.batch_size,
                                     _left_out_reason(e, why, k, free, started)))
        used = held + (max(0, k - held) - free)
        th = ", ".join(f"{t:g}" for t in self.queue_thresholds)
        note = (f"tiresias: {n_run} running, {n_wait} waiting, {n_pre} preempted on {k} GPU(s) "
                f"({held} held by busy jobs); {self.num_queues} queues, thresholds [{th}] GPU-s"
                + (f", promote knob {self.promote_knob:g}" if self.promote_knob else ""))
        return Plan(self.name, tuple(targets), float(used), (note,))
