"""The daemon's reaper of orphaned extension jobs: the pure decision (which tagged jobs are
orphans), the executor against a fake SlurmControl with real job directories, and one daemon
round that reaps. Slurm is a fake here; ``tests/test_reaper_slurm.py`` runs it on the dev
cluster."""

from __future__ import annotations

import logging
import threading
import time
from types import MappingProxyType

import pytest

from hpcsched import slurm
from hpcsched.daemon import reaper as reaper_module
from hpcsched.daemon import round as daemon_round
from hpcsched.daemon.config import load
from hpcsched.daemon.reaper import Reaper, decide, suspects
from hpcsched.daemon.round import Daemon
from hpcsched.daemon.store import Store
from hpcsched.policies.round import RoundDecision
from hpcsched.protocol.extensions import extension_comment
from hpcsched.protocol.jobdir import JobDir, JobSpec, current_user
from hpcsched.protocol.limits import JobLimits
from hpcsched.slurm.observe import Observation
from tests.fakes import FakeSlurm

ME = current_user()
UID = "u-primary"


def job(job_id, state="RUNNING", comment="", user="bob", partition="gpu"):
    return slurm.JobInfo(job_id=job_id, name="", user=user, state=state, state_reason="None",
                         partition=partition, nodes="n2", node_count=1, gpus_per_node=2,
                         restarts=0, batch_host="n2", priority=1, comment=comment)


def ext(job_id, primary="10", uid=UID, state="RUNNING", user="bob", partition="gpu"):
    return job(job_id, state, extension_comment(primary, uid, 3), user, partition)


def jobs(*infos):
    return {i.job_id: i for i in infos}


BOB_10 = {("10", "bob"): UID}

# (Slurm's jobs, job-directory uids, managed partitions, ids to cancel, ids left alone)
DECISIONS = {
    "the primary runs: not an orphan": (
        jobs(job("10"), ext("11")), BOB_10, (), [], []),
    "the primary is pending again (requeued): not an orphan": (
        jobs(job("10", "PENDING"), ext("11")), BOB_10, (), [], []),
    "the primary is completing: not yet": (
        jobs(job("10", "COMPLETING"), ext("11")), BOB_10, (), [], []),
    "the primary ended": (
        jobs(job("10", "COMPLETED"), ext("11")), BOB_10, (), ["11"], []),
    "the primary was cancelled, the extension still pends": (
        jobs(job("10", "CANCELLED"), ext("11", state="PENDING")), BOB_10, (), ["11"], []),
    "Slurm has forgotten the primary": (
        jobs(ext("11")), BOB_10, (), ["11"], []),
    "the extension has ended too": (
        jobs(ext("11", state="CANCELLED"), ext("12", state="COMPLETED")), BOB_10, (), [], []),
    "no job directory for the primary": (
        jobs(ext("11")), {}, (), [], ["11"]),
    "the job directory's uid is another (a reused job id)": (
        jobs(ext("11")), {("10", "bob"): "u-other"}, (), [], ["11"]),
    "the primary's job directory is another user's": (
        jobs(ext("11", user="mallory")), BOB_10, (), [], ["11"]),
    "comments that are not extension tags": (
        jobs(job("11", comment="hello"), job("12", comment="hpcsched-extension:10"),
             job("13", comment=f"hpcsched-extension:10:{UID}:g3 and more"),
             job("14", comment=f"hpcsched-extension:x10:{UID}:g3")), BOB_10, (), [], []),
    "a tag naming its own job as the primary": (
        jobs(ext("10", primary="10")), BOB_10, (), [], []),
    "several orphans, in job id order": (
        jobs(ext("100"), ext("99"), ext("12", primary="20", uid="u-20")),
        {**BOB_10, ("20", "bob"): "u-20"}, (), ["12", "99", "100"], []),
    "two primaries, one ended": (
        jobs(job("20"), ext("21", primary="20", uid="u-20"), ext("11")),
        {**BOB_10, ("20", "bob"): "u-20"}, (), ["11"], []),
    "an extension outside the managed partitions": (
        jobs(ext("11", partition="other"), ext("12")), BOB_10, ("gpu",), ["12"], []),
}


@pytest.mark.parametrize("slurm_jobs,uids,partitions,cancel,untouched", DECISIONS.values(),
                         ids=DECISIONS.keys())
def test_decide(slurm_jobs, uids, partitions, cancel, untouched):
    v = decide(slurm_jobs, uids, partitions)
    assert [t.job_id for t in v.cancel] == cancel
    assert [t.job_id for t, _ in v.untouched] == untouched
    assert all(t.primary_job_id in why for t, why in v.untouched)
    assert sorted(t.job_id for t in suspects(slurm_jobs, partitions)) == sorted(cancel + untouched)


