"""Slurm's own signals (issue 33): a job checkpoints on ``SIGUSR1`` (hpcsub's
``--signal=USR1@120``, sent before the time limit), stops, and its launcher requeues it; the
daemon starts a job that requeued itself at once. Real gloo workers, no Slurm (the Slurm path:
``tests/test_pre_timeout_slurm.py``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.daemon.requeued import to_release
from hpcsched.job.boundary import ControlWatcher, Decision, agree
from hpcsched.job.launcher import Launcher, effective_config
from hpcsched.job.submit import PRE_TIMEOUT_S, build_spec
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import AckState, LauncherPhase
from hpcsched.slurm.parse import JobInfo
from tests.gloo_workers import join, launch, wait_ack, write_control
from tests.jobrecords import check_exactly_once, load_records

DIGITS = 1797


# ------------------------------------------------------------------ the boundary's decision

def test_a_stop_travels_in_the_broadcast_and_wins_over_a_new_generation(tmp_path):
    d = Decision(3, checkpoint_due=True, next_in=7, stop=True)
    assert Decision.decode(d.encode()) == d and len(d.encode()) == 12
    jd = JobDir.create(tmp_path)
    write_control(jd, 2, "continue", world=1, local=8, accum=1)
    watcher = ControlWatcher(jd)
    assert agree(watcher, None, None, 0, 0, False, stop=True) == Decision(stop=True)
    # the generation is not lost: the next boundary (or the next launch) still sees it
    assert agree(watcher, None, None, 0, 0, False).generation == 2
    assert agree(watcher, None, None, 1, 0, False, stop=True) == Decision()   # rank 0 decides


# ------------------------------------------------------------------------------- hpcsub

@pytest.mark.parametrize("given,want", [
    ((), [f"--signal=USR1@{PRE_TIMEOUT_S}"]),
    (("--signal=B:USR2@300",), []),        # the user's own choice stands
    (("--signal", "USR1@60"), []),
])
def test_hpcsub_asks_for_a_pre_timeout_signal_unless_told(tmp_path, monkeypatch, given, want):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    _, _, extra = build_spec(["--gres=gpu:2", *given, str(script)], "uid", tmp_path / "job")
    assert [d for d in extra["defaults"] if d.startswith("--signal")] == want


# ----------------------------------------------------------------------- launcher, no Slurm

@pytest.fixture
def launcher(tmp_path, monkeypatch):
    from tests.test_launcher import _spec

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    jd = JobDir.create(tmp_path)
    jd.write_spec(_spec(jd.uid))
    return Launcher(jd.path, requeue_timeout=0.0)


def _stopped(step: int = 40) -> ctl.Ack:
    return ctl.Ack(job_uid="uid", generation=0, state=AckState.STOPPED, world_size=4, nodes=2,
                   global_batch_size=64, local_batch_size=16, accumulation_steps=1, step=step,
                   time=time.time(), checkpoint="/c/ckpt-40.pt")


def test_the_launcher_requeues_its_job_after_the_checkpoint(launcher, monkeypatch):
    asked = []
    monkeypatch.setattr(slurm, "requeue", lambda job_id, **_: asked.append(job_id))
    launcher._requeue_self(effective_config(launcher.spec, None, 2), _stopped())
    assert asked == ["4242"]
    state = launcher.jd.read_launcher_state()
    assert state.phase == LauncherPhase.REQUEUED and state.phase.in_transition


def test_a_job_slurm_will_not_requeue_trains_on(launcher, monkeypatch, caplog):
    def refuse(job_id, **_):
        raise slurm.SlurmError("scontrol requeue 4242: Requested operation is presently disabled")

    monkeypatch.setattr(slurm, "requeue", refuse)
    launcher._requeue_self(effective_config(launcher.spec, None, 2), _stopped())  # returns
    assert "training on from the checkpoint" in caplog.text


# ------------------------------------------------------------------ the daemon's release

def _info(job_id: str, state: str = "PENDING", reason: str = "BeginTime") -> JobInfo:
    return JobInfo(job_id, "t", "u", state, reason, "gpu", "", 1, 4, 1, "", 100)


def _launcher_state(phase: LauncherPhase, at: float) -> ctl.LauncherState:
    return ctl.LauncherState(job_uid="uid", job_id="1", phase=phase, launches=1, resizes=0,
                             restarts=0, time=at, nodelist="n1")


def test_the_daemon_starts_only_jobs_that_requeued_themselves():
    now = 1000.0
    jobs = {
        "1": (_info("1"), _launcher_state(LauncherPhase.REQUEUED, now - 5)),      # released
        "2": (_info("2"), _launcher_state(LauncherPhase.REQUEUED, now - 0.5)),    # too soon
        "3": (_info("3"), _launcher_state(LauncherPhase.AWAITING_REQUEUE, now - 9)),  # a resize
        "4": (_info("4", reason="Resources"), _launcher_state(LauncherPhase.REQUEUED, now - 9)),
        "5": (_info("5", state="RUNNING", reason="None"),
              _launcher_state(LauncherPhase.REQUEUED, now - 9)),
        "6": (_info("6"), None),
        "7": (_info("7"), _launcher_state(LauncherPhase.REQUEUED, now - 9)),       # busy
    }
    assert to_release(jobs, busy={"7"}, now=now) == ["1"]


# ---------------------------------------------------------- real workers on Slurm's signal

@pytest.mark.slow
def test_workers_checkpoint_on_sigusr1_stop_and_resume_with_every_sample_once(tmp_path):
    """Two gloo workers; SIGUSR1 to both (as Slurm sends it to every task of the job's steps)
    mid-run: they checkpoint at the next boundary, acknowledge ``stopped`` at the generation in
    force and exit 0; a second launch resumes from that checkpoint and finishes."""
    jd = JobDir.create(tmp_path)
    epochs = 3
    procs = launch(jd, world=2, generation=0, local=16, accum=1, launch=1, epochs=epochs)
    wait_ack(jd, 0, "applied", procs)
    time.sleep(1.0)
    for p in procs:
        os.kill(p.pid, signal.SIGUSR1)
    ack = wait_ack(jd, 0, "stopped", procs)
    join(procs)
    assert Path(ack.checkpoint).is_file() and ack.step > 0
    first = load_records(jd.path)
    assert first and max(r["step"] for r in first) <= ack.step

    procs = launch(jd, world=2, generation=0, local=16, accum=1, launch=2, epochs=epochs)
    join(procs)
    recs = load_records(jd.path)
    assert {r["launch"] for r in recs} == {1, 2}
    assert min(r["step"] for r in recs if r["launch"] == 2) > ack.step - 1
    check_exactly_once(recs, DIGITS, epochs)
