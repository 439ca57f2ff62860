"""benchmarks/_evaluation_slurm.py: the evaluation's simulations as one Slurm job array
(``evaluation.py --executor slurm``). The pure parts (the sbatch command and script, squeue's
and sacct's output, the error for a failed task) and the driver against a fake Slurm; then, on
the dev cluster, a tiny grid run both ways into two caches (the same keys, the same results,
the same rendered tables), a failed task's error, and Ctrl-C cancelling the array."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
_spec = importlib.util.spec_from_file_location("evaluation_script_slurm", _BENCH / "evaluation.py")
assert _spec is not None and _spec.loader is not None
ev = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ev
_spec.loader.exec_module(ev)
es = sys.modules["_evaluation_slurm"]
rc = sys.modules["_run_cache"]
runs_mod = sys.modules["_evaluation_runs"]


def _run(workload="pollux:1@1.0", policy="static"):
    return ev.make_run(workload, policy, granularity="gpu")


# --- the pure parts ---------------------------------------------------------------------------

def test_the_sbatch_command_submits_one_array_with_the_options_given():
    work, script = Path("/shared/c/slurm/w"), Path("/shared/c/slurm/w/array.sh")
    opts = es.SlurmOptions(partition="cpu", time="1:30:00", max_parallel=8,
                           extra=("--mem=4G", "--qos=low"))
    cmd = es.sbatch_command(opts, 40, work, script)
    assert cmd[:3] == ["sbatch", "--parsable", "--array=0-39%8"]
    assert "--output=/shared/c/slurm/w/task-%A_%a.out" in cmd
    assert {"--partition=cpu", "--time=1:30:00", "--cpus-per-task=1", f"--chdir={es.ROOT}",
            "--job-name=hpcsched-eval"} <= set(cmd)
    assert cmd[-3:] == ["--mem=4G", "--qos=low", str(script)]      # extra words last, as given
    bare = es.sbatch_command(es.SlurmOptions(), 1, work, script)
    assert "--array=0-0" in bare and not any(a.startswith(("--partition", "--time")) for a in bare)


def test_the_array_script_runs_this_module_on_the_task_file(tmp_path):
    text = es.array_script("/opt/my env/bin/python", tmp_path / "tasks.pkl")
    assert text.startswith("#!/bin/sh\n")
    last = text.strip().splitlines()[-1]
    assert last == (f"exec '/opt/my env/bin/python' {_BENCH / '_evaluation_slurm.py'} "
                    f"{tmp_path / 'tasks.pkl'}")
    (tmp_path / "a.sh").write_text(text)
    assert subprocess.run(["sh", "-n", str(tmp_path / "a.sh")]).returncode == 0


def test_squeue_rows_give_each_queued_task_of_this_array():
    text = "4242_3|RUNNING\n4242_[5-7%2]|PENDING\n4242_[9,11]|PENDING\n777_1|RUNNING\n4242_4|COMPLETING\n"
    assert es.parse_squeue(text, "4242") == {3: "RUNNING", 4: "COMPLETING", 5: "PENDING",
                                             6: "PENDING", 7: "PENDING", 9: "PENDING", 11: "PENDING"}
    assert es.parse_squeue("", "4242") == {}


def test_sacct_rows_give_each_task_s_state_and_exit_code():
    text = ("4242_0|COMPLETED|0:0\n4242_1|FAILED|1:0\n4242_1.batch|FAILED|1:0\n"
            "4242_2|CANCELLED by 0|0:15\n4242_3|TIMEOUT|0:0\n4242_[4-5%2]|PENDING|0:0\n"
            "42420_6|FAILED|1:0\n")
    got = es.parse_sacct(text, "4242")
    assert got == {0: ("COMPLETED", "0:0"), 1: ("FAILED", "1:0"), 2: ("CANCELLED", "0:15"),
                   3: ("TIMEOUT", "0:0"), 4: ("PENDING", "0:0"), 5: ("PENDING", "0:0")}
    assert {t for t, (s, _) in got.items() if s in es.FAILED_STATES} == {1, 2, 3}


def test_the_error_names_each_failed_task_its_runs_state_and_output(tmp_path, monkeypatch):
    es.output_path(tmp_path, "4242", 1).write_text("[1/1] ...\nTraceback\nWorkloadError: no workload 99\n\n")
    msg = es.failure_message("4242", 3, {1: ["static on pollux:99@1.0"], 2: ["jct on pollux:2@1.0"]},
                             {1: ("FAILED", "1:0")}, tmp_path)
    lines = msg.splitlines()
    assert lines[0].startswith("2 of 3 tasks of Slurm job array 4242 left runs out of the run cache")
    assert lines[1] == (f"  task 1 (FAILED, exit code 1:0): static on pollux:99@1.0; "
                        f"output {tmp_path / 'task-4242_1.out'}")
    assert lines[2] == "    WorkloadError: no workload 99"
    assert lines[3].startswith("  task 2 (state unknown): jct on pollux:2@1.0; output ")
    assert len(lines) == 4                                       # no output file: no last line
    monkeypatch.setattr(es, "SHOWN", 1)
    short = es.failure_message("4242", 3, {1: ["a"], 2: ["b"]}, {}, tmp_path).splitlines()
    assert short[1].startswith("  task 1 (state unknown): a;")
    assert short[3:] == [f"  and 1 more tasks: their outputs are in {tmp_path}"]


def _parse(*argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-cache", action="store_true")
    es.add_options(ap)
    return ap.parse_args(argv)


def test_the_options():
    assert es.options(_parse()) is None
    assert es.options(_parse("--executor", "local")) is None
    got = es.options(_parse("--executor", "slurm", "--slurm-partition", "p", "--slurm-time", "10",
                            "--slurm-max-parallel", "4", "--slurm-arg=--mem=2G", "--slurm-arg=--qos=x",
                            "--slurm-chunk", "3"))
    assert got == es.SlurmOptions("p", "10", 4, ("--mem=2G", "--qos=x"), 3)
    with pytest.raises(es.SlurmArrayError, match="leave out --no-cache"):
        es.options(_parse("--executor", "slurm", "--no-cache"))
    with pytest.raises(es.SlurmArrayError, match="--slurm-max-parallel must be at least 1"):
        es.options(_parse("--executor", "slurm", "--slurm-max-parallel", "0"))


# --- the driver against a fake Slurm ----------------------------------------------------------

class FakeSlurm:
    """sbatch, squeue, sacct and scancel for one array: each squeue poll ends one more task,
    which puts its runs into the cache (through the task file, as a task does) unless it is in
    ``fail``."""

    def __init__(self, cache, fail=(), interrupt_at=None):
        self.cache, self.fail, self.interrupt_at = cache, set(fail), interrupt_at
        self.calls, self.ended, self.shares = [], 0, []

    def __call__(self, *cmd):
        self.calls.append(cmd)
        out = ""
        if cmd[0] == "sbatch":
            task_file = Path(cmd[-1]).with_name("tasks.pkl")
            self.shares, self.ended = pickle.loads(task_file.read_bytes())["shares"], 0
            out = "4242;lab\n"
        elif cmd[0] == "squeue":
            if self.interrupt_at is not None and self.ended == self.interrupt_at:
                raise KeyboardInterrupt
            if self.ended < len(self.shares):
                if self.ended not in self.fail:
                    for r in self.shares[self.ended]:
                        self.cache.put(r, ("result", {"avg_jct": float(r.seed), "wall_seconds": 1.0}))
                self.ended += 1
            out = "".join(f"4242_{t}|{'RUNNING' if t == self.ended else 'PENDING'}\n"
                          for t in range(self.ended, len(self.shares)))
        elif cmd[0] == "sacct":
            out = "".join(f"4242_{t}|{'FAILED' if t in self.fail else 'COMPLETED'}|"
                          f"{'1:0' if t in self.fail else '0:0'}\n" for t in range(self.ended))
        return subprocess.CompletedProcess(cmd, 0, out, "")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake Slurm in place of the real commands, no sleeping, no waiting for late results;
    ``fake(**kw)`` makes it."""
    monkeypatch.setattr(es, "_sleep", lambda s: None)
    monkeypatch.setattr(es, "SETTLE", 0.0)

    def make(**kw):
        slurm = FakeSlurm(rc.RunCache("v1", tmp_path), **kw)
        monkeypatch.setattr(es, "_call", slurm)
        return slurm
    return make


