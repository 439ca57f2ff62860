"""Pollux-style goodput: a job's throughput at any placement and batch size, times its statistical
efficiency at that batch size.

Pure and deterministic (fits are seeded-free L-BFGS-B from fixed starting points). Units: seconds,
samples, samples/s. The one file this module reads is the shipped prior table
(``hpcsched/data/pollux/priors.json``, static data, read once); :func:`build_priors` and the
``__main__`` block, which rebuild that table from the Pollux traces, are tooling and are never
called by a policy.

Sources: Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep
Learning", OSDI'21, §3 (goodput = throughput x statistical efficiency; §3.1 efficiency, §3.2
throughput model), and AdaptDL's ``adaptdl/goodput.py`` (github.com/petuum/adaptdl), which this
module follows formula for formula; where it departs, the text says so.

Throughput model (Pollux §3.2; AdaptDL ``PerfParams``, ``_predict_accum_time``,
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
(``s - 1``).

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

*Departures* (hpcsched), all only when a prior for the job's application is known (below): the
fixed parameters take the prior's values scaled to the job's own measurements (scale = geometric
mean of measured / prior-predicted step time) instead of 1e-8, and ``gamma`` is the prior's when
the job has never synchronised; the objective gains a weak pull towards that scaled prior,
``PRIOR_PULL x mean((log p - log p_prior)^2)`` over the free parameters (``gamma`` unlogged), so a
job with fewer configurations than free parameters gets a well-posed fit rather than an arbitrary
point of a flat valley; and the scaled prior is a third starting point. Without a prior the fit is
AdaptDL's. Numerics: optimisation over ``log`` of the time parameters with an analytic gradient
(AdaptDL: the parameters themselves, autograd gradient), from AdaptDL's starting point and one
scaled to the data, keeping the better; each RMSE has ``SMOOTH`` = 1e-8 under its root so the
minimiser does not stall on the kink of an exact fit.

Compute time of a point: the traces give it (``step_time - sync_time``); a job's own
:class:`~hpcsched.policies.snapshot.ProfilePoint` gives it exactly when it ran on one GPU
(``step_time / accum``, no synchronisation); otherwise only the step time is fitted.

Priors (hpcsched): per application of the Pollux traces (cifar10, imagenet, bert, ncf,
deepspeech2, yolov3), the parameters fitted to all of its measured placements and local batch sizes
(``hpcsched/data/pollux/``, see ``SOURCE.md`` there). A job's parameters (:func:`job_perf_params`):

* >= 2 distinct configurations measured: fitted to its own points (prior fills what they cannot
  determine, as above);
* 1 configuration: the prior of its application, every time parameter scaled by
  ``measured / predicted`` step time so the model reproduces the measurement exactly (the model
  is homogeneous of degree 1 in the time parameters); without a prior, AdaptDL's one-point fit;
* none: the prior as is (absolute times are the traces' T4 GPUs), or ``None``.

Statistical efficiency (Pollux §3.1, the gradient-noise-scale form of E(M); AdaptDL
``GoodputFunction.efficiency``), with ``M0`` the initial (base) batch size, ``M`` the batch size,
``|g|^2`` and ``sigma^2`` the gradient's squared norm and variance estimated at ``M0``::

    r    = M / M0
    E(M) = ((sigma^2 + |g|^2) / (sigma^2 / r + |g|^2)) / r
         = (phi + M0) / (phi + M),   phi = M0 * sigma^2 / |g|^2   (the gradient noise scale)

``E(M0) = 1``; ``E`` falls as ``M`` grows, slowly while ``M << phi`` (noisy gradients: larger
batches are almost free) and as ``M0 / M`` once ``M >> phi``. Limits, following the formula:
no noise (``sigma^2 = 0``) gives ``E = M0 / M`` (a larger batch buys no progress per step);
pure noise (``|g|^2 = 0``) gives ``E = 1``; both 0 gives ``M0 / M`` (AdaptDL: gain 1, divided by
``r``). Negative estimates (they happen with few samples) are clipped to 0. *Departures*: no
statistics (``None``) gives ``E = 1``; below ``M0`` the formula exceeds 1 and AdaptDL never
evaluates there (it asserts ``M >= M0``); here ``E`` is capped at 1 so it stays in (0, 1].

Goodput = throughput x E (Pollux §3, eq. 1).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from hpcsched.protocol.batching import BatchConfig, BatchSizeError, fit_batch
from hpcsched.policies.snapshot import JobView, ProfilePoint

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "pollux"
PRIORS_FILE = DATA_DIR / "priors.json"
PROFILES_FILE = DATA_DIR / "profiles.csv"
APPLICATIONS = ("cifar10", "imagenet", "bert", "ncf", "deepspeech2", "yolov3")

LOWER = 1e-8          # AdaptDL's lower bound for every time parameter
UPPER = 1e4           # s; a step time no job has
GAMMA_RANGE = (1.0, 10.0)
_TIME_NAMES = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r")
BATCH_CANDIDATES = 50  # global batch sizes tried per size, geometric (AdaptDL ``optimize``: 50)
PRIOR_PULL = 1e-2      # weight of the pull towards the prior (hpcsched; module docstring)
MAX_ITER = 500         # L-BFGS-B iterations per start
FTOL = 1e-8            # L-BFGS-B: stop when the objective (log-RMSE) improves by less
FTOL_PRIOR = 1e-6      # ... when a prior anchors the fit (a policy refits jobs every round)
SMOOTH = 1e-8          # under each RMSE's root: no kink at an exact fit (module docstring)


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
        return replace(self, **{n: getattr(self, n) * factor for n in _TIME_NAMES})

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> PerfParams:
        return cls(**{f.name: float(d[f.name]) for f in fields(cls)})


@dataclass(frozen=True)
class PerfSample:
    """One measured configuration: mean seconds per optimizer step, and, where known, the compute
    time of one micro-batch (no synchronisation)."""

    nodes: int
    replicas: int
    local_bsz: int
    accum: int
    step_time: float
    compute_time: float | None = None


# ---------------------------------------------------------------------------------- prediction

def _scalar_or_array(x):
    return float(x) if np.ndim(x) == 0 else x


def predict_compute_time(params: PerfParams, local_bsz):
    """T_grad: seconds for one micro-batch of ``local_bsz`` samples per replica."""
    return _scalar_or_array(params.alpha_c + params.beta_c * np.asarray(local_bsz, dtype=float))


def predict_sync_time(params: PerfParams, nodes, replicas):
    """T_sync: 0 on one replica; intra-node parameters when every replica is on one node;
    inter-node parameters when the job spans nodes. Retrogression grows with ``replicas - 2``."""
    n = np.asarray(nodes, dtype=float)
    k = np.asarray(replicas, dtype=float)
    retro = np.maximum(k - 2.0, 0.0)
    inter = params.alpha_n + params.beta_n * retro
    intra = params.alpha_r + params.beta_r * retro
    return _scalar_or_array(np.where(n > 1, inter, np.where(k > 1, intra, 0.0)))


def _pnorm(a, b, gamma):
    """(a^gamma + b^gamma)^(1/gamma), scaled to avoid under/overflow."""
    m = np.maximum(np.maximum(a, b), 1e-300)
    return m * ((a / m) ** gamma + (b / m) ** gamma) ** (1.0 / gamma)


def _check(nodes, replicas, local_bsz, accum):
    n, k, b, s = (np.asarray(v) for v in (nodes, replicas, local_bsz, accum))
    if np.any(n < 1) or np.any(k < n) or np.any(b < 1) or np.any(s < 1):
        raise ValueError(f"need 1 <= nodes <= replicas, local_bsz >= 1, accum >= 1; got "
                         f"nodes={nodes}, replicas={replicas}, local_bsz={local_bsz}, "
                         f"accum={accum}")


def predict_step_time(params: PerfParams, nodes, replicas, local_bsz, accum=1):
    """Seconds per optimizer step (module docstring). Scalars or numpy arrays (broadcast)."""
    _check(nodes, replicas, local_bsz, accum)
    tg = np.asarray(predict_compute_time(params, local_bsz), dtype=float)
    ts = np.asarray(predict_sync_time(params, nodes, replicas), dtype=float)
    s = np.asarray(accum, dtype=float)
    return _scalar_or_array((s - 1.0) * tg + _pnorm(tg, ts, params.gamma))


def predict_throughput(params: PerfParams, nodes, replicas, local_bsz, accum=1):
    """Samples/s: ``replicas * local_bsz * accum / T_step``."""
    t = np.asarray(predict_step_time(params, nodes, replicas, local_bsz, accum), dtype=float)
    batch = (np.asarray(replicas, dtype=float) * np.asarray(local_bsz, dtype=float)
             * np.asarray(accum, dtype=float))
    return _scalar_or_array(batch / t)


# ------------------------------------------------------------------------------------- fitting

def _as_sample(p: ProfilePoint | PerfSample) -> PerfSample:
    if isinstance(p, PerfSample):
        return p
    compute = p.step_time / p.accumulation_steps if p.world_size == 1 else None
    return PerfSample(p.nodes, p.world_size, p.local_batch_size, p.accumulation_steps,
                      p.step_time, compute)


def aggregate(points: Iterable[ProfilePoint | PerfSample]) -> tuple[PerfSample, ...]:
    """One sample per distinct configuration ``(nodes, replicas, local_bsz, accum)``: step and
    compute times averaged (a :class:`ProfilePoint` weighted by its ``samples``). Unusable points
    (non-positive or non-finite times, impossible sizes) are dropped. Sorted, so equal inputs give
    equal outputs whatever their order."""
    # weighted sums in plain floats: policies aggregate every job's profile every round, and
    # numpy's per-call overhead dominated on these few points
    acc: dict[tuple[int, int, int, int], list[float]] = {}   # [sum w*t, sum w, sum w*c, sum w_c]
    for p in points:
        w = float(max(1, p.samples)) if isinstance(p, ProfilePoint) else 1.0
        s = _as_sample(p)
        ok = (s.nodes >= 1 and s.replicas >= s.nodes and s.local_bsz >= 1 and s.accum >= 1
              and math.isfinite(s.step_time) and s.step_time > 0)
        if not ok:
            continue
        a = acc.setdefault((s.nodes, s.replicas, s.local_bsz, s.accum), [0.0, 0.0, 0.0, 0.0])
        a[0] += w * s.step_time
        a[1] += w
        c = s.compute_time
        if c is not None and math.isfinite(c) and c > 0:
            a[2] += w * c
            a[3] += w
    out = []
    for key in sorted(acc):
        tw, w, cw, wc = acc[key]
        out.append(PerfSample(*key, tw / w, cw / wc if wc > 0 else None))
    return tuple(out)


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
    return _fit(samples, prior)


@lru_cache(maxsize=2048)
def _fit(samples: tuple[PerfSample, ...], prior: PerfParams | None) -> PerfParams:
    n = np.array([s.nodes for s in samples], dtype=float)
    k = np.array([s.replicas for s in samples], dtype=float)
    b = np.array([s.local_bsz for s in samples], dtype=float)
    acc = np.array([s.accum for s in samples], dtype=float)
    step = np.array([s.step_time for s in samples], dtype=float)
    has_c = np.array([s.compute_time is not None for s in samples])
    comp = np.array([s.compute_time if s.compute_time is not None else 1.0 for s in samples])

    # what the points can tell (AdaptDL fit_perf_params)
    multi_node = bool(np.any(n > 1))
    intra = bool(np.any((n == 1) & (k > 1)))
    above_two = bool(np.any(k > 2))
    one_bsz = len(np.unique(b)) == 1
    synced = bool(np.any(k > 1))

    ref: PerfParams | None = None
    if prior is not None:
        pred = np.asarray(predict_step_time(prior, n, k, b, acc), dtype=float)
        ratio = float(np.exp(np.mean(np.log(step / pred))))
        ref = prior.scaled(ratio)
    fixed: dict[str, float] = {}

    def fix(name: str, adaptdl_value: float) -> None:
        fixed[name] = getattr(ref, name) if ref is not None else adaptdl_value

    if one_bsz:
        mean_c = float(np.mean(comp[has_c])) if has_c.any() else float(np.mean(step / acc))
        fix("alpha_c", mean_c / 2.0)
    if not multi_node:
        fix("alpha_n", LOWER)
        fix("beta_n", LOWER)
    if not intra:
        fix("alpha_r", LOWER)
        fix("beta_r", LOWER)
    if not above_two:
        fix("beta_n", LOWER)
        fix("beta_r", LOWER)
    if not synced and prior is not None:
        fixed["gamma"] = prior.gamma
    for name in _TIME_NAMES:
        if name in fixed:
            fixed[name] = float(np.clip(fixed[name], LOWER, UPPER))

    names = [f.name for f in fields(PerfParams)]
    free = [nm for nm in names if nm not in fixed]

    def unpack(x: np.ndarray) -> PerfParams:
        vals = dict(fixed)
        for nm, v in zip(free, x, strict=True):
            vals[nm] = float(v) if nm == "gamma" else float(np.exp(v))
        return PerfParams(**vals)

    log_step = np.log(step)
    log_comp = np.log(comp[has_c])

    # hpcsched: a weak pull of the free parameters (log times, gamma) towards the scaled prior, so
    # that a few points (fewer than parameters) give a well-posed fit, not a flat valley
    pull_idx = np.arange(len(free))
    pull = (np.array([ref.gamma if nm == "gamma" else math.log(np.clip(getattr(ref, nm), LOWER,
                                                                        UPPER)) for nm in free])
            if ref is not None and free else None)
    retro = np.maximum(k - 2.0, 0.0)
    inter = n > 1
    intra = (n == 1) & (k > 1)
    b_c = b[has_c]

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        """The objective and its gradient in ``x`` (log time parameters, gamma)."""
        p = unpack(x)
        g = p.gamma
        tg = p.alpha_c + p.beta_c * b
        ts = np.where(inter, p.alpha_n + p.beta_n * retro,
                      np.where(intra, p.alpha_r + p.beta_r * retro, 0.0))
        m = np.maximum(tg, ts)
        u, v = tg / m, ts / m
        ug, vg = u ** g, v ** g
        big_s = ug + vg
        pn = m * big_s ** (1.0 / g)
        pred = (acc - 1.0) * tg + pn
        e = np.log(pred) - log_step
        err1 = math.sqrt(float(np.mean(e ** 2)) + SMOOTH)
        # d err1 / d pred_i = e_i / (pred_i * N * err1)
        w = e / (pred * len(e) * err1)
        dp_du = (u * m / pn) ** (g - 1.0)                       # (tg / P)^(g-1)
        dp_dv = np.where(ts > 0, (ts / pn) ** (g - 1.0), 0.0)   # (ts / P)^(g-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            lu = np.where(u > 0, ug * np.log(np.where(u > 0, u, 1.0)), 0.0)
            lv = np.where(v > 0, vg * np.log(np.where(v > 0, v, 1.0)), 0.0)
        dlnp_dg = -np.log(big_s) / g ** 2 + (lu + lv) / (g * big_s)
        d_tg = (acc - 1.0) + dp_du
        grad = {
            "alpha_c": float(np.sum(w * d_tg)), "beta_c": float(np.sum(w * d_tg * b)),
            "alpha_n": float(np.sum(w * dp_dv * inter)),
            "beta_n": float(np.sum(w * dp_dv * retro * inter)),
            "alpha_r": float(np.sum(w * dp_dv * intra)),
            "beta_r": float(np.sum(w * dp_dv * retro * intra)),
            "gamma": float(np.sum(w * pn * dlnp_dg)),
        }
        total = err1
        if has_c.any():
            tg_c = p.alpha_c + p.beta_c * b_c
            ec = np.log(tg_c) - log_comp
            err2 = math.sqrt(float(np.mean(ec ** 2)) + SMOOTH)
            wc = ec / (tg_c * len(ec) * err2)
            grad["alpha_c"] += float(np.sum(wc))
            grad["beta_c"] += float(np.sum(wc * b_c))
            total += err2
        total += 1e-3 * (g - 1.0) ** 2
        grad["gamma"] += 2e-3 * (g - 1.0)
        total += 1e-2 * ((p.beta_n / p.alpha_n) ** 2 + (p.beta_r / p.alpha_r) ** 2)
        grad["beta_n"] += 2e-2 * p.beta_n / p.alpha_n ** 2
        grad["alpha_n"] -= 2e-2 * p.beta_n ** 2 / p.alpha_n ** 3
        grad["beta_r"] += 2e-2 * p.beta_r / p.alpha_r ** 2
        grad["alpha_r"] -= 2e-2 * p.beta_r ** 2 / p.alpha_r ** 3
        # chain rule: time parameters are optimised as logs
        jac = np.array([grad[nm] if nm == "gamma" else grad[nm] * getattr(p, nm) for nm in free])
        if pull is not None:
            d = x[pull_idx] - pull
            total += PRIOR_PULL * float(np.mean(d ** 2))
            jac[pull_idx] += 2.0 * PRIOR_PULL * d / len(d)
        return total, jac

    if free:
        bounds = [GAMMA_RANGE if nm == "gamma" else (math.log(LOWER), math.log(UPPER))
                  for nm in free]
        # AdaptDL's start ([0.1, 0.01] x 3, gamma 1.001), one scaled to the data, and the scaled
        # prior when there is one
        t0 = float(np.median(step / acc))
        starts = [dict(zip(names, [1e-1, 1e-2] * 3 + [1.0 + 1e-3], strict=True)),
                  dict(zip(names, [t0 / 2, t0 / 2 / float(np.median(b)), t0 / 2, t0 / 20,
                                   t0 / 4, t0 / 40, 1.0 + 1e-3], strict=True))]
        if ref is not None:
            # with a prior, start from it alone: the pull keeps the optimum near it, and one
            # start instead of three makes a policy's refit of a job 3x cheaper
            starts = [ref.as_dict()]
        best = None
        for st in starts:
            x0 = np.array([st[nm] if nm == "gamma" else math.log(np.clip(st[nm], LOWER, UPPER))
                           for nm in free])
            res = minimize(objective, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                           options={"maxiter": MAX_ITER,
                                    "ftol": FTOL if ref is None else FTOL_PRIOR})
            if best is None or res.fun < best.fun:
                best = res
        params = unpack(best.x)
    else:
        params = PerfParams(**fixed)
    if not multi_node and prior is None:
        # AdaptDL: "enforce prior: alpha_n and beta_n are at least alpha_r and beta_r"
        params = replace(params, alpha_n=max(params.alpha_n, params.alpha_r * 1.1),
                         beta_n=max(params.beta_n, params.beta_r * 1.1))
    return params


# -------------------------------------------------------------------------------------- priors

@lru_cache(maxsize=1)
def _priors() -> dict[str, PerfParams]:
    try:
        doc = json.loads(PRIORS_FILE.read_text())
    except FileNotFoundError:
        return {}
    return {app: PerfParams.from_dict(v["params"]) for app, v in doc["applications"].items()}


def prior_apps() -> tuple[str, ...]:
    """Applications with a shipped prior."""
    return tuple(sorted(_priors()))


def prior_for(app_class: str) -> PerfParams | None:
    """The shipped step-time parameters fitted to the Pollux traces of ``app_class`` (case and
    surrounding spaces ignored), or ``None`` for an application without traces."""
    return _priors().get((app_class or "").strip().lower())


def job_perf_params(job: JobView, *, use_prior: bool = True) -> tuple[PerfParams | None, str]:
    """The job's step-time parameters and where they came from (module docstring, "Priors")."""
    samples = aggregate(job.profile)
    prior = prior_for(job.app_class) if use_prior else None
    if len(samples) >= 2:
        how = f"fitted to {len(samples)} configurations"
        if prior is not None:
            how += f" ({job.app_class} prior for the rest)"
        return _fit(samples, prior), how
    if len(samples) == 1:
        s = samples[0]
        if prior is not None:
            ratio = s.step_time / predict_step_time(prior, s.nodes, s.replicas, s.local_bsz,
                                                    s.accum)
            return prior.scaled(ratio), f"{job.app_class} prior x {ratio:.3g} (1 configuration)"
        return _fit(samples, None), "fitted to 1 configuration (AdaptDL defaults)"
    if prior is not None:
        return prior, f"{job.app_class} prior (not measured yet)"
    return None, "not measured, no prior"


