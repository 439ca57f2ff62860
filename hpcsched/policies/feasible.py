"""Which of the changes reconcile chose Slurm can make now, and where a grow's GPUs come from.

Pure: :func:`feasible_now` orders the chosen changes (:data:`~hpcsched.policies.changes.ORDER`)
and drops the grows Slurm cannot place now, claiming each grow's GPUs in turn (whole nodes, GPUs
packed, or an extension's GPUs beside the job's own); :func:`released` and the changes' layouts
say which GPUs shrinks and preemptions give back first; :func:`extension_spans`, the nodes a
grow by extension will span. Units: GPUs, nodes.
"""

from __future__ import annotations

from dataclasses import replace

from hpcsched.model.snapshot import ClusterSnapshot, JobView
from hpcsched.policies.changes import ORDER, Candidate, Change
from hpcsched.policies.realise import Layout, Mechanism
from hpcsched.protocol.kinds import ChangeKind, Granularity, GrowMode


def extension_spans(job: JobView, gpus: int, snapshot: ClusterSnapshot) -> int:
    """Nodes running ``job`` spans after a GPU-granular grow to ``gpus`` GPUs by extension:
    its own nodes, whose free GPUs the extension takes first, and for the rest the fewest other
    nodes that hold them (fullest first), as :func:`_place_extension_gpus` claims them. An
    extension keeps the job's GPUs, so it may leave the job spread where a requeue would pack
    it; its goodput is predicted on the nodes it will span."""
    free = snapshot.free_gpus
    own = set(job.node_names)
    rest = gpus - job.gpus - sum(free.get(n, 0) for n in own)
    spans = len(own)
    for f in sorted((f for n, f in free.items() if n not in own and f > 0), reverse=True):
        if rest <= 0:
            break
        rest -= f
        spans += 1
    return max(spans, 1)



def feasible_now(chosen: list[Candidate], snapshot: ClusterSnapshot, grow: GrowMode = GrowMode.REQUEUE
                 ) -> tuple[list[Change], list[str]]:
    """``chosen`` in :data:`ORDER` (largest gain first within a kind), without the grows Slurm
    cannot place now, and notes on those. A grow needs ``to_nodes`` usable nodes with the job's
    GPUs per node free, its own nodes counted (the requeue frees them; by ``grow ==
    "extension"`` the job keeps them and the extension needs the rest); its planned placement
    is kept when it fits, else dropped (Slurm chooses). Grows made claim their nodes in turn.
    The GPUs the plan's shrinks and preemptions give back count as free for its grows (they
    come first: a shrink in place releases its GPUs within seconds, and a grow's extension job
    or requeued job waits in Slurm's queue until they are free), so a plan that moves GPUs from
    one job to another is made in one round, not over two."""
    free = dict(snapshot.free_gpus)     # claimed change by change
    changes: list[Change] = []
    notes: list[str] = []
    keep_own = grow == GrowMode.EXTENSION
    for cand in sorted(chosen, key=lambda c: (ORDER[c.kind], -c.gain)):
        c = cand.change
        if c.kind in (ChangeKind.SHRINK, ChangeKind.PREEMPT):
            job = snapshot.job(c.job_id)
            assert job is not None, c.job_id    # a plan shrinks the snapshot's jobs
            gone = (_given_back(job, c.layout) if c.mechanism in (Mechanism.RELEASE,
                                                                  Mechanism.SHRINK_PRIMARY)
                    else released(job, c.to_gpus if c.kind == ChangeKind.SHRINK else 0,
                                  snapshot.granularity))
            for n, g in gone.items():
                if n in free:
                    free[n] += g
        elif c.kind == ChangeKind.GROW:
            job = snapshot.job(c.job_id)
            assert job is not None, c.job_id    # and grows them
            if snapshot.granularity != Granularity.GPU:
                placed, note = _place_grow(c, job, free, keep_own)
            elif keep_own:
                placed, note = _place_extension_gpus(c, job, free)
            else:
                placed, note = _place_grow_gpus(c, job, free)
            if note:
                notes.append(note)
            if placed is None:
                continue
            c = placed
        changes.append(c)
    return changes, notes


def _given_back(job: JobView, layout: Layout) -> dict[str, int]:
    """GPUs per node ``job`` gives back by reaching ``layout`` in place."""
    after = dict(layout)
    return {n: g - after.get(n, 0) for n, g in job.allocation().items() if g > after.get(n, 0)}


