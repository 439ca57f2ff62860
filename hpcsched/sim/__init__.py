"""Trace-driven simulator: replays a workload on a simulated Slurm cluster with the very policies
(and the same reconcile step) the daemon runs.

Modules:

* :mod:`~hpcsched.sim.workload` -- workload files (Pollux, PAL/Blox, Philly samples, the store's
  history) into :class:`WorkloadJob` records.
* :mod:`~hpcsched.sim.physics` -- how fast a job trains in a given placement, from measured data
  (Pollux profiles and convergence curves, PAL's per-GPU variability).
* :mod:`~hpcsched.sim.engine` -- the discrete-event engine and the simulated backend;
  :mod:`~hpcsched.sim.state` (its configuration and a job's state) and
  :mod:`~hpcsched.sim.resize` (shrinks, extension grows) beside it.
* :mod:`~hpcsched.sim.report` -- summary JSON, per-job CSV, plots.

The records below are the interfaces between those modules. Units: seconds (times are from the
start of the trace), samples, GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkloadJob:
    """One job of a workload, as submitted.

    ``application`` names the measured profile that gives the job its physics: one of the Pollux
    applications (``cifar10``, ``imagenet``, ``bert``, ``ncf``, ``deepspeech2``, ``yolov3``),
    whose work is "train to the end of the application's epochs" with statistical efficiency.
    ``iterations`` set means a fixed-work job instead (PAL/Blox traces): it ends after that many
    optimizer steps at its submitted size, each taking ``iteration_time`` seconds on median GPUs
    of one node (the application then only picks the per-GPU variability class).

    ``gpus`` and ``batch_size`` are what the user asked for: the fixed size non-elastic policies
    run the job at (Pollux's "TunedJobs"). ``app_class`` is PAL's variability class (``A``..``D``).

    ``rigid``: another user's plain ``sbatch`` job, not hpcsched's: it runs at its submitted
    GPUs and batch size from start to end, Slurm alone decides when (priority, then backfill),
    and the daemon sees it only as Slurm shows it (a foreign job: its GPUs held, or its request
    pending, :mod:`hpcsched.policies.neighbours`). :func:`hpcsched.sim.workload.make_rigid`
    marks a fraction of a trace's jobs so.

    ``work_claim``, ``speed_claim``, ``speed_claim_from``: a job that lies about itself (issue
    33's "lying job"; :mod:`hpcsched.views.claims` checks): it reports ``work_claim`` x its true
    remaining work, and ``speed_claim`` x its true throughput at ``speed_claim_from`` GPUs and
    more. 1.0: the truth.
    """

    name: str
    submit_time: float
    application: str
    gpus: int
    batch_size: int
    app_class: str
    iterations: float | None = None
    iteration_time: float | None = None
    rigid: bool = False
    work_claim: float = 1.0
    speed_claim: float = 1.0
    speed_claim_from: int = 1


@dataclass(frozen=True)
class JobResult:
    """What happened to one job in a simulation (one row of the per-job CSV).

    ``finish_time`` is ``None`` when the simulation ended (time limit) before the job finished;
    ``jct`` is then ``None`` too. ``gpu_seconds`` counts GPUs held (running or restarting).
    ``rigid``: a plain job of another user (:attr:`WorkloadJob.rigid`).
    """

    name: str
    application: str
    submit_time: float
    start_time: float | None
    finish_time: float | None
    gpu_seconds: float
    restarts: int
    resizes: int
    requested_gpus: int
    max_gpus: int
    #: every resize, in order: ``(time s, round number, GPUs before, GPUs after)``; a
    #: preemption is ``(t, r, gpus, 0)`` and its release ``(t, r, 0, gpus)``
    resize_log: tuple[tuple[float, int, int, int], ...] = ()
    rigid: bool = False

    @property
    def jct(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.submit_time

    @property
    def wait(self) -> float | None:
        """Seconds from submission to the first start (``None``: it never started)."""
        return None if self.start_time is None else self.start_time - self.submit_time


@dataclass(frozen=True)
class SimResult:
    """One simulation: a policy on a workload.

    ``utilization`` is a time series ``(time, gpus_busy, gpus_total)`` sampled at every round.
    ``rounds`` is how many times the policy ran and ``wall_seconds`` the simulator's own run time.
    """

    policy: str
    workload: str
    jobs: tuple[JobResult, ...]
    utilization: tuple[tuple[float, int, int], ...]
    total_gpus: int
    rounds: int
    wall_seconds: float
    params: dict = field(default_factory=dict)
