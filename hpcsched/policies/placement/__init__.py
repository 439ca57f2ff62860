"""Placement stages: which nodes each job of a :class:`~hpcsched.model.snapshot.Plan` runs on.

An allocation policy (``static``, ``dp``, ...) decides *how many* nodes and what batch size each
job gets; :func:`place` then decides *which* nodes, and composes with any of them::

    plan = place(policy.decide(snapshot, seed), snapshot, "pal", locality_penalty=1.5, seed=seed)

It fills ``JobTarget.placement`` (node names, in natural order) for every job that is to run
(``nodes > 0``) and never changes a node count or batch size. Three strategies
(:data:`PLACEMENTS`), after Jain et al., "PAL: A Variability-Aware Policy for Scheduling ML
Workloads in GPU Clusters", SC'24 (arXiv:2408.11919; artifact github.com/hal-uw/blox-pal):

``packed``
    The paper's *Packed-Sticky* baseline (artifact ``placement/packing_sticky.py``). A running
    job whose node count is unchanged keeps its nodes. Every other job, in plan order, is
    packed best-fit: its current nodes first (a shrink keeps a subset of them), then nodes
    whose free GPUs match ``workers_per_node`` exactly, then the fewest free GPUs that still
    fit, lowest name first. This is the artifact's consolidated rule (exact fit, else the
    node with the fewest free GPUs that fit): with a fixed node count and GPUs per node it is
    what "as few nodes as possible" leaves to choose, and it keeps whole nodes free for
    whole-node jobs.

``pm-first``
    The paper's *PM-First* (§III; artifact ``placement/pmfirst.py``): jobs in the order of
    their class's :func:`~hpcsched.policies.variability.sensitivity`, most sensitive first,
    each take the nodes that are fastest for their class (measured slowdown; ties: the job's
    current nodes, best-fit, name). Every job is placed afresh each round, as in the paper.

``pal``
    *PAL* (§III; artifact ``placement/pal.py``): the same class order, and each job takes the
    placement minimising PAL's locality x variability score::

        score(S) = V(S) * L(S),   V(S) = max over the job's GPUs of the binned slowdown,
                                  L(S) = 1 if S is one node else locality_penalty

    ``V`` is the max because a data-parallel job runs at its slowest GPU's pace; slowdowns are
    binned per class with K-Means (:func:`~.binning.bin_gpus`), so GPUs
    in one bin count as equally fast; ``L`` is the paper's constant across-node penalty (the
    artifact uses 1.7; the paper sweeps 1.0-3.0; default here 1.5). The search walks the bins
    fastest first, as the artifact walks its L x V matrix: at the first bin ``b`` with enough
    usable nodes in bins ``<= b``, every choice scores the same, so locality breaks the tie --
    the job's current nodes first (no move), then best-fit packing, then the faster measured
    slowdown, then name. Slurm places at node granularity and the node count is fixed by the
    allocation policy, so ``L`` is the same for every candidate of one job: within a job the
    L x V walk reduces to the bin walk, and ``L`` matters where a caller compares layouts
    with different node counts (:func:`placement_score`, :func:`job_slowdown`).

**A node's speed for a class.** Slurm, not hpcsched, picks the GPUs inside a node, and the
snapshot says how many GPUs of a node are free but not which. Any GPU of the node may therefore
be handed to the job, so a node's speed for a class is its *slowest* GPU's slowdown for that
class (equivalently: the job is assumed to get the slowest ``workers_per_node`` GPUs, whose
slowest is the node's slowest). The bound is exact for whole-node jobs, the common case on
4-GPU nodes, and never flatters a node. Nodes without measurements count as median (1.0).

**Capacity.** A node's GPUs minus those of unmanaged jobs (``other_gpus_allocated``, or more if
``gpus_allocated`` shows GPUs that no managed job explains), minus the GPUs of managed jobs that
are not re-placed (running jobs without a target or ``busy``), minus the jobs placed before it.
A job only goes on usable nodes of its partition with at least ``workers_per_node`` free GPUs.
A job that cannot get ``nodes`` such nodes keeps an empty placement (Slurm chooses) and the plan
says why in ``notes``. If re-placing every job leaves a job out, the placement is computed again
with running jobs keeping their nodes first, and the better of the two (fewer running-job GPUs,
then fewer GPUs, left out) is returned. The placements of one plan are consistent only as a
whole: applying a move without the moves it makes room for can overfill a node.

**GPU-granular plans** (``snapshot.granularity == "gpu"``: targets that speak GPUs, as
``jct``'s) are placed by :mod:`.gpus` instead: each job is placed on the GPUs free now (what
Slurm can give it), running jobs that do not grow keep their GPUs (reconcile never moves a
running job), a grow by extension adds nodes to the job's own, and each strategy ranks the
nodes as above (PAL: bins, fastest first; the first bin whose nodes hold the job, packed on
at most ``target.nodes`` nodes, wins).

Pure: no I/O, no clock; the only randomness is K-Means seeding, from ``seed`` (the binning of
one set of measurements and seed is computed once: :func:`.binning.bin_gpus_cached`).

Modules: :mod:`.capacity` (what each node has left), :mod:`.strategies` (one chooser per
strategy), :mod:`.gpus` (GPU-granular plans), :mod:`.binning` (PAL's K-Means), :mod:`.scores`
(``L x V``, node speeds, name order); this one drives them (:func:`place`).
"""

