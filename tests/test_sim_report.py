"""hpcsched.sim.report: summary figures checked against hand computations, the per-job CSV, the
summary JSON, the plots (valid PNGs) and the terminal table. No Slurm."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import numpy as np
import pytest

from hpcsched.sim import JobResult, SimResult, report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def job(name, submit, start, finish, gpu_seconds=0.0, restarts=0, resizes=0, requested=4,
        max_gpus=8, application="cifar10"):
    return JobResult(name=name, application=application, submit_time=submit, start_time=start,
                     finish_time=finish, gpu_seconds=gpu_seconds, restarts=restarts,
                     resizes=resizes, requested_gpus=requested, max_gpus=max_gpus)


# JCTs 100, 200, 600 s; 1, 2, 3 GPU-hours; restarts 1, 0, 2; resizes 2, 1, 0
THREE = (
    job("a", 0.0, 10.0, 100.0, gpu_seconds=3600.0, restarts=1, resizes=2),
    job("b", 50.0, 60.0, 250.0, gpu_seconds=7200.0, restarts=0, resizes=1, application="bert"),
    job("c", 100.0, 100.0, 700.0, gpu_seconds=10800.0, restarts=2, resizes=0, requested=2),
)
# over [0, 700] with 8 GPUs: 0 busy before t=10, then 4 to 100, 8 to 400, 2 to 700 (the sample at
# 800 is past the last finish): busy 4*90 + 8*300 + 2*300 = 3360, total 8*700 = 5600 -> 0.6
SERIES = ((10.0, 4, 8), (100.0, 8, 8), (400.0, 2, 8), (800.0, 0, 8))


def sim(jobs=THREE, policy="ones-pal", workload="pollux", utilization=SERIES, total_gpus=8,
        params=None):
    return SimResult(policy=policy, workload=workload, jobs=tuple(jobs),
                     utilization=tuple(utilization), total_gpus=total_gpus, rounds=12,
                     wall_seconds=1.5, params=dict(params or {"seed": 1}))


def assert_plain(summary):
    for key, value in summary.items():
        assert value is None or type(value) in (int, float, str, dict), (key, type(value))


# --- summarize ---------------------------------------------------------------------------------


def test_summary_figures_by_hand():
    s = report.summarize(sim())
    assert s["policy"] == "ones-pal" and s["workload"] == "pollux"
    assert (s["jobs"], s["finished"], s["unfinished"]) == (3, 3, 0)
    assert s["avg_jct"] == 300.0
    assert s["median_jct"] == 200.0
    # numpy linear: rank 0.99 * (3 - 1) = 1.98 -> 200 + 0.98 * (600 - 200) = 592
    assert s["p99_jct"] == pytest.approx(592.0, abs=1e-9)
    assert s["p99_jct"] == float(np.percentile([100.0, 200.0, 600.0], 99))
    assert s["makespan"] == 700.0
    assert s["gpu_utilization"] == pytest.approx(0.6, abs=1e-12)
    assert s["gpu_hours_per_job"] == 2.0
    assert s["restarts_per_job"] == 1.0
    assert s["resizes_per_job"] == 1.0
    assert (s["rounds"], s["wall_seconds"], s["params"]) == (12, 1.5, {"seed": 1})
    assert type(s["jobs"]) is int and type(s["rounds"]) is int
    assert type(s["avg_jct"]) is float and type(s["p99_jct"]) is float
    assert_plain(s)
    json.dumps(s)


def test_summary_with_an_unfinished_job():
    jobs = THREE + (job("d", 20.0, None, None, gpu_seconds=0.0, restarts=1, resizes=1),)
    s = report.summarize(sim(jobs))
    assert (s["jobs"], s["finished"], s["unfinished"]) == (4, 3, 1)
    assert s["avg_jct"] == 300.0 and s["median_jct"] == 200.0  # finished jobs only
    assert s["makespan"] == 700.0
    assert s["gpu_utilization"] == pytest.approx(0.6, abs=1e-12)
    assert s["gpu_hours_per_job"] == 1.5  # (1 + 2 + 3 + 0) / 4
    assert s["restarts_per_job"] == 1.0  # (1 + 0 + 2 + 1) / 4
    assert s["resizes_per_job"] == 1.0  # (2 + 1 + 0 + 1) / 4


def test_summary_without_finished_jobs_is_none():
    jobs = (job("x", 0.0, 5.0, None, gpu_seconds=7200.0, restarts=3),
            job("y", 10.0, None, None))
    s = report.summarize(sim(jobs))
    assert (s["jobs"], s["finished"], s["unfinished"]) == (2, 0, 2)
    for key in ("avg_jct", "median_jct", "p99_jct", "makespan", "gpu_utilization"):
        assert s[key] is None, key
    assert s["gpu_hours_per_job"] == 1.0 and s["restarts_per_job"] == 1.5
    json.dumps(s)


def test_summary_without_jobs():
    s = report.summarize(sim(jobs=(), utilization=()))
    assert (s["jobs"], s["finished"], s["unfinished"]) == (0, 0, 0)
    for key in ("avg_jct", "median_jct", "p99_jct", "makespan", "gpu_utilization",
                "gpu_hours_per_job", "restarts_per_job", "resizes_per_job"):
        assert s[key] is None, key
    json.dumps(s)


def test_summary_params_become_plain_values():
    params = {"seed": np.int64(3), "scale": np.float32(0.5), "sizes": (1, 2), "arr": np.arange(2),
              "flag": np.bool_(True)}
    s = report.summarize(sim(params=params))
    assert s["params"] == {"seed": 3, "scale": 0.5, "sizes": [1, 2], "arr": [0, 1], "flag": True}
    assert type(s["params"]["seed"]) is int and type(s["params"]["flag"]) is bool
    json.dumps(s)


# --- gpu_utilization (step function) ------------------------------------------------------------


def test_utilization_step_function_with_changing_cluster_size():
    r = sim(utilization=((0.0, 4, 4), (100.0, 2, 8)))
    # [0, 200]: busy 4*100 + 2*100 = 600, total 4*100 + 8*100 = 1200
    assert report.gpu_utilization(r, 0.0, 200.0) == pytest.approx(0.5)
    # [50, 200]: the first sample counts from 50 on: busy 4*50 + 2*100 = 400, total 200 + 800
    assert report.gpu_utilization(r, 50.0, 200.0) == pytest.approx(0.4)
    # a window inside one step
    assert report.gpu_utilization(r, 120.0, 150.0) == pytest.approx(0.25)


def test_utilization_edge_cases():
    # before the first sample: nothing busy, total_gpus GPUs: busy 8*50 = 400 over 8*100 = 800
    r = sim(utilization=((50.0, 8, 8),))
    assert report.gpu_utilization(r, 0.0, 100.0) == pytest.approx(0.5)
    # equal times: the last sample wins (zero-length step)
    r = sim(utilization=((0.0, 8, 8), (0.0, 2, 8)))
    assert report.gpu_utilization(r, 0.0, 10.0) == pytest.approx(0.25)
    # unsorted samples are sorted by time
    r = sim(utilization=((100.0, 2, 8), (0.0, 4, 4)))
    assert report.gpu_utilization(r, 0.0, 200.0) == pytest.approx(0.5)
    # no samples: idle cluster; no GPUs at all or an empty interval: undefined
    assert report.gpu_utilization(sim(utilization=()), 0.0, 10.0) == 0.0
    assert report.gpu_utilization(sim(utilization=(), total_gpus=0), 0.0, 10.0) is None
    assert report.gpu_utilization(sim(), 5.0, 5.0) is None


# --- files -------------------------------------------------------------------------------------


def test_job_csv_round_trip(tmp_path):
    jobs = THREE + (job("d", 20.0, None, None, gpu_seconds=0.5, restarts=1),
                    job("e", 30.0, 40.0, None, gpu_seconds=1.0 / 3.0))
    path = report.write_job_csv(sim(jobs), tmp_path / "out" / "jobs.csv")
    assert path == tmp_path / "out" / "jobs.csv"
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == report.CSV_COLUMNS == (
            "name", "application", "submit_time", "start_time", "finish_time", "jct",
            "gpu_seconds", "restarts", "resizes", "requested_gpus", "max_gpus")
        rows = list(reader)
    assert [r["name"] for r in rows] == ["a", "b", "c", "d", "e"]
    b = rows[1]
    assert b["application"] == "bert"
    assert float(b["submit_time"]) == 50.0 and float(b["start_time"]) == 60.0
    assert float(b["finish_time"]) == 250.0 and float(b["jct"]) == 200.0
    assert float(b["gpu_seconds"]) == 7200.0
    assert (int(b["restarts"]), int(b["resizes"]), int(b["requested_gpus"]),
            int(b["max_gpus"])) == (0, 1, 4, 8)
    assert int(rows[2]["requested_gpus"]) == 2
    d = rows[3]
    assert (d["start_time"], d["finish_time"], d["jct"]) == ("", "", "")
    assert float(d["submit_time"]) == 20.0 and int(d["restarts"]) == 1
    e = rows[4]
    assert float(e["start_time"]) == 40.0 and (e["finish_time"], e["jct"]) == ("", "")
    assert float(e["gpu_seconds"]) == 1.0 / 3.0  # floats read back exactly


def test_summary_json(tmp_path):
    summaries = [report.summarize(sim()), report.summarize(sim(policy="static")),
                 report.summarize(sim(jobs=(job("x", 0.0, None, None),)))]
    path = report.write_summary_json(summaries, tmp_path / "a" / "b" / "summary.json")
    doc = json.loads(path.read_text())
    assert list(doc) == ["runs"]
    assert doc["runs"] == summaries
    assert [r["policy"] for r in doc["runs"]] == ["ones-pal", "static", "ones-pal"]
    assert doc["runs"][2]["avg_jct"] is None


# --- plots -------------------------------------------------------------------------------------


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 5000


@pytest.mark.parametrize("plot", [report.plot_jct_cdf, report.plot_utilization])
def test_plots_one_and_two_policies(tmp_path, plot):
    one = plot([sim()], tmp_path / "one" / "plot.png")
    assert one == tmp_path / "one" / "plot.png"
    assert_png(one)
    two = plot([sim(), sim(policy="static", utilization=((0.0, 8, 8), (900.0, 0, 8)))],
               tmp_path / "two.png")
    assert_png(two)
    assert two.read_bytes() != one.read_bytes()


@pytest.mark.parametrize("plot", [report.plot_jct_cdf, report.plot_utilization])
def test_plots_without_finished_jobs(tmp_path, plot):
    nothing = sim(jobs=(job("x", 0.0, 5.0, None), job("y", 1.0, None, None)))
    assert_png(plot([nothing], tmp_path / "none.png"))
    assert_png(plot([nothing, sim(policy="static")], tmp_path / "mixed.png"))
    assert_png(plot([sim(jobs=(), utilization=())], tmp_path / "empty.png"))


def test_plots_close_their_figures(tmp_path):
    import matplotlib.pyplot as plt

    before = len(plt.get_fignums())
    report.plot_jct_cdf([sim()], tmp_path / "a.png")
    report.plot_utilization([sim()], tmp_path / "b.png")
    assert len(plt.get_fignums()) == before


def test_labels_name_the_workload_only_when_several():
    assert report._labels([sim(), sim(policy="static")]) == ["ones-pal", "static"]
    assert report._labels([sim(), sim(workload="philly")]) == ["ones-pal (pollux)",
                                                               "ones-pal (philly)"]


def test_importing_report_does_not_import_matplotlib():
    code = "import sys, hpcsched.sim.report; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- terminal ----------------------------------------------------------------------------------


def test_render_table():
    from rich.console import Console

    summaries = [report.summarize(sim()),
                 report.summarize(sim(jobs=(job("x", 0.0, None, None),), policy="static"))]
    table = report.render_table(summaries)
    assert table.row_count == 2
    headers = [c.header for c in table.columns]
    assert headers == ["POLICY", "WORKLOAD", "JOBS", "AVG JCT (h)", "MEDIAN JCT (h)",
                       "P99 JCT (h)", "MAKESPAN (h)", "GPU UTIL (%)", "RESTARTS/JOB",
                       "FLIP-FLOPS"]
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(table)
    lines = console.export_text().splitlines()
    # 300 s, 200 s, 592 s, 700 s in hours; 60 % utilization; 1 restart per job
    assert lines[1].split() == ["ones-pal", "pollux", "3/3", "0.08", "0.06", "0.16", "0.19",
                                "60.0", "1.00", "0/0"]
    assert lines[2].split() == ["static", "pollux", "0/1", "-", "-", "-", "-", "-", "0.00",
                                "0/0"]
