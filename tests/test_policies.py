"""Policies are pure: pinned on small worked cases, plus invariants."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcsched.daemon.config import defaults
from hpcsched.model.snapshot import ClusterSnapshot, JobView, NodeView, ProfilePoint
from hpcsched.policies import DEFAULT_POLICY, POLICIES, REGISTRY, PolicyError, make_policy
from hpcsched.policies.common import admit_fifo, capacity
from hpcsched.policies.dp import Option, solve
from hpcsched.policies.ones import ONES
from hpcsched.protocol.limits import JobLimits


def _job(job_id, nodes, *, wpn=2, min_nodes=1, max_nodes=3, batch=64, bmin=None, bmax=None,
         state="RUNNING", profile=(), submit=0.0, busy=False):
    return JobView(job_id=job_id, state=state, nodes=nodes, node_names=(),
                   limits=JobLimits(wpn, min_nodes, max_nodes, bmin or batch, bmax or batch, None, batch, "linear"),
                   batch_size=batch, submit_time=submit, profile=tuple(profile), busy=busy)


def _cluster(n_nodes=4, gpus=4, jobs=(), other=()):
    return ClusterSnapshot(time=0.0, nodes=tuple(NodeView(f"n{i}", gpus, 0, "idle")
                                                 for i in range(1, n_nodes + 1)),
                           jobs=tuple(jobs), other_gpus_allocated=tuple(other))


def _pt(world, local, step_time, accum=1):
    return ProfilePoint(world, world // 2, local, accum, step_time,
                        world * local * accum / step_time, samples=50)


def test_dp_recurrence_on_a_hand_solved_instance():
    """K = 4 GPUs. Job 1: T(2)=10, T(4)=12. Job 2: T(0)=0, T(2)=9, T(4)=17.
    By hand: (2, 2) -> 19; (4, 0) -> 12; (0, 4) impossible for job 1 (min 2); so 19."""
    j1 = [Option(2, 10.0, 64), Option(4, 12.0, 64)]
    j2 = [Option(0, 0.0, 64), Option(2, 9.0, 64), Option(4, 17.0, 64)]
    total, picks = solve([j1, j2], 4)
    assert total == 19.0 and picks == [0, 1]
    total, picks = solve([j1, j2], 6)          # 6 GPUs: (2, 4) -> 27 beats (4, 2) -> 21
    assert total == 27.0 and picks == [0, 2]
    assert solve([j1, [Option(4, 1.0, 1)]], 4) is None   # minimums 2 + 4 > 4


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 6), st.sampled_from([0.0, 1.0, 2.5, 4.0, 7.0,
                                                                      float("nan")])),
                         min_size=0, max_size=4), min_size=1, max_size=4),
       st.integers(0, 10))
def test_dp_finds_the_best_total_and_the_tie_rules_of_a_brute_force(jobs, k):
    """Every combination of one option per job within ``k`` GPUs, by brute force: the DP's
    total is the best (None when nothing fits), its picks reach it, and of the combinations
    that reach it the picks use the fewest GPUs, then prefer each job's earlier option
    (the last job's first: the backtrack fixes it first). An option valued NaN never counts."""
    import itertools
    options = [[Option(g, v, 1) for g, v in job] for job in jobs]
    best = None
    for combo in itertools.product(*(range(len(o)) for o in options)):
        picked = [options[j][i] for j, i in enumerate(combo)]
        if any(math.isnan(o.value) for o in picked) or sum(o.gpus for o in picked) > k:
            continue
        total = 0.0
        for o in picked:
            total += o.value
        key = (total, -sum(o.gpus for o in picked), [-i for i in reversed(combo)])
        if best is None or key > best[0]:
            best = (key, total, list(combo))
    got = solve(options, k)
    if best is None:
        assert got is None
        return
    assert got is not None and got[0] == best[1]
    assert sum(options[j][i].gpus for j, i in enumerate(got[1])) == -best[0][1]
    assert got[1] == best[2]


def test_dp_moves_gpus_from_a_job_that_does_not_scale_to_one_that_does():
    # A: step time independent of local batch (does not scale with GPUs), B: perfectly linear
    a = _job("A", 2, batch=96, profile=[_pt(4, 24, 0.1), _pt(2, 48, 0.1)])
    b = _job("B", 1, batch=96, profile=[_pt(2, 48, 0.096), _pt(4, 24, 0.048)])
    plan = make_policy("dp").decide(_cluster(2, 4, [a, b]))
    assert plan.target("A").nodes == 1, plan.target("A").reason
    assert plan.target("B").nodes == 3
    assert "samples/s" in plan.target("B").reason


def test_dp_chooses_the_larger_batch_when_it_pays():
    c = _job("C", 1, min_nodes=1, max_nodes=1, batch=32, bmin=32, bmax=128,
             profile=[_pt(2, 16, 0.05), _pt(2, 32, 0.05)])   # fixed step time: bigger is better
    plan = make_policy("dp").decide(_cluster(1, 4, [c]))
    assert (plan.target("C").nodes, plan.target("C").batch_size) == (1, 128)


def test_a_job_with_no_feasible_size_is_held_not_the_whole_plan():
    stuck = _job("S", 3, min_nodes=3, profile=[_pt(6, 16, 0.1)])  # batch 64 cannot be cut over 6 GPUs
    free = _job("F", 1, profile=[_pt(2, 32, 0.064), _pt(4, 16, 0.032)])
    plan = make_policy("dp").decide(_cluster(4, 4, [stuck, free]))
    assert plan.target("S") is None and plan.target("F").nodes == 2


def test_unmeasured_and_busy_jobs_keep_their_size():
    a = _job("A", 2)                      # no profile
    b = _job("B", 1, profile=[_pt(2, 32, 0.064)], busy=True)
    plan = make_policy("dp").decide(_cluster(4, 4, [a, b]))
    assert plan.target("A").nodes == 2 and "not measured" in plan.target("A").reason
    assert plan.target("B") is None


def test_pending_jobs_admitted_in_submission_order_others_wait_with_reason():
    run = _job("R", 3, min_nodes=3, batch=96, profile=[_pt(6, 16, 0.1)])
    p1 = _job("P1", 1, state="PENDING", submit=1.0)
    p2 = _job("P2", 1, state="PENDING", submit=2.0)
    plan = make_policy("dp").decide(_cluster(2, 4, [run, p2, p1]))   # 8 GPUs: 6 + 2
    assert plan.target("P1").nodes == 1
    assert plan.target("P2").nodes == 0 and "waits" in plan.target("P2").reason


def test_capacity_excludes_unusable_nodes_and_foreign_jobs():
    snap = ClusterSnapshot(0.0, (NodeView("n1", 4, 0, "idle"), NodeView("n2", 4, 0, "down"),
                                 NodeView("n3", 4, 4, "allocated")), (), (("n3", 4),))
    assert capacity(snap) == 4


def test_registry_has_one_line_per_policy_and_every_policy_decides():
    assert POLICIES == tuple(REGISTRY) == ("static", "tiresias", "dp", "ones", "ones-pal", "pollux", "sia",
                                            "jct", "wham")
    snap = _contended()
    for name in POLICIES:
        policy = make_policy(name)
        plan = policy.decide(snap, seed=1)
        assert policy.name == plan.policy == name
        assert plan == make_policy(name).decide(snap, seed=1)      # pure: same input, same plan


def test_importing_the_policies_package_stays_light():
    """The Slurm glue and the configuration import the package for its types and names: no
    policy, no model, no scipy until a policy is made."""
    code = ("import sys, hpcsched.policies, hpcsched.model.snapshot; "
            "print(sorted(m for m in sys.modules if m.startswith(('scipy', 'hpcsched.perf', "
            "'hpcsched.policies.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['hpcsched.policies.base']"


@pytest.mark.parametrize(("sizes", "free", "admitted", "waiting"), [
    ([2, 2, 2], 6, [0, 1, 2], []),
    ([4, 4], 6, [0], [(1, 2)]),
    ([4, 1, 2], 3, [1, 2], [(0, 3)]),          # a smaller job passes one that does not fit
    ([1], 0, [], [(0, 0)]),
    ([1, 1], -2, [], [(0, -2), (1, -2)]),      # over-committed already: nothing starts
    ([], 5, [], []),
])
def test_admit_fifo_walks_in_order_and_lets_smaller_jobs_pass(sizes, free, admitted, waiting):
    jobs = [_job(f"J{i}", 1, wpn=g, state="PENDING", submit=float(i)) for i, g in enumerate(sizes)]
    got, waits = admit_fifo(jobs, free, lambda j: j.gpus)
    assert [j.job_id for j in got] == [f"J{i}" for i in admitted]
    assert [(j.job_id, f) for j, f in waits] == [(f"J{i}", f) for i, f in waiting]


@pytest.mark.parametrize(("sizes", "free", "admitted", "waiting"), [
    ([4, 1, 2], 3, [], [(0, 3), (1, 3), (2, 3)]),   # the head does not fit: nobody passes it
    ([1, 4, 1], 3, [0], [(1, 2), (2, 2)]),
    ([2, 1], 3, [0, 1], []),
])
def test_admit_fifo_without_backfill_stops_at_the_first_job_that_does_not_fit(
        sizes, free, admitted, waiting):
    jobs = [_job(f"J{i}", 1, wpn=g, state="PENDING", submit=float(i)) for i, g in enumerate(sizes)]
    got, waits = admit_fifo(jobs, free, lambda j: j.gpus, backfill=False)
    assert [j.job_id for j in got] == [f"J{i}" for i in admitted]
    assert [(j.job_id, f) for j, f in waits] == [(f"J{i}", f) for i, f in waiting]


def test_static_backfills_unless_told_not_to():
    cluster = _cluster(n_nodes=2, jobs=[
        _job("R", 1), _job("P1", 4, max_nodes=4, state="PENDING", submit=1.0),
        _job("P2", 1, state="PENDING", submit=2.0)])   # 6 GPUs free: P1 needs 8, P2 2
    assert [t.job_id for t in make_policy("static").decide(cluster).targets] == ["P2"]
    assert make_policy("static", {"backfill": False}).decide(cluster).targets == ()
    with pytest.raises(PolicyError, match="policy 'static': backfill must be true or false"):
        make_policy("static", {"backfill": "no"})


def test_static_changes_nothing_and_unknown_policy_is_refused():
    assert make_policy("static").decide(_cluster(jobs=[_job("A", 2)])).targets == ()
    # pending jobs that fit, FIFO, at their submitted size; one that does not fit gets nothing
    plan = make_policy("static").decide(_cluster(n_nodes=2, jobs=[
        _job("R", 1), _job("P2", 3, state="PENDING", submit=2.0),
        _job("P1", 1, state="PENDING", submit=1.0)]))
    assert [(t.job_id, t.nodes, t.batch_size) for t in plan.targets] == [("P1", 1, 64)]
    with pytest.raises(PolicyError, match="unknown policy 'nope'"):
        make_policy("nope")
    with pytest.raises(PolicyError, match="policy 'dp'"):
        make_policy("dp", {"bogus": 1})
    with pytest.raises(PolicyError, match="policy 'static'.*bogus"):
        make_policy("static", {"bogus": 1})
    with pytest.raises(PolicyError, match="policy 'ones'"):
        make_policy("ones", {"population": 1})


jobs_st = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4), st.floats(0.01, 0.5),
                             st.booleans()), min_size=0, max_size=6)


