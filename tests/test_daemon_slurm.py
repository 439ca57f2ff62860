"""The daemon on the real dev cluster.

Three jobs of different sizes share 8 GPUs (a foreign job holds the other two nodes):
A (2 nodes) does not scale, B (1 node) scales with GPUs, C (1 node, fixed) gains from a larger
batch. The daemon (dp policy), running on its own, must shrink A, grow B and change C's batch
size; every job must finish with exact sample accounting; the store and ``hpcsched status``
must show each decision with its reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.jobdir import JobDir
from hpcsched.store import Store

from .conftest import EXAMPLE, cli, wait_for
from .jobrecords import check_exactly_once, load_records

DIGITS = 1797
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


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


def test_daemon_shrinks_grows_and_changes_batch_size(daemon_env, blocker, slurm_jobs):
    tmp_path, db = daemon_env
    a = submit(tmp_path, "-N", "2", "--gres=gpu:2", "--hpcsched-max-nodes", "2",
               "--hpcsched-batch-size", "96", str(EXAMPLE), "--epochs", "40", "--min-step-time", "0.1")
    b = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-max-nodes", "2",
               "--hpcsched-batch-size", "96", str(EXAMPLE), "--epochs", "40", "--sample-time", "0.002")
    c = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-batch-size", "32",
               "--hpcsched-max-batch-size", "128", str(EXAMPLE), "--epochs", "25",
               "--min-step-time", "0.05")
    jobs = [a, b, c]
    slurm_jobs.extend(jobs)
    proc = start_daemon(tmp_path)
    try:
        infos = wait_for(lambda: finished(jobs), 400, "the three jobs to finish", interval=2)
    finally:
        stop_daemon(proc)
    log = (tmp_path / "daemon.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    for j in jobs:
        out = (tmp_path / f"slurm-{j}.out").read_text()
        assert infos[j].state == "COMPLETED", out[-2000:]
    store = Store(f"sqlite:///{db}")
    acts = {j: [(x.kind, x.from_nodes, x.to_nodes, x.from_batch_size, x.to_batch_size, x.status)
                for x in store.actions(j)] for j in jobs}
    assert ("shrink", 2, 1, 96, 96, "observed") in acts[a], (acts, log[-4000:])
    assert ("grow", 1, 2, 96, 96, "observed") in acts[b], (acts, log[-4000:])
    assert ("batch", 1, 1, 32, 128, "observed") in acts[c], (acts, log[-4000:])
    for x in store.actions():
        assert x.reason.startswith("dp: predicted") and "samples/s" in x.reason
    for j, epochs in ((a, 40), (b, 40), (c, 25)):
        check_exactly_once(load_records(JobDir.for_job(j).path), DIGITS, epochs)
    rounds = store.rounds(limit=1000)
    assert rounds and all(r.error is None for r in rounds)
    quiet = [r for r in rounds if r.actions == 0]
    assert quiet and max(r.slurm_calls for r in quiet) <= 3

    status = json.loads(cli("hpcsched", "status", "--json", b).stdout)
    (row,) = status["jobs"]
    grow = [d for d in row["decisions"] if d["kind"] == "grow"]
    assert grow and grow[0]["status"] == "observed" and "samples/s" in grow[0]["reason"]
    assert row["profile"], "status shows no throughput profile"
    table = cli("hpcsched", "status").stdout
    assert "grow" in table and "shrink" in table
