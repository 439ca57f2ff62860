"""Placement of a GPU-granular plan (``snapshot.granularity == "gpu"``): targets that speak GPUs
(``JobTarget.gpus``, e.g. 6 GPUs packed as 4 + 2) rather than whole nodes of
``workers_per_node``. Pure; used by :func:`hpcsched.policies.placement.place`.

What the mechanism does with a placement sets what this stage places:

* a **pending** job (or one held by a preemption) starts on the nodes named, taking its GPUs
  among their free ones (Slurm's ``--nodelist``; the simulator's ``allocate_gpus``). A
  placement whose nodes lack the GPUs would keep it waiting, so a job is only placed on GPUs
  free *now*;
* a **running job that grows** by extension keeps its GPUs and adds the rest on the nodes
  named (its own nodes first, :func:`hpcsched.policies.reconcile.feasible_now`), so its
  placement is its own nodes plus the new ones; grown by requeue it starts afresh, its own
  GPUs counted free;
* a running job that keeps its size or shrinks is not moved (reconcile never migrates a
  running job): it keeps its GPUs, which no other job is placed on.

Each job (most variability-sensitive class first, then plan order) walks the node *ranks* of its
strategy, best first -- PAL: the K-Means bin of the node's slowest GPU for its class; PM-First:
that GPU's measured slowdown; packed: one rank -- and takes the first rank at which the nodes of
that rank or better hold its GPUs packed (best fit: the node with the fewest free GPUs that
holds the rest, else the one with the most) on no more nodes than ``target.nodes`` or, when
the free GPUs are fragmented, than Slurm's own packing of all of them would span (a grow by
extension: its own nodes counted), so the stage never trades locality for speed. Within a rank
every node counts as equally fast, so locality and packing decide, as PAL's bin walk does. A
job that the free GPUs do not hold keeps an empty placement (Slurm chooses), with a note.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcsched.model.snapshot import ClusterSnapshot
from hpcsched.policies.placement.scores import node_sort_key
from hpcsched.policies.placement.strategies import Cluster, PlacedJob, partition_ok
from hpcsched.protocol.kinds import GrowMode

GpuChoice = tuple[dict[str, int], str]     # GPUs taken per node, and why


@dataclass(frozen=True)
class Demand:
    """What one job asks of the free GPUs: ``gpus`` more GPUs on at most ``max_nodes`` nodes
    (``None``: any number), its ``own`` nodes first (a grow by extension)."""

    gpus: int
    max_nodes: int | None
    own: tuple[str, ...] = ()


def free_gpus(cluster: Cluster) -> dict[str, int]:
    """GPUs free now on each usable node (what Slurm would give a job started now)."""
    return {name: node.gpus_free for name, node in cluster.usable.items()}


def demand(x: PlacedJob, snapshot: ClusterSnapshot) -> Demand | None:
    """What placing ``x`` needs, or ``None`` when it keeps its GPUs (running, not growing)."""
    want = x.target.gpus_for(x.job)
    if not x.running:
        return Demand(want, x.target.nodes)
    if want <= x.job.gpus:
        return None
    if snapshot.grow == GrowMode.EXTENSION:
        return Demand(want - x.job.gpus, None, tuple(x.job.node_names))
    return Demand(want, x.target.nodes)


def node_rank(x: PlacedJob, strategy: str, cluster: Cluster) -> dict[str, float]:
    """Each usable node's rank for ``x``'s class under ``strategy`` (lower: faster)."""
    if strategy == "packed":
        return dict.fromkeys(cluster.usable, 0.0)
    binned = strategy == "pal"
    sp = cluster.speed(x.cls, binned=binned)
    if binned:
        return {m: float(sp.bin.get(m, 0)) for m in cluster.usable}
    return {m: sp.raw.get(m, 1.0) for m in cluster.usable}


def pack(need: Demand, nodes: list[str], free: dict[str, int]) -> dict[str, int] | None:
    """``need.gpus`` GPUs from ``nodes``: the job's own nodes first, then best fit (the node
    with the fewest free GPUs that holds the rest, else the one with the most; ties: natural
    name order). ``None`` if they do not hold them within ``need.max_nodes`` nodes."""
    avail = {m: free[m] for m in nodes if free[m] > 0}
    take: dict[str, int] = {}
    left = need.gpus
    for m in need.own:
        if left > 0 and avail.get(m, 0) > 0:
            take[m] = min(left, avail.pop(m))
            left -= take[m]
    while left > 0 and avail:
        fits = [m for m, f in avail.items() if f >= left]
        m = (min(fits, key=lambda k: (avail[k], node_sort_key(k))) if fits
             else min(avail, key=lambda k: (-avail[k], node_sort_key(k))))
        take[m] = min(left, avail.pop(m))
        left -= take[m]
    spans = len(set(take) | set(need.own))
    if left > 0 or (need.max_nodes is not None and spans > need.max_nodes):
        return None
    return take


def choose(x: PlacedJob, need: Demand, free: dict[str, int], strategy: str, cluster: Cluster
           ) -> GpuChoice | None:
    """The first rank (best first) at which ``x``'s demand packs, and why; ``None``: nowhere."""
    rank = node_rank(x, strategy, cluster)
    ok = [m for m in cluster.usable if partition_ok(x.job, cluster.usable[m])]
    slurm = pack(replace(need, max_nodes=None), ok, free)   # what Slurm's packing would take
    if slurm is None:
        return None
    # never more nodes than the target's, nor than Slurm's packing would span (locality)
    spans = len(set(slurm) | set(need.own))
    need = replace(need, max_nodes=spans if need.max_nodes is None else max(need.max_nodes, spans))
    for r in sorted({rank[m] for m in ok if free[m] > 0}):
        take = pack(need, [m for m in ok if rank[m] <= r], free)
        if take is not None:
            why = "" if strategy == "packed" else f"rank {r:g} for class {x.cls or '-'}"
            return take, why
    return None


def assign_gpus(todo: list[PlacedJob], snapshot: ClusterSnapshot, cluster: Cluster,
                strategy: str) -> tuple[dict[str, tuple[list[str], str]], list[PlacedJob], int]:
    """Place the jobs of a GPU-granular plan (module docstring). Returns the placement (node
    names, and why) per job id, the jobs that did not fit, and how many jobs kept their GPUs."""
    free = free_gpus(cluster)
    got: dict[str, tuple[list[str], str]] = {}
    failed: list[PlacedJob] = []
    kept = 0
    for x in sorted(todo, key=lambda x: (-x.sens, x.pos)):
        need = demand(x, snapshot)
        if need is None:
            kept += 1
            continue
        c = choose(x, need, free, strategy, cluster) if need.gpus > 0 else ({}, "")
        if c is None:
            failed.append(x)
            continue
        take, why = c
        for m, g in take.items():
            free[m] -= g
        got[x.job.job_id] = (sorted(set(take) | set(need.own), key=node_sort_key), why)
    return got, failed, kept
