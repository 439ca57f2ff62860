"""hpcsched replay on the real dev cluster with the daemon deciding (issue 11's "must show").

A 3-job Pollux-format workload (cifar10 on 1 GPU, ncf on 1 GPU, cifar10 on 2 GPUs; arrivals
0, 200, 400 s) at scale 0.015: arrivals 0, 3, 6 s, and about 60, 22 and 35 s of emulated work
alone at the submitted size. The daemon runs with its default policy and grow mode; the replay
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
from tests.conftest import cli, start_daemon, stop_daemon

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCALE = 0.015


def test_replay_with_the_daemon(devcluster, daemon_env, tmp_path):
    tmp, db = daemon_env
    cfg = Path(os.environ["HPCSCHED_CONFIG"])
    cfg.write_text(cfg.read_text().replace('[policy]\nname = "dp"\n', ""))   # default policy
    tag = f"t{os.getpid()}"
    workload = tmp / "tiny.csv"
    workload.write_text("name,time,application,num_replicas,batch_size\n"
                        f"{tag}-cifar10-a,0,cifar10,1,128\n"
                        f"{tag}-ncf-b,200,ncf,1,256\n"
                        f"{tag}-cifar10-c,400,cifar10,2,256\n")
    out = tmp / "run"
    proc = start_daemon(tmp)
    try:
        r = cli("hpcsched", "replay", str(workload), "--scale", str(SCALE), "--out", str(out),
                "--poll", "2", "--compare", check=False, timeout=540, cwd=tmp)
    finally:
        stop_daemon(proc)
        for name in ("cifar10-a", "ncf-b", "cifar10-c"):   # whatever happened: no job left
            subprocess.run(["scancel", f"--name=replay-{tag}-{name}"], capture_output=True,
                           timeout=30)
    log = (tmp / "daemon.log").read_text()
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{log[-3000:]}"

    with (out / "jobs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [row["final_state"] for row in rows] == ["COMPLETED"] * 3, (rows, log[-3000:])
    assert all(float(row["jct"]) > 0 and row["job_id"] for row in rows), rows
    (summary,) = json.loads((out / "summary.json").read_text())["runs"]
    assert (summary["jobs"], summary["finished"], summary["unfinished"]) == (3, 3, 0)
    assert summary["avg_jct"] > 0 and summary["makespan"] >= max(float(r["jct"]) for r in rows)

    ids = [row["job_id"] for row in rows]
    store = Store(f"sqlite:///{db}")
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
    assert sim["jobs"] == 3 and (out / "jct-cdf.png").exists()
    assert "real vs simulated" in r.stdout
