"""The per-user layout's guards that need no cluster: the resize lock a root process takes in a
user's job directory, and the other ``by-id`` links a lookup refuses and logs. The ownership
cases need root (``chown`` to another user)."""

from __future__ import annotations

import errno
import logging
import os

import pytest

from hpcsched.protocol.files import ProtocolError
from hpcsched.protocol.jobdir import JobDir

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _user_dir(root, user_uid: int = NOBODY) -> JobDir:
    """``root/<name of the current user>/job`` owned by ``user_uid``."""
    jd = JobDir(root / "job")
    jd.path.mkdir(parents=True)
    os.chown(jd.path, user_uid, user_uid)
    return jd


@needs_root
def test_a_lock_root_takes_belongs_to_the_job_directorys_owner(tmp_path):
    jd = _user_dir(tmp_path)
    with jd.resize_lock():
        pass
    st = (jd.path / "resize.lock").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (NOBODY, 0o600)


@needs_root
def test_a_root_owned_lock_left_by_an_earlier_version_is_given_to_the_owner(tmp_path):
    jd = _user_dir(tmp_path)
    fd = os.open(jd.path / "resize.lock", os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(fd)
    with jd.resize_lock():
        pass
    assert (jd.path / "resize.lock").stat().st_uid == NOBODY


def test_the_lock_is_never_taken_through_a_symbolic_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    jd = JobDir(tmp_path / "job")
    jd.path.mkdir()
    (jd.path / "resize.lock").symlink_to(victim)
    with pytest.raises(OSError) as info:
        with jd.resize_lock():
            pass
    assert info.value.errno == errno.ELOOP
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize(("kind", "error"), [("fifo", ProtocolError), ("hardlink", ProtocolError),
                                             ("directory", IsADirectoryError)])
def test_the_lock_must_be_a_regular_file_of_its_own(tmp_path, kind, error):
    jd = JobDir(tmp_path / "job")
    jd.path.mkdir()
    lock = jd.path / "resize.lock"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "hardlink":
        os.link(victim, lock)
    else:
        lock.mkdir()
    with pytest.raises(error):
        with jd.resize_lock():
            pass
    assert victim.read_text() == "precious\n"


def _job(root, user: str, uid: str, job_id: str) -> JobDir:
    jd = JobDir(root / user / uid)
    jd.path.mkdir(parents=True)
    jd.link_job_id(job_id)
    return jd


def test_a_lookup_logs_the_earlier_layouts_link_to_another_directory(tmp_path, caplog):
    me = JobDir(tmp_path).owner() or "root"
    mine = _job(tmp_path, me, "a" * 12, "7")
    other = tmp_path / "elsewhere"
    other.mkdir()
    (tmp_path / "by-id").mkdir()
    (tmp_path / "by-id" / "7").symlink_to(other)
    with caplog.at_level(logging.WARNING, "hpcsched.protocol.jobdir"):
        assert JobDir.for_job("7", tmp_path, user=me).path == mine.path
    assert f"job 7: {tmp_path}/by-id/7 refused: Slurm says the job is {me}'s" in caplog.text


@needs_root
def test_root_logs_a_link_in_another_users_subtree_naming_the_job(tmp_path, caplog):
    me = JobDir(tmp_path).owner()
    mine = _job(tmp_path, me, "a" * 12, "7")
    _job(tmp_path, "mallory", "b" * 12, "7")       # mallory's subtree claims job 7 too
    with caplog.at_level(logging.WARNING, "hpcsched.protocol.jobdir"):
        assert JobDir.for_job("7", tmp_path, user=me).path == mine.path
    assert f"job 7: {tmp_path}/mallory/by-id/7 refused: Slurm says the job is {me}'s" in caplog.text


def test_no_warning_when_only_the_jobs_own_link_names_it(tmp_path, caplog):
    me = JobDir(tmp_path).owner()
    _job(tmp_path, me, "a" * 12, "7")
    _job(tmp_path, "someone", "b" * 12, "8")
    with caplog.at_level(logging.WARNING, "hpcsched.protocol.jobdir"):
        JobDir.for_job("7", tmp_path, user=me)
    assert "refused" not in caplog.text


@needs_root
def test_the_daemon_finds_a_job_in_the_subtree_of_slurms_user(tmp_path, caplog):
    """The daemon (root) looks a job up under Slurm's user of it (here ``nobody``), not its own;
    the earlier layout's link that user ``mallory`` planted for the job is refused and logged."""
    import pwd

    from hpcsched import slurm
    from hpcsched.daemon.views import ManagedJobs
    from hpcsched.protocol.jobdir import JobSpec
    from hpcsched.protocol.limits import JobLimits
    from hpcsched.slurm.observe import Observation

    user = pwd.getpwuid(NOBODY).pw_name
    jd = _job(tmp_path, user, "c" * 12, "42")
    jd.write_spec(JobSpec(job_uid=jd.uid, script="/s/train.py", script_args=(), python="python3",
                          submit_dir="/s", sbatch_args=(), nodes=1,
                          limits=JobLimits(2, 1, 2, 16, 256, None, 64, "linear"),
                          checkpoint_dir=str(jd.path / "ck"), user=user))
    for p in (tmp_path / user, jd.path, jd.spec_path):
        os.chown(p, NOBODY, NOBODY)
    planted = _job(tmp_path, "mallory", "d" * 12, "1")
    (tmp_path / "by-id").mkdir()
    (tmp_path / "by-id" / "42").symlink_to(planted.path)
    job = slurm.JobInfo(job_id="42", name="", user=user, state="RUNNING", state_reason="None",
                        partition="gpu", nodes="n1", node_count=1, gpus_per_node=2, restarts=0,
                        batch_host="n1", priority=1)
    with caplog.at_level(logging.WARNING):
        found = ManagedJobs(tmp_path, ()).find(Observation(time=0.0, nodes=(), jobs={"42": job}, calls=0))
    assert found["42"][0].path == jd.path and found["42"][1].job_uid == jd.uid
    assert f"job 42: {tmp_path}/by-id/42 refused: Slurm says the job is {user}'s" in caplog.text
