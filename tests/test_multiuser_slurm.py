"""Two real Unix users on the dev cluster share one control directory (docs/control-protocol.md,
"Many users").

alice and bob each submit an elastic job with ``hpcsub`` as themselves; both run side by side
and finish with every sample of every epoch processed exactly once. In between, bob tries
everything the layout must refuse -- read or change alice's files, resize her job, see its
details, and plant links (in his own subtree, in hers, in the earlier layout's ``by-id/``, and
his own job's link re-pointed at her directory) -- while the daemon, as root, runs rounds over the
real cluster and changes alice's batch size: it must use alice's own directory, write only
there (files owned by her), refuse and log every planted link. Needs root (users, ``runuser``).
"""

from __future__ import annotations

import json
import logging
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.daemon import round as daemon_round
from hpcsched.daemon.config import load
from hpcsched.daemon.round import Daemon
from hpcsched.daemon.store import Store
from hpcsched.policies.reconcile import Change
from hpcsched.policies.round import RoundDecision
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from tests.conftest import EXAMPLE, cli, wait_for
from tests.jobrecords import check_exactly_once, load_records

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

DIGITS = 1797
EPOCHS = {"alice": 30, "bob": 20}
STEP_S = "0.1"           # --min-step-time: long enough for every check while both run


class Shared:
    """The shared control directory (mode 1777) and how to run a command as a user."""

    def __init__(self, base: Path, venv: Path, slurm_conf: str):
        self.base, self.venv, self.slurm_conf = base, venv, slurm_conf
        self.control = base / "jobs"
        self.jobs: dict[str, str] = {}        # user -> Slurm job id

    def run(self, user: str, *cmd: str, check: bool = False) -> subprocess.CompletedProcess:
        """``cmd`` as ``user``, in a clean environment (no root's variables), in their out dir;
        a bare command name is taken from the shared venv."""
        exe = cmd[0] if "/" in cmd[0] or cmd[0] in ("cat", "ls", "sh", "ln", "rm") else \
            str(self.venv / "bin" / cmd[0])
        env = [f"HOME=/home/{user}", f"PATH={self.venv}/bin:/usr/bin:/bin", "LANG=C.UTF-8",
               f"SLURM_CONF={self.slurm_conf}", f"HPCSCHED_CONTROL_DIR={self.control}"]
        proc = subprocess.run(["runuser", "-u", user, "--", "env", "-i", *env, exe, *cmd[1:]],
                              capture_output=True, text=True, timeout=600,
                              cwd=self.base / "out" / user)
        if check and proc.returncode != 0:
            raise AssertionError(f"{user}: {' '.join(cmd)} -> {proc.returncode}\n{proc.stdout}\n"
                                 f"{proc.stderr}")
        return proc

    def jobdir(self, user: str) -> JobDir:
        return JobDir.for_job(self.jobs[user], self.control, user=user)


def _acked(jd: JobDir, generation: int):
    a = ctl.read_ack(jd.ack_path, jd.uid)
    return a if a is not None and a.generation == generation and a.state == "applied" else None


