"""``jct``: average job completion time first, with starvation bounded -- the default policy.

Our jobs know what Pollux's do not: how much work they have left (``remaining_samples``,
reported by the elastic API: epochs x data-set size minus what was trained). ``jct`` uses it with
the goodput model the other policies use.

**Objective.** Each round, give every job ``j`` (running or pending: every job is a candidate
every round, there is no first-come queue) a GPU count ``g_j`` and batch size that maximise::

    maximise  sum_j  w_j * T_j^ref / (R_j / X_j(g_j) + c_j(g_j))     subject to  sum_j g_j <= K

``R_j`` is the job's remaining work (samples), ``X_j(g)`` its best predicted goodput at ``g``
GPUs over its allowed batch sizes (samples/s; :func:`hpcsched.perf.model.best_at`: throughput x
statistical efficiency, Pollux OSDI'21 §3), so ``T_j(g) = R_j / X_j(g)`` is its remaining time
at that size and ``T_j^ref`` the one at its reference size (its fair share; below): each term
is the job's speedup over that size, once ``c_j(g)`` is paid -- the restart cost for a start, the
shrink cost for a shrink, 0 to stay, and for a running job's grow the snapshot's grow cost
(:meth:`~hpcsched.model.snapshot.ClusterSnapshot.grow_cost`: the restart cost by requeue;
by extension ``startup x max(0, 1 - X_j(now) / X_j(g)) + stall``, exactly what the extension
adds to ``T_j(g)``: the job trains on at its current goodput while the new workers start) --
the snapshot's costs, those reconcile judges by, so a change is chosen only when it finishes
the job sooner after its cost. A pending job
may get 0 GPUs (it waits, value 0) or any allowed count, smaller than it asked included.

``w_j`` is heSRPT's weight (Berg, Vesilo, Harchol-Balter, "Optimal Scheduling of Parallel Jobs
with Unknown Service Requirements" / heSRPT, SIGMETRICS'20 §4), times the job's age weight
(below). For ``m`` jobs with speedup ``k^p``, the allocation that minimises mean flow time gives
the ``i``-th largest (by remaining work) ``theta_i = (i/m)^(1/(1-p)) - ((i-1)/m)^(1/(1-p))`` of
the cluster: the shortest job the largest share, none all of it. That allocation maximises
``sum_i w_i s(theta_i)`` exactly when ``w_i = theta_i^(1-p)``; ``jct`` ranks the jobs by
``T_j^min`` (their remaining time at their smallest allowed size) and uses those weights
(``hesrpt`` = ``p``, 0.5 by default) on each job's own measured speedup curve instead of
``k^p``. The search is exact: the dynamic program of
:func:`hpcsched.policies.dp.solve` over the GPU counts (Saxena et al., MASCOTS'20 §IV).
The default ``p`` and the rank weights over ``tempering`` were chosen in the simulator
(measured: docs/design-notes.md, "policies/jct.py").

**Speedups over the fair share** (``speedup_at="fair"``, the default). The speedup each term
counts is taken over the job's goodput at the fair share ``ceil(K / J)`` GPUs (``J`` jobs,
running and pending; the largest allowed count within it), as Pollux's (OSDI'21 §4.1), not
over its smallest size: the numerator is ``T_j^fair`` instead of ``T_j^min``. Under heSRPT's
common speedup ``k^p`` the reference cancels (every job's value scales by the same
``k_ref^p``); with the jobs' own curves it does not: over 1 GPU, a job that scales linearly
is worth ``g`` at ``g`` GPUs, a job whose statistical efficiency caps it early about 1.5, so
the longest job takes the cluster whatever its rank weight. Over the fair share both curves
are 1 where the jobs would share equally, and the rank weight (the shorter job the larger
share) decides at the margin. ``speedup_at="min"`` keeps the speedup over the smallest size.
The fair share gave a lower mean average JCT than ``min`` in the simulator (measured:
docs/design-notes.md, "policies/jct.py").

**Starvation is bounded.** A job's weight is ``w_j = 1 + wait_j / aging`` where ``wait_j`` is
how long it has been in the system without GPUs (pending since submission or since its
preemption), so a waiting job's value grows without bound and it is started once its weighted
rate beats the least valuable running job's. Hard bound: a pending job that has waited longer
than ``max_wait`` seconds is admitted before the search, at its smallest size, ahead of jobs
that have not; the running jobs are then shrunk (never below their minimum) to make room. So a
job waits at most ``max_wait`` plus the time for the running jobs' minimums to leave room
(running jobs are never preempted by ``jct``).

**Efficiency over the remaining work.** ``T_j(g)`` is the job's remaining time, so the
statistical efficiency in ``X_j`` is the one over its remaining work: the plan predicts it with
the job's measured gradient noise scale times ``noise_growth`` (2 by default), because the
noise scale grows as training goes on and is measured at the job's own, often small, batch
(:func:`planning_view`); reconcile judges the plan on the same view.

**The no-thrash hold.** A job that reconcile's hold keeps from going back (grown less than
``hold`` seconds ago: no shrink; shrunk: no grow; :func:`~hpcsched.model.snapshot.held_reversal`)
is planned only the way the hold lets it go, so no other job is planned onto GPUs that will
not free (:func:`_allowed_now`).

**Rounds at events.** ``jct`` asks the daemon and the simulator for a round the moment a job
ends or a submitted job finds no room (:attr:`JCT.round_on_events`).

**Remaining work unknown** (a job that does not report it): its remaining time is taken as
``unknown_remaining`` seconds at its goodput at its current size (pending: the size it asks
for). **Not measured yet** (no throughput model:
neither a profile nor a prior for its application): it keeps its size, valued at a tiny
epsilon per GPU, as in :mod:`hpcsched.policies.dp`. Busy jobs (a resize in flight) are held
where they are.

**Granularity.** The GPU counts a job may have come from
:func:`hpcsched.policies.common.gpu_counts`: whole nodes x its GPUs per node, or (GPU-granular)
any count, packed onto as few nodes as it fits. Above ``max_options`` counts per job the
counts are thinned geometrically (all small counts kept), which keeps a decision on 4,096 GPUs
and 1,000 jobs within a second.

Each target's :attr:`~hpcsched.model.snapshot.JobTarget.weight` is
``w_j T_j^ref / R_j``, so reconcile judges the plan by this objective (a gain of goodput ``dX``
is a gain of ``w_j T_j^ref dX / R_j`` in it to first order).

Objective reported: the plan's value of the objective above (weighted speedups).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, Plan, held_reversal
from hpcsched.perf.model import best_at, best_at_each_of, model_for
from hpcsched.policies.base import Params, PolicyBase
from hpcsched.policies.common import capacity, gpu_counts, min_gpus, nodes_spanned, target
from hpcsched.policies.dp import EPSILON, Option, solve
from hpcsched.policies.jct_tail import critical_floors, in_tail
from hpcsched.protocol.kinds import SlurmState


@dataclass(frozen=True)
class JCTParams(Params):
    """``jct``'s parameters (:func:`decide`'s keywords; their meaning is documented there).

    Raises (when made):
        ValueError: ``hesrpt`` outside ``(0, 1)``, ``tempering`` outside ``[0, 1]``,
            ``speedup_at`` not ``"fair"`` or ``"min"``, ``noise_growth`` below 1, a negative
            cost or ``max_wait``, ``aging`` or ``unknown_remaining`` not positive,
            ``max_options`` below 1, or a value of the wrong type.
    """

    restart_cost: float | None = None     # s; None: the snapshot's
    shrink_cost: float | None = None      # s; None: the snapshot's
    aging: float = 3600.0                 # s of waiting that double a pending job's weight
    max_wait: float = 4 * 3600.0          # s after which a pending job is admitted ahead
    unknown_remaining: float = 3600.0     # s of work assumed for a job that reports none
    max_options: int = 24                 # GPU counts per job at most
    tempering: float = 0.0
    hesrpt: float | None = 0.5
    speedup_at: str = "fair"
    noise_growth: float = 2.0
    work_noise: float = 0.0
    work_known: bool = True
    makespan_guard: float | None = None   # >= 1: the tail's floors (jct_tail); None: off
    tail_after: float = 0.0               # s without a submission before the tail begins
    tail_pending: bool = False            # the tail may begin with jobs pending (jct_tail.in_tail)

    def check(self) -> None:
        if self.hesrpt is not None and not 0 < self.hesrpt < 1 or not 0 <= self.tempering <= 1 \
                or self.speedup_at not in ("min", "fair") or not self.noise_growth >= 1:
            raise ValueError("hesrpt must be in (0, 1) or None, tempering in [0, 1], "
                             "speedup_at 'min' or 'fair', noise_growth >= 1")
        if any(c is not None and not c >= 0 for c in (self.restart_cost, self.shrink_cost)) \
                or not self.max_wait >= 0:
            raise ValueError("restart_cost, shrink_cost and max_wait must be >= 0")
        if not (self.aging > 0 and self.unknown_remaining > 0 and self.max_options >= 1):
            raise ValueError("aging and unknown_remaining must be > 0, max_options >= 1")
        if not self.work_noise >= 0:
            raise ValueError("work_noise must be >= 0")
        self._check_guard()

    def _check_guard(self) -> None:
        if self.makespan_guard is not None and not self.makespan_guard >= 1 \
                or not self.tail_after >= 0:
            raise ValueError("makespan_guard must be >= 1 or None, tail_after >= 0")


@dataclass(frozen=True)
class _Params:
    restart_cost: float
    shrink_cost: float
    grow_cost: Callable[[float, float], float]   # (goodput now, at the new size) -> seconds
    aging: float
    unknown_remaining: float
    max_options: int
    tempering: float
    rank: dict          # job id -> heSRPT rank weight (empty: 1 for every job)
    share: int = 0      # speedups over the goodput at this many GPUs (0: at the smallest size)
    work_noise: float = 0.0     # sigma of the log-normal error on each job's reported work
    work_known: bool = True     # False: no job's reported work is used
    #: job id -> the fewest GPUs the makespan guard gives it (:mod:`.jct_tail`)
    floors: dict = field(default_factory=dict)
    #: job id -> its curve this decision (:func:`_curves`), computed once for the rank weights
    #: and the options
    curves: dict = field(default_factory=dict)


def _curves(jobs: list[JobView], snapshot: ClusterSnapshot, p: _Params) -> None:
    """Each job's curve into ``p.curves`` (``job id -> (model, counts, rates)``: its throughput
    model, its allowed GPU counts, :func:`_counts`, and the best goodput and configuration at
    each, ``None`` without a model), their goodputs in one pass
    (:func:`~hpcsched.perf.model.best_at_each_of`). :func:`decide` fills them for every job
    it may move, before anything reads them."""
    models = [model_for(j) for j in jobs]
    counts = [_counts(j, snapshot, p.max_options) for j in jobs]
    asked = [(j, m, [(g, nodes_spanned(j, g, snapshot)) for g in c])
             for j, m, c in zip(jobs, models, counts) if m is not None]
    rates = iter(best_at_each_of(asked))
    for j, m, c in zip(jobs, models, counts):
        p.curves[j.job_id] = (m, c, None if m is None else next(rates))


def _check_values(hesrpt: float | None, tempering: float, speedup_at: str,
                  noise_growth: float) -> None:
    """Raise ``ValueError``, saying which, for a value of :func:`decide`'s that
    :class:`JCTParams` refuses; nothing otherwise."""
    if hesrpt is not None and not 0 < hesrpt < 1 or not 0 <= tempering <= 1 \
            or speedup_at not in ("min", "fair") or not noise_growth >= 1:
        JCTParams(hesrpt=hesrpt, tempering=tempering, speedup_at=speedup_at,
                  noise_growth=noise_growth)       # raises, saying which


def _costs(snapshot: ClusterSnapshot, restart_cost: float | None, shrink_cost: float | None
           ) -> tuple[float, float, Callable[[float, float], float]]:
    """``(restart, shrink, grow_cost)``: the seconds a start or requeue and an in-place shrink
    cost (``None``: the snapshot's), and the snapshot's grow cost at that restart cost
    (:meth:`ClusterSnapshot.grow_cost`: goodput now, at the new size -> seconds)."""
    restart = snapshot.restart_cost if restart_cost is None else restart_cost
    return (restart, snapshot.shrink_cost if shrink_cost is None else shrink_cost,
            replace(snapshot, restart_cost=restart).grow_cost)


def decide(snapshot: ClusterSnapshot, seed: int = 0, *, restart_cost: float | None = None,
           shrink_cost: float | None = None, aging: float = 3600.0, max_wait: float = 4 * 3600.0,
           unknown_remaining: float = 3600.0, max_options: int = 24, tempering: float = 0.0,
           hesrpt: float | None = 0.5, speedup_at: str = "fair", noise_growth: float = 2.0,
           work_noise: float = 0.0, work_known: bool = True,
           makespan_guard: float | None = None, tail_after: float = 0.0,
           tail_pending: bool = False) -> Plan:
    """The ``jct`` plan for ``snapshot`` (module docstring). ``seed`` is unused (the search is
    exact).

    Args:
        restart_cost, shrink_cost: seconds a start or grow (requeue) and an in-place shrink cost
            the job; ``None``: the snapshot's (the daemon's and the simulator's costs, the
            ones reconcile weighs the plan's changes with). A grow by extension (the snapshot's
            ``grow``) costs what :meth:`ClusterSnapshot.grow_cost` says.
        aging: seconds of waiting that double a pending job's weight.
        max_wait: seconds after which a pending job is admitted ahead of the search.
        unknown_remaining: remaining seconds assumed for a job that does not report its work.
        max_options: GPU counts considered per job at most (thinned geometrically above it).
        hesrpt: heSRPT's speedup exponent ``p`` in ``(0, 1)`` for the rank weights (module
            docstring); ``None``: no rank weights, and ``tempering`` instead.
        tempering: with ``hesrpt=None``, ``gamma`` in ``[0, 1]``: each job's weight is
            ``T_min^gamma`` (0: the sum of completion rates ``1 / T_j``, SRPT-like; 1: the sum
            of speedups over the smallest size, no remaining work).
        speedup_at: ``"fair"``: speedups over the goodput at the fair share; ``"min"``: over
            the smallest size (module docstring; also the reference size of ``tempering``).
        noise_growth: ``>= 1``: the factor on each job's measured gradient noise scale the
            plan predicts its statistical efficiency with (:func:`planning_view`); 1: as
            measured.
        work_noise, work_known: what-ifs of less knowledge than the jobs give (issue 35's
            "jct without perfect knowledge"): with ``work_noise`` ``sigma > 0`` each job's
            reported remaining work is seen times ``exp(sigma z)``, ``z`` a standard normal
            drawn once per job from its id (a log-normal error of median 1, fixed for the
            job); with ``work_known=False`` no job's report is used: every job's remaining
            work is ``unknown_remaining`` seconds at its goodput, as for a job that reports
            none.
        makespan_guard, tail_after: the makespan guard (:mod:`hpcsched.policies.jct_tail`):
            once nothing is pending and nothing was submitted for ``tail_after`` seconds, each
            job is given at least the GPUs that end it within ``makespan_guard`` (``>= 1``)
            times the jobs' earliest common finish; ``None``: off.
        tail_pending: the tail begins ``tail_after`` seconds after the last submission even
            with jobs pending (the backlog is then a fixed set of jobs: :func:`~.jct_tail.in_tail`).

    Raises:
        ValueError: a value :class:`JCTParams` refuses (the :class:`JCT` policy checks them
            once, when it is made).
    """
    _check_values(hesrpt, tempering, speedup_at, noise_growth)
    snapshot = planning_view(snapshot, noise_growth)
    k = capacity(snapshot)
    jobs = [j for j in snapshot.jobs if j.state in (SlurmState.RUNNING, SlurmState.PENDING)]
    restart, shrink, grow = _costs(snapshot, restart_cost, shrink_cost)
    p = _Params(restart, shrink, grow, aging, unknown_remaining, max_options,
                1.0 if hesrpt else tempering, {},
                -(-k // max(1, len(jobs))) if speedup_at == "fair" else 0, work_noise, work_known)
    _curves([j for j in jobs if not j.busy], snapshot, p)
    if hesrpt:
        p = replace(p, rank=_rank_weights(jobs, snapshot, p, hesrpt))
    p = _with_floors(p, jobs, snapshot, k, makespan_guard, tail_after, tail_pending)
    forced = _overdue(snapshot, jobs, max_wait)
    sol, opts, info, notes = _search(jobs, snapshot, forced, p, k)
    if sol is None:
        return Plan("jct", (), None,
                    (f"jct: the running jobs' minimums exceed the {k} GPUs available; no change",))
    total, picks = sol
    targets = [_target(j, o[i], meta, snapshot)
               for j, o, i, meta in zip(jobs, opts, picks, info) if not j.busy]
    started = sum(1 for j, o, i in zip(jobs, opts, picks) if j.state == SlurmState.PENDING and o[i].gpus)
    notes.append(f"jct: {len(jobs)} job(s) on {k} GPU(s), {started} pending job(s) started, "
                 f"{len(forced)} overdue; objective {total:.3g} (weighted speedups)")
    return Plan("jct", tuple(targets), float(total), tuple(notes))


def _with_floors(p: _Params, jobs: list[JobView], snapshot: ClusterSnapshot, k: int,
                 guard: float | None, tail_after: float, tail_pending: bool = False) -> _Params:
    """``p`` with the makespan guard's floors when it is on and the queue has drained
    (:mod:`hpcsched.policies.jct_tail`)."""
    if not guard or not in_tail(jobs, snapshot.time, tail_after, tail_pending):
        return p
    return replace(p, floors=critical_floors(jobs, p.curves, lambda j, m: _remaining(j, m, p),
                                             k, guard))


def _search(jobs: list[JobView], snapshot: ClusterSnapshot, forced: set[str], p: _Params, k: int
            ) -> tuple[tuple[float, list[int]] | None, list[list[Option]], list[dict], list[str]]:
    """The DP over every job's options; when the overdue jobs' minimums do not fit beside the
    running jobs', again without admitting them ahead (they wait, with a note)."""
    options = [_job_options(j, snapshot, forced, p) for j in jobs]
    opts: list[list[Option]] = [o for o, _ in options]
    info: list[dict] = [meta for _, meta in options]
    sol = solve(opts, k) if jobs else (0.0, [])
    if sol is None and p.floors:
        return _search(jobs, snapshot, forced, replace(p, floors={}), k)
    if sol is not None or not forced:
        return sol, opts, info, []
    note = (f"jct: {len(forced)} overdue job(s) do not fit beside the running jobs' minimums; "
            "they wait for GPUs to free")
    opts = [_job_options(j, snapshot, set(), p)[0] for j in jobs]
    return solve(opts, k), opts, info, [note]


