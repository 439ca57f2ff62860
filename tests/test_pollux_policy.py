"""The ``pollux`` policy (Pollux, OSDI'21 §4.1-4.2): fitness, speedups, the search and the plan,
on hand-built snapshots."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hpcsched.model.snapshot import ClusterSnapshot, JobView, NodeView, ProfilePoint
from hpcsched.policies import PolicyError, make_policy
from hpcsched.policies.pollux import Pollux
from hpcsched.policies.pollux_search import EPS, Problem, fitness, power_mean, repair
from hpcsched.protocol.limits import JobLimits

# local batch 48 at 2 GPUs and 24 at 4 GPUs, global batch 96 (see test_policies)
SCALES = ((2, 48, 0.096), (4, 24, 0.048))       # step time halves with the GPUs: linear
FLAT = ((2, 48, 0.1), (4, 24, 0.1))             # same throughput at any size: no speedup


def _pt(world, local, step_time):
    return ProfilePoint(world, 1, local, 1, step_time, world * local / step_time, samples=50)


def _job(job_id, gpus=0, *, state="RUNNING", nodes=(), layout=(), points=SCALES, wpn=1,
         max_nodes=16, min_nodes=1, batch=96, submit=-3600.0, busy=False, attained=0.0):
    n = len(nodes) if nodes else max(1, gpus // wpn)
    return JobView(job_id=job_id, state=state, nodes=n, node_names=tuple(nodes),
                   limits=JobLimits(wpn, min_nodes, max_nodes, batch, batch, None, batch, "linear"),
                   batch_size=batch, submit_time=submit, profile=tuple(_pt(*p) for p in points),
                   busy=busy, layout=tuple(layout), attained_gpu_seconds=attained)


def _snap(jobs, n_nodes=4, gpus=4, granularity="gpu", other=()):
    return ClusterSnapshot(time=0.0, nodes=tuple(NodeView(f"n{i}", gpus, 0, "idle")
                                                 for i in range(1, n_nodes + 1)),
                           jobs=tuple(jobs), other_gpus_allocated=tuple(other),
                           granularity=granularity)


def _policy(**kw):
    kw.setdefault("explore", False)
    return Pollux(**kw)


# ------------------------------------------------------------------------------------ fitness

@pytest.mark.parametrize("speedups, p, expected", [
    ((1.0, 1.0), -1, 1.0 + EPS),
    ((1.0, 2.0), -1, 2 / (1 / (1 + EPS) + 1 / (2 + EPS))),          # harmonic mean
    ((1.0, 4.0), 0, ((1 + EPS) * (4 + EPS)) ** 0.5),                  # geometric mean
    ((1.0, 3.0), 1, 2.0 + EPS),                                        # arithmetic mean
    ((0.0, 2.0), -1, 2 / (1 / EPS + 1 / (2 + EPS))),                  # a job with nothing
])
def test_power_mean_by_hand(speedups, p, expected):
    assert power_mean(np.array(speedups), p) == pytest.approx(expected, rel=1e-12)


def _problem(base, factor, p=-1.0, scale=1.0):
    base = np.array(base, dtype=np.int16)
    J, N = base.shape
    return Problem(cap=np.full(N, 4), base=base, unit=np.ones(J, dtype=np.int64), whole=False,
                   lo=np.ones(J, dtype=np.int64), hi=np.full(J, 8), max_nodes=np.full(J, 2),
                   factor=np.array(factor, dtype=float), scale=scale, p=p)


@pytest.mark.parametrize("state, expected", [
    # unchanged rows: no restart factor; speedups 1 and 2 (GPUs / 1)
    (((1, 0), (0, 2)), 2 / (1 / (1 + EPS) + 1 / (2 + EPS))),
    # job 0 moved: its speedup 1 x factor 0.5
    (((0, 1), (0, 2)), 2 / (1 / (0.5 + EPS) + 1 / (2 + EPS))),
    # job 1 grown to 3: speedup 3 x 0.8
    (((1, 0), (1, 2)), 2 / (1 / (1 + EPS) + 1 / (2.4 + EPS))),
])
def test_fitness_is_the_power_mean_of_penalised_speedups(state, expected):
    prob = _problem(((1, 0), (0, 2)), (0.5, 0.8))
    states = np.array([state], dtype=np.int16)
    got = fitness(prob, states, lambda s: s.sum(axis=2).astype(float))
    assert got[0] == pytest.approx(expected, rel=1e-12)


def test_restart_factor_is_the_artifacts():
    pol = Pollux(restart_penalty=30.0)
    # age 600 s, 2 restarts: (600 - 60) / (600 + 30)
    aged = replace(_job("a", 1, submit=-600.0), restarts=2)
    assert pol._factor(aged, 0.0) == pytest.approx(540 / 630)
    assert pol._factor(_job("b", 1, submit=0.0), 0.0) == 0.0     # just submitted: no move pays


# ----------------------------------------------------------------------------------- speedups

@pytest.mark.parametrize("n_jobs", [1, 2, 4, 8])
def test_speedup_is_one_at_the_fair_share(n_jobs):
    """``a_f = ceil(K / J)`` GPUs: 16 / J here, packed onto full nodes."""
    jobs = [_job(str(i), 1, nodes=(f"n{i % 4 + 1}",)) for i in range(n_jobs)]
    snap = _snap(jobs)
    r = _policy()._round(snap)
    share = 16 // n_jobs
    nodes = -(-share // 4)
    state = np.zeros((1, n_jobs, 4), dtype=np.int16)
    for k in range(nodes):
        state[0, 0, k] = min(4, share - 4 * k)
    assert r.speedup(state)[0, 0] == pytest.approx(1.0)


def test_unmodelled_job_has_a_linear_speedup_and_keeps_its_size():
    job = _job("u", 2, nodes=("n1",), layout=(2,), points=())
    plan = _policy().decide(_snap([job]), seed=0)
    assert plan.target("u").gpus <= 2 and plan.target("u").predicted_goodput is None


# ------------------------------------------------------------------------------------ the plan

@pytest.mark.parametrize("points, grows", [(SCALES, True), (FLAT, False)])
def test_a_job_alone_grows_to_what_pays(points, grows):
    job = _job("a", 2, nodes=("n1",), layout=(2,), points=points)
    plan = _policy(generations=40).decide(_snap([job]), seed=1)
    t = plan.target("a")
    if grows:
        assert t.gpus >= 12, t.reason
    else:
        assert t.gpus == 2, t.reason       # no gain: the restart penalty keeps it where it is


def test_two_jobs_share_the_cluster():
    a = _job("a", 16, nodes=("n1", "n2", "n3", "n4"), layout=(4, 4, 4, 4))
    b = _job("b", 0, state="PENDING")
    plan = _policy(generations=60, population=48).decide(_snap([a, b]), seed=2)
    ga, gb = plan.target("a").gpus, plan.target("b").gpus
    assert ga > 0 and gb > 0 and ga + gb <= 16
    assert abs(ga - gb) <= 4, (ga, gb)      # p = -1 favours the worse-off job


def test_a_pending_job_is_admitted_possibly_smaller_than_it_asked():
    jobs = [_job(str(i), 4, nodes=(f"n{i}",), layout=(4,), attained=1e5) for i in (1, 2, 3, 4)]
    new = _job("new", 16, state="PENDING", nodes=(), points=SCALES)
    plan = _policy(generations=60).decide(_snap(jobs + [new]), seed=3)
    t = plan.target("new")
    assert 0 < t.gpus < 16 and len(t.placement) == t.nodes >= 1
    assert sum(plan.target(str(i)).gpus for i in (1, 2, 3, 4)) + t.gpus <= 16


def test_targets_weigh_goodput_by_the_fair_share_and_name_their_nodes():
    jobs = [_job("a", 4, nodes=("n1",), layout=(4,)), _job("b", 4, nodes=("n2",), layout=(4,))]
    pol = _policy()
    snap = _snap(jobs)
    plan = pol.decide(snap, seed=0)
    r = pol._round(snap)
    for i, j in enumerate(r.jobs):
        t = plan.target(j.job_id)
        assert t.weight == pytest.approx(1 / r.fair[i])
        assert t.nodes == len(t.placement) and set(t.placement) <= {"n1", "n2", "n3", "n4"}
    assert plan.objective is not None and plan.objective > 0


def test_busy_jobs_are_held_and_their_gpus_kept():
    busy = _job("busy", 12, nodes=("n1", "n2", "n3"), layout=(4, 4, 4), busy=True)
    other = _job("o", 4, nodes=("n4",), layout=(4,))
    plan = _policy(generations=30).decide(_snap([busy, other]), seed=0)
    assert plan.target("busy") is None
    t = plan.target("o")
    assert t.gpus <= 4 and set(t.placement) <= {"n4"}


def test_a_running_job_may_be_preempted_for_a_fair_share():
    """16 one-GPU jobs that do not scale fill 16 GPUs; 16 pending ones arrive: p = -1 gives
    as many jobs GPUs as it can, so the plan preempts none it can avoid and admits up to 16."""
    jobs = [_job(f"r{i}", 1, nodes=(f"n{i % 4 + 1}",), points=FLAT, attained=1e4 + i)
            for i in range(8)]
    jobs += [_job(f"p{i}", 0, state="PENDING", points=FLAT) for i in range(8)]
    plan = _policy(generations=60, population=48).decide(_snap(jobs), seed=4)
    given = [t for t in plan.targets if t.gpus]
    assert len(given) == 16 and sum(t.gpus for t in given) <= 16


def test_determinism_for_a_seed():
    jobs = [_job("a", 4, nodes=("n1",), layout=(4,)), _job("b", 0, state="PENDING"),
            _job("c", 2, nodes=("n2",), layout=(2,), points=FLAT)]
    one = Pollux().decide(_snap(jobs), seed=7)
    two = Pollux().decide(_snap(jobs), seed=7)
    assert one == two


def test_a_decision_sooner_than_the_interval_runs_no_generation():
    jobs = [_job("a", 4, nodes=("n1",), layout=(4,))]
    pol = Pollux(interval=60.0)
    pol.decide(_snap(jobs), seed=0)
    again = pol.decide(_snap(jobs), seed=1)
    assert "after 0 generation(s)" in again.notes[0]


@pytest.mark.parametrize("params", [{"population": 1}, {"mutation": "wild"}, {"bogus": 1}])
def test_bad_parameters_are_policy_errors(params):
    with pytest.raises(PolicyError):
        make_policy("pollux", params)


def test_no_jobs_or_no_gpus_give_an_empty_plan():
    assert make_policy("pollux").decide(_snap([]), seed=0).targets == ()
    job = _job("a", 0, state="PENDING")
    snap = _snap([job], other=tuple((f"n{i}", 4) for i in range(1, 5)))
    assert make_policy("pollux").decide(snap, seed=0).targets == ()


# -------------------------------------------------------------------------------------- repair

@pytest.mark.parametrize("whole", [False, True])
def test_repair_keeps_capacities_limits_and_whole_node_shapes(whole):
    rng = np.random.default_rng(0)
    J, N = 12, 6
    unit = rng.choice([1, 2, 4], size=J) if whole else np.ones(J, dtype=np.int64)
    lo = unit * (1 + (np.arange(J) % 2) * whole)       # some jobs need two whole nodes
    prob = Problem(cap=rng.integers(0, 5, size=N), base=np.zeros((J, N), dtype=np.int16),
                   unit=unit, whole=whole, lo=lo, hi=unit * 3, max_nodes=np.full(J, 3),
                   factor=np.ones(J), scale=1.0, p=-1.0)
    states = repair(prob, rng.integers(0, 6, size=(200, J, N)), rng)
    assert (states.sum(axis=1) <= prob.cap).all()                     # node capacities
    total = states.sum(axis=2)
    assert ((total == 0) | ((total >= lo) & (total <= prob.hi))).all()
    assert (np.count_nonzero(states, axis=2) <= 3).all()
    spread = np.count_nonzero(states, axis=2) > 1                     # one distributed job
    assert (((states > 0) & spread[..., None]).sum(axis=1) <= 1).all()  # per node
    if whole:
        assert ((states == 0) | (states == unit[None, :, None])).all()
    assert total.any()


def test_node_granularity_plans_whole_nodes():
    jobs = [_job("a", 4, nodes=("n1", "n2"), layout=(), wpn=2, max_nodes=4),
            _job("b", 0, state="PENDING", wpn=4, max_nodes=2)]
    plan = _policy(generations=40).decide(_snap(jobs, granularity="node"), seed=5)
    for t in plan.targets:
        job = next(j for j in jobs if j.job_id == t.job_id)
        assert t.gpus is None and t.nodes == len(t.placement)
        assert t.nodes == 0 or job.min_nodes <= t.nodes <= job.max_nodes


# ---------------------------------------------------------------------------------------- time

def test_a_decision_on_64_gpus_and_160_jobs_is_quick():
    """A correctness guard (the benchmark measures time): a few seconds at most."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from policy_decision import snapshot

    snap = snapshot(64, 160, model="pollux")
    t = time.perf_counter()
    plan = make_policy("pollux").decide(snap, seed=0)
    assert time.perf_counter() - t < 5.0
    used = sum(t.gpus_for(snap.job(t.job_id)) for t in plan.targets)
    assert 0 < used <= 64
