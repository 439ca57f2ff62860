"""Placement stages: which nodes each job of a :class:`~hpcsched.policies.snapshot.Plan` runs on.

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
    binned per class with K-Means (:func:`~hpcsched.policies.variability.bin_gpus`), so GPUs
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

Pure: no I/O, no clock; the only randomness is K-Means seeding, from ``seed``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hpcsched.policies.snapshot import ClusterSnapshot, GPUView, JobTarget, JobView, NodeView, Plan
from hpcsched.policies.variability import Binning, bin_gpus, class_key, profiles_from_views, sensitivity

PLACEMENTS = ("packed", "pm-first", "pal")


def node_sort_key(name: str) -> tuple:
    """Natural order of node names (``n2`` before ``n10``): "lowest name first" and the order
    of ``JobTarget.placement``."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p)


# --------------------------------------------------------------------------- scores

def locality_factor(n_nodes: int, locality_penalty: float = 1.5) -> float:
    """PAL's ``L``: 1 for a job on one node, ``locality_penalty`` for one spanning nodes."""
    return 1.0 if n_nodes <= 1 else float(locality_penalty)


def placement_score(variability: float, n_nodes: int, locality_penalty: float = 1.5) -> float:
    """PAL's ``L x V`` score of a placement: slowest GPU's slowdown times the locality factor.

    Lower is better; it estimates how much slower than on one node of median GPUs the job runs.
    """
    return float(variability) * locality_factor(n_nodes, locality_penalty)


def _gpus_by_node(gpus: Iterable[GPUView]) -> dict[str, list[GPUView]]:
    out: dict[str, list[GPUView]] = {}
    for g in gpus:
        out.setdefault(g.node, []).append(g)
    return out


def _class_in(app_class: str, classes: Iterable[str]) -> str:
    """The class name used in the GPU measurements for ``app_class`` (``classA`` == ``A``)."""
    cs = set(classes)
    for cand in (app_class, class_key(app_class), "class" + app_class):
        if cand in cs:
            return cand
    return app_class


def node_slowdowns(gpus: Sequence[GPUView], app_class: str) -> dict[str, float]:
    """Each measured node's speed for ``app_class``: the slowdown of its slowest GPU."""
    c = _class_in(app_class, (k for g in gpus for k, _ in g.slowdown))
    return {n: max(g.slowdown_for(c) for g in gs) for n, gs in sorted(_gpus_by_node(gpus).items())}


def job_slowdown(gpus: Sequence[GPUView], app_class: str, nodes: Sequence[str],
                 locality_penalty: float = 1.5) -> float:
    """How much slower than on one node of median GPUs a job of ``app_class`` runs on ``nodes``:
    :func:`placement_score` with ``V`` the slowest GPU of those nodes (unmeasured nodes 1.0).
    For the simulator and for allocation policies weighing layouts; 1.0 for no nodes."""
    names = sorted(set(nodes))
    if not names:
        return 1.0
    per = node_slowdowns(gpus, app_class)
    return placement_score(max(per.get(n, 1.0) for n in names), len(names), locality_penalty)


# --------------------------------------------------------------------------- place

@dataclass
class _Job:
    pos: int                  # index in plan.targets
    target: JobTarget
    job: JobView
    cls: str                  # class name as in the GPU measurements
    sens: float

    @property
    def running(self) -> bool:
        return self.job.state == "RUNNING"

    @property
    def gpus(self) -> int:
        return self.target.nodes * self.job.workers_per_node

    @property
    def sticky_ok(self) -> bool:
        names = set(self.job.node_names)
        return self.running and self.target.nodes == self.job.nodes and len(names) == self.target.nodes


@dataclass
class _Speeds:
    raw: dict[str, float]      # node -> slowest GPU's measured slowdown
    bin: dict[str, int]        # node -> bin of its slowest GPU (0 = fastest)
    centres: tuple[float, ...]
    binning: Binning


def _partition_ok(job: JobView, node: NodeView) -> bool:
    if not job.partition or not node.partitions:
        return True
    return any(p in node.partitions for p in job.partition.split(","))


