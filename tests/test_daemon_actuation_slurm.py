"""The daemon's round never waits for a job, on the real dev cluster.

Two elastic jobs get a change in the same round: A (fast steps) grows from 1 to 2 nodes (a
requeue), B (one step every 15 s) doubles its batch size. The round that decides returns at
once, while B has not acknowledged; later rounds (1 s apart) each advance both actions one step
on the round's own observation, and both reach ``running`` in the journal. The decision is
fixed (``decide_round`` replaced), so the test does not depend on a policy's model.
"""

from __future__ import annotations

import time

import pytest

from hpcsched import slurm
from hpcsched.daemon import round as daemon_round
from hpcsched.daemon.config import load
from hpcsched.daemon.phases import PATHS
from hpcsched.daemon.round import Daemon
from hpcsched.daemon.store import Store
from hpcsched.policies.reconcile import Change
from hpcsched.policies.round import RoundDecision
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import ChangeKind
from tests.conftest import EXAMPLE, submit, wait_for
from tests.jobrecords import load_records

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLOW_STEP_S = 15.0   # time enough for rounds that see A in its requeue while B has not answered


def _acked(job_id: str):
    jd = JobDir.for_job(job_id)
    a = ctl.read_ack(jd.ack_path, jd.uid)
    return a if a is not None and a.state == "applied" else None


def _steps(jd: JobDir) -> int:
    return sum(1 for r in load_records(jd.path) if r["rank"] == 0)


def test_two_resizes_in_one_round_one_slow_to_answer(daemon_env, devcluster, slurm_jobs,
                                                      monkeypatch):
    tmp_path, db = daemon_env
    a = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-max-nodes", "2",
               "--hpcsched-batch-size", "96", str(EXAMPLE), "--epochs", "500",
               "--min-step-time", "0.05")
    b = submit(tmp_path, "-N", "1", "--gres=gpu:2", "--hpcsched-batch-size", "32",
               "--hpcsched-max-batch-size", "128", str(EXAMPLE), "--epochs", "500",
               "--min-step-time", str(SLOW_STEP_S))
    slurm_jobs.extend([a, b])
    wait_for(lambda: _acked(a) and _acked(b), 240, "both jobs to run and report", interval=1)
    jd_b = JobDir.for_job(b)
    wait_for(lambda: _steps(JobDir.for_job(a)) > 5, 120, "job A to take some steps")

    settings = load()
    store = Store(settings.daemon.database_url)
    store.upgrade()
    daemon = Daemon(settings, store=store)
    decided = []

    def decide(snapshot, policy, costs, seed):
        decided.append(snapshot)
        if len(decided) > 1:
            return RoundDecision(None, (), ())
        return RoundDecision(None, (Change(a, "grow", 1, 2, 96, 96, "test: grow"),
                                    Change(b, "batch", 1, 1, 32, 64, "test: slow batch")), ())

    monkeypatch.setattr(daemon_round, "decide_round", decide)

    # decide right after one of B's steps: its next step boundary is SLOW_STEP_S away
    before = _steps(jd_b)
    wait_for(lambda: _steps(jd_b) > before, 3 * SLOW_STEP_S, "a step of job B", interval=0.05)
    t = time.monotonic()
    rep = daemon.round()
    first = time.monotonic() - t
    assert rep.error is None, rep.error
    assert rep.outcomes == {a: "requested", b: "requested"}, rep.outcomes
    ack_b = ctl.read_ack(jd_b.ack_path, jd_b.uid)
    assert ack_b.generation == 0, "job B answered within the round: not slow enough to tell"
    assert first < 5.0, f"the deciding round took {first:.1f} s"

    rounds = [(first, {x.job_id: x.phase for x in store.actions()})]
    deadline = time.monotonic() + 300
    while {x.phase for x in store.actions()} != {"running"} and time.monotonic() < deadline:
        time.sleep(1.0)
        t = time.monotonic()
        rep = daemon.round()
        rounds.append((time.monotonic() - t, {x.job_id: x.phase for x in store.actions()}))
        assert rep.error is None, rep.error
        assert not any(o.startswith("failed") for o in rep.outcomes.values()), rep.outcomes
    durations = [d for d, _ in rounds]
    print(f"round durations (s): first {first:.2f}, max {max(durations):.2f}, "
          f"rounds {len(rounds)}; phases per round: {[p for _, p in rounds]}")

    acts = {x.job_id: x for x in store.actions()}
    assert (acts[a].phase, acts[b].phase) == ("running", "running"), rounds
    for x in acts.values():
        assert tuple(p for p, _ in x.history) == PATHS[ChangeKind(x.kind)], x.history
    # A went through its requeue while B still had not answered: both advanced over rounds
    assert any(p[a] not in ("requested", "running") and p[b] == "requested" for _, p in rounds)
    info_a = slurm.job_info(a)
    assert info_a.restarts == 1 and info_a.node_count == 2, info_a
    assert _acked(a).world_size == 4 and _acked(b).global_batch_size == 64
    assert max(durations) < 5.0, durations
