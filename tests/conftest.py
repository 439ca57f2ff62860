"""Shared fixtures. Tests marked ``slurm`` run against a real local dev cluster
(``hpcsched devcluster up``: slurmctld, 4 x slurmd with gpu:4 GRES, slurmdbd + MariaDB), one per
pytest-xdist worker, which the ``devcluster`` fixture starts when it is not up and stops again at
the end if it started it (set ``HPCSCHED_KEEP_DEVCLUSTER=1`` to keep it)."""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcsched import slurm
from hpcsched.slurm.devcluster.plugins import LUA_SETTINGS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "jobscripts" / "examples" / "digits_mlp.py"
#: EXAMPLE with a switch for its step padding (tests/paced_digits.py): :func:`paced`, :func:`unpace`
PACED = ROOT / "tests" / "paced_digits.py"


def _instance() -> int:
    """This pytest-xdist worker's dev cluster: worker ``gwK`` runs on cluster instance K (0 is
    the default cluster; without xdist, 0)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


def pytest_collection_modifyitems(items):
    """Every test on the dev cluster is marked ``slurm``, also one that only asks for its fixture,
    so that ``-m "not slurm"`` (``tools/test.sh --quick``) leaves all of them out.

    Under pytest-xdist with ``--dist worksteal`` (``tools/test.sh``), which first hands each of
    the N workers a contiguous 1/N of the tests, the order is rearranged so that each such share
    starts with 1/N of the cluster tests (the ``slow`` ones first): their waits (up to minutes)
    begin at once on every worker's own cluster instead of queueing on one."""
    for item in items:
        if "devcluster" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.slurm)
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if n <= 1:
        return
    cluster = sorted((i for i in items if i.get_closest_marker("slurm")),
                     key=lambda i: i.get_closest_marker("slow") is None)   # stable: slow first
    rest = [i for i in items if not i.get_closest_marker("slurm")]
    shares, at = [], 0
    for k in range(n):
        mine = cluster[k::n]
        size = len(items) * (k + 1) // n - len(items) * k // n
        take = max(0, size - len(mine))
        shares += mine + rest[at:at + take]
        at += take
    items[:] = shares + rest[at:]


def pytest_configure(config):
    """Each pytest-xdist worker has a dev cluster of its own (``tools/test.sh`` runs several side
    by side so that their waits overlap): worker ``gwK`` with K >= 1 uses the state directory
    ``<default>-gwK`` (exported as ``$HPCSCHED_DEVCLUSTER_DIR`` for the ``hpcsched devcluster``
    commands tests run) and the ports of instance K (``devcluster.base.instance_ports``)."""
    from hpcsched.slurm import devcluster as dc

    k = _instance()
    if k:
        os.environ[dc.STATE_DIR_ENV] = f"{dc.default_state_dir()}-gw{k}"


@pytest.fixture(scope="session")
def devcluster():
    """This worker's dev cluster (:func:`pytest_configure`), started when it is down; its
    slurm.conf path. SLURM_CONF is exported for every subprocess."""
    from hpcsched.slurm import devcluster as dc
    from hpcsched.slurm.devcluster.base import MAX_INSTANCE, instance_ports

    state = dc.default_state_dir()
    was_up = dc.is_up(state)
    if not was_up and os.geteuid() != 0:
        pytest.skip("the dev cluster is down and starting it needs root")
    if _instance() > MAX_INSTANCE:
        pytest.fail(f"at most {MAX_INSTANCE + 1} pytest-xdist workers can each have a dev cluster "
                    f"(this is {os.environ.get('PYTEST_XDIST_WORKER')}); run with -n {MAX_INSTANCE + 1} or fewer")
    conf = dc.up(state, ports=instance_ports(_instance()))
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    yield conf
    if not was_up and os.environ.get("HPCSCHED_KEEP_DEVCLUSTER") != "1":
        dc.down(state)
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


@pytest.fixture
def plugins(devcluster):
    """hpcsched's Slurm plugins on, with the job_submit settings file the test writes
    (``write(text)``); off after."""
    settings = devcluster.parent / LUA_SETTINGS
    cli("hpcsched", "devcluster", "plugins", "on")
    yield settings.write_text
    cli("hpcsched", "devcluster", "plugins", "off")
    settings.unlink(missing_ok=True)


@pytest.fixture
def control_dir(tmp_path, monkeypatch):
    """A fresh HPCSCHED_CONTROL_DIR for the test (the dev cluster's nodes share this disk)."""
    d = tmp_path / "jobs"
    monkeypatch.setenv("HPCSCHED_CONTROL_DIR", str(d))
    return d


@pytest.fixture
def store(tmp_path):
    """An empty daemon store in a fresh SQLite file, at the current schema."""
    from hpcsched.daemon.store import Store

    s = Store(f"sqlite:///{tmp_path / 'hpcsched.db'}")
    s.upgrade()
    yield s
    s.close()


