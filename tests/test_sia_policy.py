"""The ``sia`` policy (Sia, SOSP'23 §3.2-3.3): its configurations, values and integer program, and
its plans on hand-built snapshots."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hpcsched.model.snapshot import ClusterSnapshot, JobView, NodeView, ProfilePoint
from hpcsched.perf.model import best_at, model_for
from hpcsched.policies import PolicyError, make_policy
from hpcsched.policies.sia import Sia
from hpcsched.policies.sia_milp import restart_factor, sia_sizes, solve, values
from hpcsched.protocol.limits import JobLimits

# global batch 96 (local 48 on 2 GPUs, 24 on 4); step time = a + b x local batch
LINEAR = ((2, 48, 0.096), (4, 24, 0.048))       # a = 0: throughput linear in the GPUs
FLAT = ((2, 48, 0.1), (4, 24, 0.1))             # the same throughput at any size
SATURATING = ((2, 48, 0.146), (4, 24, 0.098))   # a = 0.05 s: little gain past 8 GPUs


def _pt(world, local, step_time):
    return ProfilePoint(world, 1, local, 1, step_time, world * local / step_time, samples=50)


def _job(job_id, gpus=0, *, state="RUNNING", nodes=(), points=LINEAR, wpn=1, max_nodes=16,
         min_nodes=1, submit=-1e6, restarts=0, busy=False, min_gpu_count=None):
    n = len(nodes) if nodes else max(1, gpus // wpn)
    layout = (gpus // len(nodes),) * len(nodes) if nodes and wpn == 1 else ()
    return JobView(job_id=job_id, state=state, nodes=n, node_names=tuple(nodes),
                   limits=JobLimits(wpn, min_nodes, max_nodes, 96, 96, None, 96, "linear",
                                    min_gpu_count),
                   batch_size=96, submit_time=submit, restarts=restarts,
                   profile=tuple(_pt(*p) for p in points), busy=busy, layout=layout)


def _snap(jobs, n_nodes=4, gpus=4, granularity="gpu", restart_cost=30.0):
    return ClusterSnapshot(time=0.0, nodes=tuple(NodeView(f"n{i}", gpus, 0, "idle")
                                                 for i in range(1, n_nodes + 1)),
                           jobs=tuple(jobs), granularity=granularity, restart_cost=restart_cost)


def _gpus(plan, job_id):
    t = plan.target(job_id)
    return t.gpus_for(_job(job_id)) if t is not None else None


def _sia(**kw):
    kw.setdefault("explore", False)
    return Sia(**kw)


# --------------------------------------------------------------------- pieces, by hand

@pytest.mark.parametrize("node_size, most, expected", [
    (4, 20, [1, 2, 4, 8, 12, 16, 20]),
    (8, 64, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]),     # the artifact's CONFIGS_8GPU
    (4, 3, [1, 2]),
    (6, 12, [1, 2, 4, 6, 12]),
])
def test_sia_sizes_are_powers_of_two_in_a_node_then_whole_nodes(node_size, most, expected):
    assert sia_sizes(node_size, most) == expected


@pytest.mark.parametrize("age, restarts, penalty, expected", [
    (600.0, 2, 30.0, 540 / 630),
    (600.0, 0, 30.0, 600 / 630),
    (20.0, 5, 30.0, 1.0),           # younger than R: not penalised
    (100.0, 4, 30.0, 0.0),          # restarted more than its age pays for
])
def test_restart_factor_by_hand(age, restarts, penalty, expected):
    assert restart_factor(age, restarts, penalty) == pytest.approx(expected)


def test_values_by_hand():
    s = np.array([4.0, 2.0, 3.0])
    f = np.array([1.0, 0.5, 1.0])
    got = values(s, f, -0.5, 1.1, None)
    assert got == pytest.approx([1.1 - 0.5, 1.1 - 1.0, 1.1 - 3 ** -0.5])
    assert values(s, f, -0.5, 1.1, 2)[2] == pytest.approx(1.1 - 0.58)     # rounded first
    assert values(s, f, 1.0, 1.1, None) == pytest.approx([5.1, 2.1, 4.1])
    # a factor of 0: f s taken as 1e-4 (the artifact's ZERO_ALLOC_GAIN), powered 100
    assert values(np.array([1.0]), np.array([0.0]), -0.5, 1.1, None)[0] == pytest.approx(1.1 - 100)
    assert values(np.array([1.0]), np.array([0.0]), -2.0, 1.1, None)[0] == pytest.approx(1.1 - 3000)


def test_solve_a_multiple_choice_knapsack_by_hand():
    """4 GPUs. Job 0: 1 -> 0.1, 2 -> 0.4, 4 -> 0.6; job 1: 1 -> 0.1, 2 -> 0.4, 4 -> -0.2.
    By hand: (2, 2) -> 0.8 beats (4, -) 0.6 and (1, 2) 0.5."""
    job_of = np.array([0, 0, 0, 1, 1, 1])
    gpus = np.array([1, 2, 4, 1, 2, 4])
    value = np.array([0.1, 0.4, 0.6, 0.1, 0.4, -0.2])
    sol = solve(job_of, gpus, value, 2, 4)
    assert list(np.flatnonzero(sol.chosen)) == [1, 4] and sol.value == pytest.approx(0.8)
    sol = solve(job_of, gpus, value, 2, 5)           # 5 GPUs: (4, 1) -> 0.7 < (2, 2) + nothing
    assert sol.value == pytest.approx(0.8)
    sol = solve(job_of, gpus, value, 2, 6)           # 6 GPUs: (4, 2) -> 1.0
    assert list(np.flatnonzero(sol.chosen)) == [2, 4] and sol.value == pytest.approx(1.0)


def test_solve_never_takes_a_larger_pair_worth_no_more():
    job_of = np.array([0, 0, 0])
    sol = solve(job_of, np.array([1, 2, 4]), np.array([0.1, 0.1, 0.1]), 1, 4)
    assert list(np.flatnonzero(sol.chosen)) == [0]
    assert not solve(job_of, np.array([1, 2, 4]), np.array([-1.0, 0.0, -0.1]), 1, 4).chosen.any()


# ------------------------------------------------------------------------------- the plan

def test_it_fills_the_cluster_when_the_jobs_can_use_it():
    jobs = [_job("a", 4, nodes=("n1",)), _job("b", 4, nodes=("n2",))]
    plan = _sia().decide(_snap(jobs), seed=0)
    assert _gpus(plan, "a") + _gpus(plan, "b") == 16
    assert _gpus(plan, "a") == _gpus(plan, "b") == 8        # p < 0: the even split
    four = [_job(c, 2, nodes=(f"n{i + 1}",)) for i, c in enumerate("abcd")]
    plan = _sia().decide(_snap(four), seed=0)
    assert [_gpus(plan, c) for c in "abcd"] == [4, 4, 4, 4]


def test_the_job_that_scales_better_gets_more_gpus():
    jobs = [_job("lin", 4, nodes=("n1",)), _job("flat", 4, nodes=("n2",), points=FLAT)]
    plan = _sia().decide(_snap(jobs), seed=0)
    assert _gpus(plan, "lin") > _gpus(plan, "flat") >= 1
    assert _gpus(plan, "flat") == 1        # worth no more on more GPUs: its fewest
    assert _gpus(plan, "lin") + _gpus(plan, "flat") <= 16


@pytest.mark.parametrize("granularity", ["gpu", "node"])
def test_limits_are_respected(granularity):
    small = _job("small", 1, nodes=("n1",), max_nodes=2)                      # at most 2 GPUs
    pair = _job("pair", 2, nodes=("n2",), wpn=2, min_nodes=1, max_nodes=3)    # 2..6 GPUs
    fixed = _job("fixed", 4, nodes=("n3",), wpn=4, min_nodes=1, max_nodes=1)  # 4 GPUs
    plan = _sia().decide(_snap([small, pair, fixed], granularity=granularity), seed=0)
    assert 1 <= plan.target("small").gpus_for(small) <= 2
    assert 2 <= plan.target("pair").gpus_for(pair) <= 6
    assert plan.target("fixed").gpus_for(fixed) in (0, 4)
    if granularity == "node":
        assert plan.target("pair").gpus_for(pair) % 2 == 0
    total = sum(plan.target(j.job_id).gpus_for(j) for j in (small, pair, fixed))
    assert total <= 16


def test_a_job_with_a_minimum_above_one_gpu_is_normalised_to_it():
    job = _job("m", 4, nodes=("n1",), min_gpu_count=2, min_nodes=1, wpn=4, max_nodes=4)
    pol = _sia()
    opts = pol._options(job, model_for(job), _snap([job]))
    assert opts.gpus[0] == 2 and opts.speedup[0] == pytest.approx(2.0)   # the paper's N_min
    plan = pol.decide(_snap([job]), seed=0)
    assert plan.target("m").gpus >= 2


def test_the_restart_penalty_keeps_a_running_job_where_the_gain_is_small():
    """A saturating job on 8 GPUs alone: 16 are worth a little more. Restarted 3 times in its
    600 s (factor (600 - 90) / 630), it stays; without a penalty (or never restarted and old) it
    grows."""
    young = _job("s", 8, nodes=("n1", "n2"), points=SATURATING, submit=-600.0, restarts=3)
    kept = _sia().decide(_snap([young]), seed=0)
    assert _gpus(kept, "s") == 8 and "restart factor" not in kept.target("s").reason
    assert _gpus(_sia(restart_penalty=0.0).decide(_snap([young]), seed=0), "s") == 16
    old = replace(young, submit_time=-1e6, restarts=0)
    assert _gpus(_sia().decide(_snap([old]), seed=0), "s") == 16
    # the snapshot's restart cost is the penalty by default
    assert _gpus(_sia().decide(_snap([young], restart_cost=0.0), seed=0), "s") == 16


def test_a_running_job_restarted_too_often_is_not_moved_at_all():
    job = _job("r", 4, nodes=("n1",), submit=-100.0, restarts=4)     # factor 0
    plan = _sia().decide(_snap([job]), seed=0)
    assert _gpus(plan, "r") == 4


def test_p_norm_fairness_starts_a_waiting_job_that_throughput_alone_leaves_waiting():
    """A linear job on all 16 GPUs and a pending job that does not scale: for total normalised
    goodput (p = 1, no lambda_n) 16 GPUs on the linear job beat 12 + 1; with p = -0.5 and
    lambda_n (Sia's defaults) the waiting job starts."""
    running = _job("run", 16, nodes=("n1", "n2", "n3", "n4"))
    waiting = _job("wait", 1, state="PENDING", points=FLAT, submit=0.0)
    snap = _snap([running, waiting])
    fair = _sia().decide(snap, seed=0)
    assert _gpus(fair, "wait") >= 1 and _gpus(fair, "run") < 16
    greedy = _sia(p=1.0, lambda_n=0.0).decide(snap, seed=0)
    assert _gpus(greedy, "wait") == 0 and _gpus(greedy, "run") == 16
    assert "waits" in greedy.target("wait").reason


def test_lambda_n_must_outweigh_a_jobs_fewest_gpus_for_it_to_start():
    waiting = _job("w", 1, state="PENDING", submit=0.0)
    assert _gpus(_sia().decide(_snap([waiting]), seed=0), "w") >= 1
    assert _gpus(_sia(lambda_n=1.0).decide(_snap([waiting]), seed=0), "w") > 1   # 1 GPU: 0
    assert _gpus(_sia(lambda_n=0.0).decide(_snap([waiting]), seed=0), "w") == 0


def test_explore_caps_a_job_at_twice_what_it_was_measured_on():
    job = _job("e", 4, nodes=("n1",))                      # measured on 2 and 4 GPUs
    assert _gpus(Sia().decide(_snap([job]), seed=0), "e") == 8
    assert _gpus(Sia(explore=False).decide(_snap([job]), seed=0), "e") == 16
    new = _job("new", 4, state="PENDING", points=(), submit=0.0)   # no model: its fewest
    plan = Sia().decide(_snap([new]), seed=0)
    assert _gpus(plan, "new") == 1 and plan.target("new").predicted_goodput is None


def test_configs_all_may_use_counts_sia_leaves_out():
    """A linear job of at most 3 GPUs: Sia's set on 4-GPU nodes has 1, 2 and 4, so 2."""
    job = _job("three", 1, nodes=("n1",), max_nodes=3)
    snap = _snap([job])
    assert _sia()._counts(job, model_for(job), snap) == [1, 2]
    assert _sia(configs="all")._counts(job, model_for(job), snap) == [1, 2, 3]
    assert _gpus(_sia().decide(snap, seed=0), "three") == 2
    assert _gpus(_sia(configs="all").decide(snap, seed=0), "three") == 3


def test_busy_jobs_are_held_and_their_gpus_not_planned():
    busy = _job("busy", 12, nodes=("n1", "n2", "n3"), busy=True)
    other = _job("o", 4, nodes=("n4",))
    plan = _sia().decide(_snap([busy, other]), seed=0)
    assert plan.target("busy") is None and _gpus(plan, "o") <= 4


def test_targets_carry_the_batch_size_goodput_and_weight_of_the_normalisation():
    jobs = [_job("a", 4, nodes=("n1",)), _job("s", 4, nodes=("n2",), points=SATURATING)]
    snap = _snap(jobs)
    plan = _sia().decide(snap, seed=0)
    for j in jobs:
        t = plan.target(j.job_id)
        m = model_for(j)
        x, cfg = best_at(j, m, t.gpus, t.nodes)
        assert t.predicted_goodput == pytest.approx(x) and t.batch_size == cfg.global_batch_size
        assert t.nodes == -(-t.gpus // 4)
        assert t.weight == pytest.approx(1 / best_at(j, m, 1, 1)[0])    # fewest: 1 GPU
    assert plan.objective == pytest.approx(sum(1.1 - round(
        (best_at(j, model_for(j), plan.target(j.job_id).gpus)[0] * plan.target(j.job_id).weight)
        ** -0.5, 2) for j in jobs))


def test_plans_are_deterministic():
    jobs = [_job("a", 4, nodes=("n1",)), _job("b", 0, state="PENDING", submit=0.0),
            _job("c", 2, nodes=("n2",), points=FLAT), _job("d", 8, nodes=("n3", "n4"),
                                                           points=SATURATING)]
    one = Sia().decide(_snap(jobs), seed=1)
    assert one == Sia().decide(_snap(jobs), seed=2)
    assert one == Sia().decide(_snap(list(reversed(jobs))), seed=1)   # order of the snapshot
    pol = Sia()
    assert pol.decide(_snap(jobs), seed=1) == pol.decide(_snap(jobs), seed=1)


def test_an_empty_cluster_or_no_job_gives_an_empty_plan():
    assert _sia().decide(_snap([]), seed=0).targets == ()
    job = _job("a", 4, nodes=("n1",))
    down = replace(_snap([job]), nodes=(NodeView("n1", 4, 0, "down"),))
    assert _sia().decide(down, seed=0).targets == ()


@pytest.mark.parametrize("params", [{"p": 0.0}, {"lambda_n": -1}, {"configs": "some"},
                                    {"restart_penalty": -1.0}, {"decimals": -1},
                                    {"mip_rel_gap": 1.0}, {"time_limit": 0.0}, {"p": "low"},
                                    {"bogus": 1}])
def test_bad_parameters_are_policy_errors(params):
    with pytest.raises(PolicyError):
        make_policy("sia", params)


def test_registered_by_name_with_its_defaults():
    pol = make_policy("sia")
    assert isinstance(pol, Sia) and pol.params.p == -0.5 and pol.params.lambda_n == 1.1
    assert dict(pol.reconcile_gate) == {"min_gain": 0.0, "hold": 0.0}