class PlannedOnGrownNoise(PolicyBase):
    """A policy that plans on :func:`planning_view` (its parameters' ``noise_growth``) and so is
    judged on it: reconcile weighs a change by the goodputs the plan was made with
    (:func:`hpcsched.policies.round.decide_round`). ``jct`` and ``wham``."""

    _view: tuple[ClusterSnapshot, ClusterSnapshot] | None = None

    def judged_view(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot reconcile judges this policy's plans on: the one the plan was made on
        (:func:`planning_view`), so both weigh a change by the same predicted goodputs
        (:func:`hpcsched.policies.round.decide_round`). Built once per snapshot: the plan and
        reconcile of a round ask for the same one (the last is remembered)."""
        if self._view is None or self._view[0] is not snapshot:
            growth = self.params.noise_growth  # type: ignore[attr-defined]
            self._view = (snapshot, planning_view(snapshot, growth))
        return self._view[1]


class JCT(PlannedOnGrownNoise):
    """The ``jct`` policy (module docstring) with its parameters (:class:`JCTParams`) bound.

    Raises (constructor):
        PolicyError: an unknown key or a bad value (the message lists the valid keys).
    """

    name = "jct"
    Params = JCTParams
    params: JCTParams
    #: reconcile's gate for this policy's plans (:func:`hpcsched.policies.round.decide_round`):
    #: no minimum gain. ``jct`` prices each change itself (a target's value counts its start,
    #: shrink or grow cost, so the search keeps a job where it is unless the change pays), and
    #: reconcile's gain test still weighs the changes' gain over the horizon against their
    #: costs; the no-thrash hold stays. No minimum gain gave a lower average JCT than 0.05 and
    #: no flip-flop (measured: docs/design-notes.md, "policies/jct.py").
    reconcile_gate = MappingProxyType({"min_gain": 0.0})
    #: run a round the moment a job ends or a submitted job finds no room, besides the
    #: periodic ones (the daemon's ``daemon.event_rounds``, the simulator's
    #: ``SimConfig.event_rounds``): freed GPUs go to the jobs that gain most instead of idling
    #: up to a round, and a new job starts at once (measured: docs/design-notes.md,
    #: "policies/jct.py"). ``pollux`` does not ask: the same rounds made its average JCT worse.
    round_on_events = True

    def __init__(self, **values):
        super().__init__(**values)
        # the plan is made on the judged view, which has the noise growth already
        self._kwargs = {**asdict(self.params), "noise_growth": 1.0}

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        """The ``jct`` plan for ``snapshot`` (:func:`decide`), made on :meth:`judged_view`."""
        return decide(self.judged_view(snapshot), seed, **self._kwargs)


def planning_view(snapshot: ClusterSnapshot, noise_growth: float) -> ClusterSnapshot:
    """``snapshot`` with each job's gradient noise scale (its reported ``grad_var`` over
    ``grad_sqr``) multiplied by ``noise_growth`` (>= 1; 1: the snapshot itself), shapes and
    everything else unchanged.

    ``jct`` values a job by its remaining time, and the statistical efficiency that sets it is
    the one over the job's remaining work, not the one its latest measurement gives (Pollux's
    own objective is the goodput now, OSDI'21 §3.1). Two effects make the measured noise
    scale a low estimate of it. It grows as training goes on (McCandlish et al., "An Empirical
    Model of Large-Batch Training", arXiv:1812.06162, §3-4: by an order of magnitude over a
    run). And a job measures it at its own batch, where the traces measure a larger one at
    larger batches. A job planned on its current measurement is shrunk to a small batch early
    in training and comes back only after the no-thrash hold. ``noise_growth`` 2 is below the
    growth in Pollux's traces (``hpcsched/data/pollux``) of every application but imagenet's
    and bert's (the traces' figures, and the simulated average JCT at other values:
    docs/design-notes.md, "policies/jct.py")."""
    if noise_growth == 1:
        return snapshot
    jobs = tuple(replace(j, grad_noise=(j.grad_noise[0], j.grad_noise[1] * noise_growth))
                 if j.grad_noise is not None else j for j in snapshot.jobs)
    return replace(snapshot, jobs=jobs)


def _remaining(job: JobView, model, p: _Params) -> float:
    """The job's remaining work, samples: what it reports, else ``unknown_remaining`` seconds
    at its goodput at its current size (running) or the size it asks for (pending: a job that
    has not run yet has reported nothing; counted as none, its work would rank it first, with
    its largest batch; history: docs/design-notes.md, "policies/jct.py")."""
    if job.remaining_samples is not None and p.work_known:
        seen = job.remaining_samples * (_work_error(job.job_id, p.work_noise) if p.work_noise else 1.0)
        return max(seen, 1e-9)
    x_now = best_at(job, model, job.gpus, job.nodes)[0] if job.gpus > 0 else 0.0
    return max(p.unknown_remaining * max(x_now, 1e-9), 1e-9)


@lru_cache(maxsize=65536)
def _work_error(job_id: str, sigma: float) -> float:
    """The log-normal factor ``exp(sigma z)`` on job ``job_id``'s reported work (``work_noise``):
    ``z`` standard normal, drawn from the job's id, so the same every round."""
    z = np.random.default_rng(zlib.crc32(job_id.encode())).standard_normal()
    return float(np.exp(sigma * z))