@given(jobs=jobs_st, n_nodes=st.integers(1, 6))
@settings(max_examples=150, deadline=None)
def test_dp_never_overcommits_and_respects_limits(jobs, n_nodes):
    views = []
    for i, (nodes, max_extra, t, pending) in enumerate(jobs):
        views.append(_job(f"J{i}", nodes, min_nodes=1, max_nodes=nodes + max_extra,
                          state="PENDING" if pending else "RUNNING", submit=float(i),
                          profile=[] if pending else [_pt(nodes * 2, 32, t)]))
    snap = _cluster(n_nodes, 4, views)
    plan = make_policy("dp").decide(snap)
    cap = capacity(snap)
    running_min = sum(v.min_nodes * 2 for v in views if v.state == "RUNNING")
    if running_min > cap:
        assert "exceed" in " ".join(plan.notes)
        return
    used = 0
    for t in plan.targets:
        v = snap.job(t.job_id)
        if t.nodes:
            assert v.min_nodes <= t.nodes <= v.max_nodes
        else:
            assert v.state == "PENDING"
        used += t.nodes * v.workers_per_node
    assert used <= cap
    assert plan == make_policy("dp").decide(snap)   # deterministic


# --------------------------------------------------------------------------------- ONES


def _contended():
    a = _job("A", 2, batch=96, profile=[_pt(4, 24, 0.1), _pt(2, 48, 0.1)])          # flat
    b = _job("B", 1, batch=96, profile=[_pt(2, 48, 0.096), _pt(4, 24, 0.048)])      # scales
    c = _job("C", 1, batch=96, profile=[_pt(2, 48, 0.096)])
    return _cluster(2, 4, [a, b, c])


