"""The simulator's job physics for a job that really runs: the emulated application
(``jobscripts/examples/emulated.py``) trains on the real elastic API, sleeps what
:mod:`hpcsched.sim.physics` says its compute takes, and counts progress as the simulator does.

One optimizer step of a Pollux application at placement ``p`` (GPUs per node), ``accum``
micro-batches of ``m`` samples per GPU, global batch ``M = sum(p) * m * accum``:

* takes :meth:`Emulation.step_seconds` = ``Application.step_time(p, m, accum)`` seconds (the
  simulator's ``SimJob.rate`` on median GPUs, no variability);
* advances the job by :meth:`Emulation.gain` = ``Application.gain(M, epoch_at(progress /
  scale))`` progress units (Pollux's unit: steps at the base batch size ``M0``; statistical
  efficiency included): at a ``scale`` every epoch is ``scale`` x as long, so the job goes
  through all the application's epochs (``SimJob.epoch_at``);
* the job ends at :attr:`Emulation.total` = ``scale`` x ``total_progress``, exactly
  ``SimJob.total`` under ``SimConfig(work_scale=scale)``;
* work in samples (what the job reports, the simulator's ``SimJob.remaining_samples``):
  progress x ``M0``.

Gradient noise: the emulated model's per-sample gradient is ``G + sigma z`` with ``|G|^2 =
grad_sqr`` and ``z`` standard normal in ``dim`` dimensions, ``sigma^2 dim = tr(Sigma) = grad_var
x M0``: the physics' statistics are Pollux's, at the base batch size (``grad_var`` is the
variance of a gradient of ``M0`` samples), and the elastic API measures ``tr(Sigma)`` per sample
(:mod:`hpcsched.job.gradient_noise`). :meth:`Emulation.gradient_sum` gives a micro-batch's sum
of per-sample gradients, drawn at once (the sum of ``n`` standard normals is ``sqrt(n)`` times
one) from a generator seeded by the micro-batch's first sample, its size and the data epoch.
The job's estimates are unbiased, with the real estimator's error in ``dim`` dimensions: a
step's ``tr(Sigma)`` is within about ``sqrt(2 / dim)`` (2%), its ``|G|^2`` within about
``sqrt(2 / dim)`` x noise scale / batch, large for ncf and bert, whose noise scale is far above
their batch (``tests/test_emulated.py``); the simulator uses the exact statistics.

Units: seconds, samples, GPUs, Pollux progress units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcsched.sim.physics import Application, PhysicsError, application

#: smallest emulated data set (samples): its permutation costs about 0.5 ms a step
MIN_DATASET = 2 ** 16


@dataclass(frozen=True)
class Emulation:
    """One Pollux application's physics at a work ``scale`` (module docstring).

    Attributes:
        app: the application (:func:`hpcsched.sim.physics.application`).
        scale: factor on its work, in ``(0, 1]``.
        dim: dimensions of the synthetic gradient.

    Raises:
        ValueError: ``scale`` outside ``(0, 1]`` or ``dim < 2``.
    """

    app: Application
    scale: float = 1.0
    dim: int = 4096

    def __post_init__(self):
        if not 0.0 < self.scale <= 1.0:
            raise ValueError(f"scale must be in (0, 1], got {self.scale!r}")
        if self.dim < 2:
            raise ValueError(f"dim must be >= 2, got {self.dim}")

    @classmethod
    def of(cls, name: str, scale: float = 1.0, dim: int = 4096) -> Emulation:
        """The emulation of application ``name``.

        Raises:
            PhysicsError: unknown application. ValueError: bad ``scale`` or ``dim``.
        """
        return cls(application(name), scale, dim)

    @property
    def base_batch_size(self) -> int:
        """``M0``, samples: the unit of progress and of the gradient statistics."""
        return self.app.init_batch_size

    @property
    def total(self) -> float:
        """Progress at which the job ends (``SimJob.total`` at ``work_scale = scale``)."""
        return self.scale * self.app.total_progress

    def grad_noise_smoothing(self, unscaled: float = 0.999) -> float:
        """The gradient-noise estimator's smoothing per step that gives the job, whose epochs
        are ``scale`` x as long, the memory in epochs that ``unscaled`` gives an unscaled job:
        ``1 - (1 - unscaled) / scale``, at least 0. Without it a scaled job's estimate would
        lag ``1 / scale`` x further behind its statistics than a real job's (measured:
        docs/design-notes.md, "sim/emulate.py")."""
        return max(0.0, 1.0 - (1.0 - unscaled) / self.scale)

    def samples(self, progress: float) -> float:
        """Work in samples of ``progress`` (the unit of ``SimJob.remaining_samples``)."""
        return progress * self.base_batch_size

    def step_seconds(self, placement: tuple[int, ...], global_samples: float,
                     accum: int = 1) -> float:
        """Seconds of one optimizer step of ``global_samples`` samples over ``accum``
        micro-batches at ``placement`` (GPUs per node); a full step's local batch is
        ``global_samples / (sum(placement) * accum)``.

        Raises:
            PhysicsError: an empty placement.
        """
        gpus = sum(placement)
        if gpus < 1:
            raise PhysicsError(f"empty placement {placement!r}")
        accum = max(1, int(accum))
        return self.app.step_time(tuple(placement), global_samples / (gpus * accum), accum)

    def gain(self, global_samples: float, progress: float) -> float:
        """Progress units one step of ``global_samples`` samples makes at ``progress``."""
        return self.app.gain(global_samples, self.epoch_at(progress))

    def epoch_at(self, progress: float) -> int:
        """The application's epoch at ``progress``, epochs ``scale`` x as long
        (:meth:`Application.epoch_at`, as ``SimJob.epoch_at``)."""
        return self.app.epoch_at(progress, self.scale)

    def grad_stats(self, global_batch: float, progress: float) -> tuple[float, float]:
        """``(|G|^2, tr(Sigma))`` at ``progress`` and ``global_batch``: the physics'
        ``(grad_sqr, grad_var x M0)``, ``tr(Sigma)`` per sample as the elastic API measures it."""
        sqr, var = self.app.grad_stats(global_batch, self.epoch_at(progress))
        return sqr, var * self.base_batch_size

    def gradient_sum(self, stats: tuple[float, float], first: int, n: int, epoch: int,
                     seed: int = 0) -> np.ndarray:
        """Sum over ``n`` samples of their gradients ``G + sigma z_i`` (float64, ``(dim,)``),
        ``stats`` = :meth:`grad_stats`; ``G`` points along the diagonal. Deterministic in
        ``(seed, epoch, first, n)``: ``first`` is the micro-batch's first sample index, which
        names it within a data epoch."""
        sqr, trace = stats
        g = np.full(self.dim, np.sqrt(max(sqr, 0.0) / self.dim))
        rng = np.random.default_rng([seed, epoch, first, n])
        z = rng.standard_normal(self.dim)
        return n * g + np.sqrt(max(trace, 0.0) / self.dim * n) * z

    def dataset_size(self, batch_size: int) -> int:
        """Samples of the emulated data set: the least power of two >= :data:`MIN_DATASET` and
        >= 4 x the larger of ``batch_size`` and the application's largest batch, so that a short
        last step of a data epoch (:meth:`step_seconds`, :meth:`gain` take its real size) is
        rare."""
        need = max(MIN_DATASET, 4 * max(int(batch_size), self.app.max_batch_size))
        return 1 << (need - 1).bit_length()

    def data_epochs(self, dataset_size: int, max_batch_size: int) -> int:
        """Data epochs that outlast the work at any batch size up to ``max_batch_size``: a step
        of ``M`` samples gains at least ``min(1, M / M0)`` (Pollux's gain is between
        ``min(1, r)`` and ``max(1, r)``, ``r = M / M0``), so the work takes at most
        ``total x max(M, M0)`` samples; one epoch more for the short steps."""
        most = self.total * max(int(max_batch_size), self.base_batch_size)
        return int(most // dataset_size) + 2

    def step_table(self, max_gpus: int, gpus_per_node: int, points: int = 12) -> dict:
        """The physics a torch-free stand-in job needs (:mod:`hpcsched.job.standin`), as plain
        JSON: for every GPU count ``1..max_gpus``, packed ``gpus_per_node`` to a node,
        ``[local_bsz, step_s, sync_s]`` at ``points`` local batch sizes spaced geometrically
        over the application's measured range (:meth:`Application.step_sync_time`); the
        stand-in interpolates between them. Also ``M0`` (``base_batch_size``, samples) and the
        gradient statistics at ``M0`` in the first epoch (``grad_sqr``, ``grad_var`` per sample).

        Raises:
            ValueError: ``max_gpus``, ``gpus_per_node`` or ``points`` < 1 (``points`` < 2).
        """
        if max_gpus < 1 or gpus_per_node < 1 or points < 2:
            raise ValueError(f"need max_gpus, gpus_per_node >= 1 and points >= 2, got "
                             f"{max_gpus}, {gpus_per_node}, {points}")
        lo, hi = self.app.min_local_bsz, max(self.app.max_local_bsz, self.app.min_local_bsz + 1)
        grid = sorted({max(1, round(lo * (hi / lo) ** (i / (points - 1)))) for i in range(points)})
        steps = {}
        for g in range(1, max_gpus + 1):
            placement = (gpus_per_node,) * (g // gpus_per_node) + ((g % gpus_per_node,) if g % gpus_per_node else ())
            steps[str(g)] = [[m, *self.app.step_sync_time(placement, m)] for m in grid]
        sqr, var = self.grad_stats(self.base_batch_size, 0.0)
        return {"application": self.app.name, "base_batch_size": self.base_batch_size,
                "grad_sqr": sqr, "grad_var": var, "steps": steps}

