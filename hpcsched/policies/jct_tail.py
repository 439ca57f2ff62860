"""``jct``'s makespan guard: once the queue drains, the jobs left get at least the GPUs that
let them all end together.

``jct`` ranks jobs by remaining time (heSRPT's weights), which finishes the jobs left at the end
one after another: optimal for their mean completion time, but each last job then runs alone at
a size where its speedup has flattened, and the makespan stretches (``jct`` +6-8% over
``pollux`` at loads 1.0-2.0 on Pollux's workloads: docs/evaluation.md). For a fixed set of
malleable jobs with concave speedups the makespan-optimal allocation ends them all at the same
time (Berg, Vesilo, Harchol-Balter, heSRPT, SIGMETRICS'20, §3, the makespan case). So in the
tail (:func:`in_tail`: nothing pending, unless ``tail_pending``, and nothing submitted for
``tail_after`` seconds) each
job's options are floored at the fewest GPUs that end it within ``guard x T*``, ``T*`` the
earliest common finish (:func:`critical_floors`); ``jct``'s search places the GPUs above the
floors as before, so the shorter jobs still go first where that costs the last job nothing.
Off unless ``makespan_guard`` is set: measured, it trades average JCT for makespan
(``docs/evaluation.md``, section 11). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hpcsched.model.snapshot import JobView
from hpcsched.protocol.kinds import SlurmState


def critical_floors(jobs: Sequence[JobView], curves: dict, remaining: Callable[[JobView, object], float],
                    k: int, guard: float) -> dict[str, int]:
    """GPUs each job is given at least so that every job can end by ``guard x T*``: ``job id
    -> GPUs`` (module docstring).

    ``T*`` is the earliest common finish: the smallest horizon ``T`` at which the fewest GPUs
    finishing each job within ``T`` (``R_j / X_j(g) <= T``) add up to at most ``k``.

    Args:
        jobs: the jobs the search plans (busy and unmeasured ones are skipped).
        curves: ``job id -> (model, counts, rates)`` as :func:`hpcsched.policies.jct._curves`
            fills them (``rates[i] = (goodput samples/s, config or None)`` at ``counts[i]``).
        remaining: the job's remaining work, samples, from ``(job, model)``.
        k: GPUs the plan may use.
        guard: ``>= 1``: the floors finish each job within ``guard x T*``.
    """
    times = _finish_times(jobs, curves, remaining)
    if not times or k <= 0:
        return {}
    # T* is one of the finish times; whether the floors fit only improves with the horizon
    # (each job's fewest GPUs can only fall), so the first that fits is found by bisection
    horizons = sorted({t for tg in times.values() for t, _ in tg})
    lo, hi = 0, len(horizons)
    while lo < hi:
        mid = (lo + hi) // 2
        if _floors_at(times, horizons[mid], k) is None:
            lo = mid + 1
        else:
            hi = mid
    if lo == len(horizons):
        return {}
    return _floors_at(times, guard * horizons[lo], k) or {}


def _finish_times(jobs: Sequence[JobView], curves: dict, remaining: Callable[[JobView, object], float]
                  ) -> dict[str, list[tuple[float, int]]]:
    """``job id -> [(remaining seconds at g GPUs, g), ...]`` ascending, for every measured job
    that is not busy."""
    times: dict[str, list[tuple[float, int]]] = {}
    for j in jobs:
        if j.busy or j.job_id not in curves:
            continue
        model, counts, rates = curves[j.job_id]
        ok = [(g, x) for g, (x, cfg) in zip(counts, rates) if cfg is not None and x > 0 and g > 0]
        if model is None or not ok:
            continue
        r = remaining(j, model)
        times[j.job_id] = sorted((r / x, g) for g, x in ok)
    return times


def _floors_at(times: dict[str, list[tuple[float, int]]], horizon: float, k: int
               ) -> dict[str, int] | None:
    """The fewest GPUs ending each job within ``horizon`` s; ``None`` if some job cannot or
    they add up to more than ``k``."""
    out = {}
    for job_id, tg in times.items():
        fit = [g for t, g in tg if t <= horizon]
        if not fit:
            return None
        out[job_id] = min(fit)
    return out if sum(out.values()) <= k else None


def in_tail(jobs: Sequence[JobView], now: float, tail_after: float, pending: bool = False) -> bool:
    """Whether the queue has drained: no job pending, and none of ``jobs`` submitted within the
    last ``tail_after`` seconds (``now``: the snapshot's time, Unix seconds). With ``pending``
    the jobs pending do not stop the tail: the set of jobs is taken as fixed once nothing was
    submitted for ``tail_after`` seconds, backlog and all (heSRPT's makespan case is a fixed
    set of jobs, not an empty queue); a pending job then has its floor like a running one, so
    the floors admit it when they fit."""
    if not pending and any(j.state == SlurmState.PENDING for j in jobs):
        return False
    return not jobs or now - max(j.submit_time for j in jobs) >= tail_after