from __future__ import annotations

from dataclasses import replace

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, Plan
from hpcsched.policies.placement.capacity import capacity_left
from hpcsched.policies.placement.gpus import assign_gpus
from hpcsched.policies.placement.scores import (
    class_in,
    job_slowdown,
    locality_factor,
    node_slowdowns,
    node_sort_key,
    placement_score,
)
from hpcsched.policies.placement.strategies import CHOOSERS, Choice, Cluster, PlacedJob, partition_ok
from hpcsched.policies.variability import profiles_from_views, sensitivity
from hpcsched.protocol.kinds import Granularity

PLACEMENTS = ("packed", "pm-first", "pal")

__all__ = ["PLACEMENTS", "job_slowdown", "locality_factor", "node_slowdowns", "node_sort_key",
           "place", "placement_score"]


def place(plan: Plan, snapshot: ClusterSnapshot, strategy: str, locality_penalty: float = 1.5,
          seed: int = 0) -> Plan:
    """``plan`` with ``JobTarget.placement`` filled by ``strategy`` (one of :data:`PLACEMENTS`).

    Only placements, reasons (a short ``; placement ...`` suffix) and notes change, but for one
    case: in a GPU-granular plan whose nodes' free GPUs are known (``NodeView.free_index``), a
    grow that a slow GPU would not pay for is trimmed to the GPUs that do, or left out (the job
    keeps its size; :func:`.gpus.trim_grow`). Targets of jobs not in the snapshot, of ``busy``
    jobs, and with ``nodes == 0`` are returned as they are. See the module docstring for the
    strategies, the capacity rules and the score.

    Raises:
        ValueError: unknown strategy, or a locality penalty that is not positive.
    """
    if strategy not in PLACEMENTS:
        raise ValueError(f"unknown placement {strategy!r} (choose from {', '.join(PLACEMENTS)})")
    if not locality_penalty > 0:
        raise ValueError(f"locality_penalty must be > 0, got {locality_penalty!r}")
    if not plan.targets:
        return plan
    cluster = Cluster(snapshot, locality_penalty, seed)
    todo, notes = _to_place(plan, snapshot, strategy)
    if snapshot.granularity == Granularity.GPU:
        todo, got, failed, gpu_notes = _place_gpus(todo, snapshot, cluster, strategy)
        notes += gpu_notes
    else:
        free0 = capacity_left(plan, snapshot, {x.job.job_id for x in todo}, cluster.usable)
        got, failed, retry_notes = _assign_with_retry(todo, free0, cluster, strategy)
        notes += retry_notes + _failed_notes(failed, free0, cluster, strategy)
    notes.insert(0, f"placement: {strategy} (locality penalty {locality_penalty:g}), "
                    f"{len(todo) - len(failed)}/{len(todo)} jobs placed")
    targets = _rewrite(plan.targets, todo, got, {x.pos for x in failed}, strategy,
                       cluster.taken if snapshot.granularity == Granularity.GPU else None)
    targets = _resized(targets, cluster, strategy, notes)
    return replace(plan, targets=targets, notes=tuple(plan.notes) + tuple(notes))


