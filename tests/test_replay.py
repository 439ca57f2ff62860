"""hpcsched replay's outputs, its comparison with the simulator, and its command line (no
Slurm: a fake ``sinfo`` on PATH where the cluster's shape is read)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcsched.cli import main
from hpcsched.daemon.config import DaemonSettings, PolicySettings
from hpcsched.daemon.config import Settings as DaemonConfig
from hpcsched.replay import ReplayError, compare, report
from hpcsched.replay.plan import ClusterShape, make_plan
from hpcsched.replay.slurmread import JobRecord
from hpcsched.replay.watch import Tracked
from hpcsched.sim import SimResult
from hpcsched.sim.report import summarize
from hpcsched.sim.workload import load_csv
from tests.slurm_outputs import SINFO_DOWN, SINFO_IDLE

WORKLOAD = """name,time,application,num_replicas,batch_size
cifar10-a,0,cifar10,1,128
ncf-b,200,ncf,1,256
cifar10-c,400,cifar10,2,256
"""
START = 1_000_000.0


@pytest.fixture
def workload(tmp_path) -> Path:
    p = tmp_path / "tiny.csv"
    p.write_text(WORKLOAD)
    return p


def _tracked(workload: Path) -> list[Tracked]:
    """a completed after a requeue (Slurm rewrote its submit time), b failed, c completed."""
    plan = make_plan(load_csv(workload), ClusterShape(4, 4, "gpu"), 0.01, script="e.py")
    a, b, c = (Tracked(p, job_id=str(10 + p.index), submitted_at=START + p.submit_at + 0.5)
               for p in plan)
    a.record = JobRecord("10", "COMPLETED", START + 0.4, START + 20.0, START + 60.0, 1)
    b.record = JobRecord("11", "FAILED", START + 2.4, START + 3.0, START + 5.0, 0)
    c.record = JobRecord("12", "COMPLETED", START + 4.2, START + 5.0, START + 40.0, 0)
    return [a, b, c]


def test_rows_jct_from_the_original_submission_and_only_for_completed_jobs(workload):
    rows = report.job_rows(_tracked(workload), START)
    assert [r["final_state"] for r in rows] == ["COMPLETED", "FAILED", "COMPLETED"]
    assert rows[0]["jct"] == pytest.approx(59.6) and rows[0]["requeues"] == 1
    assert rows[1]["jct"] is None and rows[1]["end_time"] == pytest.approx(5.0)
    assert rows[2]["jct"] == pytest.approx(35.8) and rows[2]["gpus"] == 2
    assert [r["planned_submit"] for r in rows] == pytest.approx([0.0, 2.0, 4.0])


def test_summary_has_simulates_keys_and_counts_a_failed_job_unfinished(workload):
    rows = report.job_rows(_tracked(workload), START)
    s = report.summarize_real(report.as_result(rows, "tiny.csv", 16, 80.0, {"scale": 0.01}))
    empty = SimResult("p", "w", (), (), 16, 0, 0.0)
    assert list(s) == list(summarize(empty))
    assert (s["policy"], s["jobs"], s["finished"], s["unfinished"]) == ("real", 3, 2, 1)
    assert s["avg_jct"] == pytest.approx((59.6 + 35.8) / 2)
    assert s["makespan"] == pytest.approx(60.0 - 0.4)     # first submit to last finish
    assert all(s[k] is None for k in report.NOT_MEASURED)
    assert s["restarts_per_job"] == pytest.approx(1 / 3)


def test_run_files_read_back(tmp_path, workload):
    rows = report.job_rows(_tracked(workload), START)
    summary = report.summarize_real(report.as_result(rows, "tiny.csv", 16, 80.0, {}))
    report.write_run(tmp_path / "run", {"workload": str(workload)}, rows, summary)
    meta, back = report.read_run(tmp_path / "run")
    assert meta == {"workload": str(workload)} and back == rows
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["runs"] == [summary]
    with pytest.raises(ReplayError, match="not a replay's directory"):
        report.read_run(tmp_path)


def _run_dir(tmp_path, workload) -> Path:
    out = tmp_path / "run"
    rows = report.job_rows(_tracked(workload), START)
    meta = {"workload": str(workload), "workload_name": "tiny.csv", "scale": 0.01, "seed": 0,
            "nodes": 4, "gpus_per_node": 4, "partition": "gpu", "start": START,
            "wall_seconds": 80.0}
    report.write_run(out, meta, rows, report.summarize_real(
        report.as_result(rows, "tiny.csv", 16, 80.0, {})))
    return out


def test_compare_a_finished_run(tmp_path, workload):
    out = _run_dir(tmp_path, workload)
    doc = compare.compare_run(out, compare.Settings(policy="static", interval=2.0,
                                                    restart_cost=5.0, costs_note="n"))
    real, sim = doc["runs"]
    assert list(real) == list(sim) and sim["policy"] == "simulated (static)"
    assert sim["finished"] == 3 and sim["params"]["restart_cost"] == {"*": 5.0}
    # scaled: cifar10 on 1 GPU at 128 is 4028 s of work, x 0.01 plus the 5 s start
    sim_jobs = (out / "simulated-jobs.csv").read_text().splitlines()
    assert len(sim_jobs) == 4 and sim_jobs[1].startswith("cifar10-a,cifar10,0.0,")
    assert doc["jct_ratio"]["jobs"] == 2 and doc["costs"] == "n"
    assert (out / "jct-cdf.png").stat().st_size > 1000
    saved = json.loads((out / "compare.json").read_text())
    assert saved["runs"][0]["policy"] == "real"
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(compare.render(real, sim, doc["jct_ratio"]))
    text = console.export_text()
    for label in ("jobs finished", "avg JCT (s)", "p99 JCT (s)", "makespan (s)",
                  "per-job JCT ratio (2 jobs)", "2/3", "3/3"):
        assert label in text, text


def test_jct_ratios():
    from hpcsched.sim import JobResult

    def res(*jcts):
        return SimResult("p", "w", tuple(
            JobResult(f"j{i}", "ncf", 0.0, 0.0, j, 0.0, 0, 0, 1, 1) for i, j in enumerate(jcts)),
            (), 4, 0, 0.0)

    r = compare.jct_ratios(res(10.0, 40.0, None), res(20.0, 10.0, 5.0))
    assert r == {"jobs": 2, "median": 2.25, "mean": 2.25, "min": 0.5, "max": 4.0, "worst": "j1"}
    assert compare.jct_ratios(res(None), res(1.0))["median"] is None


def _grow(i: int, seconds: float):
    from hpcsched.daemon.store.rows import ActionRow

    t = 1000.0 * i
    return ActionRow(i, i, "1", "grow", 1, 1, 2, 64, 64, "r", "running", None, t, t + seconds, 0,
                     history=(("requested", t), ("checkpointed", t + 1), ("requeued", t + 2),
                              ("running", t + 1 + seconds)))


def test_daemon_settings_use_measured_costs_once_there_are_enough():
    config = DaemonConfig(daemon=DaemonSettings(round_interval=2.0, restart_cost=7.0,
                                                grow="requeue", hold_rounds=1),
                          policy=PolicySettings(name="dp", seed=3, params={"x": 1}))
    s = compare.daemon_settings(config, [])
    assert (s.policy, s.params, s.seed, s.interval, s.grow, s.restart_cost, s.hold_rounds) == (
        "dp", {"x": 1}, 3, 2.0, "requeue", 7.0, 1)
    assert s.granularity == "node"     # auto, with grow = requeue
    assert compare.daemon_settings(DaemonConfig(), []).granularity == "gpu"   # the defaults
    assert "configured; 0 measured" in s.costs_note
    other = compare.daemon_settings(config, [], policy="static")
    assert (other.policy, other.params) == ("static", {})
    measured = compare.daemon_settings(config, [_grow(1, 9.0), _grow(2, 11.0), _grow(3, 4.0)])
    assert measured.restart_cost == 9.0 and "grow 9.0 s (median of the last 3)" in \
        measured.costs_note
    assert compare.daemon_settings(config, [_grow(1, 9.0), _grow(2, 11.0)]).restart_cost == 7.0


# ------------------------------------------------------------------------------- the command


@pytest.fixture
def fake_sinfo(tmp_path, monkeypatch):
    """A fake ``sinfo`` first on PATH printing ``text`` (SINFO_IDLE unless changed)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HPCSCHED_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("[daemon]\npartitions = [\"gpu\"]\n")

    def install(text: str) -> None:
        p = bindir / "sinfo"
        p.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({text!r})\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)

    install(SINFO_IDLE)
    return install