def _runs(n):
    return {("grid", "static", "gpu", "1.0", s): dataclasses.replace(_run(), seed=s) for s in range(n)}


def test_execute_all_sends_only_what_the_cache_lacks_and_reads_the_results_back(fake, tmp_path, capsys):
    slurm = fake()
    runs = _runs(5)
    slurm.cache.put(runs[("grid", "static", "gpu", "1.0", 0)], ("old", {"avg_jct": 0.0, "wall_seconds": 9.0}))
    out = ev.execute_all(runs, 1, slurm.cache, es.SlurmOptions(max_parallel=2, chunk=2))
    assert sum(len(s) for s in slurm.shares) == 4 and len(slurm.shares) == 2     # 4 runs, 2 a task
    assert next(c for c in slurm.calls if c[0] == "sbatch")[2] == "--array=0-1%2"
    assert out[("grid", "static", "gpu", "1.0", 0)] == ("old", {"avg_jct": 0.0, "wall_seconds": 9.0,
                                                                "cached": True})
    for s in range(1, 5):
        assert out[("grid", "static", "gpu", "1.0", s)] == ("result", {"avg_jct": float(s), "wall_seconds": 1.0})
    assert not (tmp_path / "slurm").exists() or not any((tmp_path / "slurm").iterdir())   # cleaned up
    text = capsys.readouterr().out
    assert "submitted 4 simulations as Slurm job array 4242 (2 tasks)" in text
    assert "Slurm job array 4242: 2 of 2 tasks ended, 0 running, 0 waiting" in text
    assert "[5/5]" in text
    assert ev.execute_all(runs, 1, slurm.cache, es.SlurmOptions()) and \
        sum(c[0] == "sbatch" for c in slurm.calls) == 1              # all cached: nothing submitted


