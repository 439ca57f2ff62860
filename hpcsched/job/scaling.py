"""The learning-rate factor a job hands its training loop (``step.lr_scale``), by the rule of
``hpcsub --hpcsched-lr-scaling`` (:mod:`hpcsched.protocol.batching`: the sources).

Static rules (``linear``, ``sqrt``, ``none``): the factor hpcsched sent, as it is. Adaptive
rules (``adascale``, ``adamscale``): the job computes it at every step from its own smoothed
gradient-noise estimate (:class:`hpcsched.job.gradient_noise.GradientNoiseEstimator`) and the
global batch size in force, relative to the submitted one; 1 until the first estimate.
"""

from __future__ import annotations

import logging
import math

from hpcsched.protocol.batching import ADAPTIVE_LR_RULES, adaptive_lr_scale

log = logging.getLogger(__name__)


class LRScaling:
    """The rule of one job.

    Args:
        rule: one of :data:`hpcsched.protocol.batching.LR_RULES`.
        base_batch_size: the global batch size the job was submitted with (samples); None
            outside hpcsched (then every rule is static: the batch never changes).
    """

    def __init__(self, rule: str = "linear", base_batch_size: int | None = None):
        self.rule, self.base_batch_size = rule, base_batch_size

    @property
    def adaptive(self) -> bool:
        return self.rule in ADAPTIVE_LR_RULES and self.base_batch_size is not None

    @classmethod
    def of_job_dir(cls, jd) -> LRScaling:
        """The rule in the job's ``spec.json`` (a :class:`~hpcsched.protocol.jobdir.JobDir`,
        or None); a job directory without a readable spec (tests) is static."""
        if jd is None:
            return cls()
        try:
            limits = jd.read_spec().limits
        except (OSError, ValueError) as exc:
            log.debug("no spec (%s): static learning-rate factors", exc)
            return cls()
        return cls(limits.lr_scaling, limits.base_batch_size)

    def factor(self, in_force: float, global_batch_size: int, noise) -> float:
        """``step.lr_scale`` for a step at ``global_batch_size`` (samples): ``in_force`` (what
        hpcsched sent) for a static rule; for an adaptive one, from ``noise`` (the job's
        :class:`~hpcsched.job.gradient_noise.GNSTracker`), whose estimate is read with every
        measurement folded in, so that every rank computes the same factor (on a GPU this waits
        for the previous step's few statistics)."""
        if not self.adaptive:
            return in_force
        est = noise.estimate
        if est is None:
            return 1.0
        return adaptive_lr_scale(self.rule, est[0], est[1], global_batch_size,
                                 self.base_batch_size)


def adam_square_root_rule(kappa: float, betas: tuple[float, float],
                          eps: float) -> tuple[tuple[float, float], float]:
    """Malladi et al.'s square-root scaling rule for Adam's other hyperparameters ("On the SDEs
    and Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022, arXiv:2205.10287, §4):
    at ``kappa`` times the batch size, ``1 - beta_i`` times ``kappa`` and ``eps / sqrt(kappa)``
    (the learning rate times ``sqrt(kappa)`` is the ``sqrt`` rule's ``step.lr_scale``).
    A beta is kept at 0 or more (the rule holds for moderate ``kappa``).

    Returns:
        ``((beta1, beta2), eps)`` for the larger batch.

    Raises:
        ValueError: ``kappa <= 0``.
    """
    if kappa <= 0:
        raise ValueError(f"kappa must be > 0, got {kappa}")
    new = tuple(max(0.0, 1.0 - kappa * (1.0 - b)) for b in betas)
    return (new[0], new[1]), eps / math.sqrt(kappa)
