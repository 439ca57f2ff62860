"""A real, local Slurm 22.05 cluster for development and tests: ``hpcsched devcluster up|down|status``.

``up`` starts, on this one host and as root, everything a small GPU cluster needs:

* ``munged`` (reused when one is already running),
* MariaDB on its own data directory, socket and port (16820), used by
* ``slurmdbd`` (port 16819), so that accounting, ``sacct`` and repeated job updates work,
* ``slurmctld`` (port 16817), ``ClusterName=lab``, default partition ``gpu``,
* one ``slurmd -N nK`` per emulated node ``n1..nN`` (``NodeAddr=127.0.0.K``, ``Port=17000+K``),
  each with ``--cpus`` CPUs and ``--gpus`` fake GPUs (character devices ``STATE/dev/gpuI``,
  major 195, so that the ``gpu`` GRES has the ``File=`` that Slurm 22.05 requires).

It waits, polling with deadlines, until every node is ``idle`` in ``sinfo`` (or ``mixed``/``allocated``
when jobs restored from saved state still run on it). ``down`` stops only the
daemons ``up`` started, by PID file, in the order slurmd, slurmctld, slurmdbd, MariaDB, munged.

Every measured fact this module relies on (multiple-slurmd build, fake GPU device files, the
TRES/slurmdbd requirement, zombie processes because PID 1 does not reap, slurmd before slurmctld
on stop, timeouts on every Slurm client call, never the ``slurm-wlm-emulator`` package) is in
``../shared/slurm-22.05-notes.md`` (``/work/shared/slurm-22.05-notes.md``), sections 1, 2 and 6.

Files under the state directory ``STATE`` (``--state-dir``, env ``HPCSCHED_DEVCLUSTER_DIR``,
default ``/var/lib/hpcsched/devcluster``)::

    etc/slurm.conf gres.conf cgroup.conf slurmdbd.conf (600)   dev/gpu0..       state/  spool/nK/
    run/*.pid (every daemon started)   log/*.log   db/ (MariaDB)   cluster.json (manifest)   .lock

Python API: :func:`up`, :func:`down`, :func:`is_up`, :func:`status`, :func:`slurm_env`,
:func:`render_configs`, :func:`default_state_dir`. Errors are raised as :class:`DevClusterError`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

logger = logging.getLogger(__name__)

#: Default state directory when neither ``--state-dir`` nor ``HPCSCHED_DEVCLUSTER_DIR`` is given.
DEFAULT_STATE_DIR = "/var/lib/hpcsched/devcluster"
STATE_DIR_ENV = "HPCSCHED_DEVCLUSTER_DIR"

CLUSTER_NAME = "lab"
PARTITION = "gpu"
SLURMCTLD_PORT = 16817
SLURMD_PORT = 16818  # SlurmdPort; every emulated node overrides it with its own Port=
SLURMDBD_PORT = 16819
MARIADB_PORT = 16820
NODE_PORT_BASE = 17000  # node nK listens on NODE_PORT_BASE + K
NODE_REAL_MEMORY_MB = 16000
GPU_DEVICE_MAJOR = 195  # the NVIDIA character-device major number
DB_USER, DB_PASSWORD, DB_NAME = "slurm", "slurmpw", "slurm_acct_db"
MAX_NODES = 254  # NodeAddr is 127.0.0.K

#: apt packages installed when a needed binary is missing (never slurm-wlm-emulator, see the notes).
APT_PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server")
_NEEDED_BINARIES = (
    "slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db", "mariadb",
    "sinfo", "scontrol", "sbatch", "squeue", "sacct",
)
_SBIN_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

# Daemon kinds in stop order, with their /proc/PID/comm name and the SIGTERM deadline in seconds.
_STOP_ORDER = ("slurmd", "slurmctld", "slurmdbd", "mariadb", "munged")
_COMM = {"slurmd": "slurmd", "slurmctld": "slurmctld", "slurmdbd": "slurmdbd",
         "mariadb": "mariadbd", "munged": "munged"}
_TERM_DEADLINE_S = {"slurmd": 20.0, "slurmctld": 20.0, "slurmdbd": 20.0, "mariadb": 60.0, "munged": 10.0}
_KILL_DEADLINE_S = 5.0

_MUNGE_RUN_DIR = Path("/run/munge")
_MUNGE_SOCKET = _MUNGE_RUN_DIR / "munge.socket.2"
_MUNGE_KEY = Path("/etc/munge/munge.key")

_SLURM_CLIENT_TIMEOUT_S = 5.0  # every sinfo/scontrol call: a dead controller makes them retry for minutes
_POLL_S = 0.1


class DevClusterError(RuntimeError):
    """A dev-cluster operation failed; the message says what and what to do."""


# --------------------------------------------------------------------------------------------
# Paths and small helpers
# --------------------------------------------------------------------------------------------


def default_state_dir() -> Path:
    """The state directory used when none is given: ``$HPCSCHED_DEVCLUSTER_DIR`` or
    ``/var/lib/hpcsched/devcluster``."""
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


class _Layout:
    """Every path under one state directory."""

    def __init__(self, state_dir: str | os.PathLike[str] | None):
        root = Path(state_dir) if state_dir is not None else default_state_dir()
        self.root = Path(os.path.abspath(root))
        bad = [c for c in self.root.as_posix() if c.isspace() or c in "#\"'=,[]"]
        if bad:
            raise DevClusterError(
                f"state directory {self.root} contains {''.join(sorted(set(bad)))!r}, "
                "which slurm.conf cannot hold; choose a plain path"
            )
        self.etc = self.root / "etc"
        self.dev = self.root / "dev"
        self.run = self.root / "run"
        self.log = self.root / "log"
        self.state = self.root / "state"
        self.spool = self.root / "spool"
        self.db = self.root / "db"
        self.datadir = self.db / "data"
        self.db_socket = self.db / "mysqld.sock"
        self.slurm_conf = self.etc / "slurm.conf"
        self.manifest = self.root / "cluster.json"
        self.lock = self.root / ".lock"

    def pidfile(self, name: str) -> Path:
        return self.run / f"{name}.pid"


def _bin(name: str) -> str | None:
    """Full path of a program, also looking in the sbin directories a non-root PATH may lack."""
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(_SBIN_PATH)
    return shutil.which(name, path=path)


def _need_bin(name: str) -> str:
    found = _bin(name)
    if found is None:
        raise DevClusterError(f"{name} not found; run `hpcsched devcluster up` (it installs it) or "
                              f"apt-get install {' '.join(APT_PACKAGES)}")
    return found


def _run(args: Sequence[str], *, timeout: float, env: dict[str, str] | None = None,
         check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a short, non-daemonizing command and capture its output (argument list, timeout)."""
    logger.debug("run: %s", shlex.join(args))
    try:
        cp = subprocess.run(list(args), input=input, capture_output=True, text=True,
                            timeout=timeout, env=env,
                            stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError as e:
        raise DevClusterError(f"{args[0]}: not found") from e
    except subprocess.TimeoutExpired as e:
        raise DevClusterError(f"`{shlex.join(args)}` timed out after {timeout:g} s") from e
    if check and cp.returncode != 0:
        out = (cp.stderr.strip() or cp.stdout.strip()).splitlines()[-5:]
        raise DevClusterError(f"`{shlex.join(args)}` failed (exit {cp.returncode}): " + " | ".join(out))
    return cp


def _spawn(args: Sequence[str], log_path: Path, *, env: dict[str, str] | None = None,
           timeout: float = 30.0) -> None:
    """Run a command that daemonizes itself. Its stdio goes to ``log_path`` (never a pipe we wait on,
    or the caller of ``eval "$(hpcsched devcluster up)"`` would block until the daemon exits)."""
    logger.debug("spawn: %s", shlex.join(args))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        try:
            rc = subprocess.run(list(args), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, timeout=timeout).returncode
        except FileNotFoundError as e:
            raise DevClusterError(f"{args[0]}: not found") from e
        except subprocess.TimeoutExpired as e:
            raise DevClusterError(f"`{shlex.join(args)}` did not return within {timeout:g} s") from e
    if rc != 0:
        raise DevClusterError(f"`{shlex.join(args)}` exited {rc}: {_tail(log_path)}")


def _tail(path: Path, lines: int = 6) -> str:
    """Last lines of a log file, joined on one line, for error messages."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    return f"[{path}] " + " | ".join(text[-lines:])


def _wait_for(check, deadline_s: float, what: str, on_timeout=None, interval: float = _POLL_S) -> None:
    """Poll ``check()`` every ``interval`` s until it returns true, or raise after ``deadline_s`` s.

    ``check`` may itself raise :class:`DevClusterError` to fail fast (a daemon that died).
    """
    end = time.monotonic() + deadline_s
    while True:
        if check():
            return
        if time.monotonic() >= end:
            extra = on_timeout() if on_timeout else ""
            raise DevClusterError(f"timed out after {deadline_s:g} s waiting for {what}" + (f": {extra}" if extra else ""))
        time.sleep(interval)


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _unix_socket_open(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
        return True


# --------------------------------------------------------------------------------------------
# Processes: PID files, liveness (zombies count as dead), stopping
# --------------------------------------------------------------------------------------------


def _proc_state(pid: int) -> tuple[str, str] | None:
    """``(comm, state letter)`` of a process, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # Format: "PID (comm) S ..."; comm may contain spaces and parentheses.
    lpar, rpar = raw.find("("), raw.rfind(")")
    if lpar < 0 or rpar < 0:
        return None
    return raw[lpar + 1:rpar], raw[rpar + 2:rpar + 3]


def _alive(pid: int | None, comm: str | None = None) -> bool:
    """True when ``pid`` runs and is not a zombie (PID 1 here does not reap; see the notes, §6.8).

    With ``comm``, the process must also have that name, so that a stale PID file whose number
    was reused by an unrelated process is not mistaken for our daemon.
    """
    if not pid or pid <= 0:
        return False
    st = _proc_state(pid)
    if st is None or st[1] in ("Z", "X", "x"):
        return False
    return comm is None or st[0] == comm


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _find_procs(comm: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose name is ``comm``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _alive(int(entry), comm):
            pids.append(int(entry))
    return sorted(pids)


def _kind(name: str) -> str:
    """Daemon kind from a PID-file stem: ``slurmd-n3`` -> ``slurmd``."""
    return name.split("-", 1)[0]


def _pidfile_daemons(layout: _Layout) -> dict[str, int | None]:
    """Every daemon with a PID file under ``run/``: name -> PID."""
    if not layout.run.is_dir():
        return {}
    return {p.stem: _read_pid(p) for p in sorted(layout.run.glob("*.pid")) if _kind(p.stem) in _COMM}


def _stop_group(names: dict[str, int | None]) -> list[str]:
    """SIGTERM a group of daemons, wait for them, SIGKILL what is left. Returns the names stopped."""
    live = {n: pid for n, pid in names.items() if _alive(pid, _COMM[_kind(n)])}
    if not live:
        return []
    for name, pid in live.items():
        logger.debug("SIGTERM %s (pid %d)", name, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    kind = _kind(next(iter(live)))

    def all_dead() -> bool:
        return not any(_alive(pid) for pid in live.values())

    try:
        _wait_for(all_dead, _TERM_DEADLINE_S[kind], f"{kind} to exit")
    except DevClusterError:
        for name, pid in live.items():
            if _alive(pid):
                logger.warning("%s (pid %d) ignored SIGTERM for %g s; sending SIGKILL", name, pid,
                               _TERM_DEADLINE_S[kind])
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _wait_for(all_dead, _KILL_DEADLINE_S, f"{kind} to die after SIGKILL")
    return sorted(live)


def _stop_all(layout: _Layout) -> list[str]:
    """Stop every daemon with a PID file under ``run/``, in the order of the notes (§2):
    slurmd, slurmctld, slurmdbd, MariaDB, munged. PID files are removed. Returns names stopped."""
    daemons = _pidfile_daemons(layout)
    stopped: list[str] = []
    for kind in _STOP_ORDER:
        group = {n: pid for n, pid in daemons.items() if _kind(n) == kind}
        t0 = time.monotonic()
        done = _stop_group(group)
        if done:
            logger.info("stopped %s in %.2f s", ", ".join(done), time.monotonic() - t0)
        stopped += done
        for n in group:
            with contextlib.suppress(FileNotFoundError):
                layout.pidfile(n).unlink()
    return stopped


# --------------------------------------------------------------------------------------------
# Configuration rendering (pure)
# --------------------------------------------------------------------------------------------


def _span(lo: int, hi: int) -> str:
    """Slurm hostlist bracket for a numeric range: ``1,4 -> [1-4]``, ``3,3 -> 3``."""
    return str(lo) if lo == hi else f"[{lo}-{hi}]"


def node_names(nodes: int) -> list[str]:
    """Names of the emulated nodes: ``n1 .. nN``."""
    return [f"n{k}" for k in range(1, nodes + 1)]


def _check_geometry(nodes: int, gpus: int, cpus: int) -> None:
    if not 1 <= nodes <= MAX_NODES:
        raise DevClusterError(f"--nodes must be between 1 and {MAX_NODES} (NodeAddr is 127.0.0.K), got {nodes}")
    if not 0 <= gpus <= 64:
        raise DevClusterError(f"--gpus must be between 0 and 64 per node, got {gpus}")
    if not 1 <= cpus <= 1024:
        raise DevClusterError(f"--cpus must be between 1 and 1024 per node, got {cpus}")


def render_configs(state_dir: str | os.PathLike[str] | None, nodes: int = 4, gpus: int = 4,
                   cpus: int = 8) -> dict[str, str]:
    """Render the cluster's configuration files; pure (touches nothing).

    :param state_dir: the state directory every path in the files points into.
    :param nodes: emulated nodes ``n1..nN`` (1..254).
    :param gpus: fake GPUs per node (0..64); 0 configures no GRES on the nodes.
    :param cpus: CPUs per node as Slurm sees them (``SlurmdParameters=config_overrides`` lets
        2 real cores pose as any number).
    :returns: ``{"slurm.conf": text, "gres.conf": ..., "cgroup.conf": ..., "slurmdbd.conf": ...}``,
        exactly the configuration measured to work in the notes (§2), with ports 16817 (slurmctld),
        16818 (SlurmdPort, overridden per node), 16819 (slurmdbd), 16820 (MariaDB), 17001+ (nodes).
    :raises DevClusterError: for a geometry out of range or a state path slurm.conf cannot hold.
    """
    _check_geometry(nodes, gpus, cpus)
    L = _Layout(state_dir)
    names = _span(1, nodes)
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    slurm_conf = f"""\
# Written by `hpcsched devcluster up` ({nodes} nodes x {gpus} GPUs x {cpus} CPUs); do not edit:
# it is rewritten on every start. Facts behind every line: slurm-22.05-notes.md, section 2.
ClusterName={CLUSTER_NAME}
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={SLURMCTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={L.state}
SlurmdSpoolDir={L.spool}/%n
SlurmctldPidFile={L.run}/slurmctld.pid
SlurmdPidFile={L.run}/slurmd-%n.pid
SlurmctldLogFile={L.log}/slurmctld.log
SlurmdLogFile={L.log}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={SLURMDBD_PORT}
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/filetxt
JobCompLoc={L.log}/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=permit_job_expansion
JobRequeue=1
ReturnToService=2
MpiDefault=none
SlurmdParameters=config_overrides
TreeWidth=65533
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
"""
    for k in range(1, nodes + 1):
        slurm_conf += (f"NodeName=n{k} NodeHostname=n{k} NodeAddr=127.0.0.{k} Port={NODE_PORT_BASE + k} "
                       f"CPUs={cpus} RealMemory={NODE_REAL_MEMORY_MB}{gres} State=UNKNOWN\n")
    slurm_conf += (f"PartitionName={PARTITION} Nodes=n{names} Default=YES MaxTime=INFINITE "
                   "State=UP OverSubscribe=NO\n")

    gres_conf = "# Written by `hpcsched devcluster up`. Fake GPUs: character devices, major 195.\nAutoDetect=off\n"
    if gpus:
        gres_conf += f"NodeName=n{names} Name=gpu File={L.dev}/gpu{_span(0, gpus - 1)}\n"

    cgroup_conf = "# Not read with proctrack/linuxproc + task/none; written as in the notes.\nCgroupPlugin=autodetect\n"

    slurmdbd_conf = f"""\
# Written by `hpcsched devcluster up`; mode 600 (it holds the database password).
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={SLURMDBD_PORT}
SlurmUser=root
DebugLevel=info
LogFile={L.log}/slurmdbd.log
PidFile={L.run}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={MARIADB_PORT}
StorageUser={DB_USER}
StoragePass={DB_PASSWORD}
StorageLoc={DB_NAME}
"""
    return {"slurm.conf": slurm_conf, "gres.conf": gres_conf, "cgroup.conf": cgroup_conf,
            "slurmdbd.conf": slurmdbd_conf}


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _write_configs(layout: _Layout, nodes: int, gpus: int, cpus: int) -> None:
    for d in (layout.etc, layout.dev, layout.run, layout.log, layout.state, layout.spool, layout.db):
        d.mkdir(parents=True, exist_ok=True)
    for name in node_names(nodes):
        (layout.spool / name).mkdir(exist_ok=True)
    for name, text in render_configs(layout.root, nodes, gpus, cpus).items():
        _write(layout.etc / name, text, 0o600 if name == "slurmdbd.conf" else 0o644)
    _make_gpu_devices(layout.dev, gpus)


def _make_gpu_devices(dev: Path, gpus: int) -> None:
    """``mknod DEV/gpuI c 195 I`` for each fake GPU (the notes, §2 and §6.2). Where mknod is not
    permitted, a regular file is used instead (it works; slurmd logs that it is not a device)."""
    for i in range(gpus):
        path = dev / f"gpu{i}"
        try:
            st = path.lstat()
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == GPU_DEVICE_MAJOR and os.minor(st.st_rdev) == i:
                continue
            if stat.S_ISREG(st.st_mode):
                continue
            path.unlink()
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(GPU_DEVICE_MAJOR, i))
        except PermissionError:
            logger.warning("mknod %s not permitted; using a regular file as fake GPU", path)
            path.touch()
        os.chmod(path, 0o666)


# --------------------------------------------------------------------------------------------
# Install
# --------------------------------------------------------------------------------------------


def _missing_binaries() -> list[str]:
    return [b for b in _NEEDED_BINARIES if _bin(b) is None]


def _ensure_installed(install: bool) -> None:
    """apt-get install the packages when a needed binary is missing (the notes, §1)."""
    missing = _missing_binaries()
    if missing:
        if not install:
            raise DevClusterError(f"missing {', '.join(missing)} and --no-install given; "
                                  f"apt-get install {' '.join(APT_PACKAGES)}")
        apt = _bin("apt-get")
        if apt is None:
            raise DevClusterError(f"missing {', '.join(missing)} and no apt-get on this machine; "
                                  f"install {' '.join(APT_PACKAGES)} by hand")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        logger.info("installing %s (missing: %s)", " ".join(APT_PACKAGES), ", ".join(missing))
        t0 = time.monotonic()
        try:
            _run([apt, "update"], timeout=300, env=env)
            _run([apt, "install", "-y", "--no-install-recommends", *APT_PACKAGES], timeout=900, env=env)
        except DevClusterError as e:
            raise DevClusterError(f"installing {' '.join(APT_PACKAGES)} failed: {e}") from e
        logger.info("installed in %.1f s", time.monotonic() - t0)
        still = _missing_binaries()
        if still:
            raise DevClusterError(f"after apt-get install, still missing: {', '.join(still)}")
    _fix_emulator_alternatives()
    if not _MUNGE_KEY.exists():
        _create_munge_key()


def _fix_emulator_alternatives() -> None:
    """If slurm-wlm-emulator took over /usr/sbin/slurmctld etc. (notes, §6.1), set them back."""
    for prog in ("slurmctld", "slurmd", "slurmstepd"):
        target = os.path.realpath(f"/usr/sbin/{prog}")
        wlm = f"/usr/sbin/{prog}-wlm"
        if "emulator" in os.path.basename(target) and os.path.exists(wlm):
            logger.warning("%s points to the broken emulator build %s; setting it back to %s", prog, target, wlm)
            _run([_need_bin("update-alternatives"), "--set", prog, wlm], timeout=30)


def _create_munge_key() -> None:
    logger.info("creating %s", _MUNGE_KEY)
    _MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
    mungekey = _bin("mungekey")
    if mungekey:
        _run([mungekey, "--create", f"--keyfile={_MUNGE_KEY}"], timeout=30)
    else:
        fd = os.open(_MUNGE_KEY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
    shutil.chown(_MUNGE_KEY, "munge", "munge")
    os.chmod(_MUNGE_KEY, 0o400)


# --------------------------------------------------------------------------------------------
# Starting the daemons
# --------------------------------------------------------------------------------------------


def _slurm_env_full(layout: _Layout) -> dict[str, str]:
    return dict(os.environ, SLURM_CONF=str(layout.slurm_conf))


def _start_munged(layout: _Layout) -> bool:
    """Start munged unless one runs already. Returns True when this call started it."""
    running = _find_procs("munged")
    if running:
        logger.info("reusing running munged (pid %s)", ", ".join(map(str, running)))
        return False
    _MUNGE_RUN_DIR.mkdir(parents=True, exist_ok=True)
    shutil.chown(_MUNGE_RUN_DIR, "munge", "munge")
    os.chmod(_MUNGE_RUN_DIR, 0o755)
    munge_pidfile = _MUNGE_RUN_DIR / "munged.pid"
    with contextlib.suppress(FileNotFoundError):
        munge_pidfile.unlink()
    _spawn([_need_bin("runuser"), "-u", "munge", "--", _need_bin("munged"), "--num-threads=10",
            f"--pid-file={munge_pidfile}"], layout.log / "munged.out")

    def ready() -> bool:
        pid = _read_pid(munge_pidfile)
        return bool(pid) and _alive(pid, "munged") and _unix_socket_open(_MUNGE_SOCKET)

    _wait_for(ready, 15, "munged", on_timeout=lambda: _tail(layout.log / "munged.out"))
    _write(layout.pidfile("munged"), f"{_read_pid(munge_pidfile)}\n", 0o644)
    return True


def _start_mariadb(layout: _Layout) -> None:
    """Initialise (once) and start MariaDB on its own datadir/socket/port, create the slurm user."""
    if not (layout.datadir / "mysql").is_dir():
        logger.info("initialising MariaDB in %s", layout.datadir)
        shutil.rmtree(layout.datadir, ignore_errors=True)
        layout.datadir.mkdir(parents=True)
        try:
            _run([_need_bin("mariadb-install-db"), "--no-defaults", "--user=root",
                  f"--datadir={layout.datadir}", "--auth-root-authentication-method=normal"], timeout=180)
        except DevClusterError:
            shutil.rmtree(layout.datadir, ignore_errors=True)
            raise
    pidfile = layout.pidfile("mariadb")
    with contextlib.suppress(FileNotFoundError):
        pidfile.unlink()
    log = layout.log / "mariadb.log"
    # mariadbd does not daemonize: `setsid --fork` detaches it so that it outlives this process.
    _spawn([_need_bin("setsid"), "--fork", _need_bin("mariadbd"), "--no-defaults", "--user=root",
            f"--datadir={layout.datadir}", f"--socket={layout.db_socket}", "--bind-address=127.0.0.1",
            f"--port={MARIADB_PORT}", f"--pid-file={pidfile}", f"--log-error={log}",
            "--innodb-buffer-pool-size=64M"], layout.log / "mariadb.out")

    def ready() -> bool:
        pid = _read_pid(pidfile)
        if pid and not _alive(pid):
            raise DevClusterError(f"mariadbd exited during start: {_tail(log)}")
        return bool(pid) and _unix_socket_open(layout.db_socket) and _port_open(MARIADB_PORT)

    _wait_for(ready, 60, "MariaDB", on_timeout=lambda: _tail(log))
    os.chmod(pidfile, 0o644)  # mariadbd writes it 660; status/is_up need no root
    sql = "".join(
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{host}' IDENTIFIED BY '{DB_PASSWORD}'; "
        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{host}'; "
        for host in ("127.0.0.1", "localhost")
    )
    _run([_need_bin("mariadb"), "--no-defaults", f"--socket={layout.db_socket}", "-uroot", "-e", sql], timeout=30)


def _start_daemon(layout: _Layout, name: str, args: list[str], port: int, log: Path) -> None:
    """Start a self-daemonizing Slurm daemon and wait until it listens on ``port``."""
    pidfile = layout.pidfile(name)
    with contextlib.suppress(FileNotFoundError):
        pidfile.unlink()
    _spawn(args, layout.log / f"{name}.out", env=_slurm_env_full(layout))
    comm = _COMM[_kind(name)]

    def ready() -> bool:
        pid = _read_pid(pidfile)
        if pid and not _alive(pid, comm):
            raise DevClusterError(f"{name} exited during start: {_tail(log)}")
        return bool(pid) and _port_open(port)

    _wait_for(ready, 30, name, on_timeout=lambda: _tail(log))


def _start_slurmds(layout: _Layout, nodes: int) -> None:
    slurmd = _need_bin("slurmd")
    env = _slurm_env_full(layout)
    for name in node_names(nodes):
        with contextlib.suppress(FileNotFoundError):
            layout.pidfile(f"slurmd-{name}").unlink()
        _spawn([slurmd, "-N", name], layout.log / f"slurmd-{name}.out", env=env)


def _sinfo_nodes(slurm_conf: Path) -> list[dict[str, Any]]:
    """Nodes from ``sinfo --json`` (5 s timeout): name, state, flags, gres, cpus, reason.

    :raises DevClusterError: when sinfo fails, times out or prints something that is not JSON.
    """
    cp = _run([_need_bin("sinfo"), "--json"], timeout=_SLURM_CLIENT_TIMEOUT_S,
              env=dict(os.environ, SLURM_CONF=str(slurm_conf)))
    try:
        data = json.loads(cp.stdout)
    except json.JSONDecodeError as e:
        raise DevClusterError(f"sinfo --json printed no JSON: {cp.stdout[:200]!r}") from e
    out = []
    for n in data.get("nodes", []):
        out.append({
            "name": n.get("name") or n.get("hostname"),
            "state": str(n.get("state", "")).lower(),
            "flags": [str(f).upper() for f in n.get("state_flags") or []],
            "gres": n.get("gres", ""),
            "cpus": n.get("cpus"),
            "reason": n.get("reason") or "",
        })
    return sorted(out, key=lambda n: (len(n["name"] or ""), n["name"] or ""))


#: Node states that count as "up": idle, or busy with jobs restored from saved state (no ``-c``).
_READY_STATES = frozenset({"idle", "mixed", "allocated"})
_BAD_FLAGS = frozenset({"DRAIN", "NOT_RESPONDING", "DOWN", "FAIL", "MAINTENANCE", "POWERED_DOWN", "REBOOT_REQUESTED"})


def _node_ready(n: dict[str, Any]) -> bool:
    return n["state"] in _READY_STATES and not _BAD_FLAGS & set(n["flags"])


def _wait_nodes_ready(layout: _Layout, nodes: int, deadline_s: float = 60.0) -> None:
    """Poll ``sinfo --json`` (every 0.2 s, 5 s timeout per call) until all nodes are idle, or
    mixed/allocated when jobs restored from saved state run on them. Nodes still DRAINED from saved
    state are resumed once (slurmctld keeps DRAIN across restarts without -c)."""
    want = set(node_names(nodes))
    resumed: set[str] = set()
    last: list[dict[str, Any]] = []
    ctld_pidfile = layout.pidfile("slurmctld")

    def ready() -> bool:
        nonlocal last
        if not _alive(_read_pid(ctld_pidfile), "slurmctld"):
            raise DevClusterError(f"slurmctld died: {_tail(layout.log / 'slurmctld.log')}")
        for name in want:
            pid = _read_pid(layout.pidfile(f"slurmd-{name}"))
            if pid and not _alive(pid, "slurmd"):
                raise DevClusterError(f"slurmd {name} died: {_tail(layout.log / f'slurmd-{name}.log')}")
        try:
            last = [n for n in _sinfo_nodes(layout.slurm_conf) if n["name"] in want]
        except DevClusterError as e:
            logger.debug("sinfo not ready: %s", e)
            return False
        drained = [n["name"] for n in last if "DRAIN" in n["flags"] and n["name"] not in resumed]
        if drained:
            logger.warning("resuming nodes left drained by saved state: %s", ",".join(drained))
            _run([_need_bin("scontrol"), "update", f"NodeName={','.join(drained)}", "State=RESUME"],
                 timeout=_SLURM_CLIENT_TIMEOUT_S, env=_slurm_env_full(layout), check=False)
            resumed.update(drained)
        return len(last) == len(want) and all(_node_ready(n) for n in last)

    def describe() -> str:
        states = ", ".join(f"{n['name']}={n['state']}{'+' + '+'.join(n['flags']) if n['flags'] else ''}"
                           f"{' (' + n['reason'] + ')' if n['reason'] else ''}" for n in last)
        return (states or "sinfo answered nothing") + " " + _tail(layout.log / "slurmctld.log", 4)

    _wait_for(ready, deadline_s, f"{nodes} idle nodes", on_timeout=describe, interval=0.2)


# --------------------------------------------------------------------------------------------
# Manifest, lock, root
# --------------------------------------------------------------------------------------------


def _read_manifest(layout: _Layout) -> dict[str, Any] | None:
    try:
        return json.loads(layout.manifest.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _write_manifest(layout: _Layout, manifest: dict[str, Any]) -> None:
    _write(layout.manifest, json.dumps(manifest, indent=2) + "\n", 0o644)


@contextlib.contextmanager
def _locked(layout: _Layout) -> Iterator[None]:
    """Serialise up/down on one state directory (flock on STATE/.lock; not inherited by daemons)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise DevClusterError(f"`hpcsched devcluster {action}` must run as root (it installs packages, "
                              "creates device files and runs the Slurm daemons as root); try sudo")


def _manifest_alive(layout: _Layout, manifest: dict[str, Any] | None) -> bool:
    if not manifest:
        return False
    for name in manifest.get("daemons", []):
        if not _alive(_read_pid(layout.pidfile(name)), _COMM[_kind(name)]):
            return False
    return bool(_find_procs("munged"))


def _geometry(manifest: dict[str, Any]) -> tuple[int, int, int]:
    return int(manifest["nodes"]), int(manifest["gpus"]), int(manifest["cpus"])


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def slurm_env(state_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Environment additions for Slurm clients talking to this cluster: ``{"SLURM_CONF": path}``.

    Pure: does not check that the cluster is up (see :func:`is_up`).
    """
    return {"SLURM_CONF": str(_Layout(state_dir).slurm_conf)}


def is_up(state_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when ``up`` completed in ``state_dir`` and every daemon it started still runs
    (zombies count as dead) and a munged runs. Does not query Slurm; needs no root."""
    layout = _Layout(state_dir)
    return _manifest_alive(layout, _read_manifest(layout))


def up(state_dir: str | os.PathLike[str] | None = None, nodes: int = 4, gpus: int = 4, cpus: int = 8,
       clean: bool = False, install: bool = True) -> Path:
    """Start the dev cluster (or find it already up) and return the path of its ``slurm.conf``.

    Starts munged (unless one runs), MariaDB (port 16820), slurmdbd (16819), slurmctld (16817) and
    one slurmd per node (17001+), then waits until all ``nodes`` nodes are idle (or busy with jobs
    restored from saved state; deadline 60 s). Takes about 1-2.5 s on
    the reference machine once installed (notes, §2); the first job is scheduled about 3 s later.

    :param state_dir: state directory (default :func:`default_state_dir`).
    :param nodes: emulated nodes (1..254). :param gpus: fake GPUs per node (0..64).
    :param cpus: CPUs per node as Slurm sees them.
    :param clean: start slurmctld with ``-c``: discard saved jobs and node states.
    :param install: apt-get install the packages when a needed binary is missing.
    :returns: absolute path of ``STATE/etc/slurm.conf`` (export it as ``SLURM_CONF``).
    :raises DevClusterError: not root; geometry out of range; the cluster is up with another
        geometry (run ``down`` first); a port is taken; install failed; a daemon failed to start
        or the nodes did not become idle within the deadline (what was started is stopped again).
    """
    _check_geometry(nodes, gpus, cpus)
    _require_root("up")
    layout = _Layout(state_dir)
    with _locked(layout):
        manifest = _read_manifest(layout)
        if _manifest_alive(layout, manifest):
            have = _geometry(manifest)
            if have != (nodes, gpus, cpus):
                raise DevClusterError(
                    f"the dev cluster in {layout.root} is already up with {have[0]} nodes x {have[1]} GPUs x "
                    f"{have[2]} CPUs (asked: {nodes} x {gpus} x {cpus}); run "
                    f"`hpcsched devcluster down --state-dir {layout.root}` first")
            if clean:
                logger.warning("already up; --clean ignored (run down first to discard saved jobs)")
            logger.info("dev cluster already up in %s (%d nodes x %d GPUs x %d CPUs); nothing to do",
                        layout.root, nodes, gpus, cpus)
            return layout.slurm_conf
        leftovers = _stop_all(layout)
        if leftovers:
            logger.warning("stopped leftovers of an incomplete cluster: %s", ", ".join(leftovers))
        with contextlib.suppress(FileNotFoundError):
            layout.manifest.unlink()

        t0 = time.monotonic()
        _ensure_installed(install)
        ports = {"slurmctld": SLURMCTLD_PORT, "slurmdbd": SLURMDBD_PORT, "MariaDB": MARIADB_PORT,
                 **{f"slurmd {n}": NODE_PORT_BASE + k for k, n in enumerate(node_names(nodes), 1)}}
        taken = [f"{p} ({who})" for who, p in ports.items() if _port_open(p)]
        if taken:
            raise DevClusterError(f"port(s) {', '.join(taken)} already in use on 127.0.0.1: another Slurm or "
                                  "dev cluster (another --state-dir?) is running; stop it first")
        _write_configs(layout, nodes, gpus, cpus)
        daemons: list[str] = []  # what this call started, in start order
        try:
            started_munged = _start_munged(layout)
            daemons += ["munged"] if started_munged else []
            t1 = time.monotonic()
            _start_mariadb(layout)
            daemons.append("mariadb")
            logger.info("MariaDB up (%.1f s)", time.monotonic() - t1)
            _start_daemon(layout, "slurmdbd", [_need_bin("slurmdbd")], SLURMDBD_PORT, layout.log / "slurmdbd.log")
            daemons.append("slurmdbd")
            ctld = [_need_bin("slurmctld"), "-i"] + (["-c"] if clean else [])
            _start_daemon(layout, "slurmctld", ctld, SLURMCTLD_PORT, layout.log / "slurmctld.log")
            daemons.append("slurmctld")
            _start_slurmds(layout, nodes)
            daemons += [f"slurmd-{n}" for n in node_names(nodes)]
            _wait_nodes_ready(layout, nodes)
        except BaseException:
            # Cleanup goes by the PID files the daemons wrote, so it also covers a half-started one.
            logger.error("start failed; stopping what was started (logs stay in %s)", layout.log)
            _stop_all(layout)
            raise
        _write_manifest(layout, {
            "version": 1, "state_dir": str(layout.root), "slurm_conf": str(layout.slurm_conf),
            "cluster_name": CLUSTER_NAME, "partition": PARTITION,
            "nodes": nodes, "gpus": gpus, "cpus": cpus, "node_names": node_names(nodes),
            "ports": {"slurmctld": SLURMCTLD_PORT, "slurmd": SLURMD_PORT, "slurmdbd": SLURMDBD_PORT,
                      "mariadb": MARIADB_PORT, "nodes": [NODE_PORT_BASE + k for k in range(1, nodes + 1)]},
            "munged": "started" if started_munged else "reused",
            "daemons": daemons,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "startup_s": round(time.monotonic() - t0, 3),
        })
        logger.info("dev cluster up in %.1f s: %d nodes x %d GPUs x %d CPUs, SLURM_CONF=%s",
                    time.monotonic() - t0, nodes, gpus, cpus, layout.slurm_conf)
    return layout.slurm_conf


def down(state_dir: str | os.PathLike[str] | None = None) -> bool:
    """Stop the daemons ``up`` started in ``state_dir`` (by their PID files; a reused munged is
    left alone), slurmd first, then slurmctld, slurmdbd, MariaDB, munged: SIGTERM, then SIGKILL after
    a deadline (20 s; 60 s for MariaDB); zombies count as dead (notes, §6.8).

    Saved Slurm state (jobs, node DRAIN) and the database stay for the next ``up``.
    Job steps still running are not killed by Slurm when slurmd stops; none should be left in a
    dev cluster, so cancel jobs before ``down`` when that matters.

    :returns: True when something was stopped, False when it was already down.
    :raises DevClusterError: not root while there are daemons to stop.
    """
    layout = _Layout(state_dir)
    if not layout.root.is_dir():
        return False
    live = [n for n, pid in _pidfile_daemons(layout).items() if _alive(pid, _COMM[_kind(n)])]
    if live:
        _require_root("down")
    with _locked(layout):
        stopped = _stop_all(layout)
        with contextlib.suppress(FileNotFoundError):
            layout.manifest.unlink()
    return bool(stopped)


def status(state_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Describe the cluster in ``state_dir``; needs no root.

    :returns: ``{"up": bool, "state_dir", "slurm_conf", "geometry": {"nodes","gpus","cpus"} | None,
        "daemons": [{"name", "pid", "running", "started_by_us"}], "nodes": [{"name", "state", "flags",
        "gres", "cpus", "reason"}], "error": str | None}``; nodes come from ``sinfo --json`` (5 s timeout)
        and are empty when slurmctld is not running.
    """
    layout = _Layout(state_dir)
    manifest = _read_manifest(layout)
    daemons = []
    pids = _pidfile_daemons(layout)
    names = list(manifest.get("daemons", [])) if manifest else []
    names += [n for n in pids if n not in names]
    order = {k: i for i, k in enumerate(reversed(_STOP_ORDER))}
    names.sort(key=lambda n: (order[_kind(n)], len(n), n))
    for n in names:
        pid = _read_pid(layout.pidfile(n))
        daemons.append({"name": n, "pid": pid, "running": _alive(pid, _COMM[_kind(n)]), "started_by_us": True})
    if "munged" not in names:
        munged = _find_procs("munged")
        daemons.insert(0, {"name": "munged", "pid": munged[0] if munged else None, "running": bool(munged),
                           "started_by_us": False})
    result: dict[str, Any] = {
        "up": _manifest_alive(layout, manifest),
        "state_dir": str(layout.root),
        "slurm_conf": str(layout.slurm_conf),
        "geometry": dict(zip(("nodes", "gpus", "cpus"), _geometry(manifest))) if manifest else None,
        "daemons": daemons,
        "nodes": [],
        "error": None,
    }
    if any(d["name"] == "slurmctld" and d["running"] for d in daemons):
        try:
            result["nodes"] = _sinfo_nodes(layout.slurm_conf)
        except DevClusterError as e:
            result["error"] = str(e)
    return result


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (click's test runner swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _cli_logging() -> None:
    """Progress messages to stderr at INFO, even when the root logger is at WARNING."""
    if getattr(logger, "_devcluster_cli", False):
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("devcluster: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(min(logging.INFO, logging.getLogger().getEffectiveLevel()))
    logger._devcluster_cli = True  # type: ignore[attr-defined]


_state_dir_option = click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path), envvar=STATE_DIR_ENV,
    default=DEFAULT_STATE_DIR, show_default=True,
    help=f"Directory for configs, PID files, logs and the database (env {STATE_DIR_ENV}).")


@click.group("devcluster")
def devcluster() -> None:
    """A local Slurm 22.05 cluster with fake GPUs for development: up, down, status.

    \b
    eval "$(sudo hpcsched devcluster up)"    # starts it, sets SLURM_CONF
    hpcsched devcluster status
    sudo hpcsched devcluster down
    """
    _cli_logging()


@devcluster.command("up")
@click.option("--nodes", type=int, default=4, show_default=True, help="Emulated nodes n1..nN.")
@click.option("--gpus", type=int, default=4, show_default=True, help="Fake GPUs per node.")
@click.option("--cpus", type=int, default=8, show_default=True, help="CPUs per node.")
@_state_dir_option
@click.option("--clean", is_flag=True, help="Discard saved Slurm jobs and node states (slurmctld -c).")
@click.option("--no-install", is_flag=True, help="Never apt-get install; fail if a binary is missing.")
def up_command(nodes: int, gpus: int, cpus: int, state_dir: Path, clean: bool, no_install: bool) -> None:
    """Start the cluster (idempotent) and print `export SLURM_CONF=...` on stdout."""
    try:
        conf = up(state_dir, nodes=nodes, gpus=gpus, cpus=cpus, clean=clean, install=not no_install)
    except DevClusterError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"export SLURM_CONF={shlex.quote(str(conf))}")


@devcluster.command("down")
@_state_dir_option
def down_command(state_dir: Path) -> None:
    """Stop the daemons `up` started (idempotent)."""
    try:
        stopped = down(state_dir)
    except DevClusterError as e:
        raise click.ClickException(str(e)) from e
    if not stopped:
        logger.info("dev cluster in %s is not running; nothing to stop", _Layout(state_dir).root)


@devcluster.command("status")
@_state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def status_command(ctx: click.Context, state_dir: Path, as_json: bool) -> None:
    """Show daemons and nodes. Exit status 0 when up, 3 when down."""
    try:
        st = status(state_dir)
    except DevClusterError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(st, indent=2))
    else:
        g = st["geometry"]
        shape = f" ({g['nodes']} nodes x {g['gpus']} GPUs x {g['cpus']} CPUs)" if g else ""
        click.echo(f"dev cluster {st['state_dir']}: {'up' if st['up'] else 'down'}{shape}")
        for d in st["daemons"]:
            who = "" if d["started_by_us"] else " (not started by devcluster)"
            state = f"running, pid {d['pid']}" if d["running"] else "not running"
            click.echo(f"  {d['name']:<12} {state}{who}")
        if st["nodes"]:
            click.echo("nodes:")
            for n in st["nodes"]:
                flags = "+" + "+".join(n["flags"]) if n["flags"] else ""
                reason = f"  ({n['reason']})" if n["reason"] else ""
                click.echo(f"  {n['name']:<6} {n['state'] + flags:<12} gres={n['gres'] or '-'} cpus={n['cpus']}{reason}")
        if st["error"]:
            click.echo(f"sinfo: {st['error']}")
        if st["up"]:
            click.echo(f"export SLURM_CONF={shlex.quote(st['slurm_conf'])}")
    ctx.exit(0 if st["up"] else 3)