def test_a_failed_task_stops_the_run_with_its_output_path_after_the_others_end(fake, tmp_path, capsys):
    slurm = fake(fail={1})
    runs = _runs(3)
    with pytest.raises(es.SlurmArrayError) as err:
        ev.execute_all(runs, 1, slurm.cache, es.SlurmOptions())
    work = next((tmp_path / "slurm").iterdir())
    msg = str(err.value)
    assert msg.startswith("1 of 3 tasks of Slurm job array 4242 left runs out of the run cache")
    assert "task 1 (FAILED, exit code 1:0): static on pollux:1@1.0 (gpu, seed " in msg
    assert f"output {work / 'task-4242_1.out'}" in msg
    assert f"task 1 FAILED (exit code 1:0); output {work / 'task-4242_1.out'}" in capsys.readouterr().out
    assert slurm.ended == 3                                    # the other tasks ran to their end
    assert sum(slurm.cache.get(r) is not None for r in runs.values()) == 2     # and are kept


def test_ctrl_c_while_waiting_cancels_the_array(fake):
    slurm = fake(interrupt_at=1)
    with pytest.raises(KeyboardInterrupt):
        ev.execute_all(_runs(3), 1, slurm.cache, es.SlurmOptions())
    assert slurm.calls[-1] == ("scancel", "4242")


