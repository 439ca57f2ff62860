"""How a GPU-granular plan becomes real on Slurm: the mechanism of each change, decided once.

A plan gives a job GPUs per node. Slurm (22.05 to 26.05) cannot grow a running GPU job nor
release part of its GRES, so a job is its **primary** Slurm job (what ``hpcsub`` submitted, the
same GPUs on each of its nodes) plus **extension** jobs, each some GPUs on one node
(``docs/extensions.md``). Which mechanism reaches a target, and what it costs the job, is
decided here, for reconcile (which prices a change by it), the daemon (which carries it out)
and the simulator (which follows the same rules):

======================  ==============================================  ==================
mechanism               when                                            seconds it costs
======================  ==============================================  ==================
``start``               a pending job starts: its primary at the        ``restart_cost``
                        job's fewest GPUs (:func:`primary_shape`), the
                        rest by ``extend`` once it runs
``extend``              a running job grows: extension jobs on the      ``grow_cost``
                        nodes the plan names, no worker restarts        (start-up x lost
                                                                        rate + stall)
``release``             a running job shrinks within its extensions,    ``extension_stall``
                        all of a node's extension GPUs at a time: the
                        released ranks leave at a step boundary
``shrink-primary``      a shrink below its extensions, by whole         ``shrink_cost``
                        primary nodes: released in place (Slurm keeps
                        the first nodes)
``requeue``             any other shrink into the primary: checkpoint,  ``restart_cost``
                        requeue onto the same GPUs on every node
======================  ==============================================  ==================

The rule for the primary's shape: **a job the daemon starts has its fewest GPUs as its primary
and all its growth as extensions**, so every later shrink within its limits is a ``release``
(no checkpoint, no restart: 0.15 s to the new size on the dev cluster, ``docs/extensions.md``),
and a requeue is only ever needed for a job Slurm started at its own request. Units: GPUs,
seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from hpcsched.model.snapshot import JobView


class Mechanism(str, Enum):
    """How a change of a job's GPUs is carried out on Slurm (module docstring)."""

    START = "start"
    EXTEND = "extend"
    RELEASE = "release"
    SHRINK_PRIMARY = "shrink-primary"
    REQUEUE = "requeue"

    def __str__(self) -> str:
        return self.value


Layout = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Realisation:
    """What a change makes real: its mechanism and the job's allocation after it.

    Attributes:
        mechanism: how (:class:`Mechanism`).
        layout: ``((node, GPUs), ...)``, the whole allocation after the change, the primary's
            nodes first; empty when Slurm picks the nodes (a start with no placement).
    """

    mechanism: Mechanism
    layout: Layout = ()

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.layout)


