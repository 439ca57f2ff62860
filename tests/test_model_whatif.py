"""benchmarks/model_whatif.py: its what-ifs change the policy's predictions, and only them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_fitted_and_shared_are_the_committed_models_and_the_others_change_the_run(tmp_path):
    """``fitted`` and ``shared`` are the simulations as committed; every what-if that patches
    the predictions reaches the policy (the ``true-*`` ones once looked the physics up by a
    noise scale ``jct`` no longer plans with, and silently gave ``fitted``'s figures)."""
    from hpcsched.sim import report
    from hpcsched.sim.cli import single_threaded_blas
    from hpcsched.sim.engine import SimConfig, Simulator
    from hpcsched.sim.workload import load_workload

    out = tmp_path / "w.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "model_whatif.py"), "--variants",
                    "fitted,shared,prior,true-step,true-efficiency", "--loads", "0.5",
                    "--workloads", "5", "--jobs", "2", "--out", str(out)], check=True, capture_output=True, timeout=600)
    rows = {r["variant"]: r["mean_avg_jct"] for r in json.loads(out.read_text())["rows"]}
    name, jobs = load_workload("pollux:5@0.5")
    # one BLAS thread, as the benchmark's simulations run (and hpcsched simulate's): the
    # thread pool's threads competing for a busy machine's 2 cores made the fitted model's
    # L-BFGS-B fits (tiny vectors) 10-20 times slower; the figures are the same
    with single_threaded_blas():
        direct = {model: report.summarize(Simulator(
            jobs, "jct", workload_name=name,
            config=SimConfig(granularity="gpu", throughput_model=model)).run())["avg_jct"]
            for model in ("fitted", "shared")}
    assert rows["fitted"] == direct["fitted"]   # nothing patched: the simulations as committed
    assert rows["shared"] == direct["shared"]
    assert rows["shared"] != rows["fitted"]
    assert rows["prior"] != rows["fitted"]      # the prior alone predicts otherwise
    assert rows["true-step"] != rows["fitted"]
    assert rows["true-efficiency"] != rows["fitted"]


def test_unknown_variants_are_refused_with_the_known_ones():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "model_whatif.py"),
                        "--variants", "oracle"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown variant(s) oracle" in r.stderr and "true-both" in r.stderr
