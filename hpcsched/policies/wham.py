"""``wham``: GPUs handed out one step at a time to the job whose next GPUs raise its completion
rate the most -- a Whittle-index-style marginal allocation across jobs with different concave
speedup curves, clairvoyant as ``jct`` is.

**Source, and what was built.** Issue 35 asks for WHAM (Whittle Allocation for Malleable jobs)
from Li, Harchol-Balter and Berg, "Mean field optimal Core Allocation across Malleable jobs",
arXiv:2602.01411 (2026). Only the paper's abstract could be read here (arxiv.org/abs/2602.01411:
the CAM problem, several job classes each with an arbitrary concave speedup function and a
holding cost, two mean-field-optimal policies, FW-CAM and WHAM); the definition of WHAM's index
was not. So ``wham`` is **not** the paper's WHAM: it is the well-known rule the paper
generalises, the marginal (greedy) allocation that heSRPT-like policies make for concave
speedups (Berg, Vesilo, Harchol-Balter, heSRPT, SIGMETRICS'20, as :mod:`hpcsched.policies.jct`
cites it): each GPU goes to the job with the largest index

    index_j = c_j * (X_j(g_j + step) - X_j(g_j)) / (step * R_j)

``c_j`` the holding cost of the job's class (its application, ``holding_costs``; 1 by
default: mean response time), ``X_j(g)`` its best predicted goodput at ``g`` GPUs over its
allowed batch sizes (:func:`hpcsched.perf.model.best_at`: throughput x statistical efficiency
at the co-adapted batch size, Pollux OSDI'21 §3), ``R_j`` its remaining work (samples, as
``jct`` reads it: ``remaining_samples``). Normalised as the paper's setting is (speedup
``s_j(g) = X_j(g) / X_j(1)``, size in 1-GPU seconds ``R_j / X_j(1)``) the index is the same
number: ``c_j (s_j(g+1) - s_j(g)) / (R_j / X_j(1))``. FW-CAM is not built: it needs each
class's arrival rate and mean size (a steady-state fluid programme), which a snapshot does not
give. An adaptdl fork under the first author's name (github.com/Li-Zhouzi/adaptdl,
``sched/adaptdl_sched/_compute_width.py``, read for behaviour) computes such fixed widths per
application and epoch by a convex programme over the upper concave envelope of each speedup
curve; ``wham`` takes the same envelope of each job's curve (below).

**The objective.** With concave ``X_j`` the greedy allocation maximises exactly
``sum_j c_j X_j(g_j) / R_j`` subject to ``sum_j g_j <= K`` (a separable concave resource
allocation: greedy on marginal gains is optimal), the weighted sum of the jobs' completion
rates. A measured curve is not concave: at GPU granularity goodput drops where a job spills
onto a new node, and a start costs a restart. Each step is therefore a step along the job's
upper concave envelope from where it stands: from ``g`` the job's next step is to the allowed
count ``g' > g`` with the largest ``(f_j(g') - f_j(g)) / (g' - g)`` among those that fit in
the GPUs still free, ``f_j`` its value (below); the steps of all jobs are taken largest first,
each recomputed when GPUs run short (a lazy heap). GPUs stay idle only when no job gains from
more of them, or none that gains fits: the allocation is work-conserving.

**Change costs** (``price_changes``, on by default). A job's value at ``g`` GPUs is
``f_j(g) = c_j / (R_j / X_j(g) + cost_j(g))``: its completion rate once the change has been
paid (0 to stay, the snapshot's shrink cost to shrink, its grow cost to grow,
:meth:`~hpcsched.model.snapshot.ClusterSnapshot.grow_cost`, its restart cost to start), the
costs reconcile judges by; with ``price_changes=false`` it is ``c_j X_j(g) / R_j``, the pure
index above, and reconcile's gain test alone decides which changes pay.

**Limits.** Each job's GPU counts are its allowed counts at the snapshot's granularity
(:func:`hpcsched.policies.common.gpu_counts`; thinned above ``max_options`` as ``jct`` thins
them, whole-node counts kept). A running job keeps at least its smallest allowed count (``wham``
never preempts) and, under reconcile's no-thrash hold, is planned only the way the hold lets it
go; a pending job may wait (0 GPUs). Busy jobs (a resize in flight) are held where they are and
their GPUs are not handed out. A job nothing predicts yet (no throughput model) keeps its size
when running and, pending, starts at the size it asks for only after every measured job has
what it gains from (value :data:`UNMEASURED` per GPU, far below any measured job's). A job that
reports no remaining work is taken to have ``unknown_remaining`` seconds left at its goodput
at its current (pending: requested) size. With ``aging`` a pending job's weight grows as
``1 + wait / aging`` (off by default: the rule alone).

**What reconcile sees.** Each target's ``weight`` is ``c_j a_j / R_j`` (``a_j`` the age
weight, 1 without ``aging``), so reconcile weighs a gain of goodput ``dX`` as ``c_j a_j dX /
R_j``: the change in this objective. The plan is made, and judged, on the same view as
``jct``'s (the gradient noise scale times ``noise_growth``: :func:`hpcsched.policies.jct.
planning_view`), with ``jct``'s gate (no minimum gain) and rounds at job ends and arrivals.

Objective reported: ``sum_j f_j(g_j)`` (weighted completion rates, 1/s).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, Plan
from hpcsched.perf.model import best_at, best_at_each_of, model_for
from hpcsched.perf.priors import application_key
from hpcsched.policies.base import Params
from hpcsched.policies.common import capacity, gpu_counts, min_gpus, nodes_spanned, target
from hpcsched.policies.jct import PlannedOnGrownNoise, _allowed_now, _counts, _waited
from hpcsched.protocol.kinds import SlurmState

#: value per GPU of a job nothing predicts yet (1/s): below any measured job's completion rate
#: (a job of 1e12 samples at 1 sample/s has 1e-12), so it starts only on GPUs no measured job
#: gains from
UNMEASURED = 1e-15


def holding_table(entries: tuple[str, ...]) -> dict[str, float]:
    """``("bert=2", "cifar10=0.5")`` as ``{application: holding cost}`` (application names as
    :func:`~hpcsched.perf.priors.application_key` spells them).

    Raises:
        ValueError: an entry not ``NAME=NUMBER``, or a cost not positive.
    """
    table: dict[str, float] = {}
    for entry in entries:
        name, sep, value = entry.partition("=")
        try:
            cost = float(value) if sep and name.strip() else float("nan")
        except ValueError:
            cost = float("nan")
        if not cost > 0 or cost == float("inf"):
            raise ValueError(f"holding_costs entries must be APPLICATION=POSITIVE_NUMBER, "
                             f"got {entry!r}")
        table[application_key(name)] = cost
    return table


@dataclass(frozen=True)
class WHAMParams(Params):
    """``wham``'s parameters (module docstring).

    Attributes:
        holding_costs: ``"APPLICATION=COST"`` entries: the holding cost (weight) of each class;
            an application not named costs 1.
        price_changes: value each size after the change's cost (restart, shrink, grow); off:
            the pure marginal-goodput index.
        noise_growth: ``>= 1``: the factor on each job's gradient noise scale in the view the
            plan is made and judged on (as ``jct``'s).
        unknown_remaining: seconds of work assumed for a job that reports none.
        aging: seconds of waiting that double a pending job's weight; ``None``: no aging.
        max_options: GPU counts considered per job at most.
        restart_cost, shrink_cost: seconds; ``None``: the snapshot's.

    Raises (when made):
        ValueError: a value out of range or of the wrong type.
    """

    holding_costs: tuple[str, ...] = ()
    price_changes: bool = True
    noise_growth: float = 2.0
    unknown_remaining: float = 3600.0
    aging: float | None = None
    max_options: int = 24
    restart_cost: float | None = None
    shrink_cost: float | None = None

    def check(self) -> None:
        holding_table(self.holding_costs)
        if not (self.noise_growth >= 1 and self.unknown_remaining > 0 and self.max_options >= 1):
            raise ValueError("noise_growth must be >= 1, unknown_remaining > 0, max_options >= 1")
        if self.aging is not None and not self.aging > 0:
            raise ValueError("aging must be > 0 or None")
        if any(c is not None and not c >= 0 for c in (self.restart_cost, self.shrink_cost)):
            raise ValueError("restart_cost and shrink_cost must be >= 0")


@dataclass
class _Curve:
    """One job's options: its GPU counts (ascending), its value ``f`` and goodput at each, the
    index of the count it must keep (``-1``: it may get none), and what its target says."""

    job: JobView
    counts: np.ndarray                  # (n,) int
    value: np.ndarray                   # (n,) f_j at each count
    goodput: np.ndarray                 # (n,) samples/s
    batch: list[int]                    # global batch size at each count
    base: int = -1
    weight: float = 1.0                 # c_j a_j / R_j (reconcile's)
    remaining: float = 0.0
    measured: bool = True
    pos: int = field(init=False)

    def __post_init__(self):
        self.pos = self.base

    def gpus(self, pos: int | None = None) -> int:
        pos = self.pos if pos is None else pos
        return int(self.counts[pos]) if pos >= 0 else 0

    def step(self, free: int) -> tuple[float, int] | None:
        """``(value per GPU, index)`` of the job's steepest step from where it stands to a
        count within ``free`` more GPUs (ties: the farthest, as the envelope's vertex);
        ``None`` when no such step gains."""
        g, f = self.gpus(), (float(self.value[self.pos]) if self.pos >= 0 else 0.0)
        lo = self.pos + 1
        hi = int(np.searchsorted(self.counts, g + free, side="right"))
        if hi <= lo:
            return None
        slopes = (self.value[lo:hi] - f) / (self.counts[lo:hi] - g)
        k = len(slopes) - 1 - int(np.argmax(slopes[::-1]))
        return (float(slopes[k]), lo + k) if slopes[k] > 0 else None


@dataclass(frozen=True)
class _Setting:
    """What every job's curve is computed with this decision."""

    holding: dict[str, float]
    price_changes: bool
    unknown_remaining: float
    aging: float | None
    max_options: int
    restart_cost: float
    shrink_cost: float


def decide(snapshot: ClusterSnapshot, params: WHAMParams) -> Plan:
    """The ``wham`` plan for ``snapshot`` (module docstring), made on ``snapshot`` as given
    (:class:`WHAM` hands it its judged view)."""
    k = capacity(snapshot)
    live = [j for j in snapshot.jobs if j.state in (SlurmState.RUNNING, SlurmState.PENDING)]
    held = sum(j.gpus for j in live if j.busy and j.state == SlurmState.RUNNING)
    curves = _curves([j for j in live if not j.busy], snapshot, _setting(snapshot, params))
    free = k - held - sum(c.gpus() for c in curves)
    if free < 0:
        return Plan("wham", (), None, (f"wham: the running jobs' minimums exceed the {k} GPUs "
                                       "available; no change",))
    free, last = _allocate(curves, free)
    return _plan(curves, last, snapshot, f"on {k} GPU(s)", free)


def _plan(curves: list[_Curve], last: dict[str, float], snapshot: ClusterSnapshot, where: str,
          free: int) -> Plan:
    """The plan of the allocated ``curves``: a target per job, the objective, a note."""
    targets = tuple(_target(c, last.get(c.job.job_id), snapshot) for c in curves)
    total = sum(float(c.value[c.pos]) for c in curves if c.pos >= 0 and c.measured)
    started = sum(1 for c in curves if c.job.state == SlurmState.PENDING and c.gpus())
    return Plan("wham", targets, total,
                (f"wham: {len(curves)} job(s) {where}, {started} pending job(s) started, "
                 f"{free} GPU(s) left idle; objective {total:.3g} (weighted completion rates)",))


def _setting(snapshot: ClusterSnapshot, params: WHAMParams) -> _Setting:
    """What the curves are computed with: ``params``, the costs ``None`` leaves to the
    snapshot."""
    return _Setting(holding_table(params.holding_costs), params.price_changes,
                    params.unknown_remaining, params.aging, params.max_options,
                    snapshot.restart_cost if params.restart_cost is None else params.restart_cost,
                    snapshot.shrink_cost if params.shrink_cost is None else params.shrink_cost)


def _allocate(curves: list[_Curve], free: int) -> tuple[int, dict[str, float]]:
    """Take the jobs' steps, steepest first, while GPUs are free (module docstring); each
    job's position moves in place. Returns the GPUs left and, per job that took a step, the
    value per GPU of its last one (its index at the margin)."""
    heap: list[tuple[float, int, int]] = []
    for i, c in enumerate(curves):
        step = c.step(free)
        if step is not None:
            heap.append((-step[0], i, step[1]))
    heapq.heapify(heap)
    last: dict[str, float] = {}
    while heap and free > 0:
        neg, i, _ = heapq.heappop(heap)
        c = curves[i]
        step = c.step(free)              # free only shrinks: the step is as good or worse now
        if step is None:
            continue
        slope, to = step
        if slope < -neg * (1 - 1e-12):  # worse than when queued: back in line
            heapq.heappush(heap, (-slope, i, to))
            continue
        free -= int(c.counts[to]) - c.gpus()
        c.pos, last[c.job.job_id] = to, slope
        nxt = c.step(free)
        if nxt is not None:
            heapq.heappush(heap, (-nxt[0], i, nxt[1]))
    return free, last


def _curves(jobs: list[JobView], snapshot: ClusterSnapshot, s: _Setting) -> list[_Curve]:
    """Each job's curve (:class:`_Curve`), the goodputs of every job at every count in one
    pass (:func:`~hpcsched.perf.model.best_at_each_of`)."""
    models = [model_for(j) for j in jobs]
    counts = [_allowed_now(j, snapshot, _counts(j, snapshot, s.max_options)) for j in jobs]
    asked = [(j, m, [(g, nodes_spanned(j, g, snapshot)) for g in c])
             for j, m, c in zip(jobs, models, counts) if m is not None]
    rates = iter(best_at_each_of(asked))
    return [_curve(j, m, c, next(rates), snapshot, s) if m is not None
            else _unmeasured(j, snapshot) for j, m, c in zip(jobs, models, counts)]


def _curve(job: JobView, model, counts: list[int], rates: list, snapshot: ClusterSnapshot,
           s: _Setting) -> _Curve:
    """A measured job's curve over the counts it can run at (a batch size fits)."""
    running = job.state == SlurmState.RUNNING
    ok = [(g, x, cfg.global_batch_size) for g, (x, cfg) in zip(counts, rates)
          if cfg is not None and x > 0]
    if not ok:                           # no size within its limits: held where it is
        return _unmeasured(job, snapshot)
    g_arr = np.array([g for g, _, _ in ok], dtype=np.int64)
    x_arr = np.array([x for _, x, _ in ok])
    remaining = _remaining(job, model, snapshot, s)
    age = 1.0 + _waited(job, snapshot) / s.aging if s.aging else 1.0
    weight = s.holding.get(application_key(job.app_class), 1.0) * age / remaining
    if s.price_changes:
        x_now = _goodput_now(job, model, g_arr, x_arr, snapshot)
        cost = np.array([_change_cost(job, int(g), x_now, float(x), snapshot, s)
                         for g, x in zip(g_arr, x_arr)])
        value = weight * remaining / (remaining / x_arr + cost)
    else:
        value = weight * x_arr
    return _Curve(job, g_arr, value, x_arr, [b for *_, b in ok], 0 if running else -1,
                  weight, remaining)


def _unmeasured(job: JobView, snapshot: ClusterSnapshot) -> _Curve:
    """A job nothing predicts (or with no size that fits): running, kept at its size;
    pending, one step to the size it asks for (within its limits), valued at ``UNMEASURED`` per
    GPU."""
    if job.state == SlurmState.RUNNING:
        g, base = job.gpus, 0
    else:
        g = max(min_gpus(job, snapshot), min(job.gpus, max(gpu_counts(job, snapshot),
                                                           default=job.gpus)))
        base = -1
    return _Curve(job, np.array([g], dtype=np.int64), np.array([UNMEASURED * g]),
                  np.zeros(1), [job.batch_size], base, measured=False)


def _remaining(job: JobView, model, snapshot: ClusterSnapshot, s: _Setting) -> float:
    """Samples left: what the job reports, else ``unknown_remaining`` seconds at its goodput
    at its current size (pending: the size it asks for)."""
    if job.remaining_samples is not None:
        return max(float(job.remaining_samples), 1e-9)
    g = job.gpus
    x = best_at(job, model, g, nodes_spanned(job, g, snapshot))[0] if g > 0 else 0.0
    return max(s.unknown_remaining * max(x, 1e-9), 1e-9)


def _goodput_now(job: JobView, model, counts: np.ndarray, rates: np.ndarray,
                 snapshot: ClusterSnapshot) -> float:
    """A running job's predicted goodput at its current GPUs (samples/s; 0 pending)."""
    if job.state != SlurmState.RUNNING:
        return 0.0
    hit = np.flatnonzero(counts == job.gpus)
    if hit.size:
        return float(rates[hit[0]])
    return best_at(job, model, job.gpus, nodes_spanned(job, job.gpus, snapshot))[0]


def _change_cost(job: JobView, gpus: int, x_now: float, x_to: float, snapshot: ClusterSnapshot,
                 s: _Setting) -> float:
    """Seconds going to ``gpus`` costs the job: a start, nothing to stay, a shrink, a grow."""
    if job.state != SlurmState.RUNNING:
        return s.restart_cost
    if gpus == job.gpus:
        return 0.0
    if gpus < job.gpus:
        return s.shrink_cost
    return replace(snapshot, restart_cost=s.restart_cost).grow_cost(x_now, x_to)


def _target(c: _Curve, margin: float | None, snapshot: ClusterSnapshot) -> JobTarget:
    job, g = c.job, c.gpus()
    if not c.measured:
        why = "wham: not measured yet: kept at its size" if g else "wham: waits: not measured yet"
        return target(job, g, job.batch_size, why, snapshot)
    if g == 0:
        t = target(job, 0, job.batch_size, "wham: waits: every GPU gains more elsewhere",
                   snapshot)
        return replace(t, weight=c.weight)
    x, batch = float(c.goodput[c.pos]), c.batch[c.pos]
    why = (f"wham: {g} GPU(s), batch {batch}: goodput {x:.0f} samples/s, "
           f"{c.remaining / x:.0f} s of work left"
           + (f", index {margin:.3g} at its last step" if margin is not None else ""))
    t = target(job, g, batch, why, snapshot, predicted_goodput=x)
    return replace(t, weight=c.weight)


class WHAM(PlannedOnGrownNoise):
    """The ``wham`` policy (module docstring) with its parameters (:class:`WHAMParams`).

    Raises (constructor):
        PolicyError: an unknown key or a bad value (the message lists the valid keys).
    """

    name = "wham"
    Params = WHAMParams
    params: WHAMParams
    #: as ``jct``'s: the plan prices its own changes (``price_changes``), so no minimum gain;
    #: reconcile's gain test and no-thrash hold stay
    reconcile_gate = MappingProxyType({"min_gain": 0.0})
    #: a round when a job ends or a submitted job finds no room: freed GPUs go to the next
    #: largest index at once (as ``jct``)
    round_on_events = True

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        """The ``wham`` plan for ``snapshot`` (:func:`decide`), made on :meth:`judged_view`;
        ``seed`` is unused (the allocation is deterministic)."""
        return decide(self.judged_view(snapshot), self.params)


__all__ = ["WHAM", "WHAMParams", "decide", "holding_table"]