def test_ones_improves_fitness_over_generations_and_moves_gpus_to_the_scaling_job():
    ones = ONES(population=16, generations=15)
    plan = ones.decide(_contended(), seed=3)
    h = ones.history
    assert h[-1] <= h[0] and all(x >= y for x, y in zip(h, h[1:])), h   # elitism: never worse
    assert plan.target("A").nodes == 1 and plan.target("B").nodes >= 2, plan
    assert "remaining" in plan.notes[0]


def test_ones_is_deterministic_and_carries_its_population():
    p1 = ONES().decide(_contended(), seed=7)
    p2 = ONES().decide(_contended(), seed=7)
    assert p1 == p2
    ones = ONES()
    ones.decide(_contended(), seed=7)
    assert set(ones._carried) == {"A", "B", "C"}
    snap = _contended()
    gone = ClusterSnapshot(snap.time, snap.nodes, snap.jobs[:2])            # C finished
    ones.decide(gone, seed=8)
    assert set(ones._carried) == {"A", "B"}


def test_ones_seeded_with_dp_is_never_worse_than_the_dp():
    snap = _contended()
    ones = ONES(population=8, generations=3, seed_with_dp=True)
    plan = ones.decide(snap, seed=1)
    dp = make_policy("dp").decide(snap)
    t = ones._table(list(snap.jobs), set())

    def as_genes(p):
        return np.array([[p.target(j.job_id).nodes for j in snap.jobs]])

    assert ONES._fitness(t, as_genes(plan))[0] <= ONES._fitness(t, as_genes(dp))[0] + 1e-9