def test_an_orphans_tag_is_read_whole():
    (t,) = suspects(jobs(ext("11", primary="10", uid="u-7")))
    assert (t.job_id, t.user, t.state, t.primary_job_id, t.job_uid, t.generation) == (
        "11", "bob", "RUNNING", "10", "u-7", 3)


# -- the executor --------------------------------------------------------------------------------


def FakeControl(fail=None) -> FakeSlurm:
    """SlurmControl's ``cancel`` (the one fake of ``tests/fakes.py``); ``fail``: job id -> the
    exception its scancel raises."""
    return FakeSlurm(refuse={("cancel", j): exc for j, exc in (fail or {}).items()})


@pytest.fixture
def primary(control_dir):
    """Job 10's directory in this user's subtree (what hpcsub and the launcher make)."""
    d = JobDir.create(control_dir)
    d.link_job_id("10")
    return d


def obs(*infos):
    return Observation(time.time(), (), MappingProxyType(jobs(*infos)), 2)


def mine(job_id, primary_dir, state="RUNNING", uid=None, primary="10"):
    return ext(job_id, primary, uid or primary_dir.uid, state, user=ME)


def test_an_orphan_is_cancelled_once_counted_once(control_dir, primary, caplog):
    reaper, control = Reaper(control_dir), FakeControl()
    caplog.set_level(logging.WARNING, "hpcsched.daemon.reaper")
    assert reaper.reap(obs(mine("11", primary)), control) == ["11"]
    assert control.cancelled == ["11"] and reaper.reaped == 1
    (warning,) = caplog.records
    assert "job 11" in warning.message and "job 10" in warning.message
    # still running at the next round (scancel not yet done): cancelled again, counted once
    assert reaper.reap(obs(mine("11", primary)), control) == ["11"]
    assert control.cancelled == ["11", "11"] and reaper.reaped == 1
    # completing: left to finish
    assert reaper.reap(obs(mine("11", primary, state="COMPLETING")), control) == []
    assert control.cancelled == ["11", "11"] and len(caplog.records) == 1


def test_a_running_primary_keeps_its_extensions(control_dir, primary):
    reaper, control = Reaper(control_dir), FakeControl()
    running = job("10", user=ME)
    assert reaper.reap(obs(running, mine("11", primary)), control) == []
    assert control.cancelled == [] and reaper.reaped == 0


def test_a_foreign_tag_is_left_alone_and_logged_once(control_dir, primary, caplog):
    reaper, control = Reaper(control_dir), FakeControl()
    caplog.set_level(logging.WARNING, "hpcsched.daemon.reaper")
    seen = obs(mine("11", primary, uid="u-someone"), mine("12", primary, primary="77"))
    for _ in range(2):
        assert reaper.reap(seen, control) == []
    assert control.cancelled == [] and reaper.reaped == 0
    said = [r.message for r in caplog.records]
    assert len(said) == 2
    assert "job 11" in said[0] and f"{primary.uid}" in said[0] and "u-someone" in said[0]
    assert "job 12" in said[1] and "no job directory of job 77" in said[1]


def test_dry_run_cancels_nothing(control_dir, primary, caplog):
    reaper, control = Reaper(control_dir, dry_run=True), FakeControl()
    caplog.set_level(logging.WARNING, "hpcsched.daemon.reaper")
    for _ in range(2):
        assert reaper.reap(obs(mine("11", primary)), control) == []
    assert control.cancelled == [] and reaper.reaped == 0
    (warning,) = caplog.records
    assert "would cancel job 11" in warning.message


def test_a_refused_scancel_is_retried_next_round(control_dir, primary):
    reaper = Reaper(control_dir)
    refused = FakeControl({"11": slurm.SlurmError("scancel: error: Access/permission denied")})
    assert reaper.reap(obs(mine("11", primary), mine("12", primary)), refused) == ["12"]
    assert reaper.reaped == 1
    assert reaper.reap(obs(mine("11", primary)), FakeControl()) == ["11"]
    assert reaper.reaped == 2


