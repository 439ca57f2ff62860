"""Reconcile a policy's plan with what runs: which changes to make this round, in what order.

Pure: ``(Plan, ClusterSnapshot, Costs) -> (changes, notes)``, in five steps:

1. :func:`classify`: each target becomes a candidate change of a :class:`ChangeKind`, or a note.
   A change is a **batch**-only change (same nodes; free: applied at a step boundary), a
   **shrink** (in place; costs ``shrink_cost`` seconds of the job's throughput), a **grow**
   (costs :meth:`Costs.grow_cost` seconds: ``restart_cost`` by requeue; by extension, with
   ``Costs.grow == "extension"``, ``extension_startup x max(0, 1 - x_from / x_to) +
   extension_stall``, :func:`hpcsched.model.snapshot.grow_cost`), or a **pending** job's
   size set before it starts
   (for a job held after a preemption: and released). With ``Costs.preemption`` a running job
   the plan gives 0 nodes is **preempt**-ed (checkpoint, requeue and hold until a plan gives it
   GPUs again; Tiresias, NSDI'19 §4); the policy decided it, so it is not weighed against a gain.
   The daemon and the simulator set it; without it such targets are only noted. With
   ``Costs.place_pending`` a pending job whose plan places it on other nodes than it asks for
   gets a change even at an unchanged size (the simulator; the daemon does not know a pending
   job's requested node list yet, and would re-send it every round).
   Sizes are compared in GPUs; a plan that speaks GPUs on a node-granular snapshot (the daemon
   today) is mapped onto whole nodes first (:func:`on_grid`). A GPU-granular grow by extension
   keeps the job's GPUs, so its goodput is predicted on the nodes it will span
   (:func:`extension_spans`), not packed as the plan assumes.
2. :func:`hold_back` (no thrash): a job resized less than ``Costs.hold`` seconds ago is not
   resized back the other way this round (a grow after a shrink, a shrink after a grow).
3. :func:`admission_room`: shrinks are made without the gain test when the plan starts pending
   jobs that need more GPUs than are free: they make room for the plan's admissions, whose value
   the samples/s of the running jobs cannot show (a pending job the plan starts at the size it
   already asks for counts too: it gets no change of its own).
4. :func:`gain_test`: the plan's resizes are judged together, since a shrink is usually there to
   feed a grow: they are made only if the predicted gain over ``horizon`` seconds (or over a
   job's predicted remaining time, ``remaining_samples`` / its rate, when that is shorter: a job
   about to end gains nothing from a restart) beats the samples lost to their costs (each
   resize's cost in seconds x the job's current goodput x its weight), and the
   gain is at least ``min_gain`` of the current total. Otherwise only the batch-only changes
   that gain ``min_gain`` on their own are made. Gains and losses are in the policy's own
   objective: each job's predicted goodput weighted by its target's ``weight`` (1 for total
   goodput; for ``jct`` its rank and age weight x its remaining time at its smallest size /
   its remaining samples; for ``pollux`` 1 / its goodput at the fair share). Rates are
   predicted goodput (:func:`predict`:
   throughput x statistical efficiency, :func:`hpcsched.perf.model.job_goodput`), the objective
   the policies rank configurations by, so a plan is judged by what it was chosen for: a batch
   size a policy picked for its goodput is not refused for its raw throughput, nor a larger one
   made for raw throughput the job cannot turn into progress (Pollux, OSDI'21 §3).
5. :func:`feasible_now`: a grow is made only if Slurm can place it now: enough usable nodes with
   the job's GPUs per node free, counting the job's own nodes, which the requeue frees (GPU-
   granular: enough free GPUs, packed onto the fullest nodes). By extension the job keeps its
   own GPUs and the extension job needs the difference free (its own nodes' free GPUs first);
   a planned placement is kept only if it contains the job's nodes. The GPUs that this
   round's shrinks and preemptions give back (:func:`released`) count as free: they are made
   first, a shrink in place releases its GPUs within seconds, and the extension job (or the
   requeued job) waits in Slurm's queue for them, so a plan that moves GPUs from one job to
   another is made in one round. Otherwise the grow waits for a later round.

Order (:data:`ORDER`): preemptions, shrinks, batch-only changes, pending jobs, grows; within a
kind, the largest predicted gain first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeGuard

from hpcsched.model.snapshot import (
    EXTENSION_STALL,
    EXTENSION_STARTUP,
    GROW_MODES,
    ClusterSnapshot,
    JobTarget,
    JobView,
    Plan,
    grow_cost,
    held_reversal,
)
from hpcsched.perf.model import job_goodput
from hpcsched.policies import realise
from hpcsched.policies.changes import ORDER, RESIZES, Candidate, Change
from hpcsched.policies.feasible import extension_spans, feasible_now, released
from hpcsched.policies.realise import Mechanism
from hpcsched.protocol.kinds import ChangeKind, Granularity, GrowMode, SlurmState


@dataclass(frozen=True)
class Costs:
    """Reconcile parameters: seconds, and a fraction (``min_gain``)."""

    restart_cost: float = 30.0
    shrink_cost: float = 2.0
    min_gain: float = 0.05
    horizon: float = 600.0
    #: apply a plan's 0 nodes for a running job as a ``preempt`` change (the daemon and the
    #: simulator do; the daemon holds the job with a deadline, ``daemon.preemption_deadline``)
    preemption: bool = False
    place_pending: bool = False  # set a pending job's node list even when its size is unchanged
    #: no thrash: a job resized less than ``hold`` seconds ago is not resized back the other
    #: way (:func:`hold_back`); 0 turns it off. The daemon and the simulator set it to
    #: ``hold_rounds`` x their round interval (default 3 x 60 s: nothing a round decides is
    #: undone within the next two)
    hold: float = 180.0
    #: how a running job grows (:data:`~hpcsched.model.snapshot.GROW_MODES`): ``"requeue"``
    #: (the daemon's actuator today) costs ``restart_cost``; ``"extension"`` (the simulator's
    #: default) costs the new workers' start-up at the old size and the stall when the group
    #: re-forms (:meth:`grow_cost`). Starts, preemptions, releases and requeues always cost
    #: ``restart_cost``; shrinks ``shrink_cost``
    grow: GrowMode = GrowMode.REQUEUE
    extension_startup: float = EXTENSION_STARTUP
    extension_stall: float = EXTENSION_STALL
    #: GPU-granular changes carry the mechanism that realises them and are priced by it
    #: (:mod:`hpcsched.policies.realise`; the daemon). Off: every shrink costs ``shrink_cost``
    #: and GPUs go back where the job holds fewest (the simulator, until it follows the rules)
    by_mechanism: bool = False
    #: GPUs no grow takes, kept free for other users' jobs not yet submitted, so that one of
    #: up to that many GPUs starts at once instead of waiting for lent GPUs to come back
    #: (:func:`hpcsched.policies.neighbours.yield_to_foreign`; ``daemon.keep_free_gpus``)
    keep_free: int = 0

    def __post_init__(self):
        if self.grow not in GROW_MODES:
            raise ValueError(f"grow must be one of {', '.join(GROW_MODES)}, not {self.grow!r}")

    def grow_cost(self, x_from: float, x_to: float) -> float:
        """Seconds a running job's grow from goodput ``x_from`` to ``x_to`` (samples/s) costs
        it, in seconds of its new rate (:func:`hpcsched.model.snapshot.grow_cost`:
        ``restart_cost`` by requeue; ``extension_startup x max(0, 1 - x_from / x_to) +
        extension_stall`` by extension)."""
        return grow_cost(self.grow, self.restart_cost, self.extension_startup,
                         self.extension_stall, x_from, x_to)

    def resize_cost(self, c: Candidate) -> float:
        """Seconds candidate resize ``c`` costs its job: by the mechanism that carries it out
        when GPU-granular (:func:`hpcsched.policies.realise.cost`: a release costs the
        ``extension_stall``, a shrink of primary nodes ``shrink_cost``, a requeue
        ``restart_cost``); else :meth:`grow_cost` for a grow, ``shrink_cost`` for a shrink."""
        grow = self.grow_cost(c.x_from, c.x_to)
        if c.change.mechanism is not None:
            return realise.cost(c.change.mechanism, restart_cost=self.restart_cost,
                                shrink_cost=self.shrink_cost, stall=self.extension_stall,
                                grow_cost=grow)
        return grow if c.kind == ChangeKind.GROW else self.shrink_cost


def predict(job: JobView, nodes: int, batch_size: int, gpus: int | None = None) -> float | None:
    """Predicted goodput of ``job`` on ``gpus`` GPUs over ``nodes`` nodes (``None``: whole
    nodes) at global ``batch_size``, samples/s: what the policies rank configurations by
    (:func:`hpcsched.perf.model.job_goodput`); ``None`` without a model or when the batch size
    cannot be cut over the GPUs."""
    return job_goodput(job, nodes, batch_size, gpus)


def reconcile(plan: Plan, snapshot: ClusterSnapshot, costs: Costs = Costs()
              ) -> tuple[list[Change], list[str]]:
    """The changes to make now for ``plan``, in order, and notes on what was not made and why
    (module docstring)."""
    candidates, notes = classify(plan, snapshot, costs)
    chosen = [c for c in candidates if c.kind in (ChangeKind.PENDING, ChangeKind.PREEMPT)]
    resizes = [c for c in candidates if c.kind in RESIZES]
    batches = [c for c in candidates if c.kind == ChangeKind.BATCH]
    resizes, held = hold_back(resizes, snapshot, costs)
    room, note = admission_room(chosen, resizes, snapshot, plan)
    if room:
        chosen += room
        resizes = [c for c in resizes if c.kind != ChangeKind.SHRINK]
        notes.append(note)
    made, more = gain_test(resizes, batches, snapshot, costs, plan)
    changes, late = feasible_now(chosen + made, snapshot, costs.grow)
    return changes, notes + held + more + late


# ----------------------------------------------------------------------------------- classify

def classify(plan: Plan, snapshot: ClusterSnapshot, costs: Costs = Costs()
             ) -> tuple[list[Candidate], list[str]]:
    """One candidate change per target that asks for one, in plan order, and a note for each
    target that cannot be made (unknown rate, preemption off, a pending job told to wait).
    Targets of unknown or busy jobs, and of running jobs at their current size and batch size,
    are dropped silently. A GPU count the snapshot's granularity cannot give (a GPU-granular
    plan on whole nodes) is first mapped onto it (:func:`on_grid`)."""
    candidates: list[Candidate] = []
    notes: list[str] = []
    for t in plan.targets:
        job = snapshot.job(t.job_id)
        if job is None or job.busy:
            continue
        t = on_grid(t, job, snapshot)
        if job.state == SlurmState.PENDING:
            out = _classify_pending(job, t, costs, snapshot)
        elif job.state == SlurmState.RUNNING and (t.gpus_for(job), t.batch_size) != (job.gpus, job.batch_size):
            out = _classify_running(job, t, costs, snapshot)
        else:
            continue
        if isinstance(out, Candidate):
            candidates.append(out)
        elif out is not None:
            notes.append(out)
    return candidates, notes


def on_grid(t: JobTarget, job: JobView, snapshot: ClusterSnapshot) -> JobTarget:
    """``t`` as the snapshot's granularity can make it: at ``"node"`` granularity a target
    that speaks GPUs becomes whole nodes of the job's workers per node (rounded down, within
    its node limits; 0 stays 0); otherwise ``t`` itself."""
    if snapshot.granularity == Granularity.GPU or t.gpus is None:
        return t
    if t.gpus <= 0:
        return replace(t, nodes=0, gpus=None)
    nodes = min(job.max_nodes, max(job.min_nodes, t.gpus // job.workers_per_node))
    return replace(t, nodes=nodes, gpus=None, placement=t.placement if len(t.placement) == nodes else ())


def _change(job: JobView, t: JobTarget, kind: ChangeKind, reason: str | None = None,
            placement: tuple[str, ...] = ()) -> Change:
    return Change(job.job_id, kind, job.nodes, t.nodes, job.batch_size, t.batch_size,
                  t.reason if reason is None else reason, placement, job.gpus, t.gpus_for(job),
                  placement_gpus=t.placement_gpus if placement and placement == t.placement else ())


def _classify_pending(job: JobView, t: JobTarget, costs: Costs,
                      snapshot: ClusterSnapshot | None = None) -> Candidate | str | None:
    if t.nodes == 0 and not job.held:
        return f"job {job.job_id}: {t.reason}"
    moved = costs.place_pending and t.placement and tuple(t.placement) != tuple(job.node_names)
    if not job.held and (t.gpus_for(job), t.batch_size) == (job.gpus, job.batch_size) and not moved:
        return None
    if t.nodes == 0:
        return f"job {job.job_id}: {t.reason}"
    # a change: its size set (and, for a job held after a preemption, its release)
    change = _change(job, t, ChangeKind.PENDING, placement=t.placement)
    if _realised(snapshot, costs):
        r = realise.start(job, snapshot.node_size, tuple(t.placement), snapshot.free_gpus)
        change = replace(change, mechanism=r.mechanism, layout=r.layout,
                         to_nodes=len(r.layout) or change.to_nodes)
    return Candidate(change)


def _preempt(job: JobView, t: JobTarget, costs: Costs) -> Candidate | str:
    """Running ``job`` whose target ``t`` gives it no nodes: a preemption candidate where the
    daemon applies preemptions (:attr:`Costs.preemption`), else why it keeps running."""
    if costs.preemption:
        return Candidate(Change(job.job_id, ChangeKind.PREEMPT, job.nodes, 0, job.batch_size,
                                job.batch_size, t.reason, (), job.gpus, 0))
    return (f"job {job.job_id}: {t.reason}; preemption is not applied by the daemon here "
            "(Costs.preemption is off): the job keeps running")


def _mechanism(job: JobView, t: JobTarget, kind: ChangeKind, want: int, spans: int,
               snapshot: ClusterSnapshot
               ) -> tuple[realise.Realisation | None, JobTarget, int, int] | str:
    """How a GPU-granular resize of running ``job`` to ``want`` GPUs is made: ``(how, t,
    want, spans)``, a grow by extension, a shrink by :func:`realise.shrink` (its ``want`` and
    batch size rounded to the GPUs its layout gives back, since a node's extensions go back
    whole, and ``spans`` its layout's nodes), or ``None`` for any other kind, with ``t``,
    ``want`` and ``spans`` as given; or why a shrink cannot be made."""
    if kind == ChangeKind.GROW:
        return realise.Realisation(Mechanism.EXTEND), t, want, spans
    if kind != ChangeKind.SHRINK:
        return None, t, want, spans
    how = realise.shrink(job, want, snapshot.node_size)
    if not how.layout:
        return (f"job {job.job_id}: shrink to {want} GPU(s) not made: only a requeue "
                "onto more nodes than it holds could give that many")
    spans = len(how.layout)
    if sum(g for _, g in how.layout) != want:   # a node's extensions go back whole
        want = sum(g for _, g in how.layout)
        t = replace(t, batch_size=realise.batch_on(job, t.batch_size, want), gpus=want)
    return how, t, want, spans


def _classify_running(job: JobView, t: JobTarget, costs: Costs, snapshot: ClusterSnapshot | None = None
                      ) -> Candidate | str:
    """Running ``job`` against its target ``t``: a candidate change with its goodput now and
    predicted at the target (a preemption at 0 nodes: :func:`_preempt`), or why none is made
    (no throughput model yet, or a shrink no mechanism can give). GPU-granular changes carry
    their mechanism (:func:`_mechanism`), which may round a shrink to whole nodes' extensions."""
    if t.nodes == 0:
        return _preempt(job, t, costs)
    want = t.gpus_for(job)
    kind = ChangeKind.between(job.gpus, want)
    x_from = predict(job, job.nodes, job.batch_size, job.gpus)
    spans, how = t.nodes, None
    if kind == ChangeKind.GROW and costs.grow == GrowMode.EXTENSION and snapshot is not None \
            and snapshot.granularity == Granularity.GPU:
        spans = extension_spans(job, want, snapshot)
    if _realised(snapshot, costs):
        got = _mechanism(job, t, kind, want, spans, snapshot)
        if isinstance(got, str):
            return got
        how, t, want, spans = got
    x_to = predict(job, spans, t.batch_size, want)
    if x_from is None or x_to is None:
        return f"job {job.job_id}: no throughput model yet; {kind} not made"
    reason = f"{t.reason}; goodput {x_from:.0f} -> {x_to:.0f} samples/s predicted"
    placement = t.placement if kind == ChangeKind.GROW else ()
    change = _change(job, t, kind, reason, placement)
    if how is not None:
        change = replace(change, mechanism=how.mechanism, layout=how.layout,
                         to_nodes=len(how.layout) or change.to_nodes)
    return Candidate(change, x_from, x_to, t.weight)


def _realised(snapshot: ClusterSnapshot | None, costs: Costs) -> TypeGuard[ClusterSnapshot]:
    """Changes are GPU-granular and carry their mechanism (:attr:`Costs.by_mechanism`)."""
    return (costs.by_mechanism and costs.grow == GrowMode.EXTENSION and snapshot is not None
            and snapshot.granularity == Granularity.GPU)


# ----------------------------------------------------------------------------- admission room

def admission_room(chosen: list[Candidate], resizes: list[Candidate], snapshot: ClusterSnapshot,
                   plan: Plan | None = None) -> tuple[list[Candidate], str]:
    """The shrinks among ``resizes`` to make without the gain test, and a note: all of them when
    the pending jobs the plan starts need more GPUs than are free now; else none. Shrinks that
    make room for the jobs the plan starts are the plan's admission decision, not a rate trade:
    the gain test (samples/s of running jobs) cannot see their value.

    The jobs the plan starts are the pending changes in ``chosen`` and, given ``plan``, the
    pending jobs it gives GPUs at the very size and batch they already ask for (no change is
    sent for those: Slurm starts them once room frees). Without them, a plan that keeps a
    pending job's request and shrinks a running job to make room for it would have its shrink
    judged by the gain test alone, which refuses it (it only loses samples/s), and the pending
    job would wait (seen in the simulator: docs/design-notes.md, "policies/reconcile.py")."""
    start_need = sum(_start_gpus(c.change, snapshot)
                     for c in chosen if c.kind == ChangeKind.PENDING and c.change.to_nodes > 0)
    start_need += sum(_kept_request(t, snapshot, {c.change.job_id for c in chosen})
                      for t in (plan.targets if plan is not None else ()))
    free_now = sum(snapshot.free_gpus.values())
    room = [c for c in resizes if c.kind == ChangeKind.SHRINK] if start_need > free_now else []
    if not room:
        return [], ""
    return room, (f"made {len(room)} shrink(s) to make room: the plan starts jobs needing "
                  f"{start_need} GPU(s), {free_now} free")


def _start_gpus(change: Change, snapshot: ClusterSnapshot) -> int:
    """GPUs pending ``change`` starts its job on."""
    if change.to_gpus:
        return change.to_gpus
    job = snapshot.job(change.job_id)
    assert job is not None, change.job_id   # a plan starts the snapshot's pending jobs
    return change.to_nodes * job.workers_per_node


def _kept_request(t: JobTarget, snapshot: ClusterSnapshot, changed: set[str]) -> int:
    """GPUs pending job ``t`` is planned to start on at the size it already asks for (0: the
    target is not such a start: a running, busy or unknown job, one told to wait, or one with
    a pending change of its own in ``changed``)."""
    job = snapshot.job(t.job_id)
    if job is None or job.busy or job.state != SlurmState.PENDING or t.job_id in changed or t.nodes <= 0:
        return 0
    return t.gpus_for(job)


# ------------------------------------------------------------------------------ hold (no thrash)

def hold_back(resizes: list[Candidate], snapshot: ClusterSnapshot, costs: Costs
              ) -> tuple[list[Candidate], list[str]]:
    """``resizes`` without those that would undo a job's last resize (its
    :attr:`~hpcsched.model.snapshot.JobView.last_resize`) less than ``costs.hold`` seconds
    after it (``resized_at``), and a note for each held back: a job just grown is not shrunk
    back, nor a job just shrunk grown back, on the strength of one round's prediction (issue 9:
    a flip-flop is a resize undone within two rounds). This holds for shrinks that would make
    room for the plan's starts too.

    A resize in the same direction as the last one (a job grown again as GPUs free up) is not
    held, nor is a job's first resize after it started: its start size was the user's request
    or Slurm's, not a change the hold protects. Holding every resize within the hold of any
    start or resize kept a job just started at its request from shrinking while a job beside
    it waited for those GPUs (history and measurements: docs/design-notes.md,
    "policies/reconcile.py")."""
    if costs.hold <= 0:
        return resizes, []
    kept, notes = [], []
    for c in resizes:
        job = snapshot.job(c.change.job_id)
        if job is not None and held_reversal(job, snapshot.time, costs.hold) == c.kind:
            held_since = job.resized_at if job.last_resize is not None and job.resized_at is not None \
                and snapshot.time - job.resized_at < costs.hold else None
            if held_since is not None:
                done = "grown" if job.last_resize == ChangeKind.GROW else "shrunk"
                notes.append(f"job {c.change.job_id}: {c.kind} waits: {done} "
                             f"{snapshot.time - held_since:.0f} s ago, less than the "
                             f"{costs.hold:.0f} s hold (no thrash)")
            else:
                assert job.grow_failed_at is not None   # held_reversal's other reason
                notes.append(f"job {c.change.job_id}: grow waits: a grow failed "
                             f"{snapshot.time - job.grow_failed_at:.0f} s ago, less than the "
                             f"{costs.hold:.0f} s hold (not retried every round)")
        else:
            kept.append(c)
    return kept, notes


# ---------------------------------------------------------------------------------- gain test

def payoff_seconds(job: JobView | None, x_from: float, horizon: float) -> float:
    """Seconds a change of ``job`` pays off over: ``horizon``, or less if the job ends sooner
    (its remaining samples at its current rate ``x_from``)."""
    if job is not None and job.remaining_samples is not None and x_from > 0:
        return max(0.0, min(horizon, job.remaining_samples / x_from))
    return horizon


def objective_now(snapshot: ClusterSnapshot, plan: Plan | None = None) -> float:
    """The policy's objective at the running jobs' current configurations: the sum of their
    predicted goodput, each weighted by its target's :attr:`~JobTarget.weight` in ``plan``
    (weight 1 without a target)."""
    weights = {t.job_id: t.weight for t in plan.targets} if plan is not None else {}
    return sum((predict(j, j.nodes, j.batch_size, j.gpus) or 0.0) * weights.get(j.job_id, 1.0)
               for j in snapshot.jobs if j.state == SlurmState.RUNNING)


def gain_test(resizes: list[Candidate], batches: list[Candidate], snapshot: ClusterSnapshot,
              costs: Costs, plan: Plan | None = None) -> tuple[list[Candidate], list[str]]:
    """Which of the plan's resizes and batch-only changes to make, and notes saying why
    (module docstring, step 3). Gains and losses are in the policy's objective: goodput
    weighted by each target's weight."""
    notes: list[str] = []
    if resizes:
        base = objective_now(snapshot, plan)
        together = resizes + batches
        gain = sum(c.gain for c in together)
        won = sum(c.gain * payoff_seconds(snapshot.job(c.change.job_id), c.x_from, costs.horizon)
                  for c in together)
        lost = sum(c.x_from * c.weight * costs.resize_cost(c) for c in resizes)
        if base <= 0:
            notes.append("not made: no measured throughput")
        else:
            summary = (f"resizes gain {gain / base:+.0%} of the objective ({_fmt(base)} now): "
                       f"{_fmt(won)} over at most {costs.horizon:.0f} s (less for jobs that end "
                       f"sooner) vs {_fmt(lost)} lost to their costs")
            if won > lost and gain >= costs.min_gain * base:
                return together, [f"made: {summary}"]
            notes.append(f"not made: {summary}")
    made = []
    for c in batches:
        if c.x_to >= c.x_from * (1 + costs.min_gain):
            made.append(c)
        else:
            notes.append(f"job {c.change.job_id}: batch {c.change.from_batch_size} -> "
                         f"{c.change.to_batch_size} gains less than {costs.min_gain:.0%}; not made")
    return made, notes


def _fmt(x: float) -> str:
    """A figure of the objective, in goodput units (samples/s or samples) or small weights."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


__all__ = ["ORDER", "RESIZES", "Candidate", "Change", "Costs", "admission_room", "classify",
           "extension_spans", "feasible_now", "gain_test", "hold_back", "objective_now", "on_grid",
           "payoff_seconds", "predict", "reconcile", "released"]
