"""What several policies share: the GPUs they may hand out, and first-come-first-served
admission of pending jobs."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hpcsched.policies.snapshot import ClusterSnapshot, JobView


def capacity(snapshot: ClusterSnapshot) -> int:
    """GPUs hpcsched may hand out: usable nodes' GPUs minus those of unmanaged jobs."""
    other = dict(snapshot.other_gpus_allocated)
    return sum(max(0, n.gpus - other.get(n.name, 0)) for n in snapshot.nodes if n.usable)


def running(snapshot: ClusterSnapshot) -> list[JobView]:
    """The running jobs, in snapshot order."""
    return [j for j in snapshot.jobs if j.state == "RUNNING"]


def pending_fifo(snapshot: ClusterSnapshot) -> list[JobView]:
    """The pending jobs, first submitted first (ties: job id)."""
    return sorted((j for j in snapshot.jobs if j.state == "PENDING"),
                  key=lambda j: (j.submit_time, j.job_id))


def admit_fifo(jobs: Iterable[JobView], free: int, size: Callable[[JobView], int]
               ) -> tuple[list[JobView], list[tuple[JobView, int]]]:
    """Walk ``jobs`` in order and admit each whose ``size(job)`` GPUs fit in what is left of
    ``free``; one that does not fit waits and the walk goes on, so a smaller job behind it may
    start (no head-of-line blocking, as Slurm's backfill).

    Returns:
        ``(admitted, waiting)``; each waiting job with the GPUs that were left when its turn came.
    """
    admitted: list[JobView] = []
    waiting: list[tuple[JobView, int]] = []
    for j in jobs:
        need = size(j)
        if need <= free:
            admitted.append(j)
            free -= need
        else:
            waiting.append((j, free))
    return admitted, waiting


def min_gpus(job: JobView) -> int:
    """The fewest GPUs ``job`` may run on: its minimum nodes, whole."""
    return job.min_nodes * job.workers_per_node
