"""The three placement strategies, one chooser each: which ``nodes`` nodes a job takes, given
the GPUs each node has free (module docstring of :mod:`hpcsched.policies.placement`). Pure; the
only randomness is K-Means seeding, from the seed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, NodeView
from hpcsched.policies.placement.binning import Binning, bin_gpus_cached
from hpcsched.policies.placement.scores import gpus_by_node, locality_factor, node_sort_key, placement_score
from hpcsched.protocol.kinds import SlurmState

Choice = tuple[list[str], str]     # node names, and why (empty: nothing to add)


@dataclass
class PlacedJob:
    """A job the stage places: its target, its view, its class as measured, its sensitivity."""

    pos: int                  # index in plan.targets
    target: JobTarget
    job: JobView
    cls: str                  # class name as in the GPU measurements
    sens: float

    @property
    def running(self) -> bool:
        return self.job.state == SlurmState.RUNNING

    @property
    def gpus(self) -> int:
        return self.target.nodes * self.job.workers_per_node

    @property
    def sticky_ok(self) -> bool:
        names = set(self.job.node_names)
        return self.running and self.target.nodes == self.job.nodes and len(names) == self.target.nodes


@dataclass
class Speeds:
    """A class's per-node speeds: the slowest GPU's measured slowdown and its bin."""

    raw: dict[str, float]      # node -> slowest GPU's measured slowdown
    bin: dict[str, int]        # node -> bin of its slowest GPU (0 = fastest)
    centres: tuple[float, ...]
    binning: Binning


def partition_ok(job: JobView, node: NodeView) -> bool:
    """Whether ``node`` is in one of the job's partitions (either unset: yes)."""
    if not job.partition or not node.partitions:
        return True
    return any(p in node.partitions for p in job.partition.split(","))


class Cluster:
    """The usable nodes in natural order, and each class's node speeds (computed once)."""

    def __init__(self, snapshot: ClusterSnapshot, locality_penalty: float, seed: int):
        self.usable = {n.name: n for n in sorted(snapshot.nodes, key=lambda n: node_sort_key(n.name))
                       if n.usable}
        self.rank = {name: i for i, name in enumerate(self.usable)}   # for tie-breaks
        self.locality_penalty, self.seed = locality_penalty, seed
        self._gpus = list(snapshot.gpus)
        self._measured = set(gpus_by_node(snapshot.gpus))
        self._speeds: dict[tuple[str, bool], Speeds] = {}
        self._free_index = {n.name: n.free_index for n in self.usable.values()}
        self._gpu_slow: dict[str, dict[tuple[str, int], float]] = {}
        #: job id -> why its grow was not placed (it keeps its size this round)
        self.vetoed: dict[str, tuple[JobView, str]] = {}
        #: job id -> GPUs taken per node (GPU-granular plans): the placement's ``placement_gpus``
        self.taken: dict[str, dict[str, int]] = {}
        #: job id -> (GPUs, why): a grow trimmed to the GPUs that pay
        self.trimmed: dict[str, tuple[int, str]] = {}

    def free_index(self) -> dict[str, list[int]] | None:
        """Each usable node's free GPU indexes, lowest first (a copy to consume), or ``None``
        when some node's are not known."""
        if not self._gpus or any(v is None for v in self._free_index.values()):
            return None
        return {m: list(v or ()) for m, v in self._free_index.items()}

    def gpu_slowdowns(self, cls: str) -> dict[tuple[str, int], float]:
        """``(node, index) -> slowdown`` for ``cls`` of every measured GPU."""
        if cls not in self._gpu_slow:
            self._gpu_slow[cls] = {(g.node, g.index): g.slowdown_for(cls) for g in self._gpus}
        return self._gpu_slow[cls]

    def eligible(self, job: JobView, free: dict[str, int]) -> list[str]:
        """Usable nodes of the job's partition with ``workers_per_node`` GPUs free."""
        return [m for m, node in self.usable.items()
                if free[m] >= job.workers_per_node and partition_ok(job, node)]

    def speed(self, cls: str, binned: bool) -> Speeds:
        """Per-node speed for ``cls``; with ``binned``, K-Means bins of all measured GPUs."""
        if (cls, binned) not in self._speeds:
            vals = [g.slowdown_for(cls) for g in self._gpus]
            b = (bin_gpus_cached(tuple(vals), seed=self.seed) if binned
                 else Binning((0,) * len(vals), (), 0))
            raw: dict[str, float] = {}
            nb: dict[str, int] = {}
            for g, v, lab in zip(self._gpus, vals, b.labels):
                raw[g.node] = max(raw.get(g.node, v), v)
                nb[g.node] = max(nb.get(g.node, 0), lab)
            default_bin = b.bin_of(1.0)
            for name in self.usable:
                if name not in self._measured:
                    raw[name], nb[name] = 1.0, default_bin
            self._speeds[(cls, binned)] = Speeds(raw, nb, b.centres, b)
        return self._speeds[(cls, binned)]

    def why(self, cls: str, what: str, v: float, n: int) -> str:
        pen = self.locality_penalty
        return (f"class {cls or '-'} {what} x locality {locality_factor(n, pen):g}"
                f" = {placement_score(v, n, pen):.3f}")


def choose_packed(x: PlacedJob, elig: list[str], free: dict[str, int], cluster: Cluster
                  ) -> Choice | None:
    """Packed: its current nodes first, then best-fit (fewest GPUs left over), lowest name."""
    cur, wpn = set(x.job.node_names), x.job.workers_per_node
    elig.sort(key=lambda m: (m not in cur, free[m] - wpn, cluster.rank[m]))
    return elig[: x.target.nodes], ""


def choose_pm_first(x: PlacedJob, elig: list[str], free: dict[str, int], cluster: Cluster
                    ) -> Choice | None:
    """PM-First: the nodes fastest for the job's class (measured slowdown), then as packed."""
    cur, wpn, n = set(x.job.node_names), x.job.workers_per_node, x.target.nodes
    sp = cluster.speed(x.cls, binned=False)
    elig.sort(key=lambda m: (sp.raw.get(m, 1.0), m not in cur, free[m] - wpn, cluster.rank[m]))
    pick = elig[:n]
    v = max(sp.raw.get(m, 1.0) for m in pick)
    return pick, cluster.why(x.cls, f"slowest GPU {v:.3f}x", v, n)


def choose_pal(x: PlacedJob, elig: list[str], free: dict[str, int], cluster: Cluster
               ) -> Choice | None:
    """PAL: walk the bins fastest first; the first bin with enough nodes fixes V, and within it
    locality decides (current nodes, best-fit, bin, measured slowdown, name)."""
    cur, wpn, n = set(x.job.node_names), x.job.workers_per_node, x.target.nodes
    sp = cluster.speed(x.cls, binned=True)
    for b in sorted({sp.bin.get(m, 0) for m in elig}):
        within = [m for m in elig if sp.bin.get(m, 0) <= b]
        if len(within) >= n:
            within.sort(key=lambda m: (m not in cur, free[m] - wpn, sp.bin.get(m, 0),
                                       sp.raw.get(m, 1.0), cluster.rank[m]))
            v = sp.centres[b] if sp.centres else 1.0
            what = f"bin {b + 1}/{max(1, len(sp.centres))} ({v:.3f}x)"
            return within[:n], cluster.why(x.cls, what, v, n)
    return None  # pragma: no cover - the last bin holds every eligible node


Chooser = Callable[[PlacedJob, list[str], dict[str, int], Cluster], Choice | None]
CHOOSERS: dict[str, Chooser] = {"packed": choose_packed, "pm-first": choose_pm_first,
                                "pal": choose_pal}
