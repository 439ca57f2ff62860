"""``jct``'s makespan guard (:mod:`hpcsched.policies.jct_tail`): the earliest common finish, its
floors, when the tail begins, and the floors in ``jct``'s plan."""

from __future__ import annotations

import pytest

from hpcsched.policies import PolicyError, make_policy
from hpcsched.policies.jct import decide
from hpcsched.policies.jct_tail import critical_floors, in_tail
from tests.test_jct_policy import _job, _snap


def _linear(job_id, work, counts=(1, 2, 3, 4, 5, 6, 7, 8), rate=1.0):
    """A job whose goodput is ``rate`` samples/s per GPU, with ``work`` samples left."""
    return _job(job_id, gpus=1, remaining=work), (object(), list(counts),
                                                  [(rate * g, object()) for g in counts])


def _floors(specs, k, guard=1.0):
    jobs = [j for j, _ in specs]
    curves = {j.job_id: c for j, c in specs}
    return critical_floors(jobs, curves, lambda j, m: j.remaining_samples, k, guard)


def test_the_floors_end_every_job_at_the_earliest_common_finish():
    """Linear jobs of 100 and 300 samples on 4 GPUs end together at T* = 100 s on 1 + 3 GPUs;
    no horizon below 100 s fits in 4 GPUs (the long job alone would need 4 at 75 s)."""
    assert _floors([_linear("S", 100), _linear("L", 300)], k=4) == {"S": 1, "L": 3}


def test_a_looser_guard_asks_for_fewer_gpus():
    """8 GPUs, 100 and 700 samples: T* = 100 s (1 + 7). Within 1.4 x T* = 140 s the long job
    needs 5 GPUs (700 / 5 = 140), the short one still 1."""
    specs = [_linear("S", 100), _linear("L", 700)]
    assert _floors(specs, k=8) == {"S": 1, "L": 7}
    assert _floors(specs, k=8, guard=1.4) == {"S": 1, "L": 5}


def test_concave_curves_spread_the_gpus_to_end_together():
    """Two equal jobs whose goodput flattens (sqrt): the common finish gives each half."""
    counts = [1, 2, 3, 4, 5, 6, 7, 8]
    def curve(g): return (g ** 0.5, object())
    a = (_job("A", gpus=1, remaining=1000.0), (object(), counts, [curve(g) for g in counts]))
    b = (_job("B", gpus=1, remaining=1000.0), (object(), counts, [curve(g) for g in counts]))
    assert _floors([a, b], k=8) == {"A": 4, "B": 4}


def test_busy_and_unmeasured_jobs_get_no_floor_and_nothing_fits_gives_none():
    busy = (_job("B", gpus=1, remaining=100.0, busy=True), _linear("x", 1)[1])
    unmeasured = (_job("U", gpus=1, remaining=100.0), (None, [1], [(1.0, object())]))
    # the one measured job left ends soonest on all 4 GPUs: T* is its fastest finish
    assert _floors([busy, unmeasured, _linear("S", 100)], k=4) == {"S": 4}
    assert _floors([], k=4) == {}
    assert _floors([_linear("S", 100)], k=0) == {}


def test_the_tail_begins_when_nothing_is_pending_and_nothing_was_submitted_lately():
    running = [_job("A", submit=0.0), _job("B", submit=500.0)]
    assert in_tail(running, now=1000.0, tail_after=0.0)
    assert in_tail(running, now=1000.0, tail_after=500.0)
    assert not in_tail(running, now=1000.0, tail_after=501.0)
    assert not in_tail([*running, _job("P", state="PENDING", submit=0.0)], now=1e6, tail_after=0.0)
    assert in_tail([], now=0.0, tail_after=3600.0)


def test_in_the_tail_the_long_job_is_not_left_behind():
    """Two perfectly scaling jobs on 16 GPUs (500 samples/s per GPU, batch up to 2048), 1e5
    and 1e6 samples left. Without the guard ``jct`` gives the short one 15 GPUs (SRPT); with
    it, both end together: the long one needs 14 GPUs for T* = 1e6 / (14 x 500) = 143 s, and
    the short one 2 (100 s). With a job pending there is no tail: the plan is ``jct``'s."""
    short = _job("S", remaining=1e5, batch=2048, bmin=64)
    long_ = _job("L", remaining=1e6, batch=2048, bmin=64)
    snap = _snap([short, long_], nodes=4, granularity="gpu")
    free = {"restart_cost": 0.0, "shrink_cost": 0.0}
    assert {t.job_id: t.gpus for t in decide(snap, **free).targets} == {"S": 15, "L": 1}
    guarded = decide(snap, **free, makespan_guard=1.0)
    assert {t.job_id: t.gpus for t in guarded.targets} == {"S": 2, "L": 14}
    later = decide(snap, **free, makespan_guard=1.0, tail_after=60.0)   # submitted at 0, now 0
    assert {t.job_id: t.gpus for t in later.targets} == {"S": 15, "L": 1}
    pending = _snap([short, long_, _job("P", state="PENDING", remaining=1e5)], nodes=4,
                    granularity="gpu")
    assert decide(pending, **free, makespan_guard=1.0) == decide(pending, **free)


def test_with_tail_pending_the_backlog_is_a_fixed_set_and_gets_its_floors():
    """``tail_pending``: the tail begins with a job pending. S and L as above and P pending
    with 1e5 samples: the earliest common finish (guard 1) is L on 12 GPUs (1e6 / 6000 = 167 s; on 13,
    S and P would need 2 each, 17 GPUs in all), S and P 2 each: P is admitted at its floor."""
    short = _job("S", remaining=1e5, batch=2048, bmin=64)
    long_ = _job("L", remaining=1e6, batch=2048, bmin=64)
    waiting = _job("P", state="PENDING", remaining=1e5, batch=2048, bmin=64)
    assert in_tail([short, waiting], now=1e6, tail_after=0.0, pending=True)
    assert not in_tail([short, waiting], now=1e6, tail_after=0.0)
    assert not in_tail([short, waiting], now=10.0, tail_after=60.0, pending=True)
    snap = _snap([short, long_, waiting], nodes=4, granularity="gpu")
    free = {"restart_cost": 0.0, "shrink_cost": 0.0}
    plan = decide(snap, **free, makespan_guard=1.0, tail_pending=True)
    assert {t.job_id: t.gpus for t in plan.targets} == {"S": 2, "L": 12, "P": 2}
    # without it a job pending means no tail: P, short, goes first and L waits (jct's SRPT order)
    assert {t.job_id: t.gpus for t in decide(snap, **free, makespan_guard=1.0).targets}["L"] < 12


@pytest.mark.parametrize("bad", [{"makespan_guard": 0.5}, {"tail_after": -1}])
def test_the_guard_parameters_are_checked(bad):
    with pytest.raises(PolicyError):
        make_policy("jct", bad)