# ---------------------------------------------------------------------------------- efficiency

def efficiency(grad_sqr: float | None, grad_var: float | None, init_batch_size: float,
               batch_size: float) -> float:
    """Statistical efficiency E(M) of batch size ``batch_size`` relative to ``init_batch_size``
    (module docstring: formula, limits, and the cap at 1 below ``init_batch_size``). 1 when either
    statistic is ``None`` or not finite.

    Raises:
        ValueError: non-positive batch sizes.
    """
    if init_batch_size <= 0 or batch_size <= 0:
        raise ValueError(f"batch sizes must be positive, got {init_batch_size}, {batch_size}")
    if grad_sqr is None or grad_var is None or not (math.isfinite(grad_sqr)
                                                    and math.isfinite(grad_var)):
        return 1.0
    sqr, var = max(0.0, float(grad_sqr)), max(0.0, float(grad_var))
    scale = batch_size / init_batch_size
    denom = var / scale + sqr
    gain = (var + sqr) / denom if denom > 0 else 1.0
    return min(1.0, gain / scale)


# --------------------------------------------------------------------------------- job model

class GoodputModel:
    """Throughput, efficiency and goodput of one job at any size (module docstring).

    ``params`` overrides the parameters :func:`job_perf_params` would choose. ``params`` is
    ``None`` when the job has neither a measurement nor a prior; throughput and goodput then raise
    ``ValueError`` (efficiency does not need them).
    """

    def __init__(self, job: JobView, params: PerfParams | None = None, *, use_prior: bool = True):
        self.job = job
        if params is None:
            self.params, self.source = job_perf_params(job, use_prior=use_prior)
        else:
            self.params, self.source = params, "given"
        self.init_batch_size = job.base_batch_size if job.base_batch_size > 0 else job.batch_size

    def _need(self) -> PerfParams:
        if self.params is None:
            raise ValueError(f"job {self.job.job_id}: no throughput model ({self.source})")
        return self.params

    def throughput(self, nodes: int, replicas: int, local_bsz: int, accum: int = 1) -> float:
        """Samples/s at the configuration."""
        return predict_throughput(self._need(), nodes, replicas, local_bsz, accum)

    def step_time(self, nodes: int, replicas: int, local_bsz: int, accum: int = 1) -> float:
        return predict_step_time(self._need(), nodes, replicas, local_bsz, accum)

    def efficiency(self, batch_size: int) -> float:
        """E(batch_size) from the job's latest gradient-noise statistics (1 without them)."""
        sqr, var = self.job.grad_noise if self.job.grad_noise is not None else (None, None)
        return efficiency(sqr, var, self.init_batch_size, batch_size)

    def goodput(self, nodes: int, replicas: int, local_bsz: int, accum: int = 1) -> float:
        """Throughput x efficiency at the configuration, samples/s."""
        return (self.throughput(nodes, replicas, local_bsz, accum)
                * self.efficiency(replicas * local_bsz * accum))

    def batch_configs(self, replicas: int) -> list[BatchConfig]:
        """Configurations at ``replicas`` GPUs within the job's limits: global batch in
        ``[min_batch_size, max_batch_size]``, local batch <= ``max_local_batch_size`` (gradient
        accumulation beyond it). Tried: the job's current and base batch sizes, the limits, and
        ``BATCH_CANDIDATES`` sizes spread geometrically between them (AdaptDL ``optimize``)."""
        job = self.job
        lo, hi = job.min_batch_size, job.max_batch_size
        if replicas < 1 or hi < max(lo, replicas):
            return []
        wanted = {job.batch_size, self.init_batch_size, lo, hi}
        wanted.update(round(float(x)) for x in np.geomspace(max(lo, 1), hi, BATCH_CANDIDATES))
        out: dict[tuple[int, int], BatchConfig] = {}
        for want in sorted(wanted):
            try:
                cfg = fit_batch(want, replicas, min_global=lo, max_global=hi,
                                max_local_batch_size=job.max_local_batch_size)
            except BatchSizeError:
                continue
            if not lo <= cfg.global_batch_size <= hi:
                continue
            cap = job.max_local_batch_size
            if cap is not None and cfg.local_batch_size > cap:
                continue
            out.setdefault((cfg.local_batch_size, cfg.accumulation_steps), cfg)
        return sorted(out.values(), key=lambda c: (c.global_batch_size, c.accumulation_steps))

    def best_batch(self, nodes: int, replicas: int) -> tuple[int, int, int, float] | None:
        """``(global_bsz, local_bsz, accum, goodput)`` with the highest goodput at ``nodes`` nodes
        and ``replicas`` GPUs over :meth:`batch_configs`; ties go to the batch size nearest the
        job's current one, then to the smaller. ``None`` when no batch size fits the limits."""
        best = None
        for cfg in self.batch_configs(replicas):
            g = self.goodput(nodes, replicas, cfg.local_batch_size, cfg.accumulation_steps)
            key = (g, -abs(cfg.global_batch_size - self.job.batch_size), -cfg.global_batch_size)
            if best is None or key > best[0]:
                best = (key, cfg, g)
        if best is None:
            return None
        _, cfg, g = best
        return cfg.global_batch_size, cfg.local_batch_size, cfg.accumulation_steps, float(g)


