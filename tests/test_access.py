"""Who may see and act on which job (hpcsched.daemon.access): a user their own jobs, root and the
admin group all; ``hpcsched resize`` and ``hpcsched status`` refuse another user's job with a
clear message, before reading any of its files. No Slurm: its answer is given."""

from __future__ import annotations

import json
import os
import pwd

import pytest
from click.testing import CliRunner

from hpcsched import slurm
from hpcsched.daemon import access, resize_cli, status
from hpcsched.daemon.access import Caller, NotYourJob
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.limits import JobLimits

ALICE = Caller("alice", admin=False)
BOB = Caller("bob", admin=False)
ADMIN = Caller("carol", admin=True)


def info(job_id, user):
    return slurm.JobInfo(job_id=job_id, name="", user=user, state="RUNNING", state_reason="None",
                         partition="gpu", nodes="n1", node_count=1, gpus_per_node=2, restarts=0,
                         batch_host="n1", priority=1)


@pytest.mark.parametrize("caller, owner, allowed", [
    (ALICE, "alice", True),
    (ALICE, "bob", False),
    (BOB, "alice", False),
    (ALICE, "", False),          # an owner nobody can tell: only an admin
    (ADMIN, "alice", True),
    (ADMIN, "", True),
])
def test_who_may_act_on_a_job(caller, owner, allowed):
    assert caller.may_act_on(owner) is allowed
    if allowed:
        caller.check("5", owner)
    else:
        with pytest.raises(NotYourJob, match="job 5 is not yours"):
            caller.check("5", owner)


def test_current_caller_is_the_effective_user(monkeypatch):
    me = Caller.current()
    assert me.user == pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        assert me.admin, "root sees every job"
    monkeypatch.setattr(os, "geteuid", lambda: 4_000_000_000)   # no passwd entry
    stranger = Caller.current()
    assert not stranger.admin and not stranger.may_act_on("root")


def test_admin_group_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(access.ENV_ADMIN_GROUP, raising=False)
    assert access.admin_group() == "hpcsched-admin"
    monkeypatch.setenv(access.ENV_ADMIN_GROUP, "hpc-ops")
    assert access.admin_group() == "hpc-ops"


def _job(control_dir, job_id, user):
    d = JobDir.create(control_dir)
    d.write_spec(JobSpec(job_uid=d.uid, script="/s/train.py", script_args=(), python="python3",
                         submit_dir="/s", sbatch_args=(), nodes=1,
                         limits=JobLimits(2, 1, 2, 16, 256, None, 64, "linear"),
                         checkpoint_dir=str(d.path / "ck"), user=user))
    d.link_job_id(job_id)
    return d


class OneJob:
    """The SlurmControl resize asks: it knows one job, and counts the questions."""

    def __init__(self, job):
        self.info, self.asked = job, 0

    def job(self, job_id):
        self.asked += 1
        return self.info if job_id == self.info.job_id else None


def test_resize_refuses_another_users_job_before_reading_its_files(monkeypatch, control_dir):
    sl = OneJob(info("5", "alice"))
    monkeypatch.setattr(resize_cli, "CLISlurmControl", lambda: sl)
    monkeypatch.setattr(Caller, "current", classmethod(lambda cls: BOB))
    # no job directory at all: had resize read the job's files first it would say "not found"
    r = CliRunner().invoke(resize_cli.resize_command, ["5", "--batch-size", "128"])
    assert r.exit_code == 2
    assert "hpcsched resize: refused: job 5 is not yours" in r.output and "Traceback" not in r.output
    assert sl.asked == 1


def test_resize_of_a_job_slurm_does_not_know_is_refused(monkeypatch, control_dir):
    monkeypatch.setattr(resize_cli, "CLISlurmControl", lambda: OneJob(info("5", "alice")))
    r = CliRunner().invoke(resize_cli.resize_command, ["6", "--batch-size", "128"])
    assert (r.exit_code, "Slurm does not know job 6" in r.output) == (2, True), r.output


def test_status_lists_only_the_callers_jobs_and_refuses_anothers(monkeypatch, control_dir):
    _job(control_dir, "5", "alice")
    _job(control_dir, "6", "bob")
    monkeypatch.setattr(slurm, "squeue", lambda: {"5": info("5", "alice"), "6": info("6", "bob")})
    rows, err = status.collect(caller=ALICE)
    assert err is None and [r.job_id for r in rows] == ["5"]
    rows, _ = status.collect(caller=ADMIN)
    assert [r.job_id for r in rows] == ["5", "6"]
    with pytest.raises(NotYourJob):
        status.collect(["6"], caller=ALICE)
    monkeypatch.setattr(Caller, "current", classmethod(lambda cls: ALICE))
    r = CliRunner().invoke(status.status_command, ["6"])
    assert r.exit_code == 2 and "hpcsched status: refused: job 6 is not yours" in r.output
    r = CliRunner().invoke(status.status_command, ["--json"])
    assert [j["job_id"] for j in json.loads(r.output)["jobs"]] == ["5"]


def test_status_of_a_job_slurm_forgot_goes_by_the_directorys_owner(monkeypatch, control_dir):
    _job(control_dir, "5", "alice")           # created by root here
    monkeypatch.setattr(slurm, "squeue", lambda: {})
    assert [r.job_id for r in status.collect(caller=Caller("root", admin=False))[0]] == ["5"]
    assert status.collect(caller=ALICE)[0] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file away")
def test_a_file_the_daemon_writes_into_a_users_job_directory_is_that_users(tmp_path):
    from hpcsched.protocol.files import write_json_atomic

    d = tmp_path / "alice-job"
    d.mkdir(mode=0o700)
    os.chown(d, 12345, 12345)
    write_json_atomic(d / "control.json", {"x": 1})
    st = (d / "control.json").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (12345, 12345, 0o600)
    write_json_atomic(tmp_path / "mine.json", {"x": 1})      # root's own directory: root's file
    assert (tmp_path / "mine.json").stat().st_uid == 0
