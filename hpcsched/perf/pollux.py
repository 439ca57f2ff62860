"""Pollux's job-performance model: step time (hence throughput) at any placement and batch size,
its fit to measured configurations, and statistical efficiency.

Pure and deterministic (fits are L-BFGS-B from fixed starting points, no randomness). Units:
seconds, samples, samples/s. The one objective built on it, goodput = throughput x efficiency,
is :func:`hpcsched.perf.model.goodput`.

Sources: Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep
Learning", OSDI'21, §3 (goodput = throughput x statistical efficiency; §3.1 efficiency, §3.2
throughput model), and AdaptDL's ``adaptdl/goodput.py`` (github.com/petuum/adaptdl), which this
module follows formula for formula; where it departs, the text says so.

Step-time model (Pollux §3.2; AdaptDL ``PerfParams``, ``_predict_accum_time``,
``_predict_network_time``, ``_predict_log_optim_time``). One optimizer step of a job on ``N``
nodes with ``K`` replicas (GPUs), local batch ``m`` and ``s >= 1`` micro-batches per step::

    T_grad(m)    = alpha_c + beta_c * m                        compute of one micro-batch
    T_sync(N, K) = 0                                           K = 1
                 = alpha_r + beta_r * max(K - 2, 0)            K > 1, all on one node (intra-node)
                 = alpha_n + beta_n * max(K - 2, 0)            N > 1 (inter-node)
    T_step       = (s - 1) * T_grad + (T_grad^gamma + T_sync^gamma)^(1 / gamma)
    throughput   = K * m * s / T_step

``gamma`` in [1, 10] is the overlap of compute and communication (1: none, 10 ~ max()). Note on
counting: here ``s`` (``accum``) is the number of micro-batches per optimizer step, as in
:class:`hpcsched.protocol.batching.BatchConfig`; AdaptDL's ``accum_steps`` counts the *extra* ones
(``s - 1``). :func:`step_time` is the one implementation: the policies' inner loop
(:meth:`PolluxModel.throughput`), the fit's objective and the tooling all evaluate it.

Fit (AdaptDL ``fit_perf_params``/``_obj_fn``): minimise over the seven parameters, with L-BFGS-B
within bounds ``[1e-8, 1e4]`` for the times and ``[1, 10]`` for ``gamma``::

    RMSE(log T_grad_pred - log T_grad_meas)        over points whose compute time is known
  + RMSE(log T_step_pred - log T_step_meas)        over all points
  + 1e-3 * (gamma - 1)^2                           (prefer little overlap: easier to fit)
  + 1e-2 * ((beta_n / alpha_n)^2 + (beta_r / alpha_r)^2)   (prefer optimistic scaling)

Parameters the points cannot determine are fixed, as AdaptDL does: ``alpha_c`` when only one local
batch size was seen (at half the mean compute time), ``alpha_n, beta_n`` without a multi-node
point, ``alpha_r, beta_r`` without a single-node multi-GPU point, ``beta_n, beta_r`` without a point
above 2 GPUs -- at 1e-8 (AdaptDL: optimistic, so the scheduler tries larger sizes), and afterwards
``alpha_n, beta_n >= 1.1 x alpha_r, beta_r`` when nothing multi-node was seen.

*Departures* (hpcsched), all only when a prior for the job's application is known
(:mod:`hpcsched.perf.priors`): the fixed parameters take the prior's values scaled to the job's
own measurements (scale = geometric mean of measured / prior-predicted step time) instead of 1e-8,
and ``gamma`` is the prior's when the job has never synchronised; the objective gains a weak pull
towards that scaled prior, ``PRIOR_PULL x mean((log p - log p_prior)^2)`` over the free parameters
(``gamma`` unlogged), so a job with fewer configurations than free parameters gets a well-posed
fit rather than an arbitrary point of a flat valley; and the scaled prior is the one starting
point. Without a prior the fit is AdaptDL's. Numerics: optimisation over ``log`` of the time
parameters with an analytic gradient (AdaptDL: the parameters themselves, autograd gradient), from
AdaptDL's starting point and one scaled to the data, keeping the better; each RMSE has ``SMOOTH`` =
1e-8 under its root so the minimiser does not stall on the kink of an exact fit.

Compute time of a point: the traces give it (``step_time - sync_time``); a job's own
:class:`~hpcsched.model.snapshot.ProfilePoint` gives it exactly when it ran on one GPU
(``step_time / accum``, no synchronisation); otherwise only the step time is fitted.

Statistical efficiency (Pollux §3.1, the gradient-noise-scale form of E(M); AdaptDL
``GoodputFunction.efficiency``), with ``M0`` the initial (base) batch size, ``M`` the batch size,
``|g|^2`` and ``sigma^2`` the gradient's squared norm and variance estimated at ``M0``::

    r       = M / M0
    gain(r) = (sigma^2 + |g|^2) / (sigma^2 / r + |g|^2)     progress per step, relative to M0
    E(M)    = gain(r) / r
            = (phi + M0) / (phi + M),   phi = M0 * sigma^2 / |g|^2   (the gradient noise scale)

``E(M0) = 1``; ``E`` falls as ``M`` grows, slowly while ``M << phi`` (noisy gradients: larger
batches are almost free) and as ``M0 / M`` once ``M >> phi``. Limits, following the formula:
no noise (``sigma^2 = 0``) gives ``E = M0 / M`` (a larger batch buys no progress per step);
pure noise (``|g|^2 = 0``) gives ``E = 1``; both 0 gives ``M0 / M`` (AdaptDL: gain 1, divided by
``r``). Negative estimates (they happen with few samples) are clipped to 0. *Departures*: no
statistics (``None``) gives ``E = 1``; below ``M0`` the formula exceeds 1 and AdaptDL never
evaluates there (it asserts ``M >= M0``); here ``E`` is capped at 1 so it stays in (0, 1].
:func:`gain` is also what the simulator's physics advances a job's progress by
(:meth:`hpcsched.sim.physics.Application.gain`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard

import numpy as np

from hpcsched.model.snapshot import ProfilePoint
from hpcsched.protocol.batching import BatchConfig

if TYPE_CHECKING:
    from hpcsched.perf.shared import StepCorrections

LOWER = 1e-8          # AdaptDL's lower bound for every time parameter
UPPER = 1e4           # s; a step time no job has
GAMMA_RANGE = (1.0, 10.0)
TIME_NAMES = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r")
PRIOR_PULL = 1e-2      # weight of the pull towards the prior (hpcsched; module docstring)
MAX_ITER = 500         # L-BFGS-B iterations per start
FTOL = 1e-8            # L-BFGS-B: stop when the objective (log-RMSE) improves by less
FTOL_PRIOR = 1e-6      # ... when a prior anchors the fit (a policy refits jobs every round)
SMOOTH = 1e-8          # under each RMSE's root: no kink at an exact fit (module docstring)
_TINY = 1e-300         # floor of the p-norm's scale: no 0/0 when compute and sync are both 0


@dataclass(frozen=True)
class PerfParams:
    """The seven parameters of the step-time model (module docstring). Times in seconds."""

    alpha_c: float   # compute per micro-batch, fixed part
    beta_c: float    # compute per sample of the local batch
    alpha_n: float   # inter-node synchronisation, fixed part
    beta_n: float    # inter-node, growth per replica beyond 2
    alpha_r: float   # intra-node synchronisation, fixed part
    beta_r: float    # intra-node, growth per replica beyond 2
    gamma: float     # compute/communication overlap, 1..10

    def scaled(self, factor: float) -> PerfParams:
        """Every time parameter times ``factor`` (``gamma`` kept): all predicted step times scale
        by exactly ``factor``."""
        return replace(self, **{n: getattr(self, n) * factor for n in TIME_NAMES})

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> PerfParams:
        return cls(**{f.name: float(d[f.name]) for f in fields(cls)})


class PerfSample(NamedTuple):
    """One measured configuration (the fit's input; Pollux's names): mean seconds per optimizer
    step, and, where known, the compute time of one micro-batch (no synchronisation). A named
    tuple: the models are cached on tuples of them."""

    nodes: int
    replicas: int
    local_bsz: int
    accum: int
    step_time: float
    compute_time: float | None = None


# ---------------------------------------------------------------------------------- the model

def compute_time(params: PerfParams, local_bsz):
    """T_grad: seconds for one micro-batch of ``local_bsz`` samples per replica (number or
    numpy array)."""
    return params.alpha_c + params.beta_c * local_bsz


def sync_time(params: PerfParams, nodes, replicas, maximum=np.maximum):
    """T_sync in seconds: 0 on one replica; intra-node parameters when every replica is on one
    node; inter-node parameters when the job spans nodes. Retrogression grows with
    ``replicas - 2``. Numbers or numpy arrays (``maximum``: :func:`max` for plain numbers, the
    policies' inner loop)."""
    retro = maximum(replicas - 2, 0)
    inter = (nodes > 1) * (params.alpha_n + params.beta_n * retro)
    intra = ((nodes <= 1) & (replicas > 1)) * (params.alpha_r + params.beta_r * retro)
    return inter + intra


def _step_time(params: PerfParams, nodes, replicas, local_bsz, accum, maximum):
    tg = compute_time(params, local_bsz)
    ts = sync_time(params, nodes, replicas, maximum)
    g = params.gamma
    m = maximum(maximum(tg, ts), _TINY)     # (tg^g + ts^g)^(1/g), scaled: no under/overflow
    return (accum - 1) * tg + m * ((tg / m) ** g + (ts / m) ** g) ** (1.0 / g)


def _is_array(*xs) -> bool:
    return any(isinstance(x, (np.ndarray, list, tuple)) for x in xs)


def step_time(params: PerfParams, nodes, replicas, local_bsz, accum=1):
    """Seconds per optimizer step (module docstring) on ``nodes`` nodes with ``replicas`` GPUs,
    local batch ``local_bsz`` and ``accum`` micro-batches per step. Numbers give a float; numpy
    arrays (or lists) broadcast and give an array.

    Raises:
        ValueError: not ``1 <= nodes <= replicas``, ``local_bsz >= 1``, ``accum >= 1``.
    """
    # (nodes, replicas, local_bsz, accum, maximum) for _step_time: arrays and np.maximum, or
    # numbers and max
    args: tuple[Any, Any, Any, Any, Callable[[Any, Any], Any]]
    if _is_array(nodes, replicas, local_bsz, accum):
        n, k, b, s = (np.asarray(v) for v in (nodes, replicas, local_bsz, accum))
        ok = not (np.any(n < 1) or np.any(k < n) or np.any(b < 1) or np.any(s < 1))
        args = (n, k, np.asarray(b, dtype=float), s, np.maximum)
    else:
        ok = 1 <= nodes <= replicas and local_bsz >= 1 and accum >= 1
        args = (nodes, replicas, local_bsz, accum, max)
    if not ok:
        raise ValueError(f"need 1 <= nodes <= replicas, local_bsz >= 1, accum >= 1; got "
                         f"nodes={nodes}, replicas={replicas}, local_bsz={local_bsz}, "
                         f"accum={accum}")
    t = _step_time(params, *args)
    return t if isinstance(t, np.ndarray) else float(t)


def throughput(params: PerfParams, nodes, replicas, local_bsz, accum=1):
    """Samples/s: ``replicas * local_bsz * accum / T_step`` (numbers or arrays, as
    :func:`step_time`, whose errors it raises)."""
    t = step_time(params, nodes, replicas, local_bsz, accum)
    if isinstance(t, np.ndarray):
        return np.asarray(replicas) * np.asarray(local_bsz) * np.asarray(accum) / t
    return replicas * local_bsz * accum / t


@dataclass(frozen=True)
class PolluxModel:
    """A job's throughput from :class:`PerfParams` (:func:`hpcsched.perf.model.model_for`
    builds it); ``source`` says where the parameters came from. With ``corrections`` (the
    application's measured error of its prior, :mod:`hpcsched.perf.shared`) each step time is
    the parameters' times the error's factor at that configuration."""

    params: PerfParams
    source: str
    corrections: StepCorrections | None = None

    def step_time(self, cfg: BatchConfig, nodes: int = 1) -> float:
        """Seconds per optimizer step at ``cfg`` on ``nodes`` nodes (:func:`step_time`, plain
        floats: this is a policy's inner loop, and a :class:`BatchConfig` is valid already)."""
        t = _step_time(self.params, nodes, cfg.world_size, cfg.local_batch_size,
                       cfg.accumulation_steps, max)
        if self.corrections is not None:
            t *= self.corrections.factor(nodes, cfg.world_size, cfg.local_batch_size)
        return t

    def throughput(self, cfg: BatchConfig, nodes: int = 1) -> float:
        """Samples/s at ``cfg`` on ``nodes`` nodes (0 if the step time is not positive)."""
        t = self.step_time(cfg, nodes)
        return cfg.global_batch_size / t if t > 0 else 0.0


# ---------------------------------------------------------------------------------- efficiency

def gain(grad_sqr: float, grad_var: float, scale: float) -> float:
    """Progress per optimizer step at ``scale = M / M0`` times the base batch size, relative to
    a step at ``M0`` (AdaptDL's gain; module docstring). Negative statistics count as 0; 1 when
    both are 0."""
    sqr, var = max(0.0, grad_sqr), max(0.0, grad_var)
    top = max(sqr, var)
    if not top > 0:
        return 1.0
    # over the larger statistic: the same ratio, without subnormal quotients (var / scale of
    # 5e-324 rounds, and the gain then rose with the batch size: found by hypothesis)
    sqr, var = sqr / top, var / top
    return (var + sqr) / (var / scale + sqr)


def noise_known(grad_noise: tuple[float | None, float | None] | None
                ) -> TypeGuard[tuple[float, float]]:
    """Whether ``grad_noise`` = ``(grad_sqr, grad_var)`` gives an efficiency: both statistics
    known and finite (else the efficiency is taken as 1)."""
    return grad_noise is not None and all(v is not None and math.isfinite(v) for v in grad_noise)


def efficiency(grad_sqr: float | None, grad_var: float | None, init_batch_size: float,
               batch_size: float) -> float:
    """Statistical efficiency E(M) of batch size ``batch_size`` relative to ``init_batch_size``:
    ``gain / r``, capped at 1 (module docstring: formula, limits). 1 when either statistic is
    ``None`` or not finite.

    Raises:
        ValueError: non-positive batch sizes.
    """
    if init_batch_size <= 0 or batch_size <= 0:
        raise ValueError(f"batch sizes must be positive, got {init_batch_size}, {batch_size}")
    if grad_sqr is None or grad_var is None or not noise_known((grad_sqr, grad_var)):
        return 1.0
    scale = batch_size / init_batch_size
    return min(1.0, gain(float(grad_sqr), float(grad_var), scale) / scale)


def efficiencies(grad_sqr: float | np.ndarray, grad_var: float | np.ndarray,
                 init_batch_size: float | np.ndarray, batch_sizes: np.ndarray) -> np.ndarray:
    """:func:`efficiency` of each of ``batch_sizes`` (positive, a numpy array) with finite
    statistics: the same formula over an array (the policies' inner loop). The statistics and
    the initial batch size are one job's (floats) or each batch size's own (arrays of its
    shape: several jobs' candidates at once)."""
    scale = batch_sizes / init_batch_size
    sqr, var = np.maximum(0.0, grad_sqr), np.maximum(0.0, grad_var)
    top = np.maximum(sqr, var)
    with np.errstate(divide="ignore", invalid="ignore"):
        sqr, var = sqr / top, var / top   # as gain: over the larger statistic
        g = np.where(top > 0, (var + sqr) / (var / scale + sqr), 1.0)
    return np.minimum(1.0, g / scale)


# ------------------------------------------------------------------------------------- fitting

def _fields(p: ProfilePoint | PerfSample) -> tuple[tuple[int, int, int, int], float, float | None,
                                                  float]:
    """``((nodes, replicas, local_bsz, accum), step time, compute time, weight)`` of a point:
    a :class:`ProfilePoint` weighs its ``samples`` and knows its compute time on one GPU (its
    step time per micro-batch)."""
    if isinstance(p, PerfSample):
        return (p.nodes, p.replicas, p.local_bsz, p.accum), p.step_time, p.compute_time, 1.0
    compute = p.step_time / p.accumulation_steps if p.world_size == 1 else None
    return ((p.nodes, p.world_size, p.local_batch_size, p.accumulation_steps), p.step_time,
            compute, float(max(1, p.samples)))


def aggregate(points: Iterable[ProfilePoint | PerfSample]) -> tuple[PerfSample, ...]:
    """One sample per distinct configuration ``(nodes, replicas, local_bsz, accum)``: step and
    compute times averaged (a :class:`ProfilePoint` weighted by its ``samples``). Unusable points
    (non-positive or non-finite times, impossible sizes) are dropped. Sorted, so equal inputs give
    equal outputs whatever their order."""
    # weighted sums in plain floats and tuples: policies aggregate every job's profile every
    # round, and numpy's per-call overhead (then one object per point) dominated
    acc: dict[tuple[int, int, int, int], list[float]] = {}   # [sum w*t, sum w, sum w*c, sum w_c]
    for p in points:
        key, t, c, w = _fields(p)
        n, k, b, a = key
        if not (n >= 1 and k >= n and b >= 1 and a >= 1 and math.isfinite(t) and t > 0):
            continue
        s = acc.get(key)
        if s is None:
            s = acc[key] = [0.0, 0.0, 0.0, 0.0]
        s[0] += w * t
        s[1] += w
        if c is not None and math.isfinite(c) and c > 0:
            s[2] += w * c
            s[3] += w
    out = []
    for key in sorted(acc):
        tw, w, cw, wc = acc[key]
        out.append(PerfSample(*key, tw / w, cw / wc if wc > 0 else None))
    return tuple(out)


@dataclass(frozen=True)
class _Points:
    """The fit's samples as arrays (one entry per configuration)."""

    n: np.ndarray          # nodes
    k: np.ndarray          # replicas
    b: np.ndarray          # local batch
    acc: np.ndarray        # micro-batches per step
    step: np.ndarray       # measured step time, s
    has_c: np.ndarray      # compute time known
    comp: np.ndarray       # measured compute time, s (1.0 where unknown)

    @classmethod
    def of(cls, samples: Sequence[PerfSample]) -> _Points:
        def col(f):
            return np.array([f(s) for s in samples], dtype=float)
        return cls(col(lambda s: s.nodes), col(lambda s: s.replicas), col(lambda s: s.local_bsz),
                   col(lambda s: s.accum), col(lambda s: s.step_time),
                   np.array([s.compute_time is not None for s in samples]),
                   np.array([s.compute_time if s.compute_time is not None else 1.0
                             for s in samples]))


def fixed_parameters(pts: _Points, prior: PerfParams | None
                     ) -> tuple[dict[str, float], PerfParams | None]:
    """The parameters the points cannot determine, with their values, and the prior scaled to
    the points (``None`` without a prior). Module docstring, "Fit" and "Departures"."""
    ref: PerfParams | None = None
    if prior is not None:
        pred = np.asarray(step_time(prior, pts.n, pts.k, pts.b, pts.acc), dtype=float)
        ref = prior.scaled(float(np.exp(np.mean(np.log(pts.step / pred)))))
    fixed: dict[str, float] = {}

    def fix(name: str, adaptdl_value: float) -> None:
        fixed[name] = getattr(ref, name) if ref is not None else adaptdl_value

    if len(np.unique(pts.b)) == 1:                               # one local batch size
        mean_c = (float(np.mean(pts.comp[pts.has_c])) if pts.has_c.any()
                  else float(np.mean(pts.step / pts.acc)))
        fix("alpha_c", mean_c / 2.0)
    if not np.any(pts.n > 1):                                    # never multi-node
        fix("alpha_n", LOWER)
        fix("beta_n", LOWER)
    if not np.any((pts.n == 1) & (pts.k > 1)):                   # never several GPUs of a node
        fix("alpha_r", LOWER)
        fix("beta_r", LOWER)
    if not np.any(pts.k > 2):                                    # never above 2 GPUs
        fix("beta_n", LOWER)
        fix("beta_r", LOWER)
    if not np.any(pts.k > 1) and prior is not None:              # never synchronised
        fixed["gamma"] = prior.gamma
    for name in TIME_NAMES:
        if name in fixed:
            fixed[name] = float(np.clip(fixed[name], LOWER, UPPER))
    return fixed, ref


class _Objective:
    """The fit's objective (module docstring) and its analytic gradient, over the free
    parameters: ``log`` of the time parameters, ``gamma`` as is.

    Evaluated point by point in plain floats: a fit has a few points (one per configuration the
    job has run) and L-BFGS-B calls this many times per fit, so numpy's per-call overhead on
    arrays that small would be most of the cost (measured: docs/design-notes.md,
    "perf/pollux.py")."""

    def __init__(self, pts: _Points, fixed: dict[str, float], ref: PerfParams | None):
        self.free = [f.name for f in fields(PerfParams) if f.name not in fixed]
        # per point: (local batch, micro-batches, retrogression, inter-node?, intra-node?,
        # log measured step time)
        self._rows = [(float(b), float(a), max(float(k) - 2.0, 0.0), float(n > 1),
                       float(n == 1 and k > 1), math.log(float(t)))
                      for n, k, b, a, t in zip(pts.n, pts.k, pts.b, pts.acc, pts.step)]
        self._comp = [(float(b), math.log(float(c)))
                      for b, c, h in zip(pts.b, pts.comp, pts.has_c) if h]
        names = [f.name for f in fields(PerfParams)]
        self._free_idx = [names.index(nm) for nm in self.free]
        self._gamma = names.index("gamma")
        self._fixed_vals = [fixed.get(nm, 0.0) for nm in names]
        # hpcsched: a weak pull of the free parameters (log times, gamma) towards the scaled
        # prior, so that a few points (fewer than parameters) give a well-posed fit
        self.pull = ([ref.gamma if nm == "gamma" else math.log(float(np.clip(
            getattr(ref, nm), LOWER, UPPER))) for nm in self.free]
            if ref is not None and self.free else None)

    def unpack(self, x: np.ndarray) -> PerfParams:
        """The parameters at ``x`` (fixed ones as fixed, times from their logs)."""
        return PerfParams(*self._values(x))

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        vals = self._values(x)
        ac, bc, an, bn, ar, br, g = vals
        log, rows, ig = math.log, self._rows, 1.0 / g
        preds = []          # per point: (pred, e, d pred / d T_grad, d pred / d T_sync,
        sq = 0.0            #             d pred / d gamma), from _step_time's formula
        for b, acc, retro, inter, intra, log_step in rows:
            tg = ac + bc * b
            ts = inter * (an + bn * retro) + intra * (ar + br * retro)
            m = tg if tg >= ts else ts
            u, v = tg / m, ts / m
            ug, vg = u ** g, v ** g
            big_s = ug + vg
            pn = m * big_s ** ig
            pred = (acc - 1.0) * tg + pn
            e = log(pred) - log_step
            sq += e * e
            lv = vg * log(v) if v > 0 else 0.0
            preds.append((pred, e, (acc - 1.0) + (tg / pn) ** (g - 1.0),
                          (ts / pn) ** (g - 1.0) if ts > 0 else 0.0,
                          pn * (-log(big_s) * ig * ig + (ug * log(u) + lv) * ig / big_s)))
        n = len(rows)
        err1 = math.sqrt(sq / n + SMOOTH)
        grad = [0.0] * 7
        for (b, _, retro, inter, intra, _), (pred, e, dt, dv, dg) in zip(rows, preds):
            w = e / (pred * n * err1)          # d err1 / d pred
            wt, wv = w * dt, w * dv
            grad[0] += wt
            grad[1] += wt * b
            grad[2] += wv * inter
            grad[3] += wv * retro * inter
            grad[4] += wv * intra
            grad[5] += wv * retro * intra
            grad[6] += w * dg
        total = err1
        if self._comp:
            nc, sq_c, terms = len(self._comp), 0.0, []
            for b, log_c in self._comp:
                tg = ac + bc * b
                ec = log(tg) - log_c
                sq_c += ec * ec
                terms.append((b, ec, tg))
            err2 = math.sqrt(sq_c / nc + SMOOTH)
            for b, ec, tg in terms:
                wc = ec / (tg * nc * err2)
                grad[0] += wc
                grad[1] += wc * b
            total += err2
        total += 1e-3 * (g - 1.0) ** 2
        grad[6] += 2e-3 * (g - 1.0)
        total += 1e-2 * ((bn / an) ** 2 + (br / ar) ** 2)
        grad[3] += 2e-2 * bn / an ** 2
        grad[2] -= 2e-2 * bn ** 2 / an ** 3
        grad[5] += 2e-2 * br / ar ** 2
        grad[4] -= 2e-2 * br ** 2 / ar ** 3
        # chain rule: time parameters are optimised as logs
        jac = [grad[i] if i == self._gamma else grad[i] * vals[i] for i in self._free_idx]
        if self.pull is not None:
            k = len(self.pull)
            for i, (xi, pi) in enumerate(zip(x.tolist(), self.pull)):
                d = xi - pi
                total += PRIOR_PULL * d * d / k
                jac[i] += 2.0 * PRIOR_PULL * d / k
        return total, np.array(jac)

    def _values(self, x: np.ndarray) -> list[float]:
        """The seven parameters (:class:`PerfParams` order) at ``x``, as :meth:`unpack` gives."""
        vals = list(self._fixed_vals)
        for i, v in zip(self._free_idx, x.tolist(), strict=True):
            vals[i] = v if i == self._gamma else math.exp(v)
        return vals


def _starts(pts: _Points, ref: PerfParams | None) -> list[dict[str, float]]:
    """Starting points: AdaptDL's ([0.1, 0.01] x 3, gamma 1.001) and one scaled to the data; with
    a prior, the scaled prior alone (the pull keeps the optimum near it, and one start instead of
    two makes a policy's refit of a job cheaper)."""
    if ref is not None:
        return [ref.as_dict()]
    names = [f.name for f in fields(PerfParams)]
    t0 = float(np.median(pts.step / pts.acc))
    return [dict(zip(names, [1e-1, 1e-2] * 3 + [1.0 + 1e-3], strict=True)),
            dict(zip(names, [t0 / 2, t0 / 2 / float(np.median(pts.b)), t0 / 2, t0 / 20,
                             t0 / 4, t0 / 40, 1.0 + 1e-3], strict=True))]


def _minimise(objective: _Objective, starts: list[dict[str, float]], ftol: float) -> np.ndarray:
    """L-BFGS-B from each start within the bounds; the best end point."""
    from scipy.optimize import minimize  # here: kept out of the CLI's start-up
    free = objective.free
    bounds = [GAMMA_RANGE if nm == "gamma" else (math.log(LOWER), math.log(UPPER))
              for nm in free]
    best = None
    for st in starts:
        x0 = np.array([st[nm] if nm == "gamma" else math.log(np.clip(st[nm], LOWER, UPPER))
                       for nm in free])
        res = minimize(objective, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": MAX_ITER, "ftol": ftol})
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None, "no start point"   # _starts gives at least one
    return best.x


def fit_perf_params(points: Iterable[ProfilePoint | PerfSample],
                    prior: PerfParams | None = None) -> PerfParams:
    """Fit :class:`PerfParams` to measured points (module docstring: objective, bounds, fixed
    parameters, and how ``prior`` fills what the points cannot determine).

    Raises:
        ValueError: no usable point.
    """
    samples = aggregate(points)
    if not samples:
        raise ValueError("no usable profile point (need a positive, finite step time)")
    return fit_samples(samples, prior)


@lru_cache(maxsize=2048)
def fit_samples(samples: tuple[PerfSample, ...], prior: PerfParams | None) -> PerfParams:
    """:func:`fit_perf_params` of samples already :func:`aggregate`-d; cached (a policy refits
    a job whose measurements did not change every round)."""
    pts = _Points.of(samples)
    fixed, ref = fixed_parameters(pts, prior)
    objective = _Objective(pts, fixed, ref)
    if objective.free:
        params = objective.unpack(_minimise(objective, _starts(pts, ref),
                                            FTOL if ref is None else FTOL_PRIOR))
    else:
        params = PerfParams(**fixed)
    if not np.any(pts.n > 1) and prior is None:
        # AdaptDL: "enforce prior: alpha_n and beta_n are at least alpha_r and beta_r"
        params = replace(params, alpha_n=max(params.alpha_n, params.alpha_r * 1.1),
                         beta_n=max(params.beta_n, params.beta_r * 1.1))
    return params