def place(plan: Plan, snapshot: ClusterSnapshot, strategy: str, locality_penalty: float = 1.5,
          seed: int = 0) -> Plan:
    """``plan`` with ``JobTarget.placement`` filled by ``strategy`` (one of :data:`PLACEMENTS`).

    Only placements, reasons (a short ``; placement ...`` suffix) and notes change. Targets of
    jobs not in the snapshot, of ``busy`` jobs, and with ``nodes == 0`` are returned as they
    are. See the module docstring for the strategies, the capacity rules and the score.

    Raises:
        ValueError: unknown strategy, or a locality penalty that is not positive.
    """
    if strategy not in PLACEMENTS:
        raise ValueError(f"unknown placement {strategy!r} (choose from {', '.join(PLACEMENTS)})")
    if not locality_penalty > 0:
        raise ValueError(f"locality_penalty must be > 0, got {locality_penalty!r}")
    if not plan.targets:
        return plan

    jobs = {j.job_id: j for j in snapshot.jobs}
    usable = {n.name: n for n in sorted(snapshot.nodes, key=lambda n: node_sort_key(n.name))
              if n.usable}
    rank = {name: i for i, name in enumerate(usable)}     # natural name order, for tie-breaks
    gpus_on = _gpus_by_node(snapshot.gpus)
    profiles = profiles_from_views(snapshot.gpus)
    notes: list[str] = []

    # who is (re)placed here
    todo: list[_Job] = []
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
        cls = _class_in(j.app_class, profiles)
        if cls not in sens:
            sens[cls] = sensitivity(cls, profiles)
        todo.append(_Job(pos, t, j, cls, sens[cls]))
    replaced = {x.job.job_id for x in todo}
    targeted = {t.job_id: t for t in plan.targets}

    # capacity left once unmanaged jobs and managed jobs that stay put are counted
    other = dict(snapshot.other_gpus_allocated)
    managed_now: dict[str, int] = {}
    fixed: dict[str, int] = {}
    for j in snapshot.jobs:
        if j.state != "RUNNING":
            continue
        t = targeted.get(j.job_id)
        stays = j.job_id not in replaced and not (t is not None and t.nodes <= 0 and not j.busy)
        for n in set(j.node_names):
            managed_now[n] = managed_now.get(n, 0) + j.workers_per_node
            if stays:
                fixed[n] = fixed.get(n, 0) + j.workers_per_node
    free0 = {}
    for name, node in usable.items():
        unmanaged = max(other.get(name, 0), node.gpus_allocated - managed_now.get(name, 0), 0)
        free0[name] = node.gpus - unmanaged - fixed.get(name, 0)

    speeds: dict[tuple[str, bool], _Speeds] = {}

    def speed(cls: str, binned: bool) -> _Speeds:
        """Per-node speed for ``cls``; with ``binned``, K-Means bins of all measured GPUs."""
        if (cls, binned) not in speeds:
            allg = list(snapshot.gpus)
            vals = [g.slowdown_for(cls) for g in allg]
            b = bin_gpus(vals, seed=seed) if binned else Binning((0,) * len(vals), (), 0)
            raw: dict[str, float] = {}
            nb: dict[str, int] = {}
            for g, v, lab in zip(allg, vals, b.labels):
                raw[g.node] = max(raw.get(g.node, v), v)
                nb[g.node] = max(nb.get(g.node, 0), lab)
            default_bin = b.bin_of(1.0)
            for name in usable:
                if name not in gpus_on:
                    raw[name], nb[name] = 1.0, default_bin
            speeds[(cls, binned)] = _Speeds(raw, nb, b.centres, b)
        return speeds[(cls, binned)]

    def choose(x: _Job, free: dict[str, int]) -> tuple[list[str], str] | None:
        wpn, n = x.job.workers_per_node, x.target.nodes
        cur = set(x.job.node_names)
        elig = [m for m, node in usable.items() if free[m] >= wpn and _partition_ok(x.job, node)]
        if len(elig) < n:
            return None
        if strategy == "packed":
            elig.sort(key=lambda m: (m not in cur, free[m] - wpn, rank[m]))
            return elig[:n], ""
        sp = speed(x.cls, binned=strategy == "pal")
        if strategy == "pm-first":
            elig.sort(key=lambda m: (sp.raw.get(m, 1.0), m not in cur, free[m] - wpn, rank[m]))
            pick = elig[:n]
            v = max(sp.raw.get(m, 1.0) for m in pick)
            return pick, (f"class {x.cls or '-'} slowest GPU {v:.3f}x x locality"
                          f" {locality_factor(n, locality_penalty):g}"
                          f" = {placement_score(v, n, locality_penalty):.3f}")
        # pal: walk the bins fastest first; the first bin with enough nodes fixes V
        for b in sorted({sp.bin.get(m, 0) for m in elig}):
            within = [m for m in elig if sp.bin.get(m, 0) <= b]
            if len(within) >= n:
                within.sort(key=lambda m: (m not in cur, free[m] - wpn, sp.bin.get(m, 0),
                                           sp.raw.get(m, 1.0), rank[m]))
                pick = within[:n]
                v = sp.centres[b] if sp.centres else 1.0
                return pick, (f"class {x.cls or '-'} bin {b + 1}/{max(1, len(sp.centres))}"
                              f" ({v:.3f}x) x locality {locality_factor(n, locality_penalty):g}"
                              f" = {placement_score(v, n, locality_penalty):.3f}")
        return None  # pragma: no cover - the last bin holds every eligible node

    def run(order: list[_Job], sticky_first: bool) -> tuple[dict[str, tuple[list[str], str]], list[_Job]]:
        free = dict(free0)
        got: dict[str, tuple[list[str], str]] = {}
        failed: list[_Job] = []
        rest = order
        if sticky_first:
            rest = []
            for x in order:
                names = sorted(set(x.job.node_names), key=node_sort_key)
                wpn = x.job.workers_per_node
                if x.sticky_ok and all(m in usable and free[m] >= wpn
                                       and _partition_ok(x.job, usable[m]) for m in names):
                    for m in names:
                        free[m] -= wpn
                    got[x.job.job_id] = (names, "kept")
                else:
                    rest.append(x)
        for x in rest:
            c = choose(x, free)
            if c is None:
                failed.append(x)
                continue
            for m in c[0]:
                free[m] -= x.job.workers_per_node
            got[x.job.job_id] = c
        return got, failed

    if strategy == "packed":
        got, failed = run(todo, sticky_first=True)
    else:
        order = sorted(todo, key=lambda x: (-x.sens, x.pos))
        got, failed = run(order, sticky_first=False)
        if failed:
            alt, alt_failed = run(order, sticky_first=True)

            def lost(fs: list[_Job]) -> tuple[int, int]:
                return (sum(x.gpus for x in fs if x.running), sum(x.gpus for x in fs))

            if lost(alt_failed) < lost(failed):
                got, failed = alt, alt_failed
                notes.append(f"placement {strategy}: running jobs kept their nodes so that more jobs fit")

    for x in sorted(failed, key=lambda x: x.pos):
        wpn = x.job.workers_per_node
        have = sum(1 for m, node in usable.items() if free0[m] >= wpn and _partition_ok(x.job, node))
        notes.append(f"placement {strategy}: job {x.job.job_id} needs {x.target.nodes} node(s) with "
                     f">= {wpn} free GPUs; {have} had them before other jobs were placed; "
                     "placement left to Slurm")

    by_pos = {x.pos: x for x in todo}
    failed_pos = {x.pos for x in failed}
    new_targets = []
    for pos, t in enumerate(plan.targets):
        x = by_pos.get(pos)
        if x is None:
            new_targets.append(t)
        elif pos in failed_pos:
            new_targets.append(replace(t, placement=(),
                                       reason=f"{t.reason}; placement {strategy}: does not fit"))
        else:
            names, why = got[x.job.job_id]
            names = sorted(names, key=node_sort_key)
            detail = ",".join(names) + (f" ({why})" if why else "")
            new_targets.append(replace(t, placement=tuple(names),
                                       reason=f"{t.reason}; placement {strategy}: {detail}"))
    notes.insert(0, f"placement: {strategy} (locality penalty {locality_penalty:g}), "
                    f"{len(todo) - len(failed)}/{len(todo)} jobs placed")
    return replace(plan, targets=tuple(new_targets), notes=tuple(plan.notes) + tuple(notes))