def _t_min(job: JobView, snapshot: ClusterSnapshot, p: _Params) -> float | None:
    """The job's remaining time at its smallest allowed size (s); ``None`` unmeasured."""
    if job.busy:
        return None
    model, _, rates = p.curves[job.job_id]
    if model is None or not rates:
        return None
    x, cfg = rates[0]                       # at its smallest allowed count
    if cfg is None or x <= 0:
        return None
    return _remaining(job, model, p) / x


def _rank_weights(jobs: list[JobView], snapshot: ClusterSnapshot, p: _Params, exponent: float
                  ) -> dict[str, float]:
    """heSRPT's weight per measured job from its rank by remaining time (``hesrpt`` above)."""
    t = {j.job_id: _t_min(j, snapshot, p) for j in jobs}
    ranked = sorted((x, jid) for jid, x in t.items() if x is not None)[::-1]   # largest first
    m, a = len(ranked), 1.0 / (1.0 - exponent)
    return {jid: ((i / m) ** a - ((i - 1) / m) ** a) ** (1.0 - exponent)
            for i, (_, jid) in enumerate(ranked, 1)}


def _overdue(snapshot: ClusterSnapshot, jobs: list[JobView], max_wait: float) -> set[str]:
    return {j.job_id for j in jobs
            if j.state == SlurmState.PENDING and not j.busy and _waited(j, snapshot) > max_wait}


