"""The daemon at its default (GPU) granularity on the real dev cluster: a plan of 4 + 2 GPUs on
two nodes, one of them half-used by another user's job, made real by an extension job, and a
later shrink made by releasing that extension (hpcsched/policies/realise.py); the primary's
workers never restart and every sample is trained on exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.protocol.jobdir import JobDir
from tests.conftest import (
    cli,
    daemon_store,
    finished,
    paced,
    start_daemon,
    stop_daemon,
    submit,
    unpace_when,
    wait_for,
)
from tests.jobrecords import check_exactly_once, epochs_trained, load_records

DIGITS = 1797
EPOCHS_A = 120   # A runs on n1:4,n2:2 after about 20 s, is released for B at about 26 s, ends at about
#                  120 s alone (a margin for the suite's three clusters side by side on 2 cores)
#                  if all paced; it ends with its epoch in progress once B has ended (conftest.unpace)
EMULATED = Path(__file__).resolve().parent.parent / "jobscripts" / "examples" / "emulated.py"
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _layouts(store, job: str) -> list[tuple[str, str, str]]:
    """The job's journal: ``(kind, layout, status)``, oldest first."""
    return [(a.kind, ",".join(a.placement), a.status) for a in reversed(store.actions(job))]


def test_4_plus_2_gpus_beside_a_foreign_job_then_a_release(daemon_env, blocker, slurm_jobs,
                                                           monkeypatch):
    """n3 and n4 are held (``blocker``), and another user's job holds 2 GPUs of n2. A (1 node x
    4 GPUs, up to 2 nodes) is grown by ``jct`` onto n2's 2 free GPUs: 4 + 2, by an extension job.
    Then B (2 GPUs, far less work) is submitted: nothing is free, and the plan starts it by
    shrinking A back to n1's 4 GPUs, a release of the extension, no checkpoint."""
    monkeypatch.setenv("HPCSCHED_GRAD_NOISE", "0")   # goodput = throughput (test_daemon_slurm)
    tmp_path, db = daemon_env
    cfg = Path(os.environ["HPCSCHED_CONFIG"])
    cfg.write_text(cfg.read_text().replace('[policy]\nname = "dp"\n', ""))   # the defaults
    foreign = subprocess.run(["sbatch", "--parsable", "-w", "n2", "--gres=gpu:2",
                              f"--output={tmp_path}/foreign.out", "--wrap", "sleep 900"],
                             capture_output=True, text=True, check=True).stdout.strip()
    slurm_jobs.append(foreign)
    wait_for(lambda: (i := slurm.job_info(foreign)) and i.state == "RUNNING", 60, "the foreign job")
    a = submit(tmp_path, "-N", "1", "--gres=gpu:4", "--hpcsched-max-nodes", "2",
               "--hpcsched-batch-size", "96", *paced(tmp_path / "unpaced"), "--epochs", str(EPOCHS_A),
               "--sample-time", "0.002")
    slurm_jobs.append(a)
    proc = start_daemon(tmp_path)
    t0 = time.time()
    try:
        store = daemon_store(tmp_path, db)
        wait_for(lambda: ("reform", "n1:4,n2:2", "running") in _layouts(store, a), 240,
                 "A to run on n1:4,n2:2")
        t_grown = time.time() - t0
        # B trains an application with a prior (ncf, emulated): the plan knows its rate before
        # it runs, and its work is far shorter than A's
        b = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-application", "ncf",
                   "--hpcsched-batch-size", "256", str(EMULATED), "--application", "ncf",
                   "--scale", "0.002")
        slurm_jobs.append(b)
        wait_for(lambda: ("reform", "n1:4", "running") in _layouts(store, a), 240,
                 "A's extension released for B")
        t_released = time.time() - t0
        # what is checked while A runs has happened: once B has ended and the daemon has grown
        # A back onto n2's free GPUs (or not, within 60 s), A ends with its epoch in progress
        wait_for(lambda: finished([b]), 400, "B to finish", interval=1)
        unpace_when(tmp_path / "unpaced", lambda: finished([a]) or (_layouts(store, a).count(
            ("reform", "n1:4,n2:2", "running")) > 1 and not store.open_actions()), 60)
        infos = wait_for(lambda: finished([a, b]), 400, "A and B to finish", interval=2)
        t_done = time.time() - t0
    finally:
        stop_daemon(proc)
    print(f"A on n1:4,n2:2 after {t_grown:.0f} s, released for B after {t_released:.0f} s, "
          f"both done after {t_done:.0f} s")
    log = (tmp_path / "daemon.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    for j in (a, b):
        assert infos[j].state == "COMPLETED", (tmp_path / f"slurm-{j}.out").read_text()[-2000:]
    acts = [x for x in store.actions(a) if x.kind == "reform" and x.status == "running"]
    assert [x.mechanism for x in reversed(acts)][:2] == ["extend", "release"], \
        [(x.mechanism, x.reason) for x in acts]
    assert not [x for x in store.actions(a) if x.kind in ("grow", "shrink", "preempt")], \
        _layouts(store, a)
    # the primary's workers ran throughout: one process per rank file, no second launch
    jd = JobDir.for_job(a)
    for f in jd.metrics_dir.glob("launch-1-rank-*.jsonl"):
        assert len({json.loads(line)["pid"] for line in f.read_text().splitlines()}) == 1, f
    assert not list(jd.metrics_dir.glob("launch-2-*"))
    recs = load_records(jd.path)
    check_exactly_once(recs, DIGITS, epochs_trained(recs, EPOCHS_A))
    # status shows the layouts the plan gave, with their mechanism
    detail = cli("hpcsched", "status", a).stdout
    assert "reform by extend: 1->2 node(s) (n1:4,n2:2)" in detail, detail
    assert "reform by release: 2->1 node(s) (n1:4)" in detail, detail
