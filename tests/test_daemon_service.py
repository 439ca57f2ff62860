"""The daemon as a service: one per cluster (lock), clean stop on SIGTERM, reload on SIGHUP (a
bad file keeps the old configuration), clear configuration errors. Slurm is deliberately
unreachable here (SLURM_CONF points nowhere): every round fails, is recorded, and the daemon
stays up."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsched.daemon.store import Store
from tests.conftest import wait_for

EXE = str(Path(sys.executable).parent / "hpcsched")


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    monkeypatch.setenv("HPCSCHED_CONTROL_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("HPCSCHED_DATABASE_URL", f"sqlite:///{tmp_path}/db.sqlite")
    cfg = tmp_path / "hpcsched.toml"
    # slurm_timeout 1 s: Slurm never answers here (squeue and scontrol retry a missing
    # SLURM_CONF for 60 s), so every Slurm call ends on the timeout whatever its length; each
    # round (and the partitions' check at start and at a reload) then waits 1 s, not 5
    cfg.write_text(f'[daemon]\nround_interval = 60\nlock_file = "{tmp_path}/lock"\n'
                   'slurm_timeout = 1\n[policy]\nname = "dp"\n')
    return tmp_path, cfg


def _rounds(tmp_path):
    """Finished rounds, newest first."""
    try:
        return [r for r in Store(f"sqlite:///{tmp_path}/db.sqlite").rounds(100)
                if r.duration is not None]
    except Exception:  # not created yet
        return []


def test_one_daemon_per_cluster_and_clean_stop(env):
    tmp_path, cfg = env
    log = open(tmp_path / "a.log", "wb")
    a = subprocess.Popen([EXE, "-v", "daemon", "--config", str(cfg)], stdout=log, stderr=log)
    try:
        wait_for(lambda: _rounds(tmp_path), 60, "the first round")
        r = _rounds(tmp_path)[0]
        assert r.error and "Slurm" in r.error and r.actions == 0
        b = subprocess.run([EXE, "daemon", "--config", str(cfg), "--once"], capture_output=True,
                           text=True, timeout=60)
        assert b.returncode == 1 and "another hpcsched daemon holds" in b.stderr
        assert f"pid {a.pid}" in b.stderr
        assert a.poll() is None
        t = time.monotonic()
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=10) == 0
        assert time.monotonic() - t < 5, "SIGTERM waited for the 60 s interval"
    finally:
        if a.poll() is None:
            a.kill()
    assert "SIGTERM: stopping after this round" in (tmp_path / "a.log").read_text()


def test_sighup_reloads_and_a_bad_file_keeps_the_old_configuration(env):
    tmp_path, cfg = env
    log_path = tmp_path / "a.log"
    a = subprocess.Popen([EXE, "-v", "daemon", "--config", str(cfg)],
                         stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _rounds(tmp_path), 60, "the first round")
        good = cfg.read_text()
        cfg.write_text(good + "bogus_key = 1\n")
        a.send_signal(signal.SIGHUP)
        wait_for(lambda: "configuration not reloaded" in log_path.read_text(), 30, "the refusal")
        assert "bogus_key" in log_path.read_text() and a.poll() is None
        cfg.write_text(good.replace('name = "dp"', 'name = "static"'))
        a.send_signal(signal.SIGHUP)
        wait_for(lambda: any(r.policy == "static" for r in _rounds(tmp_path)), 30,
                 "a round with the reloaded policy")
        assert "configuration reloaded (policy static" in log_path.read_text()
    finally:
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=10)


@pytest.mark.parametrize("content,message", [
    ("[daemon]\nround_intervall = 5\n", "round_intervall"),
    ("[daemon]\nround_interval = -1\n", "round_interval"),
    ('[policy]\nname = "nope"\n', "nope"),
    ("[daemon\n", "TOML"),
])
def test_configuration_errors_are_one_clear_line(env, content, message):
    tmp_path, cfg = env
    cfg.write_text(content)
    r = subprocess.run([EXE, "daemon", "--config", str(cfg), "--once"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("Error: ") and message in r.stderr, r.stderr
