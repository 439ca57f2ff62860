"""The ``wham`` policy: GPUs to the largest marginal completion rate (goodput gained per GPU over
remaining work), on small hand-made snapshots, checked against brute force and the job limits."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from hpcsched.model.snapshot import ClusterSnapshot, JobView, NodeView, ProfilePoint
from hpcsched.perf.model import best_at, model_for
from hpcsched.policies import PolicyError, make_policy
from hpcsched.policies.common import capacity, gpu_counts, min_gpus, nodes_spanned
from hpcsched.policies.reconcile import Costs
from hpcsched.policies.round import decide_round
from hpcsched.policies.wham import WHAM, WHAMParams, decide, holding_table
from hpcsched.protocol.limits import JobLimits


def _pt(world, local, step_time, nodes=1):
    return ProfilePoint(world, nodes, local, 1, step_time, world * local / step_time, samples=50)


# step time 0.02 s + 0.002 s per sample of the local batch: at a global batch of 256 the goodput
# 256 g / (0.02 g + 0.512) is concave in g (the fixed 0.02 s weighs more with every GPU)
CONCAVE = (_pt(4, 64, 0.148), _pt(8, 32, 0.084))
# perfectly scaling: 0.002 s per sample -> 500 samples/s per GPU
LINEAR = (_pt(4, 64, 0.128), _pt(8, 32, 0.064, nodes=2))
# does not scale at all: 256 samples / 0.1 s at any size
FLAT = (_pt(4, 64, 0.1), _pt(8, 32, 0.1, nodes=2))


def _job(job_id, gpus=4, *, state="PENDING", profile=CONCAVE, remaining=1e6, wpn=8, min_nodes=1,
         max_nodes=1, min_gpus=1, batch=256, app="", busy=False, submit=0.0, **extra):
    return JobView(job_id=job_id, state=state, nodes=max(1, -(-gpus // wpn)), node_names=(),
                   limits=JobLimits(wpn, min_nodes, max_nodes, batch, batch, None, batch,
                                    "linear", min_gpus),
                   batch_size=batch, submit_time=submit, profile=tuple(profile),
                   remaining_samples=remaining, app_class=app, busy=busy,
                   layout=(gpus,) if state == "RUNNING" else (), **extra)


def _snap(jobs, nodes=1, gpus=8, granularity="gpu", **extra):
    return ClusterSnapshot(time=0.0, nodes=tuple(NodeView(f"n{i}", gpus, 0, "mixed")
                                                 for i in range(1, nodes + 1)),
                           jobs=tuple(jobs), granularity=granularity, **extra)


def _gpus(plan, snap):
    return {t.job_id: t.gpus_for(snap.job(t.job_id)) for t in plan.targets}


def _pure(snap, **params):
    """The plan without change costs (the bare index), on the snapshot as given."""
    return decide(snap, WHAMParams(price_changes=False, noise_growth=1.0, **params))


def _rate(job, g, snap):
    """X_j(g): the job's best goodput at g GPUs, as the policy predicts it."""
    return best_at(job, model_for(job), g, nodes_spanned(job, g, snap))[0] if g else 0.0


# ------------------------------------------------------------------------------ the index order

def test_the_shorter_job_gets_the_gpus_first():
    """Two identical linearly scaling jobs (each at most 4 GPUs) on 6 GPUs: the one with less
    work left has the larger index at every count, so it is filled first (4) and the longer
    one gets what is left (2)."""
    short = _job("S", profile=LINEAR, remaining=1e5, max_nodes=1, wpn=4)
    long_ = _job("L", profile=LINEAR, remaining=1e6, max_nodes=1, wpn=4)
    snap = _snap([long_, short], nodes=1, gpus=6)
    assert _gpus(_pure(snap), snap) == {"S": 4, "L": 2}
    # the same work left: order by scaling instead. The linear job gains 500 samples/s per GPU,
    # the flat one only from its first GPU: it gets that one, and the sixth GPU stays idle
    flat = _job("F", profile=FLAT, remaining=1e5, max_nodes=1, wpn=4)
    snap = _snap([flat, replace(short, job_id="G")], nodes=1, gpus=6)
    plan = _pure(snap)
    assert _gpus(plan, snap) == {"G": 4, "F": 1} and "1 GPU(s) left idle" in plan.notes[0]