def test_squeue_failing_now_and_then_is_waited_out_and_in_a_row_gives_up(fake, monkeypatch):
    slurm = fake()
    real, fails = slurm.__call__, iter([True, False, True, True, False, False, False])

    def flaky(*cmd):
        if cmd[0] == "squeue" and next(fails, False):
            return subprocess.CompletedProcess(cmd, 1, "", "slurm_load_jobs error: Socket timed out")
        return real(*cmd)
    monkeypatch.setattr(es, "_call", flaky)
    out = ev.execute_all(_runs(3), 1, slurm.cache, es.SlurmOptions())
    assert len(out) == 3 and slurm.ended == 3
    monkeypatch.setattr(es, "SQUEUE_TRIES", 2)
    fails = iter([False, True, True])
    with pytest.raises(es.SlurmArrayError, match="failed 2 times in a row .*Socket timed out"):
        ev.execute_all(_runs(6), 1, slurm.cache, es.SlurmOptions())


def test_without_sbatch_or_when_it_refuses_a_clear_error(fake, monkeypatch, tmp_path):
    def missing(*cmd):
        raise FileNotFoundError(2, "No such file or directory", cmd[0])
    monkeypatch.setattr(es, "_call", missing)
    cache = rc.RunCache("v1", tmp_path)
    with pytest.raises(es.SlurmArrayError, match="cannot run sbatch: .*No such file"):
        ev.execute_all(_runs(1), 1, cache, es.SlurmOptions())
    monkeypatch.setattr(es, "_call", lambda *cmd: subprocess.CompletedProcess(
        cmd, 1, "", "sbatch: error: invalid partition specified: nope"))
    with pytest.raises(es.SlurmArrayError, match=r"sbatch refused the job array \(sbatch --parsable "
                                                 r".*--partition=nope.*\): sbatch: error: invalid partition"):
        ev.execute_all(_runs(1), 1, cache, es.SlurmOptions(partition="nope"))


def test_without_a_cache_the_slurm_executor_refuses(fake):
    fake()
    with pytest.raises(es.SlurmArrayError, match="through the run cache"):
        ev.execute_all(_runs(1), 1, rc.RunCache(None), es.SlurmOptions())


# --- on the dev cluster -----------------------------------------------------------------------

TINY = 0.05     # a twentieth of each workload's arrivals and work: about 2 s a simulation


@pytest.fixture
def recorded(monkeypatch, slurm_jobs):
    """The real Slurm commands, each array's job id kept for ``slurm_jobs`` to cancel at the end;
    the evaluation's module default executor restored after the test."""
    real = es._call

    def call(*cmd):
        got = real(*cmd)
        if cmd[0] == "sbatch" and got.returncode == 0:
            slurm_jobs.append(got.stdout.strip().split(";")[0])
        return got
    monkeypatch.setattr(es, "_call", call)
    monkeypatch.setattr(runs_mod, "SLURM", None)
    return slurm_jobs


def _evaluate(monkeypatch, tmp_path, name, *extra):
    """``evaluation.py --grow-modes --quick`` (jct by extension and by requeue, workloads 1-2 at
    load 1.0: 4 simulations) at :data:`TINY` scale, into ``tmp_path/name``'s cache, docs and
    results; the seconds it took."""
    make_run = ev.make_run
    monkeypatch.setattr(ev, "make_run", lambda *a, **k: dataclasses.replace(make_run(*a, **k), scale=TINY))
    d = tmp_path / name
    (d / "docs").mkdir(parents=True)
    monkeypatch.setattr(sys, "argv", ["evaluation.py", "--grow-modes", "--quick", "--jobs", "1",
                                      "--cache-dir", str(d / "cache"), "--docs", str(d / "docs"),
                                      "--results", str(d / "evaluation.json"), *extra])
    t0 = time.monotonic()
    ev.main()
    return time.monotonic() - t0


def _cached(d: Path) -> dict[str, tuple]:
    """Every cache entry under ``d``: ``version/key -> (run, summary less its wall time, JCTs)``."""
    out = {}
    for p in sorted(d.glob("*/*.pkl")):
        run, (res, summary) = pickle.loads(p.read_bytes())
        out[f"{p.parent.name}/{p.name}"] = (run, {k: v for k, v in summary.items() if k != "wall_seconds"},
                                            [(j.name, j.jct) for j in res.jobs])
    return out


