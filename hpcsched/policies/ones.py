"""``ones``: Online Evolutionary Search over per-job sizes (Bian et al., "Online Evolutionary
Batch Size Orchestration for Scheduling Deep Learning Workloads in GPU Clusters", SC'21, §4).

A candidate schedule gives every admitted job a node count (hence its GPUs and, through the
throughput model, its best allowed batch size). Each round the population of candidate
schedules evolves for a few generations:

* **crossover** (§4.3): uniform, per job, between two parents picked by tournament;
* **mutation** (§4.3): a job's node count moves one step up or down, within its limits;
* **repair**: a schedule over the cluster's GPUs loses nodes at random jobs (seeded) until it
  fits; no job goes below its minimum;
* **fitness** (minimised): the predicted total remaining time ``sum_j R_j / X_j(n_j)``, with
  ``R_j`` the job's remaining samples (or, when the job does not say, ``horizon`` seconds of
  work at its current speed) and ``X_j`` the predicted goodput (samples/s,
  :func:`hpcsched.perf.model.best_at`). That is the
  average remaining JCT were the schedule kept, the figure users feel; remaining GPU-time would
  instead reward running every job small.
* **elitism and carry-over** (§4.4): the best schedules survive, and the population is kept
  from round to round, repaired when jobs arrive (new genes: their current size) or leave.
* **limits that grow with proof** (§4.2, "exploration"): a job may be given at most twice the
  largest node count it has been measured at (its maximum allowed caps it), so it earns larger
  sizes by showing it scales.

Admission of pending jobs (first come, first served at their minimum) and the treatment of jobs
without measurements are those of :mod:`hpcsched.policies.dp`. With ``seed_with_dp`` the DP's
answer is put into the population each round (the composite's "ONES seeded by the DP"); with
``seed_with_jct`` the :mod:`hpcsched.policies.jct` plan's node counts are (its exact search
as a starting point for the evolutionary one).

Deterministic: the same snapshot, seed and carried population give the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, Plan
from hpcsched.perf.model import best_at, model_for
from hpcsched.policies import dp
from hpcsched.policies.base import Params, PolicyBase
from hpcsched.policies.common import capacity
from hpcsched.protocol.kinds import SlurmState


@dataclass(frozen=True)
class _Table:
    job_ids: tuple[str, ...]
    wpn: np.ndarray          # (J,) workers per node
    lo: np.ndarray           # (J,) min nodes
    hi: np.ndarray           # (J,) max nodes explored
    cost: np.ndarray         # (J, N+1) predicted remaining seconds at n nodes (inf: not allowed)
    batch: np.ndarray        # (J, N+1) batch size at n nodes
    goodput: np.ndarray      # (J, N+1) predicted goodput, samples/s
    current: np.ndarray      # (J,) current nodes (clipped to [lo, hi])


@dataclass(frozen=True)
class ONESParams(Params):
    """``ones``'s parameters.

    Attributes:
        population: schedules kept (>= 2). generations: per round (>= 0). mutation: per-gene
        probability in ``[0, 1]``. elite: best schedules copied unchanged (>= 0; at most
        ``population``). horizon: seconds of work assumed for a job that does not report its
        remaining work (> 0). seed_with_dp: add the DP's plan each round. seed_with_jct: add
        the ``jct`` policy's plan each round.
    """

    population: int = 24
    generations: int = 20
    mutation: float = 0.1
    elite: int = 2
    horizon: float = 3600.0
    seed_with_dp: bool = False
    seed_with_jct: bool = False

    def check(self) -> None:
        if self.population < 2 or self.generations < 0 or not 0 <= self.mutation <= 1 \
                or self.elite < 0 or not self.horizon > 0:
            raise ValueError("population >= 2, generations >= 0, 0 <= mutation <= 1, "
                             "elite >= 0, horizon > 0")


def _kept_size(j: JobView, fixed: set[str], sizes: dict[str, int] | None) -> int:
    """The node count where a job that is not evolved (busy: in ``fixed``, or unmeasured)
    stays: a running job where it is, a pending one at its minimum, or, unless busy, the DP's
    size from ``sizes`` (a pending job starts as large as fits)."""
    n = j.nodes if j.state == SlurmState.RUNNING else j.min_nodes
    if sizes and sizes.get(j.job_id) and j.job_id not in fixed:
        n = sizes[j.job_id]   # a pending job starts as large as fits (DP)
    return n


def _waits_and_sized(snapshot: ClusterSnapshot, base: Plan) -> tuple[list[JobTarget],
                                                                    list[JobView]]:
    """Split the round by the DP's plan ``base``: ``(waits, jobs)``, the DP's targets at 0
    nodes (jobs it leaves waiting) and the jobs ONES sizes (running ones, and pending ones the
    DP admits), in the snapshot's order."""
    waits = [t for t in base.targets if t.nodes == 0]
    waiting = {t.job_id for t in waits}
    jobs = [j for j in snapshot.jobs
            if j.state == SlurmState.RUNNING or (j.state == SlurmState.PENDING and j.job_id not in waiting)]
    return waits, jobs


