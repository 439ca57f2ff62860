"""What reconcile hands on: the changes to make, and the candidates it weighs.

A :class:`Change` is the actuator's input and the journal's record (the daemon's
:mod:`hpcsched.daemon.round` and the simulator's :mod:`hpcsched.sim.engine` apply it); a
:class:`Candidate` is a change under consideration in :mod:`hpcsched.policies.reconcile`, with
the job's predicted goodput before and after. Units: nodes, GPUs, samples, samples/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcsched.policies.realise import Layout, Mechanism
from hpcsched.protocol.kinds import ChangeKind

#: the order changes are made in (shrinks free what grows and starts need)
ORDER: dict[ChangeKind, int] = {ChangeKind.PREEMPT: 0, ChangeKind.SHRINK: 1, ChangeKind.BATCH: 2,
                                ChangeKind.PENDING: 3, ChangeKind.GROW: 4}
RESIZES = (ChangeKind.SHRINK, ChangeKind.GROW)


@dataclass(frozen=True)
class Change:
    """One change to make: the actuator's input, and the journal's record."""

    job_id: str
    kind: ChangeKind
    from_nodes: int
    to_nodes: int
    from_batch_size: int
    to_batch_size: int
    reason: str
    placement: tuple[str, ...] = ()   # nodes to run on, for a pending job or a grow
    #: GPUs before (held, or asked for when pending) and after; 0: ``nodes`` x workers per node
    from_gpus: int = 0
    to_gpus: int = 0
    #: GPU-granular: how Slurm carries it out (:class:`~hpcsched.policies.realise.Mechanism`;
    #: ``None``: node-granular, by ``kind``) and the job's whole allocation after it,
    #: ``((node, GPUs), ...)``, primary's nodes first (empty: Slurm chooses)
    mechanism: Mechanism | None = None
    layout: Layout = ()
    #: GPUs a GPU-granular grow takes on each node of ``placement`` (the placement stage's
    #: choice, :mod:`hpcsched.policies.placement.gpus`); empty: as many as each has free, in order
    placement_gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Candidate:
    """A change under consideration, with the job's predicted goodput before and after
    (samples/s; 0 for changes that are not weighed: pending, preempt) and the weight of one
    sample/s of it in the policy's objective (:attr:`JobTarget.weight`)."""

    change: Change
    x_from: float = 0.0
    x_to: float = 0.0
    weight: float = 1.0

    @property
    def kind(self) -> ChangeKind:
        return self.change.kind

    @property
    def gain(self) -> float:
        """The change's gain in the policy's objective (weighted goodput)."""
        return (self.x_to - self.x_from) * self.weight


__all__ = ["ORDER", "RESIZES", "Candidate", "Change"]
