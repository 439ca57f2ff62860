"""The simulated Slurm cluster: nodes of GPUs, which are free, how slow each GPU is, and what
``squeue``/``sinfo`` would report (:class:`SimBackend`, the daemon's backend interface).

Placement rule (what Slurm does without hpcsched): a job with a node list (``ReqNodeList``)
starts only on those nodes; otherwise on the nodes with the fewest free GPUs that still hold its
GPUs per node, lowest name first; on a node it takes the lowest-numbered free GPUs.

Units: GPUs; slowdowns are multipliers of a median GPU's step time (1 = median).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from hpcsched.model.snapshot import GPUView, NodeView
from hpcsched.protocol.kinds import SlurmState
from hpcsched.sim import physics
from hpcsched.slurm import JobInfo
from hpcsched.slurm.observe import Observation

if TYPE_CHECKING:  # pragma: no cover
    from hpcsched.sim.engine import Simulator

#: PAL's application classes (Jain et al., SC'24, §3), the variability classes of the GPUs
CLASSES = ("A", "B", "C", "D")

#: the simulated cluster's one partition
PARTITION = "sim"

#: the user of other users' plain jobs (:attr:`hpcsched.sim.WorkloadJob.rigid`) in ``squeue``
FOREIGN_USER = "other"


class SimCluster:
    """``nodes`` x ``gpus_per_node`` GPUs named ``n1..nN``; a boolean matrix of free GPUs and a
    ``(nodes, gpus_per_node, len(CLASSES))`` matrix of per-GPU slowdowns, drawn from PAL's
    Longhorn measurements with ``variability`` (seeded by ``seed``), else all 1."""

    def __init__(self, nodes: int, gpus_per_node: int, variability: bool | str = False,
                 seed: int = 0):
        self.gpus_per_node = gpus_per_node
        self.node_names = tuple(f"n{i + 1}" for i in range(nodes))
        self.node_index = {n: i for i, n in enumerate(self.node_names)}
        self.free = np.ones((nodes, gpus_per_node), dtype=bool)
        if variability:
            draw = physics.pal_gpu_slowdowns if variability == "pal" else physics.draw_gpu_slowdowns
            self.slow = draw(nodes * gpus_per_node, CLASSES, seed).reshape(
                nodes, gpus_per_node, len(CLASSES))
        else:
            self.slow = np.ones((nodes, gpus_per_node, len(CLASSES)))
        self.gpu_views = self._gpu_views() if variability else ()

    def _gpu_views(self) -> tuple[GPUView, ...]:
        return tuple(GPUView(node=self.node_names[n], index=g,
                             slowdown=tuple((c, float(self.slow[n, g, k]))
                                            for k, c in enumerate(CLASSES)))
                     for n in range(len(self.node_names)) for g in range(self.gpus_per_node))

    def slowdown(self, app_class: str, gpus: Iterable[tuple[int, int]]) -> float:
        """The slowest of ``gpus`` (``(node index, gpu index)``) for ``app_class``: the pace a
        data-parallel job runs at (PAL §3). 1 for a class without measurements or no GPUs."""
        gpus = tuple(gpus)
        if app_class not in CLASSES or not gpus:
            return 1.0
        k = CLASSES.index(app_class)
        return float(max(self.slow[n, g, k] for n, g in gpus))

    def allocate(self, nodes: int, per_node: int, required: Sequence[str] = (),
                 fastest_for: str | None = None
                 ) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]] | None:
        """Take ``nodes`` x ``per_node`` GPUs by Slurm's rule (module docstring); returns the
        node names and the ``(node index, gpu index)`` taken, or ``None`` if they do not fit now
        (nothing taken). ``fastest_for``: a class whose fastest free GPUs each node gives
        (lowest number first among equals) instead of its lowest-numbered, as PAL's simulator
        places on GPUs (a what-if: Slurm does not let a job choose them)."""
        free = self.free.sum(axis=1)
        if required:
            idx = [self.node_index[n] for n in required]
            if len(idx) != nodes or any(free[i] < per_node for i in idx):
                return None
        else:
            fits = [i for i in range(len(self.node_names)) if free[i] >= per_node]
            if len(fits) < nodes:
                return None
            idx = sorted(sorted(fits, key=lambda i: (free[i], i))[:nodes])
        gpus = []
        k = CLASSES.index(fastest_for) if fastest_for in CLASSES else None
        for i in idx:
            g = np.flatnonzero(self.free[i])
            if k is not None:
                g = g[np.argsort(self.slow[i, g, k], kind="stable")]
            g = np.sort(g[:per_node])
            self.free[i, g] = False
            gpus.extend((i, int(x)) for x in g)
        return tuple(self.node_names[i] for i in idx), tuple(gpus)

    def allocate_gpus(self, count: int, required: Sequence[str] = ()
                      ) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]] | None:
        """Take ``count`` GPUs on any nodes, packed (a GPU-granular job: ``--gpus=count``):
        while some node holds what is left, the one with the fewest free GPUs that does (best
        fit); else the node with the most free GPUs, all of them. With ``required`` only those
        nodes are used. Returns the node names (in node order) and the ``(node index, gpu
        index)`` taken, or ``None`` if they do not fit now (nothing taken)."""
        free = self.free.sum(axis=1)
        allowed = ([self.node_index[n] for n in required] if required
                   else list(range(len(self.node_names))))
        if sum(int(free[i]) for i in allowed) < count:
            return None
        left, take = count, {}
        avail = {i: int(free[i]) for i in allowed if free[i] > 0}
        while left > 0:
            fits = [i for i, f in avail.items() if f >= left]
            i = (min(fits, key=lambda k: (avail[k], k)) if fits
                 else max(avail, key=lambda k: (avail[k], -k)))
            n = min(left, avail.pop(i))
            take[i] = n
            left -= n
        gpus = []
        for i in sorted(take):
            g = np.flatnonzero(self.free[i])[:take[i]]
            self.free[i, g] = False
            gpus.extend((i, int(x)) for x in g)
        return tuple(self.node_names[i] for i in sorted(take)), tuple(gpus)

    def release(self, gpus: Iterable[tuple[int, int]]) -> None:
        """Give ``gpus`` (``(node index, gpu index)``) back."""
        for n, g in gpus:
            self.free[n, g] = True

    def node_views(self) -> tuple[NodeView, ...]:
        """The nodes as ``sinfo`` reports them."""
        used = (~self.free).sum(axis=1)
        cap = self.gpus_per_node
        return tuple(NodeView(name=n, gpus=cap, gpus_allocated=int(used[i]),
                              state="mixed" if 0 < used[i] < cap else
                              ("allocated" if used[i] else "idle"), partitions=(PARTITION,),
                              free_index=tuple(int(g) for g in np.flatnonzero(self.free[i])))
                     for i, n in enumerate(self.node_names))


class SimBackend:
    """The simulated cluster behind :class:`hpcsched.slurm.observe.Backend`: ``observe()``
    reports its nodes and jobs as Slurm would (``squeue``/``sinfo``), one call per observation."""

    name = "simulated"

    def __init__(self, sim: Simulator):
        self._sim = sim
        self.calls = 0

    def with_planned_nodes(self, obs: Observation) -> Observation:
        return obs   # the simulated Slurm plans no starts (hpcsched.sim.engine)

    def observe(self, jobs_only: bool = False) -> Observation:
        self.calls += 1
        return Observation(time=self._sim.now, nodes=() if jobs_only else self._sim.cluster.node_views(),
                           jobs=MappingProxyType(self._sim.job_infos()), calls=1)


def job_info(job_id: str, name: str, state: str, nodes: Sequence[str], node_count: int,
             gpus_per_node: int, restarts: int, priority: int, user: str = "sim") -> JobInfo:
    """A simulated job as ``squeue`` reports it."""
    return JobInfo(job_id=job_id, name=name, user=user, state=state,
                   state_reason="None" if state == SlurmState.RUNNING else "Resources",
                   partition=PARTITION, nodes=",".join(nodes), node_count=node_count,
                   gpus_per_node=gpus_per_node, restarts=restarts,
                   batch_host=(tuple(nodes) or ("",))[0], priority=priority)


__all__ = ["CLASSES", "FOREIGN_USER", "PARTITION", "SimBackend", "SimCluster", "job_info"]
