"""The vocabulary both sides share, once: kinds of change, control actions, acknowledgement
states, launcher phases and Slurm's job states; and the daemon's and simulator's settings of how
jobs grow (:class:`GrowMode`) and what plans may ask for (:class:`Granularity`).

Each is a :class:`enum.StrEnum`, so a member compares equal to its string value and is written
to JSON, the store and logs as that string (``ChangeKind.GROW == "grow"``); the strings are the
wire format of ``docs/control-protocol.md`` and the store's ``actions.kind`` column.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class ChangeKind(StrEnum):
    """What a change does to a job (reconcile's output, the actuator's input, the journal's
    ``kind``).

    * ``BATCH``: global batch size only, same GPUs; applied at a step boundary, no restart.
    * ``SHRINK``: fewer nodes, in place (checkpoint, release nodes, re-form the group).
    * ``GROW``: more nodes (checkpoint, requeue, resume at the new size).
    * ``PENDING``: a pending job's size, batch size and node list, set before it starts (also
      the release of a job held after a preemption).
    * ``PREEMPT``: a running job given 0 GPUs: checkpoint, requeue and hold until a plan gives
      it GPUs again (Tiresias, Gu et al., NSDI'19 §4).
    * ``REFORM``: a new layout (GPUs per node) reached without restarting a worker: GPUs added
      through extension allocations (a second Slurm job whose workers join the running job),
      extension GPUs released; a move is both at once (``docs/extensions.md``).
    """

    BATCH = "batch"
    SHRINK = "shrink"
    GROW = "grow"
    PENDING = "pending"
    PREEMPT = "preempt"
    REFORM = "reform"

    @classmethod
    def between(cls, from_nodes: int, to_nodes: int) -> ChangeKind:
        """The kind of a running job's change from ``from_nodes`` to ``to_nodes`` nodes."""
        if to_nodes == 0:
            return cls.PREEMPT
        if to_nodes < from_nodes:
            return cls.SHRINK
        if to_nodes > from_nodes:
            return cls.GROW
        return cls.BATCH


class ControlAction(StrEnum):
    """The ``action`` of a control generation (``control.json``)."""

    CONTINUE = "continue"
    CHECKPOINT_AND_SHRINK = "checkpoint-and-shrink"
    CHECKPOINT_AND_REQUEUE = "checkpoint-and-requeue"
    #: run on the control's ``layout`` without restarting a worker (extension allocations)
    REFORM = "reform"


#: the control action that carries out each change kind
ACTION_FOR_KIND: dict[ChangeKind, ControlAction] = {
    ChangeKind.BATCH: ControlAction.CONTINUE,
    ChangeKind.PENDING: ControlAction.CONTINUE,
    ChangeKind.SHRINK: ControlAction.CHECKPOINT_AND_SHRINK,
    ChangeKind.GROW: ControlAction.CHECKPOINT_AND_REQUEUE,
    ChangeKind.PREEMPT: ControlAction.CHECKPOINT_AND_REQUEUE,
    ChangeKind.REFORM: ControlAction.REFORM,
}


class AckState(StrEnum):
    """The ``state`` of an acknowledgement (``ack.json``, written by the job's rank 0).

    * ``APPLIED``: the job has run its first step at the generation (the only meaning of
      "applied" in hpcsched).
    * ``CHECKPOINTED``: the job checkpointed for a generation that needs a restart or shrink.
    * ``REJECTED``: the job cannot apply the generation (``message`` says why).
    * ``STOPPED``: the job checkpointed at the generation in force and stopped because Slurm
      signalled it (``SIGUSR1``: its time limit is near, ``sbatch --signal``; or an admin's
      ``scancel --signal=USR1``); it resumes from that checkpoint when requeued
      (``docs/control-protocol.md``, "Slurm's own signals").
    """

    APPLIED = "applied"
    CHECKPOINTED = "checkpointed"
    REJECTED = "rejected"
    STOPPED = "stopped"


class LauncherPhase(StrEnum):
    """What the job's launcher is doing (``launcher.json``, read by the daemon)."""

    RUNNING = "running"                    # workers running at the configuration in force
    RESIZING = "resizing"                  # shrinking the allocation and relaunching
    AWAITING_REQUEUE = "awaiting-requeue"  # checkpointed for a grow; waits for the requeue
    #: checkpointed at Slurm's signal (time limit near) and requeued itself; resumes from it
    REQUEUED = "requeued"
    #: checkpointed at Slurm's signal; not requeued (``--no-requeue``): ends at its time limit
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def in_transition(self) -> bool:
        """A resize is under way: the job must not be given another change."""
        return self in (LauncherPhase.RESIZING, LauncherPhase.AWAITING_REQUEUE,
                        LauncherPhase.REQUEUED, LauncherPhase.STOPPED)


class SlurmState(StrEnum):
    """A Slurm job state as ``squeue --json`` (``job_state``) and ``sacct`` print it (squeue(1),
    JOB STATE CODES).

    A member compares equal to the string Slurm prints (``SlurmState.RUNNING == "RUNNING"``), so
    parsed states stay plain strings: Slurm has more states than a release documents, and an
    unknown one must never raise. :attr:`ACTIVE` and :attr:`ENDED` are the two sets the code
    asks about.
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    CONFIGURING = "CONFIGURING"
    COMPLETING = "COMPLETING"
    REQUEUED = "REQUEUED"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    RESIZING = "RESIZING"
    STAGE_OUT = "STAGE_OUT"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STOPPED = "STOPPED"
    REVOKED = "REVOKED"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    SIGNALING = "SIGNALING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"

    #: states in which Slurm still holds resources for the job or may start it again
    ACTIVE: ClassVar[frozenset[SlurmState]]
    #: states after which a job runs no more
    ENDED: ClassVar[frozenset[SlurmState]]


SlurmState.ACTIVE = frozenset({
    SlurmState.PENDING, SlurmState.RUNNING, SlurmState.CONFIGURING, SlurmState.COMPLETING,
    SlurmState.SUSPENDED, SlurmState.REQUEUED, SlurmState.RESIZING})
SlurmState.ENDED = frozenset({
    SlurmState.COMPLETED, SlurmState.FAILED, SlurmState.CANCELLED, SlurmState.TIMEOUT,
    SlurmState.NODE_FAIL, SlurmState.OUT_OF_MEMORY, SlurmState.PREEMPTED, SlurmState.BOOT_FAIL,
    SlurmState.DEADLINE})


class GrowMode(StrEnum):
    """How a running job grows (``[daemon] grow``, ``simulate --grow``; ``docs/extensions.md``).

    * ``EXTENSION``: a second Slurm job whose workers start while the job trains on and join its
      process group at a step boundary (no restart).
    * ``REQUEUE``: checkpoint, requeue, restart at the new size.
    """

    EXTENSION = "extension"
    REQUEUE = "requeue"


class Granularity(StrEnum):
    """What a plan may ask for (``[daemon] granularity``, ``simulate --granularity``).

    * ``NODE``: whole nodes x the job's workers per node.
    * ``GPU``: any GPU count on any GPUs per node, realised with extension jobs.
    * ``AUTO``: a setting only, resolved to ``GPU`` with ``GrowMode.EXTENSION``, else ``NODE``.
    """

    AUTO = "auto"
    NODE = "node"
    GPU = "gpu"


__all__ = ["ACTION_FOR_KIND", "AckState", "ChangeKind", "ControlAction", "Granularity", "GrowMode",
           "LauncherPhase", "SlurmState"]