# ----------------------------------------------------------- tooling: rebuild the shipped prior

def read_pollux_traces(trace_root: Path | str, app: str) -> list[dict[str, float]]:
    """Rows of ``<trace_root>/<app>/placements.csv`` and ``scalability.csv`` averaged per
    ``(num_nodes, num_replicas, local_bsz)`` (a placement "13" = 1 GPU on one node and 3 on
    another: 2 nodes, 4 replicas, as Pollux's simulator reads it). I/O: tooling only."""
    root = Path(trace_root) / app
    acc: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    with open(root / "placements.csv", newline="") as f:
        for r in csv.DictReader(f):
            p = r["placement"].strip()
            key = (len(p), sum(int(c) for c in p), int(r["local_bsz"]))
            acc.setdefault(key, []).append((float(r["step_time"]), float(r["sync_time"])))
    with open(root / "scalability.csv", newline="") as f:
        for r in csv.DictReader(f):
            key = (int(r["num_nodes"]), int(r["num_replicas"]), int(r["local_bsz"]))
            acc.setdefault(key, []).append((float(r["step_time"]), float(r["sync_time"])))
    return [{"application": app, "num_nodes": key[0], "num_replicas": key[1], "local_bsz": key[2],
             "step_time": float(f"{np.mean([s for s, _ in v]):.6g}"),
             "sync_time": float(f"{np.mean([y for _, y in v]):.6g}"), "count": len(v)}
            for key, v in sorted(acc.items())]


