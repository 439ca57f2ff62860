"""The ``jct`` policy: the sum of completion rates, on hand-checked cases."""

from __future__ import annotations

import time

import pytest

from hpcsched.model.snapshot import ClusterSnapshot, JobView, NodeView, ProfilePoint
from hpcsched.perf.model import best_at, model_for
from hpcsched.policies import make_policy
from hpcsched.policies.jct import decide
from hpcsched.policies.reconcile import Costs, reconcile
from hpcsched.protocol.limits import JobLimits


def _pt(world, local, step_time, nodes=None):
    return ProfilePoint(world, nodes or max(1, world // 4), local, 1, step_time,
                        world * local / step_time, samples=50)


# perfectly scaling: 0.002 s per sample of the local batch -> 500 samples/s per GPU
LINEAR = (_pt(4, 64, 0.128), _pt(8, 32, 0.064, nodes=2))
# a job whose step time does not fall with more GPUs: 256 samples / 0.1 s at any size
FLAT = (_pt(4, 64, 0.1), _pt(8, 32, 0.1, nodes=2))


def _job(job_id, gpus=4, *, state="RUNNING", profile=LINEAR, remaining=1e5, submit=0.0,
         min_nodes=1, max_nodes=4, wpn=4, busy=False, held=False, resized_at=None, batch=256,
         bmin=None, min_gpus=1):
    """A job that may run on ``min_gpus`` GPUs and up (``--hpcsched-min-gpus``; whole nodes at
    node granularity)."""
    return JobView(job_id=job_id, state=state, nodes=max(1, gpus // wpn), node_names=(),
                   limits=JobLimits(wpn, min_nodes, max_nodes, bmin or batch, batch, None, batch,
                                    "linear", min_gpus),
                   batch_size=batch, submit_time=submit, profile=tuple(profile),
                   remaining_samples=remaining, busy=busy, held=held, resized_at=resized_at)


def _snap(jobs, nodes=2, gpus=4, now=0.0, granularity="node"):
    return ClusterSnapshot(time=now, nodes=tuple(NodeView(f"n{i}", gpus, 0, "mixed")
                                                 for i in range(1, nodes + 1)),
                           jobs=tuple(jobs), granularity=granularity)


def _sizes(plan):
    return {t.job_id: (t.nodes, t.gpus) for t in plan.targets}


def test_linear_speedup_gives_the_gpus_to_the_shortest_job_srpt():
    """12 GPUs, two perfectly scaling jobs at 1 node each, changes free: the node beyond the
    minimums goes to the one with less work left (SRPT), not to the longer one. With the 30 s
    restart it goes to the longer one: 25 s of work + 30 s is longer than the short job's 50 s
    as it is, while the long one's 500 s become 280."""
    short, long_ = _job("S", remaining=1e5), _job("L", remaining=1e6)
    snap = _snap([short, long_], nodes=3)
    assert _sizes(decide(snap, restart_cost=0.0)) == {"S": (2, None), "L": (1, None)}
    assert _sizes(decide(snap)) == {"S": (1, None), "L": (2, None)}


def test_the_sum_of_completion_rates_is_the_objective_without_rank_weights():
    a, b = _job("A", remaining=2e5), _job("B", remaining=4e5)
    plan = decide(_snap([a, b], nodes=2), hesrpt=None)      # each keeps its 4 GPUs: 2000 samples/s
    assert plan.objective == pytest.approx(2000 / 2e5 + 2000 / 4e5)
    t = plan.target("A")
    assert t.weight == pytest.approx(1 / 2e5) and t.predicted_goodput == pytest.approx(2000)
    assert "100 s of work left" in t.reason


@pytest.mark.parametrize("p", [0.3, 0.5, 0.7])
def test_hesrpt_rank_weights_make_the_objective(p):
    """Two jobs at their smallest size (1 node, 4 GPUs): each term is heSRPT's weight times a
    speedup of 1. m = 2: the larger gets theta_1 = (1/2)^(1/(1-p)), the smaller 1 - theta_1;
    weights theta^(1-p)."""
    a, b = _job("A", remaining=2e5), _job("B", remaining=4e5)
    plan = decide(_snap([a, b], nodes=2), hesrpt=p)
    theta_big = 0.5 ** (1 / (1 - p))
    w_small, w_big = (1 - theta_big) ** (1 - p), theta_big ** (1 - p)
    assert w_small > w_big
    assert plan.objective == pytest.approx(w_small + w_big)
    t_min = 2e5 / 2000                                      # A's 100 s at 4 GPUs
    assert plan.target("A").weight == pytest.approx(w_small * t_min / 2e5)


def test_hesrpt_gives_the_shorter_job_the_larger_share_not_all():
    """16 GPUs for two jobs with sublinear speedup (0.05 s per step plus 0.002 s per sample of
    the local batch), changes free: heSRPT (p = 0.5) gives the shorter one more GPUs, but the
    longer one more than its minimum (SRPT would give the shorter one all it can use)."""
    sub = (_pt(4, 64, 0.178), _pt(8, 32, 0.114, nodes=2))
    a = _job("A", 4, remaining=1e5, max_nodes=4, profile=sub, bmin=16)
    b = _job("B", 4, remaining=1e6, max_nodes=4, profile=sub, bmin=16)
    plan = decide(_snap([a, b], nodes=4, granularity="gpu"), restart_cost=0.0, shrink_cost=0.0)
    ga, gb = plan.target("A").gpus, plan.target("B").gpus
    assert ga > gb > 1 and ga + gb <= 16, (ga, gb)


@pytest.mark.parametrize("bad", [{"hesrpt": 0.0}, {"hesrpt": 1.0}, {"tempering": 1.5},
                                 {"speedup_at": "max"}])
def test_bad_weighting_parameters_are_refused(bad):
    from hpcsched.policies import PolicyError
    with pytest.raises(PolicyError, match="hesrpt must be"):
        make_policy("jct", bad).decide(_snap([_job("A")]))


# scales sub-linearly: 2,560 samples/s on 4 GPUs, 4,267 on 8 (1.67 x)
SUBLINEAR = (_pt(4, 64, 0.1), _pt(8, 32, 0.06, nodes=2))


def test_speedups_over_the_fair_share_do_not_let_a_long_linear_job_take_the_cluster():
    """12 GPUs, changes free: a long perfectly scaling job L (10x the work) and a shorter one
    P that scales sub-linearly. Speedups over 1 GPU value L's 8 GPUs at 8 x its 1-GPU rate,
    P's at 5.7 x: L gets 8 although it is 10 x longer. Over the fair share (6 GPUs: its 4-GPU
    rate), L's 8 are worth 2 and P's 1.67: the shorter job's higher rank weight decides, and P
    gets 8 (heSRPT: the shorter job the larger share)."""
    big, small = _job("L", remaining=1e7), _job("P", profile=SUBLINEAR, remaining=1e6)
    snap = _snap([big, small], nodes=3, granularity="gpu")
    free = dict(restart_cost=0.0, shrink_cost=0.0)
    assert _sizes(decide(snap, speedup_at="min", **free)) == {"L": (2, 8), "P": (1, 4)}
    assert _sizes(decide(snap, **free)) == {"L": (1, 4), "P": (2, 8)}   # the default


def test_a_job_that_does_not_scale_gives_its_gpus_away():
    flat, lin = _job("F", 8, profile=FLAT, remaining=1e5), _job("L", 4, remaining=1e6)
    plan = decide(_snap([flat, lin], nodes=3))
    assert _sizes(plan)["F"] == (1, None) and _sizes(plan)["L"] == (2, None)


def test_a_pending_job_starts_smaller_than_it_asked_when_that_is_what_fits():
    run = _job("R", 4, min_nodes=1, max_nodes=1, remaining=1e7)
    pend = _job("P", 8, state="PENDING", remaining=1e5, submit=10.0)
    plan = decide(_snap([run, pend], nodes=2, now=20.0))
    assert plan.target("P").nodes == 1, plan.target("P").reason


def test_a_pending_job_waits_when_the_running_jobs_finish_sooner_with_the_gpus():
    run = _job("R", 4, min_nodes=1, max_nodes=1, remaining=1e4)
    pend = _job("P", 4, state="PENDING", remaining=1e9, submit=10.0, min_nodes=1, max_nodes=1)
    plan = decide(_snap([run, pend], nodes=1, now=20.0))
    assert plan.target("P").nodes == 0 and "waits" in plan.target("P").reason


def test_a_pending_job_that_has_reported_nothing_is_not_taken_for_finished():
    """A pending job that has never run has reported no work: it counts as ``unknown_remaining``
    (3,600 s) at the size it asks for (1 node: 2,000 samples/s), so 1,800 s at the 2 nodes it
    gets; its unknown work once counted as none ("0 s of work left")."""
    unknown = _job("U", 4, state="PENDING", remaining=None, submit=10.0, max_nodes=2)
    (t,) = decide(_snap([unknown], nodes=2, now=20.0)).targets
    assert t.nodes == 2 and "1800 s of work left" in t.reason, t


def test_age_weight_and_the_overdue_bound_admit_a_job_that_waited():
    """One node, a running job that cannot shrink below it: a pending job is valued at 0 and
    waits -- until it is overdue, when it is admitted ahead of the search (the running job's
    minimum then does not fit beside it, so the plan says it waits for GPUs to free)."""
    run = _job("R", 4, min_nodes=1, max_nodes=1, remaining=1e4)
    pend = _job("P", 4, state="PENDING", remaining=1e9, submit=0.0, min_nodes=1, max_nodes=1)
    fresh = decide(_snap([run, pend], nodes=2, now=60.0), max_wait=3600.0)
    late = decide(_snap([run, pend], nodes=2, now=7200.0), max_wait=3600.0, aging=3600.0)
    assert fresh.target("P").nodes == 1                      # 2 nodes: room for both
    assert "age weight 3.00" in late.target("P").reason      # 1 + 7200 / 3600
    crowded = decide(_snap([run, pend], nodes=1, now=7200.0), max_wait=3600.0)
    assert crowded.target("P").nodes == 0
    assert any("overdue" in n for n in crowded.notes)


def test_overdue_jobs_are_admitted_ahead_of_more_valuable_ones():
    a = _job("A", 4, min_nodes=1, max_nodes=1, remaining=1e9, state="PENDING", submit=0.0)
    b = _job("B", 4, min_nodes=1, max_nodes=1, remaining=1e6, state="PENDING", submit=7000.0)
    on_time = decide(_snap([a, b], nodes=1, now=7100.0), max_wait=1e9, aging=1e9)
    overdue = decide(_snap([a, b], nodes=1, now=7100.0), max_wait=3600.0, aging=1e9)
    assert (on_time.target("A").nodes, on_time.target("B").nodes) == (0, 1)
    assert (overdue.target("A").nodes, overdue.target("B").nodes) == (1, 0)


@pytest.mark.parametrize(("remaining", "grows"), [
    (1e3, False),     # 2 s of work left at 4 GPUs: a 30 s restart never pays
    (1e7, True),      # hours left: doubling the GPUs pays the restart many times over
])
def test_a_grow_is_chosen_only_when_it_finishes_the_job_sooner_after_its_restart(remaining, grows):
    plan = decide(_snap([_job("A", 4, remaining=remaining)], nodes=2))
    assert (plan.target("A").nodes == 2) == grows


def test_gpu_granular_targets_speak_gpus_and_pack():
    a = _job("A", 4, remaining=1e5, bmin=224)       # 224 = 7 GPUs x 32
    b = _job("B", 4, remaining=1e6, profile=FLAT)
    plan = decide(_snap([a, b], nodes=2, granularity="gpu"), restart_cost=0.0, shrink_cost=0.0)
    ta, tb = plan.target("A"), plan.target("B")
    assert (ta.gpus, tb.gpus) == (7, 1)                 # FLAT gains nothing from GPUs
    assert (ta.nodes, tb.nodes) == (2, 1)               # 7 GPUs packed: 4 + 3


@pytest.mark.parametrize("fewest", [None, 2, 1])
def test_gpu_granular_plans_keep_the_users_fewest_gpus(fewest):
    """At GPU granularity a plan never gives a job fewer GPUs than its limits allow: its
    ``--hpcsched-min-gpus`` (``JobLimits.min_gpu_count``), else its minimum nodes' GPUs. B
    gains nothing from GPUs (FLAT): the plan would leave it 1 GPU if it could."""
    a = _job("A", 4, remaining=1e5, bmin=224)
    b = _job("B", 4, remaining=1e6, profile=FLAT, min_gpus=fewest)
    plan = decide(_snap([a, b], nodes=2, granularity="gpu"), restart_cost=0.0, shrink_cost=0.0)
    assert plan.target("B").gpus == (fewest or 4)   # the limit holds it, not the policy


def test_unmeasured_and_busy_jobs_keep_their_size():
    new = _job("N", 4, profile=(), remaining=None)
    busy = _job("B", 4, busy=True)
    plan = decide(_snap([new, busy], nodes=3))
    assert plan.target("N").nodes == 1 and "not measured" in plan.target("N").reason
    assert plan.target("B") is None


def test_reconcile_judges_the_plan_by_its_weights():
    """The grow the plan makes is made by reconcile: gains weighed by 1 / remaining work."""
    snap = _snap([_job("A", 4, remaining=1e7)], nodes=2)
    plan = make_policy("jct").decide(snap)
    changes, notes = reconcile(plan, snap, Costs(hold=0))
    assert [(c.job_id, c.kind, c.to_nodes) for c in changes] == [("A", "grow", 2)], notes


def test_decision_on_64_gpus_and_160_jobs_is_quick():
    jobs = [_job(str(i), 4 if i < 16 else 4, state="RUNNING" if i < 16 else "PENDING",
                 remaining=1e4 * (1 + i), submit=float(i)) for i in range(160)]
    snap = _snap(jobs, nodes=16, now=200.0, granularity="gpu")
    for j in jobs:
        best_at(j, model_for(j), 4)
    t0 = time.perf_counter()
    plan = decide(snap)
    assert time.perf_counter() - t0 < 5.0       # a guard; benchmarks/policy_decision.py measures
    assert sum(t.gpus for t in plan.targets) <= 64


def test_thinned_counts_keep_the_whole_node_counts_around_them():
    """At GPU granularity a job's counts are thinned above ``max_options``; the whole-node
    counts next to each kept one stay (a packed job's goodput peaks where it fills its nodes:
    4 -> 5 GPUs puts one behind the network)."""
    from hpcsched.policies.jct import _counts, _thinned

    job = _job("A", 4, max_nodes=16)
    snap = _snap([job], nodes=16, granularity="gpu")
    counts = _counts(job, snap, 12)
    thinned = {i + 1 for i in _thinned(64, 12)}                 # counts 1..64: index + 1
    assert thinned <= set(counts) and 4 in counts
    for c in thinned:
        assert c // 4 * 4 in counts or c < 4
        assert -(-c // 4) * 4 in counts
    assert {8, 12, 16} <= set(counts) and len(counts) < 64     # still thinned
    assert _counts(job, snap, 64) == list(range(1, 65))


@pytest.mark.parametrize(("last", "ok"), [
    ("grow", lambda g, now: g >= now),      # just grown: planned at its size or more
    ("shrink", lambda g, now: g <= now),    # just shrunk: at its size or less
])
def test_a_job_inside_the_no_thrash_hold_is_planned_the_way_the_hold_lets_it_go(last, ok):
    """The plan does not undo a resize reconcile would hold back, so no GPU is planned onto
    that never frees. FLAT gains nothing from GPUs (plan: shrink it), LINEAR everything
    (plan: grow it); inside the hold the plan keeps each one's direction, outside it not."""
    from dataclasses import replace as _replace

    flat = _replace(_job("F", 8, profile=FLAT, remaining=1e5), resized_at=-60.0,
                    last_resize=last)
    lin = _replace(_job("L", 4, remaining=1e6), resized_at=-60.0, last_resize=last)
    free = _snap([flat, lin], nodes=3, granularity="gpu")
    held = _replace(free, hold=180.0)
    for job, g in ((flat, 8), (lin, 4)):
        assert ok(decide(held).target(job.job_id).gpus, g), (last, job.job_id)
    moved = {t.job_id: t.gpus for t in decide(free).targets}
    assert moved["F"] < 8 and moved["L"] > 4           # without the hold both move
    assert sum(t.gpus for t in decide(held).targets) <= 12


def _noisy(phi):
    from dataclasses import replace as _replace

    job = _job("A", 4, profile=SUBLINEAR, remaining=1e6, batch=256, bmin=64)
    return _replace(job, limits=_replace(job.limits, max_batch_size=4096, base_batch_size=64),
                    grad_noise=(1.0, phi))


def test_the_plan_predicts_efficiency_with_the_grown_noise_scale():
    """``noise_growth`` g plans as if the job's noise scale were g x what it measured: the same
    plan as on :func:`planning_view`'s snapshot, and a larger batch the larger g is."""
    from hpcsched.policies.jct import planning_view

    snap = _snap([_noisy(2.0), _job("B", 4, remaining=1e5)], nodes=4, granularity="gpu")
    view = planning_view(snap, 4.0)
    assert view.job("A").grad_noise == (1.0, 8.0) and view.job("B").grad_noise is None
    assert planning_view(snap, 1.0) is snap
    assert _sizes(decide(snap, noise_growth=4.0)) == _sizes(decide(view, noise_growth=1.0))
    batches = [decide(snap, noise_growth=g).target("A").batch_size for g in (1.0, 2.0, 4.0)]
    assert batches == sorted(batches) and batches[0] < batches[-1], batches
    with pytest.raises(Exception, match="noise_growth >= 1"):
        make_policy("jct", {"noise_growth": 0.5})


def test_reconcile_judges_a_jct_plan_on_the_view_it_was_made_on(monkeypatch):
    """decide_round hands reconcile the policy's ``judged_view``: the goodputs it weighs a
    change with are the ones the plan was made with (one objective)."""
    import hpcsched.policies.round as round_
    from hpcsched.policies.round import decide_round

    seen = []
    real = round_.reconcile
    monkeypatch.setattr(round_, "reconcile",
                        lambda plan, snap, costs: seen.append(snap) or real(plan, snap, costs))
    snap = _snap([_noisy(2.0)], nodes=4, granularity="gpu")
    decide_round(snap, make_policy("jct", {"noise_growth": 3.0}), Costs(), seed=0)
    decide_round(snap, make_policy("jct", {}), Costs(), seed=0)
    assert [s.job("A").grad_noise for s in seen] == [(1.0, 6.0), (1.0, 4.0)]


def test_the_policy_plans_on_its_view_built_once_per_snapshot(monkeypatch):
    """The bound policy plans on :func:`planning_view` (the plan of the module's ``decide``
    with the same ``noise_growth``) and builds it once for the plan and reconcile of a round;
    a new snapshot gets its own view."""
    from dataclasses import replace

    import hpcsched.policies.jct as jct_mod

    snap = _snap([_noisy(2.0), _job("B", 4, remaining=1e5)], nodes=4, granularity="gpu")
    policy = make_policy("jct", {"noise_growth": 3.0})
    want = decide(snap, noise_growth=3.0)
    built = []
    real = jct_mod.planning_view
    monkeypatch.setattr(jct_mod, "planning_view",         # views that change the snapshot
                        lambda snap, g: (g != 1 and built.append(g)) or real(snap, g))
    plan = policy.decide(snap)
    assert policy.judged_view(snap) is policy.judged_view(snap)
    assert policy.judged_view(snap).job("A").grad_noise == (1.0, 6.0)
    assert built == [3.0]
    assert plan == want
    other = replace(snap, time=snap.time + 60.0)
    assert policy.judged_view(other).time == other.time and built == [3.0, 3.0]


def test_less_knowledge_what_ifs():
    """``work_noise``: each job's reported work is seen times a log-normal factor fixed per job
    (the same every round, different between jobs); ``work_known=False``: no report is used."""
    from hpcsched.policies.jct import _work_error

    assert _work_error("17", 1.0) == _work_error("17", 1.0) != _work_error("18", 1.0)
    assert _work_error("17", 0.5) == pytest.approx(_work_error("17", 1.0) ** 0.5)
    # a short job and a long one on 4 GPUs: the short one gets them all when the policy knows
    snap = _snap([_job("1", 4, remaining=1e4), _job("2", 4, remaining=1e7)], nodes=2)
    exact = _sizes(decide(snap))
    assert exact["1"][0] >= exact["2"][0], exact          # nodes: the short one first
    blind = decide(snap, work_known=False)
    assert {t.job_id for t in blind.targets} == {"1", "2"}
    assert _sizes(decide(snap, work_noise=0.0)) == exact
    with pytest.raises(ValueError, match="work_noise"):
        make_policy("jct", {"work_noise": -1})
