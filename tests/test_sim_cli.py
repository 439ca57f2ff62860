"""``hpcsched simulate`` (hpcsched.sim.cli): outputs checked against the simulator and
report.summarize run directly here, parallel runs, and user errors (exit code 2, a one-line
message, no traceback). CliRunner on hpcsched.cli.main, plus the installed entry point once.
No Slurm."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcsched.cli import main
from hpcsched.sim import report
from hpcsched.sim.engine import SimConfig, Simulator
from hpcsched.sim.workload import load_workload

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HEADER = "name,time,application,num_replicas,batch_size\n"
# 7 GPUs asked for on one 4-GPU node (--nodes 1)
ROWS = "cifar-a,0,cifar10,2,256\nncf-b,30,ncf,1,256\nbert-c,60,bert,4,48\n"
# Pollux's baseline thresholds, which the CLI gives tiresias by default: 16 GPU-hours
POLLUX_TIRESIAS = {"queue_thresholds": [16 * 3600.0]}


@pytest.fixture
def workload(tmp_path) -> Path:
    path = tmp_path / "small.csv"
    path.write_text(HEADER + ROWS)
    return path


def simulate(*args, env=None):
    return CliRunner().invoke(main, ["simulate", *map(str, args)], env=env)


def without_wall(runs):
    return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in runs]


def error_line(output: str) -> str:
    """The one line that says what went wrong."""
    assert "Traceback" not in output, output
    lines = [ln for ln in output.splitlines() if "error" in ln.lower()]
    assert len(lines) == 1, output
    return lines[0]


def direct_summary(path: Path, policy: str, params=None, nodes=1) -> dict:
    """What the CLI should report for one run, from the simulator and report directly."""
    name, jobs = load_workload(str(path))
    res = Simulator(jobs, policy, policy_params=params, config=SimConfig(nodes=nodes),
                    workload_name=name).run()
    return json.loads(json.dumps(report.summarize(res)))


# --- outputs ------------------------------------------------------------------------------------


def test_json_dash_is_stdout_not_a_file_named_dash(workload, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = simulate("-w", workload, "-p", "static", "--nodes", 1, "--json", "-")
    assert r.exit_code == 0, r.output
    assert [x["policy"] for x in json.loads(r.stdout)["runs"]] == ["static"]   # JSON alone on stdout
    assert not (tmp_path / "-").exists()


def test_json_holds_one_summary_per_policy(workload, tmp_path):
    out = tmp_path / "res" / "summary.json"
    r = simulate("-w", workload, "-p", "static", "-p", "tiresias", "--nodes", 1, "--json", out,
                 "-q")
    assert r.exit_code == 0, r.output
    runs = json.loads(out.read_text())["runs"]
    assert [x["policy"] for x in runs] == ["static", "tiresias"]
    assert all(x["workload"] == "small.csv" and x["jobs"] == x["finished"] == 3 for x in runs)
    expected = [direct_summary(workload, "static"),
                direct_summary(workload, "tiresias", POLLUX_TIRESIAS)]
    assert without_wall(runs) == without_wall(expected)
    assert set(runs[0]) == set(expected[0])          # exactly summarize's fields
    assert runs[0]["params"]["nodes"] == 1 and runs[0]["params"]["restart_cost"] == {"*": 30.0}


def test_options_reach_the_simulation(workload, tmp_path):
    out = tmp_path / "s.json"
    r = simulate("-w", workload, "-p", "tiresias", "--nodes", 2, "--restart-cost", "5",
                 "--restart-cost", "bert=7", "--param", "tiresias.queue_thresholds=[600]",
                 "--seed", 3, "--json", out, "-q")
    assert r.exit_code == 0, r.output
    (run,) = json.loads(out.read_text())["runs"]
    name, jobs = load_workload(str(workload))
    cfg = SimConfig(nodes=2, restart_cost={"*": 5.0, "bert": 7.0}, seed=3)
    res = Simulator(jobs, "tiresias", policy_params={"queue_thresholds": [600]}, config=cfg,
                    workload_name=name).run()
    assert without_wall([run]) == without_wall([json.loads(json.dumps(report.summarize(res)))])
    assert run["params"]["restart_cost"] == {"*": 5.0, "bert": 7.0} and run["params"]["seed"] == 3


def test_soft_consolidate_reaches_the_simulation(tmp_path):
    out = tmp_path / "s.json"
    r = simulate("-w", "pal:1", "-p", "static", "--placement", "packed", "--hold-new-jobs",
                 "--soft-consolidate", "--json", out, "-q")
    assert r.exit_code == 0, r.output
    (run,) = json.loads(out.read_text())["runs"]
    name, jobs = load_workload("pal:1")
    res = Simulator(jobs, "static", policy_params={"placement": "packed"}, workload_name=name,
                    config=SimConfig(hold_new_jobs=True, soft_consolidate=True)).run()
    res = replace(res, policy="static+packed")
    assert without_wall([run]) == without_wall([json.loads(json.dumps(report.summarize(res)))])
    assert run["params"]["soft_consolidate"] is True


def test_fastest_gpus_reaches_the_simulation(tmp_path):
    out = tmp_path / "s.json"
    r = simulate("-w", "pal:2", "-p", "static", "--placement", "pal", "--variability",
                 "--variability-draws", "pal", "--seed", 42, "--hold-new-jobs", "--fastest-gpus",
                 "--json", out, "-q")
    assert r.exit_code == 0, r.output
    (run,) = json.loads(out.read_text())["runs"]
    name, jobs = load_workload("pal:2", seed=42)
    res = Simulator(jobs, "static", policy_params={"placement": "pal"}, workload_name=name,
                    config=SimConfig(hold_new_jobs=True, variability="pal", seed=42,
                                     fastest_gpus=True)).run()
    res = replace(res, policy="static+pal")
    assert without_wall([run]) == without_wall([json.loads(json.dumps(report.summarize(res)))])
    assert run["params"]["fastest_gpus"] is True


def test_the_table_names_every_run(workload):
    r = simulate("-w", workload, "-p", "static", "-p", "dp", "--nodes", 1)
    assert r.exit_code == 0, r.output
    assert "POLICY" in r.output and "static" in r.output and "dp" in r.output
    assert "3/3" in r.output


def test_out_writes_job_csvs_summary_and_plots(workload, tmp_path):
    out = tmp_path / "out"
    r = simulate("-w", workload, "-p", "static", "-p", "tiresias", "--nodes", 1, "--out", out,
                 "-q")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == [
        "jct-cdf.png", "small.csv--static.csv", "small.csv--tiresias.csv", "summary.json",
        "utilization.png"]
    for policy in ("static", "tiresias"):
        with open(out / f"small.csv--{policy}.csv", newline="") as fh:
            reader = csv.DictReader(fh)
            assert tuple(reader.fieldnames) == report.CSV_COLUMNS
            rows = list(reader)
        assert sorted(x["name"] for x in rows) == ["bert-c", "cifar-a", "ncf-b"]
        assert all(float(x["jct"]) > 30 for x in rows)
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert [x["policy"] for x in runs] == ["static", "tiresias"]
    assert without_wall(runs) == without_wall([
        direct_summary(workload, "static"), direct_summary(workload, "tiresias", POLLUX_TIRESIAS)])
    for png in ("jct-cdf.png", "utilization.png"):
        data = (out / png).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_parallel_runs_give_the_same_summaries(workload, tmp_path):
    results = {}
    for n in (1, 2):
        out = tmp_path / f"j{n}.json"
        r = simulate("-w", workload, "-p", "static", "-p", "tiresias", "-p", "dp", "--nodes", 1,
                     "--jobs", n, "--json", out, "-q")
        assert r.exit_code == 0, r.output
        results[n] = json.loads(out.read_text())["runs"]
    assert [x["policy"] for x in results[2]] == ["static", "tiresias", "dp"]
    assert without_wall(results[1]) == without_wall(results[2])


# --- user errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "csv_text", "fragment"), [
    (["-w", "{tmp}/missing.csv", "-p", "static"], None, "no such workload file"),
    (["-w", "{csv}", "-p", "static"], HEADER + "a,0,cifar10,2,256\nb,soon,cifar10,2,256\n",
     "small.csv:3: time must be a number, got 'soon'"),
    (["-w", "{csv}", "-p", "static"], HEADER + "a,0,cifar10,2\n", "small.csv:2: expected 5 fields"),
    (["-w", "{csv}", "-p", "bogus"], HEADER + ROWS, "'bogus' is not one of"),
    (["-w", "{csv}", "-p", "tiresias", "--param", "queue_thresholds=[60]"], HEADER + ROWS,
     "expected POLICY.KEY=VALUE"),
    (["-w", "{csv}", "-p", "static", "--restart-cost", "abc"], HEADER + ROWS,
     "expected SECONDS or APPLICATION=SECONDS"),
    (["-w", "{csv}", "-p", "static", "--restart-cost", "bert=abc"], HEADER + ROWS,
     "expected SECONDS or APPLICATION=SECONDS"),
    (["-w", "{csv}", "-p", "static", "--nodes", "1"], HEADER + "big,0,bert,8,96\n",
     "error: job big asks for 8 GPUs; the cluster has 4"),
    (["-w", "{csv}", "-p", "tiresias", "--param", "tiresias.foo=1"], HEADER + ROWS,
     "policy 'tiresias': unknown parameter(s) foo; valid keys: queue_thresholds, "
     "promote_knob, preempt_within_queue, placement, locality_penalty"),
])
def test_user_errors_exit_2_with_one_line(tmp_path, args, csv_text, fragment):
    path = tmp_path / "small.csv"
    if csv_text is not None:
        path.write_text(csv_text)
    argv = [a.format(tmp=tmp_path, csv=path) for a in args]
    r = simulate(*argv, "-q", env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert fragment in error_line(r.output), r.output


def test_a_long_error_stays_on_one_line(tmp_path):
    name = "a-job-with-a-name-long-enough-to-pass-eighty-columns"
    path = tmp_path / "w.csv"
    path.write_text(HEADER + f"{name},0,bert,8,96\n")
    r = simulate("-w", path, "-p", "static", "--nodes", 1, "-q", env={"COLUMNS": "80"})
    assert r.exit_code == 2, r.output
    assert f"job {name} asks for 8 GPUs; the cluster has 4" in error_line(r.output), r.output


def test_an_error_message_keeps_its_brackets(workload):
    r = simulate("-w", workload, "-p", "tiresias", "--param", "tiresias.queue_thresholds=[a]",
                 "-q", env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert "queue_thresholds must be a list, got '[a]'" in error_line(r.output), r.output


def test_an_error_about_a_bracketed_job_name_is_reported(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "[/x],0,bert,8,96\n")
    r = simulate("-w", path, "-p", "static", "--nodes", 1, "-q", env={"COLUMNS": "200"})
    assert r.exit_code == 2, (r.exit_code, repr(r.exception))
    assert "job [/x] asks for 8 GPUs" in error_line(r.output)


# --- the installed command ----------------------------------------------------------------------


def entry_point() -> Path:
    exe = Path(sys.executable).with_name("hpcsched")
    assert exe.exists(), f"no hpcsched entry point next to {sys.executable}"
    return exe


def test_the_installed_command_runs_a_simulation(workload, tmp_path):
    out = tmp_path / "s.json"
    p = subprocess.run([str(entry_point()), "simulate", "-w", str(workload), "-p", "static",
                        "--nodes", "1", "--json", str(out), "-q"],
                       check=False, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert without_wall([run]) == without_wall([direct_summary(workload, "static")])


def test_the_installed_command_reports_a_job_larger_than_the_cluster(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "big,0,bert,8,96\n")
    p = subprocess.run([str(entry_point()), "simulate", "-w", str(path), "-p", "static",
                        "--nodes", "1", "-q"], check=False, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr.strip() == "hpcsched simulate: error: job big asks for 8 GPUs; the cluster has 4"


@pytest.mark.parametrize("flag", ["--event-rounds", "--no-event-rounds"])
def test_event_rounds_reach_the_simulation(workload, tmp_path, flag):
    out = tmp_path / "e.json"
    r = simulate("-w", workload, "-p", "jct", "--nodes", 1, flag, "--json", out, "-q")
    assert r.exit_code == 0, r.output
    (run,) = json.loads(out.read_text())["runs"]
    on = flag == "--event-rounds"
    name, jobs = load_workload(str(workload))
    res = Simulator(jobs, "jct", workload_name=name,
                    config=SimConfig(nodes=1, event_rounds=on)).run()
    assert without_wall([run]) == without_wall([json.loads(json.dumps(report.summarize(res)))])
    assert run["params"]["event_rounds"] is on
