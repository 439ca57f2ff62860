"""``dp``: the elastic dynamic program of Saxena et al., "Effective Elastic Scaling of Deep
Learning Workloads", MASCOTS 2020, §IV.

Given ``K`` GPUs and jobs ``1..J``, choose each job's GPU count ``g_j`` (and batch size) to
maximise the cluster's total throughput::

    P[j][k] = max_{g in G_j, g <= k}  T_j(g) + P[j-1][k-g],      P[0][k] = 0

where ``T_j(g)`` is the best measured-or-interpolated goodput of job ``j`` over its allowed
batch sizes at ``g`` GPUs (:func:`hpcsched.perf.throughput.best_at`; the job's throughput
model is :func:`~hpcsched.perf.throughput.model_for`'s) and ``G_j`` its allowed GPU counts:
whole nodes, ``g = n * workers_per_node`` for ``n`` in ``[min_nodes, max_nodes]``. The batch
size chosen for ``g_j`` is the one that gives ``T_j(g_j)``.

Raw samples/s, as in the paper. Summing speedups instead (each job's goodput over its own at its
smallest size, as Pollux's fitness does) was tried and measured in the simulator: on Pollux
workloads 1 and 2 it changed the average JCT by less than 2 % (2195 vs 2232 s, 4737 vs 4759 s),
so the paper's objective stays.

What this implementation adds around the paper's recurrence, and why:

* **Admission (who waits).** Running jobs keep at least their minimum (no preemption here).
  Pending jobs are admitted in submission order at their minimum while it fits; the others
  wait, with the reason. This keeps the DP's throughput objective from starving a new job.
* **Unmeasured jobs** (no profile yet, and no prior for their application) keep their current size and batch size: their throughput
  is unknown, so the DP does not move them; their value is a tiny per-GPU epsilon so spare GPUs
  are not left idle. A pending one may start smaller than it asked, down to its minimum, when
  that is what fits (the largest size that fits wins, by the epsilon); its size is then set
  before it starts.
* **Capacity** ``K`` counts GPUs on usable nodes of the managed partitions, minus those held by
  jobs hpcsched does not manage. Whether a grow also fits node by node is checked when the plan
  is reconciled against the cluster.

Objective reported: predicted total throughput of the measured jobs, samples/s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcsched.policies.snapshot import ClusterSnapshot, JobTarget, JobView, Plan
from hpcsched.perf.model import JobModel, best_at, model_for

EPSILON = 1e-6


@dataclass(frozen=True)
class _Option:
    gpus: int
    value: float          # the DP's value: predicted samples/s (epsilon per GPU if unmeasured)
    batch: int


def _options(job: JobView, model: JobModel | None, lo_nodes: int) -> list[_Option]:
    wpn = job.workers_per_node
    if model is None and job.state == "PENDING":
        # not started yet: may start smaller, down to its minimum (it was admitted at that)
        nodes = list(range(max(lo_nodes, job.min_nodes), max(job.min_nodes, min(job.nodes, job.max_nodes)) + 1))
    elif model is None:
        nodes = [max(lo_nodes, min(job.nodes, job.max_nodes))]
    else:
        nodes = list(range(max(lo_nodes, job.min_nodes), job.max_nodes + 1))
    out = []
    for n in nodes:
        g = n * wpn
        x, cfg = best_at(job, model, g)
        if cfg is None:
            continue
        value = x if model is not None else EPSILON * g
        out.append(_Option(g, value, cfg.global_batch_size))
    return out


def capacity(snapshot: ClusterSnapshot) -> int:
    """GPUs hpcsched may hand out: usable nodes' GPUs minus those of unmanaged jobs."""
    other = dict(snapshot.other_gpus_allocated)
    return sum(max(0, n.gpus - other.get(n.name, 0)) for n in snapshot.nodes if n.usable)