@given(jobs=jobs_st, n_nodes=st.integers(1, 6), seed=st.integers(0, 1000))
@settings(max_examples=100, deadline=None)
def test_ones_never_overcommits_and_respects_limits(jobs, n_nodes, seed):
    views = [_job(f"J{i}", nodes, min_nodes=1, max_nodes=nodes + extra,
                  state="PENDING" if pending else "RUNNING", submit=float(i),
                  profile=[] if pending else [_pt(nodes * 2, 32, t)])
             for i, (nodes, extra, t, pending) in enumerate(jobs)]
    snap = _cluster(n_nodes, 4, views)
    if sum(v.min_nodes * 2 for v in views if v.state == "RUNNING") > capacity(snap):
        return
    plan = ONES(population=6, generations=4).decide(snap, seed)
    used = 0
    for t in plan.targets:
        v = snap.job(t.job_id)
        assert t.nodes == 0 and v.state == "PENDING" or v.min_nodes <= t.nodes <= v.max_nodes
        used += t.nodes * v.workers_per_node
    assert used <= capacity(snap)
    assert plan == ONES(population=6, generations=4).decide(snap, seed)


def test_gradient_noise_makes_the_dp_stop_growing_the_batch():
    """Step time grows slowly with the batch, so throughput grows with it. Without noise
    statistics the DP takes
    the largest batch; with little gradient noise (a large batch buys no progress) it keeps the
    base batch (Pollux's efficiency)."""
    base = dict(min_nodes=1, max_nodes=1, batch=32, bmin=32, bmax=128,
                profile=[_pt(2, 16, 0.05), _pt(2, 32, 0.06)])   # step time grows slowly
    noisy = JobView(**{**_job("C", 1, **base).__dict__, "grad_noise": (1.0, 1e-6)})
    assert make_policy("dp").decide(_cluster(1, 4, [_job("C", 1, **base)])).target("C").batch_size == 128
    assert make_policy("dp").decide(_cluster(1, 4, [noisy])).target("C").batch_size == 32