def _invoke(*args):
    return CliRunner().invoke(main, ["replay", *args])


def test_dry_run_prints_the_plan_and_submits_nothing(fake_sinfo, workload, tmp_path):
    r = _invoke(str(workload), "--scale", "0.01", "--dry-run", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    for word in ("cifar10-a", "ncf-b", "cifar10-c", "1x2", "3 jobs on 4 x 4 GPUs in gpu",
                 "nothing submitted"):
        assert word in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, message", [
    (("pal:1", "--dry-run"), "fixed-work job (a PAL/Blox trace)"),
    (("nope.csv", "--dry-run"), "no such workload file"),
    (("{w}", "--scale", "0.01", "--script", "/no/such.py"), "emulated application /no/such.py"),
])
def test_errors_are_one_line(fake_sinfo, workload, args, message):
    r = _invoke(*(a.format(w=workload) for a in args))
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcsched replay: error: ") and message in lines[0]


def test_slurm_down_is_one_line(fake_sinfo, workload):
    fake_sinfo(SINFO_DOWN)
    r = _invoke(str(workload), "--dry-run")
    assert r.exit_code == 2
    assert r.output.strip().startswith("hpcsched replay: error: Slurm: ")
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    ((), "missing WORKLOAD"),
    (("--from", "."), "give --compare and no WORKLOAD"),
])
def test_usage_errors(args, message):
    r = _invoke(*args)
    assert r.exit_code == 2 and message in r.output