def samples_from_rows(rows: Sequence[dict]) -> list[PerfSample]:
    """Profile rows (as in ``profiles.csv``) as fit inputs: the step time is the optimizer step,
    ``step_time - sync_time`` the compute of one micro-batch (Pollux simulator,
    ``applications.py``)."""
    out = []
    for r in rows:
        step, sync = float(r["step_time"]), float(r["sync_time"])
        comp = step - sync
        out.append(PerfSample(int(r["num_nodes"]), int(r["num_replicas"]), int(r["local_bsz"]), 1,
                              step, comp if comp > 0 else None))
    return out


def read_shipped_profiles() -> dict[str, list[dict]]:
    """The shipped ``profiles.csv``, rows per application (tooling and tests)."""
    out: dict[str, list[dict]] = {}
    with open(PROFILES_FILE, newline="") as f:
        for r in csv.DictReader(f):
            out.setdefault(r["application"], []).append(r)
    return out


def fit_report(params: PerfParams, samples: Sequence[PerfSample]) -> dict[str, float]:
    """How well ``params`` predicts ``samples``' step times."""
    pred = np.array([predict_step_time(params, s.nodes, s.replicas, s.local_bsz, s.accum)
                     for s in samples])
    meas = np.array([s.step_time for s in samples])
    rel = np.abs(pred / meas - 1.0)
    return {"rmsle_step_time": float(np.sqrt(np.mean(np.log(pred / meas) ** 2))),
            "median_abs_rel_error": float(np.median(rel)), "max_abs_rel_error": float(rel.max())}


