"""What several policies share: the GPUs they may hand out, the sizes a job may have at the
snapshot's granularity, and first-come-first-served admission of pending jobs."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView
from hpcsched.protocol.kinds import Granularity, SlurmState


def capacity(snapshot: ClusterSnapshot) -> int:
    """GPUs hpcsched may hand out: usable nodes' GPUs minus those of unmanaged jobs."""
    other = dict(snapshot.other_gpus_allocated)
    return sum(max(0, n.gpus - other.get(n.name, 0)) for n in snapshot.nodes if n.usable)


def running(snapshot: ClusterSnapshot) -> list[JobView]:
    """The running jobs, in snapshot order."""
    return [j for j in snapshot.jobs if j.state == SlurmState.RUNNING]


def pending_fifo(snapshot: ClusterSnapshot) -> list[JobView]:
    """The pending jobs, first submitted first (ties: job id)."""
    return sorted((j for j in snapshot.jobs if j.state == SlurmState.PENDING),
                  key=lambda j: (j.submit_time, j.job_id))


def admit_fifo(jobs: Iterable[JobView], free: int, size: Callable[[JobView], int],
               backfill: bool = True) -> tuple[list[JobView], list[tuple[JobView, int]]]:
    """Walk ``jobs`` in order and admit each whose ``size(job)`` GPUs fit in what is left of
    ``free``. With ``backfill``, one that does not fit waits and the walk goes on, so a smaller
    job behind it may start (no head-of-line blocking, as Slurm's backfill); without, the walk
    stops at the first job that does not fit and every job behind it waits too (strict FIFO,
    as the FIFO scheduler of PAL's artifact, Jain et al., SC'24).

    Returns:
        ``(admitted, waiting)``; each waiting job with the GPUs that were left when its turn came.
    """
    admitted: list[JobView] = []
    waiting: list[tuple[JobView, int]] = []
    blocked = False
    for j in jobs:
        need = size(j)
        if need <= free and not blocked:
            admitted.append(j)
            free -= need
        else:
            waiting.append((j, free))
            blocked = not backfill
    return admitted, waiting


def resizable_by_gpu(job: JobView, snapshot: ClusterSnapshot | None) -> bool:
    """``snapshot`` is GPU-granular and ``job`` may run on more than one GPU count
    (``min_gpus < max_gpus``)."""
    return snapshot is not None and snapshot.granularity == Granularity.GPU and job.min_gpus < job.max_gpus


def min_gpus(job: JobView, snapshot: ClusterSnapshot | None = None) -> int:
    """The fewest GPUs ``job`` may run on: its minimum nodes, whole; its limits' fewest GPUs
    (:attr:`~hpcsched.protocol.limits.JobLimits.min_gpus`: ``--hpcsched-min-gpus``, else its
    minimum nodes' GPUs) when ``snapshot`` is GPU-granular and the job is resizable."""
    if resizable_by_gpu(job, snapshot):
        return job.min_gpus
    return job.min_nodes * job.workers_per_node


def max_gpus(job: JobView) -> int:
    """The most GPUs ``job`` may run on: its maximum nodes x its workers per node (at either
    granularity: a GPU-granular job packs them onto fewer, fuller nodes)."""
    return job.max_nodes * job.workers_per_node


def gpu_counts(job: JobView, snapshot: ClusterSnapshot) -> range:
    """The GPU counts a plan may give ``job``, smallest first: multiples of its workers per
    node within its node limits at ``"node"`` granularity; every count from its fewest GPUs
    (:func:`min_gpus`) to its maximum at ``"gpu"`` granularity (a job whose limits fix its size
    keeps it at either)."""
    if resizable_by_gpu(job, snapshot):
        return range(job.min_gpus, max_gpus(job) + 1)
    wpn = job.workers_per_node
    return range(job.min_nodes * wpn, job.max_nodes * wpn + 1, wpn)


def nodes_spanned(job: JobView, gpus: int, snapshot: ClusterSnapshot) -> int:
    """Nodes ``gpus`` GPUs of ``job`` take: ``gpus / workers_per_node`` at node granularity;
    packed onto full nodes (``ceil(gpus / snapshot.node_size)``) at GPU granularity. 0 for 0 GPUs."""
    if gpus <= 0:
        return 0
    per = snapshot.node_size if snapshot.granularity == Granularity.GPU else job.workers_per_node
    return -(-gpus // max(1, per))


def target(job: JobView, gpus: int, batch_size: int, reason: str, snapshot: ClusterSnapshot,
           predicted_goodput: float | None = None, placement: tuple[str, ...] = ()) -> JobTarget:
    """The target giving ``job`` ``gpus`` GPUs (0: none) at global ``batch_size``, at the
    snapshot's granularity (:func:`nodes_spanned`; ``JobTarget.gpus`` set when GPU-granular)."""
    gpu = snapshot.granularity == Granularity.GPU
    return JobTarget(job.job_id, nodes_spanned(job, gpus, snapshot), batch_size, reason,
                     placement, predicted_goodput, gpus if gpu else None)