def test_compare_from_a_directory(fake_sinfo, tmp_path, workload, monkeypatch):
    monkeypatch.setenv("HPCSCHED_DATABASE_URL", f"sqlite:///{tmp_path}/absent.db")
    out = _run_dir(tmp_path, workload)
    r = _invoke("--from", str(out), "--compare", "--policy", "static")
    assert r.exit_code == 0, r.output
    assert "real vs simulated (static)" in r.output and "(no store found)" in r.output
    assert (out / "compare.json").exists()
    r = _invoke("--from", str(tmp_path), "--compare")
    assert r.exit_code == 2 and "not a replay's directory" in r.output


def test_startup_is_read_from_the_latest_launchs_first_step(tmp_path, monkeypatch):
    from hpcsched.protocol.jobdir import JobDir

    monkeypatch.setenv("HPCSCHED_CONTROL_DIR", str(tmp_path / "jobs"))
    jd = JobDir.create(tmp_path / "jobs")
    jd.link_job_id("77")
    jd.metrics_dir.mkdir(parents=True, exist_ok=True)
    (jd.metrics_dir / "launch-1-rank-0.jsonl").write_text('{"t": 1003.5, "step": 0}\n')
    (jd.metrics_dir / "launch-10-rank-0.jsonl").write_text(
        '{"t": 1052.25, "step": 0}\n{"t": 1052.5, "step": 1}\n')
    (jd.metrics_dir / "launch-10-rank-1.jsonl").write_text('{"t": 1051.0, "step": 0}\n')
    # a newcomer of an extension that joined later: not the job's start
    (jd.metrics_dir / "launch-11-ext-91-rank-0.jsonl").write_text('{"t": 1200.0, "step": 40}\n')
    assert report.startup_seconds("77", 1050.0) == 2.25     # after a requeue: launch 10
    assert report.startup_seconds("77", None) is None
    assert report.startup_seconds("78", 1050.0) is None     # no job directory


@pytest.mark.parametrize("measured, startups, expect, said", [
    (False, [3.0, None, 5.0, 4.0], 4.0, "start/restart cost 4.0 s (median start-up of the "
                                        "replay's 3 jobs)"),
    (False, [None], 30.0, None),
    (True, [3.0], 30.0, None),
])
def test_restart_cost_from_the_replays_start_ups(measured, startups, expect, said):
    s = compare.Settings(policy="jct", restart_cost=30.0, restart_measured=measured,
                         costs_note="resize costs: ...")
    got = compare.with_startups(s, startups)
    assert got.restart_cost == expect
    assert (said in got.costs_note) if said else got == s


@pytest.mark.parametrize("starts, complete, expect", [
    ([50.0, 150.0, 250.0], True, True),     # a round within [100, 200]
    ([50.0, 250.0], True, False),
    ([], True, False),
    ([250.0, 300.0], False, None),          # only later rounds seen; older ones not looked at
    ([250.0, 300.0], True, False),
])
def test_daemon_ran(starts, complete, expect):
    assert compare.daemon_ran(starts, 100.0, 200.0, complete) is expect


def test_compare_without_a_daemon_simulates_static(fake_sinfo, tmp_path, workload, monkeypatch):
    monkeypatch.setenv("HPCSCHED_DATABASE_URL", f"sqlite:///{tmp_path}/absent.db")
    out = _run_dir(tmp_path, workload)
    r = _invoke("--from", str(out), "--compare")
    assert r.exit_code == 0, r.output
    assert "real vs simulated (static)" in r.output
    assert "no daemon round during the replay: static" in " ".join(r.output.split())


