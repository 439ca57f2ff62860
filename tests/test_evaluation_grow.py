"""benchmarks/evaluation.py --grow-modes (issue 10): the runs it makes and how it rewrites only
its own section of docs/evaluation.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
_spec = importlib.util.spec_from_file_location("evaluation_script_grow", _DIR / "evaluation.py")
ev = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ev)
render = sys.modules["_evaluation_render"]

DOC = "# Evaluation\n\nintro\n\n## 1. One\n\nbody 1\n\n## 4. Four\n\nbody 4\n"


def test_grow_runs_are_the_default_policy_at_gpu_granularity_both_ways():
    runs = ev.grow_runs(range(1, 9), ev.LOADS)
    assert len(runs) == 64
    assert {(r.policy, r.granularity) for r in runs.values()} == {("jct", "gpu")}
    assert {k[1] for k in runs} == {r.grow for r in runs.values()} == {"extension", "requeue"}
    assert all(r.workload == f"pollux:{k[4]}@{k[3]}" and r.grow == k[1] for k, r in runs.items())


@pytest.mark.parametrize(("doc", "expected"), [
    (DOC, DOC + "\n## 5. Grow\n\nnew\n"),                                        # appended
    (DOC + "\n## 5. Grow\n\nold\n", DOC + "\n## 5. Grow\n\nnew\n"),              # replaced at the end
    (DOC.replace("## 4. Four", "## 5. Grow\n\nold\n\n## 4. Four"),               # replaced in the middle
     DOC.replace("## 4. Four", "## 5. Grow\n\nnew\n\n## 4. Four")),
])
def test_replace_section_keeps_the_rest_of_the_document(doc, expected):
    assert render.replace_section(doc, "## 5. Grow", ["## 5. Grow\n", "new"]) == expected


def test_grow_section_tabulates_both_modes_and_the_change():
    loads = ("0.5", "1.0")
    means = {(m, mode, ld): v for m in ("avg_jct", "p99_jct", "restarts_per_job", "resizes")
             for mode, v in (("extension", 900.0), ("requeue", 1000.0)) for ld in loads}
    params = {"extension_startup": 2.25, "extension_stall": 0.09, "restart_cost": {"*": 30.0}}
    text = "\n".join(render.grow_section("## 5. Grow", means, ("extension", "requeue"), loads, [1, 8],
                                         "cmd", 4, 60.0, "2026-11-24", params, "jct"))
    assert "| extension | 900 | 900 |" in text and "| requeue | 1000 | 1000 |" in text
    assert text.count("| extension vs requeue | -10.0% | -10.0% |") == 2      # average and p99
    assert "2.25 s while the new workers" in text and "stalls 0.09 s" in text and "`cmd`" in text
    assert "paying the 30 s restart" in text


@pytest.mark.parametrize(("doc", "section"), [
    (DOC, ""),
    (DOC + "\n## 5. Grow\n\nold\n", "## 5. Grow\n\nold\n"),
    (DOC.replace("## 4. Four", "## 5. Grow\n\nold\n\n## 4. Four"), "## 5. Grow\n\nold\n"),
])
def test_section_of_finds_the_section_a_full_run_carries_over(doc, section):
    assert render.section_of(doc, "## 5. Grow") == section


def test_grow_render_reads_a_saved_run():
    params = {"extension_startup": 2.25, "extension_stall": 0.09, "restart_cost": {"*": 30.0}}
    runs = [{"grow": mode, "load": "1.0", "workload": w, "avg_jct": avg + w, "p99_jct": 10.0 * avg,
             "restarts_per_job": 0.0, "resizes": 5, "params": params}
            for mode, avg in (("extension", 900.0), ("requeue", 1000.0)) for w in (1, 2)]
    saved = {"command": "cmd --grow-modes", "date": "2026-11-24", "wall_seconds": 120.0,
             "workloads": [1, 2], "loads": ["1.0"], "runs": runs}
    section, means = ev.grow_render(saved)
    assert means[("avg_jct", "extension", "1.0")] == 901.5 and means[("avg_jct", "requeue", "1.0")] == 1001.5
    text = "\n".join(section)
    assert text.startswith(ev.GROW_SECTION) and "`cmd --grow-modes`" in text and "4 simulations in 2.0 min" in text


def test_a_full_run_carries_sections_5_and_6_over(tmp_path):
    """Sections 5 and 6 have their own runs (--grow-modes; benchmarks/jct_bound.py): a full
    run rewrites sections 1-4 and keeps them as they were."""
    doc = tmp_path / "evaluation.md"
    five, six = f"{ev.GROW_SECTION}\n\nfive\n", f"{ev.BOUND_SECTION}\n\nsix\n"
    doc.write_text(f"# Evaluation\n\n## 1. Old\n\nold\n\n{five}\n{six}")
    ev._write_doc(doc, ["# Evaluation\n", "## 1. New\n", "new\n"])
    text = doc.read_text()
    assert "## 1. New" in text and "## 1. Old" not in text
    assert render.section_of(text, ev.GROW_SECTION) == five
    assert render.section_of(text, ev.BOUND_SECTION) == six