def test_jct_is_the_default_policy():
    assert defaults().policy.name == DEFAULT_POLICY == "jct"


def test_ones_pal_places_without_changing_sizes():
    snap = _contended()
    plan = make_policy("ones-pal").decide(snap, seed=2)
    bare = ONES(seed_with_dp=True).decide(snap, seed=2)
    assert [(t.job_id, t.nodes, t.batch_size) for t in plan.targets] == \
           [(t.job_id, t.nodes, t.batch_size) for t in bare.targets]
    assert all(len(t.placement) == t.nodes for t in plan.targets if t.nodes)
    assert plan.policy == "ones-pal"


def test_any_policy_takes_a_placement_stage():
    plan = make_policy("dp", {"placement": "packed"}).decide(_contended())
    assert plan.policy == "dp+packed" and all(t.placement for t in plan.targets if t.nodes)
    with pytest.raises(PolicyError, match="placement must be one of"):
        make_policy("dp", {"placement": "scattered"})


def test_ones_starts_an_unmeasured_pending_job_as_large_as_fits():
    pend = _job("P", 2, min_nodes=1, max_nodes=2, state="PENDING", batch=96)
    other = _job("B", 1, batch=96, profile=[_pt(2, 48, 0.096)], state="PENDING", submit=1.0)
    plan = ONES().decide(_cluster(3, 4, [pend, other]), seed=0)   # 12 GPUs: room for both
    assert plan.target("P").nodes == 2, plan


@pytest.mark.parametrize("seeded", [False, True])
def test_ones_can_be_seeded_by_jct(seeded):
    """jct's plan (its exact search) enters ONES' population as a starting point. Two jobs that
    scale, 16 GPUs: jct gives A 7 nodes, which ONES clips to the 4 it may explore (twice the 2
    measured); no status quo (1, 1) moved by one node reaches (4, 1), so it is in the population
    (no generations: the population is the starting one) only when seeded."""
    prof = [_pt(2, 48, 0.096), _pt(4, 24, 0.048)]
    a = _job("A", 1, max_nodes=8, batch=96, bmin=16, bmax=960, profile=prof)
    b = _job("B", 1, max_nodes=8, batch=96, bmin=16, bmax=960, profile=prof)
    snap = _cluster(8, 2, [a, b])
    ones = ONES(generations=0, seed_with_jct=seeded)
    plan = ones.decide(snap, seed=3)
    assert plan == ONES(generations=0, seed_with_jct=seeded).decide(snap, seed=3)
    pop = np.stack([ones._carried[j] for j in ("A", "B")], axis=1)     # (individuals, jobs)
    assert any(list(row) == [4, 1] for row in pop) == seeded