def running_job_dir(control_dir, job_id: str = "10", script: str = "/s/train.py",
                    limits=None, global_batch_size: int = 64, local_batch_size: int = 16):
    """A job directory in ``control_dir`` as a running job leaves it: its spec (1 node of 4
    workers), Slurm job id ``job_id``, and its acknowledgement of generation 0."""
    from hpcsched.protocol import files as ctl
    from hpcsched.protocol.jobdir import JobDir, JobSpec, current_user
    from hpcsched.protocol.limits import JobLimits

    d = JobDir.create(control_dir)
    d.write_spec(JobSpec(job_uid=d.uid, script=script, script_args=(), python="python3",
                         submit_dir="/s", sbatch_args=(), nodes=1,
                         limits=limits or JobLimits(4, 1, 4, 16, 256, None, 64, "linear"),
                         checkpoint_dir=str(d.path / "ck"), user=current_user()))
    d.link_job_id(job_id)
    ctl.write_ack(d.ack_path, ctl.Ack(job_uid=d.uid, generation=0, state="applied", world_size=4,
                                      nodes=1, global_batch_size=global_batch_size,
                                      local_batch_size=local_batch_size, accumulation_steps=1,
                                      step=0, time=time.time()))
    return d


@pytest.fixture
def slurm_jobs():
    """Collects Slurm job ids to cancel when the test ends, whatever happened, then waits (up
    to 30 s) until they have left the queue and no node is still completing a job, so that
    the next test on this worker's cluster starts on idle nodes."""
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30)
        _wait_until_settled(ids, 30.0)


