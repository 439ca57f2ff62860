"""tools/build_pollux_priors.py and the data it shipped: the priors are the fit of the shipped
profiles, the profiles those of the original traces, the data small, licensed and sourced."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hpcsched.perf.pollux import PerfParams, fit_perf_params, step_time, throughput
from hpcsched.perf.priors import APPLICATIONS, DATA_DIR, PRIORS_FILE, prior_for

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "pollux"
_SPEC = importlib.util.spec_from_file_location("build_pollux_priors",
                                               ROOT / "tools" / "build_pollux_priors.py")
tool = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(tool)


def test_every_prior_fits_its_shipped_profiles():
    shipped = tool.read_shipped_profiles()
    for app in APPLICATIONS:
        p = prior_for(app)
        samples = tool.samples_from_rows(shipped[app])
        assert len(samples) >= 200
        rep = tool.fit_report(p, samples)
        assert rep["median_abs_rel_error"] < 0.15, (app, rep)
        # sanity: scaling out still helps somewhere (throughput at 16 GPUs > at 1 GPU)
        b = samples[len(samples) // 2].local_bsz
        assert throughput(p, 4, 16, b) > throughput(p, 1, 1, b)


def test_shipped_priors_are_the_fit_of_the_shipped_profiles():
    doc = json.loads(PRIORS_FILE.read_text())
    shipped = tool.read_shipped_profiles()
    for app in ("cifar10", "bert"):
        refit = fit_perf_params(tool.samples_from_rows(shipped[app]))
        stored = PerfParams.from_dict(doc["applications"][app]["params"])
        for n, k, b in [(1, 1, 32), (1, 4, 8), (4, 16, 12), (16, 64, 64)]:
            assert step_time(refit, n, k, b) == pytest.approx(step_time(stored, n, k, b),
                                                              rel=1e-3)


def test_shipped_data_is_small_licensed_and_sourced():
    files = {p.name: p for p in DATA_DIR.iterdir()}
    assert {"LICENSE.apache2", "SOURCE.md", "priors.json", "profiles.csv"} <= set(files)
    assert files["priors.json"].stat().st_size + files["profiles.csv"].stat().st_size < 300_000
    # everything shipped under data/pollux (the simulator's traces and workloads too) stays small
    assert sum(p.stat().st_size for p in DATA_DIR.rglob("*") if p.is_file()) < 3_000_000
    assert "Apache License" in files["LICENSE.apache2"].read_text()
    if (SHARED / "LICENSE.apache2").exists():
        assert files["LICENSE.apache2"].read_bytes() == (SHARED / "LICENSE.apache2").read_bytes()
    src = files["SOURCE.md"].read_text()
    assert "petuum/adaptdl" in src and "c793c7089bd307462686339d29707925c461f9a9" in src


@pytest.mark.skipif(not (SHARED / "traces").exists(), reason="reference traces not present")
def test_shipped_profiles_match_the_original_traces():
    rows = tool.read_pollux_traces(SHARED / "traces", "yolov3")
    shipped = tool.read_shipped_profiles()["yolov3"]
    assert len(rows) == len(shipped)
    for a, b in zip(rows, shipped, strict=True):
        assert (a["num_nodes"], a["num_replicas"], a["local_bsz"]) == (
            int(b["num_nodes"]), int(b["num_replicas"]), int(b["local_bsz"]))
        assert a["step_time"] == pytest.approx(float(b["step_time"]), rel=1e-5)


@pytest.mark.skipif(not (SHARED / "traces").exists(), reason="reference traces not present")
def test_rebuilding_reproduces_the_shipped_priors(tmp_path, monkeypatch):
    monkeypatch.setattr(tool.priors, "clear_cache", lambda: None)   # the shipped file stays
    doc = tool.build_priors(SHARED / "traces", tmp_path)
    shipped = json.loads(PRIORS_FILE.read_text())["applications"]
    for app in APPLICATIONS:
        assert doc["applications"][app]["params"] == pytest.approx(shipped[app]["params"],
                                                                   rel=1e-4)
    assert (tmp_path / "profiles.csv").read_text() == (DATA_DIR / "profiles.csv").read_text()
