"""Batch-size arithmetic: global batch size <-> (world size, local batch size, accumulation steps).

Pure functions, no I/O. Units: batch sizes are in samples; world size in workers (one worker
per GPU slot).

The global batch size is ``B = world_size * local_batch_size * accumulation_steps``. A job fixes a
per-GPU limit ``M`` on the local batch size (what fits in GPU memory); above ``world_size * M`` a
global batch is reached by gradient accumulation.

Learning-rate scaling rules, applied to the job's base learning rate, with ``B0`` the global
batch size the job was submitted with:

* ``linear``: ``lr = lr0 * B / B0`` -- Goyal et al., "Accurate, Large Minibatch SGD: Training
  ImageNet in 1 Hour", arXiv:1706.02677, §2.1 ("Linear Scaling Rule").
* ``sqrt``: ``lr = lr0 * sqrt(B / B0)`` -- Krizhevsky, "One weird trick for parallelizing
  convolutional neural networks", arXiv:1404.5997, §5; Hoffer et al., NeurIPS'17, §4.
* ``none``: ``lr = lr0``.

Adaptive rules, for which the job itself turns the factor into the one it applies at every step
from its own gradient-noise estimate (:func:`adaptive_lr_scale`; ``hpcsched.job.scaling``); the
factor hpcsched sends (``lr_scale`` of the control file) is their upper bound, reached when the
gradient is pure noise:

* ``adascale`` (SGD): ``lr = lr0 * r`` with AdaScale's gain ratio ``r`` in ``[1, S]``,
  ``S = B / B0`` -- Johnson et al., "AdaScale SGD: A User-Friendly Algorithm for Distributed
  Training", ICML 2020, §3 (Algorithm 1); as AdaptDL's ``AdaScale`` (Qiao et al., OSDI'21).
  Bound sent: ``S``.
* ``adamscale`` (Adam, AdamW, RMSprop): ``lr = lr0 * sqrt(r)``, AdaptDL's ``AdamScale``
  (``adaptdl/torch/scaling_rules.py``): the square root of the gain, in the spirit of the
  square-root scaling rule that Malladi et al. derive for adaptive methods ("On the SDEs and
  Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022, arXiv:2205.10287, §4: at
  ``kappa`` times the batch, ``lr * sqrt(kappa)``, ``1 - beta`` times ``kappa``, ``eps /
  sqrt(kappa)``). The static ``sqrt`` rule is that rule's learning rate for Adam-family
  optimizers; ``hpcsched.job.scaling.adam_square_root_rule`` gives its betas and epsilon.
  Bound sent: ``sqrt(S)``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

LR_RULES = ("linear", "sqrt", "none", "adascale", "adamscale")
#: the rules whose factor the job adapts at every step (module docstring)
ADAPTIVE_LR_RULES = ("adascale", "adamscale")


class BatchSizeError(ValueError):
    """A batch-size configuration that the job's limits forbid."""


