"""What every part of the dev cluster shares: its constants (ports, names, geometry limits),
:class:`DevClusterError`, the state-directory :class:`Layout`, and small helpers to find
programs, run commands (argument lists with timeouts), start self-daemonizing ones, poll with a
deadline and probe ports. Facts: ``docs/slurm-22.05-notes.md`` §2 (ports, paths) and §6."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Every module of the package logs to the package's logger, the one the CLI shows on stderr.
logger = logging.getLogger("hpcsched.slurm.devcluster")


#: Default state directory when neither ``--state-dir`` nor ``HPCSCHED_DEVCLUSTER_DIR`` is given.
DEFAULT_STATE_DIR = "/var/lib/hpcsched/devcluster"
STATE_DIR_ENV = "HPCSCHED_DEVCLUSTER_DIR"

CLUSTER_NAME = "lab"
PARTITION = "gpu"
#: the preemptible QOS for extension jobs (``docs/daemon.md``, "Sharing the cluster"): every
#: other QOS may preempt it; a job in it has ``GraceTime`` seconds to leave
LEND_QOS = "hpcsched-lend"
LEND_GRACE_S = 60
SLURMCTLD_PORT = 16817
SLURMD_PORT = 16818  # SlurmdPort; every emulated node overrides it with its own Port=
SLURMDBD_PORT = 16819
MARIADB_PORT = 16820
NODE_PORT_BASE = 17000  # node nK listens on NODE_PORT_BASE + K
NODE_REAL_MEMORY_MB = 16000
GPU_DEVICE_MAJOR = 195  # the NVIDIA character-device major number
DB_USER, DB_PASSWORD, DB_NAME = "slurm", "slurmpw", "slurm_acct_db"
#: nodes on one host; node nK of a cluster over :data:`SMALL_NODES` nodes has its address and
#: port from :func:`node_addr` and :meth:`Ports.node` (``docs/devcluster.md``, "A large cluster")
MAX_NODES = 1024
#: nodes n1..n254 are at 127.0.0.K and port ``node_base + K``, as the small clusters always were
SMALL_NODES = 254
#: nodes n255 and up listen from here (``LARGE_NODE_PORT_BASE + K - 254``): above the kernel's
#: ephemeral range (32768-60999 by default, where jobs' outgoing connections take ports) and
#: the jobs' rank-0 stores (20000 up to that range), so only one large cluster runs per host
LARGE_NODE_PORT_BASE = 61000


def node_addr(k: int) -> str:
    """Loopback address of node ``nK``: ``127.0.0.K`` up to :data:`SMALL_NODES`, then
    ``127.0.(K // 254).(K % 254 + 1)`` (the whole of 127/8 answers on loopback, no setup)."""
    if k <= SMALL_NODES:
        return f"127.0.0.{k}"
    return f"127.0.{k // SMALL_NODES}.{k % SMALL_NODES + 1}"


@dataclass(frozen=True)
class Ports:
    """The TCP ports one cluster's Slurm daemons use, whether it runs slurmdbd (accounting), and
    its cgroup plugin: what differs between the host's cluster and the chroot ones."""

    slurmctld: int = SLURMCTLD_PORT
    slurmd: int = SLURMD_PORT       # SlurmdPort; every node overrides it with node_base + K
    node_base: int = NODE_PORT_BASE
    slurmdbd: int = SLURMDBD_PORT
    mariadb: int = MARIADB_PORT
    #: slurm.conf ``FirstJobId``: clusters side by side never hand out the same job id (a job's
    #: rank-0 store port is derived from its id: ``job.launcher.master_port``)
    first_job_id: int = 1
    accounting: bool = True
    cgroup_plugin: str = "autodetect"  # cgroup.conf CgroupPlugin=
    #: wire hpcsched's Slurm-side plugins (job_submit.lua, prolog, epilog), each off until
    #: ``hpcsched devcluster plugins on`` (:mod:`hpcsched.slurm.devcluster.plugins`)
    slurm_plugins: bool = True

    def node(self, k: int) -> int:
        """Port of node ``nK``: ``node_base + K`` up to :data:`SMALL_NODES`, then
        ``LARGE_NODE_PORT_BASE + K - SMALL_NODES``."""
        return self.node_base + k if k <= SMALL_NODES else LARGE_NODE_PORT_BASE + k - SMALL_NODES

    def all(self, nodes: int) -> dict[str, int]:
        """Every TCP port the cluster listens on, by daemon (``slurmd nK`` per node)."""
        ports = {"slurmctld": self.slurmctld}
        if self.accounting:
            ports |= {"slurmdbd": self.slurmdbd, "MariaDB": self.mariadb}
        return ports | {f"slurmd n{k}": self.node(k) for k in range(1, nodes + 1)}


#: The host's 22.05 dev cluster.
DEFAULT_PORTS = Ports()

#: Further host 22.05 clusters side by side (:func:`instance_ports`: the test suite runs one per
#: pytest-xdist worker): instance K listens from ``INSTANCE_PORT_BASE + K x INSTANCE_PORT_STEP``,
#: between the chroot clusters' ports (up to 17854) and 20000, where jobs' rank-0 stores start
#: (``job.launcher.PORT_BASE``).
INSTANCE_PORT_BASE = 17900
INSTANCE_PORT_STEP = 300
MAX_INSTANCE = 6


def instance_ports(instance: int) -> Ports:
    """The ports of host cluster number ``instance``: 0 is :data:`DEFAULT_PORTS`; 1..6 are
    further clusters that run beside it (each with its own state directory, MariaDB and
    slurmdbd): nodes at ``base + K``, slurmctld/SlurmdPort/slurmdbd/MariaDB at ``base + 260..263``
    with ``base = 17900 + instance x 300``; job ids from ``instance x 100,000 + 1``.

    :raises DevClusterError: ``instance`` outside 0..6.
    """
    if instance == 0:
        return DEFAULT_PORTS
    if not 1 <= instance <= MAX_INSTANCE:
        raise DevClusterError(f"cluster instance must be between 0 and {MAX_INSTANCE}, got {instance}")
    base = INSTANCE_PORT_BASE + instance * INSTANCE_PORT_STEP
    return Ports(slurmctld=base + 260, slurmd=base + 261, slurmdbd=base + 262, mariadb=base + 263,
                 node_base=base, first_job_id=1 + instance * 100_000)


#: apt packages installed when a needed binary is missing (never slurm-wlm-emulator, see the notes).
APT_PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server")

_SBIN_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

POLL_S = 0.1  # seconds between two checks of wait_for


class DevClusterError(RuntimeError):
    """A dev-cluster operation failed; the message says what and what to do."""


def default_state_dir() -> Path:
    """The state directory used when none is given: ``$HPCSCHED_DEVCLUSTER_DIR`` or
    ``/var/lib/hpcsched/devcluster``."""
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


class Layout:
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
        # MariaDB's temporary files, this cluster's own: two clusters initialised at the same
        # second in a shared /tmp failed ("Could not remove temporary table '/tmp/#sql-...'")
        self.db_tmp = self.db / "tmp"
        self.slurm_conf = self.etc / "slurm.conf"
        self.manifest = self.root / "cluster.json"
        self.ports = self.root / "ports.json"
        self.lock = self.root / ".lock"

    def pidfile(self, name: str) -> Path:
        """``run/<name>.pid``: where daemon ``name`` (``slurmctld``, ``slurmd-n3``, ...) keeps its PID."""
        return self.run / f"{name}.pid"


def find_bin(name: str) -> str | None:
    """Full path of a program, also looking in the sbin directories a non-root PATH may lack."""
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(_SBIN_PATH)
    return shutil.which(name, path=path)


def need_bin(name: str) -> str:
    """Full path of a program that must be installed.

    :raises DevClusterError: it is not installed (the message says which packages provide it).
    """
    found = find_bin(name)
    if found is None:
        raise DevClusterError(f"{name} not found; run `hpcsched devcluster up` (it installs it) or "
                              f"apt-get install {' '.join(APT_PACKAGES)}")
    return found


def run_cmd(args: Sequence[str], *, timeout: float, env: dict[str, str] | None = None,
            check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a short, non-daemonizing command and capture its output (argument list, timeout in s).

    :raises DevClusterError: the program is missing, timed out, or (with ``check``) exited non-zero;
        the message ends with the last lines of its output.
    """
    logger.debug("run: %s", shlex.join(args))
    try:
        cp = subprocess.run(list(args), check=False, input=input, capture_output=True, text=True,
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


def spawn(args: Sequence[str], log_path: Path, *, env: dict[str, str] | None = None,
          timeout: float = 30.0) -> None:
    """Run a command that daemonizes itself. Its stdio goes to ``log_path`` (never a pipe we wait on,
    or the caller of ``eval "$(hpcsched devcluster up)"`` would block until the daemon exits)."""
    logger.debug("spawn: %s", shlex.join(args))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        try:
            rc = subprocess.run(list(args), check=False, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except FileNotFoundError as e:
            raise DevClusterError(f"{args[0]}: not found") from e
        except subprocess.TimeoutExpired as e:
            raise DevClusterError(f"`{shlex.join(args)}` did not return within {timeout:g} s") from e
    if rc != 0:
        raise DevClusterError(f"`{shlex.join(args)}` exited {rc}: {tail(log_path)}")


def tail(path: Path, lines: int = 6) -> str:
    """Last lines of a log file, joined on one line, for error messages."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    return f"[{path}] " + " | ".join(text[-lines:])


def wait_for(check, deadline_s: float, what: str, on_timeout=None, interval: float = POLL_S) -> None:
    """Poll ``check()`` every ``interval`` s until it returns true, or raise after ``deadline_s`` s.

    ``check`` may itself raise :class:`DevClusterError` to fail fast (a daemon that died).
    """
    end = time.monotonic() + deadline_s
    while True:
        if check():
            return
        if time.monotonic() >= end:
            extra = on_timeout() if on_timeout else ""
            raise DevClusterError(f"timed out after {deadline_s:g} s waiting for {what}"
                                  + (f": {extra}" if extra else ""))
        time.sleep(interval)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port`` (0.5 s timeout)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def unix_socket_open(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket ``path`` (0.5 s timeout)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
        return True


def write_file(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, then rename) with permissions ``mode``."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
