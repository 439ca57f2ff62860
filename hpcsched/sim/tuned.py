"""Tuned batch sizes: the global batch size a user who tuned a job for its GPU count would submit.

Source: the Pollux artifact's workload generator (Qiao et al., OSDI'21; github.com/petuum/adaptdl,
branch ``osdi21-artifact``, ``simulator/workload.py`` with ``Application.get_configurations`` in
``simulator/applications.py``) gives each job of its "TunedJobs" workloads, for its number of
replicas ``n`` placed on 4-GPU nodes, the batch size among the application's validated ones
(``traces/<app>/validation-<B>.csv``) that minimises the time to train the application to its
end at ``n`` GPUs, with gradient accumulation above the per-GPU limit and no batch whose per-GPU
share is under the smallest measured local batch. The code here is our own and computes that time
with the simulator's physics (:mod:`hpcsched.sim.physics`) and the batch configuration the engine
will run (:meth:`hpcsched.protocol.limits.JobLimits.fit_batch`), so the choice is the best one in
this simulator among the candidates:

    time(B) = sum over epochs e of (P(e) - P(e-1)) / gain(B, e) * step_time(placement, m, s)

with ``P(e)`` the progress at the end of epoch ``e`` (``P(-1) = 0``), ``gain`` the statistical
efficiency (progress per step at global batch ``B``), and ``(m, s)`` the local batch and
accumulation steps of ``B`` on ``n`` GPUs. The placement is the shape Slurm gives ``n`` GPUs
(:func:`hpcsched.sim.engine.job_shape`: one node when they fit, else whole nodes). *Departure:*
the artifact counts iterations of the measured run at ``B`` (its ``iteration`` column); our
physics derives them from the gradient statistics, as the engine does while the job runs. And
besides the validated sizes we try ``n x k`` for per-GPU shares ``k`` on a geometric grid (4 per
doubling) within the application's batch range: Pollux only ever sized jobs at 1, 2, 4, 6, 8, 12,
... GPUs, where the validated sizes split evenly; on 3 GPUs (a Philly count) a validated size
needs uneven accumulation and a multiple of 3 trains sooner (yolov3: 24 samples, not 64).

Units: samples (batch sizes), seconds, GPUs.
"""

from __future__ import annotations

from functools import lru_cache

from hpcsched.protocol.batching import BatchConfig, BatchSizeError, fit_batch
from hpcsched.sim.physics import TRACES, Application, application

#: GPUs per node the tuning assumes (Pollux's generator: "a cluster of 16 nodes each with 4 GPUs").
TUNING_GPUS_PER_NODE = 4

#: Per-GPU shares tried per doubling, besides the validated batch sizes.
GRID_STEPS_PER_DOUBLING = 4

__all__ = ["TUNING_GPUS_PER_NODE", "candidate_batch_sizes", "training_time", "tuned_batch_size",
           "validated_batch_sizes"]


def validated_batch_sizes(app: str) -> tuple[int, ...]:
    """The global batch sizes (samples) of ``app``'s ``validation-<B>.csv`` traces, ascending.

    Raises:
        hpcsched.sim.physics.PhysicsError: unknown application.
    """
    application(app)   # raises on an unknown application
    return tuple(sorted(int(p.stem.rsplit("-", 1)[-1])
                        for p in (TRACES / app).glob("validation-*.csv")))


def candidate_batch_sizes(app: str, gpus: int) -> tuple[int, ...]:
    """Global batch sizes (samples, ascending, before fitting to the GPUs) tried for ``app`` on
    ``gpus`` GPUs: the validated ones, and ``gpus x k`` for ``k`` from ``ceil(base / gpus)`` to
    ``floor(max / gpus)`` samples per GPU on a geometric grid (:data:`GRID_STEPS_PER_DOUBLING`
    per doubling, the top included), ``base`` and ``max`` the application's batch range.

    Raises:
        hpcsched.sim.physics.PhysicsError: unknown application.
    """
    a = application(app)
    kmin, kmax = -(-a.init_batch_size // gpus), a.max_batch_size // gpus
    shares = {kmax} if kmax >= kmin else set()
    i = 0
    while kmax >= kmin and (k := round(kmin * 2 ** (i / GRID_STEPS_PER_DOUBLING))) <= kmax:
        shares.add(k)
        i += 1
    return tuple(sorted(set(validated_batch_sizes(app)) | {gpus * k for k in shares}))


def _placement(gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    from hpcsched.sim.engine import job_shape  # engine pulls in the policies: import on use

    nodes, per_node = job_shape(gpus, gpus_per_node)
    return (per_node,) * nodes


def _config(a: Application, batch: int, gpus: int) -> BatchConfig:
    return fit_batch(batch, gpus, min_global=a.init_batch_size, max_global=a.max_batch_size,
                     max_local_batch_size=a.max_local_bsz)


def training_time(app: str, gpus: int, batch_size: int,
                  gpus_per_node: int = TUNING_GPUS_PER_NODE) -> float:
    """Seconds to train ``app`` to its end on ``gpus`` GPUs (median GPUs, no restarts) at global
    ``batch_size`` as the engine runs it (fitted to the GPUs: module docstring's ``time(B)``).

    Raises:
        hpcsched.protocol.batching.BatchSizeError: no batch configuration fits ``gpus`` GPUs.
        hpcsched.sim.physics.PhysicsError: unknown application.
    """
    a = application(app)
    cfg = _config(a, batch_size, gpus)
    step = a.step_time(_placement(gpus, gpus_per_node), cfg.local_batch_size,
                       cfg.accumulation_steps)
    total, done = 0.0, 0.0
    for epoch in range(a.max_epochs):
        end = a.epoch_end(epoch)
        total += (end - done) / a.gain(cfg.global_batch_size, epoch) * step
        done = end
    return total


@lru_cache(maxsize=None)
def tuned_batch_size(app: str, gpus: int, gpus_per_node: int = TUNING_GPUS_PER_NODE) -> int:
    """The global batch size (samples) that trains ``app`` soonest on ``gpus`` GPUs: the
    candidate (:func:`candidate_batch_sizes`) with the least :func:`training_time`, fitted to the
    GPUs as the engine fits it (ties: the smaller batch). Candidates whose per-GPU share is under the application's
    smallest measured local batch are left out (as Pollux's generator does) unless none is left.
    Cached per ``(app, gpus, gpus_per_node)``.

    Raises:
        ValueError: ``gpus`` under 1.
        hpcsched.protocol.batching.BatchSizeError: no batch size fits ``gpus`` GPUs.
        hpcsched.sim.physics.PhysicsError: unknown application.
    """
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    a = application(app)
    sizes = candidate_batch_sizes(app, gpus)
    usable = [b for b in sizes if b >= gpus * a.min_local_bsz] or list(sizes)
    best: tuple[float, int] | None = None
    for b in usable:
        try:
            fitted = _config(a, b, gpus).global_batch_size
        except BatchSizeError:
            continue
        t = training_time(app, gpus, fitted, gpus_per_node)
        if best is None or t < best[0]:
            best = (t, fitted)
    if best is None:
        raise BatchSizeError(f"{app}: no batch size in [{a.init_batch_size}, {a.max_batch_size}] "
                             f"fits {gpus} GPUs")
    return best[1]