def build_priors(trace_root: Path | str, out_dir: Path | str = DATA_DIR) -> dict:
    """Rebuild ``profiles.csv`` and ``priors.json`` in ``out_dir`` from the Pollux traces
    (tooling; see ``SOURCE.md``). Returns the priors document."""
    out_dir = Path(out_dir)
    rows: list[dict] = []
    for app in APPLICATIONS:
        rows.extend(read_pollux_traces(trace_root, app))
    cols = ["application", "num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time",
            "count"]
    with open(out_dir / "profiles.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    apps = {}
    for app in APPLICATIONS:
        app_rows = [r for r in rows if r["application"] == app]
        samples = samples_from_rows(app_rows)
        p = fit_perf_params(samples)
        apps[app] = {"params": {k: float(f"{v:.6g}") for k, v in p.as_dict().items()},
                     "configurations": len(samples),
                     "local_bsz": [min(s.local_bsz for s in samples),
                                   max(s.local_bsz for s in samples)],
                     "max_replicas": max(s.replicas for s in samples),
                     **{k: round(v, 4) for k, v in fit_report(p, samples).items()}}
    doc = {"model": "T_step = (s-1)*T_grad + (T_grad^gamma + T_sync^gamma)^(1/gamma); "
                    "see hpcsched/policies/goodput.py",
           "units": "seconds (AWS g4dn.12xlarge, NVIDIA T4, 4 GPUs per node)",
           "source": "github.com/petuum/adaptdl, branch osdi21-artifact, commit "
                     "c793c7089bd307462686339d29707925c461f9a9, simulator/traces/<app>/"
                     "{placements,scalability}.csv (Apache-2.0); see SOURCE.md",
           "applications": apps}
    (out_dir / "priors.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    _priors.cache_clear()
    return doc


if __name__ == "__main__":  # pragma: no cover - tooling
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m hpcsched.perf.goodput TRACE_ROOT   "
                 "(e.g. ../shared/data/pollux/traces)")
    print(json.dumps(build_priors(sys.argv[1])["applications"], indent=1))
