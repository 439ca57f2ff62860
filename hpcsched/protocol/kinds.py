"""The vocabulary both sides share, once: kinds of change, control actions, acknowledgement
states and launcher phases.

Each is a :class:`enum.StrEnum`, so a member compares equal to its string value and is written
to JSON, the store and logs as that string (``ChangeKind.GROW == "grow"``); the strings are the
wire format of ``docs/control-protocol.md`` and the store's ``actions.kind`` column.
"""

from __future__ import annotations

from enum import StrEnum


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


__all__ = ["ACTION_FOR_KIND", "AckState", "ChangeKind", "ControlAction", "LauncherPhase"]