@pytest.fixture(scope="module")
def shared(devcluster, multiuser_venv, unix_users):
    """alice's and bob's jobs submitted and training (1 node x 1 GPU each); cancelled and the
    shared directory removed at the end."""
    base = Path(tempfile.mkdtemp(prefix="hpcsched-multiuser-", dir="/tmp"))
    base.chmod(0o755)
    sh = Shared(base, multiuser_venv, str(devcluster))
    sh.control.mkdir(mode=0o1777)
    sh.control.chmod(0o1777)              # as the admin sets it up (mkdir's mode obeys umask)
    for user in unix_users:
        out = base / "out" / user
        out.mkdir(parents=True)
        shutil.chown(out, user, user)
    try:
        for user in unix_users:
            r = sh.run(user, "hpcsub", "--parsable", "-N", "1", "--gres=gpu:1",
                       f"--output={base}/out/{user}/slurm-%j.out", "--hpcsched-record-samples",
                       "--hpcsched-batch-size", "32", "--hpcsched-max-batch-size", "128",
                       str(EXAMPLE), "--epochs", str(EPOCHS[user]), "--min-step-time", STEP_S,
                       check=True)
            sh.jobs[user] = r.stdout.strip()
        for user in unix_users:
            jd = sh.jobdir(user)
            wait_for(lambda: _acked(jd, 0), 420, f"{user}'s job {sh.jobs[user]} to train\n"
                     f"{_job_log(sh, user)}", interval=0.5)
        yield sh
    finally:
        if sh.jobs:
            subprocess.run(["scancel", *sh.jobs.values()], capture_output=True, timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def _job_log(sh: Shared, user: str) -> str:
    p = sh.base / "out" / user / f"slurm-{sh.jobs.get(user)}.out"
    return p.read_text() if p.exists() else "(no output yet)"


def test_each_subtree_is_its_users_alone(shared):
    alice = shared.jobdir("alice")
    assert alice.path.parent == shared.control / "alice"
    for user in ("alice", "bob"):
        st = (shared.control / user).stat()
        assert (st.st_uid, st.st_mode & 0o7777) == (pwd_uid(user), 0o700)
        assert shared.jobdir(user).owner() == user
    # Slurm says whose each job is (the owner hpcsched trusts)
    assert {u: slurm.job_info(j).user for u, j in shared.jobs.items()} == {"alice": "alice",
                                                                          "bob": "bob"}


def pwd_uid(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


@pytest.mark.parametrize("what", ["spec.json", "ack.json", "progress.json", "metrics/launch-1-rank-0.jsonl",
                                  "checkpoints", "."])
def test_bob_cannot_read_alices_files(shared, what):
    path = shared.jobdir("alice").path / what
    r = shared.run("bob", "cat" if what not in ("checkpoints", ".") else "ls", str(path))
    assert r.returncode != 0 and "Permission denied" in r.stderr, (r.stdout, r.stderr)
    r = shared.run("bob", "ls", str(shared.control / "alice"))
    assert r.returncode != 0 and "Permission denied" in r.stderr
    if what in ("spec.json", "ack.json", "."):     # alice herself can
        shared.run("alice", "ls", str(path), check=True)


def test_bob_cannot_change_alices_control(shared):
    path = shared.jobdir("alice").control_path
    r = shared.run("bob", "sh", "-c", f"echo '{{}}' > {path}")
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [("--batch-size", "64"), ("--nodes", "2"), ("--gpus", "1")])
def test_bob_cannot_resize_alices_job(shared, args):
    job = shared.jobs["alice"]
    r = shared.run("bob", "hpcsched", "resize", job, *args, "--reason", "bob was here")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"job {job} is not yours" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert ctl.read_control(shared.jobdir("alice").control_path) is None   # nothing requested


def test_bob_sees_only_his_own_jobs(shared, monkeypatch):
    alice_job, bob_job = shared.jobs["alice"], shared.jobs["bob"]
    r = shared.run("bob", "hpcsched", "status", alice_job)
    assert r.returncode == 2 and f"job {alice_job} is not yours" in r.stderr, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and shared.jobdir("alice").uid not in r.stdout + r.stderr
    for user, mine in (("bob", bob_job), ("alice", alice_job)):
        r = shared.run(user, "hpcsched", "status", "--json", "--all", check=True)
        assert [j["job_id"] for j in json.loads(r.stdout)["jobs"]] == [mine], r.stdout
    monkeypatch.setenv("HPCSCHED_CONTROL_DIR", str(shared.control))
    r = cli("hpcsched", "status", "--json", "--all")        # root sees every job
    assert sorted(j["job_id"] for j in json.loads(r.stdout)["jobs"]) == sorted([alice_job, bob_job])
    r = shared.run("bob", "hpcsched", "status", "--json", bob_job, check=True)
    (row,) = json.loads(r.stdout)["jobs"]
    assert row["job_dir"] == str(shared.jobdir("bob").path)


PLANT = r"""
import json, os, sys
control, alice_job, bob_job, alice_dir, decoy = sys.argv[1:6]
mine = os.path.join(control, "bob")
fake = os.path.join(mine, "planted")
os.makedirs(os.path.join(fake, "metrics"), exist_ok=True)
own = os.path.realpath(os.path.join(mine, "by-id", bob_job))
spec = json.load(open(os.path.join(own, "spec.json")))
spec.update(job_uid="planted", script="/tmp/planted.py")
json.dump(spec, open(os.path.join(fake, "spec.json"), "w"))
done = {}
def link(target, at):
    try:
        os.makedirs(os.path.dirname(at), exist_ok=True)
        os.symlink(target, at)
        done[at] = "made"
    except OSError as exc:
        done[at] = exc.strerror
link("../planted", os.path.join(mine, "by-id", alice_job))                 # his subtree
link("../planted", os.path.join(control, "alice", "by-id", alice_job))     # hers
link("../bob/planted", os.path.join(control, "by-id", alice_job))          # the earlier layout
# in his own job's directory: its control file leads out of it (to where root must not write;
# a dangling link, so his job reads no control file), a metrics file into alice's
link(decoy, os.path.join(own, "control.json"))
link(os.path.join(alice_dir, "metrics", "launch-1-rank-0.jsonl"),
     os.path.join(own, "metrics", "launch-9-rank-0.jsonl"))
print(json.dumps(done))
"""


def _daemon(tmp_path, monkeypatch, control: Path, changes: tuple[Change, ...]) -> Daemon:
    """A daemon (this process: root) over the real cluster whose first round decides
    ``changes`` and later rounds nothing (the decision is fixed: no policy model involved)."""
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text(f'[daemon]\nround_interval = 1.0\nlock_file = "{tmp_path}/daemon.lock"\n'
                   '[policy]\nname = "dp"\n')
    monkeypatch.setenv("HPCSCHED_CONFIG", str(cfg))
    monkeypatch.setenv("HPCSCHED_DATABASE_URL", f"sqlite:///{tmp_path}/hpcsched.db")
    monkeypatch.setenv("HPCSCHED_CONTROL_DIR", str(control))
    decided = []

    def decide(snapshot, policy, costs, seed):
        decided.append({j.job_id for j in snapshot.jobs})
        return RoundDecision(None, changes if len(decided) == 1 else (), ())

    monkeypatch.setattr(daemon_round, "decide_round", decide)
    settings = load()
    store = Store(settings.daemon.database_url)
    store.upgrade()
    daemon = Daemon(settings, store=store)
    daemon.decided = decided
    return daemon


def _warnings(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_planted_links_never_make_the_daemon_act_on_alices_job(shared, tmp_path, monkeypatch,
                                                                caplog):
    alice_job, bob_job = shared.jobs["alice"], shared.jobs["bob"]
    alice, bob = shared.jobdir("alice"), shared.jobdir("bob")
    c = shared.control
    decoy = shared.base / "out" / "bob" / "written-through-a-link.json"
    r = shared.run("bob", "python", "-c", PLANT, str(c), alice_job, bob_job, str(alice.path),
                   str(decoy), check=True)
    assert json.loads(r.stdout) == {
        f"{c}/bob/by-id/{alice_job}": "made", f"{c}/alice/by-id/{alice_job}": "Permission denied",
        f"{c}/by-id/{alice_job}": "made", f"{bob.path}/control.json": "made",
        f"{bob.path}/metrics/launch-9-rank-0.jsonl": "made"}

    # the root daemon changes both jobs' batch sizes, each in its own directory
    daemon = _daemon(tmp_path, monkeypatch, c, (
        Change(alice_job, "batch", 1, 1, 32, 64, "test: root, alice"),
        Change(bob_job, "batch", 1, 1, 32, 128, "test: root, bob")))
    caplog.set_level(logging.INFO)
    daemon.round()
    managed = daemon.managed.find(daemon.backend.observe())
    assert (managed[alice_job][0].path, managed[bob_job][0].path) == (alice.path, bob.path)
    assert daemon.decided[0] == {alice_job, bob_job}
    for link in (f"{c}/bob/by-id/{alice_job}", f"{c}/by-id/{alice_job}"):
        assert f"job {alice_job}: {link} refused: Slurm says the job is alice's" in _warnings(caplog)
    assert f"job {bob_job}: {bob.path}/metrics/launch-9-rank-0.jsonl" in _warnings(caplog)
    assert daemon.store.job(alice_job).job_uid == alice.uid
    wait_for(lambda: daemon.round() and _acked(alice, 1) and _acked(bob, 1), 120,
             f"both jobs to apply the daemon's batch change\n{_job_log(shared, 'alice')}\n"
             f"{_job_log(shared, 'bob')}", interval=1)
    assert (_acked(alice, 1).global_batch_size, _acked(bob, 1).global_batch_size) == (64, 128)
    # bob's control link was replaced, not written through: each control file in its own dir
    assert not decoy.exists()
    for user, jd, batch in (("alice", alice, 64), ("bob", bob, 128)):
        st = jd.control_path.lstat()
        assert (st.st_uid, st.st_mode & 0o170777) == (pwd_uid(user), 0o100600), user
        assert ctl.read_control(jd.control_path).global_batch_size == batch
    # nothing of root's in either subtree; bob's planted directory as he left it
    assert sorted(p.name for p in (c / "bob" / "planted").iterdir()) == ["metrics", "spec.json"]
    assert not list((c / "bob" / "planted" / "metrics").iterdir())
    for user in ("alice", "bob"):
        for p in (c / user).rglob("*"):
            assert p.lstat().st_uid == pwd_uid(user), p
    shared.run("bob", "rm", f"{bob.path}/metrics/launch-9-rank-0.jsonl", check=True)


def test_bobs_job_linked_to_alices_directory_is_refused(shared, tmp_path, monkeypatch, caplog):
    alice_job, bob_job = shared.jobs["alice"], shared.jobs["bob"]
    alice, bob = shared.jobdir("alice"), shared.jobdir("bob")
    link = shared.control / "bob" / "by-id" / bob_job
    shared.run("bob", "ln", "-sfn", f"../../alice/{alice.uid}", str(link), check=True)
    try:
        daemon = _daemon(tmp_path, monkeypatch, shared.control, ())
        caplog.set_level(logging.INFO)
        daemon.round()
        managed = daemon.managed.find(daemon.backend.observe())
        assert bob_job not in managed and managed[alice_job][0].path == alice.path
        assert f"job {bob_job}: ignored: job {bob_job}: {link} does not lead to a job directory " \
               f"of bob" in _warnings(caplog)
        r = shared.run("bob", "hpcsched", "resize", bob_job, "--batch-size", "64")
        assert r.returncode == 2 and "does not lead to a job directory of bob" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    finally:    # bob puts his own link back: his job is his again
        shared.run("bob", "ln", "-sfn", f"../{bob.uid}", str(link), check=True)
    daemon = _daemon(tmp_path, monkeypatch, shared.control, ())
    managed = daemon.managed.find(daemon.backend.observe())
    assert managed[bob_job][0].path == bob.path


def test_admin_then_alice_resize_her_job_and_both_finish(shared, monkeypatch):
    alice_job = shared.jobs["alice"]
    alice = shared.jobdir("alice")
    gen = ctl.read_ack(alice.ack_path, alice.uid).generation + 1
    # root (an admin) may resize anyone's job; what it leaves in her directory stays hers
    monkeypatch.setenv("HPCSCHED_CONTROL_DIR", str(shared.control))
    r = cli("hpcsched", "resize", alice_job, "--batch-size", "96", "--reason", "test: admin")
    assert f"generation {gen} in force" in r.stdout, r.stdout
    for p in alice.path.rglob("*"):
        assert p.lstat().st_uid == pwd_uid("alice"), p
    gen += 1
    r = shared.run("alice", "hpcsched", "resize", alice_job, "--batch-size", "128", "--reason",
                   "test: mine")
    assert r.returncode == 0 and f"generation {gen} in force" in r.stdout, (r.stdout, r.stderr)
    # everything in her job directory is still hers to read (the daemon's files included)
    for name in ("control.json", "ack.json", "spec.json"):
        shared.run("alice", "cat", str(alice.path / name), check=True)
    for user, job in shared.jobs.items():
        final = wait_for(lambda: (i := slurm.job_info(job)) and not i.active and i, 400,
                         f"{user}'s job {job} to finish", interval=1)
        assert final.state == "COMPLETED", _job_log(shared, user)
        check_exactly_once(load_records(shared.jobdir(user).path), DIGITS, EPOCHS[user])
