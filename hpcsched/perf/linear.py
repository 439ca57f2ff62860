"""The linear throughput model, for jobs of an application without a Pollux prior.

Pure, deterministic. Units: seconds, samples, samples/s, GPUs.

One optimizer step at ``g`` GPUs, local batch ``b`` and ``s`` accumulation steps takes::

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

Throughput = ``g * b * s / t``. Jobs of a known application get Pollux's model instead
(:class:`hpcsched.perf.pollux.PolluxModel`; :func:`hpcsched.perf.model.model_for` chooses).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hpcsched.model.snapshot import ProfilePoint
from hpcsched.protocol.batching import BatchConfig

WEIGHT_CAP = 100    # steps: beyond this a profile point's weight in the fit stops growing
ALPHA_PRIOR = 0.2  # share of a step that does not grow with the batch, before a fit is possible


@dataclass(frozen=True)
class ThroughputModel:
    """Fitted linear model for one job (see module docstring)."""

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

    def step_time(self, cfg: BatchConfig, nodes: int = 1) -> float:
        """Seconds per optimizer step (``nodes`` is not used: the measured efficiency per GPU
        count already reflects how the job was laid out)."""
        return cfg.accumulation_steps * (self.alpha + self.beta * cfg.local_batch_size) / self.eff(
            cfg.world_size)

    def throughput(self, cfg: BatchConfig, nodes: int = 1) -> float:
        """Samples/s (0 if the step time is not positive)."""
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
        from scipy.optimize import nnls  # here: kept out of the CLI's start-up
        (alpha, beta), _ = nnls(A, micro * weight)
    else:
        t = float(np.average(micro, weights=weight))
        alpha, beta = ALPHA_PRIOR * t, (1 - ALPHA_PRIOR) * t / local[0]
    if alpha + beta <= 0:
        return None
    return ThroughputModel(float(alpha), float(beta), _efficiency(pts, micro, alpha, beta), fitted)


def _efficiency(pts: list[ProfilePoint], micro: np.ndarray, alpha: float, beta: float
                ) -> tuple[tuple[int, float], ...]:
    """Measured scaling efficiency per GPU count, weighted by steps; the best is 1."""
    by_g: dict[int, list[tuple[float, float]]] = {}
    for p, m in zip(pts, micro):
        pred = alpha + beta * p.local_batch_size
        by_g.setdefault(p.world_size, []).append((min(1.0, pred / m),
                                                  min(WEIGHT_CAP, max(1, p.samples))))
    eff = tuple(sorted((g, float(np.average([e for e, _ in v], weights=[w for _, w in v])))
                       for g, v in by_g.items()))
    # only relative efficiency matters; normalise so the best measured size is 1
    top = max(e for _, e in eff)
    return tuple((g, e / top) for g, e in eff)