def released(job: JobView, to_gpus: int, granularity: Granularity) -> dict[str, int]:
    """GPUs per node that ``job`` gives back when it shrinks in place to ``to_gpus`` GPUs (0: it
    is preempted). Whole nodes: it keeps its first nodes (Slurm's rule for ``scontrol update
    NumNodes``); GPU-granular: the GPUs on the nodes where it holds fewest go first, the last
    such node first (:func:`hpcsched.sim.resize.shrink_in_place`, the same rule)."""
    per = job.layout or (job.workers_per_node,) * len(job.node_names)
    held = dict(zip(job.node_names, per))
    if to_gpus <= 0:
        return held
    if granularity != Granularity.GPU:
        keep = max(1, to_gpus // max(1, job.workers_per_node))
        return {n: held[n] for n in job.node_names[keep:]}
    out, drop = {}, sum(held.values()) - to_gpus
    for i in sorted(range(len(job.node_names)), key=lambda i: (per[i], -i)):
        if drop <= 0:
            break
        n = job.node_names[i]
        out[n] = min(drop, held[n])
        drop -= out[n]
    return out


def _place_grow(c: Change, job: JobView, free: dict[str, int], keep_own: bool = False
                ) -> tuple[Change | None, str]:
    """The grow as it can be made now (``None``: it waits) and a note; claims its nodes in
    ``free``. With ``keep_own`` (by extension) a placement must contain the job's nodes, and
    the change carries the nodes claimed (its own first), whether planned or chosen here."""
    wpn = job.workers_per_node
    mine = {name: free.get(name, 0) + wpn for name in job.node_names}
    fits = sorted((n for n, g in {**free, **mine}.items() if g >= wpn),
                  key=lambda n: (n not in mine, n))
    if len(fits) < c.to_nodes:
        return None, (f"job {c.job_id}: grow to {c.to_nodes} node(s) waits: "
                      f"{len(fits)} node(s) have {wpn} GPU(s) free")
    note = ""
    nodes = fits[: c.to_nodes]
    if (c.placement and len(c.placement) == c.to_nodes and set(c.placement) <= set(fits)
            and (not keep_own or set(mine) <= set(c.placement))):
        nodes = list(c.placement)
    elif c.placement:
        note = (f"job {c.job_id}: placement {','.join(c.placement)} does not fit now; Slurm "
                "chooses the nodes")
        c = replace(c, placement=())
    for n in nodes:
        free[n] = free.get(n, 0) + (wpn if n in mine else 0) - wpn
    if keep_own:   # the job itself submits the extension: it is told the nodes claimed here
        c = replace(c, placement=tuple(nodes))
    return c, note


def _place_grow_gpus(c: Change, job: JobView, free: dict[str, int]) -> tuple[Change | None, str]:
    """A GPU-granular grow: it fits when the free GPUs, the job's own counted (the requeue frees
    them), add up to ``to_gpus``; it claims the fullest nodes first (packed), its own first
    among equals. Its planned node list is kept when those nodes hold the GPUs."""
    own = dict(zip(job.node_names, job.layout or (job.workers_per_node,) * len(job.node_names)))
    avail = {n: free.get(n, 0) + own.get(n, 0) for n in {*free, *own}}
    if sum(avail.values()) < c.to_gpus:
        return None, (f"job {c.job_id}: grow to {c.to_gpus} GPU(s) waits: "
                      f"{sum(avail.values())} free, its own counted")
    note = ""
    if c.placement and sum(avail.get(n, 0) for n in c.placement) >= c.to_gpus:
        order = list(c.placement)
    else:
        if c.placement:
            note = (f"job {c.job_id}: placement {','.join(c.placement)} does not fit now; Slurm "
                    "chooses the nodes")
            c = replace(c, placement=())
        order = sorted(avail, key=lambda n: (-avail[n], n not in own, n))
    need = c.to_gpus
    for n in order:
        take = min(need, avail.get(n, 0))
        free[n] = avail.get(n, 0) - take
        need -= take
    for n in own:   # own GPUs not taken again are freed by the requeue
        if n not in order:
            free[n] = avail[n]
    return c, note


def _place_extension_gpus(c: Change, job: JobView, free: dict[str, int]
                          ) -> tuple[Change | None, str]:
    """A GPU-granular grow by extension: the job keeps its GPUs and the extension job takes
    ``to_gpus`` minus those, on the job's own nodes first, then on the fullest nodes (packed).
    It fits when that many GPUs are free; its planned node list is kept when it contains the
    job's nodes and those nodes hold the GPUs."""
    own = set(job.node_names)
    extra = c.to_gpus - job.gpus
    if sum(free.values()) < extra:
        return None, (f"job {c.job_id}: grow to {c.to_gpus} GPU(s) waits: {sum(free.values())} "
                      f"free for its extension of {extra}")
    note = ""
    caps = (dict(zip(c.placement, c.placement_gpus)) if len(c.placement_gpus) == len(c.placement)
            else {})
    room = {n: min(free.get(n, 0), caps.get(n, free.get(n, 0))) for n in c.placement}
    if c.placement and own <= set(c.placement) and sum(room.values()) >= extra:
        order = list(c.placement)
    else:
        room = free
        if c.placement:
            note = (f"job {c.job_id}: placement {','.join(c.placement)} does not fit an "
                    "extension now; Slurm chooses the nodes")
            c = replace(c, placement=())
        order = sorted(free, key=lambda n: (n not in own, -free[n], n))
    after = job.allocation()
    for n in order:
        take = min(extra, room.get(n, 0))
        free[n] = free.get(n, 0) - take
        extra -= take
        if take:
            after[n] = after.get(n, 0) + take
    if c.mechanism is not None:    # the nodes it takes, for the job's extension jobs
        c = replace(c, layout=tuple(after.items()), to_nodes=len(after))
    return c, note


__all__ = ["extension_spans", "feasible_now", "released"]