def test_a_short_job_that_scales_well_beats_a_long_one_that_does_not():
    good = _job("good", profile=LINEAR, remaining=2e5, wpn=4, max_nodes=2)
    poor = _job("poor", profile=FLAT, remaining=2e6, wpn=4, max_nodes=2)
    snap = _snap([poor, good], nodes=2, gpus=4)
    got = _gpus(_pure(snap), snap)
    assert got["good"] == 8 and got["poor"] == 0


def test_the_index_is_marginal_goodput_over_remaining_work():
    """Each target's weight is 1 / R (reconcile's), and the job that took the last step took
    it at ``dX / (dg R)``: no job left with a step of a larger index that fits."""
    jobs = [_job("A", remaining=3e5), _job("B", remaining=1e6, profile=LINEAR, wpn=4,
                                               max_nodes=2)]
    snap = _snap(jobs, nodes=1, gpus=8)
    plan = _pure(snap)
    got = _gpus(plan, snap)
    for j in jobs:
        assert plan.target(j.job_id).weight == pytest.approx(1 / j.remaining_samples)
    assert sum(got.values()) == 8
    # a GPU moved from one job to the other never raises the sum of X_j / R_j
    total = sum(_rate(j, got[j.job_id], snap) / j.remaining_samples for j in jobs)
    assert plan.objective == pytest.approx(total)
    for a, b in itertools.permutations(jobs):
        ga, gb = got[a.job_id], got[b.job_id]
        if ga >= 1 and gb + 1 <= 8:
            moved = (total - _rate(a, ga, snap) / a.remaining_samples
                     + _rate(a, ga - 1, snap) / a.remaining_samples
                     - _rate(b, gb, snap) / b.remaining_samples
                     + _rate(b, gb + 1, snap) / b.remaining_samples)
            assert moved <= total * (1 + 1e-12)


def test_holding_costs_weigh_a_class():
    """The same two jobs, B with twice A's work: B waits behind A, unless its application's
    holding cost is high enough to make its index the larger."""
    a = _job("A", profile=LINEAR, remaining=1e5, app="alpha", wpn=4, max_nodes=1)
    b = _job("B", profile=LINEAR, remaining=2e5, app="beta", wpn=4, max_nodes=1)
    snap = _snap([a, b], nodes=1, gpus=4)
    assert _gpus(_pure(snap), snap) == {"A": 4, "B": 0}
    assert _gpus(_pure(snap, holding_costs=("Beta=3",)), snap) == {"A": 0, "B": 4}
    assert _pure(snap, holding_costs=("beta=3",)).target("B").weight == pytest.approx(3 / 2e5)


# ------------------------------------------------------------------------- concave speedups

def _concave(job, snap, counts):
    x = [_rate(job, g, snap) for g in counts]
    return all(d1 >= d2 - 1e-9 for d1, d2 in zip(np.diff([0.0, *x]), np.diff([0.0, *x])[1:]))


@pytest.mark.parametrize("remaining", [(1e5, 2e5, 4e5), (3e5, 1e5, 1e6), (1e6, 1e6, 2e5)])
def test_marginal_allocation_is_the_brute_force_optimum_for_concave_curves(remaining):
    """Three pending jobs with concave curves of different shapes on 8 GPUs of one node: the
    plan maximises sum_j X_j(g_j) / R_j over every allocation (greedy on marginal gains is
    optimal for concave separable objectives)."""
    profiles = (CONCAVE, LINEAR, (_pt(4, 64, 0.2), _pt(8, 32, 0.15)))
    jobs = [_job(f"J{i}", profile=p, remaining=r, batch=840)     # 840: any count of 1-8 divides it
            for i, (p, r) in enumerate(zip(profiles, remaining))]
    snap = _snap(jobs, nodes=1, gpus=8)
    for j in jobs:
        assert _concave(j, snap, range(1, 9)), j.job_id
    best = max(sum(_rate(j, g, snap) / j.remaining_samples for j, g in zip(jobs, gs))
               for gs in itertools.product(range(9), repeat=3) if sum(gs) <= 8)
    plan = _pure(snap)
    assert plan.objective == pytest.approx(best, rel=1e-9)
    assert sum(_gpus(plan, snap).values()) == 8


