"""A good neighbour on the real dev cluster (issue 37's scenario): two hpcsub jobs grow by
extension over the whole cluster; another user's plain ``sbatch -N 2 --gres=gpu:4`` job then
waits at most a round and the extensions' release, not until an elastic job ends; the elastic
jobs keep running, smaller, and lose no sample."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.daemon.views import JobFacts, foreign_pending, job_view, plans_unread
from hpcsched.model.snapshot import ClusterSnapshot
from hpcsched.policies.neighbours import yield_to_foreign
from hpcsched.protocol.extensions import parse_extension_comment
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.limits import JobLimits
from hpcsched.slurm.observe import SlurmCLIBackend
from tests.conftest import (
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
ROUND = 5.0
EPOCHS = 100     # grown over all 4 nodes after about 40 s, done after about 120 s if all paced
pytestmark = [pytest.mark.slurm]


def _nodes_held(infos, primaries) -> set[str]:
    """Nodes where the elastic jobs or their extension jobs hold GPUs."""
    held = set()
    for i in infos.values():
        tag = parse_extension_comment(i.comment)
        if i.state == "RUNNING" and (i.job_id in primaries or (tag and tag[0] in primaries)):
            held |= set(slurm.expand_hostlist(i.nodes))
    return held


def _sbatch(tmp_path: Path, *args: str) -> str:
    return subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/%j.out", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.slow   # backfill plans every bf_interval (30 s by default)
def test_the_free_gpus_slurm_plans_a_waiting_job_onto_are_kept(devcluster, slurm_jobs, tmp_path):
    """Slurm 22.05's backfill plans another user's 4 x 4 job, which waits for a job on n2, onto
    n[1-4]: the daemon reads that plan (a third ``squeue``, ``%Y``) and the planner keeps
    the 12 free GPUs of n1, n3 and n4 for it, where Slurm would start no extension job that
    outlives the planned start (hpcsched.policies.neighbours); and so for the same job as
    one of hpcsched's own, whose view carries the plan."""
    slurm_jobs.append(_sbatch(tmp_path, "-N1", "-w", "n2", "--gres=gpu:4", "--time=5",
                              "--wrap", "sleep 300"))
    big = _sbatch(tmp_path, "-N4", "--gres=gpu:4", "--time=5", "--wrap", "sleep 1")
    slurm_jobs.append(big)
    backend = SlurmCLIBackend(plans_max_age=0)   # each look a fresh read

    def planned():
        obs = backend.observe()   # as the daemon's round: more only for a plan it cannot see
        return plans_unread(obs) and (o := backend.with_planned_nodes(obs)).jobs[big].scheduled_nodes and o

    obs = wait_for(planned, 90, "Slurm's backfill to plan the 4-node job")
    assert obs.calls == 3 and obs.jobs[big].start_time and obs.jobs[big].scheduled_nodes == "n[1-4]"
    (f,) = foreign_pending(obs, mine=())
    assert (f.job_id, f.scheduled_nodes) == (big, ("n1", "n2", "n3", "n4"))
    snapshot = ClusterSnapshot(obs.time, obs.nodes, (), granularity="gpu", foreign_pending=(f,))
    assert sum(n.gpus_free for n in snapshot.nodes) == 12
    planned, releases, notes = yield_to_foreign(snapshot)
    assert releases == [] and sum(n.gpus_free for n in planned.nodes) == 0
    assert "12 free GPU(s) kept for them (12 on nodes Slurm plans them onto)" in notes[0], notes
    # the same waiting job as one of hpcsched's own: its view carries the plan, and the same
    # 12 GPUs are kept out of grows, whose extension jobs Slurm would not start there
    own = job_view(JobFacts(info=obs.jobs[big], limits=JobLimits(4, 1, 4, 32, 4096, 64, 128),
                            nodes=4, batch_size=128, generation=0, submit_time=0.0,
                            application="sleep"))
    assert own.scheduled_nodes == ("n1", "n2", "n3", "n4") and own.slurm_priority > 0
    snapshot = replace(snapshot, jobs=(own,), foreign_pending=())
    planned, releases, notes = yield_to_foreign(snapshot)
    assert releases == [] and sum(n.gpus_free for n in planned.nodes) == 0
    assert notes == [f"hpcsched's pending jobs: 12 free GPU(s) kept on the nodes Slurm plans them "
                     f"onto, where no grow's extension job would start: {big} (12)"], notes


@pytest.mark.slow
def _two_elastic_jobs(tmp_path: Path, slurm_jobs, monkeypatch, settings: str = "") -> list[str]:
    """The issue's scenario: the default policy, ``ROUND``-s rounds (and ``settings``, more
    lines of ``[daemon]``), and two hpcsub jobs of 1 node x 2 GPUs that may grow to 16."""
    monkeypatch.setenv("HPCSCHED_GRAD_NOISE", "0")
    cfg = Path(os.environ["HPCSCHED_CONFIG"])
    cfg.write_text(cfg.read_text().replace('[policy]\nname = "dp"\n', "")
                   .replace("round_interval = 2.0", f"round_interval = {ROUND}\n{settings}"))
    elastic = [submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-max-gpus", "16",
                      "--hpcsched-batch-size", "96", *paced(tmp_path / "unpaced"),
                      "--epochs", str(EPOCHS), "--sample-time", "0.002") for _ in range(2)]
    slurm_jobs.extend(elastic)
    return elastic


