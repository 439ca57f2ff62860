"""Shared fixtures. Tests marked ``slurm`` run against the real local dev cluster
(``hpcsched devcluster up``: slurmctld, 4 x slurmd with gpu:4 GRES, slurmdbd + MariaDB), which
this fixture starts when it is not up and stops again at the end if it started it
(set ``HPCSCHED_KEEP_DEVCLUSTER=1`` to keep it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsched import slurm

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "jobscripts" / "examples" / "digits_mlp.py"


@pytest.fixture(scope="session")
def devcluster():
    """The dev cluster's slurm.conf path; SLURM_CONF is exported for every subprocess."""
    from hpcsched.slurm import devcluster as dc

    state = dc.default_state_dir()
    was_up = dc.is_up(state)
    if not was_up and os.geteuid() != 0:
        pytest.skip("the dev cluster is down and starting it needs root")
    conf = dc.up(state)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    yield conf
    if not was_up and os.environ.get("HPCSCHED_KEEP_DEVCLUSTER") != "1":
        dc.down(state)
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


@pytest.fixture
def control_dir(tmp_path, monkeypatch):
    """A fresh HPCSCHED_CONTROL_DIR for the test (the dev cluster's nodes share this disk)."""
    d = tmp_path / "jobs"
    monkeypatch.setenv("HPCSCHED_CONTROL_DIR", str(d))
    return d


@pytest.fixture
def slurm_jobs():
    """Collects Slurm job ids to cancel when the test ends, whatever happened."""
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30)


def cli(*args: str, timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run an hpcsched console script (``hpcsched``/``hpcsub``) as a user would."""
    exe = Path(sys.executable).parent / args[0]
    proc = subprocess.run([str(exe), *args[1:]], capture_output=True, text=True,
                          timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ------------------------------------------------------------------ the daemon, for real
@pytest.fixture
def daemon_env(tmp_path, control_dir, monkeypatch):
    db = tmp_path / "hpcsched.db"
    monkeypatch.setenv("HPCSCHED_DATABASE_URL", f"sqlite:///{db}")
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text(f'[daemon]\nround_interval = 2.0\nlock_file = "{tmp_path}/daemon.lock"\n'
                   'restart_cost = 5.0\nmin_gain = 0.02\n[policy]\nname = "dp"\n')
    monkeypatch.setenv("HPCSCHED_CONFIG", str(cfg))
    return tmp_path, db


def start_daemon(tmp_path: Path, log_name: str = "daemon.log") -> subprocess.Popen:
    exe = Path(sys.executable).parent / "hpcsched"
    log = open(tmp_path / log_name, "ab")
    return subprocess.Popen([str(exe), "-v", "daemon"], stdout=log, stderr=subprocess.STDOUT)


def stop_daemon(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def submit(tmp_path, *args) -> str:
    out = cli("hpcsub", "--parsable", f"--output={tmp_path}/slurm-%j.out", "--hpcsched-record-samples",
              *args, cwd=tmp_path)
    return out.stdout.strip()


@pytest.fixture
def blocker(devcluster, slurm_jobs, tmp_path):
    """A non-hpcsched job holding n3 and n4 (8 GPUs) for the whole test."""
    out = subprocess.run(["sbatch", "--parsable", "-N2", "-w", "n[3-4]", "--gres=gpu:4",
                          f"--output={tmp_path}/blocker.out", "--wrap", "sleep 900"],
                         capture_output=True, text=True, check=True)
    job = out.stdout.strip()
    slurm_jobs.append(job)
    wait_for(lambda: (i := slurm.job_info(job)) and i.state == "RUNNING", 60, "the blocker job")
    return job


def finished(job_ids):
    infos = slurm.squeue()
    return all(infos.get(j) is not None and not infos[j].active for j in job_ids) and infos
