"""Which layout a control generation carries, pure. A layout is a job's ``{node: GPUs}`` pairs
(primary's nodes first, then its extensions', oldest first), sent as ``node:GPUs`` strings. A
``continue`` carries one only when the job runs other GPUs per node than it was submitted with;
a job on extension allocations gets a ``reform`` onto the layout it runs (a batch-only change, a
cancelled generation) or reaches (a grow or shrink by extensions). Below
:mod:`~hpcsched.daemon.phases` and :mod:`~hpcsched.daemon.actuator`; ``docs/control-protocol.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcsched.protocol.extensions import layout_pairs
from hpcsched.protocol.kinds import ChangeKind, ControlAction
from hpcsched.slurm.hostlist import expand_hostlist

if TYPE_CHECKING:
    from hpcsched.protocol.files import Ack
    from hpcsched.slurm import JobInfo


def layout_in_force(info: JobInfo, ack: Ack | None, workers_per_node: int
                    ) -> tuple[dict[str, int], dict[str, int]]:
    """``(layout, primary)``: the GPUs per node a running job trains on (its acknowledged
    layout when it runs on extension allocations, in rank order: the primary's nodes first,
    then its extensions', oldest first) and those of its primary Slurm job (pure)."""
    primary = {n: workers_per_node for n in expand_hostlist(info.nodes)} if info.nodes else {}
    layout = dict(ack.layout) if ack is not None and ack.layout else dict(primary)
    return layout, primary


def running_layout(ack: Ack, job: JobInfo) -> tuple[ControlAction, tuple[str, ...]]:
    """How to tell a job to go on as it runs (pure): on extension allocations (its
    acknowledged layout), a ``reform`` onto that layout; on its primary alone, a ``continue``
    with the primary's nodes at the GPUs per node Slurm gave it (the daemon may have started it
    with fewer than it asked), or with no layout when Slurm's view does not match the
    acknowledged node count."""
    if pairs := continue_layout(job, ack, job.gpus_per_node):
        return ControlAction.REFORM, pairs
    primary = layout_in_force(job, ack, job.gpus_per_node)[1]
    if not job.gpus_per_node or len(primary) != ack.nodes \
            or ack.world_size != sum(primary.values()):
        return ControlAction.CONTINUE, ()
    return ControlAction.CONTINUE, layout_pairs(primary)


def continue_layout(info: JobInfo, ack: Ack | None, workers_per_node: int
                    ) -> tuple[str, ...]:
    """The ``node:GPUs`` pairs of a running job on extension allocations, for a batch-only
    change: its world size is its layout's sum, not nodes x GPUs per node (the job refuses a
    ``continue`` of another world size), so the change is a ``reform`` onto the layout it runs
    (the same members, the new batch split; a launcher that starts again ignores a reform's
    layout, where it would take a ``continue``'s as the GPUs per node of a requeue). ``()``
    for a job on its primary alone, whose ``continue`` says it (pure)."""
    if ack is None or not ack.layout:
        return ()
    layout, primary = layout_in_force(info, ack, workers_per_node)
    return () if layout == primary else layout_pairs(layout)


def batch_layout(info: JobInfo, ack: Ack | None, workers_per_node: int
                 ) -> tuple[ChangeKind, tuple[str, ...]]:
    """How a batch-only change of running job ``info`` (submitted with ``workers_per_node``
    GPUs per node) is journaled: ``(kind, placement)`` (pure).

    The job refuses a ``continue`` whose world size is not the one it runs, and a ``continue``
    without a layout means ``nodes`` x ``workers_per_node`` workers. So:

    * on extension allocations: a ``reform`` onto the layout it runs (:func:`continue_layout`);
    * on its primary alone with other GPUs per node than it was submitted with (the daemon
      started it at its fewest GPUs): a ``batch`` whose ``continue`` carries the primary's layout,
      whose sum is the world size; a launcher that starts again takes it as its GPUs per node;
    * otherwise a ``batch``, no layout.
    """
    per_node = info.gpus_per_node or workers_per_node
    if pairs := continue_layout(info, ack, per_node):
        return ChangeKind.REFORM, pairs
    if per_node != workers_per_node and info.nodes:
        return ChangeKind.BATCH, layout_pairs(dict.fromkeys(expand_hostlist(info.nodes), per_node))
    return ChangeKind.BATCH, ()


def reform_layout(kind: ChangeKind, to_nodes: int, placement: tuple[str, ...],
                  layout: dict[str, int], primary: dict[str, int], workers_per_node: int
                  ) -> dict[str, int] | None:
    """The layout a node-granular change of a running job reaches by extension allocations
    (``docs/extensions.md``), or None when it is not made that way (pure).

    * A grow to ``to_nodes`` nodes adds the planned nodes it does not have yet (``placement``,
      in order), each with ``workers_per_node`` GPUs, as extensions. None when the placement
      names too few new nodes (reconcile claims the nodes of an extension grow).
    * A shrink of a job that runs on extensions releases extension nodes, the newest first,
      down to ``to_nodes`` but never below its primary's nodes (those are released in place by
      a ``shrink`` once no extension is left). None for a job without extensions.
    """
    if kind == ChangeKind.GROW:
        new = dict(layout)
        for node in placement:
            if len(new) >= to_nodes:
                break
            new.setdefault(node, workers_per_node)
        return new if len(new) == to_nodes else None
    extensions = [n for n in layout if n not in primary]
    if kind == ChangeKind.SHRINK and extensions:
        drop = max(0, len(layout) - max(to_nodes, len(primary)))
        gone = set(extensions[len(extensions) - drop:]) if drop else set()
        return {n: g for n, g in layout.items() if n not in gone}
    return None


__all__ = ["batch_layout", "continue_layout", "layout_in_force", "reform_layout", "running_layout"]
