"""benchmarks/pal_compose.py (issue 32): the grid is the issue's command (``jct`` with and
without ``pal``, variability, GPU granularity) once per seed, and the figures (per-seed ratio of
the mean average JCTs, the seeds' spread, the paired ratios' confidence interval) are computed
as the module says. No simulation runs."""

from __future__ import annotations

import pytest

from tests.bench_scripts import load

pal_compose = load("pal_compose")


def test_the_grid_is_jct_with_and_without_pal_per_workload_and_seed():
    runs = pal_compose.runs([0, 5])
    assert len(runs) == 2 * 8 * 2
    jct, pal = runs[("w3", "jct", "s5", 1.0)], runs[("w3", "jct+pal", "s5", 1.0)]
    for r in (jct, pal):
        assert (r.workload, r.policy, r.variability, r.seed, r.granularity) == \
            ("pollux:3@1.0", "jct", True, 5, "gpu")
    assert (jct.placement, pal.placement) == (None, "pal")
    assert runs[("w3", "jct", "s0", 1.0)].seed == 0


def _summaries(jct: dict, pal: dict, seeds) -> dict:
    """Summaries for every workload: ``jct[s]``/``pal[s]`` give seed ``s``'s average JCT for
    workload 1 (the others are 1,000 s under both), wall 1 s and 1.2 s."""
    out = {}
    for s in seeds:
        for w in range(1, 9):
            out[(f"w{w}", "jct", f"s{s}", 1.0)] = {"avg_jct": jct[s] if w == 1 else 1000.0,
                                                   "wall_seconds": 1.0}
            out[(f"w{w}", "jct+pal", f"s{s}", 1.0)] = {"avg_jct": pal[s] if w == 1 else 1000.0,
                                                       "wall_seconds": 1.2}
    return out


def test_figures_ratio_of_means_per_seed_the_spread_and_the_paired_interval():
    fig = pal_compose.figures(_summaries({0: 2000.0, 1: 1000.0}, {0: 1000.0, 1: 1500.0}, [0, 1]),
                              [0, 1])
    s0, s1 = fig["per_seed"]["s0"], fig["per_seed"]["s1"]
    # seed 0: means (2000 + 7 x 1000) / 8 = 1125 and 1000; seed 1: 1000 and 1062.5
    assert (s0["jct_mean_avg_jct"], s0["pal_mean_avg_jct"]) == (1125.0, 1000.0)
    assert s0["ratio"] == pytest.approx(1000 / 1125)
    assert s1["ratio"] == pytest.approx(1062.5 / 1000)
    assert s0["per_workload"]["w1"] == 0.5 and s1["per_workload"]["w1"] == 1.5
    assert s0["wall_ratio"] == pytest.approx(1.2)
    assert fig["ratio_mean_of_seeds"] == pytest.approx((1000 / 1125 + 1.0625) / 2)
    assert (fig["ratio_seed_min"], fig["ratio_seed_max"]) == (s0["ratio"], s1["ratio"])
    # 16 paired ratios: fourteen 1.0, one 0.5, one 1.5 -> mean 1, an interval around it
    assert fig["pairs"] == 16 and fig["pair_ratio_mean"] == pytest.approx(1.0)
    lo, hi = fig["pair_ratio_ci95"]
    assert lo < 1.0 < hi and hi - 1.0 == pytest.approx(1.0 - lo)
    assert hi - lo < 0.5


def test_no_difference_gives_ratio_one_and_an_empty_interval():
    fig = pal_compose.figures(_summaries({3: 900.0}, {3: 900.0}, [3]), [3])
    assert fig["ratio_mean_of_seeds"] == 1.0
    assert fig["pair_ratio_ci95"] == [1.0, 1.0]
