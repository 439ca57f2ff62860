"""benchmarks/squeue_parse.py (issue 36): its documents are recorded jobs repeated, and a short
run writes the figures it prints, for every recorded version; bad arguments are a usage error."""

from __future__ import annotations

import json

import pytest

from tests.bench_scripts import load

squeue_parse = load("squeue_parse")


def test_the_document_is_the_recorded_first_job_repeated_under_new_ids():
    doc = json.loads(squeue_parse.document("24.11", 3))
    ids = [j["job_id"] for j in doc["jobs"]]
    assert len(set(ids)) == 3
    assert all(set(j) == set(doc["jobs"][0]) and len(j) > 100 for j in doc["jobs"])


def test_a_short_run_writes_a_row_per_version_and_size_with_the_slim_decode_smaller(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert squeue_parse.main(["--jobs", "5,50", "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["version"], r["jobs"]) for r in rows] == [
        (v, n) for v in ("22.05", "24.11", "26.05") for n in (5, 50)]
    for r in rows:
        assert 0 < r["slim"]["held_mib"] < r["plain"]["held_mib"] / 2
        assert r["slim"]["peak_mib"] < r["plain"]["peak_mib"]
    assert "26.05" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--jobs", "0"], ["--jobs", "x"], ["--versions", "9.9"],
                                  ["--repeats", "0"]])
def test_bad_arguments_are_a_usage_error(argv, tmp_path):
    with pytest.raises(SystemExit) as exc:
        squeue_parse.main([*argv, "--out", str(tmp_path / "r.json")])
    assert exc.value.code == 2
