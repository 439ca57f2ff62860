"""Lower bounds on Pollux jobs' completion times in the simulator: a job alone at its best
(:func:`isolated_jct`), and a workload on the cluster's capacity (:func:`capacity_bound`).

:func:`isolated_jct` is the JCT of a job that has the whole cluster to itself from its
submission, starts at once (paying the start cost the simulator charges every start, the first
included: ``SimConfig.restart_cost``, 30 s) and then, at every point of its progress, trains at
the configuration with the highest *true* rate the simulator's physics gives there: progress per
second = ``Application.gain(B, epoch) / Application.step_time(layout, m, s)``, exactly
``SimJob.rate`` (with no GPU variability, ``slowdown = 1``). The maximum is taken over every
configuration the simulator can run: ``w`` GPUs up to ``min(cluster, max_nodes x workers per
node)`` (the policies' limit, ``policies.common.max_gpus``), every layout of ``w`` GPUs on the
cluster's nodes (not only packed ones: an extension may spread a job) and every global batch
``B = w k`` in the job's ``[min_batch_size, max_batch_size]`` that ``fit_batch`` gives for some
request (what ``SimJob.fit`` can set: ``k`` cut into the fewest equal micro-batches of at most
``max_local_batch_size``).

Why it is a bound: in any simulation the job starts no earlier than its submission, pays the
start cost before its first step, and in each epoch advances at a rate no higher than that
maximum (the rate depends on progress only through the epoch, ``Application.epoch_at``). So its
JCT is at least ``start cost + sum over epochs of epoch length / best rate``, whatever the
policy. It ignores queueing and contention (other jobs), restarts and resize costs after the
first start, extension start-up time, and the policy's knowledge (it knows the true gradient
statistics).

Units: seconds, Pollux progress units (steps at the base batch size), samples, GPUs.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from hpcsched.protocol.batching import fit_batch
from hpcsched.protocol.kinds import Granularity
from hpcsched.sim import WorkloadJob
from hpcsched.sim.physics import Application, canonical_placement
from hpcsched.sim.state import SimConfig, job_limits


def layouts(w: int, nodes: int, gpus_per_node: int, packed: bool = False) -> list[tuple[int, ...]]:
    """GPUs per node of every way the physics distinguishes to hold ``w`` GPUs on ``nodes`` nodes
    of ``gpus_per_node`` GPUs: every layout on up to 4 nodes (the measured ``placements.csv``
    keys, up to rotation) and one per node count above 4 (the physics interpolates those on
    ``(nodes, GPUs, local batch)`` only). ``packed``: only the fewest-nodes layout (4 + 2)."""
    full, rest = divmod(w, gpus_per_node)
    if packed:
        return [(gpus_per_node,) * full + ((rest,) if rest else ())]
    out: set[tuple[int, ...]] = set()

    def parts(left: int, n: int, prefix: tuple[int, ...]) -> None:
        if n == 0:
            if left == 0:
                out.add(canonical_placement(prefix))
            return
        for g in range(1, min(gpus_per_node, left - (n - 1)) + 1):
            parts(left - g, n - 1, prefix + (g,))

    for n in range(1, min(4, nodes, w) + 1):
        parts(w, n, ())
    for n in range(max(5, -(-w // gpus_per_node)), min(nodes, w) + 1):
        base, extra = divmod(w, n)          # any layout of n nodes; the physics sees (n, w, m)
        out.add((base + 1,) * extra + (base,) * (n - extra))
    return sorted(out)


def step_times(app: Application, layout: tuple[int, ...], local: np.ndarray,
               accum: np.ndarray) -> np.ndarray:
    """``Application.step_time(layout, local[i], accum[i])`` for every ``i`` at once: the same
    rule: the measured placement curve, extended along its end segments and floored at half its
    least time, on arrays; else ``Application.step_sync_time`` point by point.
    ``tests/test_sim_bound.py`` checks it point for point against ``Application.step_time``."""
    p = canonical_placement(layout)
    m = np.asarray(local, dtype=float)
    curve = app._curves.get(p)
    if curve is not None:
        x = curve.local
        if len(x) == 1:
            step, sync = np.full_like(m, curve.step[0]), np.full_like(m, curve.sync[0])
        else:
            ext = []
            for y in (curve.step, curve.sync):
                v = np.interp(m, x, y)
                v = np.where(m < x[0], y[0] + (y[1] - y[0]) * (m - x[0]) / (x[1] - x[0]), v)
                v = np.where(m > x[-1], y[-1] + (y[-1] - y[-2]) * (m - x[-1]) / (x[-1] - x[-2]), v)
                ext.append(v)
            step = np.maximum(ext[0], float(curve.step.min()) * 0.5)
            sync = np.minimum(np.maximum(ext[1], 0.0), step)
    else:
        # the interpolation over (nodes, GPUs, local), one point per call as the physics calls
        # it (a batched call may walk the triangulation to another simplex where it is flat)
        v = np.array([app.step_sync_time(p, float(x)) for x in m]).reshape(-1, 2)
        step, sync = v[:, 0], v[:, 1]
    return step + (np.maximum(1, accum) - 1) * (step - sync)


@cache
def min_step_time(app: Application, max_gpus: int, lo: int, hi: int, max_local: int | None,
                  nodes: int = 16, gpus_per_node: int = 4, packed: bool = False) -> np.ndarray:
    """``T[B]``: the least seconds per optimizer step at global batch ``B`` (0..hi) over every
    configuration with ``B`` in ``[lo, hi]`` (module docstring); ``inf`` where none exists.
    The batch cut is ``fit_batch``'s with the job's limits (the configurations ``SimJob.fit``
    can reach), the step time :func:`step_times`."""
    return _least_per_batch(app, max_gpus, lo, hi, max_local, nodes, gpus_per_node, packed, False)


@cache
def min_step_gpu_seconds(app: Application, max_gpus: int, lo: int, hi: int,
                         max_local: int | None, nodes: int = 16, gpus_per_node: int = 4,
                         packed: bool = False) -> np.ndarray:
    """``C[B]``: the least GPU-seconds per optimizer step at global batch ``B`` (GPUs x seconds
    per step) over the configurations of :func:`min_step_time`; ``inf`` where none exists."""
    return _least_per_batch(app, max_gpus, lo, hi, max_local, nodes, gpus_per_node, packed, True)


def _least_per_batch(app: Application, max_gpus: int, lo: int, hi: int, max_local: int | None,
                     nodes: int, gpus_per_node: int, packed: bool, per_gpu: bool) -> np.ndarray:
    """:func:`min_step_time` (``per_gpu`` False) or :func:`min_step_gpu_seconds` (True)."""
    T = np.full(hi + 1, np.inf)
    for w in range(1, max_gpus + 1):
        ks = range(max(1, -(-lo // w)), hi // w + 1)
        if not ks:
            continue
        # every configuration SimJob.fit can give at w GPUs: fit_batch of any request, which
        # depends on the request only through k0 = round(request / w) clamped to [kmin, kmax]
        cfgs = sorted({fit_batch(w * k, w, min_global=lo, max_global=hi,
                                 max_local_batch_size=max_local) for k in ks},
                      key=lambda c: (c.local_batch_size, c.accumulation_steps))
        local = np.array([c.local_batch_size for c in cfgs])
        accum = np.array([c.accumulation_steps for c in cfgs])
        b = np.array([c.global_batch_size for c in cfgs])
        for lay in layouts(w, nodes, gpus_per_node, packed):
            np.minimum.at(T, b, step_times(app, lay, local, accum) * (w if per_gpu else 1))
    return T


def gains(app: Application, batch: np.ndarray, epoch: int) -> np.ndarray:
    """``Application.gain(batch[i], epoch)`` for every ``i`` at once: the gradient statistics
    interpolated linearly between the measured batch sizes (clamped to their range), then
    :func:`hpcsched.perf.pollux.gain`'s formula. Checked against ``Application.gain`` in
    ``tests/test_sim_bound.py``."""
    bszs = app._bszs
    stats = np.array([app.grad_stats(float(b), epoch) for b in bszs])
    bc = np.clip(batch, bszs[0], bszs[-1])
    sqr = np.maximum(0.0, np.interp(bc, bszs, stats[:, 0]))
    var = np.maximum(0.0, np.interp(bc, bszs, stats[:, 1]))
    denom = var / (np.asarray(batch, dtype=float) / app.init_batch_size) + sqr
    return np.where(denom > 0, (var + sqr) / np.where(denom > 0, denom, 1.0), 1.0)


@cache
def epoch_rates(app: Application, max_gpus: int, lo: int, hi: int, max_local: int | None,
                nodes: int = 16, gpus_per_node: int = 4, packed: bool = False) -> np.ndarray:
    """Best progress per second in each epoch ``e``: ``max_B Application.gain(B, e) / T[B]``
    with ``T`` = :func:`min_step_time` of the same arguments."""
    T = min_step_time(app, max_gpus, lo, hi, max_local, nodes, gpus_per_node, packed)
    bs = np.flatnonzero(np.isfinite(T))
    return np.array([float(np.max(gains(app, bs.astype(float), e) / T[bs]))
                     for e in range(app.max_epochs)])


def _bounded(wj: WorkloadJob, cfg: SimConfig):
    """``(application, limits, most GPUs)`` of a job the bounds apply to.

    Raises:
        ValueError: a fixed-work (PAL/Blox) job, or GPU variability on.
    """
    if wj.iterations is not None:
        raise ValueError(f"job {wj.name}: the bound is for Pollux applications only")
    if cfg.variability:
        raise ValueError("the bound assumes no GPU variability (SimConfig.variability off)")
    app, _, _, lim, _ = job_limits(wj, cfg)
    return app, lim, min(cfg.nodes * cfg.gpus_per_node, lim.max_nodes * lim.workers_per_node)


def isolated_jct(wj: WorkloadJob, cfg: SimConfig = SimConfig(granularity=Granularity.GPU), *,
                 substeps: int = 1, packed: bool = False) -> float:
    """Lower bound on ``wj``'s JCT in seconds (module docstring), under ``cfg``'s cluster, costs,
    granularity and ``work_scale``. ``substeps``: sub-intervals per epoch of the progress
    integral (the rate is evaluated at each one's midpoint through ``epoch_at``; the result does
    not depend on it because the rate is constant within an epoch).

    Raises:
        ValueError: a fixed-work (PAL/Blox) job, or GPU variability on (a GPU faster than the
            median would make ``slowdown = 1`` no bound).
    """
    app, lim, max_gpus = _bounded(wj, cfg)
    rates = epoch_rates(app, max_gpus, lim.min_batch_size, lim.max_batch_size,
                        lim.max_local_batch_size, cfg.nodes, cfg.gpus_per_node, packed)
    scale = cfg.work_scale
    t, start = cfg.restart_cost_for(wj.application), 0.0
    for e in range(app.max_epochs):
        end = app.epoch_end(e, scale)
        edges = np.linspace(start, end, substeps + 1)
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            t += (b - a) / rates[app.epoch_at(0.5 * (a + b), scale)]
        start = end
    return float(t)


def mean_isolated_jct(jobs: list[WorkloadJob], cfg: SimConfig = SimConfig(granularity=Granularity.GPU),
                      **kw) -> float:
    """Mean of :func:`isolated_jct` over ``jobs`` (a lower bound on any policy's average JCT)."""
    return float(np.mean([isolated_jct(j, cfg, **kw) for j in jobs])) if jobs else math.nan


# --------------------------------------------------------------------------------------------
# the capacity bound

def least_gpu_seconds(wj: WorkloadJob, cfg: SimConfig = SimConfig(granularity=Granularity.GPU), *,
                      packed: bool = False) -> float:
    """The fewest GPU-seconds job ``wj`` can be trained in on ``cfg``'s cluster: its start (the
    start cost on at least one GPU) plus, epoch by epoch, the epoch's work over the most progress
    per GPU-second any configuration gives there, ``max_B gain(B, e) / C[B]`` with ``C`` =
    :func:`min_step_gpu_seconds` (the configurations of :func:`isolated_jct`). Whatever a policy
    does, the job holds GPUs at least that long, counted in GPU-seconds.

    Raises:
        ValueError: as :func:`isolated_jct`.
    """
    app, lim, max_gpus = _bounded(wj, cfg)
    C = min_step_gpu_seconds(app, max_gpus, lim.min_batch_size, lim.max_batch_size,
                             lim.max_local_batch_size, cfg.nodes, cfg.gpus_per_node, packed)
    bs = np.flatnonzero(np.isfinite(C))
    total, start = cfg.restart_cost_for(wj.application) * 1.0, 0.0
    for e in range(app.max_epochs):
        end = app.epoch_end(e, cfg.work_scale)
        best = float(np.max(gains(app, bs.astype(float), e) / C[bs]))   # progress / GPU-s
        total += (end - start) / best
        start = end
    return float(total)


def srpt_mean_flow_time(releases: list[float], sizes: list[float]) -> float:
    """Mean flow time (completion - release, s) of preemptive shortest-remaining-processing-time
    on one machine: jobs released at ``releases`` (s) needing ``sizes`` (s) of it. SRPT is
    optimal for the sum of completion times on one machine with release dates and preemption
    (``1|r_j, pmtn|sum C_j``; Schrage, "A proof of the optimality of the shortest remaining
    processing time discipline", Operations Research 16(3), 1968), also against any sharing of
    the machine among jobs (sharing is a limit of preemption). Pure; ``nan`` for no jobs.

    Raises:
        ValueError: the two lists differ in length, or a size is negative.
    """
    import heapq

    if len(releases) != len(sizes):
        raise ValueError("releases and sizes differ in length")
    if any(p < 0 for p in sizes):
        raise ValueError("a size is negative")
    if not sizes:
        return math.nan
    order = sorted(range(len(sizes)), key=lambda i: releases[i])
    ready: list[tuple[float, int]] = []
    t, k, flow = 0.0, 0, 0.0
    while k < len(order) or ready:
        if not ready:
            t = max(t, releases[order[k]])
        while k < len(order) and releases[order[k]] <= t:
            heapq.heappush(ready, (sizes[order[k]], order[k]))
            k += 1
        left, i = heapq.heappop(ready)
        nxt = releases[order[k]] if k < len(order) else math.inf
        if t + left <= nxt:
            t += left
            flow += t - releases[i]
        else:
            heapq.heappush(ready, (left - (nxt - t), i))
            t = nxt
    return flow / len(sizes)


def capacity_bound(jobs: list[WorkloadJob], cfg: SimConfig = SimConfig(granularity=Granularity.GPU), *,
                   packed: bool = False) -> float:
    """A lower bound on any policy's average JCT over ``jobs`` (s) from the cluster's capacity:
    job ``j`` needs at least ``W_j`` GPU-seconds (:func:`least_gpu_seconds`) and the cluster
    supplies ``nodes x gpus_per_node`` GPU-seconds per second, so any schedule is a preemptive
    schedule of one machine of that speed, on which SRPT with sizes ``W_j / GPUs`` and the
    jobs' submit times is optimal (:func:`srpt_mean_flow_time`). It counts queueing the
    isolated bound cannot; it ignores each job's own speed limit (the isolated bound's),
    so :func:`lower_bound` takes the larger of the two.

    Raises:
        ValueError: as :func:`isolated_jct`.
    """
    gpus = cfg.nodes * cfg.gpus_per_node
    return srpt_mean_flow_time([j.submit_time for j in jobs],
                               [least_gpu_seconds(j, cfg, packed=packed) / gpus for j in jobs])


def lower_bound(jobs: list[WorkloadJob], cfg: SimConfig = SimConfig(granularity=Granularity.GPU),
                **kw) -> float:
    """The larger of :func:`mean_isolated_jct` and :func:`capacity_bound` (s): both bound any
    policy's average JCT over ``jobs`` from below."""
    return max(mean_isolated_jct(jobs, cfg, **kw), capacity_bound(jobs, cfg, **kw))