def _place_gpus(todo: list[PlacedJob], snapshot: ClusterSnapshot, cluster: Cluster, strategy: str
                ) -> tuple[list[PlacedJob], dict[str, Choice], list[PlacedJob], list[str]]:
    """A GPU-granular plan's placements (:func:`.gpus.assign_gpus`): the jobs placed or left
    to Slurm, the choices, the jobs left to Slurm, and notes."""
    got, failed, kept = assign_gpus(todo, snapshot, cluster, strategy)
    todo = [x for x in todo if x.job.job_id in got or x in failed]   # vetoed: kept later
    notes = [f"placement {strategy}: job {x.job.job_id} needs {x.target.gpus_for(x.job)} "
             f"GPU(s) on at most {x.target.nodes} node(s) of those free now; placement "
             "left to Slurm" for x in sorted(failed, key=lambda x: x.pos)]
    if kept:
        notes.append(f"placement {strategy}: {kept} running job(s) keep their GPUs")
    return todo, got, failed, notes


def _resized(targets: tuple[JobTarget, ...], cluster: Cluster, strategy: str,
             notes: list[str]) -> tuple[JobTarget, ...]:
    """``targets`` with the grows the GPU-granular stage trimmed (:func:`.gpus.trim_grow`), and
    those it left out at the job's size and batch size (its weight kept: reconcile judges the
    plan in the policy's objective), a note each added to ``notes``."""
    out = []
    for t in targets:
        if t.job_id in cluster.trimmed:
            t = _trim(t, *cluster.trimmed[t.job_id])
        elif t.job_id in cluster.vetoed:
            job, why = cluster.vetoed[t.job_id]
            t = replace(t, nodes=job.nodes, gpus=job.gpus, batch_size=job.batch_size, placement=(),
                        reason=f"{t.reason}; keeps its size: {why}")
            notes.append(f"placement {strategy}: job {t.job_id} keeps its size: {why}")
        out.append(t)
    return tuple(out)


def _trim(t: JobTarget, gpus: int, why: str) -> JobTarget:
    """Target ``t`` trimmed to ``gpus`` GPUs on its placement's nodes."""
    return replace(t, gpus=gpus, nodes=max(1, len(t.placement)), reason=f"{t.reason}; {why}")


def _failed_notes(failed: list[PlacedJob], free0: dict[str, int], cluster: Cluster,
                  strategy: str) -> list[str]:
    """A note per job of a whole-node plan that did not fit, in plan order."""
    notes = []
    for x in sorted(failed, key=lambda x: x.pos):
        wpn = x.job.workers_per_node
        have = len(cluster.eligible(x.job, free0))
        notes.append(f"placement {strategy}: job {x.job.job_id} needs {x.target.nodes} node(s) with "
                     f">= {wpn} free GPUs; {have} had them before other jobs were placed; "
                     "placement left to Slurm")
    return notes


def _to_place(plan: Plan, snapshot: ClusterSnapshot, strategy: str
              ) -> tuple[list[PlacedJob], list[str]]:
    """The jobs this stage (re)places, in plan order: the first target of each job that is to
    run, is in the snapshot and is not busy; a note for each target of an unknown job."""
    jobs = {j.job_id: j for j in snapshot.jobs}
    profiles = profiles_from_views(snapshot.gpus)
    todo: list[PlacedJob] = []
    notes: list[str] = []
    seen: set[str] = set()
    sens: dict[str, float] = {}
    for pos, t in enumerate(plan.targets):
        j = jobs.get(t.job_id)
        if t.nodes <= 0 or t.job_id in seen:
            continue
        seen.add(t.job_id)
        if j is None:
            notes.append(f"placement {strategy}: job {t.job_id} is not in the snapshot; not placed")
            continue
        if j.busy:
            continue
        cls = class_in(j.app_class, profiles)
        if cls not in sens:
            sens[cls] = sensitivity(cls, profiles)
        todo.append(PlacedJob(pos, t, j, cls, sens[cls]))
    return todo, notes


