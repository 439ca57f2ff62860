"""reconcile: the plan's targets -> the changes to make now. Each rule as a table (classify,
admission room, gain test, feasibility and order), plus worked cases through the DP."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, NodeView, Plan, ProfilePoint
from hpcsched.policies import make_policy
from hpcsched.policies.feasible import _place_grow_gpus
from hpcsched.policies.reconcile import (
    ORDER,
    Candidate,
    Change,
    Costs,
    admission_room,
    classify,
    feasible_now,
    gain_test,
    on_grid,
    payoff_seconds,
    predict,
    reconcile,
    released,
)
from hpcsched.protocol.kinds import ChangeKind
from hpcsched.protocol.limits import JobLimits


def _job(job_id, nodes, *, wpn=2, min_nodes=1, max_nodes=3, batch=64, bmin=None, bmax=None,
         state="RUNNING", profile=(), submit=0.0, busy=False, names=(), held=False,
         remaining=None):
    return JobView(job_id=job_id, state=state, nodes=nodes, node_names=tuple(names),
                   limits=JobLimits(wpn, min_nodes, max_nodes, bmin or batch, bmax or batch, None, batch, "linear"),
                   batch_size=batch, submit_time=submit, profile=tuple(profile), busy=busy,
                   held=held, remaining_samples=remaining)


def _pt(world, local, step_time, accum=1):
    return ProfilePoint(world, world // 2, local, accum, step_time,
                        world * local * accum / step_time, samples=50)


def _cluster(n_nodes=4, gpus=4, jobs=(), used=0):
    return ClusterSnapshot(time=0.0, nodes=tuple(NodeView(f"n{i}", gpus, used, "mixed")
                                                 for i in range(1, n_nodes + 1)),
                           jobs=tuple(jobs))


# perfectly scaling job: step 0.002 s per sample of the local batch -> 500 samples/s per GPU
SCALES = [_pt(2, 48, 0.096), _pt(4, 24, 0.048)]
# a job whose step time does not grow with the local batch: throughput grows with the batch
FLAT = [_pt(2, 16, 0.05), _pt(2, 32, 0.05)]


def _snap_ab():
    a = _job("A", 2, batch=96, profile=[_pt(4, 24, 0.1), _pt(2, 48, 0.1)], names=("n1", "n2"))
    b = _job("B", 1, batch=96, profile=SCALES, names=("n3",))
    nodes = tuple(NodeView(f"n{i}", 4, 2 if i <= 3 else 0, "mixed") for i in range(1, 5))
    return ClusterSnapshot(0.0, nodes, (a, b))


# ------------------------------------------------------------------------------ classify

RUN = {"profile": SCALES, "batch": 96}


@pytest.mark.parametrize(("job", "target", "costs", "kind", "note"), [
    # running jobs: the kind follows the node count; batch-only at the same nodes
    (_job("J", 2, **RUN), (1, 96), Costs(), ChangeKind.SHRINK, None),
    (_job("J", 1, **RUN), (3, 96), Costs(), ChangeKind.GROW, None),
    (_job("J", 1, profile=FLAT, batch=32, bmax=128), (1, 128), Costs(), ChangeKind.BATCH, None),
    # nothing to change, an unknown rate, a busy job
    (_job("J", 1, **RUN), (1, 96), Costs(), None, None),
    (_job("J", 1, batch=96), (2, 96), Costs(), None, "no throughput model yet; grow not made"),
    (_job("J", 1, busy=True, **RUN), (2, 96), Costs(), None, None),
    # 0 nodes for a running job: a preemption only where preemption is on
    (_job("J", 1, **RUN), (0, 96), Costs(), None, "preemption is not applied by the daemon"),
    (_job("J", 1, **RUN), (0, 96), Costs(preemption=True), ChangeKind.PREEMPT, None),
    # pending jobs: a size set before the start, a wait, a release of a held job
    (_job("J", 2, state="PENDING"), (1, 64), Costs(), ChangeKind.PENDING, None),
    (_job("J", 2, state="PENDING"), (2, 64), Costs(), None, None),
    (_job("J", 2, state="PENDING"), (0, 64), Costs(), None, "job J: waits"),
    (_job("J", 2, state="PENDING", held=True), (2, 64), Costs(), ChangeKind.PENDING, None),
    (_job("J", 2, state="PENDING", held=True), (0, 64), Costs(), None, "job J: waits"),
])
def test_classify(job, target, costs, kind, note):
    plan = Plan("p", (JobTarget("J", target[0], target[1], "waits" if not target[0] else "sized"),))
    candidates, notes = classify(plan, _cluster(jobs=[job]), costs)
    assert [c.kind for c in candidates] == ([kind] if kind else [])
    assert (note is None and notes == []) or (note is not None and note in notes[0])
    for c in candidates:
        assert (c.change.from_nodes, c.change.to_nodes) == (job.nodes, target[0])
        weighed = c.kind in (ChangeKind.SHRINK, ChangeKind.GROW, ChangeKind.BATCH)
        assert (c.x_from > 0 and c.x_to > 0) == weighed


@pytest.mark.parametrize(("place_pending", "placement", "changed"), [
    (False, ("n3", "n4"), False),      # the daemon: same size, no change
    (True, ("n3", "n4"), True),        # the simulator: other nodes than it asks for
    (True, ("n1", "n2"), False),       # the nodes it asks for already
    (True, (), False),                 # no placement
])
def test_classify_places_a_pending_job_only_where_asked(place_pending, placement, changed):
    job = _job("J", 2, state="PENDING", names=("n1", "n2"))
    plan = Plan("p", (JobTarget("J", 2, 64, "sized", placement),))
    candidates, _ = classify(plan, _cluster(jobs=[job]), Costs(place_pending=place_pending))
    assert [c.change.placement for c in candidates] == ([placement] if changed else [])


def test_a_grow_carries_its_placement_a_shrink_does_not():
    grow = _job("G", 1, names=("n1",), **RUN)
    shrink = _job("S", 2, names=("n2", "n3"), **RUN)
    plan = Plan("p", (JobTarget("G", 2, 96, "g", ("n1", "n4")), JobTarget("S", 1, 96, "s", ("n2",))))
    candidates, _ = classify(plan, _cluster(jobs=[grow, shrink]))
    assert [(c.kind, c.change.placement) for c in candidates] == [
        (ChangeKind.GROW, ("n1", "n4")), (ChangeKind.SHRINK, ())]


# ------------------------------------------------------------------------ admission room

def _cand(job_id, kind, to_nodes=1, x_from=0.0, x_to=0.0, from_nodes=1, placement=()):
    return Candidate(Change(job_id, kind, from_nodes, to_nodes, 64, 64, "r", placement),
                     x_from, x_to)


@pytest.mark.parametrize(("used", "start_nodes", "room"), [
    (4, 2, True),      # 4 GPUs needed (2 nodes x 2), 0 free: make room
    (3, 2, False),     # 4 needed, 4 free
    (4, 0, False),     # nothing starts
])
def test_admission_room_makes_the_shrinks_when_starts_need_more_than_is_free(used, start_nodes, room):
    snap = _cluster(n_nodes=4, gpus=4, used=used, jobs=[_job("P", start_nodes or 1, state="PENDING")])
    chosen = [_cand("P", ChangeKind.PENDING, to_nodes=start_nodes)]
    resizes = [_cand("S", ChangeKind.SHRINK), _cand("G", ChangeKind.GROW)]
    made, note = admission_room(chosen, resizes, snap)
    assert [c.change.job_id for c in made] == (["S"] if room else [])
    assert ("make room" in note) == room


@pytest.mark.parametrize(("asks", "planned", "room"), [
    (2, 2, True),      # planned at the 4 GPUs it asks for, 0 free: room is made (no change of its own)
    (2, 0, False),     # told to wait: nothing starts
])
def test_admission_room_counts_a_pending_job_planned_at_its_own_request(asks, planned, room):
    snap = _cluster(n_nodes=4, gpus=4, used=4, jobs=[_job("P", asks, state="PENDING")])
    plan = Plan("t", (JobTarget("P", planned, 64, "r"),), None)
    resizes = [_cand("S", ChangeKind.SHRINK), _cand("G", ChangeKind.GROW)]
    assert admission_room([], resizes, snap) == ([], "")   # without the plan: not seen
    made, note = admission_room([], resizes, snap, plan)
    assert [c.change.job_id for c in made] == (["S"] if room else [])
    assert ("make room" in note) == room


# ------------------------------------------------------------------------------ gain test

@pytest.mark.parametrize(("costs", "ratio", "made"), [
    # the job runs at 1,000 samples/s; +50 % over 600 s = 300,000 samples vs 30 s x 1,000 lost
    (Costs(restart_cost=30, horizon=600), 1.5, True),
    (Costs(restart_cost=400, horizon=600), 1.5, False),              # restart too dear
    (Costs(restart_cost=30, horizon=600, min_gain=0.6), 1.5, False),  # gains less than 60 %
    (Costs(restart_cost=30, horizon=600), 1.0, False),               # no gain at all
])
def test_gain_test_weighs_the_resizes_together_against_their_restarts(costs, ratio, made):
    snap = _cluster(jobs=[_job("G", 1, **RUN)])
    x = predict(snap.jobs[0], 1, 96)
    assert x == pytest.approx(1000.0, rel=1e-6)
    got, notes = gain_test([_cand("G", ChangeKind.GROW, 2, x, x * ratio)], [], snap, costs)
    assert [c.change.job_id for c in got] == (["G"] if made else [])
    assert notes[0].startswith("made:" if made else "not made:")


def test_gain_test_without_a_measured_rate_makes_no_resize():
    snap = _cluster(jobs=[_job("G", 1, batch=96)])           # no profile: no prediction
    got, notes = gain_test([_cand("G", ChangeKind.GROW, 2, 10.0, 20.0)], [], snap, Costs())
    assert got == [] and notes == ["not made: no measured throughput"]


@pytest.mark.parametrize(("x_to", "made"), [(1060.0, True), (1040.0, False)])
def test_gain_test_makes_a_batch_only_change_that_gains_min_gain_on_its_own(x_to, made):
    snap = _cluster(jobs=[_job("B", 1, **RUN)])
    got, notes = gain_test([], [_cand("B", ChangeKind.BATCH, 1, 1000.0, x_to)], snap, Costs())
    assert [c.change.job_id for c in got] == (["B"] if made else [])
    assert made or "gains less than 5%" in notes[0]


@pytest.mark.parametrize(("remaining", "x_from", "expect"), [
    (None, 100.0, 600.0),          # the job does not say: the horizon
    (6000.0, 100.0, 60.0),         # ends in 60 s
    (1e9, 100.0, 600.0),           # ends after the horizon
    (6000.0, 0.0, 600.0),          # no rate: the horizon
])
def test_a_change_pays_off_over_the_horizon_or_the_jobs_remaining_time(remaining, x_from, expect):
    assert payoff_seconds(_job("J", 1, remaining=remaining), x_from, 600.0) == expect


# ----------------------------------------------------------------------- feasible and order

@pytest.mark.parametrize(("free", "placement", "made", "kept"), [
    ({"n1": 0, "n2": 4, "n3": 4}, ("n1", "n3"), True, True),     # its own node n1 counts
    ({"n1": 0, "n2": 4, "n3": 0}, ("n1", "n3"), True, False),    # n3 full: Slurm chooses
    ({"n1": 0, "n2": 0, "n3": 0}, (), False, False),             # only its own node: waits
])
def test_feasible_now_places_a_grow_only_where_it_fits(free, placement, made, kept):
    job = _job("G", 1, wpn=4, names=("n1",), **RUN)
    snap = ClusterSnapshot(0.0, tuple(NodeView(n, 4, 4 - f, "mixed") for n, f in free.items()),
                           (job,))
    changes, notes = feasible_now([_cand("G", ChangeKind.GROW, 2, 1.0, 2.0, placement=placement)],
                                  snap)
    assert [c.job_id for c in changes] == (["G"] if made else [])
    if made:
        assert changes[0].placement == (placement if kept else ())
    assert bool(notes) == (not kept)


def test_feasible_now_orders_by_kind_then_by_gain():
    snap = _cluster(n_nodes=8, jobs=[_job(j, 1, names=(f"n{i}",), **RUN)
                                     for i, j in enumerate("ABCDEF", 1)])
    chosen = [_cand("A", ChangeKind.GROW, 2, 1.0, 2.0), _cand("B", ChangeKind.GROW, 2, 1.0, 5.0),
              _cand("C", ChangeKind.PENDING), _cand("D", ChangeKind.BATCH, 1, 1.0, 1.5),
              _cand("E", ChangeKind.SHRINK, 0), _cand("F", ChangeKind.PREEMPT, 0)]
    changes, _ = feasible_now(chosen, snap)
    assert [c.job_id for c in changes] == ["F", "E", "D", "C", "B", "A"]
    assert list(ORDER) == [ChangeKind.PREEMPT, ChangeKind.SHRINK, ChangeKind.BATCH,
                           ChangeKind.PENDING, ChangeKind.GROW]


@pytest.mark.parametrize(("names", "layout", "to_gpus", "granularity", "freed"), [
    # whole nodes: the first nodes are kept (Slurm's rule), the rest given back
    (("n1", "n2", "n3"), (), 2, "node", {"n2": 2, "n3": 2}),
    (("n1", "n2", "n3"), (), 4, "node", {"n3": 2}),
    # GPU-granular: the nodes where the job holds fewest first, the last of equals first
    (("n1", "n2", "n3"), (4, 1, 2), 4, "gpu", {"n2": 1, "n3": 2}),
    (("n1", "n2", "n3"), (4, 1, 2), 5, "gpu", {"n2": 1, "n3": 1}),
    (("n1", "n2"), (3, 3), 4, "gpu", {"n2": 2}),
    # a preemption gives back everything
    (("n1", "n2"), (4, 1), 0, "gpu", {"n1": 4, "n2": 1}),
    (("n1", "n2"), (), 0, "node", {"n1": 2, "n2": 2}),
])
def test_released_follows_the_shrink_rules(names, layout, to_gpus, granularity, freed):
    job = replace(_job("S", len(names), names=names), layout=layout)
    assert released(job, to_gpus, granularity) == freed


@pytest.mark.parametrize("granularity", ["node", "gpu"])
def test_a_grow_may_take_the_gpus_a_shrink_of_the_same_plan_gives_back(granularity):
    """A plan that moves GPUs from one job to another is made in one round: the grow fits only
    on what the shrink frees (the simulator applies shrinks first; on Slurm the extension job
    waits seconds for them)."""
    a = _job("A", 2, wpn=4, names=("n1", "n2"), **RUN)
    b = _job("B", 1, wpn=4, names=("n3",), **RUN)
    snap = replace(ClusterSnapshot(0.0, tuple(NodeView(n, 4, 4, "allocated") for n in ("n1", "n2", "n3")),
                                   (a, b)), granularity=granularity)
    grow = Candidate(Change("B", ChangeKind.GROW, 1, 2, 64, 64, "r", (), 4, 8), 1.0, 2.0)
    shrink = Candidate(Change("A", ChangeKind.SHRINK, 2, 1, 64, 64, "r", (), 8, 4), 1.0, 1.0)
    for grow_mode in ("extension", "requeue"):
        changes, notes = feasible_now([grow, shrink], snap, grow_mode)
        assert [(c.job_id, c.kind) for c in changes] == [("A", "shrink"), ("B", "grow")], notes
        if granularity == "node" and grow_mode == "extension":
            assert changes[1].placement == ("n3", "n2")       # its own node, then the freed one
    alone, notes = feasible_now([grow], snap, "extension")       # without the shrink: it waits
    assert alone == [] and "waits" in notes[0]


# ------------------------------------------------------------------- worked cases (the DP)

def test_reconcile_orders_shrink_before_grow_and_explains():
    snap = _snap_ab()
    plan = make_policy("dp").decide(snap)
    changes, notes = reconcile(plan, snap, Costs(restart_cost=30, shrink_cost=2, horizon=600))
    assert [(c.job_id, c.kind, c.from_nodes, c.to_nodes) for c in changes] == [
        ("A", "shrink", 2, 1), ("B", "grow", 1, 3)]
    assert "samples/s predicted" in changes[1].reason and notes[0].startswith("made:")


def test_reconcile_skips_resizes_not_worth_their_restart_cost():
    snap = _snap_ab()
    plan = make_policy("dp").decide(snap)
    changes, notes = reconcile(plan, snap, Costs(restart_cost=10_000, horizon=60))
    assert changes == [] and notes[0].startswith("not made:")


def test_reconcile_defers_a_grow_that_slurm_cannot_place_now():
    snap = _snap_ab()
    full = tuple(NodeView(n.name, 4, 2 if n.name == "n3" else 4, "mixed") for n in snap.nodes)
    snap = ClusterSnapshot(0.0, full, snap.jobs)   # only B's own node n3 has room
    plan = Plan("test", (JobTarget("B", 3, 96, "test"),))
    changes, notes = reconcile(plan, snap, Costs(restart_cost=0))
    assert changes == [] and any("waits" in n for n in notes)


def test_reconcile_batch_only_change_when_it_gains_enough():
    c = _job("C", 1, min_nodes=1, max_nodes=1, batch=32, bmin=32, bmax=128, profile=FLAT)
    snap = _cluster(1, 4, [c])
    changes, _ = reconcile(make_policy("dp").decide(snap), snap)
    assert [(x.kind, x.from_batch_size, x.to_batch_size) for x in changes] == [("batch", 32, 128)]


def test_pending_job_starts_smaller_when_only_its_minimum_fits():
    run = _job("R", 2, min_nodes=2, max_nodes=2, profile=[_pt(4, 16, 0.1)])
    pend = _job("P", 3, min_nodes=1, max_nodes=3, state="PENDING", batch=96)   # asks 6 GPUs
    snap = _cluster(2, 4, [run, pend])                                        # 8: 4 left
    plan = make_policy("dp").decide(snap)
    assert plan.target("P").nodes == 2, plan
    changes, _ = reconcile(plan, snap)
    assert [(c.job_id, c.kind, c.from_nodes, c.to_nodes) for c in changes] == [("P", "pending", 3, 2)]


def test_reconcile_judges_a_plan_by_the_goodput_the_policy_maximised():
    """Little gradient noise: a batch above the base buys no progress (efficiency M0 / M), so the
    DP takes the base batch although raw throughput is higher at the current, larger one.
    Reconcile must make that change: it predicts the same goodput the policy did."""
    job = _job("C", 1, min_nodes=1, max_nodes=1, batch=128, bmin=32, bmax=128,
               profile=[_pt(2, 16, 0.05), _pt(2, 32, 0.06)])   # step time grows slowly
    job = replace(job, limits=replace(job.limits, base_batch_size=32), grad_noise=(1.0, 1e-6))
    snap = _cluster(1, 4, [job])
    plan = make_policy("dp").decide(snap)
    t = plan.target("C")
    assert t.batch_size == 32
    assert predict(job, t.nodes, t.batch_size) == pytest.approx(t.predicted_goodput, rel=1e-12)
    changes, notes = reconcile(plan, snap)
    assert [(c.kind, c.from_batch_size, c.to_batch_size) for c in changes] == [("batch", 128, 32)]
    assert "goodput 400 -> 640 samples/s predicted" in changes[0].reason, changes[0].reason


def test_reconcile_does_not_preempt_and_says_so():
    run = _job("R", 2, profile=[_pt(4, 16, 0.1)])
    snap = _cluster(2, 4, [run])
    plan = Plan("tiresias", (JobTarget("R", 0, 64, "tiresias: preempted by job S"),))
    changes, notes = reconcile(plan, snap)
    assert changes == [] and "preemption is not applied" in notes[0]


# ------------------------------------------------------------- GPU-granular plans, no thrash

@pytest.mark.parametrize(("gpus", "nodes"), [
    (6, 3),     # 6 GPUs at 2 per node: 3 nodes
    (5, 2),     # rounded down to whole nodes
    (1, 1),     # never below the job's minimum
    (99, 3),    # nor above its maximum
    (0, 0),     # 0 stays 0
])
def test_on_grid_maps_a_gpu_target_onto_whole_nodes(gpus, nodes):
    job = _job("A", 1)                           # 2 GPUs per node, 1..3 nodes
    t = JobTarget("A", 9, 64, "r", gpus=gpus)
    got = on_grid(t, job, _cluster())
    assert (got.nodes, got.gpus) == (nodes, None)
    gpu = replace(_cluster(), granularity="gpu")
    assert on_grid(t, job, gpu) is t


def test_a_gpu_granular_plan_on_whole_nodes_makes_the_whole_node_change():
    job = _job("B", 1, batch=96, profile=SCALES, names=("n1",))
    snap = _cluster(jobs=[job])
    plan = Plan("x", (JobTarget("B", 2, 96, "r", gpus=5),))
    changes, _ = reconcile(plan, snap, Costs(hold=0))
    assert [(c.kind, c.to_nodes, c.to_gpus) for c in changes] == [(ChangeKind.GROW, 2, 4)]


@pytest.mark.parametrize(("resized_at", "last", "hold", "made"), [
    (-100.0, "shrink", 180.0, False),   # shrunk 100 s ago: not grown back within the hold
    (-200.0, "shrink", 180.0, True),
    (-100.0, "shrink", 0.0, True),      # hold off
    (None, "shrink", 180.0, True),      # unknown: not held
    (-100.0, "grow", 180.0, True),      # grown 100 s ago: growing on undoes nothing
    (-100.0, None, 180.0, True),        # started 100 s ago, never resized: its start size
])                                      # was asked for, not a change the hold protects
def test_hold_back_keeps_a_just_resized_job_from_going_back(resized_at, last, hold, made):
    job = replace(_job("B", 1, batch=96, profile=SCALES, names=("n1",)), resized_at=resized_at,
                  last_resize=last)
    snap = _cluster(jobs=[job])
    changes, notes = reconcile(Plan("x", (JobTarget("B", 2, 96, "r"),)), snap, Costs(hold=hold))
    assert bool(changes) == made
    assert any("no thrash" in n for n in notes) == (not made)
    if not made:
        assert any("grow waits: shrunk 100 s ago" in n for n in notes)


def test_a_just_grown_job_is_not_shrunk_back_but_may_grow_again():
    job = replace(_job("B", 2, batch=96, profile=SCALES, names=("n1", "n2")), resized_at=-60.0,
                  last_resize=ChangeKind.GROW)
    snap = _cluster(jobs=[job])
    shrink, notes = reconcile(Plan("x", (JobTarget("B", 1, 96, "r"),)), snap, Costs(hold=180.0))
    assert shrink == [] and any("shrink waits: grown 60 s ago" in n for n in notes)
    grow, notes = reconcile(Plan("x", (JobTarget("B", 3, 96, "r"),)), snap, Costs(hold=180.0))
    assert [c.kind for c in grow] == [ChangeKind.GROW], notes


def test_a_held_job_is_not_shrunk_to_make_room_either():
    """Shrinks that make room for starts are held too (no grow undone within the hold)."""
    big = replace(_job("R", 3, names=("n1", "n2", "n3"), profile=SCALES, batch=96),
                  resized_at=-60.0, last_resize=ChangeKind.GROW)
    pend = _job("P", 2, state="PENDING")
    snap = ClusterSnapshot(0.0, tuple(NodeView(f"n{i}", 2, 2 if i <= 3 else 0, "mixed")
                                      for i in range(1, 4)), (big, pend))
    plan = Plan("x", (JobTarget("R", 1, 96, "r"), JobTarget("P", 1, 64, "r")))
    changes, notes = reconcile(plan, snap, Costs(hold=180.0))
    assert [c.kind for c in changes] == [ChangeKind.PENDING]
    assert any("no thrash" in n for n in notes)


@pytest.mark.parametrize(("free", "own", "to_gpus", "fits", "taken"), [
    ({"n1": 4, "n2": 2}, {}, 6, True, {"n1": 0, "n2": 0}),
    ({"n1": 1, "n2": 2}, {"n3": 2}, 5, True, {"n1": 0, "n2": 0, "n3": 0}),
    ({"n1": 4, "n2": 4}, {"n3": 2}, 6, True, {"n1": 0, "n2": 2, "n3": 2}),   # fullest first
    ({"n1": 1}, {"n3": 2}, 4, False, None),
])
def test_a_gpu_granular_grow_fits_when_the_free_gpus_add_up(free, own, to_gpus, fits, taken):
    job = replace(_job("G", len(own) or 1, names=tuple(own)), layout=tuple(own.values()))
    c = Change("G", ChangeKind.GROW, len(own), 2, 64, 64, "r", (), sum(own.values()), to_gpus)
    pool = dict(free)
    got, note = _place_grow_gpus(c, job, pool)
    assert (got is not None) == fits
    if fits:
        assert pool == taken
    else:
        assert "waits" in note


def test_a_policy_that_prices_restarts_itself_may_loosen_the_gate():
    """decide_round applies a policy's ``reconcile_gate``: Pollux's plans are not held."""
    from hpcsched.policies.base import PolicyBase
    from hpcsched.policies.round import decide_round

    job = replace(_job("B", 1, batch=96, profile=SCALES, names=("n1",)), resized_at=-60.0,
                  last_resize=ChangeKind.SHRINK)
    snap = _cluster(jobs=[job])

    class Grow(PolicyBase):
        name = "grow"

        def decide(self, snapshot, seed=0):
            return Plan("grow", (JobTarget("B", 2, 96, "r"),))

    class GrowUngated(Grow):
        reconcile_gate = {"hold": 0.0}

    held = decide_round(snap, Grow(), Costs(hold=180.0), seed=0)
    made = decide_round(snap, GrowUngated(), Costs(hold=180.0), seed=0)
    assert held.changes == () and any("no thrash" in n for n in held.notes)
    assert [c.kind for c in made.changes] == [ChangeKind.GROW]


@pytest.mark.parametrize(("resized_at", "last", "hold", "held"), [
    (-100.0, "grow", 180.0, "shrink"),    # grown 100 s ago: a shrink would undo it
    (-100.0, "shrink", 180.0, "grow"),
    (-180.0, "shrink", 180.0, None),      # the hold is over at exactly its length
    (-100.0, "grow", 0.0, None),          # hold off
    (None, "grow", 180.0, None),          # when unknown
    (-100.0, None, 180.0, None),          # never resized since it started
])
def test_held_reversal_names_the_resize_the_hold_forbids(resized_at, last, hold, held):
    from hpcsched.model.snapshot import held_reversal

    job = replace(_job("B", 1, batch=96, profile=SCALES, names=("n1",)), resized_at=resized_at,
                  last_resize=last)
    assert held_reversal(job, 0.0, hold) == held


@pytest.mark.parametrize(("failed_at", "resized_at", "last", "held"), [
    (-100.0, None, None, "grow"),         # a grow failed 100 s ago: not tried again yet
    (-180.0, None, None, None),           # the hold is over
    (None, None, None, None),
    (-100.0, -50.0, "grow", "shrink"),    # grown since: the no-thrash hold comes first
])
def test_a_job_whose_grow_failed_is_not_grown_again_within_the_hold(failed_at, resized_at, last, held):
    from hpcsched.model.snapshot import held_reversal

    job = replace(_job("B", 1, batch=96, profile=SCALES, names=("n1",)), grow_failed_at=failed_at,
                  resized_at=resized_at, last_resize=last)
    assert held_reversal(job, 0.0, 180.0) == held
    changes, notes = reconcile(Plan("x", (JobTarget("B", 2, 96, "r"),)), _cluster(jobs=[job]),
                               Costs(hold=180.0))
    assert bool(changes) == (held != "grow")
    assert any("grow waits: a grow failed 100 s ago" in n for n in notes) == (held == "grow")


def test_the_policy_sees_the_hold_reconcile_applies_after_its_gate():
    """decide_round tells the policy the hold its plans are judged with: Costs.hold, or 0 for
    a policy whose gate turns it off (the policy can then plan around it: ``jct``)."""
    from hpcsched.policies.base import PolicyBase
    from hpcsched.policies.round import decide_round

    seen = {}

    class Spy(PolicyBase):
        name = "spy"

        def decide(self, snapshot, seed=0):
            seen[type(self).__name__] = snapshot.hold
            return Plan("spy", ())

    class Ungated(Spy):
        reconcile_gate = {"hold": 0.0}

    snap = _cluster(jobs=[_job("B", 1, batch=96, profile=SCALES, names=("n1",))])
    decide_round(snap, Spy(), Costs(hold=180.0), seed=0)
    decide_round(snap, Ungated(), Costs(hold=180.0), seed=0)
    assert seen == {"Spy": 180.0, "Ungated": 0.0}