def solve(options: list[list[_Option]], k: int) -> tuple[float, list[int]] | None:
    """The recurrence above over GPU counts 0..k. Returns (best value, chosen option index per
    job) or None when the jobs' minimums do not fit in ``k``.

    ``P[j][kk]`` is the best value of jobs ``1..j`` using exactly ``kk`` GPUs; each option of job
    ``j`` is one shifted vector maximum (numpy), so the work is O(J * |G|) vector operations of
    length ``k + 1``. Ties go to the earlier option and the fewer GPUs.
    """
    best = np.full(k + 1, -np.inf)
    best[0] = 0.0
    choice = np.full((len(options), k + 1), -1, dtype=np.int32)
    for j, opts in enumerate(options):
        nxt = np.full(k + 1, -np.inf)
        arg = choice[j]
        for i, o in enumerate(opts):
            g = o.gpus
            if g > k:
                continue
            cand = np.full(k + 1, -np.inf)
            cand[g:] = best[: k + 1 - g] + o.value
            better = cand > nxt
            nxt[better] = cand[better]
            arg[better] = i
        best = nxt
    kk = int(np.argmax(best))
    if not np.isfinite(best[kk]):
        return None
    total, picks = float(best[kk]), []
    for j in range(len(options) - 1, -1, -1):
        i = int(choice[j, kk])
        picks.append(i)
        kk -= options[j][i].gpus
    return total, picks[::-1]


class ElasticDP:
    """Saxena et al.'s elastic DP (see module docstring)."""

    name = "dp"

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        k = capacity(snapshot)
        running = [j for j in snapshot.jobs if j.state == "RUNNING"]
        pending = sorted((j for j in snapshot.jobs if j.state == "PENDING"),
                         key=lambda j: (j.submit_time, j.job_id))
        models = {j.job_id: model_for(j) for j in snapshot.jobs}
        # busy jobs (a resize in flight) are held exactly where they are
        fixed = {j.job_id for j in running if j.busy}
        need = sum(j.gpus if j.job_id in fixed else j.min_nodes * j.workers_per_node
                   for j in running)
        targets = []
        admitted: list[JobView] = []
        for j in pending:
            m = j.min_nodes * j.workers_per_node
            if j.busy:
                continue
            if need + m <= k:
                admitted.append(j)
                need += m
            else:
                targets.append(JobTarget(j.job_id, 0, j.batch_size,
                                         f"dp: waits: needs {m} GPU(s), {max(0, k - need)} of "
                                         f"{k} free after the running jobs' minimums"))
        jobs = running + admitted
        opts = []
        for j in jobs:
            o = [] if j.job_id in fixed else _options(j, models[j.job_id], j.min_nodes)
            if not o:  # busy, or no size within its limits: held exactly where it is
                fixed.add(j.job_id)
                o = [_Option(j.gpus if j.state == "RUNNING" else
                             j.min_nodes * j.workers_per_node, 0.0, j.batch_size)]
            opts.append(o)
        sol = solve(opts, k)
        if sol is None:
            return Plan(self.name, tuple(targets), None,
                        (f"dp: the running jobs' minimums exceed the {k} GPUs available; no change",))
        total, picks = sol
        for j, o, i in zip(jobs, opts, picks):
            pick = o[i]
            model = models[j.job_id]
            if j.job_id in fixed:
                continue
            nodes = pick.gpus // j.workers_per_node
            if model is None:
                why = "not measured yet: kept at its size"
                pred = None
            else:
                pred = pick.value
                why = (f"predicted {pick.value:.0f} samples/s at {pick.gpus} GPU(s), "
                       f"batch {pick.batch}")
            targets.append(JobTarget(j.job_id, nodes, pick.batch, f"dp: {why}",
                                     predicted_throughput=pred))
        return Plan(self.name, tuple(targets), float(total),
                    (f"dp: {len(jobs)} job(s) on {k} GPU(s), predicted {total:.0f} "
                     "samples/s",))