def test_the_replayed_workload_is_kept_and_simulated(tmp_path, workload):
    jobs = load_csv(workload)
    path = report.write_workload(tmp_path / "run", jobs)
    assert path == tmp_path / "run" / "workload.csv" and load_csv(path) == jobs
    out = _run_dir(tmp_path, workload)
    meta = json.loads((out / "run.json").read_text())
    workload.write_text(WORKLOAD.replace("ncf,1,256", "ncf,4,256"))   # changed since
    (out / "run.json").write_text(json.dumps(dict(meta, workload_file="workload.csv")))
    compare.compare_run(out, compare.Settings(policy="static", interval=2.0))
    sim = (out / "simulated-jobs.csv").read_text().splitlines()
    assert sim[2].startswith("ncf-b,ncf,") and sim[2].endswith(",1,1")   # 1 GPU, as replayed


@pytest.mark.parametrize("raised, status, said", [
    (KeyboardInterrupt(), 130, "interrupted: 1 of 3 jobs submitted (41); still in Slurm, not "
                               "cancelled: 41; partial results in"),
    (ReplayError("Slurm did not answer for 120 s"), 1,
     "hpcsched replay: error: Slurm did not answer for 120 s; partial results in"),
])
def test_a_run_cut_short_keeps_its_partial_results(fake_sinfo, workload, tmp_path, monkeypatch,
                                                   raised, status, said):
    from hpcsched.replay import cli as replay_cli

    script = tmp_path / "emulated.py"
    script.write_text("pass\n")

    def cut_short(replay, console):
        replay.start = START
        replay.tracked = [Tracked(p) for p in replay.plan]
        replay.tracked[0].job_id, replay.tracked[0].submitted_at = "41", START + 0.2
        raise raised

    monkeypatch.setattr(replay_cli, "_run", cut_short)
    out = tmp_path / "o"
    r = _invoke(str(workload), "--scale", "0.01", "--out", str(out), "--script", str(script))
    assert r.exit_code == status, r.output
    assert said in " ".join(r.output.split())
    meta, rows = report.read_run(out)
    assert meta["interrupted"] is True
    assert [(x["job_id"], x["final_state"]) for x in rows] == [
        ("41", "PENDING"), (None, "NOT_SUBMITTED"), (None, "NOT_SUBMITTED")]
    (summary,) = json.loads((out / "summary.json").read_text())["runs"]
    assert (summary["finished"], summary["unfinished"]) == (0, 3)


def test_a_mixed_run_reports_other_users_jobs_apart(tmp_path, workload):
    """With --rigid-fraction: the kept workload marks the plain jobs, the rows and summary
    carry them, and the comparison simulates them as rigid and shows their wait."""
    from hpcsched.sim.workload import make_rigid

    jobs = make_rigid(load_csv(workload), 0.5)        # ncf-b is another user's plain job
    assert [j.rigid for j in jobs] == [False, True, False]
    path = report.write_workload(tmp_path / "run", jobs)
    assert load_csv(path) == jobs, "the rigid column reads back"
    plan = make_plan(jobs, ClusterShape(4, 4, "gpu"), 0.01, script="e.py")
    tracked = _tracked(workload)
    for t, p in zip(tracked, plan):
        t.planned = p
    tracked[1].record = JobRecord("11", "COMPLETED", START + 2.4, START + 9.0, START + 30.0, 0)
    rows = report.job_rows(tracked, START)
    assert [r["rigid"] for r in rows] == [0, 1, 0]
    meta = {"workload": str(workload), "workload_name": "tiny.csv (0.5 plain)", "scale": 0.01,
            "seed": 0, "nodes": 4, "gpus_per_node": 4, "partition": "gpu", "start": START,
            "wall_seconds": 80.0, "workload_file": "workload.csv"}
    s = report.summarize_real(report.as_result(rows, "tiny.csv", 16, 80.0, {}))
    assert s["plain_jobs"] == 1 and s["plain_avg_wait"] == pytest.approx(9.0 - 2.4)
    assert s["elastic_avg_jct"] == pytest.approx((59.6 + 35.8) / 2)
    report.write_run(tmp_path / "run", meta, rows, s)
    assert report.read_run(tmp_path / "run")[1] == rows
    doc = compare.compare_run(tmp_path / "run", compare.Settings(policy="jct", interval=2.0,
                                                                 granularity="gpu"))
    real, sim = doc["runs"]
    assert sim["plain_jobs"] == 1 and sim["plain_avg_wait"] == 0.0   # an empty cluster
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(compare.render(real, sim, doc["jct_ratio"]))
    assert "other users' jobs: avg wait (s)" in console.export_text()
