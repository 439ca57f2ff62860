"""A job's throughput at a configuration it may not have run yet, from what it has measured.

Pure, deterministic. Units: seconds, samples, samples/s, GPUs.

Model. One optimizer step at ``g`` GPUs, local batch ``b`` and ``s`` accumulation steps takes::

    t(g, b, s) = s * (alpha + beta * b) / eff(g)

* ``alpha + beta * b`` is the compute time of one micro-batch, linear in the local batch size as
  in Pollux (Qiao et al., OSDI'21, §3.2: "compute time ... linear in the local batch size").
  ``alpha, beta >= 0`` are fitted by non-negative least squares over the job's profile points
  (normalised to ``eff = 1``) once it has measured two local batch sizes; until then the single
  measured step time is split by a prior: ``alpha = ALPHA_PRIOR * t``.
* ``eff(g) <= 1`` is the measured scaling efficiency at ``g`` GPUs: the measured throughput over
  the model's communication-free prediction. Interpolated linearly between measured GPU
  counts and held flat outside them (a job that has never run at ``g`` is assumed to scale as at
  its nearest measured size).

Throughput = ``g * b * s / t``.

**Jobs of a known application** (an ``app_class`` with a shipped Pollux prior: cifar10, imagenet,
bert, ncf, deepspeech2, yolov3) get the full Pollux model instead (:class:`PolluxModel`, from
:mod:`hpcsched.perf.goodput`): compute linear in the local batch, synchronisation linear in
the replicas with separate intra- and inter-node terms, overlapped by ``gamma`` (Pollux,
OSDI'21 §3.2), fitted with scipy's L-BFGS-B to the job's own configurations, the application's
prior filling in what they cannot determine -- and the prior alone before the job has run. It
predicts any (GPUs, nodes, local batch) from first principles where the linear model above can
only hold the nearest measured efficiency flat. Fits are cached on the measured configurations
with step times rounded to 3 significant digits: a job is refitted when a measurement moves by
more than about 0.1 %, not every round.

:func:`model_for` picks the model for a job. The policies rank configurations by goodput = throughput x
statistical efficiency (Pollux §3.1), from the job's gradient-noise statistics when it reports
them; without them the efficiency is 1, larger batches only ever look better, and the job's
declared batch-size limits are what keeps them in check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import nnls

from hpcsched.protocol.batching import BatchConfig, BatchSizeError, fit_batch
from hpcsched.policies.snapshot import JobView, ProfilePoint
from hpcsched.perf.goodput import PerfParams, PerfSample, aggregate, predict_step_time, prior_for
from hpcsched.perf.goodput import _fit as _perf_fit

WEIGHT_CAP = 100    # steps: beyond this a profile point's weight in the fit stops growing
ALPHA_PRIOR = 0.2  # share of a step that does not grow with the batch, before a fit is possible


@dataclass(frozen=True)
class ThroughputModel:
    """Fitted model for one job (see module docstring)."""

    alpha: float                       # s per micro-batch, fixed part
    beta: float                        # s per sample per micro-batch
    efficiency: tuple[tuple[int, float], ...]   # (gpus, eff) measured, sorted by gpus
    fitted: bool                       # False: prior split, too few distinct batch sizes

    def eff(self, gpus: int) -> float:
        """Scaling efficiency at ``gpus``: linear between measured counts, flat outside."""
        pts = self.efficiency
        if not pts:
            return 1.0
        if gpus <= pts[0][0]:
            return pts[0][1]
        for (g0, e0), (g1, e1) in zip(pts, pts[1:]):
            if gpus <= g1:
                return e0 + (e1 - e0) * (gpus - g0) / (g1 - g0)
        return pts[-1][1]

    def step_time(self, cfg: BatchConfig) -> float:
        """Seconds per optimizer step."""
        return cfg.accumulation_steps * (self.alpha + self.beta * cfg.local_batch_size) / self.eff(
            cfg.world_size)

    def throughput(self, cfg: BatchConfig, nodes: int = 1) -> float:
        """Samples/s (``nodes`` is not used: the measured efficiency per GPU count already
        reflects how the job was laid out; the signature is :class:`PolluxModel`'s)."""
        t = self.step_time(cfg)
        return cfg.global_batch_size / t if t > 0 else 0.0


@lru_cache(maxsize=8192)
def fit(points: tuple[ProfilePoint, ...]) -> ThroughputModel | None:
    """Fit the model to a job's profile points; ``None`` without any usable point.

    Pure, so cached on the points: a policy, then reconcile, ask for the same job's model
    several times per round, and a job whose profile did not change is not refitted."""
    pts = [p for p in points if p.step_time > 0 and p.local_batch_size > 0]
    if not pts:
        return None
    micro = np.array([p.step_time / p.accumulation_steps for p in pts])
    local = np.array([p.local_batch_size for p in pts], dtype=float)
    # weight sqrt(steps), capped: a mean over WEIGHT_CAP steps is as good as it gets, and a
    # point measured longer should not drown the others (it also keeps the fit, and so the
    # cached decisions built on it, unchanged while a job keeps running as it was)
    weight = np.sqrt(np.array([min(WEIGHT_CAP, max(1, p.samples)) for p in pts], dtype=float))
    fitted = len(set(local.tolist())) >= 2
    if fitted:
        A = np.stack([np.ones_like(local), local], axis=1) * weight[:, None]
        (alpha, beta), _ = nnls(A, micro * weight)
    else:
        t = float(np.average(micro, weights=weight))
        alpha, beta = ALPHA_PRIOR * t, (1 - ALPHA_PRIOR) * t / local[0]
    if alpha + beta <= 0:
        return None
    by_g: dict[int, list[tuple[float, float]]] = {}
    for p, m in zip(pts, micro):
        pred = alpha + beta * p.local_batch_size
        by_g.setdefault(p.world_size, []).append((min(1.0, pred / m),
                                                  min(WEIGHT_CAP, max(1, p.samples))))
    eff = tuple(sorted((g, float(np.average([e for e, _ in v], weights=[w for _, w in v])))
                       for g, v in by_g.items()))
    # only relative efficiency matters; normalise so the best measured size is 1
    top = max(e for _, e in eff)
    eff = tuple((g, e / top) for g, e in eff)
    return ThroughputModel(float(alpha), float(beta), eff, fitted)


def _sig(x: float | None, digits: int = 3) -> float | None:
    if x is None or not math.isfinite(x) or x <= 0:
        return x
    return float(f"{x:.{digits - 1}e}")


@dataclass(frozen=True)
class PolluxModel:
    """Pollux's step-time model with fitted :class:`~hpcsched.perf.goodput.PerfParams`
    (module docstring). ``source`` says where the parameters came from."""

    params: PerfParams
    source: str

    def step_time_at(self, nodes: int, gpus: int, local: int, accum: int) -> float:
        """Seconds per optimizer step (plain floats: this is a policy's inner loop)."""
        p = self.params
        tg = p.alpha_c + p.beta_c * local
        if gpus <= 1:
            ts = 0.0
        elif nodes <= 1:
            ts = p.alpha_r + p.beta_r * max(gpus - 2, 0)
        else:
            ts = p.alpha_n + p.beta_n * max(gpus - 2, 0)
        g = p.gamma
        m = max(tg, ts)
        overlap = m * ((tg / m) ** g + (ts / m) ** g) ** (1.0 / g) if m > 0 else 0.0
        return (accum - 1) * tg + overlap

    def throughput(self, cfg: BatchConfig, nodes: int = 1) -> float:
        """Samples/s at ``cfg`` on ``nodes`` nodes."""
        t = self.step_time_at(nodes, cfg.world_size, cfg.local_batch_size,
                              cfg.accumulation_steps)
        return cfg.global_batch_size / t if t > 0 else 0.0


@lru_cache(maxsize=8192)
def _pollux_model(key: tuple[PerfSample, ...], app: str) -> PolluxModel | None:
    prior = prior_for(app)
    if len(key) >= 2:
        return PolluxModel(_perf_fit(key, prior), f"fitted to {len(key)} configurations "
                                                  f"({app} prior for the rest)")
    if len(key) == 1:
        s = key[0]
        ratio = s.step_time / predict_step_time(prior, s.nodes, s.replicas, s.local_bsz, s.accum)
        return PolluxModel(prior.scaled(ratio), f"{app} prior x {ratio:.3g} (1 configuration)")
    return PolluxModel(prior, f"{app} prior (not measured yet)")


def model_for(job: JobView) -> ThroughputModel | PolluxModel | None:
    """The throughput model a policy uses for ``job``: :class:`PolluxModel` when its
    ``app_class`` has a shipped prior, else the linear :class:`ThroughputModel` fitted to its
    profile (``None`` before it has one). Pure and cached."""
    if prior_for(job.app_class) is None:
        return fit(job.profile)
    return _model_for(job.profile, job.app_class.strip().lower())


@lru_cache(maxsize=8192)
def _model_for(profile: tuple[ProfilePoint, ...], app: str) -> PolluxModel | None:
    key = tuple(PerfSample(a.nodes, a.replicas, a.local_bsz, a.accum, _sig(a.step_time),
                           _sig(a.compute_time)) for a in aggregate(profile))
    return _pollux_model(key, app)


@lru_cache(maxsize=4096)
def _wanted(lo: int, hi: int, current: int, limit: int) -> tuple[int, ...]:
    wanted = {current, lo, hi}
    if hi > lo:
        wanted.update(int(round(x)) for x in np.geomspace(lo, hi, num=limit))
    return tuple(sorted(wanted))


@lru_cache(maxsize=65536)
def _fit(b: int, gpus: int, lo: int, hi: int, max_local: int | None) -> BatchConfig | None:
    try:
        return fit_batch(b, gpus, min_global=lo, max_global=hi, max_local_batch_size=max_local)
    except BatchSizeError:
        return None


def best_at(job: JobView, model: ThroughputModel | PolluxModel | None, gpus: int) -> tuple[float, BatchConfig | None]:
    """T_j(g): the best predicted goodput (= throughput when the job reports no gradient
    noise) over the job's allowed batch sizes at ``gpus``.

    Without a model (the job has not reported yet) the job's current batch size is kept and
    its throughput is taken as proportional to its GPUs (relative units), so the job is neither
    favoured nor starved. Pure; cached on everything it depends on (policies ask for the same
    job and size many times per round, and again next round).
    """
    nodes = max(1, -(-gpus // max(1, job.workers_per_node)))
    return _best_at(model, gpus, job.min_batch_size, job.max_batch_size, job.batch_size,
                    job.max_local_batch_size, job.base_batch_size, job.grad_noise, nodes)


@lru_cache(maxsize=65536)
def _candidates(gpus: int, lo: int, hi: int, batch_size: int, max_local: int | None
                ) -> tuple[BatchConfig, ...]:
    """Global batch sizes a policy may choose at ``gpus`` GPUs: the job's current batch size
    and up to 12 sizes spread geometrically over its allowed range, each cut to a
    configuration that fits, duplicates dropped."""
    seen: dict[int, BatchConfig] = {}
    for b in _wanted(lo, hi, batch_size, 12):
        cfg = _fit(b, gpus, lo, hi, max_local)
        if cfg is not None:
            seen.setdefault(cfg.global_batch_size, cfg)
    return tuple(seen.values())


@lru_cache(maxsize=65536)
def _best_at(model: ThroughputModel | PolluxModel | None, gpus: int, lo: int, hi: int,
             batch_size: int, max_local: int | None, base: int,
             grad_noise: tuple[float, float] | None, nodes: int = 1
             ) -> tuple[float, BatchConfig | None]:
    if gpus <= 0:
        return 0.0, None
    cfgs = _candidates(gpus, lo, hi, batch_size, max_local)
    if not cfgs:
        return 0.0, None
    if model is None:
        cfg = next((c for c in cfgs if c.global_batch_size == batch_size), cfgs[0])
        return float(gpus), cfg
    # plain Python: about a dozen candidates, where numpy's per-call overhead dominates
    pollux = isinstance(model, PolluxModel)
    if not pollux:
        alpha, beta, eff = model.alpha, model.beta, model.eff(gpus)
    noisy = grad_noise is not None and all(map(math.isfinite, grad_noise))
    if noisy:
        sqr, var = max(0.0, grad_noise[0]), max(0.0, grad_noise[1])
    best, best_key = None, None
    for c in cfgs:
        g = c.global_batch_size
        if pollux:
            t = model.step_time_at(nodes, gpus, c.local_batch_size, c.accumulation_steps)
        else:
            t = c.accumulation_steps * (alpha + beta * c.local_batch_size) / eff
        x = g / t if t > 0 else 0.0
        if noisy:
            # Pollux's efficiency (goodput.efficiency, inlined: this is the hot loop)
            scale = g / base
            denom = var / scale + sqr
            gain = (var + sqr) / denom if denom > 0 else 1.0
            x *= min(1.0, gain / scale)
        if not math.isfinite(x):
            x = 0.0
        key = (x, -abs(g - batch_size))   # best goodput; ties: nearest the current batch
        if best_key is None or key > best_key:
            best, best_key = c, key
    return best_key[0], best


def clear_caches() -> None:
    """Forget every cached fit and decision (benchmarks measure a cold start with it)."""
    from hpcsched.perf import goodput as _gp

    for f in (fit, _model_for, _pollux_model, _best_at, _candidates, _fit, _wanted, _gp._fit):
        f.cache_clear()
