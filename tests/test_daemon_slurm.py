"""The daemon on the real dev cluster.

Three jobs of different sizes share 8 GPUs (a foreign job holds the other two nodes):
A (2 nodes) does not scale, B (1 node) scales with GPUs, C (1 node, fixed) gains from a larger
batch. The daemon, running on its own, must grow B and change C's batch size (with ``dp`` also
shrink A); every job must finish with exact sample accounting; the store and ``hpcsched status``
must show each decision with its reason.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.daemon.store import Store
from hpcsched.protocol.jobdir import JobDir
from tests.conftest import EXAMPLE, cli, finished, start_daemon, stop_daemon, submit, wait_for
from tests.jobrecords import check_exactly_once, load_records

DIGITS = 1797
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.mark.parametrize("policy", ["dp", "default"])
def test_daemon_shrinks_grows_and_changes_batch_size(daemon_env, blocker, slurm_jobs, policy,
                                                     monkeypatch):
    """``default`` runs the daemon's default policy (``jct``: heSRPT-weighted speedups over
    the fair share, by the DP's exact search) with no [policy] table at all, and the daemon's default grow: B
    grows by an extension allocation (a ``reform``), no worker restarted; ``dp`` runs with
    ``daemon.grow = "requeue"``: B grows by checkpoint, requeue and restart.

    The jobs measure no gradient noise (``HPCSCHED_GRAD_NOISE=0``, exported to them by sbatch):
    with it, whether a larger batch pays depends on the noise scale measured by then, which
    varies from run to run on a loaded machine (ones-pal kept every job as it was in one CI run
    in six); without it goodput is throughput, and the changes expected below are what the
    policies' model predicts from the measured step times alone."""
    monkeypatch.setenv("HPCSCHED_GRAD_NOISE", "0")
    tmp_path, db = daemon_env
    cfg = Path(os.environ["HPCSCHED_CONFIG"])
    if policy == "default":
        cfg.write_text(cfg.read_text().replace('[policy]\nname = "dp"\n', ""))
    else:
        cfg.write_text(cfg.read_text().replace("[daemon]\n", '[daemon]\ngrow = "requeue"\n'))
    prefix = {"dp": "dp: predicted", "default": "jct: "}[policy]
    grow = "reform" if policy == "default" else "grow"
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
    if policy == "dp":   # throughput: A's GPUs go to B
        assert ("shrink", 2, 1, 96, 96, "running") in acts[a], (acts, log[-4000:])
    # jct weighs each job's goodput by 1 / its remaining work, and A, measured at one size
    # only, is predicted to slow down on fewer nodes, so it may keep them: B grows when room
    # appears
    if policy == "dp":
        assert (grow, 1, 2, 96, 96, "running") in acts[b], (acts, log[-4000:])
    else:   # GPU-granular: B's extension takes the free GPUs of its own node first
        grown = [x for x in store.actions(b) if x.kind == grow and x.status == "running"]
        assert grown and sum(int(p.split(":")[1]) for p in grown[0].placement) > 2, \
            (acts, log[-4000:])
        assert grown[0].mechanism == "extend", (grown[0].mechanism, grown[0].reason)
    assert ("batch", 1, 1, 32, 128, "running") in acts[c], (acts, log[-4000:])
    for x in store.actions():
        assert x.reason.startswith(prefix) and "samples/s" in x.reason, x.reason
    for j, epochs in ((a, 40), (b, 40), (c, 25)):
        check_exactly_once(load_records(JobDir.for_job(j).path), DIGITS, epochs)
    rounds = store.rounds(limit=1000)
    assert rounds and all(r.error is None for r in rounds)
    # a round that neither decided a change nor advanced one observes only: at most 3 calls
    # (squeue + sinfo, and squeue -o %Y while another user's job waits with a planned start); steps of
    # open resizes (scontrol requeue/update) happen in later rounds
    steps = [t for x in store.actions() for _, t in x.history]
    quiet = [r for r in rounds if r.actions == 0 and not any(
        r.started_at <= t <= r.started_at + r.duration for t in steps)]
    assert quiet and max(r.slurm_calls for r in quiet) <= 3

    status = json.loads(cli("hpcsched", "status", "--json", b).stdout)
    (row,) = status["jobs"]
    grown = [d for d in row["decisions"] if d["kind"] == grow]
    assert grown and grown[0]["status"] == "running" and "samples/s" in grown[0]["reason"]
    assert row["profile"], "status shows no throughput profile"
    table = cli("hpcsched", "status", "--all").stdout
    assert grow in table and "batch" in table and (policy != "dp" or "shrink" in table)
    if policy == "default":   # B's first workers ran throughout; its extension has ended
        jd = JobDir.for_job(b)
        assert len({json.loads(line)["pid"] for line in
                    (jd.metrics_dir / "launch-1-rank-0.jsonl").read_text().splitlines()}) == 1 and \
            not list(jd.metrics_dir.glob("launch-2-*"))
        ext = json.loads(jd.extensions_path.read_text())["extensions"]
        assert ext and all(e["state"] in ("released", "refused") for e in ext), ext


def test_dry_run_decides_and_logs_but_never_acts(daemon_env, blocker, slurm_jobs):
    tmp_path, db = daemon_env
    # the job is measured seconds after it starts: without this, the no-thrash hold (3 rounds
    # of 2 s) keeps it at its size in the rounds below, as it should
    cfg = Path(os.environ["HPCSCHED_CONFIG"])
    cfg.write_text(cfg.read_text().replace("[daemon]\n", "[daemon]\nhold_rounds = 0\n"))
    job = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-max-nodes", "2",
                 "--hpcsched-batch-size", "96", str(EXAMPLE), "--epochs", "30",
                 "--sample-time", "0.002")
    slurm_jobs.append(job)
    jd = None

    def measured():
        nonlocal jd
        jd = jd or JobDir.for_job(job)
        return len(load_records(jd.path)) > 40

    wait_for(measured, 120, "the job to report some steps")
    for _ in range(2):
        r = cli("hpcsched", "-v", "daemon", "--once", "--dry-run")
    # GPU-granular (the default): 2 -> 4 GPUs, packed on its node or beside it
    assert f"job {job} would grow: 1 -> " in r.stderr and "2 -> 4 GPU(s)" in r.stderr, \
        r.stderr[-3000:]
    store = Store(f"sqlite:///{db}")
    assert store.actions(job) == [] and all(x.dry_run for x in store.rounds())
    info = slurm.job_info(job)
    assert (info.node_count, info.restarts) == (1, 0)
