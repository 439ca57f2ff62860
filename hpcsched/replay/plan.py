"""What a replay submits and when: one ``hpcsub`` command line per workload job (pure).

A workload job asks Slurm for the shape the simulator gives it
(:func:`hpcsched.sim.state.job_limits`, which uses :func:`~hpcsched.sim.state.job_shape`):
``nodes x GPUs per node`` for its ``gpus``, and hpcsched's resize limits for its application
(batch sizes from the smaller of the application's base batch and the job's up to the larger of
the application's largest validated batch and the job's, the application's per-GPU micro-batch
limit, ``sqrt`` learning-rate scaling, 1 node up to the nodes its largest batch can feed). The
job starts at the workload's batch size (``--hpcsched-batch-size``), which is also what hpcsub
records as its base batch size (the simulator's base is the application's M0; the emulated
application counts progress in Pollux's units whatever the base, so only the learning-rate
factor, which the emulation does not use, differs).

A job is submitted ``submit_time x scale`` seconds after the replay's start and runs the
emulated application with ``--application`` (also given to hpcsub as ``--hpcsched-application``,
so that the daemon knows the job's application as the simulator does: its throughput priors and
GPU-variability class), ``--scale`` (its work x scale, ``SimConfig.work_scale``) and a
per-job seed (the replay's seed + the job's index). Its ``--time`` is twice its scaled run time
alone at the slowest node count its limits allow (at its starting batch), plus 10 minutes.

Another user's plain job (:attr:`~hpcsched.sim.WorkloadJob.rigid`, ``hpcsched replay
--rigid-fraction``) is submitted with ``sbatch`` itself, hpcsched not involved: its submitted
nodes x GPUs, held by a ``sleep`` of its scaled run time alone at that size and batch (Pollux's
physics, as the simulator runs it), so the real run and its simulation give it the same fixed
size and duration.

Units: seconds, GPUs, samples; ``--time`` in minutes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcsched.protocol.kinds import Granularity
from hpcsched.protocol.limits import JobLimits
from hpcsched.replay import ReplayError
from hpcsched.sim import WorkloadJob

#: margin on the time limit: twice the job's run time alone at its slowest size, plus this
TIME_MARGIN = 600.0


@dataclass(frozen=True)
class ClusterShape:
    """The cluster a replay runs on: ``nodes`` x ``gpus_per_node`` (from Slurm), and the
    partition jobs are submitted to (None: Slurm's default)."""

    nodes: int
    gpus_per_node: int
    partition: str | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class PlannedJob:
    """One job of a replay.

    Attributes:
        index: position in the workload (0-based, submit order).
        name: the workload's job name; ``job_name`` the Slurm job name (``replay-<name>``, made of
            letters, digits, ``-_.``).
        submit_at: seconds after the replay's start (workload submit time x scale).
        gpus, nodes, gpus_per_node: what the job asks for (``gpus = nodes x gpus_per_node``).
        batch_size: the global batch it starts with (samples); ``limits`` its resize limits.
        seed: the emulated application's seed; ``time_limit`` Slurm's ``--time`` in minutes.
        argv: the ``hpcsub`` arguments (without ``hpcsub`` itself); for a ``rigid`` job (another
            user's plain job), ``sbatch``'s: it holds its GPUs for its run time alone at its
            submitted size and batch (:func:`plain_argv`), as the simulator's rigid job.
    """

    index: int
    name: str
    job_name: str
    application: str
    submit_at: float
    gpus: int
    nodes: int
    gpus_per_node: int
    batch_size: int
    limits: JobLimits
    seed: int
    time_limit: int
    argv: tuple[str, ...]
    rigid: bool = False

    @property
    def program(self) -> str:
        """What submits it: ``hpcsub``, or ``sbatch`` for another user's plain job."""
        return "sbatch" if self.rigid else "hpcsub"


def check_emulatable(jobs: Sequence[WorkloadJob]) -> None:
    """Raise :class:`ReplayError` unless every job is a Pollux application's convergence job
    (a fixed-work job of a PAL/Blox trace has no emulated application)."""
    from hpcsched.sim.physics import APPLICATIONS

    if not jobs:
        raise ReplayError("the workload has no jobs")
    for wj in jobs:
        if wj.iterations is not None:
            raise ReplayError(f"job {wj.name} is a fixed-work job (a PAL/Blox trace): only Pollux "
                              "applications' convergence jobs can be emulated")
        if wj.application not in APPLICATIONS:
            raise ReplayError(f"job {wj.name}: no emulated application {wj.application!r} "
                              f"(known: {', '.join(APPLICATIONS)})")


def slurm_job_name(name: str) -> str:
    """``replay-<name>`` with every character other than letters, digits and ``-_.`` as ``_``."""
    return "replay-" + re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def run_seconds(application: str, limits: JobLimits, batch_size: int, nodes: int) -> float:
    """Seconds the whole (unscaled) job takes alone on ``nodes`` nodes at the batch nearest
    ``batch_size`` (Pollux's physics, :mod:`hpcsched.sim.physics`: each epoch's progress over
    progress per second = gain / step time)."""
    from hpcsched.sim.physics import application as physics

    app = physics(application)
    cfg = limits.fit_batch(batch_size, nodes)
    st = app.step_time((limits.workers_per_node,) * nodes, cfg.local_batch_size,
                       cfg.accumulation_steps)
    t = progress = 0.0
    while progress < app.total_progress:
        epoch = app.epoch_at(progress)
        end = min(app.total_progress, app.epoch_end(epoch))
        t += (end - progress) * st / app.gain(cfg.global_batch_size, epoch)
        progress = end
    return t


def time_limit_minutes(seconds: float, scale: float) -> int:
    """Slurm ``--time`` (minutes) for a job of ``seconds`` of work at full scale: twice its
    scaled run time plus :data:`TIME_MARGIN`, rounded up."""
    return max(1, math.ceil((2.0 * seconds * scale + TIME_MARGIN) / 60.0))


def hpcsub_argv(pj_limits: JobLimits, nodes: int, batch_size: int, *, job_name: str,
                time_limit: int, script: str, application: str, scale: float, seed: int,
                partition: str | None = None, output_dir: str | None = None) -> tuple[str, ...]:
    """The ``hpcsub`` arguments for one job (``--parsable``: sbatch prints the bare job id)."""
    lim = pj_limits
    argv = _slurm_args(nodes, lim.workers_per_node, job_name, time_limit, partition, output_dir)
    argv += ["--hpcsched-batch-size", str(batch_size),
             "--hpcsched-min-batch-size", str(lim.min_batch_size),
             "--hpcsched-max-batch-size", str(lim.max_batch_size),
             "--hpcsched-lr-scaling", lim.lr_scaling]
    # the fewest GPUs: as GPUs where they are not whole nodes (hpcsub takes one or the other)
    argv += (["--hpcsched-min-gpus", str(lim.min_gpu_count)] if lim.min_gpu_count is not None
             else ["--hpcsched-min-nodes", str(lim.min_nodes)])
    argv += ["--hpcsched-max-nodes", str(lim.max_nodes), "--hpcsched-application", application]
    if lim.max_local_batch_size is not None:
        argv += ["--hpcsched-max-local-batch-size", str(lim.max_local_batch_size)]
    argv += [script, "--application", application, "--scale", repr(float(scale)),
             "--seed", str(seed)]
    return tuple(argv)


def plain_argv(nodes: int, gpus_per_node: int, seconds: float, *, job_name: str,
               time_limit: int, partition: str | None = None,
               output_dir: str | None = None) -> tuple[str, ...]:
    """The ``sbatch`` arguments of another user's plain job: ``nodes`` x ``gpus_per_node`` GPUs
    held for ``seconds`` (a ``sleep``: its fixed duration), ``--parsable``."""
    return (*_slurm_args(nodes, gpus_per_node, job_name, time_limit, partition, output_dir),
            f"--wrap=sleep {seconds:.1f}")


def _slurm_args(nodes: int, gpus_per_node: int, job_name: str, time_limit: int,
                partition: str | None, output_dir: str | None) -> list[str]:
    """The sbatch options every replayed job has: ``--parsable``, its name, shape and time
    limit, and the partition and output file when given."""
    argv = ["--parsable", f"--job-name={job_name}", "-N", str(nodes),
            f"--gres=gpu:{gpus_per_node}", f"--time={time_limit}"]
    if partition:
        argv.append(f"--partition={partition}")
    if output_dir:
        argv.append(f"--output={Path(output_dir) / 'slurm-%j.out'}")
    return argv


def make_plan(jobs: Sequence[WorkloadJob], shape: ClusterShape, scale: float, *, script: str,
              seed: int = 0, output_dir: str | None = None,
              granularity: Granularity = Granularity.NODE) -> list[PlannedJob]:
    """One :class:`PlannedJob` per workload job, in submit order, with the shapes and limits the
    simulator gives it at ``granularity`` (the daemon's: at ``"gpu"`` a resizable job may go
    down to 1 GPU, ``--hpcsched-min-gpus 1``).

    Raises:
        ReplayError: ``scale`` not in (0, 1]; a job that cannot be emulated
            (:func:`check_emulatable`) or never fits ``shape`` (the simulator's message).
    """
    from hpcsched.sim.state import SimConfig, SimulationError, job_limits

    if not 0.0 < scale <= 1.0:
        raise ReplayError(f"--scale {scale}: must be in (0, 1]")
    check_emulatable(jobs)
    cfg = SimConfig(nodes=shape.nodes, gpus_per_node=shape.gpus_per_node, granularity=granularity)
    plan = []
    for i, wj in enumerate(jobs):
        try:
            _, _, nodes, limits, batch = job_limits(wj, cfg)
        except SimulationError as exc:
            raise ReplayError(str(exc)) from None
        slowest = max(run_seconds(wj.application, limits, batch, n)
                      for n in range(limits.min_nodes, limits.max_nodes + 1))
        minutes = time_limit_minutes(slowest, scale)
        name = slurm_job_name(wj.name)
        if wj.rigid:
            argv = plain_argv(nodes, limits.workers_per_node, slowest * scale, job_name=name,
                              time_limit=minutes, partition=shape.partition,
                              output_dir=output_dir)
        else:
            argv = hpcsub_argv(limits, nodes, batch, job_name=name, time_limit=minutes,
                               script=script, application=wj.application, scale=scale,
                               seed=seed + i, partition=shape.partition, output_dir=output_dir)
        plan.append(PlannedJob(
            index=i, name=wj.name, job_name=name, application=wj.application,
            submit_at=wj.submit_time * scale, gpus=nodes * limits.workers_per_node, nodes=nodes,
            gpus_per_node=limits.workers_per_node, batch_size=batch, limits=limits,
            seed=seed + i, time_limit=minutes, argv=argv, rigid=wj.rigid))
    return plan