def _tables(d: Path) -> list[str]:
    return [ln for ln in (d / "docs" / "evaluation.md").read_text().splitlines() if ln.startswith("|")]


def _summaries(d: Path) -> list[dict]:
    runs = json.loads((d / "evaluation-grow.json").read_text())["runs"]
    return sorted(({k: v for k, v in r.items() if k != "wall_seconds"} for r in runs),
                  key=lambda r: (r["grow"], r["workload"]))


@pytest.mark.slurm
def test_the_grid_on_slurm_gives_the_local_run_s_keys_results_and_tables(devcluster, recorded,
                                                                        monkeypatch, tmp_path, capsys):
    version = rc.code_version()         # both runs under the code as it is now (the tasks check it)
    monkeypatch.setattr(runs_mod, "code_version", lambda: version)
    local = _evaluate(monkeypatch, tmp_path, "local")
    on_slurm = _evaluate(monkeypatch, tmp_path, "slurm", "--executor", "slurm", "--slurm-max-parallel", "2",
                         "--slurm-time", "10")
    text = capsys.readouterr().out
    assert len(recorded) == 1 and f"submitted 4 simulations as Slurm job array {recorded[0]} (4 tasks)" in text
    a, b = _cached(tmp_path / "local" / "cache"), _cached(tmp_path / "slurm" / "cache")
    assert len(a) == 4 and list(a) == list(b)                    # the same code version, the same keys
    assert a == b                                                # the same runs, summaries and JCTs
    assert _summaries(tmp_path / "local") == _summaries(tmp_path / "slurm")
    assert _tables(tmp_path / "local") and _tables(tmp_path / "local") == _tables(tmp_path / "slurm")
    assert not any((tmp_path / "slurm" / "cache" / "slurm").iterdir())    # the task files removed
    print(f"local {local:.1f} s, slurm {on_slurm:.1f} s", file=sys.stderr)


@pytest.mark.slurm
def test_a_task_that_fails_on_slurm_names_its_output(devcluster, recorded, tmp_path):
    cache = rc.RunCache(rc.code_version(), tmp_path)
    runs = {("grid", "static", "gpu", "1.0", 99): _run("pollux:99@1.0")}      # no such workload
    with pytest.raises(es.SlurmArrayError) as err:
        ev.execute_all(runs, 1, cache, es.SlurmOptions())
    out = es.output_path(next((tmp_path / "slurm").iterdir()), recorded[0], 0)
    assert str(err.value).splitlines()[1:] == [
        f"  task 0 (FAILED, exit code 1:0): static on pollux:99@1.0 (gpu, seed 0); output {out}",
        "    hpcsched.sim.workload.WorkloadError: pollux:99@1.0: no shipped workload 99; N is 1..8"]


@pytest.mark.slurm
def test_ctrl_c_cancels_the_array_on_slurm(devcluster, recorded, tmp_path, monkeypatch):
    def interrupt(seconds):
        raise KeyboardInterrupt
    monkeypatch.setattr(es, "_sleep", interrupt)      # Ctrl-C at the first wait
    cache = rc.RunCache(rc.code_version(), tmp_path)
    with pytest.raises(KeyboardInterrupt):
        ev.execute_all(_runs(2), 1, cache, es.SlurmOptions())   # full-size runs: a minute each
    job = recorded[0]
    for _ in range(50):
        got = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "JobID,State,ExitCode"],
                             capture_output=True, text=True, timeout=30).stdout
        states = {s for s, _ in es.parse_sacct(got, job).values()}
        if states == {"CANCELLED"}:
            break
        time.sleep(0.2)
    assert states == {"CANCELLED"}
    assert not re.search(rf"^{job}_", subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%i"],
                                                     capture_output=True, text=True).stdout, re.M)
