"""benchmarks/evaluation.py --timings: section 7 rendered from the timing benchmarks' JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
_spec = importlib.util.spec_from_file_location("evaluation_script_timing", _DIR / "evaluation.py")
ev = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ev)
timing = sys.modules["_evaluation_timing"]

DECISION = {"benchmark": "policy_decision", "time": "2026-11-26T10:00:00+0000", "machine": {"cpus": 2},
            "repeats": 5, "model": "linear",
            "results": {"gpu": {"jct": {"64x160": {"median_s": 0.0123, "cpu_median_s": 0.0121},
                                        "4096x1000": {"median_s": 0.456, "cpu_median_s": 0.45}},
                                "pollux": {"64x160": {"median_s": 0.2, "cpu_median_s": 0.19}}}},
            "targets": ["PASS  jct at 64 GPUs / 160 jobs (gpu): 12.3 ms (CPU 12.1 ms)"]}
WALL = {"benchmark": "sim_walltime", "time": "2026-11-26T10:05:00+0000", "workloads": ["1", "2", "3"],
        "per_policy": {"gpu": {"jct": {"median_s": 4.2, "max_s": 4.9, "cpu_median_s": 4.1}}},
        "targets": ["PASS  jct at gpu granularity: median 4.20 s"]}


def test_section_seven_shows_every_measured_figure_and_the_verdicts(tmp_path):
    (tmp_path / "policy_decision.json").write_text(json.dumps(DECISION))
    (tmp_path / "sim_walltime.json").write_text(json.dumps(WALL))
    text = "\n".join(timing.timing_section(tmp_path))
    assert text.startswith(timing.TIMING_SECTION)
    assert "| `jct` | 12.3 (12.1) | 456.0 (450.0) |" in text
    assert "| `pollux` | 200.0 (190.0) | - |" in text          # a scale it was not measured at
    assert "| `jct` | gpu | 4.20 | 4.90 | 4.10 |" in text
    assert "- PASS  jct at 64 GPUs / 160 jobs (gpu): 12.3 ms (CPU 12.1 ms)" in text
    assert "- PASS  jct at gpu granularity: median 4.20 s" in text
    assert "fastest of" not in text                          # a JSON from before --repeats


def test_the_walltime_table_says_how_many_runs_each_figure_is_the_fastest_of():
    text = "\n".join(timing.walltime_table({**WALL, "repeats": 3}))
    assert "median (max; CPU median) over the workloads, each the fastest of 3 runs" in text


def test_a_missing_or_unreadable_result_is_said_not_guessed(tmp_path):
    (tmp_path / "sim_walltime.json").write_text("{not json")
    text = "\n".join(timing.timing_section(tmp_path))
    assert "`bench-results/policy_decision.json`: not measured yet" in text
    assert "`bench-results/sim_walltime.json`: not measured yet" in text
    assert "ms wall" not in text


def test_timings_rewrites_only_section_seven(tmp_path, monkeypatch):
    docs, results = tmp_path / "docs", tmp_path / "bench-results"
    docs.mkdir()
    results.mkdir()
    (results / "policy_decision.json").write_text(json.dumps(DECISION))
    doc = "# Evaluation\n\nintro\n\n## 6. Six\n\nbody 6\n"
    (docs / "evaluation.md").write_text(doc)
    monkeypatch.setattr(sys, "argv", ["evaluation.py", "--timings", "--docs", str(docs),
                                      "--results", str(results / "evaluation.json")])
    ev.main()
    out = (docs / "evaluation.md").read_text()
    assert out.startswith(doc.rstrip("\n"))
    assert out.count(timing.TIMING_SECTION) == 1 and "| `jct` | 12.3 (12.1)" in out
    ev.main()                                                    # again: replaced, not appended
    assert (docs / "evaluation.md").read_text() == out
