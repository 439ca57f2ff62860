"""The integer program of ``sia`` (:mod:`hpcsched.policies.sia`): Sia's configuration set, the
value of each (job, configuration) pair, and the program solved with
:func:`scipy.optimize.milp` (HiGHS).

Sia (Jayaram Subramanya et al., SOSP'23, §3.3-3.4; the artifact's ``sia-simulator/sia.py``,
``SiaPolicy.__solve_mip_rescaled``) chooses at most one configuration per job so that the GPUs
chosen fit in the cluster, and values a configuration ``c`` of job ``j`` by its speedup ``s_jc``
(goodput at ``c`` over goodput at the job's smallest configuration), scaled by the restart factor
``f_jc`` when it changes a running job's configuration, raised to the fairness power ``p``:

* ``p < 0`` (Sia's default, -0.5): minimise ``sum x_jc (f s)^p + lambda_n (J - sum x_jc)``, that
  is, maximise ``sum x_jc (lambda_n - (f s)^p)``: every job given a configuration earns
  ``lambda_n`` (1.1), so a waiting job is started (``(f s)^p <= 1`` at ``f = 1``), and among
  configurations the power ``p < 0`` favours raising the worst-off jobs;
* ``p > 0``: maximise ``sum x_jc ((f s)^p + lambda_n)`` (the artifact's ``lambda_n`` is then
  negative, a penalty per job left out; here ``lambda_n`` is its magnitude in both cases).

So the value of a pair is ``sign(p) (f s)^p + lambda_n`` (:func:`values`), and the program is a
multiple-choice knapsack: maximise the sum of the chosen pairs' values, at most one pair per
job, their GPUs at most the capacity (:func:`solve`). A pair of value <= 0 is never worth its
GPUs (choosing nothing is worth 0) and is left out of the program, as is a pair worth no more
than a smaller one of its job (:func:`_undominated`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the artifact's cap on a powered speedup (``sia_goodput_clip_val``): a restart factor near 0
#: makes ``(f s)^p`` huge for ``p < 0``
CLIP = 3000.0
#: the smallest ``f s`` powered (the artifact's ``ZERO_ALLOC_GAIN``)
TINY = 1e-4


def sia_sizes(node_size: int, most: int) -> list[int]:
    """Sia's GPU counts on nodes of ``node_size`` GPUs, up to ``most``: the powers of two below a
    node, then whole nodes (the artifact's ``CONFIGS_4GPU`` and ``CONFIGS_8GPU``: 1, 2, 4, 8, 12,
    ... on 4-GPU nodes; 1, 2, 4, 8, 16, 24, ... on 8-GPU nodes). Such counts pack onto free
    nodes without fragments, so the program needs only the GPU total."""
    node_size = max(1, node_size)
    out, k = [], 1
    while k < node_size and k <= most:
        out.append(k)
        k *= 2
    out.extend(range(node_size, most + 1, node_size))
    return out


def restart_factor(age: float, restarts: int, penalty: float) -> float:
    """The restart factor ``max(age - restarts x R, 0) / (age + R)`` (Pollux's, which Sia keeps:
    ``sia_use_pollux_realloc_factor``), 1 for a job younger than ``R`` (the artifact: "don't
    penalize jobs that have not scaled up even once"). ``age``, ``R = penalty``: seconds."""
    if age < penalty or age + penalty <= 0:
        return 1.0
    return max(age - restarts * penalty, 0.0) / (age + penalty)


def values(speedup: np.ndarray, factor: np.ndarray, p: float, lambda_n: float,
           decimals: int | None) -> np.ndarray:
    """The value of each pair: ``sign(p) (f s)^p + lambda_n`` (module docstring), the powered
    speedup rounded to ``decimals`` (the artifact: 2; ``None``: not rounded) and capped at
    :data:`CLIP`."""
    powered = np.power(np.maximum(speedup * factor, TINY), p)
    if decimals is not None:
        powered = np.round(powered, decimals)
    return np.sign(p) * np.minimum(powered, CLIP) + lambda_n


@dataclass(frozen=True)
class Solution:
    """The program's answer: ``chosen`` (K,) whether each pair is chosen (at most one per job),
    ``value`` the sum of the chosen pairs' values, ``status`` HiGHS's message."""

    chosen: np.ndarray
    value: float
    status: str


def _undominated(job_of: np.ndarray, gpus: np.ndarray, value: np.ndarray) -> np.ndarray:
    """(K,) whether each pair is worth more than every pair of its job with fewer GPUs (or as
    many, listed before it): a pair worth no more than a smaller one of its job is never needed
    (the smaller one is as good and leaves GPUs to others), and left to HiGHS it may be chosen
    in a tie, wasting GPUs (a job that does not scale is worth the same at every size)."""
    keep = np.zeros(len(value), dtype=bool)
    best: dict[int, float] = {}
    for k in np.lexsort((gpus, job_of)):
        j = int(job_of[k])
        if value[k] > best.get(j, -np.inf):
            keep[k] = True
            best[j] = float(value[k])
    return keep


def solve(job_of: np.ndarray, gpus: np.ndarray, value: np.ndarray, n_jobs: int, capacity: int,
          mip_rel_gap: float = 1e-4, time_limit: float | None = None) -> Solution:
    """Maximise the sum of ``value`` over the chosen pairs, at most one pair per job, their
    ``gpus`` at most ``capacity`` (module docstring).

    Args:
        job_of, gpus, value: (K,) each pair's job (``0..n_jobs-1``), GPUs and value.
        mip_rel_gap: HiGHS's relative optimality gap (the artifact's ``sia_solver_thresh``).
        time_limit: seconds HiGHS may take (``None``: no limit). With a limit the answer may
            depend on the machine's speed.

    Returns:
        The :class:`Solution`; nothing chosen when no pair is worth its GPUs, or when HiGHS
        found no feasible point within its limits (it always has one: nothing chosen).
    """
    chosen = np.zeros(len(value), dtype=bool)
    worth = np.flatnonzero((value > 0) & (gpus <= capacity) & _undominated(job_of, gpus, value))
    if len(worth) == 0:
        return Solution(chosen, 0.0, "no pair worth its GPUs")
    # here, not at the top: kept out of the CLI's start-up (hpcsched status needs no scipy)
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array
    k = len(worth)
    rows = np.concatenate([np.zeros(k, dtype=np.int64), 1 + job_of[worth]])
    cols = np.concatenate([np.arange(k), np.arange(k)])
    data = np.concatenate([gpus[worth], np.ones(k)]).astype(float)
    a = coo_array((data, (rows, cols)), shape=(1 + n_jobs, k)).tocsr()
    upper = np.concatenate([[float(capacity)], np.ones(n_jobs)])
    options: dict[str, float | bool] = {"mip_rel_gap": mip_rel_gap, "disp": False}
    if time_limit is not None:
        options["time_limit"] = time_limit
    res = milp(-value[worth], constraints=LinearConstraint(a, -np.inf, upper),
               integrality=np.ones(k), bounds=Bounds(0.0, 1.0), options=options)
    if res.x is None:
        return Solution(chosen, 0.0, str(res.message))
    chosen[worth] = res.x > 0.5
    return Solution(chosen, float(value[chosen].sum()), str(res.message))
