"""``sia``: Sia's allocation policy (Jayaram Subramanya et al., "Sia: Heterogeneity-aware,
goodput-optimized ML-cluster scheduling", SOSP'23, §3.2-3.3), in the special case of one GPU
type, as its artifact runs it in Sia's own simulator (github.com/siasosp23/artifacts,
``sia-simulator/sia.py``, ``SiaPolicy.optimize_mip`` and ``__solve_mip_rescaled``;
``sia-simulator/cluster.py``, ``get_sia_multi_job_info``; ``sia-simulator/simulator_config.py``
and ``run_experiment.sh`` for the defaults; read for behaviour, the code here is our own, with
:func:`scipy.optimize.milp` where the artifact calls cvxpy with CBC).

Every round, every job that is not busy, running or pending, is a candidate; a busy job (a resize
in flight, or starting) is held where it is and its GPUs are not planned. The program
(:mod:`hpcsched.policies.sia_milp`):

* **configurations** (§3.2): GPU counts that are powers of two within a node or whole nodes (1,
  2, 4, 8, 12, ... on 4-GPU nodes), packed (one node, or ``g / node size`` nodes). Per job they
  are kept within its own limits (its allowed GPU counts at the snapshot's granularity,
  :func:`hpcsched.policies.common.gpu_counts`), its fewest GPUs and, when running, its current
  count are always among them, and with ``explore`` (the artifact's ``max_replicas``) it gets
  at most ``max(2 x the most GPUs it has been measured on, 1)`` GPUs: a new job starts on its
  fewest and earns larger configurations by running. A job whose throughput nothing predicts
  yet (no model) has only its fewest GPUs (and its current count), as the artifact's job
  without a speedup function;
* **normalised goodput** (§3.3, Table 1): each job's best goodput over batch sizes at each
  configuration (:func:`hpcsched.perf.model.best_at`: throughput x statistical efficiency, the
  co-adapted batch size) over its lowest, times its fewest GPUs (the paper: "normalize the row
  to have a minimum non-zero value of N_min"; 1 GPU for most jobs);
* **restart factor** (§3.3, eq. 2; the artifact's ``realloc_factor``): for a running job, every
  configuration other than its current one has its normalised goodput scaled by
  ``max(age - restarts x R, 0) / (age + R)`` (1 while ``age < R``), ``R = restart_penalty``;
* **fairness and lambda_n** (§3.3, eq. 1): each normalised goodput raised to ``p`` (-0.5); with
  ``p < 0`` the program minimises their sum plus ``lambda_n`` (1.1) per job left without a
  configuration, so every job given one earns ``lambda_n`` and a waiting job is started
  whenever GPUs allow; at most one configuration per job, the GPUs chosen at most those the
  policy may plan.

The plan: each job's target is its chosen GPU count (0: waits, or preempted), packed, at the
batch size of the goodput; ``weight = its fewest GPUs / its goodput on them``, so
reconcile judges the plan by normalised goodputs (Sia's utilities, linearised). Objective
reported: the program's value (the sum of the chosen pairs' ``lambda_n - (f s)^p``). Stateless
and deterministic for a snapshot.

What differs from the artifact (docs/simulator.md, "sia"): the restart penalty is the snapshot's
restart cost (the artifact: 25-250 s per application); ``lambda_a`` (defined but not used in the
artifact's objective) is not a parameter; HiGHS instead of CBC (same gap, 1e-4).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, Plan
from hpcsched.perf.model import JobModel, best_at, model_for
from hpcsched.policies.base import Params, PolicyBase
from hpcsched.policies.common import capacity, gpu_counts, max_gpus, min_gpus, nodes_spanned, target
from hpcsched.policies.sia_milp import Solution, restart_factor, sia_sizes, solve, values
from hpcsched.protocol.kinds import SlurmState


@dataclass(frozen=True)
class SiaParams(Params):
    """``sia``'s parameters.

    Attributes:
        p: the fairness power of the normalised goodputs (§3.3; the artifact's
            ``sia_default_p_val`` and §5.7: -0.5); not 0.
        lambda_n: what a job given a configuration earns (the artifact's ``lambda_n``, 1.1;
            here its magnitude for either sign of ``p``). Above 1 a job's fewest GPUs are worth
            giving (their powered normalised goodput is 1 for a 1-GPU job).
        restart_penalty: seconds ``R`` of the restart factor; ``None``: the snapshot's restart
            cost (the simulator's ``--restart-cost``, 30 s; the artifact's per application).
        explore: cap each job at twice the most GPUs it has been measured on (the artifact).
        configs: ``"sia"``: powers of two within a node and whole nodes (§3.2); ``"all"``:
            every GPU count the job may have.
        decimals: the powered normalised goodputs are rounded to this many decimals (the
            artifact: 2); ``None``: not rounded.
        mip_rel_gap: HiGHS's relative optimality gap (the artifact's ``sia_solver_thresh``).
        time_limit: seconds HiGHS may take per round (``None``: no limit; with one, the plan
            may depend on the machine's speed).

    Raises (when made):
        ValueError: a parameter out of range or of the wrong type.
    """

    p: float = -0.5
    lambda_n: float = 1.1
    restart_penalty: float | None = None
    explore: bool = True
    configs: str = "sia"
    decimals: int | None = 2
    mip_rel_gap: float = 1e-4
    time_limit: float | None = None

    def check(self) -> None:
        if (self.p == 0 or self.lambda_n < 0 or self.configs not in ("sia", "all")
                or (self.restart_penalty is not None and self.restart_penalty < 0)
                or (self.decimals is not None and self.decimals < 0)
                or not 0 <= self.mip_rel_gap < 1
                or (self.time_limit is not None and self.time_limit <= 0)):
            raise ValueError("p != 0, lambda_n >= 0, restart_penalty >= 0 or null, configs 'sia' "
                             "or 'all', decimals >= 0 or null, 0 <= mip_rel_gap < 1, "
                             "time_limit > 0 or null")


@dataclass(frozen=True)
class _Options:
    """One job's configurations: GPU counts, goodputs (samples/s; relative without a model),
    normalised goodputs, restart factors, and the goodput the normalisation divides by."""

    gpus: np.ndarray
    goodput: np.ndarray
    speedup: np.ndarray
    factor: np.ndarray
    base: float


class Sia(PolicyBase):
    """Sia's allocation policy (module docstring). Stateless.

    Parameters: :class:`SiaParams`.

    Raises (constructor):
        PolicyError: an unknown key or a bad value (the message lists the valid keys).
    """

    name = "sia"
    Params = SiaParams
    params: SiaParams
    #: reconcile's gate for this policy's plans (:func:`hpcsched.policies.round.decide_round`):
    #: Sia prices restarts itself (the restart factor), so, as for ``pollux``, reconcile only
    #: checks its plans against what Slurm can place now (no minimum gain, no hold)
    reconcile_gate = MappingProxyType({"min_gain": 0.0, "hold": 0.0})

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        """One round (module docstring); ``seed`` is not used (the program has one answer)."""
        jobs = sorted((j for j in snapshot.jobs if not j.busy
                       and j.state in (SlurmState.RUNNING, SlurmState.PENDING)),
                      key=lambda j: (j.submit_time, j.job_id))
        free = _plannable(snapshot)
        if not jobs or free <= 0:
            return Plan(self.name, (), None, ("sia: no job to allocate, or no GPU to allocate",))
        models = [model_for(j) for j in jobs]
        options = [self._options(j, m, snapshot) for j, m in zip(jobs, models)]
        job_of = np.concatenate([np.full(len(o.gpus), i) for i, o in enumerate(options)])
        gpus = np.concatenate([o.gpus for o in options])
        p = self.params
        value = values(np.concatenate([o.speedup for o in options]),
                       np.concatenate([o.factor for o in options]), p.p, p.lambda_n, p.decimals)
        sol = solve(job_of, gpus, value, len(jobs), free, p.mip_rel_gap, p.time_limit)
        targets = [self._target(j, m, o, sol.chosen[job_of == i], snapshot)
                   for i, (j, m, o) in enumerate(zip(jobs, models, options))]
        return Plan(self.name, tuple(targets), sol.value, (_note(sol, jobs, gpus, free, p.p),))

    # ----------------------------------------------------------------------- configurations
    def _options(self, job: JobView, model: JobModel | None, snapshot: ClusterSnapshot
                 ) -> _Options:
        """The job's configurations (module docstring) with their values' ingredients."""
        counts = self._counts(job, model, snapshot)
        goodput = np.array([best_at(job, model, g, nodes_spanned(job, g, snapshot))[0]
                            for g in counts], dtype=float)
        ok = goodput > 0
        gpus, goodput = np.array(counts, dtype=np.int64)[ok], goodput[ok]
        if len(gpus) == 0:
            return _Options(gpus, goodput, goodput, goodput, 1.0)
        fewest = int(gpus.min())
        base = float(goodput.min()) / fewest
        factor = np.ones(len(gpus))
        if job.state == SlurmState.RUNNING:
            r = snapshot.restart_cost if self.params.restart_penalty is None \
                else self.params.restart_penalty
            factor[gpus != job.gpus] = restart_factor(snapshot.time - job.submit_time,
                                                      job.restarts, r)
        return _Options(gpus, goodput, goodput / base, factor, base)

    def _counts(self, job: JobView, model: JobModel | None, snapshot: ClusterSnapshot
                ) -> list[int]:
        """GPU counts the job may get this round: Sia's configurations within its limits, its
        fewest and its current count (module docstring)."""
        allowed = list(gpu_counts(job, snapshot))
        lo = min_gpus(job, snapshot)
        current = job.gpus if job.state == SlurmState.RUNNING else 0
        n_nodes = sum(1 for n in snapshot.nodes if n.usable)
        cap = self._cap(job, model, lo)
        keep = set(sia_sizes(snapshot.node_size, max(allowed, default=0))) \
            if self.params.configs == "sia" else set(allowed)
        out = {c for c in allowed if c <= cap and c in keep and c >= lo}
        out.update(c for c in (lo, current) if c in allowed)
        return sorted(c for c in out if c > 0 and nodes_spanned(job, c, snapshot) <= n_nodes)

    def _cap(self, job: JobView, model: JobModel | None, lo: int) -> int:
        """The most GPUs the job may get this round (its current count aside): its fewest
        without a model; with ``explore``, twice the most it has been measured on; else its
        maximum."""
        if model is None:
            return lo
        if self.params.explore:
            return max(2 * max((pt.world_size for pt in job.profile), default=0), 1)
        return max_gpus(job)

    # ------------------------------------------------------------------------------ targets
    def _target(self, job: JobView, model: JobModel | None, opts: _Options, chosen: np.ndarray,
                snapshot: ClusterSnapshot) -> JobTarget:
        weight = 1.0 / opts.base if opts.base > 0 else 1.0
        if not chosen.any():
            why = "preempted" if job.state == SlurmState.RUNNING else "waits"
            return replace(target(job, 0, job.batch_size, f"sia: {why}: no configuration chosen",
                                  snapshot), weight=weight)
        k = int(np.flatnonzero(chosen)[0])
        g = int(opts.gpus[k])
        x, cfg = best_at(job, model, g, nodes_spanned(job, g, snapshot))
        batch = cfg.global_batch_size if cfg is not None else job.batch_size
        known = model is not None
        reason = (f"sia: normalised goodput {opts.speedup[k]:.2f} at {g} GPU(s), batch {batch}"
                  + (f", restart factor {opts.factor[k]:.2f}" if opts.factor[k] < 1 else "")
                  if known else f"sia: not measured yet: {g} GPU(s), batch {batch}")
        return replace(target(job, g, batch, reason, snapshot, x if known else None),
                       weight=weight)


def _plannable(snapshot: ClusterSnapshot) -> int:
    """GPUs the policy may plan: hpcsched's (:func:`~hpcsched.policies.common.capacity`) less
    those busy jobs hold on usable nodes (they are held where they are)."""
    usable = {n.name for n in snapshot.nodes if n.usable}
    held = sum(g for j in snapshot.jobs if j.busy
               for name, g in j.allocation().items() if name in usable)
    return max(0, capacity(snapshot) - held)


def _note(sol: Solution, jobs: list[JobView], gpus: np.ndarray, free: int, p: float) -> str:
    used = int(gpus[sol.chosen].sum())
    return (f"sia: {len(jobs)} job(s), {len(gpus)} (job, configuration) pair(s), {used} of "
            f"{free} GPU(s) chosen for {int(sol.chosen.sum())} job(s): value {sol.value:.4g} "
            f"(p={p:g}; {sol.status})")


__all__ = ["Sia", "SiaParams"]
