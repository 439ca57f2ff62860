"""hpcsched replay on the real dev cluster with the daemon deciding (issue 11's "must show").

A 3-job Pollux-format workload (bert on 1 GPU at batch 48, cifar10 on 1 GPU at 512, bert on 2
GPUs at 96; arrivals 0, 1000, 2000 s) at scale 0.004: arrivals 0, 4, 8 s, plus another user's
plain ncf job on 1 GPU at 6 s (the workload's ``rigid`` column: submitted with sbatch itself), and 58, 37 and 30 s
alone at the submitted size as the simulator counts them (a 3 s start included). These jobs
scale with more nodes: the simulator's jct policy, with the test daemon's settings (2 s rounds,
min_gain 0.02), grows each of them once, where it grows none of a cifar10/ncf mix on 1-2 GPUs
(it changes their batch sizes instead). The daemon runs with its default policy and grow mode; the replay
must end with every job COMPLETED, the daemon must have resized at least one of them, and
``hpcsched status`` must show its decisions with their reasons; ``--compare`` must write the
simulator's side.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest

from hpcsched.daemon.store import Store
from hpcsched.protocol.jobdir import JobDir, JobNotFound
from tests.conftest import cli, start_daemon, stop_daemon

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCALE = 0.004


def test_replay_with_the_daemon(devcluster, daemon_env, tmp_path):
    tmp, db = daemon_env
    cfg = Path(os.environ["HPCSCHED_CONFIG"])
    # the default policy, whole nodes: this tiny workload's jobs last seconds, and a job started
    # GPU-granular runs its fewest GPUs until an extension joins (tens of seconds on a loaded
    # machine), so they end before any resize; benchmarks/testbed.py replays at GPU granularity
    cfg.write_text(cfg.read_text().replace('[policy]\nname = "dp"\n', "")
                   .replace("[daemon]\n", '[daemon]\ngranularity = "node"\n'))
    tag = f"t{os.getpid()}"
    workload = tmp / "tiny.csv"
    workload.write_text("name,time,application,num_replicas,batch_size,rigid\n"
                        f"{tag}-bert-a,0,bert,1,48,0\n"
                        f"{tag}-cifar10-b,1000,cifar10,1,512,0\n"
                        f"{tag}-ncf-p,1500,ncf,1,256,1\n"      # another user's plain job
                        f"{tag}-bert-c,2000,bert,2,96,0\n")
    out = tmp / "run"
    proc = start_daemon(tmp)
    try:
        r = cli("hpcsched", "replay", str(workload), "--scale", str(SCALE), "--out", str(out),
                "--poll", "2", "--compare", check=False, timeout=540, cwd=tmp)
    finally:
        stop_daemon(proc)
        for name in ("bert-a", "cifar10-b", "ncf-p", "bert-c"):   # whatever happened: none left
            subprocess.run(["scancel", f"--name=replay-{tag}-{name}"], capture_output=True,
                           timeout=30)
    log = (tmp / "daemon.log").read_text()
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{log[-3000:]}"

    with (out / "jobs.csv").open() as f:
        rows = list(csv.DictReader(f))
    outputs = {row["job_id"]: out / f"slurm-{row['job_id']}.out" for row in rows}
    assert [row["final_state"] for row in rows] == ["COMPLETED"] * 4, (rows, log[-3000:], {
        j: p.read_text()[-3000:] for j, p in outputs.items() if p.exists()})
    assert all(float(row["jct"]) > 0 and row["job_id"] for row in rows), rows
    (summary,) = json.loads((out / "summary.json").read_text())["runs"]
    assert (summary["jobs"], summary["finished"], summary["unfinished"]) == (4, 4, 0)
    assert summary["avg_jct"] > 0 and summary["makespan"] >= max(float(r["jct"]) for r in rows)
    # the plain job went to sbatch itself: no hpcsched job directory, never resized
    plain = next(row for row in rows if row["rigid"] == "1")
    assert summary["plain_jobs"] == 1 and plain["name"].endswith("ncf-p")
    with pytest.raises(JobNotFound):
        JobDir.for_job(plain["job_id"])

    ids = [row["job_id"] for row in rows if row["rigid"] == "0"]
    store = Store(f"sqlite:///{db}")
    assert not store.actions(plain["job_id"]), "another user's job is never touched"
    resized = [a for j in ids for a in store.actions(j)
               if a.status == "running" and a.to_nodes != a.from_nodes]
    assert resized, ([(a.job_id, a.kind, a.from_nodes, a.to_nodes, a.status)
                      for a in store.actions()], log[-4000:])

    job = resized[0].job_id
    status = json.loads(cli("hpcsched", "status", "--json", job).stdout)
    (row,) = status["jobs"]
    assert row["decisions"] and all(d["reason"] for d in row["decisions"]), row["decisions"]
    assert any(d["kind"] == resized[0].kind for d in row["decisions"])

    doc = json.loads((out / "compare.json").read_text())
    real, sim = doc["runs"]
    assert real["policy"] == "real" and sim["policy"].startswith("simulated (")
    assert sim["jobs"] == 4 and sim["plain_jobs"] == 1 and (out / "jct-cdf.png").exists()
    assert "real vs simulated" in r.stdout