def _waited(job: JobView, snapshot: ClusterSnapshot) -> float:
    """Seconds a pending job has been without GPUs: since submission, or since it last ran."""
    if job.state != SlurmState.PENDING:
        return 0.0
    since = job.resized_at if job.held and job.resized_at is not None else job.submit_time
    return max(0.0, snapshot.time - since)


def _counts(job: JobView, snapshot: ClusterSnapshot, max_options: int) -> list[int]:
    """The job's allowed GPU counts, thinned geometrically beyond ``max_options`` (its
    smallest, its largest and its current count always kept), each kept count's whole-node
    neighbours below and above with it.

    Whole nodes matter at GPU granularity: a packed job's goodput drops where it starts a new
    node (4 -> 5 GPUs puts 1 on a second node, behind the network), so the counts that fill
    their nodes are where its curve peaks, and thinning alone leaves most of them out
    (measured: docs/design-notes.md, "policies/jct.py")."""
    counts = gpu_counts(job, snapshot)
    if len(counts) <= max_options:
        return list(counts)
    keep = {counts[i] for i in _thinned(len(counts), max_options)}
    size = snapshot.node_size
    keep |= {c // size * size for c in keep} | {-(-c // size) * size for c in keep}
    if job.gpus in counts:
        keep.add(job.gpus)
    return sorted(keep.intersection(counts))


def _allowed_now(job: JobView, snapshot: ClusterSnapshot, counts: list[int]) -> list[int]:
    """``counts`` without those reconcile's no-thrash hold would not let ``job`` go to now
    (:func:`~hpcsched.model.snapshot.held_reversal`): a job just grown is planned at its
    size or more, one just shrunk at its size or less. Planned otherwise, the change is held
    back and the GPUs the plan gave elsewhere on its strength stay idle (measured:
    docs/design-notes.md, "policies/jct.py")."""
    held = held_reversal(job, snapshot.time, snapshot.hold) if job.state == SlurmState.RUNNING else None
    if held == "shrink":
        return [g for g in counts if g >= job.gpus] or counts
    if held == "grow":
        return [g for g in counts if g <= job.gpus] or counts
    return counts


@lru_cache(maxsize=1024)
def _thinned(n: int, most: int) -> tuple[int, ...]:
    """About ``most`` indices into ``n`` counts, spread geometrically, first and last kept."""
    idx = np.unique(np.round(np.geomspace(1, n, most)).astype(int) - 1)
    return tuple(sorted({0, n - 1, *map(int, idx)}))


def _job_options(job: JobView, snapshot: ClusterSnapshot, forced: set[str], p: _Params
                 ) -> tuple[list[Option], dict]:
    """The job's options for the DP: ``(GPUs, value, batch)`` per allowed count (value: its
    weighted speedup after the change's cost), and what its target needs to say."""
    running = job.state == SlurmState.RUNNING
    if job.busy:   # held exactly where it is
        return [Option(job.gpus if running else 0, 0.0, job.batch_size)], {}
    model, counts, rates = p.curves[job.job_id]
    wait = [] if running or job.job_id in forced else [Option(0, 0.0, job.batch_size)]
    if model is None:
        g = job.gpus if running else max(min_gpus(job, snapshot), min(job.gpus, max(
            gpu_counts(job, snapshot), default=job.gpus)))
        return wait + [Option(g, EPSILON * g, job.batch_size)], {"measured": False}
    remaining = _remaining(job, model, p)
    age = 1.0 + _waited(job, snapshot) / p.aging
    weight = age * p.rank.get(job.job_id, 1.0) * _tempered(counts, rates, remaining, p)
    x_now = _goodput_now(job, model, counts, rates, snapshot)
    allowed = set(_allowed_now(job, snapshot, counts))   # the weight is over every count
    now = job.gpus if running else None
    out = wait + [Option(g, weight / (remaining / x + _change_cost(now, g, p, x_now, x)),
                          cfg.global_batch_size)
                  for g, (x, cfg) in zip(counts, rates)
                  if cfg is not None and x > 0 and g in allowed]
    out = _floored(out, p.floors.get(job.job_id, 0))
    if not out:   # no size within its limits: held where it is
        out = [Option(job.gpus if running else 0, 0.0, job.batch_size)]
    return out, {"measured": True, "age": age, "weight": weight, "remaining": remaining,
                 "model": model, "goodput": {g: x for g, (x, _) in zip(counts, rates)}}


def _floored(options: list[Option], floor: int) -> list[Option]:
    """The options with at least ``floor`` GPUs (all of them when none has)."""
    return [o for o in options if o.gpus >= floor] or options if floor else options


def _tempered(counts: list[int], rates: list, remaining: float, p: _Params) -> float:
    """``T_ref^gamma``: the remaining time at the reference size, to ``gamma``: the smallest
    size that runs, or with ``p.share`` the largest that runs within the fair share."""
    if not p.tempering:
        return 1.0
    ok = [(g, x) for g, (x, cfg) in zip(counts, rates) if cfg is not None and x > 0]
    if not ok:
        return 1.0
    x_ref = ok[0][1]
    if p.share:
        x_ref = max((x for g, x in ok if g <= p.share), default=x_ref)
    return (remaining / x_ref) ** p.tempering


def _goodput_now(job: JobView, model, counts: list[int], rates: list, snapshot: ClusterSnapshot
                 ) -> float:
    """A running job's best predicted goodput at its current GPUs (samples/s; 0 pending)."""
    if job.state != SlurmState.RUNNING:
        return 0.0
    if job.gpus in counts:
        return rates[counts.index(job.gpus)][0]
    return best_at(job, model, job.gpus, nodes_spanned(job, job.gpus, snapshot))[0]


def _change_cost(now: int | None, gpus: int, p: _Params, x_now: float = 0.0, x_to: float = 0.0
                 ) -> float:
    """Seconds a change from ``now`` GPUs (``None``: the job is pending) to ``gpus`` costs the
    job: 0 to stay, a shrink in place, a grow (goodput ``x_now`` -> ``x_to``, samples/s) what
    ``p.grow_cost`` says, else a start."""
    if now is None:
        return p.restart_cost
    if gpus == now:
        return 0.0
    return p.shrink_cost if gpus < now else p.grow_cost(x_now, x_to)


def _target(job: JobView, pick: Option, meta: dict, snapshot: ClusterSnapshot) -> JobTarget:
    g = pick.gpus
    if not meta.get("measured"):
        reason = "jct: not measured yet: kept at its size" if g else "jct: waits: not measured yet"
        return target(job, g, pick.batch, reason, snapshot)
    age, w, r = meta["age"], meta["weight"], meta["remaining"]
    if g == 0:
        return replace(target(job, 0, pick.batch, "jct: waits: the GPUs finish shorter jobs "
                              f"sooner (age weight {age:.2f})", snapshot), weight=w / r)
    x = meta["goodput"].get(g)   # predicted with the options, not asked for again
    if x is None:                # held at a size outside its limits' candidates
        x, _ = best_at(job, meta["model"], g, nodes_spanned(job, g, snapshot))
    reason = (f"jct: {g} GPU(s), batch {pick.batch}: goodput {x:.0f} samples/s, "
              f"{r / x:.0f} s of work left" + (f", age weight {age:.2f}" if age > 1.005 else ""))
    return replace(target(job, g, pick.batch, reason, snapshot, predicted_goodput=x), weight=w / r)
