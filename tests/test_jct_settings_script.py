"""The judgement of one jct setting against issue 35's targets at one load (anchors.verdict,
which benchmarks/jct_settings.py prints), and the short names of jct_settings' rows."""

from __future__ import annotations

import pytest

from tests.bench_scripts import load

bench = load("jct_settings")

ANCHORS = {"pollux": {"avg_jct": 1000.0, "p99_jct": 1000.0, "makespan": 1000.0},
           "sia": {"avg_jct": 950.0, "p99_jct": 980.0, "makespan": 1000.0},
           "wham": {"avg_jct": 800.0, "p99_jct": 990.0, "makespan": 1100.0}}


def _jct(avg=800.0, p99=980.0, makespan=1020.0):
    return {"avg_jct": avg, "p99_jct": p99, "makespan": makespan}


def test_a_setting_at_every_bound_meets_all_and_one_beyond_any_misses_that_one():
    assert all(bench.verdict(_jct(), ANCHORS).values())
    # 0.85 x min(pollux, sia) = 807.5 is above wham's 800: wham's bounds the average here
    assert bench.verdict(_jct(avg=800.1), ANCHORS) == {
        "avg JCT <= 0.85 x min(pollux, sia)": True, "avg JCT <= wham's": False,
        "p99 JCT <= every anchor's": True, "makespan <= 1.02 x pollux": True}
    # with sia at 900, 0.85 x min(pollux, sia) = 765 bounds it, and 800 misses that one only
    slower_wham = {**ANCHORS, "sia": {**ANCHORS["sia"], "avg_jct": 900.0},
                   "wham": {**ANCHORS["wham"], "avg_jct": 900.0}}
    got = bench.verdict(_jct(), slower_wham)
    assert not got["avg JCT <= 0.85 x min(pollux, sia)"] and got["avg JCT <= wham's"]
    assert not bench.verdict(_jct(p99=980.1), ANCHORS)["p99 JCT <= every anchor's"]   # sia's 980
    assert not bench.verdict(_jct(makespan=1020.1), ANCHORS)["makespan <= 1.02 x pollux"]


@pytest.mark.parametrize("setting, want", [
    ({"hesrpt": 0.4, "makespan_guard": 1.5, "tail_after": 1800.0}, "h0.4-g1.5-1800"),
    ({"tail_after": 1200, "hesrpt": 0.45}, "h0.45-1200"),
    ({"hesrpt": 0.4, "work_noise": 1.0}, "h0.4-work_noise=1.0"),
    ({}, "jct"),
])
def test_a_setting_is_named_by_its_values(setting, want):
    assert bench.label(setting) == want
