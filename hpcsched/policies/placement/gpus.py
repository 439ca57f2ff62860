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

**Which GPUs, not which nodes.** Slurm hands a job the lowest-numbered free GPUs of a node, so
when the snapshot knows each node's free GPUs (``NodeView.free_index``: Slurm's ``IDX`` lists)
a node ranks by the GPUs it would give the job (:func:`exact_rank`), not by its slowest GPU,
and a grow of a running job (whose GPUs ``JobView.gpus_held`` names) takes only the GPUs that
pay: one slow GPU sets the pace of every rank of a data-parallel job (PAL §3), so a grow onto
it can leave the job slower than it was (:func:`trim_grow`). The nodes of a placement are
listed in the order their GPUs are taken, with how many each gives
(``JobTarget.placement_gpus``): reconcile lays an extension out by them.
What it gains with ``jct``: ``docs/evaluation.md``, section 12.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace
from itertools import accumulate

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


def choose(x: PlacedJob, need: Demand, free: dict[str, int], strategy: str, cluster: Cluster,
           free_index: dict[str, list[int]] | None = None) -> GpuChoice | None:
    """The first rank (best first) at which ``x``'s demand packs, and why; ``None``: nowhere.
    With ``free_index`` (each node's free GPUs, lowest first: the ones Slurm hands out), a
    node's rank is that of the GPUs it would give the job, not of its slowest GPU."""
    rank = (exact_rank(x, need, free, strategy, cluster, free_index) if free_index is not None
            else node_rank(x, strategy, cluster))
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


def exact_rank(x: PlacedJob, need: Demand, free: dict[str, int], strategy: str, cluster: Cluster,
               free_index: dict[str, list[int]]) -> dict[str, float]:
    """Each usable node's rank for ``x`` from the GPUs it would hand the job: its first
    ``min(free, need.gpus)`` free GPUs (the lowest indexes, as Slurm picks them; ``free``: the
    GPUs the job may take on each node)."""
    if strategy == "packed":
        return dict.fromkeys(cluster.usable, 0.0)
    slow = cluster.gpu_slowdowns(x.cls)
    sp = cluster.speed(x.cls, binned=strategy == "pal")
    out = {}
    for m in cluster.usable:
        idx = free_index.get(m, [])[:min(need.gpus, free.get(m, 0))]
        v = max((slow.get((m, g), 1.0) for g in idx), default=1.0)
        out[m] = float(sp.binning.bin_of(v)) if strategy == "pal" else v
    return out


def trim_grow(x: PlacedJob, need: Demand, free: dict[str, int],
              free_index: dict[str, list[int]], cluster: Cluster
              ) -> tuple[int, dict[str, int], str]:
    """How many of the ``need.gpus`` GPUs a grow of running ``x`` takes: the count ``k`` and
    pace limit ``v`` that maximise ``(gpus + k) / max(pace, v)`` (its throughput at linear
    scaling, an upper bound: a slow GPU sets the pace of every rank, PAL §3), ``k`` taken from
    each node's free GPUs no slower than ``v`` in the order Slurm hands them out. Returns ``k``,
    the GPUs the grow may take per node at that limit, and why (when ``k < need.gpus``)."""
    slow = cluster.gpu_slowdowns(x.cls)
    now = max((slow.get(g, 1.0) for g in x.job.gpus_held), default=1.0)
    limits = sorted({now} | {v for m, idx in free_index.items() for i in idx
                             if (v := slow.get((m, i), 1.0)) > now})
    # each node's pace as it hands out its free GPUs in turn (a running maximum): the GPUs it
    # gives at limit v are those of its prefix no slower than v, found by bisection
    paces = {m: list(accumulate((slow.get((m, i), 1.0) for i in idx[:free.get(m, 0)]), max))
             for m, idx in free_index.items()}
    pooled = sorted(p for ps in paces.values() for p in ps)
    best: tuple[float, int, float] | None = None
    for v in limits:
        k = min(need.gpus, bisect_right(pooled, v))
        score = (x.job.gpus + k) / v
        if best is None or score > best[0] * (1 + 1e-9):
            best = (score, k, v)
    assert best is not None
    _, k, v = best
    cap = {m: bisect_right(ps, v) for m, ps in paces.items()}
    why = (f"a grow to {x.job.gpus + need.gpus} GPUs would run at {max(limits):.2f}x for class "
           f"{x.cls or '-'}; {x.job.gpus + k} on GPUs no slower than {v:.2f}x go faster")
    return k, cap, why


def assign_gpus(todo: list[PlacedJob], snapshot: ClusterSnapshot, cluster: Cluster,
                strategy: str) -> tuple[dict[str, tuple[list[str], str]], list[PlacedJob], int]:
    """Place the jobs of a GPU-granular plan (module docstring). Returns the placement (node
    names, and why) per job id, the jobs that did not fit, and how many jobs kept their GPUs."""
    free = free_gpus(cluster)
    free_index = cluster.free_index()
    got: dict[str, tuple[list[str], str]] = {}
    failed: list[PlacedJob] = []
    kept = 0
    for x in sorted(todo, key=lambda x: (-x.sens, x.pos)):
        need = demand(x, snapshot)
        if need is None:
            kept += 1
            continue
        avail = free
        if free_index is not None and x.running and strategy != "packed" and need.gpus > 0:
            k, avail, why_trim = trim_grow(x, need, free, free_index, cluster)
            if k == 0:
                cluster.vetoed[x.job.job_id] = (x.job, why_trim)
                continue
            if k < need.gpus:
                need = replace(need, gpus=k)
                cluster.trimmed[x.job.job_id] = (x.job.gpus + k, why_trim)
        c = choose(x, need, avail, strategy, cluster, free_index) if need.gpus > 0 else ({}, "")
        if c is None:
            cluster.trimmed.pop(x.job.job_id, None)
            failed.append(x)
            continue
        take, why = c
        for m, g in take.items():
            free[m] -= g
            if free_index is not None:
                del free_index[m][:g]
        # the nodes in the order the GPUs are taken (reconcile fills them in this order), then
        # the job's own nodes that give none
        got[x.job.job_id] = (list(take) + [m for m in need.own if m not in take], why)
        cluster.taken[x.job.job_id] = take
    return got, failed, kept
