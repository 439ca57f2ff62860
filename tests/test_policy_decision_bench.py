"""benchmarks/policy_decision.py: the synthetic snapshots it times and how it judges the targets."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "policy_decision.py"
_spec = importlib.util.spec_from_file_location("policy_decision_script", _PATH)
pd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pd)


@pytest.mark.parametrize("model", ["linear", "pollux"])
@pytest.mark.parametrize("gpus,jobs", [(64, 160), (1024, 500)])
def test_snapshot_places_running_jobs_and_gives_every_job_its_remaining_work(gpus, jobs, model):
    snap = pd.snapshot(gpus, jobs, model=model, granularity="gpu")
    assert snap.granularity == "gpu" and len(snap.jobs) == jobs
    assert sum(n.gpus for n in snap.nodes) == gpus
    held = Counter()
    for j in snap.jobs:
        assert j.remaining_samples is not None and j.remaining_samples > 0
        if j.state == "RUNNING":
            assert len(set(j.node_names)) == j.nodes and j.profile
            for name in j.node_names:
                held[name] += j.workers_per_node
            rate = next(p.throughput for p in j.profile if p.nodes == j.nodes)
            assert j.remaining_samples / rate >= pd.MIN_REMAINING_S * (1 - 1e-9)
        else:
            assert j.node_names == () and not j.profile
    assert {n.name: n.gpus_allocated for n in snap.nodes if n.gpus_allocated} == dict(held)
    assert all(n.gpus_allocated <= n.gpus for n in snap.nodes)


def test_a_shared_snapshot_gives_each_pollux_job_its_applications_measurements():
    from dataclasses import replace

    from hpcsched.perf.shared import Measured, step_corrections

    shared, fitted = (pd.snapshot(64, 160, model="pollux", throughput_model=m)
                      for m in ("shared", "fitted"))
    assert all(j.step_corrections is None for j in fitted.jobs)
    assert [replace(j, step_corrections=None) for j in shared.jobs] == list(fitted.jobs)
    for j in shared.jobs:
        want = step_corrections(j.app_class, [Measured(p.nodes, p.world_size, p.local_batch_size,
                                                       p.accumulation_steps, p.step_time, p.samples)
                                              for v in fitted.jobs if v.app_class == j.app_class
                                              for p in v.profile])
        assert j.step_corrections == want
        # an application whose jobs have measured something has a table that says so
        assert bool(want.fine) == any(v.profile for v in fitted.jobs if v.app_class == j.app_class)
    assert all(j.step_corrections is None for j in pd.snapshot(64, 160).jobs)   # linear model


def test_snapshot_is_seeded_and_granularity_only_changes_the_field():
    a, b = pd.snapshot(64, 160, granularity="node"), pd.snapshot(64, 160, granularity="gpu")
    assert a.jobs == b.jobs and a.nodes == b.nodes and (a.granularity, b.granularity) == ("node", "gpu")
    assert pd.snapshot(64, 160, seed=1).jobs != a.jobs


def _results(seconds):
    return {"gpu": {"jct": {"64x160": {"median_s": seconds, "cpu_median_s": seconds}}}}


@pytest.mark.parametrize("seconds,verdict", [(0.049, "PASS"), (0.05, "PASS"), (0.051, "FAIL")])
def test_judge_compares_the_cold_median_with_the_target(seconds, verdict):
    lines = pd.judge(_results(seconds), targets=(("jct", 64, 160, "gpu", 0.05, "issue #9"),))
    assert len(lines) == 1 and lines[0].startswith(verdict)


def test_judge_says_when_a_target_was_not_measured():
    targets = (("jct", 64, 160, "node", 0.05, "x"), ("jct", 4096, 1000, "gpu", 1.0, "x"))
    assert [line.split()[0] for line in pd.judge(_results(0.01), targets=targets)] == ["-", "-"]


def test_main_measures_jct_and_reports_a_policy_it_cannot_make(tmp_path, capsys):
    out = tmp_path / "pd.json"
    assert pd.main(["--repeats", "1", "--policies", "jct,no-such-policy", "--scales", "64x160",
                    "--granularity", "gpu", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "no-such-policy" in text and "not measured: PolicyError" in text
    assert any(line.startswith(("PASS", "FAIL")) and "jct at 64 GPUs" in line for line in text.splitlines())
    assert out.exists()
