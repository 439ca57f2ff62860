"""benchmarks/anchors.py's judgement of issue 35's targets, and its reading of pollux's figures
from an evaluation results file."""

from __future__ import annotations

import json

from tests.bench_scripts import load

anchors = load("anchors")


def _means(jct=(800.0, 900.0, 1000.0), pollux=(1000.0, 1000.0, 1000.0),
           sia=(1100.0, 950.0, 1000.0), wham=(900.0, 1000.0, 1100.0)):
    """One load's (avg JCT, p99 JCT, makespan) per policy; every jct variant the same."""
    fig = dict(zip(anchors.FIGURES, (0, 1, 2)))
    out = {}
    for name, v in (("pollux", pollux), ("sia", sia), ("wham", wham),
                    *((j, jct) for j in anchors.JCT_VARIANTS)):
        out[(name, "1.0")] = {f: v[i] for f, i in fig.items()}
    return out


def _verdicts(means):
    return {name.split(": ", 1)[1]: ok for name, ok, _ in anchors.checks(means, ["1.0"])
            if name.startswith("jct: ")}


def test_each_target_passes_at_its_bound_and_fails_beyond_it():
    ok = _verdicts(_means())
    assert ok == {"avg JCT <= 0.85 x min(pollux, sia)": True, "avg JCT <= wham's": True,
                  "p99 JCT <= every anchor's": True, "makespan <= 1.02 x pollux": True}
    # average over the smaller of pollux and sia: 850 / 1000 passes, 851 fails
    assert _verdicts(_means(jct=(850.0, 900.0, 1000.0)))["avg JCT <= 0.85 x min(pollux, sia)"]
    assert not _verdicts(_means(jct=(851.0, 900.0, 1000.0)))["avg JCT <= 0.85 x min(pollux, sia)"]
    assert not _verdicts(_means(sia=(900.0, 950.0, 1000.0)))["avg JCT <= 0.85 x min(pollux, sia)"]
    # no worse than wham on average; p99 against the best anchor's (sia's 950 here)
    assert not _verdicts(_means(wham=(799.0, 1000.0, 1100.0)))["avg JCT <= wham's"]
    assert not _verdicts(_means(jct=(800.0, 951.0, 1000.0)))["p99 JCT <= every anchor's"]
    # makespan over pollux's
    assert _verdicts(_means(jct=(800.0, 900.0, 1020.0)))["makespan <= 1.02 x pollux"]
    assert not _verdicts(_means(jct=(800.0, 900.0, 1021.0)))["makespan <= 1.02 x pollux"]


def test_pollux_figures_come_from_the_gpu_grid_rows_of_a_complete_load(tmp_path):
    rows = [{"experiment": "grid", "policy": "pollux", "granularity": "gpu", "load": "1.0",
             "trace": w, "avg_jct": 100.0 * w, "p99_jct": 10.0 * w, "makespan": 1000.0 + w}
            for w in anchors.WORKLOADS]
    noise = [{**rows[0], "granularity": "node", "avg_jct": 1e9},
             {**rows[0], "policy": "jct", "avg_jct": 1e9},
             {**rows[0], "variability": True, "avg_jct": 1e9},
             {**rows[0], "load": "2.0"}]                      # 2.0 has one workload only
    path = tmp_path / "evaluation.json"
    path.write_text(json.dumps({"runs": rows + noise}))
    got = anchors.pollux_means(path, ["1.0", "2.0"])
    assert set(got) == {"1.0"}
    assert got["1.0"] == {"avg_jct": 450.0, "p99_jct": 45.0, "makespan": 1004.5}
    assert anchors.pollux_means(tmp_path / "missing.json", ["1.0"]) == {}


def test_the_lower_bound_per_load_comes_from_jct_bound_results(tmp_path):
    path = tmp_path / "jct_bound.json"
    path.write_text(json.dumps({"lower_bound_s": {"0.5": 816.0, "1.0": 914.5}}))
    assert anchors.lower_bounds(path, ["0.5", "1.0", "2.0"]) == {"0.5": 816.0, "1.0": 914.5}
    assert anchors.lower_bounds(tmp_path / "missing.json", ["0.5"]) == {}


def test_the_reading_of_section_11_is_computed_from_the_run():
    """Ratios in the prose come from the means: jct 800 / min(pollux 1000, sia 950) = 0.84,
    its makespan 1,020 / 1,000 = 1.02, the guard's 20% more average JCT, the bound 400 s."""
    means = _means(sia=(950.0, 950.0, 1000.0))
    means[("jct-guard", "1.0")] = {"avg_jct": 960.0, "p99_jct": 900.0, "makespan": 990.0}
    means[("jct", "1.0")]["makespan"] = 1020.0
    text = anchors.reading(["1.0"], means, {"1.0": 400.0})
    assert "average JCT 0.84 x\n  min(`pollux`, `sia`)" in text
    assert "makespan 1.02 x `pollux`'s" in text
    assert "0.99 x\n  `pollux`'s for 20% more average JCT" in text
    assert "the closest of all to the lower bound (2.00 x it)" in text
    far = anchors.reading(["1.0"], {**means, ("wham", "1.0"): {**means[("wham", "1.0")],
                                                               "avg_jct": 700.0}}, {"1.0": 400.0})
    assert "2.00 x the lower bound" in far and "closest" not in far
