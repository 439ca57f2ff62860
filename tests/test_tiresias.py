"""Tiresias discretized 2D-LAS: worked cases and invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcsched.model.snapshot import ClusterSnapshot, JobView, NodeView
from hpcsched.policies import PolicyError
from hpcsched.policies.common import capacity
from hpcsched.policies.tiresias import DEFAULT_QUEUE_THRESHOLDS, Tiresias
from hpcsched.protocol.limits import JobLimits


def _job(job_id, nodes, *, wpn=4, min_nodes=1, max_nodes=4, state="PENDING", attained=0.0,
         submit=0.0, busy=False, batch=64):
    return JobView(job_id=job_id, state=state, nodes=nodes, node_names=(),
                   limits=JobLimits(wpn, min_nodes, max_nodes, batch, batch, None, batch, "linear"),
                   batch_size=batch, submit_time=submit, busy=busy, attained_gpu_seconds=attained)


def _cluster(n_nodes, jobs, *, gpus=4, time=10_000.0, other=()):
    return ClusterSnapshot(time=time, nodes=tuple(NodeView(f"n{i}", gpus, 0, "idle")
                                                  for i in range(1, n_nodes + 1)),
                           jobs=tuple(jobs), other_gpus_allocated=tuple(other))


def test_defaults_two_queues():
    t = Tiresias()
    assert t.name == "tiresias" and t.num_queues == 2
    assert t.queue_thresholds == DEFAULT_QUEUE_THRESHOLDS == (3200.0,)
    assert [t.queue_of(a) for a in (0, 3199.9, 3200, 1e9)] == [0, 0, 1, 1]
    three = Tiresias(queue_thresholds=[1000, 5000])
    assert [three.queue_of(a) for a in (999, 1000, 4999, 5000)] == [0, 1, 1, 2]


def test_a_short_job_in_queue_0_preempts_a_long_one_in_queue_1():
    long_ = _job("L", 1, state="RUNNING", attained=50_000, submit=0)
    short = _job("S", 1, attained=0, submit=500)
    plan = Tiresias().decide(_cluster(1, [long_, short]))
    s, l_ = plan.target("S"), plan.target("L")
    assert s.nodes == 1 and l_.nodes == 0
    assert s.reason == "tiresias: queue 0 (attained 0 GPU-s < 3200): runs on 4 GPU(s)"
    assert l_.reason.startswith("tiresias: preempted by job S (queue 0)")
    assert "queue 1 (attained 50000 GPU-s >= 3200)" in l_.reason
    assert plan.objective == 4.0


def test_fifo_by_submit_time_within_a_queue():
    a = _job("A", 1, submit=20, attained=1200)
    b = _job("B", 1, submit=10)
    c = _job("C", 1, submit=30)
    plan = Tiresias().decide(_cluster(2, [a, b, c]))
    assert plan.target("B").nodes == 1 and plan.target("A").nodes == 1
    assert plan.target("A").reason.startswith("tiresias: queue 0 (attained 1200 GPU-s < 3200)")
    assert plan.target("C").nodes == 0
    assert plan.target("C").reason.startswith("tiresias: waits: needs 4 GPU(s), 0 free")


def test_running_jobs_keep_their_place_in_their_queue():
    """An earlier-submitted waiting job of the same queue does not preempt a running one (the
    authors' simulator); strict FIFO does when asked."""
    run = _job("R", 1, state="RUNNING", submit=100, attained=800)
    wait = _job("W", 1, submit=50, attained=400)
    plan = Tiresias().decide(_cluster(1, [run, wait]))
    assert plan.target("R").nodes == 1 and plan.target("W").nodes == 0
    strict = Tiresias(preempt_within_queue=True).decide(_cluster(1, [run, wait]))
    assert strict.target("W").nodes == 1 and strict.target("R").nodes == 0
    assert "preempted by job W (queue 0)" in strict.target("R").reason


def test_a_job_that_does_not_fit_waits_and_a_smaller_one_behind_it_runs():
    big = _job("BIG", 3, submit=0)                                   # 12 GPUs on an 8-GPU cluster
    mid = _job("MID", 2, submit=1)
    small = _job("SMALL", 1, submit=2)
    run = _job("RUN", 1, state="RUNNING", attained=100, submit=3)
    plan = Tiresias().decide(_cluster(2, [big, mid, small, run]))
    assert plan.target("BIG").nodes == 0
    assert "needs 12 GPU(s), the cluster has 8" in plan.target("BIG").reason
    # capacity 8: RUN (running, queue 0) first -> 4 free; BIG never fits; MID needs 8: waits
    assert plan.target("RUN").nodes == 1
    assert plan.target("MID").nodes == 0 and "needs 8 GPU(s), 4 free" in plan.target("MID").reason
    assert plan.target("SMALL").nodes == 1     # 4 GPUs left after RUN: the small job uses them


def test_nothing_fits_everyone_waits():
    plan = Tiresias().decide(_cluster(1, [_job("A", 2), _job("B", 3, submit=1)]))
    assert [t.nodes for t in plan.targets] == [0, 0]
    assert all(t.reason.startswith("tiresias: waits: needs") for t in plan.targets)
    assert plan.objective == 0.0


def test_requested_size_is_kept_within_limits_and_batch_untouched():
    j = _job("J", 3, min_nodes=1, max_nodes=2, batch=96)             # asks 3, may have 2
    plan = Tiresias().decide(_cluster(4, [j]))
    assert (plan.target("J").nodes, plan.target("J").batch_size) == (2, 96)


def test_promote_knob_lifts_a_starving_job_back_to_queue_0():
    # P: ran 1000 s on 4 GPUs (4000 GPU-s, queue 1), submitted at 0, now 10000: waited 9000 s
    # R: running, queue 1, submitted at 8000, ran 1000 s: waited 1000 s
    p = _job("P", 1, attained=4000, submit=0)
    r = _job("R", 1, state="RUNNING", attained=4000, submit=8000)
    off = Tiresias().decide(_cluster(1, [p, r]))
    assert off.target("R").nodes == 1 and off.target("P").nodes == 0
    on = Tiresias(promote_knob=8).decide(_cluster(1, [p, r]))
    assert on.target("P").nodes == 1 and on.target("R").nodes == 0
    assert "promoted from queue 1 (waited 9000 s >= 8 x 1000 s run)" in on.target("P").reason
    assert "preempted by job P (queue 0)" in on.target("R").reason
    # a knob of 10 is not reached (9000 < 10 x 1000)
    assert Tiresias(promote_knob=10).decide(_cluster(1, [p, r])).target("P").nodes == 0


def test_busy_jobs_keep_their_gpus_and_get_no_target():
    busy = _job("B", 1, state="RUNNING", attained=1e6, busy=True)
    new = _job("N", 1)
    plan = Tiresias().decide(_cluster(1, [busy, new]))
    assert plan.target("B") is None
    assert plan.target("N").nodes == 0
    assert plan.objective == 4.0


def test_capacity_excludes_unusable_nodes_and_unmanaged_jobs():
    snap = ClusterSnapshot(time=0.0, nodes=(NodeView("n1", 4, 0, "idle"),
                                            NodeView("n2", 4, 0, "down"),
                                            NodeView("n3", 4, 2, "mixed")),
                           jobs=(_job("A", 1), _job("B", 1, submit=1)),
                           other_gpus_allocated=(("n3", 2),))
    plan = Tiresias().decide(snap)
    assert [plan.target("A").nodes, plan.target("B").nodes] == [1, 0]


def test_bad_parameters_are_refused():
    for bad in ([3200, 1000], [0], [-5], ["x"], [float("inf")]):
        with pytest.raises(PolicyError):
            Tiresias(queue_thresholds=bad)
    with pytest.raises(PolicyError):
        Tiresias(promote_knob=0)


# ------------------------------------------------------------------------------------ properties

_states = st.sampled_from(["idle", "mixed", "allocated", "down", "drained"])


@st.composite
def _snapshots(draw):
    nodes = tuple(NodeView(f"n{i}", draw(st.sampled_from([2, 4, 8])), 0, draw(_states))
                  for i in range(draw(st.integers(0, 6))))
    other = tuple((n.name, draw(st.integers(0, n.gpus))) for n in nodes if draw(st.booleans()))
    jobs = []
    for i in range(draw(st.integers(0, 9))):
        lo = draw(st.integers(1, 2))
        hi = draw(st.integers(lo, 4))
        jobs.append(_job(f"j{i}", draw(st.integers(0, 5)), wpn=draw(st.sampled_from([1, 2, 4])),
                         min_nodes=lo, max_nodes=hi,
                         state=draw(st.sampled_from(["RUNNING", "PENDING"])),
                         attained=draw(st.floats(0, 20_000)),
                         submit=draw(st.floats(0, 5_000)), busy=draw(st.booleans())))
    return ClusterSnapshot(time=6_000.0, nodes=nodes, jobs=tuple(jobs), other_gpus_allocated=other)


_policies = st.builds(Tiresias,
                      queue_thresholds=st.sampled_from([(3200.0,), (1000.0, 8000.0), (50.0,)]),
                      promote_knob=st.sampled_from([None, 1.0, 8.0]),
                      preempt_within_queue=st.booleans())


@settings(max_examples=150, deadline=None)
@given(snap=_snapshots(), policy=_policies, seed=st.integers(0, 2**31 - 1))
def test_invariants(snap, policy, seed):
    plan = policy.decide(snap, seed)
    k = capacity(snap)
    held = sum(j.gpus for j in snap.jobs if j.busy)
    jobs = {j.job_id: j for j in snap.jobs}
    # one target per job that is not busy, none for busy ones
    assert sorted(t.job_id for t in plan.targets) == sorted(j.job_id for j in snap.jobs
                                                            if not j.busy)
    used = 0
    for t in plan.targets:
        j = jobs[t.job_id]
        assert t.batch_size == j.batch_size
        if t.nodes > 0:
            assert j.min_nodes <= t.nodes <= j.max_nodes
            used += t.nodes * j.workers_per_node
    # never more GPUs than capacity (what busy jobs hold counts)
    assert used <= max(0, k - held)
    assert plan.objective == held + used
    # work-conserving: nothing left waiting would fit in what is left over
    left = max(0, k - held) - used
    for t in plan.targets:
        if t.nodes == 0:
            j = jobs[t.job_id]
            assert min(max(j.nodes, j.min_nodes), j.max_nodes) * j.workers_per_node > left
    # deterministic, whatever the seed and the order of the jobs
    again = policy.decide(ClusterSnapshot(snap.time, snap.nodes, tuple(reversed(snap.jobs)),
                                          snap.other_gpus_allocated), seed + 1)
    assert sorted(again.targets, key=lambda t: t.job_id) == sorted(plan.targets,
                                                                   key=lambda t: t.job_id)


def test_preempted_without_a_culprit_when_capacity_shrank():
    # two running jobs, one node went down: the lower-priority one stops; nobody started
    a = _job("A", 1, state="RUNNING", attained=100, submit=0)
    b = _job("B", 1, state="RUNNING", attained=9000, submit=1)
    snap = ClusterSnapshot(time=0.0, nodes=(NodeView("n1", 4, 8, "allocated"),
                                            NodeView("n2", 4, 0, "down")), jobs=(a, b))
    plan = Tiresias().decide(snap)
    assert plan.target("A").nodes == 1 and plan.target("B").nodes == 0
    assert plan.target("B").reason.startswith("tiresias: preempted: queue 1 (attained 9000 GPU-s")
    assert "needs 4 GPU(s), 0 free" in plan.target("B").reason