def _all_done_exactly_once(infos, elastic: list[str], plain: str) -> None:
    """Every job completed, and each elastic job trained every sample of its epochs once."""
    for j in elastic + [plain]:
        assert infos[j].state == "COMPLETED", j
    for j in elastic:
        recs = load_records(JobDir.for_job(j).path)
        check_exactly_once(recs, DIGITS, epochs_trained(recs, EPOCHS))


def test_a_plain_job_waits_a_round_not_an_elastic_job(daemon_env, devcluster, slurm_jobs,
                                                      monkeypatch):
    tmp_path, db = daemon_env
    elastic = _two_elastic_jobs(tmp_path, slurm_jobs, monkeypatch)
    proc = start_daemon(tmp_path)
    t0 = time.time()
    try:
        store = daemon_store(tmp_path, db)
        # grown over all 4 nodes, and no resize in flight (the scenario: they had grown)
        wait_for(lambda: len(_nodes_held(slurm.squeue(), set(elastic))) == 4
                 and not store.open_actions(), 240, "the elastic jobs to grow over all 4 nodes")
        grown = time.time() - t0
        plain = subprocess.run(["sbatch", "--parsable", "-N", "2", "--gres=gpu:4",
                                f"--output={tmp_path}/plain.out", "--wrap", "sleep 10"],
                               capture_output=True, text=True, check=True).stdout.strip()
        slurm_jobs.append(plain)
        submitted = time.time()
        wait_for(lambda: (i := slurm.job_info(plain)) and i.state in ("RUNNING", "COMPLETED"),
                 120, "the plain job to start")
        waited = time.time() - submitted
        running = slurm.squeue()
        # what is checked while the jobs run has happened: once the plain job has ended and no
        # resize is in flight, the elastic jobs end with their epoch in progress
        unpace_when(tmp_path / "unpaced", lambda: finished(elastic) or (
            finished([plain]) and not store.open_actions()), 300)
        infos = wait_for(lambda: finished(elastic + [plain]), 600, "every job to finish",
                         interval=2)
        done = time.time() - t0
    finally:
        stop_daemon(proc)
    print(f"grown over 4 nodes after {grown:.0f} s; the plain job waited {waited:.1f} s; "
          f"all done after {done:.0f} s")
    log = (tmp_path / "daemon.log").read_text()
    assert waited <= 15.0, (waited, log[-4000:])
    assert all(running[j].state == "RUNNING" for j in elastic), running   # smaller, running
    assert "yields GPU(s) to other users' pending jobs" in log, log[-4000:]
    _all_done_exactly_once(infos, elastic, plain)
    for j in elastic:
        # each resize is one line of the job's own output (issue 34: users see it)
        lines = [ln for ln in (tmp_path / f"slurm-{j}.out").read_text().splitlines()
                 if ln.startswith("hpcsched: generation ")]
        assert lines and all(" GPU(s) on " in ln and "global batch" in ln for ln in lines), lines


def test_gpus_kept_free_start_a_plain_job_at_once_and_are_kept_again(daemon_env, devcluster,
                                                                      slurm_jobs, monkeypatch):
    """``daemon.keep_free_gpus = 4``: the two hpcsub jobs grow by extension over three nodes,
    not four; another user's plain 1 x 4 job starts on the fourth at once, with nothing to
    release for it; while it runs, a later round releases a lent node so that a node's 4 GPUs
    are free again. The elastic jobs train every sample exactly once."""
    tmp_path, db = daemon_env
    elastic = _two_elastic_jobs(tmp_path, slurm_jobs, monkeypatch, "keep_free_gpus = 4")
    proc = start_daemon(tmp_path)
    log = tmp_path / "daemon.log"
    try:
        store = daemon_store(tmp_path, db)
        wait_for(lambda: len(_nodes_held(slurm.squeue(), set(elastic))) == 3
                 and not store.open_actions(), 240, "the elastic jobs to grow over 3 nodes")
        time.sleep(2 * ROUND)    # and no further: two more rounds keep the fourth node free
        assert len(_nodes_held(slurm.squeue(), set(elastic))) == 3, log.read_text()[-4000:]
        plain = _sbatch(tmp_path, "-N", "1", "--gres=gpu:4", "--wrap", "sleep 30")
        slurm_jobs.append(plain)
        submitted = time.time()
        wait_for(lambda: (i := slurm.job_info(plain)) and i.state in ("RUNNING", "COMPLETED"),
                 60, "the plain job to start")
        waited = time.time() - submitted
        # the rounds while it runs free a lent node again
        wait_for(lambda: len(_nodes_held(slurm.squeue(), set(elastic) | {plain})) < 4, 25,
                 "a lent node to be released while the plain job runs", interval=0.5)
        unpace_when(tmp_path / "unpaced", lambda: finished(elastic) or not store.open_actions(),
                    300)
        infos = wait_for(lambda: finished(elastic + [plain]), 600, "every job to finish",
                         interval=2)
    finally:
        stop_daemon(proc)
    text = log.read_text()
    print(f"the plain job waited {waited:.1f} s")
    assert waited <= 5.0 and "yields GPU(s) to other users' pending jobs" not in text, (
        waited, text[-4000:])
    assert "keeps GPU(s) free for other users' next jobs" in text, text[-4000:]
    _all_done_exactly_once(infos, elastic, plain)
