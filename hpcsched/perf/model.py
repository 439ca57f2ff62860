"""The one objective: a job's goodput at a configuration, and the best configuration at a size.

Pure, deterministic, cached. Units: seconds, samples, samples/s, GPUs.

* :func:`model_for` picks a job's throughput model: Pollux's step-time model
  (:class:`~hpcsched.perf.pollux.PolluxModel`) when the job's application has a shipped prior
  (:mod:`hpcsched.perf.priors`), else the linear model fitted to its profile
  (:class:`~hpcsched.perf.linear.ThroughputModel`), ``None`` before it has measured anything.
  Pollux's model: compute linear in the local batch, synchronisation linear in the replicas
  with separate intra- and inter-node terms, overlapped by ``gamma`` (Pollux, OSDI'21 §3.2).
  When the job's view carries its application's measured error
  (:attr:`~hpcsched.model.snapshot.JobView.step_corrections`: the daemon's and the
  simulator's default, ``throughput_model = "shared"``), the model is the application's prior
  times that error per configuration, scaled to the job's own measurements
  (:mod:`hpcsched.perf.shared`, which measures what it gains). Without it (``"fitted"``), the
  model is fitted with L-BFGS-B to the job's own configurations, the application's prior
  filling in what they cannot determine -- and the prior alone before the job has run. For a
  job's parameters:

  - >= 2 distinct configurations measured: fitted to its own points
    (:func:`~hpcsched.perf.pollux.fit_samples`, the prior for the rest);
  - 1 configuration: the prior, every time parameter scaled by ``measured / predicted`` step
    time so the model reproduces the measurement (the model is homogeneous of degree 1 in the
    time parameters);
  - none: the prior as is.

  Fits are cached on the measured configurations with step times rounded to 3 significant
  digits: a job is refitted when a measurement moves by more than about 0.1 %, not every round.
* :func:`goodput` = throughput x statistical efficiency (Pollux §3, eq. 1;
  :func:`~hpcsched.perf.pollux.efficiency`, from the job's gradient-noise statistics; 1 without
  them, so larger batches only ever look better and the job's declared batch-size limits keep
  them in check). The policies rank configurations by it (:func:`best_at`), and reconcile
  judges a plan by it.
* :func:`candidates`: the batch sizes a policy may choose at a size (the one search space).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import overload

import numpy as np

from hpcsched.model.snapshot import JobView, ProfilePoint
from hpcsched.perf import linear, pollux, priors
from hpcsched.perf.linear import ThroughputModel
from hpcsched.perf.pollux import PerfSample, PolluxModel
from hpcsched.perf.shared import StepCorrections
from hpcsched.protocol.batching import BatchConfig, BatchSizeError, fit_batch

JobModel = ThroughputModel | PolluxModel
CANDIDATES = 12     # global batch sizes tried per size, spread geometrically over the range


@overload
def _sig(x: float, digits: int = 3) -> float: ...


@overload
def _sig(x: None, digits: int = 3) -> None: ...


def _sig(x: float | None, digits: int = 3) -> float | None:
    if x is None or not math.isfinite(x) or x <= 0:
        return x
    return float(f"{x:.{digits - 1}e}")


def model_for(job: JobView) -> JobModel | None:
    """The throughput model for ``job`` (module docstring); ``None`` when its application has
    no prior and it has no usable profile point yet. Pure and cached."""
    if priors.prior_for(job.app_class) is None:
        return linear.fit(job.profile)
    return _model_for(job.profile, priors.application_key(job.app_class), job.step_corrections)


@lru_cache(maxsize=8192)
def _model_for(profile: tuple[ProfilePoint, ...], app: str,
               corrections: StepCorrections | None = None) -> PolluxModel:
    samples = [s for s in map(_rounded, profile) if s is not None]
    if len({s[:4] for s in samples}) == len(samples):   # one point per configuration
        key = tuple(sorted(samples))
    else:
        key = tuple(map(_rounded_sample, pollux.aggregate(profile)))
    return _pollux_model(key, app, corrections)


@lru_cache(maxsize=65536)
def _rounded(point: ProfilePoint) -> PerfSample | None:
    """The point alone, aggregated (:func:`~hpcsched.perf.pollux.aggregate`: ``None`` when
    unusable) with its times rounded (:func:`_rounded_sample`). Cached per point: a job's
    profile changes one point a round (the configuration it runs), and the fit's key is built
    from every point."""
    alone = pollux.aggregate((point,))
    return _rounded_sample(alone[0]) if alone else None


def _rounded_sample(s: PerfSample) -> PerfSample:
    """``s`` with its step and compute times to 3 significant digits (:func:`_sig`)."""
    return PerfSample(s.nodes, s.replicas, s.local_bsz, s.accum, _sig(s.step_time),
                      _sig(s.compute_time))


@lru_cache(maxsize=8192)
def _pollux_model(key: tuple[PerfSample, ...], app: str,
                  corrections: StepCorrections | None = None) -> PolluxModel:
    prior = priors.prior_for(app)
    assert prior is not None, f"no prior for {app!r}"   # model_for comes here only with one
    if corrections is not None:
        return _shared_model(key, app, prior, corrections)
    if len(key) >= 2:
        return PolluxModel(pollux.fit_samples(key, prior),
                           f"fitted to {len(key)} configurations ({app} prior for the rest)")
    if len(key) == 1:
        s = key[0]
        ratio = s.step_time / pollux.step_time(prior, s.nodes, s.replicas, s.local_bsz, s.accum)
        return PolluxModel(prior.scaled(ratio), f"{app} prior x {ratio:.3g} (1 configuration)")
    return PolluxModel(prior, f"{app} prior (not measured yet)")


def _shared_model(key: tuple[PerfSample, ...], app: str, prior: pollux.PerfParams,
                  corrections: StepCorrections) -> PolluxModel:
    """The prior, corrected by what the application's jobs measured, scaled to the job's own
    measurements (:mod:`hpcsched.perf.shared`): the scale is the geometric mean over the job's
    configurations of measured / corrected-prior step time (1 before it has measured)."""
    logs = [math.log(s.step_time / p) - corrections.log_factor(s.nodes, s.replicas, s.local_bsz)
            for s in key
            if (p := pollux.step_time(prior, s.nodes, s.replicas, s.local_bsz, s.accum)) > 0]
    scale = math.exp(sum(logs) / len(logs)) if logs else 1.0
    return PolluxModel(prior.scaled(scale), f"{app} prior x {scale:.3g}, corrected by what "
                       f"{app} jobs measured here ({len(corrections.fine)} configurations)",
                       corrections)


def goodput(model: JobModel, cfg: BatchConfig, nodes: int,
            grad_noise: tuple[float, float] | None, base_batch_size: int) -> float:
    """Goodput in samples/s: ``model``'s throughput at ``cfg`` on ``nodes`` nodes times the
    statistical efficiency of ``cfg.global_batch_size`` relative to ``base_batch_size``, given
    the job's ``(grad_sqr, grad_var)`` (``None``: efficiency 1). 0 when not finite.

    Raises:
        ValueError: ``grad_noise`` given and ``base_batch_size`` not positive.
    """
    x = model.throughput(cfg, nodes)
    if grad_noise is not None:
        x *= pollux.efficiency(grad_noise[0], grad_noise[1], base_batch_size,
                               cfg.global_batch_size)
    return x if math.isfinite(x) else 0.0


def nodes_for(job: JobView, gpus: int) -> int:
    """Nodes ``gpus`` GPUs take at the job's workers per node (at least 1)."""
    return max(1, -(-gpus // max(1, job.workers_per_node)))


def job_goodput(job: JobView, nodes: int, batch_size: int, gpus: int | None = None
                ) -> float | None:
    """Predicted goodput of ``job`` on ``gpus`` GPUs over ``nodes`` nodes (``gpus`` ``None``:
    ``nodes`` x its workers per node) at global ``batch_size`` (samples/s); ``None`` without a
    model, at 0 nodes, or when the batch size cannot be cut over the GPUs within the job's
    limits."""
    if gpus is None:
        gpus = nodes * job.workers_per_node
    cfg = _config(job, nodes, gpus, batch_size)
    if cfg is None:
        return None
    model = model_for(job)
    if model is None:
        return None
    return goodput(model, cfg, nodes, job.grad_noise, job.base_batch_size)


def _config(job: JobView, nodes: int, gpus: int, batch_size: int) -> BatchConfig | None:
    if nodes <= 0 or gpus <= 0:
        return None
    return _fit_batch(batch_size, gpus, job.min_batch_size, job.max_batch_size,
                      job.max_local_batch_size)


@lru_cache(maxsize=4096)
def _wanted(lo: int, hi: int, current: int, limit: int) -> tuple[int, ...]:
    wanted = {current, lo, hi}
    if hi > lo:
        wanted.update(int(round(x)) for x in np.geomspace(lo, hi, num=limit))
    return tuple(sorted(wanted))


@lru_cache(maxsize=65536)
def _fit_batch(b: int, gpus: int, lo: int, hi: int, max_local: int | None) -> BatchConfig | None:
    try:
        return fit_batch(b, gpus, min_global=lo, max_global=hi, max_local_batch_size=max_local)
    except BatchSizeError:
        return None


def candidates(job: JobView, gpus: int) -> tuple[BatchConfig, ...]:
    """Configurations a policy may choose at ``gpus`` GPUs: the job's current batch size, its
    limits and up to :data:`CANDIDATES` sizes spread geometrically over its allowed range, each
    cut to a configuration that fits (:func:`~hpcsched.protocol.batching.fit_batch`),
    duplicates dropped. Cached."""
    return _candidates(gpus, job.min_batch_size, job.max_batch_size, job.batch_size,
                       job.max_local_batch_size)


@lru_cache(maxsize=65536)
def _candidates(gpus: int, lo: int, hi: int, batch_size: int, max_local: int | None
                ) -> tuple[BatchConfig, ...]:
    seen: dict[int, BatchConfig] = {}
    for b in _wanted(lo, hi, batch_size, CANDIDATES):
        cfg = _fit_batch(b, gpus, lo, hi, max_local)
        if cfg is not None:
            seen.setdefault(cfg.global_batch_size, cfg)
    return tuple(seen.values())


def best_at(job: JobView, model: JobModel | None, gpus: int, nodes: int | None = None
            ) -> tuple[float, BatchConfig | None]:
    """T_j(g): the best :func:`goodput` over the job's :func:`candidates` at ``gpus`` GPUs on
    ``nodes`` nodes (``None``: :func:`nodes_for`, whole nodes at the job's workers per node), and
    the configuration that gives it (ties: the batch size nearest the current one); ``(0, None)``
    when none fits.

    Without a model (the job has not reported yet) the job's current batch size is kept and
    its goodput is taken as proportional to its GPUs (relative units), so the job is neither
    favoured nor starved. Pure; cached on everything it depends on (policies ask for the same
    job and size many times per round, and again next round).
    """
    return _best_at(model, gpus, job.min_batch_size, job.max_batch_size, job.batch_size,
                    job.max_local_batch_size, job.base_batch_size, job.grad_noise,
                    nodes_for(job, gpus) if nodes is None else nodes)


@lru_cache(maxsize=65536)
def _best_at(model: JobModel | None, gpus: int, lo: int, hi: int, batch_size: int,
             max_local: int | None, base: int, grad_noise: tuple[float, float] | None,
             nodes: int) -> tuple[float, BatchConfig | None]:
    if gpus <= 0:
        return 0.0, None
    cfgs = _candidates(gpus, lo, hi, batch_size, max_local)
    if not cfgs:
        return 0.0, None
    if model is None:
        cfg = next((c for c in cfgs if c.global_batch_size == batch_size), cfgs[0])
        return float(gpus), cfg
    if isinstance(model, PolluxModel):
        return _best_vectorised(model, cfgs, batch_size, base, grad_noise, nodes)
    best, best_key = None, None
    for c in cfgs:
        x = goodput(model, c, nodes, grad_noise, base)
        key = (x, -abs(c.global_batch_size - batch_size))   # ties: nearest the current batch
        if best_key is None or key > best_key:
            best, best_key = c, key
    assert best_key is not None   # cfgs is not empty
    return best_key[0], best


def best_at_each(job: JobView, model: JobModel | None, sizes: Sequence[tuple[int, int]]
                 ) -> list[tuple[float, BatchConfig | None]]:
    """:func:`best_at` at each ``(gpus, nodes)`` of ``sizes``, the same answers
    (:func:`best_at_each_of` for one job)."""
    return best_at_each_of([(job, model, sizes)])[0]


def best_at_each_of(requests: Sequence[tuple[JobView, JobModel | None,
                                             Sequence[tuple[int, int]]]]
                    ) -> list[list[tuple[float, BatchConfig | None]]]:
    """:func:`best_at` at each size of each ``(job, model, sizes)`` of ``requests``, the same
    answers. With Pollux's model, the candidates of every size of every such job are evaluated
    in one numpy pass: a policy asks for every size of every job each round, and per-job numpy
    calls were most of that cost."""
    out: list = [None] * len(requests)
    stacked, where = [], []     # (job, model, key, _stacked(*key)) for the one pass; indices
    for i, (job, model, sizes) in enumerate(requests):
        if not isinstance(model, PolluxModel) or len(sizes) < 2:
            out[i] = [best_at(job, model, g, n) for g, n in sizes]
            continue
        key = (tuple(sizes), job.min_batch_size, job.max_batch_size, job.batch_size,
               job.max_local_batch_size)
        part = _stacked(*key)
        if part[4].size:
            stacked.append((job, model, key, part))
            where.append(i)
        else:
            out[i] = [(0.0, None)] * len(sizes)
    if stacked:
        for i, rates in zip(where, _best_of_stacked(stacked)):
            out[i] = rates
    return out


def _best_of_stacked(stacked: list[tuple[JobView, PolluxModel, tuple, tuple]]
                     ) -> list[list[tuple[float, BatchConfig | None]]]:
    """:func:`best_at_each_of` for jobs with Pollux's model and candidates (each
    ``(job, model, key, _stacked(*key))``), in one pass: every job's goodputs
    (:func:`_goodputs_of`), then per size the best, ties to the batch nearest the job's current
    one, then the first."""
    parts = [part for *_, part in stacked]
    x = _goodputs_of(stacked)
    seg, starts, filled = _segments(tuple(len(c) for part in parts for c in part[0]))
    # reduceat: an empty segment's entry is junk no element reads (trailing ones dropped)
    top = np.flatnonzero(x == np.maximum.reduceat(x, starts[starts < x.size])[seg])
    pick = np.full(starts.size, -1)
    if top.size == filled:      # one best per size (the rule below picks it): the usual case
        pick[seg[top]] = top
    else:
        glob = np.concatenate([part[4] for part in parts])
        cur = np.repeat([float(job.batch_size) for job, *_ in stacked],
                        [part[4].size for part in parts])
        near = np.full(x.size, np.inf)
        near[top] = np.abs(glob[top] - cur[top])
        order = np.lexsort((np.arange(x.size), near, seg))
        first = order[np.r_[True, seg[order][1:] != seg[order][:-1]]]
        pick[seg[first]] = first
    best, picks, starts = x[np.maximum(pick, 0)].tolist(), pick.tolist(), starts.tolist()
    out, k = [], 0
    for part in parts:
        rates = []
        for cfgs in part[0]:
            i = picks[k]
            rates.append((0.0, None) if i < 0 else (best[k], cfgs[i - starts[k]]))
            k += 1
        out.append(rates)
    return out


def _goodputs_of(stacked: list[tuple[JobView, PolluxModel, tuple, tuple]]) -> np.ndarray:
    """:func:`_goodputs` at the candidates of each ``(job, model, key, _stacked(*key))``, laid
    end to end in one array: each job's throughputs (samples/s, cached per model,
    :func:`_stacked_throughputs`) times its statistical efficiency at each candidate's global
    batch (1 for a job without finite gradient noise); 0 where not finite."""
    jobs = [job for job, *_ in stacked]
    globs = [part[4] for *_, part in stacked]
    sizes, glob = [g.size for g in globs], np.concatenate(globs)
    x = np.concatenate([_stacked_throughputs(model, key) for _, model, key, _ in stacked])
    noises = [job.grad_noise if pollux.noise_known(job.grad_noise) else None for job in jobs]
    noisy = [n is not None for n in noises]
    if any(noisy):
        sqr, var = (np.repeat([n[f] if n is not None else 0.0 for n in noises], sizes)
                    for f in (0, 1))
        base = np.repeat([float(job.base_batch_size) for job in jobs], sizes)
        eff = pollux.efficiencies(sqr, var, base, glob)
        x = x * np.where(np.repeat(noisy, sizes), eff, 1.0)
    return np.where(np.isfinite(x), x, 0.0)


@lru_cache(maxsize=4096)
def _segments(lengths: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    """For segments of ``lengths`` laid end to end: each element's segment number, each
    segment's start (empty segments included), and how many segments are not empty."""
    lens = np.array(lengths, dtype=int)
    return (np.repeat(np.arange(len(lens)), lens), np.r_[0, np.cumsum(lens)[:-1]],
            int(np.count_nonzero(lens)))


@lru_cache(maxsize=16384)
def _stacked(sizes: tuple[tuple[int, int], ...], lo: int, hi: int, batch_size: int,
             max_local: int | None) -> tuple:
    """The candidates at each ``(gpus, nodes)`` and, stacked, their world sizes, local
    batches, accumulation steps, global batches and node counts (numpy arrays)."""
    per = [_candidates(g, lo, hi, batch_size, max_local) if g > 0 else () for g, _ in sizes]
    flat = tuple(c for cfgs in per for c in cfgs)
    if not flat:
        empty = np.zeros(0)
        return per, empty, empty, empty, empty, empty
    nodes = np.repeat(np.array([n for _, n in sizes], dtype=float), [len(c) for c in per])
    return (per, *_arrays(flat), nodes)


@lru_cache(maxsize=65536)
def _arrays(cfgs: tuple[BatchConfig, ...]) -> tuple[np.ndarray, ...]:
    """``(world sizes, local batches, accumulation steps, global batches)`` of ``cfgs``."""
    return tuple(np.array([getattr(c, f) for c in cfgs], dtype=float) for f in
                 ("world_size", "local_batch_size", "accumulation_steps", "global_batch_size"))


def _best_vectorised(model: PolluxModel, cfgs: tuple[BatchConfig, ...], batch_size: int,
                     base: int, grad_noise: tuple[float, float] | None, nodes: int
                     ) -> tuple[float, BatchConfig]:
    """:func:`goodput` of every configuration at once (Pollux's model and efficiency over numpy
    arrays), the best and ties as the loop above: nearest the current batch, then the first."""
    world, local, accum, glob = _arrays(cfgs)
    x = _goodputs(model, nodes, world, local, accum, glob, base, grad_noise)
    top = np.flatnonzero(x == x.max())
    i = int(top[np.argmin(np.abs(glob[top] - batch_size))])
    return float(x[i]), cfgs[i]


def _goodputs(model: PolluxModel, nodes, world: np.ndarray, local: np.ndarray,
              accum: np.ndarray, glob: np.ndarray, base: int,
              grad_noise: tuple[float, float] | None, throughputs: np.ndarray | None = None
              ) -> np.ndarray:
    """:func:`goodput` over arrays of configurations (Pollux's step time and statistical
    efficiency, numpy): samples/s, 0 where not finite or the step time is not positive.
    ``throughputs``: :func:`_throughputs` at these configurations when the caller has them
    (:func:`_stacked_throughputs`), else computed here."""
    x = _throughputs(model, nodes, world, local, accum, glob) if throughputs is None \
        else throughputs
    if pollux.noise_known(grad_noise):
        x = x * pollux.efficiencies(grad_noise[0], grad_noise[1], base, glob)
    return np.where(np.isfinite(x), x, 0.0)


def _throughputs(model: PolluxModel, nodes, world: np.ndarray, local: np.ndarray,
                 accum: np.ndarray, glob: np.ndarray, factors: np.ndarray | None = None
                 ) -> np.ndarray:
    """``model``'s throughput (samples/s) over arrays of configurations, 0 where the step time
    is not positive; ``factors``: its corrections at them, if the caller has them."""
    t = pollux._step_time(model.params, nodes, world, local, accum, np.maximum)
    if model.corrections is not None:
        t = t * (factors if factors is not None else model.corrections.factors(
            np.broadcast_to(nodes, np.shape(world)), world, local))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t > 0, glob / t, 0.0)


@lru_cache(maxsize=16384)
def _stacked_throughputs(model: PolluxModel, key: tuple) -> np.ndarray:
    """:func:`_throughputs` at the candidates of ``_stacked(*key)`` (read-only): a job's model
    often comes back the same from one round to the next (its fit is cached on its rounded
    measurements and its application's table), and only its gradient noise has moved."""
    _, world, local, accum, glob, nodes = _stacked(*key)
    x = _throughputs(model, nodes, world, local, accum, glob, None if model.corrections is None
                     else _stacked_factors(model.corrections, key))
    x.flags.writeable = False
    return x


@lru_cache(maxsize=16384)
def _stacked_factors(corrections: StepCorrections, key: tuple) -> np.ndarray:
    """The corrections' factors (:meth:`StepCorrections.factors`) at the candidates of
    ``_stacked(*key)``: a job's candidates and its application's table stay the same over many
    rounds (the ledger keeps a table while its rounded means hold,
    :class:`~hpcsched.perf.shared.StepLedger`)."""
    _, world, local, _, _, nodes = _stacked(*key)
    return corrections.factors(nodes, world, local)


def clear_caches() -> None:
    """Forget every cached fit and decision (benchmarks measure a cold start with it)."""
    for f in (linear.fit, _model_for, _rounded, _pollux_model, _best_at, _candidates, _fit_batch, _wanted,
              pollux.fit_samples, _arrays, _stacked, _segments, _stacked_factors,
              _stacked_throughputs):
        f.cache_clear()
