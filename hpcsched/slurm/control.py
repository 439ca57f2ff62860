"""The Slurm operations the resize mechanism needs, behind one small interface.

:class:`SlurmControl` is what :class:`hpcsched.daemon.actuator.Actuator` acts through: look at
one job, ``scontrol update`` it, requeue, hold, release and cancel it. :class:`CLISlurmControl`
implements it with Slurm's commands (:mod:`hpcsched.slurm`); tests give the actuator a fake that
records the calls. The two recipes the mechanism needs on top (:func:`resize_pending_job`,
:func:`set_start_time`) take any :class:`SlurmControl`, so the fake sees the exact updates.

Every operation raises :class:`hpcsched.slurm.SlurmUnavailable` when the controller does not
answer and :class:`hpcsched.slurm.SlurmError` when it refuses (``str()`` is Slurm's message).
"""

from __future__ import annotations

from typing import Protocol

from hpcsched import slurm


class SlurmControl(Protocol):
    """The operations on one job that resizing needs (``job_id``: Slurm's job id)."""

    def job(self, job_id: str) -> slurm.JobInfo | None:
        """Slurm's view of the job, or None once Slurm has forgotten it."""

    def update(self, job_id: str, **fields: object) -> None:
        """``scontrol update JobId=<id> Key=Value ...``."""

    def requeue(self, job_id: str) -> None:
        """``scontrol requeue``: a running job back to PENDING (its restart count goes up)."""

    def hold(self, job_id: str) -> None:
        """``scontrol hold``: a pending job is not started until released."""

    def release(self, job_id: str) -> None:
        """``scontrol release``: undo a hold."""

    def cancel(self, *job_ids: str) -> None:
        """``scancel`` of every job given, in one command: a job Slurm refuses does not stop
        the others (scancel(1)); the error names each refused one (``... on job id <id>: ...``).

        Raises:
            SlurmUnavailable: the controller did not answer.
            SlurmError: Slurm refused one or more of them.
        """


class CLISlurmControl:
    """:class:`SlurmControl` over Slurm's commands; ``timeout``: seconds per command."""

    def __init__(self, timeout: float = 20.0):
        self.timeout = timeout

    def job(self, job_id: str) -> slurm.JobInfo | None:
        return slurm.job_info(job_id, timeout=self.timeout)

    def update(self, job_id: str, **fields: object) -> None:
        slurm.update_job(job_id, timeout=self.timeout, **fields)

    def requeue(self, job_id: str) -> None:
        slurm.requeue(job_id, timeout=self.timeout)

    def hold(self, job_id: str) -> None:
        slurm.run(["scontrol", "hold", str(job_id)], timeout=self.timeout)

    def release(self, job_id: str) -> None:
        slurm.run(["scontrol", "release", str(job_id)], timeout=self.timeout)

    def cancel(self, *job_ids: str) -> None:
        if job_ids:
            slurm.run(["scancel", *map(str, job_ids)], timeout=self.timeout)


def resize_pending_job(control: SlurmControl, job_id: str, nodes: int, workers_per_node: int,
                       placement: tuple[str, ...] = (), cpus_per_task: int = 1,
                       gpus_per_node: int | None = None) -> None:
    """Set a PENDING job's size: ``scontrol update NumNodes=<n>-<n> NumTasks=<n * wpn>
    NumCPUs=<tasks * cpus_per_task> ReqNodeList=<nodes>``, and ``TresPerNode=gres:gpu:<k>``
    with ``gpus_per_node`` (measured on 22.05: a job submitted with ``--ntasks-per-node=4
    --gres=gpu:4``, so updated to 1 node, 2 tasks and ``gres:gpu:2``, ran on 2 GPUs of the
    node asked for; its ``SLURM_NTASKS_PER_NODE`` stays 4, so the launcher's ``srun`` is
    always explicit).

    Measured on Slurm 22.05: ``NumNodes=3`` alone is refused ("Node count specification
    invalid") for a job submitted with ``-N 2``, whose node range is 2-2; the range form sets
    both bounds. ``NumTasks`` must follow, or ``--ntasks-per-node`` no longer fits.
    ``ReqNodeList`` in the same update steers the job onto the placement's nodes (Slurm still
    picks the GPUs within each node). Without a placement an earlier one is cleared.
    ``NumCPUs`` must follow a shrink: a job submitted with ``-N 2 --ntasks-per-node=2`` keeps
    ``NumCPUs=4`` and, set to one node, stays pending forever with ``BadConstraints``
    ("Requested node configuration is not available"; measured). A requeued job returns to its
    submitted node count unless this is done while it is PENDING.
    """
    tasks = nodes * workers_per_node
    gres = {"TresPerNode": f"gres:gpu:{gpus_per_node}"} if gpus_per_node else {}
    control.update(job_id, NumNodes=f"{nodes}-{nodes}", NumTasks=tasks,
                   NumCPUs=tasks * cpus_per_task,
                   ReqNodeList=",".join(placement) if placement else "", **gres)


def set_start_time(control: SlurmControl, job_id: str, when: str) -> bool:
    """``scontrol update StartTime=<when>`` (``now``, ``now+2``) on a PENDING job; returns False
    when the job has started meanwhile (Slurm: "no longer pending"), which is not an error.

    A requeued job waits 121 s unless it gets a new StartTime; the update is lost if sent while
    the job is still COMPLETING, and an update wakes the scheduler at once where a begin time
    that merely passes waits for the next periodic pass (Slurm 22.05.8, measured).
    """
    try:
        control.update(job_id, StartTime=when)
    except slurm.SlurmError as exc:
        if isinstance(exc, slurm.SlurmUnavailable) or "no longer pending" not in str(exc):
            raise
        return False
    return True


__all__ = ["CLISlurmControl", "SlurmControl", "resize_pending_job", "set_start_time"]