class ONES(PolicyBase):
    """ONES (see module docstring). Keeps its population between :meth:`decide` calls.

    Parameters: :class:`ONESParams`.

    Raises (constructor):
        PolicyError: an unknown key or a bad value (the message lists the valid keys).
    """

    name = "ones"
    Params = ONESParams

    def __init__(self, **values):
        super().__init__(**values)
        p = self.params
        self.population, self.generations, self.mutation = p.population, p.generations, p.mutation
        self.elite, self.horizon, self.seed_with_dp = min(p.elite, p.population), p.horizon, \
            p.seed_with_dp
        self.seed_with_jct = p.seed_with_jct
        self._carried: dict[str, np.ndarray] = {}   # job id -> genes (nodes) per individual
        self.history: list[float] = []              # best fitness per generation, last round

    # ------------------------------------------------------------------ model
    def _table(self, jobs: list[JobView], fixed: set[str],
               sizes: dict[str, int] | None = None) -> _Table:
        """``sizes``: where an unmeasured or busy job stays (default: running jobs where they
        are, pending ones at their minimum); the DP's answer in :meth:`decide`."""
        n_max = max((j.max_nodes for j in jobs), default=1)
        J = len(jobs)
        cost = np.full((J, n_max + 1), np.inf)
        batch = np.zeros((J, n_max + 1), dtype=np.int64)
        goodput = np.zeros((J, n_max + 1))
        lo, hi, cur = np.zeros(J, int), np.zeros(J, int), np.zeros(J, int)
        for i, j in enumerate(jobs):
            model = model_for(j)
            if j.job_id in fixed or model is None:
                n = _kept_size(j, fixed, sizes)
                lo[i] = hi[i] = cur[i] = n
                cost[i, n], batch[i, n], goodput[i, n] = 0.0, j.batch_size, 0.0
                continue
            measured = max((p.nodes for p in j.profile), default=j.nodes)
            lo[i], hi[i] = j.min_nodes, max(j.min_nodes, min(j.max_nodes, 2 * measured))
            cur[i] = min(max(j.nodes, lo[i]), hi[i])
            x_now, _ = best_at(j, model, j.nodes * j.workers_per_node)
            work = j.remaining_samples if j.remaining_samples else max(x_now, 1e-9) * self.horizon
            for n in range(lo[i], hi[i] + 1):
                x, cfg = best_at(j, model, n * j.workers_per_node)
                if cfg is not None and x > 0:
                    cost[i, n], batch[i, n], goodput[i, n] = work / x, cfg.global_batch_size, x
        return _Table(tuple(j.job_id for j in jobs), np.array([j.workers_per_node for j in jobs]),
                      lo, hi, cost, batch, goodput, cur)

    # -------------------------------------------------------------- operators
    @staticmethod
    def _fitness(t: _Table, pop: np.ndarray) -> np.ndarray:
        return t.cost[np.arange(pop.shape[1])[None, :], pop].sum(axis=1)

    @staticmethod
    def _repair(t: _Table, pop: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
        pop = np.clip(pop, t.lo, t.hi)
        bad = np.isinf(t.cost[np.arange(pop.shape[1])[None, :], pop])
        pop = np.where(bad, t.current[None, :], pop)      # a size with no feasible batch
        used = (pop * t.wpn).sum(axis=1)
        for p in np.nonzero(used > k)[0]:
            while used[p] > k:
                can = np.nonzero(pop[p] > t.lo)[0]
                if len(can) == 0:
                    break
                i = rng.choice(can)
                pop[p, i] -= 1   # a size with no feasible batch scores inf: selection drops it
                used[p] -= t.wpn[i]
        return pop

    def evolve(self, t: _Table, k: int, start: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Run the generations from population ``start`` (P, J); returns the final population
        sorted best first. ``self.history`` gets the best fitness of each generation."""
        P, J = start.shape
        pop = self._repair(t, start.copy(), k, rng)
        self.history = []
        for _ in range(self.generations):
            fit_ = self._fitness(t, pop)
            used = (pop * t.wpn).sum(axis=1)
            fit_ = np.where(used > k, np.inf, fit_)
            order = np.argsort(fit_, kind="stable")
            pop = pop[order]
            self.history.append(float(fit_[order[0]]))
            # tournament selection of parents
            a, b = rng.integers(0, P, size=(2, P - self.elite))
            pa = np.minimum(a, b)                      # sorted: lower index = fitter
            a, b = rng.integers(0, P, size=(2, P - self.elite))
            pb = np.minimum(a, b)
            mask = rng.random((P - self.elite, J)) < 0.5
            kids = np.where(mask, pop[pa], pop[pb])
            step = rng.choice(np.array([-1, 1]), size=kids.shape)
            mutate = rng.random(kids.shape) < self.mutation
            kids = kids + np.where(mutate, step, 0)
            pop = np.concatenate([pop[: self.elite], self._repair(t, kids, k, rng)])
        fit_ = self._fitness(t, pop)
        fit_ = np.where((pop * t.wpn).sum(axis=1) > k, np.inf, fit_)
        order = np.argsort(fit_, kind="stable")
        if not self.generations:
            self.history = [float(fit_[order[0]])]
        return pop[order]

    # ----------------------------------------------------------------- decide
    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        """One round: admission and sizes of unmeasured jobs from the DP, then the generations
        from the carried population (module docstring)."""
        rng = np.random.default_rng(seed)
        k = capacity(snapshot)
        base = dp.decide(snapshot, seed)       # admission, waits, DP's sizes
        waits, jobs = _waits_and_sized(snapshot, base)
        if not jobs:
            self._carried = {}
            return Plan(self.name, tuple(waits), 0.0, ("ones: no job to size",))
        fixed = {j.job_id for j in jobs if j.busy}
        t = self._table(jobs, fixed, {x.job_id: x.nodes for x in base.targets if x.nodes})
        start = self._start(t, jobs, base, rng)
        if self.seed_with_jct and self.population >= 3:
            self._seed_jct(snapshot, t, jobs, start)
        pop = self.evolve(t, k, start, rng)
        self._carried = {j.job_id: pop[:, i].copy() for i, j in enumerate(jobs)}
        best = pop[0]
        targets = waits + [self._target(t, i, j, int(best[i]))
                           for i, j in enumerate(jobs) if j.job_id not in fixed]
        return Plan(self.name, tuple(targets), float(self._fitness(t, best[None, :])[0]),
                    (f"ones: {len(jobs)} job(s) on {k} GPU(s), predicted remaining time "
                     f"{self.history[-1]:.0f} s after {self.generations} generation(s)",))

    def _start(self, t: _Table, jobs: list[JobView], base: Plan, rng: np.random.Generator
               ) -> np.ndarray:
        """The starting population (P, J): carried genes (or the current size), the status quo,
        the DP's answer with ``seed_with_dp``, and the rest moved by one node for diversity."""
        P, J = self.population, len(jobs)
        start = np.empty((P, J), dtype=np.int64)
        for i, j in enumerate(jobs):                   # carried genes, or the current size
            genes = self._carried.get(j.job_id)
            start[:, i] = genes[:P] if genes is not None and len(genes) >= P else t.current[i]
        start[-1] = t.current                         # the status quo is always a candidate
        if self.seed_with_dp:
            sizes = {x.job_id: x.nodes for x in base.targets}
            start[-2] = [sizes.get(j.job_id, t.current[i]) for i, j in enumerate(jobs)]
        start[1:-2] = start[1:-2] + rng.integers(-1, 2, size=start[1:-2].shape)  # diversity
        return start

    def _seed_jct(self, snapshot: ClusterSnapshot, t: _Table, jobs: list[JobView],
                  start: np.ndarray) -> None:
        """Put the jct policy's node counts for ``jobs`` (clipped to each job's range in
        ``t``; the current size for a job it does not size) into one individual of the
        starting population ``start`` (P, J), in place: the third from last with
        ``seed_with_dp`` (the DP's answer is the second), else the second from last."""
        from hpcsched.policies import jct
        sizes = {x.job_id: x.nodes for x in jct.decide(snapshot).targets}
        start[-3 if self.seed_with_dp else -2] = [
            min(max(sizes.get(j.job_id, t.current[i]), t.lo[i]), t.hi[i])
            for i, j in enumerate(jobs)]

    @staticmethod
    def _target(t: _Table, i: int, job: JobView, n: int) -> JobTarget:
        if t.goodput[i, n] <= 0:
            return JobTarget(job.job_id, n, int(t.batch[i, n]),
                             "ones: not measured yet: kept at its size")
        good = float(t.goodput[i, n])
        return JobTarget(job.job_id, n, int(t.batch[i, n]),
                         f"ones: predicted goodput {good:.0f} samples/s at "
                         f"{n * job.workers_per_node} GPU(s), batch {int(t.batch[i, n])}, "
                         f"{t.cost[i, n]:.0f} s of work left", predicted_goodput=good)
