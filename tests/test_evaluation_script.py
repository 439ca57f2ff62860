"""benchmarks/evaluation.py: the published figures it reads, and how it judges issue 9's targets."""

from __future__ import annotations

import pytest

from tests.bench_scripts import load

ev = load("evaluation")

LOADS = ["0.5", "1.0", "1.5", "2.0"]


def test_published_pollux_figures_match_the_issue():
    pub = ev.published(range(1, 9), LOADS)
    assert [round(x) for x in pub["pollux"]] == [1534, 2751, 3685, 5289]
    assert [round(x) for x in pub["pollux_p99"]] == [14292, 40888, 53108, 68711]
    assert round(pub["tiresias"][1]) == 4038


def _means(jct_ratio, p99_ratio, pollux_10=2751.0):
    avg, p99 = {}, {}
    for i, ld in enumerate(LOADS):
        base = pollux_10 if ld == "1.0" else 1000.0 * (i + 1)
        avg[("pollux", "gpu", ld)] = base
        avg[("jct", "gpu", ld)] = base * jct_ratio[i]
        p99[("pollux", "gpu", ld)] = 10 * base
        p99[("jct", "gpu", ld)] = 10 * base * p99_ratio[i]
    return {"avg_jct": avg, "p99_jct": p99}


def _without_pollux(means):
    return {m: {k: v for k, v in d.items() if k[0] != "pollux"} for m, d in means.items()}


def _verdicts(means, policies=("pollux", "jct"), flips=(1, 100), geo=(-0.40, -0.38)):
    pub = {"pollux": [1534.0, 2751.0, 3685.0, 5289.0]}
    out = {("grid", "jct", "gpu", "1.0", 1): (None, {"flip_flops": flips[0], "resizes": flips[1]})}
    checks = ev.check_targets(means, pub, LOADS, list(policies), ["gpu"], out,
                              {"artifact": {"pal": geo[0], "pm-first": geo[1]},
                               "pal": {"pal": -0.05, "pm-first": -0.05}})
    return [ok for _, ok, _ in checks]


def test_the_pal_targets_judge_pal_s_rules_and_show_hpcsched_s_run_beside():
    (name, ok, detail), _ = ev.pal_checks({"artifact": {"pal": -0.431, "pm-first": -0.385},
                                           "pal": {"pal": -0.241, "pm-first": -0.229}})
    assert ok is True and "benchmarks/pal_artifact.py" in name
    assert detail.startswith("-43.1% (-0.1 points)") and "-24.1%" in detail
    assert ev.pal_checks({"pal": {"pal": -0.43}})[0][1] is None     # not rebuilt: not judged


def test_section_3_lines_are_replaced_by_target_name_and_the_rest_kept():
    doc = "# x\n- **PASS** jct p99: a\n- **FAIL** PAL vs packed, old: b\n- **FAIL** PM-First vs packed: c\n"
    new = ev.render.replace_check_lines(doc, [("PAL vs packed, new", True, "d"),
                                              ("PM-First vs packed, new", None, "e")],
                                        ("PAL vs packed", "PM-First vs packed"))
    assert new == ("# x\n- **PASS** jct p99: a\n- **PASS** PAL vs packed, new: d\n"
                   "- **NOT RUN** PM-First vs packed, new: e\n")


@pytest.mark.parametrize("means, kw, want", [
    # pollux anchor, jct <= 0.85 pollux, jct <= 2340 at 1.0, p99, flip-flops, PAL, PM-First
    (_means([0.8] * 4, [1.0] * 4), {}, [True, True, True, True, True, True, True]),
    (_means([0.8, 0.8, 0.9, 0.8], [1.0] * 4), {}, [True, False, True, True, True, True, True]),
    (_means([0.8] * 4, [1.0, 1.01, 1.0, 1.0]), {}, [True, True, True, False, True, True, True]),
    (_means([0.87] * 4, [1.0] * 4, pollux_10=2700.0), {}, [True, False, False, True, True, True, True]),
    (_means([0.8] * 4, [1.0] * 4, pollux_10=3100.0), {}, [False, True, False, True, True, True, True]),
    (_means([0.8] * 4, [1.0] * 4), {"flips": (2, 100)}, [True, True, True, True, False, True, True]),
    (_means([0.8] * 4, [1.0] * 4), {"geo": (-0.20, -0.31)}, [True, True, True, True, True, False, True]),
    (_without_pollux(_means([0.8] * 4, [1.0] * 4)), {"policies": ("jct",)},
     [None, None, True, None, True, True, True]),
])
def test_targets(means, kw, want):
    assert _verdicts(means, **kw) == want


def test_select_policies_leaves_out_composites():
    chosen, _ = ev.select_policies(None)
    assert "ones-pal" not in chosen
    assert chosen[:2] == ["static", "tiresias"]
    chosen, skipped = ev.select_policies("dp,nosuch")
    assert chosen == ["dp"]
    assert any("nosuch" in s for s in skipped)


def test_the_anchor_is_judged_at_gpu_granularity_and_node_only_reported():
    means = _means([0.8] * 4, [1.0] * 4)
    means["avg_jct"][("pollux", "node", "1.0")] = 3300.0          # +20%: reported, not judged
    pub = {"pollux": [1534.0, 2751.0, 3685.0, 5289.0]}
    name, ok, detail = ev._anchor(means["avg_jct"], pub, LOADS, ["gpu", "node"])
    assert ok is True and "(gpu)" in name
    assert "3300 s (+20.0%)" in detail and "not Pollux's setting" in detail
    assert ev._anchor(means["avg_jct"], pub, LOADS, ["node"])[1] is None


def test_pal_modes_change_one_factor_each_and_reach_the_runs():
    runs = ev.plan_runs([], [], [1], [])
    fifo = runs[("pal-fifo", "packed", "node", None, 1)]
    free = runs[("pal-free-moves", "pal", "node", None, 1)]
    base = runs[("pal", "pal", "node", None, 1)]
    assert dict(fifo.params) == {"backfill": False} and dict(base.params) == {}
    assert dict(free.restart_cost) == {"*": 0.0} and dict(base.restart_cost) == {"*": 30.0}
    assert (fifo.interval, fifo.seed, fifo.variability) == (base.interval, base.seed, base.variability)


def test_pal_summary_says_how_far_each_way_is_from_the_published_figure():
    geo = {"pal": {"pal": -0.24, "pm-first": -0.23}, "pal-fifo": {"pal": -0.40, "pm-first": None}}
    titles = {"pal": "PAL's way", "pal-fifo": "strict FIFO"}
    lines = ev.render.pal_summary(geo, titles, ev.PAL_PUBLISHED)
    assert lines[2] == "| PAL's way | -23.0% (17.0) | -24.0% (19.0) |"
    assert lines[3] == "| strict FIFO | - | -40.0% (3.0) |"
    assert lines[4] == "| PAL's paper (published) | -40.0% | -43.0% |"


def test_fifo_reading_is_the_geomean_of_packed_without_backfill_over_with():
    rows = {"pal": [(1, {"packed": 100.0}), (2, {"packed": 200.0})],
            "pal-fifo": [(1, {"packed": 400.0}), (2, {"packed": 200.0})]}
    line = ev._fifo_reading(rows)[0]
    assert "2.0x its JCT with backfill" in line and "1.0x to 4.0x" in line
    assert ev._fifo_reading({"pal": rows["pal"]}) == []