def test_a_non_concave_curve_is_stepped_along_its_envelope():
    """GPU granularity on nodes of 4: job A's goodput dips where it spills onto a second node
    (5 GPUs) and rises again to 8. One GPU at a time, A would stop at 4 (its fifth GPU loses
    goodput) and the flat job B would take one, leaving no room for A's 8; along A's envelope
    the step 4 -> 8 is worth more per GPU than B's start, so A gets 8."""
    spill = (_pt(4, 210, 0.42), _pt(5, 168, 0.6, nodes=2), _pt(8, 105, 0.22, nodes=2))
    a = _job("A", profile=spill, remaining=1e5, wpn=4, max_nodes=2, batch=840)
    b = _job("B", profile=FLAT, remaining=1e7, wpn=4, max_nodes=1, batch=840)
    snap = _snap([a, b], nodes=2, gpus=4)
    x = [_rate(a, g, snap) for g in range(9)]
    assert x[5] < x[4] and (x[8] - x[4]) / 4 / 1e5 > _rate(b, 1, snap) / 1e7   # the premise
    assert _gpus(_pure(snap), snap) == {"A": 8, "B": 0}


# ------------------------------------------------------------------------------ limits

def _random_snapshot(rng, granularity):
    jobs = []
    for i in range(int(rng.integers(2, 9))):
        wpn = int(rng.choice([1, 2, 4]))
        lo = int(rng.integers(1, 3))
        hi = lo + int(rng.integers(0, 3))
        running = bool(rng.random() < 0.5)
        g = wpn * lo
        jobs.append(_job(f"J{i}", g, state="RUNNING" if running else "PENDING",
                         profile=[CONCAVE, LINEAR, FLAT, ()][int(rng.integers(0, 4))],
                         remaining=float(10 ** rng.uniform(4, 7)), wpn=wpn, min_nodes=lo,
                         max_nodes=hi, min_gpus=int(rng.integers(1, g + 1)),
                         busy=bool(rng.random() < 0.15), submit=float(i)))
    return _snap(jobs, nodes=int(rng.integers(2, 6)), gpus=4, granularity=granularity)


@pytest.mark.parametrize("granularity", ["gpu", "node"])
@pytest.mark.parametrize("seed", range(12))
def test_limits_capacity_busy_jobs_and_work_conservation(seed, granularity):
    snap = _random_snapshot(np.random.default_rng(seed), granularity)
    running_min = sum(j.gpus if j.busy else min_gpus(j, snap)
                      for j in snap.jobs if j.state == "RUNNING")
    plan = make_policy("wham").decide(snap, seed=seed)
    if running_min > capacity(snap):
        assert plan.targets == ()
        return
    got = _gpus(plan, snap)
    for j in snap.jobs:
        if j.busy:
            assert j.job_id not in got, "a busy job is left as it is"
            continue
        g = got[j.job_id]
        if j.state == "RUNNING":
            assert g > 0, "wham never preempts"
        assert g == 0 or g in gpu_counts(j, snap) or (g == j.gpus and not j.profile), (j, g)
    busy = sum(j.gpus for j in snap.jobs if j.busy and j.state == "RUNNING")
    used = sum(got.values()) + busy
    assert used <= capacity(snap)
    # work-conserving: a job left below its largest count had no step that fits and gains
    left = capacity(snap) - used
    for j in snap.jobs:
        if j.busy or not j.profile:
            continue
        g = got[j.job_id]
        fits = [c for c in gpu_counts(j, snap) if g < c <= g + left]
        gains = [c for c in fits if _rate(j, c, snap) > _rate(j, g, snap) * (1 + 1e-9)]
        assert not gains or j.state == "PENDING" and g == 0 and not fits, (j.job_id, g, left)


def test_all_gpus_are_used_while_jobs_can_use_them():
    jobs = [_job(f"J{i}", profile=p, remaining=r, wpn=4, max_nodes=2)
            for i, (p, r) in enumerate([(CONCAVE, 1e5), (LINEAR, 5e5), (CONCAVE, 2e6)])]
    snap = _snap(jobs, nodes=5, gpus=4)
    got = _gpus(make_policy("wham").decide(snap), snap)
    assert sum(got.values()) == 20 and all(g > 0 for g in got.values())
    # room for every job's maximum: each gets it
    snap = _snap(jobs, nodes=8, gpus=4)
    assert _gpus(make_policy("wham").decide(snap), snap) == {"J0": 8, "J1": 8, "J2": 8}


