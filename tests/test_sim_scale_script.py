"""benchmarks/sim_scale.py (issue 36): the Philly sample's arrivals at a load for the cluster,
and a small run of the whole benchmark (few jobs, one node) whose JSON has the figures. No
Slurm."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpcsched.sim.workload import load_workload, sample_philly
from tests.bench_scripts import BENCH, load

sim_scale = load("sim_scale")


def test_arrivals_come_at_pollux_rate_per_gpu_times_the_load():
    jobs = sample_philly(40, seed=3)
    # 40 jobs at 20 an hour per 64 GPUs x 2 (load) x 2 (128 GPUs): over 0.5 h
    fast = sim_scale.arrivals_at_load(jobs, 128, 2.0)
    assert fast[-1].submit_time == pytest.approx(1800.0)
    assert [j.name for j in fast] == [j.name for j in jobs]
    assert all(a.submit_time <= b.submit_time for a, b in zip(fast, fast[1:]))
    assert sim_scale.arrivals_at_load(jobs, 128, 0.0) == jobs, "load 0: the sample's 8 h"
    # the benchmark's own: 2,000 jobs on 1,024 GPUs at load 1.0 arrive over 6.25 h
    assert 2000 / (sim_scale.POLLUX_RATE * 1024 / 64) == 6.25


def test_a_small_run_writes_its_figures(tmp_path):
    out = tmp_path / "sim_scale.json"
    subprocess.run([sys.executable, str(BENCH / "sim_scale.py"), "--jobs", "6", "--nodes", "1",
                    "--gpus-per-node", "4", "--out", str(out)], check=True, timeout=300,
                   capture_output=True)
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "sim_scale" and doc["gpus"] == 4 and doc["jobs"] == 6
    assert doc["command"].startswith("hpcsched simulate -w ") and "-p jct" in doc["command"]
    assert "--granularity gpu" in doc["command"]
    assert 0 < doc["wall_s"] < 300 and doc["cpu_user_s"] > 0 and doc["cpu_system_s"] >= 0
    assert doc["rounds"] > 0 and doc["finished"] == 6
    assert 0 < doc["avg_jct"] <= doc["makespan"]
    assert doc["makespan"] >= doc["arrival_span_s"] > 0
    assert doc["target"].startswith("PASS")
    _, jobs = load_workload(str(tmp_path / "sim_scale-workload.csv"))
    assert len(jobs) == 6, "the workload it replayed is kept beside the figures"