class BatchLog(FakeSlurm):
    """The fake, with each ``scancel`` command's job ids recorded in ``batches``."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.batches: list[tuple[str, ...]] = []

    def cancel(self, *job_ids: str) -> None:
        self.batches.append(job_ids)
        super().cancel(*job_ids)


def test_a_rounds_orphans_go_in_one_scancel_of_at_most_cancel_batch(control_dir, primary, monkeypatch):
    ids = [str(i) for i in range(11, 16)]
    control = BatchLog()
    assert Reaper(control_dir).reap(obs(*(mine(i, primary) for i in ids)), control) == ids
    assert control.batches == [tuple(ids)]
    monkeypatch.setattr(reaper_module, "CANCEL_BATCH", 2)
    control, reaper = BatchLog(), Reaper(control_dir)
    assert reaper.reap(obs(*(mine(i, primary) for i in ids)), control) == ids
    assert control.batches == [("11", "12"), ("13", "14"), ("15",)] and reaper.reaped == 5


def test_a_refusal_that_names_no_job_retries_the_whole_batch(control_dir, primary):
    class Vague(BatchLog):
        def cancel(self, *job_ids: str) -> None:
            self.batches.append(job_ids)
            raise slurm.SlurmError("scancel: error: Socket timed out on send/recv operation")

    reaper = Reaper(control_dir)
    assert reaper.reap(obs(mine("11", primary), mine("12", primary)), Vague()) == []
    assert reaper.reaped == 0
    assert reaper.reap(obs(mine("11", primary), mine("12", primary)), FakeControl()) == ["11", "12"]


def test_slurm_down_stops_the_reaping(control_dir, primary):
    reaper = Reaper(control_dir)
    down = FakeControl({"11": slurm.SlurmUnavailable("scancel: Unable to contact slurm controller")})
    assert reaper.reap(obs(mine("11", primary), mine("12", primary)), down) == []
    assert down.cancelled == [] and reaper.reaped == 0


class Slow(BatchLog):
    """A controller whose every ``scancel`` waits until ``go`` is set."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.go = threading.Event()

    def cancel(self, *job_ids: str) -> None:
        assert self.go.wait(10)
        super().cancel(*job_ids)


def test_a_background_scancel_holds_up_no_round_and_comes_in_next_round(control_dir, primary):
    reaper, control = Reaper(control_dir, background=True), Slow()
    seen = obs(mine("11", primary), mine("12", primary))
    t0 = time.monotonic()
    assert reaper.reap(seen, control) == []          # started, not waited for
    assert reaper.reap(seen, control) == []          # still running: no second scancel
    assert time.monotonic() - t0 < 5 and reaper.reaped == 0
    control.go.set()
    assert reaper.settle() == ["11", "12"] and reaper.reaped == 2
    assert control.batches == [("11", "12")] and reaper.settle() == []


def test_a_background_scancel_that_slurm_did_not_answer_is_retried(control_dir, primary, caplog):
    reaper = Reaper(control_dir, background=True)
    down = FakeControl({"11": slurm.SlurmUnavailable("scancel: Unable to contact slurm controller")})
    caplog.set_level(logging.WARNING, "hpcsched.daemon.reaper")
    seen = obs(mine("11", primary))
    assert reaper.reap(seen, down) == [] and reaper.settle() == [] and reaper.reaped == 0
    assert "Slurm did not answer" in caplog.text
    up = FakeControl()
    assert reaper.reap(seen, up) == [] and reaper.settle() == ["11"] and up.cancelled == ["11"]


# -- in the daemon's round -----------------------------------------------------------------------


def FakeCluster(*infos) -> FakeSlurm:
    """The round's observation and the actuator's SlurmControl."""
    return FakeSlurm(*infos)


@pytest.fixture
def daemon_settings(tmp_path, control_dir, monkeypatch):
    monkeypatch.delenv("HPCSCHED_DATABASE_URL", raising=False)
    monkeypatch.setattr(daemon_round, "decide_round", lambda *a, **k: RoundDecision(None, (), ()))
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text(f'[daemon]\ncontrol_dir = "{control_dir}"\n'
                   f'database_url = "sqlite:///{tmp_path / "h.db"}"\n[policy]\nname = "static"\n')
    settings = load(cfg)
    store = Store(settings.daemon.database_url)
    store.upgrade()
    yield settings, store
    store.close()


def test_a_round_reaps_the_orphans(control_dir, primary, daemon_settings):
    settings, store = daemon_settings
    primary.write_spec(JobSpec(job_uid=primary.uid, script="/s/train.py", script_args=(),
                               python="python3", submit_dir="/s", sbatch_args=(), nodes=1,
                               limits=JobLimits(2, 1, 2, 16, 256, None, 64, "linear"),
                               checkpoint_dir=str(primary.path / "ck"), user=ME))
    other = JobDir.create(control_dir)
    other.link_job_id("20")
    cluster = FakeCluster(job("10", "COMPLETED", user=ME), mine("11", primary),
                          job("20", user=ME), mine("21", other, primary="20"))
    d = Daemon(settings, backend=cluster, store=store)
    d.actuator.slurm = cluster
    rep = d.round()   # the round's scancel runs in a thread: its outcome comes next round
    assert rep.error is None and d.reaper.settle() == ["11"] and cluster.cancelled == ["11"]
    assert d.reaper.reaped == 1
