"""Reconcile a policy's plan with what runs: which changes to make this round, in what order.

Pure: ``(Plan, ClusterSnapshot, Costs) -> (changes, notes)``.

* A change is a **batch**-only change (same nodes; free: applied at a step boundary), a
  **shrink** (in place; costs ``shrink_cost`` seconds of the job's throughput), a **grow**
  (requeue; costs ``restart_cost`` seconds), or a **pending** job's size set before it starts
  (for a job held after a preemption: and released). With ``Costs.preemption`` a running job
  the plan gives 0 nodes is **preempt**-ed (checkpoint, requeue and hold until a plan gives it
  GPUs again; Tiresias, NSDI'19 §4); the policy decided it, so it is not weighed against a gain.
  Only the simulator sets it so far; the daemon reports such targets in its notes.
* The plan's resizes are judged together, since a shrink is usually there to feed a grow: they
  are made only if the predicted throughput gain over ``horizon`` seconds (or over a job's
  predicted remaining time, ``remaining_samples`` / its throughput, when that is shorter: a
  job about to end gains nothing from a restart) beats the samples lost to their restarts, and the gain is at least ``min_gain`` of the current throughput. Otherwise
  only the batch-only changes that gain ``min_gain`` on their own are made. Predictions use the
  same model the policies use (:mod:`hpcsched.perf.throughput`).
* A grow is made only if Slurm can place it now: enough usable nodes with the job's GPUs per
  node free, counting the job's own nodes, which the requeue frees. Otherwise it waits for a
  later round (shrinks made this round free their nodes by then).
* With ``Costs.place_pending`` a pending job whose plan places it on other nodes than it asks
  for gets a change even at an unchanged size (the simulator; the daemon does not know a pending
  job's requested node list yet, and would re-send it every round).
* Shrinks are made without the gain test when the plan starts pending jobs that need more GPUs
  than are free: they make room for the plan's admissions, whose value the samples/s of the
  running jobs cannot show.
* Order: preemptions, shrinks, batch-only changes, pending jobs, grows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcsched.perf.model import job_throughput
from hpcsched.policies.snapshot import ClusterSnapshot, JobView, Plan

ORDER = {"preempt": 0, "shrink": 1, "batch": 2, "pending": 3, "grow": 4}


@dataclass(frozen=True)
class Costs:
    """Reconcile parameters: seconds, and a fraction (``min_gain``)."""

    restart_cost: float = 30.0
    shrink_cost: float = 2.0
    min_gain: float = 0.05
    horizon: float = 600.0
    preemption: bool = False   # apply a plan's "0 nodes" for a running job (simulator only, so far)
    place_pending: bool = False  # set a pending job's node list even when its size is unchanged


@dataclass(frozen=True)
class Change:
    """One change to make: the actuator's input, and the journal's record."""

    job_id: str
    kind: str
    from_nodes: int
    to_nodes: int
    from_batch_size: int
    to_batch_size: int
    reason: str
    placement: tuple[str, ...] = ()   # nodes to run on, for a pending job or a grow


def predict(job: JobView, nodes: int, batch_size: int) -> float | None:
    """Predicted samples/s of ``job`` at ``nodes`` nodes and global ``batch_size``."""
    return job_throughput(job, nodes, batch_size)


def reconcile(plan: Plan, snapshot: ClusterSnapshot, costs: Costs = Costs()) -> tuple[list[Change], list[str]]:
    notes: list[str] = []
    candidates: list[tuple[Change, float, float]] = []   # change, x_from, x_to
    for t in plan.targets:
        job = snapshot.job(t.job_id)
        if job is None or job.busy:
            continue
        if job.state == "PENDING":
            if job.held and t.nodes > 0:
                # preempted earlier and held by us: the plan gives it GPUs again -> release
                candidates.append((Change(job.job_id, "pending", job.nodes, t.nodes,
                                          job.batch_size, t.batch_size, t.reason,
                                          t.placement), 0.0, 0.0))
            elif t.nodes == 0:
                notes.append(f"job {job.job_id}: {t.reason}")
            elif (t.nodes, t.batch_size) != (job.nodes, job.batch_size) or (
                    costs.place_pending and t.placement
                    and tuple(t.placement) != tuple(job.node_names)):
                candidates.append((Change(job.job_id, "pending", job.nodes, t.nodes,
                                          job.batch_size, t.batch_size, t.reason,
                                          t.placement), 0.0, 0.0))
            continue
        if job.state != "RUNNING" or (t.nodes, t.batch_size) == (job.nodes, job.batch_size):
            continue
        if t.nodes == 0:
            if costs.preemption:
                candidates.append((Change(job.job_id, "preempt", job.nodes, 0, job.batch_size,
                                          job.batch_size, t.reason), 0.0, 0.0))
            else:
                notes.append(f"job {job.job_id}: {t.reason}; preemption is not applied by the "
                             "daemon yet (the simulator applies it): the job keeps running")
            continue
        kind = ("shrink" if t.nodes < job.nodes else "grow" if t.nodes > job.nodes else "batch")
        x_from, x_to = predict(job, job.nodes, job.batch_size), predict(job, t.nodes, t.batch_size)
        if x_from is None or x_to is None:
            notes.append(f"job {job.job_id}: no throughput model yet; {kind} not made")
            continue
        reason = (f"{t.reason}; {x_from:.0f} -> {x_to:.0f} samples/s predicted")
        candidates.append((Change(job.job_id, kind, job.nodes, t.nodes, job.batch_size,
                                  t.batch_size, reason,
                                  t.placement if kind == "grow" else ()), x_from, x_to))

    resizes = [c for c in candidates if c[0].kind in ("shrink", "grow")]
    batches = [c for c in candidates if c[0].kind == "batch"]
    chosen = [c for c in candidates if c[0].kind in ("pending", "preempt")]
    # shrinks that make room for the jobs the plan starts are the plan's admission decision,
    # not a throughput trade: the gain test (samples/s of running jobs) cannot see their value
    start_need = sum(c.to_nodes * snapshot.job(c.job_id).workers_per_node
                     for c, _, _ in chosen if c.kind == "pending" and c.to_nodes > 0)
    free_now = sum(n.gpus_free for n in snapshot.nodes if n.usable)
    if start_need > free_now:
        room = [c for c in resizes if c[0].kind == "shrink"]
        if room:
            chosen += room
            resizes = [c for c in resizes if c[0].kind != "shrink"]
            notes.append(f"made {len(room)} shrink(s) to make room: the plan starts jobs needing "
                         f"{start_need} GPU(s), {free_now} free")
    base = sum(predict(j, j.nodes, j.batch_size) or 0.0 for j in snapshot.jobs
               if j.state == "RUNNING")
    def horizon(job_id: str, x_from: float) -> float:
        """Seconds a change pays off over: the horizon, or less if the job ends sooner."""
        job = snapshot.job(job_id)
        if job is not None and job.remaining_samples is not None and x_from > 0:
            return max(0.0, min(costs.horizon, job.remaining_samples / x_from))
        return costs.horizon

    if resizes:
        gain = sum(x_to - x_from for _, x_from, x_to in resizes + batches)
        won = sum((x_to - x_from) * horizon(c.job_id, x_from) for c, x_from, x_to in
                  resizes + batches)
        lost = sum(x_from * (costs.restart_cost if c.kind == "grow" else costs.shrink_cost)
                   for c, x_from, _ in resizes)
        summary = (f"resizes gain {gain:+.0f} samples/s ({gain / base:+.0%} of {base:.0f}): "
                   f"{won:.0f} samples over at most {costs.horizon:.0f} s (less for jobs that "
                   f"end sooner) vs {lost:.0f} lost to restarts") if base > 0 else \
            "no measured throughput"
        if base > 0 and won > lost and gain >= costs.min_gain * base:
            chosen += resizes + batches
            notes.append(f"made: {summary}")
            batches = []
        else:
            notes.append(f"not made: {summary}")
    for c, x_from, x_to in batches:
        if x_to >= x_from * (1 + costs.min_gain):
            chosen.append((c, x_from, x_to))
        else:
            notes.append(f"job {c.job_id}: batch {c.from_batch_size} -> {c.to_batch_size} gains "
                         f"less than {costs.min_gain:.0%}; not made")

    # can Slurm place each grow now? free GPUs per usable node, the job's own nodes included
    free = {n.name: n.gpus_free for n in snapshot.nodes if n.usable}
    changes = []
    for c, x_from, x_to in sorted(chosen, key=lambda c: (ORDER[c[0].kind], -(c[2] - c[1]))):
        if c.kind == "grow":
            job = snapshot.job(c.job_id)
            mine = {name: free.get(name, 0) + job.workers_per_node for name in job.node_names}
            fits = sorted((n for n, g in {**free, **mine}.items() if g >= job.workers_per_node),
                          key=lambda n: (n not in mine, n))
            if len(fits) < c.to_nodes:
                notes.append(f"job {c.job_id}: grow to {c.to_nodes} node(s) waits: "
                             f"{len(fits)} node(s) have {job.workers_per_node} GPU(s) free")
                continue
            chosen_nodes = fits[: c.to_nodes]
            if c.placement and len(c.placement) == c.to_nodes and set(c.placement) <= set(fits):
                chosen_nodes = list(c.placement)
            elif c.placement:
                notes.append(f"job {c.job_id}: placement {','.join(c.placement)} does not fit "
                             "now; Slurm chooses the nodes")
                c = replace(c, placement=())
            for n in chosen_nodes:
                free[n] = free.get(n, 0) + (job.workers_per_node if n in mine else 0) - job.workers_per_node
        changes.append(c)
    return changes, notes
