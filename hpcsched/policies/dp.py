"""``dp``: the elastic dynamic program of Saxena et al., "Effective Elastic Scaling of Deep
Learning Workloads", MASCOTS 2020, §IV.

Given ``K`` GPUs and jobs ``1..J``, choose each job's GPU count ``g_j`` (and batch size) to
maximise the cluster's total throughput::

    P[j][k] = max_{g in G_j, g <= k}  T_j(g) + P[j-1][k-g],      P[0][k] = 0

where ``T_j(g)`` is the best predicted goodput of job ``j`` over its allowed batch sizes at
``g`` GPUs (:func:`hpcsched.perf.model.best_at`: throughput x statistical efficiency, equal to
the throughput when the job reports no gradient noise; the job's model is
:func:`~hpcsched.perf.model.model_for`'s) and ``G_j`` its allowed GPU counts:
whole nodes, ``g = n * workers_per_node`` for ``n`` in ``[min_nodes, max_nodes]``. The batch
size chosen for ``g_j`` is the one that gives ``T_j(g_j)``.

Samples/s of goodput: the paper's throughput, weighed by statistical efficiency. Summing
speedups instead (each job's goodput over its own at its smallest size, as Pollux's fitness
does) made little difference in the simulator, so the paper's objective stays (measured:
docs/design-notes.md, "policies/dp.py").

What this implementation adds around the paper's recurrence, and why:

* **Admission (who waits).** Running jobs keep at least their minimum (no preemption here).
  Pending jobs are admitted in submission order at their minimum while it fits
  (:func:`hpcsched.policies.common.admit_fifo`); the others wait, with the reason. This keeps
  the DP's objective from starving a new job.
* **Unmeasured jobs** (no profile yet, and no prior for their application) keep their current
  size and batch size: their throughput is unknown, so the DP does not move them; their value
  is a tiny per-GPU epsilon so spare GPUs are not left idle. A pending one may start smaller
  than it asked, down to its minimum, when that is what fits (the largest size that fits wins,
  by the epsilon); its size is then set before it starts.
* **Capacity** ``K`` counts GPUs on usable nodes of the managed partitions, minus those held by
  jobs hpcsched does not manage. Whether a grow also fits node by node is checked when the plan
  is reconciled against the cluster.

Objective reported: predicted total goodput of the measured jobs, samples/s.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, Plan
from hpcsched.perf.model import JobModel, best_at, model_for
from hpcsched.policies.base import NoParams, stateless
from hpcsched.policies.common import admit_fifo, capacity, min_gpus, pending_fifo, running
from hpcsched.protocol.kinds import SlurmState

EPSILON = 1e-6


class Option(NamedTuple):
    """One choice for one job in :func:`solve` (a named tuple: policies build hundreds of
    thousands per simulation)."""

    gpus: int
    value: float          # the DP's value: predicted goodput, samples/s (epsilon per GPU if unmeasured)
    batch: int            # global batch size at it (samples per optimizer step)


def _options(job: JobView, model: JobModel | None, lo_nodes: int) -> list[Option]:
    wpn = job.workers_per_node
    if model is None and job.state == SlurmState.PENDING:
        # not started yet: may start smaller, down to its minimum (it was admitted at that)
        nodes = list(range(max(lo_nodes, job.min_nodes),
                           max(job.min_nodes, min(job.nodes, job.max_nodes)) + 1))
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
        out.append(Option(g, value, cfg.global_batch_size))
    return out


def solve(options: list[list[Option]], k: int) -> tuple[float, list[int]] | None:
    """The recurrence above over GPU counts 0..k. Returns (best value, chosen option index per
    job) or None when the jobs' minimums do not fit in ``k``.

    ``P[j][kk]`` is the best value of jobs ``1..j`` using exactly ``kk`` GPUs; each job is one
    maximum over its options of ``P[j-1]`` shifted by the option's GPUs (numpy, an array of
    ``|G| x (k + 1)``), so the work is O(J * |G| * k) in J vector operations. Ties go to the
    earlier option and the fewer GPUs; an option valued NaN is never chosen.
    """
    best = np.full(k + 1, -np.inf)
    best[0] = 0.0
    choice = np.full((len(options), k + 1), -1, dtype=np.int32)
    kk_all = np.arange(k + 1)
    # padded[k + 1 + m] = best[m], -inf before: its window at k + 1 - g is best shifted by g
    padded = np.full(2 * (k + 1), -np.inf)
    shifts = sliding_window_view(padded, k + 1)
    for j, opts in enumerate(options):
        if not opts:
            best = np.full(k + 1, -np.inf)
            continue
        # cand[i, kk]: option i on top of the best of the jobs before it at kk - g_i GPUs
        # (-inf below g_i), its rows copied whole from the shifted windows
        gpus, values, _ = zip(*opts)
        padded[k + 1:] = best
        cand = shifts[k + 1 - np.minimum(np.array(gpus), k + 1)]
        value = np.array(values, dtype=float)
        cand += np.where(np.isnan(value), -np.inf, value)[:, None]
        arg = np.argmax(cand, axis=0)            # ties: the earlier option
        best = cand[arg, kk_all]
        choice[j] = np.where(np.isfinite(best), arg, -1)
    kk = int(np.argmax(best))
    if not np.isfinite(best[kk]):
        return None
    total, picks = float(best[kk]), []
    for j in range(len(options) - 1, -1, -1):
        i = int(choice[j, kk])
        picks.append(i)
        kk -= options[j][i].gpus
    return total, picks[::-1]


def _admit(snapshot: ClusterSnapshot, fixed: set[str], k: int
           ) -> tuple[list[JobView], list[JobTarget]]:
    """Pending jobs admitted at their minimum (FIFO) after the running jobs' minimums (busy
    running jobs: what they hold), and a waiting target for each of the others."""
    need = sum(j.gpus if j.job_id in fixed else min_gpus(j) for j in running(snapshot))
    pending = [j for j in pending_fifo(snapshot) if not j.busy]
    admitted, waiting = admit_fifo(pending, k - need, min_gpus)
    waits = [JobTarget(j.job_id, 0, j.batch_size,
                       f"dp: waits: needs {min_gpus(j)} GPU(s), {max(0, free)} of {k} free "
                       "after the running jobs' minimums") for j, free in waiting]
    return admitted, waits


def _held_option(job: JobView) -> Option:
    """The one option of a job held where it is (busy, or no size within its limits)."""
    return Option(job.gpus if job.state == SlurmState.RUNNING else min_gpus(job), 0.0, job.batch_size)


def _target(job: JobView, pick: Option, model: JobModel | None) -> JobTarget:
    nodes = pick.gpus // job.workers_per_node
    if model is None:
        return JobTarget(job.job_id, nodes, pick.batch, "dp: not measured yet: kept at its size")
    return JobTarget(job.job_id, nodes, pick.batch,
                     f"dp: predicted goodput {pick.value:.0f} samples/s at {pick.gpus} GPU(s), "
                     f"batch {pick.batch}", predicted_goodput=pick.value)


def decide(snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
    """Saxena et al.'s elastic DP (module docstring). ``seed`` is unused: the DP is exact."""
    k = capacity(snapshot)
    # busy jobs (a resize in flight) are held exactly where they are
    fixed = {j.job_id for j in running(snapshot) if j.busy}
    admitted, targets = _admit(snapshot, fixed, k)
    jobs = running(snapshot) + admitted
    models = {j.job_id: model_for(j) for j in jobs}
    opts = []
    for j in jobs:
        o = [] if j.job_id in fixed else _options(j, models[j.job_id], j.min_nodes)
        if not o:  # busy, or no size within its limits: held exactly where it is
            fixed.add(j.job_id)
            o = [_held_option(j)]
        opts.append(o)
    sol = solve(opts, k)
    if sol is None:
        return Plan("dp", tuple(targets), None,
                    (f"dp: the running jobs' minimums exceed the {k} GPUs available; no change",))
    total, picks = sol
    targets += [_target(j, o[i], models[j.job_id])
                for j, o, i in zip(jobs, opts, picks) if j.job_id not in fixed]
    return Plan("dp", tuple(targets), float(total),
                (f"dp: {len(jobs)} job(s) on {k} GPU(s), predicted goodput {total:.0f} samples/s",))


#: the ``dp`` policy's factory: ``DP()``; the DP takes no parameters (:class:`NoParams`)
DP = stateless("dp", decide, NoParams)
