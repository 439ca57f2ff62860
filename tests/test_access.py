"""Who may see and act on which job (hpcsched.daemon.access): a user their own jobs, root and the
admin group all; ``hpcsched resize`` and ``hpcsched status`` refuse another user's job with a
clear message, before reading any of its files. No Slurm: its answer is given."""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd

import pytest
from click.testing import CliRunner

from hpcsched import slurm
from hpcsched.daemon import access, config, resize_cli, status
from hpcsched.daemon.access import Caller, NotYourJob
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.limits import JobLimits
from tests.fakes import FakeSlurm

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


@pytest.fixture
def system_config(tmp_path, monkeypatch):
    """Writes the system's configuration file (``/etc/hpcsched/hpcsched.toml`` stand-in);
    ``None``: there is none."""
    path = tmp_path / "etc-hpcsched.toml"
    monkeypatch.setattr(config, "DEFAULT_PATH", path)
    monkeypatch.delenv(access.ENV_ADMIN_GROUP, raising=False)
    monkeypatch.delenv(config.ENV_CONFIG, raising=False)

    def write(text: str | None) -> None:
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)

    return write


def test_admin_group_comes_from_the_systems_configuration(system_config, tmp_path, monkeypatch):
    system_config(None)
    assert access.admin_group() == "hpcsched-admin"
    system_config('[daemon]\nadmin_group = "hpc-ops"\n')
    assert access.admin_group() == "hpc-ops"
    system_config('[daemon]\nadmin_group = ""\n')
    assert access.admin_group() == ""
    # a configuration of the caller's own choosing is not read
    mine = tmp_path / "mine.toml"
    mine.write_text('[daemon]\nadmin_group = "alice"\n')
    monkeypatch.setenv(config.ENV_CONFIG, str(mine))
    system_config('[daemon]\nadmin_group = "hpc-ops"\n')
    assert access.admin_group() == "hpc-ops"
    # a file that is there but broken names no admin group: only root sees every job
    system_config('[daemon]\nadmin_grup = "hpc-ops"\n')
    assert access.admin_group() == ""


class Groups:
    """The system's user and group databases, as ``pwd``, ``grp`` and ``os`` answer."""

    def __init__(self, monkeypatch, groups: dict[str, int], members: dict[str, list[int]]):
        self.groups, self.members, self.asked = groups, members, []
        monkeypatch.setattr(access.grp, "getgrnam", self.getgrnam)
        monkeypatch.setattr(access.os, "getgrouplist", self.getgrouplist)

    def getgrnam(self, name):
        if name not in self.groups:
            raise KeyError(name)
        return grp.struct_group((name, "x", self.groups[name], []))

    def getgrouplist(self, user, gid):
        self.asked.append(user)
        return [gid, *self.members.get(user, [])]

    @staticmethod
    def run_as(monkeypatch, user: str, uid: int, gid: int, process_groups: list[int]) -> None:
        """This process is ``user``'s, its credentials ``gid`` and ``process_groups``."""
        monkeypatch.setattr(access.os, "geteuid", lambda: uid)
        monkeypatch.setattr(access.os, "getegid", lambda: gid)
        monkeypatch.setattr(access.os, "getgroups", lambda: list(process_groups))
        monkeypatch.setattr(access.pwd, "getpwuid", lambda u: pwd.struct_passwd(
            (user, "x", uid, gid, "", f"/home/{user}", "/bin/sh")))


def test_a_forged_admin_group_variable_gives_no_admin_rights(system_config, monkeypatch, caplog):
    system_config(None)                                     # the default group, hpcsched-admin
    Groups(monkeypatch, {"hpcsched-admin": 900, "alice": 1234}, {"carol": [900]})
    Groups.run_as(monkeypatch, "alice", 1234, 1234, [1234])
    monkeypatch.setenv(access.ENV_ADMIN_GROUP, "alice")     # her own group
    with caplog.at_level(logging.WARNING, logger="hpcsched.daemon.access"):
        me = Caller.current()
    assert me == Caller("alice", admin=False)
    assert not me.may_act_on("bob")
    assert any("HPCSCHED_ADMIN_GROUP=alice is ignored" in r.getMessage() for r in caplog.records)
    with pytest.raises(NotYourJob, match="the 'hpcsched-admin' group"):
        me.check("5", "bob")