def _assign(order: list[PlacedJob], free0: dict[str, int], cluster: Cluster, strategy: str,
            sticky_first: bool) -> tuple[dict[str, Choice], list[PlacedJob]]:
    """Place the jobs in ``order``, each on what the ones before it left. With
    ``sticky_first``, running jobs whose size is unchanged first keep their nodes where they
    still fit. Returns the choice per job id and the jobs that did not fit."""
    free = dict(free0)
    got: dict[str, Choice] = {}
    failed: list[PlacedJob] = []
    rest = order
    if sticky_first:
        rest = []
        for x in order:
            names = sorted(set(x.job.node_names), key=node_sort_key)
            wpn = x.job.workers_per_node
            if x.sticky_ok and all(m in cluster.usable and free[m] >= wpn
                                   and partition_ok(x.job, cluster.usable[m]) for m in names):
                for m in names:
                    free[m] -= wpn
                got[x.job.job_id] = (names, "kept")
            else:
                rest.append(x)
    for x in rest:
        elig = cluster.eligible(x.job, free)
        c = CHOOSERS[strategy](x, elig, free, cluster) if len(elig) >= x.target.nodes else None
        if c is None:
            failed.append(x)
            continue
        for m in c[0]:
            free[m] -= x.job.workers_per_node
        got[x.job.job_id] = c
    return got, failed


def _assign_with_retry(todo: list[PlacedJob], free0: dict[str, int], cluster: Cluster,
                       strategy: str) -> tuple[dict[str, Choice], list[PlacedJob], list[str]]:
    """Packed keeps running jobs' nodes first. PM-First and PAL place every job afresh, most
    sensitive class first; if that leaves a job out, they try again with running jobs keeping
    their nodes first and keep the better (fewer running-job GPUs, then fewer GPUs, left out)."""
    if strategy == "packed":
        got, failed = _assign(todo, free0, cluster, strategy, sticky_first=True)
        return got, failed, []
    order = sorted(todo, key=lambda x: (-x.sens, x.pos))
    got, failed = _assign(order, free0, cluster, strategy, sticky_first=False)
    if not failed:
        return got, failed, []
    alt, alt_failed = _assign(order, free0, cluster, strategy, sticky_first=True)

    def lost(fs: list[PlacedJob]) -> tuple[int, int]:
        return (sum(x.gpus for x in fs if x.running), sum(x.gpus for x in fs))

    if lost(alt_failed) < lost(failed):
        return alt, alt_failed, [f"placement {strategy}: running jobs kept their nodes so that "
                                 "more jobs fit"]
    return got, failed, []


def _rewrite(targets: tuple[JobTarget, ...], todo: list[PlacedJob], got: dict[str, Choice],
             failed_pos: set[int], strategy: str, taken: dict[str, dict[str, int]] | None = None
             ) -> tuple[JobTarget, ...]:
    """The plan's targets with the placements and a reason suffix; targets the stage did not
    place are returned as they are. Node names in natural order, or with ``taken`` (a
    GPU-granular plan: GPUs taken per node, per job) in the order their GPUs are taken, with
    those counts as ``placement_gpus``."""
    by_pos = {x.pos: x for x in todo}
    out = []
    for pos, t in enumerate(targets):
        x = by_pos.get(pos)
        if x is None:
            out.append(t)
        elif pos in failed_pos:
            out.append(replace(t, placement=(),
                               reason=f"{t.reason}; placement {strategy}: does not fit"))
        else:
            names, why = got[x.job.job_id]
            if taken is None:
                names = sorted(names, key=node_sort_key)
            detail = ",".join(names) + (f" ({why})" if why else "")
            counts = taken.get(x.job.job_id) if taken is not None else None
            out.append(replace(t, placement=tuple(names),
                               placement_gpus=tuple(counts.get(n, 0) for n in names) if counts else (),
                               reason=f"{t.reason}; placement {strategy}: {detail}"))
    return tuple(out)