@dataclass(frozen=True)
class BatchConfig:
    """How a global batch is cut across workers.

    Attributes:
        world_size: number of workers (GPUs), >= 1.
        local_batch_size: samples per worker per micro-batch, >= 1.
        accumulation_steps: micro-batches per optimizer step, >= 1.
    """

    world_size: int
    local_batch_size: int
    accumulation_steps: int

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step across all workers."""
        return self.world_size * self.local_batch_size * self.accumulation_steps


def lr_scale(rule: str, global_batch_size: int, base_global_batch_size: int) -> float:
    """Learning-rate factor for ``rule`` (see module docstring for the sources).

    Raises:
        ValueError: unknown rule or non-positive batch sizes.
    """
    if global_batch_size <= 0 or base_global_batch_size <= 0:
        raise ValueError("batch sizes must be positive")
    ratio = global_batch_size / base_global_batch_size
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    if rule == "none":
        return 1.0
    if rule == "adascale":
        return ratio  # the bound; the job applies the gain (adaptive_lr_scale)
    if rule == "adamscale":
        return math.sqrt(ratio)
    raise ValueError(f"unknown learning-rate scaling rule {rule!r} (choose from {', '.join(LR_RULES)})")


def adascale_gain(grad_sqr: float, grad_var: float, global_batch_size: float,
                  base_batch_size: float) -> float:
    """AdaScale's gain ratio ``r = (s0 + |G|^2) / (s0 / S + |G|^2)`` at ``S = B / B0``
    (Johnson et al., ICML 2020, §3, eq. for ``r_t``; AdaptDL's ``AdaScale.scale_lr``), with
    ``s0 = tr(Sigma) / B0`` the gradient variance at the base batch size.

    ``grad_sqr`` is ``|G|^2`` and ``grad_var`` is ``tr(Sigma)`` *per sample* (the units of
    :class:`hpcsched.job.gradient_noise.GradientNoiseEstimator`); ``B``, ``B0`` in samples.
    ``r`` is in ``[1, S]`` for ``S >= 1`` (``[S, 1]`` below): 1 without noise, ``S`` with pure
    noise. As AdaptDL does, ``|G|^2`` is clipped at 0 and ``s0`` at ``1e-6``.

    Raises:
        ValueError: non-positive batch sizes.
    """
    if global_batch_size <= 0 or base_batch_size <= 0:
        raise ValueError("batch sizes must be positive")
    scale = global_batch_size / base_batch_size
    var0 = max(grad_var / base_batch_size, 1e-6)
    sqr = max(grad_sqr, 0.0)
    return (var0 + sqr) / (var0 / scale + sqr)


def adaptive_lr_scale(rule: str, grad_sqr: float, grad_var: float, global_batch_size: float,
                      base_batch_size: float) -> float:
    """The factor an adaptive rule (:data:`ADAPTIVE_LR_RULES`) applies now: ``adascale``: the
    gain :func:`adascale_gain`; ``adamscale``: its square root (module docstring).

    Raises:
        ValueError: ``rule`` is not adaptive, or non-positive batch sizes.
    """
    if rule not in ADAPTIVE_LR_RULES:
        raise ValueError(f"{rule!r} is not an adaptive rule ({', '.join(ADAPTIVE_LR_RULES)})")
    gain = adascale_gain(grad_sqr, grad_var, global_batch_size, base_batch_size)
    return gain if rule == "adascale" else math.sqrt(gain)


def split_global_batch(
    global_batch_size: int,
    world_size: int,
    max_local_batch_size: int | None = None,
) -> BatchConfig:
    """Cut ``global_batch_size`` samples across ``world_size`` workers.

    Uses the fewest accumulation steps that keep the local batch within ``max_local_batch_size``
    (fewer micro-batches = better GPU efficiency), then the local batch size that comes nearest
    to the requested global batch. The result's global batch size may differ from the request by
    less than ``world_size * accumulation_steps`` samples when the request does not divide.

    Raises:
        BatchSizeError: ``global_batch_size < world_size`` (some worker would get no sample) or
            non-positive arguments.
    """
    if world_size < 1:
        raise BatchSizeError(f"world size must be >= 1, got {world_size}")
    if global_batch_size < world_size:
        raise BatchSizeError(
            f"global batch size {global_batch_size} is smaller than the world size {world_size}"
        )
    if max_local_batch_size is not None and max_local_batch_size < 1:
        raise BatchSizeError(f"per-GPU batch-size limit must be >= 1, got {max_local_batch_size}")
    per_worker = global_batch_size / world_size
    accumulation = 1
    if max_local_batch_size is not None:
        accumulation = max(1, math.ceil(per_worker / max_local_batch_size))
    local = max(1, round(per_worker / accumulation))
    if max_local_batch_size is not None:
        local = min(local, max_local_batch_size)
    return BatchConfig(world_size, local, accumulation)


def fit_batch(
    requested_global: int,
    world_size: int,
    *,
    min_global: int | None = None,
    max_global: int | None = None,
    max_local_batch_size: int | None = None,
) -> BatchConfig:
    """The batch configuration nearest ``requested_global`` that respects a job's limits.

    A global batch is ``world_size * k`` with ``k = local * accumulation`` samples per worker.
    ``k`` ranges over ``[ceil(min_global / world_size), floor(max_global / world_size)]``; the
    search starts at the ``k`` nearest the request and moves outward, preferring a ``k`` that
    splits into ``ceil(k / max_local_batch_size)`` equal micro-batches (the fewest accumulation
    steps); if none in range does, the fewest equal micro-batches of at most the per-GPU limit
    for the nearest ``k`` (always possible: ``k`` micro-batches of one sample).

    Raises:
        BatchSizeError: no configuration at ``world_size`` satisfies the limits (e.g.
            ``max_global < world_size``).
    """
    if world_size < 1:
        raise BatchSizeError(f"world size must be >= 1, got {world_size}")
    if max_local_batch_size is not None and max_local_batch_size < 1:
        raise BatchSizeError(f"per-GPU batch-size limit must be >= 1, got {max_local_batch_size}")
    kmin = max(1, -(-(min_global or 1) // world_size))
    kmax = max_global // world_size if max_global is not None else None
    if kmax is not None and kmax < kmin:
        raise BatchSizeError(
            f"no global batch size fits: {world_size} GPUs need a multiple of {world_size} "
            f"samples in [{min_global or 1}, {max_global}]"
        )
    k0 = max(kmin, round(requested_global / world_size))
    if kmax is not None:
        k0 = min(k0, kmax)
    if max_local_batch_size is None:
        return BatchConfig(world_size, k0, 1)
    for k in itertools.islice(_outward(k0, kmin, kmax), 4096):
        accumulation = -(-k // max_local_batch_size)
        if k % accumulation == 0:
            return BatchConfig(world_size, k // accumulation, accumulation)
    accumulation = next(a for a in range(-(-k0 // max_local_batch_size), k0 + 1) if k0 % a == 0)
    return BatchConfig(world_size, k0 // accumulation, accumulation)


def _outward(k0: int, lo: int, hi: int | None):
    """k0, k0+1, k0-1, k0+2, k0-2, ... within [lo, hi] (hi None = unbounded)."""
    yield k0
    d = 1
    while True:
        up, down = k0 + d, k0 - d
        up_ok = hi is None or up <= hi
        down_ok = down >= lo
        if not (up_ok or down_ok):
            return
        if up_ok:
            yield up
        if down_ok:
            yield down
        d += 1
