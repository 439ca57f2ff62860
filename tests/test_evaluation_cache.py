"""benchmarks/_run_cache.py: finished simulations kept by run and code version, and
benchmarks/evaluation.py's use of them (a stopped run goes on where it stopped)."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
_spec = importlib.util.spec_from_file_location("evaluation_script_cache", _DIR / "evaluation.py")
ev = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ev      # execute_all's worker processes find _execute by this name
_spec.loader.exec_module(ev)
rc = sys.modules["_run_cache"]


def _run(workload="pollux:1@0.5", policy="static"):
    return ev.make_run(workload, policy, granularity="gpu")


def test_a_kept_result_comes_back_for_the_same_run_and_code_only(tmp_path):
    cache = rc.RunCache("v1", tmp_path)
    run = _run()
    assert cache.get(run) is None
    cache.put(run, ("result", {"avg_jct": 12.5}))
    assert cache.get(run) == ("result", {"avg_jct": 12.5})
    assert rc.RunCache("v1", tmp_path).get(run) == ("result", {"avg_jct": 12.5})   # on disk
    assert cache.get(_run(policy="jct")) is None                                   # other run
    assert cache.get(dataclasses.replace(run, seed=1)) is None                     # other seed
    assert rc.RunCache("v2", tmp_path).get(run) is None                            # other code


def test_an_unreadable_entry_counts_as_missing(tmp_path):
    cache = rc.RunCache("v1", tmp_path)
    run = _run()
    cache.put(run, ("result", {}))
    path = next((tmp_path / "v1").glob("*.pkl"))
    path.write_bytes(path.read_bytes()[:10])        # a run killed while writing
    assert cache.get(run) is None
    path.write_bytes(b"not a pickle at all")
    assert cache.get(run) is None


def test_without_a_code_version_nothing_is_kept(tmp_path):
    cache = rc.RunCache(None, tmp_path)
    cache.put(_run(), ("result", {}))
    assert cache.get(_run()) is None
    assert not any(tmp_path.iterdir())


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True)


def test_code_version_follows_every_change_under_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "hpcsched"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("readme\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "one")
    monkeypatch.setattr(rc, "ROOT", tmp_path)
    v1 = rc.code_version()
    assert v1 and rc.code_version() == v1
    (tmp_path / "README.md").write_text("other\n")           # outside the package: same code
    assert rc.code_version() == v1
    (pkg / "a.py").write_text("x = 2\n")                     # uncommitted edit
    v2 = rc.code_version()
    assert v2 != v1
    (pkg / "b.py").write_text("y = 1\n")                     # untracked file
    v3 = rc.code_version()
    assert v3 not in (v1, v2)
    (pkg / "b.py").write_text("y = 2\n")                     # its content counts
    assert rc.code_version() not in (v1, v2, v3)
    (pkg / "b.py").unlink()
    (pkg / "a.py").write_text("x = 1\n")
    assert rc.code_version() == v1


def test_code_version_is_none_outside_a_git_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(rc, "ROOT", tmp_path)
    assert rc.code_version() is None


@pytest.fixture(scope="module")
def tiny_run():
    """A real simulation small enough for a test: workload 1 at a twentieth of its work."""
    return dataclasses.replace(_run(), scale=0.05)


def test_execute_all_keeps_each_run_and_takes_it_back_next_time(tmp_path, tiny_run):
    cache = rc.RunCache("v1", tmp_path)
    runs = {("grid", "static", "gpu", "0.5", 1): tiny_run}
    first = ev.execute_all(runs, 1, cache)
    res, summary = first[("grid", "static", "gpu", "0.5", 1)]
    assert "cached" not in summary and summary["avg_jct"] > 0
    again = ev.execute_all(runs, 1, cache)
    assert ev._ran(again, 6.0).startswith("1 simulations: 0 run now in 0.1 min, 1 taken from the cache")
    assert ev._ran(first, 6.0) == "1 simulations in 0.1 min"
    res2, summary2 = again[("grid", "static", "gpu", "0.5", 1)]
    assert {**summary2} == {**summary, "cached": True}
    assert [j.jct for j in res2.jobs] == [j.jct for j in res.jobs]
