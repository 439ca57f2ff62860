"""``pollux``: Pollux's allocation policy (Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for
Goodput-Optimized Deep Learning", OSDI'21, §4.1-4.2), as its artifact runs it in Pollux's own
simulator (github.com/petuum/adaptdl, branch ``osdi21-artifact``, ``simulator/pollux.py`` and
``simulator/simulator.py``; read for behaviour, the code here is our own, numpy instead of
pymoo's NSGA-II).

Every job, running or pending, is a candidate every round. A candidate allocation is a matrix
of GPUs per node (jobs x nodes, :mod:`hpcsched.policies.pollux_search`); a job may get none (a
running one is then preempted). Its value:

* **speedup** (§4.1): ``SPEEDUP_j(A_j) = max_m GOODPUT_j(A_j, m) / max_m GOODPUT_j(a_f, m)``, the
  best goodput over batch sizes ``m`` (:func:`hpcsched.perf.model.best_at`: throughput x
  statistical efficiency, the co-adapted batch size) at the job's GPUs on the nodes it spans,
  over the same at its fair share ``a_f``: ``ceil(K / J)`` GPUs for ``K`` GPUs and ``J`` jobs, as
  the artifact's ``fair_replicas`` -- kept within the job's own limits (its allowed GPU counts
  at the snapshot's granularity) and packed onto full nodes (the artifact evaluates it on one
  node, a shape our nodes do not have; the difference is small: docs/design-notes.md,
  "policies/pollux.py");
* **restart penalty** (the artifact's ``_evaluate``): a job whose row differs from its current
  allocation has its speedup scaled by ``max(age - restarts * R, 0) / (age + R)``, ``age`` =
  seconds since submission, ``R`` = ``restart_penalty`` (30 s): a young or often-restarted job
  is moved only for a large gain;
* **fitness** (§4.1, eq. 4): the power mean with ``p = -1`` of the speedups (each scaled by
  nodes / GPUs as the artifact does), which favours raising the worst-off jobs (fairness).

Per job limits (the artifact's ``get_pollux_job_info``): at most ``max(2 x the most GPUs it has
been measured on, 1)`` GPUs -- it earns larger allocations by running on smaller ones
(``explore``; its current GPUs are always allowed) -- and its own maximum; at node granularity
whole nodes of its workers per node within ``[min_nodes, max_nodes]``. A job whose throughput
nothing predicts yet (no profile, no prior) has a speedup linear in its GPUs, as the artifact's,
and is given at most what it asked for (its requested size when pending, its size when running).
Busy jobs (a resize in flight, or starting) are held where they are and their GPUs are not
searched over.

The search starts from the population kept from the previous round (adapted to the jobs and
nodes of this one, as the artifact's ``_adapt_prev_states``) plus the current allocation, and
runs ``generations`` generations of ``population`` children (the artifact's crossover and
repair; a focused raise mutation by default, see :mod:`hpcsched.policies.pollux_search`). The
population is kept for the next round, so the search goes on across rounds (as the artifact's).
The best state is the plan: each job's target names the nodes it holds GPUs on
(``placement``), their count (``nodes``) and, at GPU granularity, its GPUs; the batch size is
the one that gives the goodput; ``weight = 1 / goodput at the fair share``, so reconcile judges
the plan by speedups (Pollux's own objective, linearised). Objective reported: the fitness of
the plan. Deterministic for a snapshot, seed and carried population.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, Plan
from hpcsched.perf.model import JobModel, best_at, model_for
from hpcsched.policies.base import Params, PolicyBase
from hpcsched.policies.common import capacity, gpu_counts, max_gpus, min_gpus, nodes_spanned, target
from hpcsched.policies.pollux_search import Problem, evolve, fitness
from hpcsched.protocol.kinds import Granularity, SlurmState


@dataclass
class _Round:
    """What one decision searches over: the jobs (priority order), the nodes, the problem and
    the goodput table behind the speedups."""

    jobs: list[JobView]
    nodes: list[str]
    models: list[JobModel | None]
    fair: np.ndarray              # (J,) goodput at the fair share, samples/s (relative if no model)
    table: np.ndarray             # (J, N+1, G+1) goodput at (nodes, GPUs); NaN: not computed yet
    prob: Problem
    snapshot: ClusterSnapshot

    def goodput(self, j: int, nodes: int, gpus: int) -> float:
        x = self.table[j, nodes, gpus]
        if np.isnan(x):
            x = best_at(self.jobs[j], self.models[j], gpus, nodes)[0] if gpus > 0 else 0.0
            self.table[j, nodes, gpus] = x
        return float(x)

    def speedup(self, states: np.ndarray) -> np.ndarray:
        """(P, J) speedups of ``states`` (P, J, N); fills the table where it is missing."""
        n = np.count_nonzero(states, axis=2)
        g = states.sum(axis=2)
        jj = np.broadcast_to(np.arange(states.shape[1])[None, :], n.shape)
        x = self.table[jj, n, g]
        miss = np.isnan(x)
        if miss.any():
            for j, nn, gg in np.unique(np.stack([jj[miss], n[miss], g[miss]], axis=1), axis=0):
                self.goodput(int(j), int(nn), int(gg))
            x = self.table[jj, n, g]
        return x / self.fair[None, :]


@dataclass(frozen=True)
class PolluxParams(Params):
    """``pollux``'s parameters.

    Attributes:
        population: states kept and children per generation (the artifact: 100).
        generations: per round (the artifact: 100). The defaults were measured against other
            sizes in the simulator (docs/design-notes.md, "policies/pollux.py"). Both are cut
            at large scale: ``population <= max_work / (4 x jobs x nodes)``, ``generations <=
            max_work / (population x jobs x nodes)``.
        p: exponent of the power mean of speedups (Pollux §4.1: -1).
        restart_penalty: seconds ``R`` of the restart factor (the artifact's ``delay``: 30 s).
        interval: seconds between searches (Pollux's round, 60 s); a decision sooner than that
            after the last one re-uses the kept population, repaired to the snapshot, without
            new generations.
        explore: cap each job at twice the most GPUs it has been measured on (the artifact).
        mutation: ``"focused"`` (default) or ``"artifact"``: how children raise allocations
            (:mod:`hpcsched.policies.pollux_search`; the artifact's leaves jobs without GPUs
            that a focused raise gives some).
        max_work: bound on ``population x generations x jobs x nodes`` (matrix cells searched).

    Raises (when made):
        ValueError: a parameter out of range or of the wrong type.
    """

    population: int = 64
    generations: int = 40
    p: float = -1.0
    restart_penalty: float = 30.0
    interval: float = 60.0
    explore: bool = True
    mutation: str = "focused"
    max_work: float = 4e6

    def check(self) -> None:
        if (self.population < 2 or self.generations < 0 or self.restart_penalty < 0
                or self.interval < 0 or self.max_work <= 0
                or self.mutation not in ("focused", "artifact")):
            raise ValueError("population >= 2, generations >= 0, restart_penalty >= 0, "
                             "interval >= 0, max_work > 0, mutation 'focused' or 'artifact'")


class Pollux(PolicyBase):
    """Pollux's allocation policy (module docstring). Keeps its population between rounds.

    Parameters: :class:`PolluxParams`.

    Raises (constructor):
        PolicyError: an unknown key or a bad value (the message lists the valid keys).
    """

    name = "pollux"
    Params = PolluxParams
    #: reconcile's gate for this policy's plans (:func:`hpcsched.policies.round.decide_round`):
    #: Pollux prices restarts itself (the restart factor in every job's speedup) and has no
    #: minimum gain nor hold, so reconcile only checks its plans against what Slurm can place
    #: now. Without the daemon's gate its average JCT was lower (measured:
    #: docs/design-notes.md, "policies/pollux.py").
    reconcile_gate = MappingProxyType({"min_gain": 0.0, "hold": 0.0})

    def __init__(self, **values):
        super().__init__(**values)
        p = self.params
        self.mutation = p.mutation
        self.population, self.generations, self.p = p.population, p.generations, p.p
        self.restart_penalty, self.interval = p.restart_penalty, p.interval
        self.explore, self.max_work = p.explore, p.max_work
        self._kept: tuple[list[str], list[str], np.ndarray] | None = None  # jobs, nodes, states
        self._last: float | None = None

    # ------------------------------------------------------------------------------ decide
    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        """One round (module docstring)."""
        rng = np.random.default_rng(seed)
        r = self._round(snapshot)
        if r is None:
            self._kept = None
            return Plan(self.name, (), None, ("pollux: no job to allocate, or no GPU to allocate",))
        J, N = len(r.jobs), len(r.nodes)
        population = max(2, min(self.population, int(self.max_work // max(1, J * N * 4))))
        generations = min(self.generations, int(self.max_work // max(1, population * J * N)))
        if self._last is not None and snapshot.time - self._last < self.interval:
            generations = 0
        else:
            self._last = snapshot.time
        start = np.concatenate([r.prob.base[None].astype(np.int16), self._carried(r)])
        states, fits = evolve(r.prob, start, r.speedup, population, generations, rng)
        self._kept = ([j.job_id for j in r.jobs], list(r.nodes), states)
        targets = [self._target(r, j, states[0][j]) for j in range(J)]
        return Plan(self.name, tuple(targets), float(fits[0]),
                    (f"pollux: {J} job(s) on {int(r.prob.cap.sum())} GPU(s) of {N} node(s): "
                     f"fitness {fits[0]:.3g} (power mean p={self.p:g} of speedups) after "
                     f"{generations} generation(s) of {population}",))

    def _carried(self, r: _Round) -> np.ndarray:
        """The kept population mapped onto this round's jobs and nodes (new jobs: nothing)."""
        if self._kept is None:
            return np.zeros((0, len(r.jobs), len(r.nodes)), dtype=np.int16)
        jobs, nodes, states = self._kept
        out = np.zeros((len(states), len(r.jobs), len(r.nodes)), dtype=np.int16)
        ji = {k: i for i, k in enumerate(jobs)}
        ni = {k: i for i, k in enumerate(nodes)}
        src_j = [(d, ji[j.job_id]) for d, j in enumerate(r.jobs) if j.job_id in ji]
        src_n = [(d, ni[n]) for d, n in enumerate(r.nodes) if n in ni]
        if src_j and src_n:
            dj, sj = map(list, zip(*src_j))
            dn, sn = map(list, zip(*src_n))
            out[:, np.array(dj)[:, None], np.array(dn)[None, :]] = \
                states[:, np.array(sj)[:, None], np.array(sn)[None, :]]
        return out

    # ------------------------------------------------------------------------------ round
    def _round(self, snapshot: ClusterSnapshot) -> _Round | None:
        """This round's search: ``None`` when there is no job or no GPU to allocate."""
        names, cap = _nodes(snapshot)
        jobs = sorted((j for j in snapshot.jobs if not j.busy and j.state in (SlurmState.RUNNING, SlurmState.PENDING)),
                      key=lambda j: (j.attained_gpu_seconds, j.submit_time, j.job_id))
        if not jobs or not names or cap.sum() <= 0:
            return None
        models = [model_for(j) for j in jobs]
        limits = np.array([self._limits(j, m, snapshot) for j, m in zip(jobs, models)],
                          dtype=np.int64).reshape(len(jobs), 3)
        table = np.full((len(jobs), len(names) + 1, max(int(limits[:, 1].max()), 1) + 1), np.nan)
        table[:, :, 0] = 0.0
        k = capacity(snapshot)
        fair = np.array([self._fair(j, m, k, len(jobs), snapshot) for j, m in zip(jobs, models)])
        whole = snapshot.granularity == Granularity.NODE
        prob = Problem(
            cap=cap, base=_base(jobs, names),
            unit=np.array([j.workers_per_node if whole else 1 for j in jobs], dtype=np.int64),
            whole=whole, lo=limits[:, 0], hi=limits[:, 1], max_nodes=limits[:, 2],
            factor=np.array([self._factor(j, snapshot.time) for j in jobs]),
            scale=len(names) / max(1, k), p=self.p, focused=self.mutation == "focused")
        return _Round(jobs, names, models, fair, table, prob, snapshot)

    def _limits(self, job: JobView, model: JobModel | None, snapshot: ClusterSnapshot
                ) -> tuple[int, int, int]:
        """``(fewest GPUs, most GPUs, most nodes)`` the job may get this round."""
        counts = list(gpu_counts(job, snapshot))
        lo = min_gpus(job, snapshot)
        if model is None:   # nothing predicts it: at most what it asked for / holds
            cap = max(lo, min(job.gpus, max_gpus(job)))
        elif self.explore:
            measured = max((p.world_size for p in job.profile), default=0)
            held = job.gpus if job.state == SlurmState.RUNNING else 0
            cap = max(2 * measured, 1, held)
        else:
            cap = max_gpus(job)
        hi = max((c for c in counts if c <= cap), default=counts[0] if counts else 0)
        if snapshot.granularity == Granularity.NODE:
            return lo, hi, job.max_nodes
        return lo, hi, max(1, min(hi, len(snapshot.nodes)))

    @staticmethod
    def _fair(job: JobView, model: JobModel | None, k: int, n_jobs: int,
              snapshot: ClusterSnapshot) -> float:
        """Goodput at the fair share (module docstring); 1 when the job can run on no size."""
        share = math.ceil(k / max(1, n_jobs))
        counts = [c for c in gpu_counts(job, snapshot) if c <= share] or [min_gpus(job, snapshot)]
        for g in sorted(counts, reverse=True):
            x, cfg = best_at(job, model, g, nodes_spanned(job, g, snapshot))
            if cfg is not None and x > 0:
                return float(x)
        return 1.0

    def _factor(self, job: JobView, now: float) -> float:
        """The restart factor ``max(age - restarts * R, 0) / (age + R)`` (module docstring)."""
        age = max(0.0, now - job.submit_time)
        r = self.restart_penalty
        return max(age - job.restarts * r, 0.0) / (age + r) if age + r > 0 else 1.0

    # ----------------------------------------------------------------------------- targets
    def _target(self, r: _Round, j: int, row: np.ndarray) -> JobTarget:
        job, snap = r.jobs[j], r.snapshot
        weight = float(1.0 / r.fair[j])
        used = np.nonzero(row)[0]
        g = int(row.sum())
        if g == 0:
            why = "preempted" if job.state == SlurmState.RUNNING else "waits"
            t = target(job, 0, job.batch_size, f"pollux: {why}: no GPUs in the fittest allocation",
                       snap)
            return replace(t, weight=weight)
        placement = tuple(r.nodes[i] for i in sorted(used, key=lambda i: (-int(row[i]), i)))
        x, cfg = best_at(job, r.models[j], g, len(used))
        batch = cfg.global_batch_size if cfg is not None else job.batch_size
        known = r.models[j] is not None
        reason = (f"pollux: speedup {x / r.fair[j]:.2f} x its fair share at {g} GPU(s) on "
                  f"{len(used)} node(s), batch {batch}" if known else
                  f"pollux: not measured yet: {g} GPU(s), batch {batch}")
        t = target(job, g, batch, reason, snap, x if known else None, placement)
        return replace(t, nodes=len(used), weight=weight)


def _nodes(snapshot: ClusterSnapshot) -> tuple[list[str], np.ndarray]:
    """The usable nodes' names and (N,) the GPUs each may give the searched jobs: its GPUs
    less those of unmanaged jobs and of busy jobs (held where they are)."""
    other = dict(snapshot.other_gpus_allocated)
    usable = [n for n in snapshot.nodes if n.usable]
    names = [n.name for n in usable]
    cap = np.array([max(0, n.gpus - other.get(n.name, 0)) for n in usable], dtype=np.int64)
    index = {n: i for i, n in enumerate(names)}
    for j in snapshot.jobs:
        for name, g in (_layout(j) if j.busy else ()):
            if name in index:
                cap[index[name]] = max(0, cap[index[name]] - g)
    return names, cap


def _base(jobs: list[JobView], names: list[str]) -> np.ndarray:
    """(J, N) the current allocation: GPUs of each running job on each node."""
    index = {n: i for i, n in enumerate(names)}
    base = np.zeros((len(jobs), len(names)), dtype=np.int16)
    for i, j in enumerate(jobs):
        for name, g in (_layout(j) if j.state == SlurmState.RUNNING else ()):
            if name in index:
                base[i, index[name]] = g
    return base


def _layout(job: JobView) -> list[tuple[str, int]]:
    """``(node name, GPUs)`` the job holds (running) or has been placed on."""
    per = job.layout or (job.workers_per_node,) * len(job.node_names)
    return list(zip(job.node_names, per))


__all__ = ["Pollux", "fitness"]
