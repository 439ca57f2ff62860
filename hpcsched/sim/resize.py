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


def extension_on(cluster: SimCluster, j: SimJob, layout: Sequence[tuple[str, int]]
                 ) -> Allocation | None:
    """Take the GPUs of an extension that brings running ``j`` to ``layout`` (``((node,
    GPUs), ...)``, its whole allocation after the grow, as reconcile claimed it): on each node,
    what the layout has beyond what the job holds there. ``None`` (nothing taken) when they
    are not free now."""
    names = cluster.node_names
    held: dict[str, int] = {}
    for n, _ in j.gpus:
        held[names[n]] = held.get(names[n], 0) + 1
    taken: list[tuple[int, int]] = []
    for node, want in layout:
        extra = want - held.get(node, 0)
        got = cluster.allocate_gpus(extra, (node,)) if extra > 0 else ((), ())
        if got is None:
            cluster.release(taken)
            return None
        taken.extend(got[1])
    gpus = tuple(sorted(taken))
    return tuple(names[i] for i in sorted({n for n, _ in gpus})), gpus


def reach_layout(cluster: SimCluster, j: SimJob, layout: Sequence[tuple[str, int]],
                 cfg: BatchConfig, now: float, cost: float) -> None:
    """Shrink running ``j`` in place to ``layout`` (``((node, GPUs), ...)``) at batch
    configuration ``cfg``, costing ``cost`` seconds: on each node its primary's GPUs are kept
    first, the rest given back (a ``release`` of extension GPUs or a ``shrink-primary`` of whole
    primary nodes, :mod:`hpcsched.policies.realise`)."""
    names = cluster.node_names
    want = dict(layout)
    primary = set(j.primary)
    keep: list[tuple[int, int]] = []
    drop: list[tuple[int, int]] = []
    count: dict[str, int] = {}
    for ng in sorted(j.gpus, key=lambda ng: (ng not in primary, ng)):
        node = names[ng[0]]
        if count.get(node, 0) < want.get(node, 0):
            keep.append(ng)
            count[node] = count.get(node, 0) + 1
        else:
            drop.append(ng)
    cluster.release(drop)
    j.gpus = tuple(sorted(keep))
    j.primary = tuple(ng for ng in j.primary if ng in set(keep))
    j.node_names = j.held_nodes(names)
    j.nodes, j.size, j.cfg = len(j.node_names), len(keep), cfg
    j.blocked_until = max(j.blocked_until, now) + cost
    j.resized_at = now
    j.resizes += 1


def join(j: SimJob, names: Sequence[str], now: float, stall: float) -> None:
    """At ``now`` the extension's workers of ``j`` (advanced to ``now``) have started: the group
    re-forms at the new size on the job's and the extension's GPUs (``names``: the cluster's
    node names), every rank stalled ``stall`` seconds while the newcomers receive the state."""
    ext, j.ext = j.ext, None
    j.gpus = tuple(sorted(j.gpus + ext.gpus))
    j.node_names = j.held_nodes(names)
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
    j.primary = tuple(ng for ng in j.primary if ng in set(j.gpus))
    j.nodes, j.size, j.cfg = len(j.node_names), gpus, cfg
    j.blocked_until = max(j.blocked_until, now) + cost
    j.resized_at = now
    j.resizes += 1


__all__ = ["extension_gpus", "extension_nodes", "extension_on", "join", "reach_layout",
           "shrink_in_place"]
