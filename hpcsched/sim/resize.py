"""How the simulated Slurm and a job carry out a resize: an in-place shrink, and a grow by
extension (issue 10) -- the extension job's GPUs, and the join of its workers. The engine
(:mod:`hpcsched.sim.engine`) decides when; these functions change the cluster's free GPUs and the
job's state. A grow by requeue is the engine's (the job is released and started again).

Units: seconds, GPUs; GPUs are ``(node index, gpu index)`` pairs of
:class:`~hpcsched.sim.cluster.SimCluster`.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcsched.protocol.batching import BatchConfig
from hpcsched.sim.cluster import SimCluster
from hpcsched.sim.state import SimJob

Allocation = tuple[tuple[str, ...], tuple[tuple[int, int], ...]]


def extension_gpus(cluster: SimCluster, j: SimJob, gpus: int, nodes: int,
                   placement: Sequence[str] = ()) -> Allocation | None:
    """Take the GPUs of an extension growing running job ``j`` to ``gpus`` GPUs (``nodes``
    nodes at ``node`` granularity): GPU-granular, ``gpus - j.size`` GPUs on ``placement`` when
    it names nodes that hold them, else on the job's own nodes when they do, else packed
    (:meth:`SimCluster.allocate_gpus`); node-granular, ``nodes`` minus the job's nodes, whole
    nodes of its GPUs per node, other than its own (:func:`extension_nodes`). Returns what was
    taken, or ``None`` (nothing taken) when they are not free now."""
    names = cluster.node_names
    mine = tuple(dict.fromkeys(names[n] for n, _ in j.gpus))
    if not j.granular:
        return extension_nodes(cluster, nodes - len(mine), j.per_node, mine, placement)
    extra = gpus - j.size
    if placement:
        got = cluster.allocate_gpus(extra, tuple(placement))
        if got is not None:
            return got
    free = cluster.free.sum(axis=1)
    on_mine = min(extra, sum(int(free[cluster.node_index[n]]) for n in mine))
    first = cluster.allocate_gpus(on_mine, mine) if on_mine else ((), ())
    rest = cluster.allocate_gpus(extra - on_mine) if extra > on_mine else ((), ())
    if rest is None:
        cluster.release(first[1])
        return None
    gpus_taken = tuple(sorted(first[1] + rest[1]))
    return tuple(names[i] for i in sorted({n for n, _ in gpus_taken})), gpus_taken


def extension_nodes(cluster: SimCluster, count: int, per_node: int, mine: Sequence[str],
                    placement: Sequence[str] = ()) -> Allocation | None:
    """``count`` nodes other than ``mine`` with ``per_node`` GPUs each: the placement's new nodes
    when they are that many and fit, else by Slurm's rule (:meth:`SimCluster.allocate`: fewest
    free GPUs that hold them, lowest name first); ``None`` (nothing taken) when there are not
    that many."""
    req = tuple(n for n in placement if n not in mine)
    got = cluster.allocate(count, per_node, req) if req and len(req) == count else None
    if got is not None:
        return got
    free = cluster.free.sum(axis=1)
    names = cluster.node_names
    fits = sorted((i for i, n in enumerate(names) if n not in mine and free[i] >= per_node),
                  key=lambda i: (free[i], i))[:count]
    if len(fits) < count:
        return None
    return cluster.allocate(count, per_node, tuple(names[i] for i in sorted(fits)))


def join(j: SimJob, names: Sequence[str], now: float, stall: float) -> None:
    """At ``now`` the extension's workers of ``j`` (advanced to ``now``) have started: the group
    re-forms at the new size on the job's and the extension's GPUs (``names``: the cluster's
    node names), every rank stalled ``stall`` seconds while the newcomers receive the state."""
    ext, j.ext = j.ext, None
    j.gpus = tuple(sorted(j.gpus + ext.gpus))
    j.node_names = tuple(names[n] for n in sorted({n for n, _ in j.gpus}))
    j.nodes, j.size, j.cfg = len(j.node_names), ext.size, ext.cfg
    j.blocked_until = max(j.blocked_until, now) + stall
    j.resized_at = now
    j.max_gpus = max(j.max_gpus, j.size)
    j.eta = j.st = None


def shrink_in_place(cluster: SimCluster, j: SimJob, gpus: int, cfg: BatchConfig, now: float,
                    cost: float) -> None:
    """Shrink running ``j`` in place to ``gpus`` GPUs at batch configuration ``cfg``, costing
    ``cost`` seconds: whole nodes keep the first nodes of the allocation (Slurm's rule);
    GPU-granular, the GPUs on the nodes where the job holds fewest go first (the rest stay
    packed)."""
    names = cluster.node_names
    if j.granular:
        order = sorted(j.gpus, key=lambda ng: (-j.layout[j.node_names.index(names[ng[0]])],
                                               ng[0], ng[1]))
        keep_gpus, drop = tuple(sorted(order[:gpus])), order[gpus:]
        cluster.release(drop)
        j.gpus = keep_gpus
        j.node_names = tuple(dict.fromkeys(names[n] for n, _ in keep_gpus))
    else:
        keep = j.node_names[:gpus // j.per_node]
        cluster.release((n, g) for n, g in j.gpus if names[n] not in keep)
        j.gpus = tuple((n, g) for n, g in j.gpus if names[n] in keep)
        j.node_names = keep
    j.nodes, j.size, j.cfg = len(j.node_names), gpus, cfg
    j.blocked_until = max(j.blocked_until, now) + cost
    j.resized_at = now
    j.resizes += 1


__all__ = ["extension_gpus", "extension_nodes", "join", "shrink_in_place"]