def test_admin_membership_is_read_from_the_group_database(system_config, monkeypatch):
    system_config('[daemon]\nadmin_group = "hpc-ops"\n')
    groups = Groups(monkeypatch, {"hpc-ops": 900}, {"carol": [900, 50]})
    Groups.run_as(monkeypatch, "carol", 1000, 1000, [])      # a process without the group
    assert Caller.current() == Caller("carol", admin=True)
    assert groups.asked == ["carol"]
    Groups.run_as(monkeypatch, "bob", 1001, 1001, [900])     # the group's gid, not its member
    assert Caller.current() == Caller("bob", admin=False)
    Groups.run_as(monkeypatch, "dave", 1002, 900, [])       # the group is his primary group
    assert Caller.current() == Caller("dave", admin=True)
    system_config('[daemon]\nadmin_group = ""\n')          # no admin group: nobody but root
    Groups.run_as(monkeypatch, "carol", 1000, 1000, [900])
    assert Caller.current() == Caller("carol", admin=False)
    with pytest.raises(NotYourJob, match="only its owner and root may"):
        Caller.current().check("5", "bob")
    system_config('[daemon]\nadmin_group = "hpc-absent"\n')   # a group that does not exist
    assert not Caller.current().admin


def test_root_is_an_admin_whatever_the_groups(system_config, monkeypatch):
    system_config('[daemon]\nadmin_group = ""\n')
    Groups(monkeypatch, {}, {})
    Groups.run_as(monkeypatch, "root", 0, 0, [0])
    assert Caller.current() == Caller("root", admin=True)


def test_a_group_database_that_does_not_answer_gives_no_admin(system_config, monkeypatch):
    system_config(None)
    Groups(monkeypatch, {"hpcsched-admin": 900}, {})
    Groups.run_as(monkeypatch, "carol", 1000, 1000, [900])

    def down(user, gid):
        raise OSError("sssd is down")

    monkeypatch.setattr(access.os, "getgrouplist", down)
    assert not Caller.current().admin


def _job(control_dir, job_id, user):
    d = JobDir.create(control_dir)
    d.write_spec(JobSpec(job_uid=d.uid, script="/s/train.py", script_args=(), python="python3",
                         submit_dir="/s", sbatch_args=(), nodes=1,
                         limits=JobLimits(2, 1, 2, 16, 256, None, 64, "linear"),
                         checkpoint_dir=str(d.path / "ck"), user=user))
    d.link_job_id(job_id)
    return d


def test_resize_refuses_another_users_job_before_reading_its_files(monkeypatch, control_dir):
    sl = FakeSlurm(info("5", "alice"))
    monkeypatch.setattr(resize_cli, "CLISlurmControl", lambda: sl)
    monkeypatch.setattr(Caller, "current", classmethod(lambda cls: BOB))
    # no job directory at all: had resize read the job's files first it would say "not found"
    r = CliRunner().invoke(resize_cli.resize_command, ["5", "--batch-size", "128"])
    assert r.exit_code == 2
    assert "hpcsched resize: refused: job 5 is not yours" in r.output and "Traceback" not in r.output
    assert sl.count("job") == 1


def test_resize_of_a_job_slurm_does_not_know_is_refused(monkeypatch, control_dir):
    monkeypatch.setattr(resize_cli, "CLISlurmControl", lambda: FakeSlurm(info("5", "alice")))
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


def test_resize_refuses_what_is_not_a_job_id_before_asking_slurm(monkeypatch):
    from click.testing import CliRunner

    from hpcsched.daemon import resize_cli

    def no_slurm(*a, **k):
        raise AssertionError("Slurm asked about a job id that is not one")

    monkeypatch.setattr(resize_cli, "_owned_job", no_slurm)
    for bad in ("abc", "12a", "١٢"):
        r = CliRunner().invoke(resize_cli.resize_command, [bad, "--batch-size", "128"])
        assert r.exit_code == 2 and "is not a Slurm job id" in r.output, (bad, r.output)
        assert "Traceback" not in r.output