def primary_shape(fewest: int, node_size: int) -> tuple[int, int]:
    """``(nodes, GPUs per node)`` of a primary Slurm job holding at least ``fewest`` GPUs with
    the same GPUs on every node (``NumNodes`` x ``TresPerNode``), on nodes of ``node_size``
    GPUs: the fewest nodes, then the fewest GPUs per node (``fewest`` 2 -> 1 x 2; 8 -> 2 x 4;
    6 -> 2 x 3; 5 -> 2 x 3)."""
    fewest, node_size = max(1, fewest), max(1, node_size)
    nodes = -(-fewest // node_size)
    return nodes, -(-fewest // nodes)


def exact_shape(gpus: int, node_size: int) -> tuple[int, int]:
    """``(nodes, GPUs per node)`` giving exactly ``gpus`` GPUs with the same GPUs on every node
    of ``node_size`` GPUs, as a user asks Slurm for them: one node when they fit on one, else the
    largest GPUs per node that divides ``gpus`` (6 on 4-GPU nodes: 2 x 3; 5: 5 x 1)."""
    if gpus <= node_size:
        return 1, gpus
    for per_node in range(node_size, 0, -1):
        if gpus % per_node == 0:
            return gpus // per_node, per_node
    return gpus, 1  # pragma: no cover - 1 always divides


def start(job: JobView, node_size: int, placement: tuple[str, ...] = (),
          free: Mapping[str, int] | None = None) -> Realisation:
    """A pending ``job`` started by the plan: its primary at its fewest GPUs
    (:func:`primary_shape`), on the first nodes of ``placement`` when it names enough, else on
    the nodes of ``free`` (free GPUs per node) with the fewest free GPUs that hold its GPUs per
    node (Slurm's best fit); no layout (Slurm chooses) when neither does."""
    nodes, per = primary_shape(job.min_gpus, node_size)
    if len(placement) < nodes:
        avail = free or {}
        fits = sorted((n for n, f in avail.items() if f >= per), key=lambda n: (avail[n], n))
        placement = tuple(fits)
    if len(placement) < nodes:
        return Realisation(Mechanism.START)
    return Realisation(Mechanism.START, tuple((n, per) for n in placement[:nodes]))


def shrink(job: JobView, to_gpus: int, node_size: int) -> Realisation:
    """Running ``job`` shrunk to at most ``to_gpus`` GPUs (fewer than it holds), by the cheapest
    mechanism (module docstring): extension GPUs first, every one on a node at a time
    (:func:`release_nodes`: the layout may hold fewer than ``to_gpus``); then whole primary
    nodes, its last first; otherwise a requeue onto :func:`requeue_layout`."""
    held = job.allocation()
    primary = job.primary_allocation()
    extra = {n: g - primary.get(n, 0) for n, g in held.items() if g > primary.get(n, 0)}
    drop = sum(held.values()) - to_gpus
    if drop <= sum(extra.values()):
        return Realisation(Mechanism.RELEASE, _release(held, extra, drop))
    per = set(primary.values())
    if len(per) == 1 and to_gpus % next(iter(per)) == 0 and to_gpus >= next(iter(per)):
        keep = list(primary)[: to_gpus // next(iter(per))]
        return Realisation(Mechanism.SHRINK_PRIMARY, tuple((n, primary[n]) for n in keep))
    return Realisation(Mechanism.REQUEUE, requeue_layout(held, to_gpus, node_size))


def _release(held: dict[str, int], extra: dict[str, int], drop: int) -> Layout:
    """``held`` less the extension GPUs of the nodes :func:`release_nodes` picks."""
    gone = release_nodes(extra, drop)
    return tuple((n, g - (extra[n] if n in gone else 0)) for n, g in held.items()
                 if g - (extra[n] if n in gone else 0) > 0)


def release_nodes(extra: Mapping[str, int], drop: int) -> tuple[str, ...]:
    """The nodes whose extension GPUs (``extra``: node -> GPUs held beyond the primary's) to
    release, *all of them on each*, to give back at least ``drop`` GPUs (pure; ``()`` when all
    of them are fewer). Never part of a node's: an extension is one Slurm job on one node, whose
    GRES Slurm cannot cut, so going from 4 to 3 GPUs there would mean a new extension of 3
    beside the old one of 4 until the old one leaves, which a full node never lets start (seen
    on the dev cluster: the generation waited until the job ended). Of the sets of nodes that
    give enough, the one that gives fewest GPUs, then the one of fewest nodes, then nodes
    listed last (the job stays packed)."""
    if drop <= 0 or sum(extra.values()) < drop:
        return ()
    # subset sums, fewest nodes first, the nodes listed last first (small: GPUs per node x nodes)
    best: dict[int, tuple[str, ...]] = {0: ()}
    for n in reversed(list(extra)):
        for total, nodes in sorted(best.items(), reverse=True):
            t = total + extra[n]
            if t not in best or len(nodes) + 1 < len(best[t]):
                best[t] = (*nodes, n)
    return best[min(t for t in best if t >= drop)]


def batch_on(job: JobView, batch_size: int, gpus: int) -> int:
    """``batch_size`` (samples) as ``gpus`` GPUs can run it within ``job``'s limits: the nearest
    (:meth:`~hpcsched.protocol.limits.JobLimits.fit_batch_gpus`), else ``batch_size`` as it is
    (the daemon and the simulator refit it where they apply the change)."""
    try:
        return job.limits.fit_batch_gpus(batch_size, gpus).global_batch_size
    except ValueError:
        return batch_size


def requeue_layout(held: dict[str, int], gpus: int, node_size: int) -> Layout:
    """The layout a job requeued onto ``gpus`` GPUs asks for: exactly that many, the same on
    every node (:func:`exact_shape`), on the nodes it held most GPUs on (they are free again
    when it pends)."""
    nodes, per = exact_shape(gpus, node_size)
    order = sorted(held, key=lambda n: (-held[n], list(held).index(n)))
    return tuple((n, per) for n in order[:nodes]) if len(order) >= nodes else ()


def cost(mechanism: Mechanism, *, restart_cost: float, shrink_cost: float, stall: float,
         grow_cost: float) -> float:
    """Seconds ``mechanism`` costs the job (module docstring's table); ``grow_cost`` is the
    extension grow's (:func:`hpcsched.model.snapshot.grow_cost`)."""
    return {Mechanism.START: restart_cost, Mechanism.EXTEND: grow_cost,
            Mechanism.RELEASE: stall, Mechanism.SHRINK_PRIMARY: shrink_cost,
            Mechanism.REQUEUE: restart_cost}[mechanism]


__all__ = ["Layout", "Mechanism", "Realisation", "cost", "exact_shape", "primary_shape",
           "requeue_layout", "shrink", "start"]