def _wait_until_settled(ids: list[str], timeout: float) -> None:
    """Poll squeue until none of ``ids`` is listed and no job is COMPLETING, at most
    ``timeout`` s (then go on: the next test waits for what it needs itself)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True,
                             timeout=30)
        if out.returncode != 0:
            return
        rows = [ln.split() for ln in out.stdout.splitlines() if ln.strip()]
        if not any(r[0] in ids or r[-1] == "COMPLETING" for r in rows):
            return
        time.sleep(0.5)


def cli(*args: str, timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run an hpcsched console script (``hpcsched``/``hpcsub``) as a user would."""
    exe = Path(sys.executable).parent / args[0]
    proc = subprocess.run([str(exe), *args[1:]], capture_output=True, text=True,
                          timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def paced(flag: Path, example: Path | None = None) -> tuple[str, ...]:
    """The script and first arguments of a job that trains EXAMPLE, or ``example`` (its
    arguments follow), with its step padding on until :func:`unpace` (``flag``) -- for a job
    given many epochs as a margin for its resizes on a loaded machine; once the test has seen
    what it checks while the job runs, :func:`unpace` ends it with the epoch in progress
    (tests/paced_digits.py; check the epochs it trained with tests.jobrecords.epochs_trained)."""
    if example is None:
        return str(PACED), "--unpaced-when", str(flag)
    return str(PACED), "--unpaced-when", str(flag), "--example", str(example)


def unpace(flag: Path) -> None:
    """The jobs started with :func:`paced` (``flag``) stop padding their steps and end with the
    epoch in progress (the flag's mtime: when, for a look at a run afterwards)."""
    if not flag.exists():
        flag.touch()


def unpace_when(flag: Path, predicate, timeout: float, interval: float = 1.0) -> None:
    """:func:`unpace` once ``predicate`` holds (say, the daemon has nothing in flight), or after
    ``timeout`` s all the same: a wait that only picks the moment, never fails the test (what
    the test asserts, it waits for itself)."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(interval)
    unpace(flag)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ------------------------------------------------------------------ the daemon, for real
@pytest.fixture
def daemon_env(tmp_path, control_dir, monkeypatch):
    db = tmp_path / "hpcsched.db"
    monkeypatch.setenv("HPCSCHED_DATABASE_URL", f"sqlite:///{db}")
    cfg = tmp_path / "hpcsched.toml"
    cfg.write_text(f'[daemon]\nround_interval = 2.0\nlock_file = "{tmp_path}/daemon.lock"\n'
                   'restart_cost = 5.0\nmin_gain = 0.02\n[policy]\nname = "dp"\n')
    monkeypatch.setenv("HPCSCHED_CONFIG", str(cfg))
    return tmp_path, db


def start_daemon(tmp_path: Path, log_name: str = "daemon.log") -> subprocess.Popen:
    exe = Path(sys.executable).parent / "hpcsched"
    log = open(tmp_path / log_name, "ab")
    return subprocess.Popen([str(exe), "-v", "daemon"], stdout=log, stderr=subprocess.STDOUT)


def daemon_store(tmp_path: Path, db: Path):
    """The store of the daemon started in ``tmp_path`` (``start_daemon``), once its first round
    has made it (its migrations run at start)."""
    from hpcsched.daemon.store import Store

    wait_for(lambda: "round 1:" in (tmp_path / "daemon.log").read_text(), 60,
             "the daemon's first round (its store made)")
    return Store(f"sqlite:///{db}")


def stop_daemon(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def submit(tmp_path, *args) -> str:
    out = cli("hpcsub", "--parsable", f"--output={tmp_path}/slurm-%j.out", "--hpcsched-record-samples",
              *args, cwd=tmp_path)
    return out.stdout.strip()


@pytest.fixture
def blocker(devcluster, slurm_jobs, tmp_path):
    """A non-hpcsched job holding n3 and n4 (8 GPUs) for the whole test."""
    out = subprocess.run(["sbatch", "--parsable", "-N2", "-w", "n[3-4]", "--gres=gpu:4",
                          f"--output={tmp_path}/blocker.out", "--wrap", "sleep 900"],
                         capture_output=True, text=True, check=True)
    job = out.stdout.strip()
    slurm_jobs.append(job)
    wait_for(lambda: (i := slurm.job_info(job)) and i.state == "RUNNING", 60, "the blocker job")
    return job


def finished(job_ids):
    infos = slurm.squeue()
    return all(infos.get(j) is not None and not infos[j].active for j in job_ids) and infos


# ------------------------------------------------------------------ several Unix users
#: an interpreter every user can run (the default Python lives under /root, mode 0700)
MULTIUSER_VENV = Path("/opt/hpcsched-multiuser-venv")
MULTIUSER_PYTHON = "/usr/bin/python3.11"
#: the torch the shared venv must import: the one tools/setup.sh pins in .venv
MULTIUSER_TORCH = "2.13.0"


@contextlib.contextmanager
def session_lock(tmp_path_factory, name: str) -> Iterator[Path]:
    """Hold an exclusive lock that the pytest-xdist workers of one session share (``name.lock``
    in the directory above each worker's temporary directory); yields that directory, where
    what one worker made for the others can be left."""
    root = tmp_path_factory.getbasetemp().parent
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield root


def _console_scripts() -> dict[str, str]:
    """setup.cfg's console scripts: ``{name: "module:function"}``."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict((x.strip() for x in line.split("=")) for line in lines)   # hpcsched = hpcsched.cli:main


def _venv_ready(venv: Path) -> bool:
    """``venv`` runs this checkout's hpcsched (editable) with torch MULTIUSER_TORCH, sklearn
    and the daemon extra (``hpcsched status`` reads the store through SQLAlchemy)."""
    py = venv / "bin" / "python"
    if not (py.exists() and all((venv / "bin" / name).exists() for name in _console_scripts())):
        return False
    probe = ("import hpcsched, sklearn, sqlalchemy, alembic, torch, sys; "
             "sys.exit(0 if torch.__version__.split('+')[0] == sys.argv[1] "
             "and hpcsched.__file__.startswith(sys.argv[2]) else 1)")
    # -I and cwd "/": the checkout in the working directory must not stand in for what the venv
    # itself imports (an editable install left pointing at a checkout since deleted)
    return subprocess.run([str(py), "-I", "-c", probe, MULTIUSER_TORCH, str(ROOT / "hpcsched")],
                          capture_output=True, cwd="/").returncode == 0


@pytest.fixture(scope="session")
def multiuser_venv(tmp_path_factory) -> Path:
    """A virtual environment every user can run: Debian's python3.11 (the checkout's own Python
    lives under /root, mode 0700) over the checkout's ``.venv`` packages (hpcsched editable,
    the pinned torch, sklearn, the daemon extra), which a ``.pth`` line adds with
    ``site.addsitedir`` (so their own ``.pth`` files, the editable install's among them, are
    read too). Built in a second, once per machine, under a lock (xdist workers share it);
    rebuilt when it does not import this checkout's hpcsched and the pinned torch. Needs root."""
    if os.geteuid() != 0:
        pytest.skip("creating Unix users and a shared venv needs root")
    if not Path(MULTIUSER_PYTHON).exists():
        pytest.skip(f"{MULTIUSER_PYTHON} (Debian's python3.11 with venv) is not installed")
    with session_lock(tmp_path_factory, "multiuser_venv"):
        if not _venv_ready(MULTIUSER_VENV):
            _build_multiuser_venv()
            assert _venv_ready(MULTIUSER_VENV), f"{MULTIUSER_VENV} built but not usable"
    return MULTIUSER_VENV


def _build_multiuser_venv() -> None:
    ours = Path(sysconfig.get_paths()["purelib"])     # the checkout's .venv, world-readable
    subprocess.run([MULTIUSER_PYTHON, "-m", "venv", "--clear", "--without-pip", str(MULTIUSER_VENV)],
                   check=True, capture_output=True, timeout=120)
    (site,) = (MULTIUSER_VENV / "lib").glob("python3*/site-packages")
    (site / "hpcsched-checkout-venv.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")
    for name, target in _console_scripts().items():
        module, func = target.split(":")
        script = MULTIUSER_VENV / "bin" / name
        script.write_text(f"#!{MULTIUSER_VENV}/bin/python\nimport sys\nfrom {module} import {func}\n"
                          f"sys.exit({func}())\n")
        script.chmod(0o755)


@pytest.fixture(scope="session")
def unix_users() -> tuple[str, str]:
    """Unix users alice and bob (created if missing; they are left for the next run)."""
    if os.geteuid() != 0:
        pytest.skip("creating Unix users needs root")
    for user in ("alice", "bob"):
        if subprocess.run(["id", user], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user],
                           check=True, capture_output=True)
    return "alice", "bob"