def test_a_running_job_keeps_its_minimum_and_a_busy_one_its_gpus():
    run = _job("R", 4, state="RUNNING", remaining=1e8, wpn=4, max_nodes=2, min_gpus=2)
    busy = _job("B", 4, state="RUNNING", busy=True, wpn=4)
    short = _job("S", remaining=1e4, wpn=4, max_nodes=2)
    snap = _snap([run, busy, short], nodes=3, gpus=4)
    got = _gpus(make_policy("wham").decide(snap), snap)
    assert "B" not in got and got["R"] >= 2 and got["R"] + got["S"] <= 8


def test_change_costs_keep_a_nearly_finished_job_where_it_is():
    """A running job about 2 s from its end, 8 GPUs, half of them free, grows by requeue: the
    bare index grows it to 8 (it is the shortest job); priced, the 30 s restart outweighs the
    gain and the free GPUs go to the pending job."""
    run = _job("R", 4, state="RUNNING", profile=LINEAR, remaining=4000, wpn=4, max_nodes=2)
    pend = _job("P", profile=LINEAR, remaining=1e6, wpn=4, max_nodes=2)
    snap = _snap([run, pend], nodes=2, gpus=4, grow="requeue")
    assert _gpus(_pure(snap), snap) == {"R": 8, "P": 0}
    priced = decide(snap, WHAMParams(noise_growth=1.0))
    assert _gpus(priced, snap) == {"R": 4, "P": 4}


def test_an_unmeasured_pending_job_starts_only_on_gpus_no_measured_job_gains_from():
    new = _job("N", 4, profile=(), wpn=4, max_nodes=1)
    known = _job("K", profile=LINEAR, remaining=1e9, wpn=4, max_nodes=1)
    snap = _snap([new, known], nodes=1, gpus=4)
    assert _gpus(_pure(snap), snap) == {"N": 0, "K": 4}
    snap = _snap([new, known], nodes=2, gpus=4)
    plan = _pure(snap)
    assert _gpus(plan, snap) == {"N": 4, "K": 4} and "not measured" in plan.target("N").reason


# ------------------------------------------------------------------- determinism, contract

def test_deterministic_and_independent_of_job_order():
    rng = np.random.default_rng(7)
    snap = _random_snapshot(rng, "gpu")
    plan = make_policy("wham").decide(snap, seed=1)
    assert plan == make_policy("wham").decide(snap, seed=2)
    flipped = replace(snap, jobs=snap.jobs[::-1])
    assert _gpus(make_policy("wham").decide(flipped), flipped) == _gpus(plan, snap)


def test_parameters_are_checked():
    assert holding_table(("BERT = 2", "cifar10=0.5")) == {"bert": 2.0, "cifar10": 0.5}
    for bad in ({"holding_costs": ["bert"]}, {"holding_costs": ["bert=0"]},
                {"holding_costs": "bert=2"}, {"noise_growth": 0.5}, {"aging": 0},
                {"max_options": 0}, {"restart_cost": -1}, {"price_changes": 1}):
        with pytest.raises(PolicyError, match="valid keys"):
            make_policy("wham", bad)
    assert isinstance(make_policy("wham", {"holding_costs": ["bert=2"]}), WHAM)


def test_judged_on_the_view_it_plans_on_and_rounds_on_events():
    snap = _snap([_job("A", 4, state="RUNNING", grad_noise=(1.0, 50.0))], nodes=1)
    wham = make_policy("wham")
    view = wham.judged_view(snap)
    assert view is wham.judged_view(snap) and view.jobs[0].grad_noise[1] == 100.0
    assert make_policy("wham", {"noise_growth": 1.0}).judged_view(snap) is snap
    assert wham.round_on_events and dict(wham.reconcile_gate) == {"min_gain": 0.0}
    assert decide_round(snap, wham, Costs(), seed=0).plan is not None


def test_aging_lets_a_long_waiting_job_overtake():
    a = _job("A", profile=LINEAR, remaining=1e5, wpn=4, max_nodes=1, submit=3600.0)
    b = _job("B", profile=LINEAR, remaining=2e5, wpn=4, max_nodes=1, submit=0.0)
    snap = replace(_snap([a, b], nodes=1, gpus=4), time=3600.0)
    assert _gpus(_pure(snap), snap) == {"A": 4, "B": 0}
    assert _gpus(_pure(snap, aging=600.0), snap) == {"A": 0, "B": 4}
