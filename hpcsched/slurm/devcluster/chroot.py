"""Dev clusters of later Slurm versions, run from a Debian chroot beside the host's 22.05 one.

``hpcsched devcluster up --slurm 24.11`` (Debian trixie) or ``--slurm 26.05`` (Debian sid) builds,
once, a ``debootstrap --variant=minbase`` chroot under ``/var/lib/hpcsched/chroots/<suite>`` with
``slurmctld slurmd slurm-client munge``, then runs that chroot's munged, slurmctld and one slurmd
per node with ``chroot ROOT ...``. Everything else is the host cluster's design (same
``slurm.conf`` rendering, fake GPUs, PID files, stop order), with these differences:

* its own ports (:data:`VERSIONS`), so that it runs beside the host's 22.05 cluster, and its own
  state directory, default ``/var/lib/hpcsched/devcluster-<version>``;
* no slurmdbd (``accounting_storage/none``): ``sacct`` does not work on it;
* its own munged and key (the chroot's ``/run/munge``), so its clients must run in the chroot too:
  :func:`client` gives the command prefix (``chroot ROOT``), e.g.
  ``chroot /var/lib/hpcsched/chroots/trixie env SLURM_CONF=STATE/etc/slurm.conf squeue --json``;
* ``STATE/bin`` holds wrappers named like the clients (:func:`write_client_wrappers`): with it
  first in ``PATH``, code that runs ``squeue``/``sbatch``/``scontrol`` (hpcsched, its tests) uses
  this version's cluster unchanged;
* bind mounts into the chroot, at the same paths: ``/proc``, ``/dev``, ``/sys``, the state
  directory, and (when they exist) ``/work``, ``/root/.pyenv`` and ``/tmp`` so that batch scripts
  can run the hpcsched venv's python in the submitter's directory; they are unmounted by ``down``;
  the host's ``/etc/hosts`` is copied in (slurmctld must resolve the host name clients report).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

from hpcsched.slurm.devcluster.base import (
    CLUSTER_NAME,
    PARTITION,
    DevClusterError,
    Layout,
    Ports,
    find_bin,
    port_open,
    run_cmd,
    spawn,
    tail,
    unix_socket_open,
    wait_for,
    write_file,
)
from hpcsched.slurm.devcluster.config import check_geometry, node_names, write_configs
from hpcsched.slurm.devcluster.processes import COMM, alive, daemon_kind, pidfile_daemons, read_pid, stop_all

logger = logging.getLogger("hpcsched.slurm.devcluster")  # the package's logger (see base)

CHROOTS_DIR = Path("/var/lib/hpcsched/chroots")
HOST_VERSION = "22.05"


class Version(NamedTuple):
    """One Slurm version runnable from a chroot: its Debian suite and its ports."""

    suite: str
    ports: Ports


#: Slurm versions the dev cluster can run from a chroot (Debian packages slurm-wlm), with ports
#: that do not meet the host cluster's (16817-16820, 17001-17254) nor each other's.
VERSIONS = {
    "24.11": Version("trixie", Ports(slurmctld=16917, slurmd=16918, node_base=17300, accounting=False,
                                     slurm_plugins=False, cgroup_plugin="disabled")),
    "26.05": Version("sid", Ports(slurmctld=16927, slurmd=16928, node_base=17600, accounting=False,
                                  slurm_plugins=False, cgroup_plugin="disabled")),
}
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
_BINDS = ("/dev", "/sys")
_OPTIONAL_BINDS = ("/work", "/root/.pyenv", "/tmp")
_CLIENT_TIMEOUT_S = 10.0


def _version(version: str) -> Version:
    try:
        return VERSIONS[version]
    except KeyError:
        raise DevClusterError(f"--slurm {version}: expected one of {HOST_VERSION}, {', '.join(VERSIONS)}") from None


def chroot_dir(version: str) -> Path:
    """``/var/lib/hpcsched/chroots/<suite>`` of a version in :data:`VERSIONS`."""
    return CHROOTS_DIR / _version(version).suite


def default_state_dir(version: str) -> Path:
    """``/var/lib/hpcsched/devcluster-<version>``."""
    _version(version)
    return Path(f"/var/lib/hpcsched/devcluster-{version}")


def client(version: str) -> list[str]:
    """The prefix that runs a Slurm client of this version's chroot: ``["chroot", ROOT]``."""
    return [find_bin("chroot") or "chroot", str(chroot_dir(version))]


def apt_mirror(sources: tuple[str, ...] = ("/etc/apt/sources.list", "/etc/apt/sources.list.d")) -> str:
    """The first ``deb.debian.org``-style Debian mirror configured for apt (``URIs:`` or ``deb``
    lines, main archive, not security), else ``http://deb.debian.org/debian``."""
    files: list[Path] = []
    for s in map(Path, sources):
        files += sorted(s.iterdir()) if s.is_dir() else [s]
    for f in files:
        with contextlib.suppress(OSError):
            for m in re.finditer(r"(?m)^(?:URIs:|deb)\s+(\S+/debian)/?\s*$|^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s",
                                 f.read_text()):
                return m.group(1) or m.group(2)
    return "http://deb.debian.org/debian"


def build_chroot(version: str, install: bool = True) -> Path:
    """Create the version's chroot with debootstrap unless it has ``slurmctld`` already.

    Takes 3-6 minutes on the reference machine (downloads about 100 MB).

    :raises DevClusterError: no chroot and ``install`` is False, no debootstrap, or it failed.
    """
    root = chroot_dir(version)
    if (root / "usr/sbin/slurmctld").exists():
        return root
    if not install:
        raise DevClusterError(f"no chroot at {root} and --no-install given")
    debootstrap = find_bin("debootstrap")
    if debootstrap is None:
        raise DevClusterError("debootstrap not found: apt-get install debootstrap")
    suite = _version(version).suite
    logger.info("building the %s chroot (Debian %s) in %s; this takes minutes", version, suite, root)
    root.parent.mkdir(parents=True, exist_ok=True)
    run_cmd([debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(root),
             apt_mirror()], timeout=1800)
    return root


def _mounts(layout: Layout) -> list[str]:
    return ["/proc", *_BINDS, str(layout.root), *(p for p in _OPTIONAL_BINDS if os.path.isdir(p))]


def _is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def mount_all(root: Path, layout: Layout) -> list[str]:
    """Bind ``/proc /dev /sys``, the state directory and ``/work``, ``/root/.pyenv``, ``/tmp`` into the chroot
    at the same paths (each once). Returns the host paths mounted."""
    done = []
    for src in _mounts(layout):
        target = root / src.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        if not _is_mounted(target):
            args = ["-t", "proc", "proc"] if src == "/proc" else ["--bind", src]
            run_cmd([find_bin("mount") or "mount", *args, str(target)], timeout=30)
        done.append(src)
    return done


def unmount_all(root: Path, mounts: list[str]) -> None:
    """Unmount what :func:`mount_all` mounted, in reverse order (lazily: ``umount -l``)."""
    for src in reversed(mounts):
        target = root / src.lstrip("/")
        if _is_mounted(target):
            run_cmd([find_bin("umount") or "umount", "-l", str(target)], timeout=30, check=False)


def _start_munged(root: Path, layout: Layout) -> None:
    """The chroot's own munged (its key, its /run/munge), PID copied to ``run/munged.pid``."""
    pre = client_prefix(root)
    if not (root / "etc/munge/munge.key").exists():
        run_cmd([*pre, "mungekey", "--create"], timeout=30)
        run_cmd([*pre, "chown", "munge:munge", "/etc/munge/munge.key"], timeout=30)
    (root / "run/munge").mkdir(parents=True, exist_ok=True)
    run_cmd([*pre, "chown", "munge:munge", "/run/munge"], timeout=30)
    pidfile = root / "run/munge/munged.pid"
    with contextlib.suppress(FileNotFoundError):
        pidfile.unlink()
    spawn([*pre, "runuser", "-u", "munge", "--", "munged", "--num-threads=10",
           "--pid-file=/run/munge/munged.pid"], layout.log / "munged.out")

    def ready() -> bool:
        pid = read_pid(pidfile)
        return bool(pid) and alive(pid, "munged") and unix_socket_open(root / "run/munge/munge.socket.2")

    wait_for(ready, 15, "munged", on_timeout=lambda: tail(layout.log / "munged.out"))
    write_file(layout.pidfile("munged"), f"{read_pid(pidfile)}\n", 0o644)


CLIENTS = ("sbatch", "squeue", "scontrol", "sinfo", "scancel", "srun", "salloc", "sacct", "sstat")

_WRAPPER = """#!/bin/sh
# Written by `hpcsched devcluster up --slurm {version}`: runs the chroot's Slurm client of the
# same name in the caller's directory; inside the chroot (a job's PATH) the chroot's own binary.
n=$(basename "$0")
if [ -x "{root}/usr/bin/$n" ]; then
  exec {chroot} "{root}" /bin/sh -c 'cd "$0" 2>/dev/null; exec "$@"' "$PWD" "/usr/bin/$n" "$@"
fi
exec "/usr/bin/$n" "$@"
"""


def write_client_wrappers(version: str, layout: Layout) -> Path:
    """``STATE/bin/{sbatch,squeue,scontrol,...}``: put it first in PATH (with SLURM_CONF) and
    unchanged code and tests, hpcsched's included, talk to this version's cluster. Returns the
    directory."""
    bindir = layout.root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    root = chroot_dir(version)
    write_file(bindir / "slurm-client", _WRAPPER.format(version=version, root=root, chroot=client(version)[0]), 0o755)
    for name in CLIENTS:
        link = bindir / name
        if not link.is_symlink():
            link.symlink_to("slurm-client")
    return bindir


def client_prefix(root: Path) -> list[str]:
    """``["chroot", ROOT]``."""
    return [find_bin("chroot") or "chroot", str(root)]


def _start_slurm(root: Path, layout: Layout, ports: Ports, nodes: int, clean: bool) -> list[str]:
    from hpcsched.slurm.devcluster.daemons import wait_nodes_ready  # noqa: PLC0415 (cycle-free, lazy)

    pre = client_prefix(root)
    env = dict(os.environ, SLURM_CONF=str(layout.slurm_conf))
    spawn([*pre, "slurmctld", "-i", *(["-c"] if clean else [])], layout.log / "slurmctld.out", env=env)

    def ctld_ready() -> bool:
        pid = read_pid(layout.pidfile("slurmctld"))
        if pid and not alive(pid, COMM["slurmctld"]):
            raise DevClusterError(f"slurmctld exited during start: {tail(layout.log / 'slurmctld.log')}")
        return bool(pid) and port_open(ports.slurmctld)

    wait_for(ctld_ready, 30, "slurmctld", on_timeout=lambda: tail(layout.log / "slurmctld.log"))
    for name in node_names(nodes):
        spawn([*pre, "slurmd", "-N", name], layout.log / f"slurmd-{name}.out", env=env)
    wait_nodes_ready(layout, nodes, prefix=pre)
    return ["slurmctld", *(f"slurmd-{n}" for n in node_names(nodes))]


def up(version: str, state_dir: str | os.PathLike[str] | None = None, nodes: int = 2, gpus: int = 4,
       cpus: int = 8, clean: bool = False, install: bool = True) -> Path:
    """Start the chroot dev cluster of Slurm ``version`` (or find it up); returns its slurm.conf.

    Builds the chroot first when missing (:func:`build_chroot`). Clients must run through
    :func:`client` (the chroot's munged has its own key).

    :raises DevClusterError: unknown version, not root, ports taken, a daemon failed to start or
        nodes did not become idle in 60 s (what was started is stopped and unmounted again).
    """
    check_geometry(nodes, gpus, cpus)
    if os.geteuid() != 0:
        raise DevClusterError("`hpcsched devcluster up --slurm` must run as root (chroot, mount)")
    ports = _version(version).ports
    layout = Layout(state_dir or default_state_dir(version))
    if is_up(version, layout.root):
        logger.info("Slurm %s dev cluster already up in %s; nothing to do", version, layout.root)
        return layout.slurm_conf
    root = build_chroot(version, install)
    taken = [p for p in (ports.slurmctld, *(ports.node(k) for k in range(1, nodes + 1))) if port_open(p)]
    if taken:
        raise DevClusterError(f"port(s) {taken} already in use: is another {version} cluster running?")
    t0 = time.monotonic()
    write_configs(layout, nodes, gpus, cpus, ports)
    # slurmctld answers clients at the host name they report ("vm"): the chroot must resolve it
    shutil.copyfile("/etc/hosts", root / "etc/hosts")
    mounts = mount_all(root, layout)
    try:
        _start_munged(root, layout)
        daemons = ["munged", *_start_slurm(root, layout, ports, nodes, clean)]
    except BaseException:
        logger.error("start failed; stopping what was started (logs stay in %s)", layout.log)
        stop_all(layout)
        unmount_all(root, mounts)
        raise
    write_client_wrappers(version, layout)
    write_file(layout.manifest, _manifest_json(version, layout, ports, nodes, gpus, cpus, daemons, mounts), 0o644)
    logger.info("Slurm %s dev cluster up in %.1f s: %d nodes x %d GPUs, SLURM_CONF=%s (clients: %s)",
                version, time.monotonic() - t0, nodes, gpus, layout.slurm_conf, " ".join(client(version)))
    return layout.slurm_conf


def _manifest_json(version: str, layout: Layout, ports: Ports, nodes: int, gpus: int, cpus: int,
                   daemons: list[str], mounts: list[str]) -> str:
    import json

    return json.dumps({
        "version": 1, "slurm": version, "chroot": str(chroot_dir(version)), "state_dir": str(layout.root),
        "slurm_conf": str(layout.slurm_conf), "cluster_name": CLUSTER_NAME, "partition": PARTITION,
        "nodes": nodes, "gpus": gpus, "cpus": cpus, "node_names": node_names(nodes),
        "ports": {"slurmctld": ports.slurmctld, "slurmd": ports.slurmd,
                  "nodes": [ports.node(k) for k in range(1, nodes + 1)]},
        "munged": "started", "daemons": daemons, "mounts": mounts,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }, indent=2) + "\n"


def _manifest(layout: Layout) -> dict[str, Any] | None:
    import json

    try:
        return json.loads(layout.manifest.read_text())
    except (OSError, ValueError):
        return None


def is_up(version: str, state_dir: str | os.PathLike[str] | None = None) -> bool:
    """Whether every daemon ``up`` started for this version still runs (zombies count as dead)."""
    layout = Layout(state_dir or default_state_dir(version))
    m = _manifest(layout)
    return bool(m) and all(alive(read_pid(layout.pidfile(n)), COMM[daemon_kind(n)]) for n in m["daemons"])


def down(version: str, state_dir: str | os.PathLike[str] | None = None) -> bool:
    """Stop the chroot cluster's daemons (slurmd, slurmctld, munged) and unmount its binds.

    :returns: True when something was stopped.
    """
    layout = Layout(state_dir or default_state_dir(version))
    if not layout.root.is_dir():
        return False
    m = _manifest(layout) or {}
    stopped = stop_all(layout)
    unmount_all(chroot_dir(version), m.get("mounts") or _mounts(layout))
    with contextlib.suppress(FileNotFoundError):
        layout.manifest.unlink()
    return bool(stopped)


def status(version: str, state_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Like :func:`hpcsched.slurm.devcluster.status`, for the chroot cluster (``slurm``, ``chroot``
    and ``client`` added)."""
    from hpcsched.slurm.devcluster.daemons import sinfo_nodes  # noqa: PLC0415

    layout = Layout(state_dir or default_state_dir(version))
    m = _manifest(layout)
    daemons = [{"name": n, "pid": pid, "running": alive(pid, COMM[daemon_kind(n)]), "started_by_us": True}
               for n, pid in pidfile_daemons(layout).items()]
    out: dict[str, Any] = {
        "up": is_up(version, layout.root), "slurm": version, "chroot": str(chroot_dir(version)),
        "client": client(version), "state_dir": str(layout.root), "slurm_conf": str(layout.slurm_conf),
        "geometry": {k: m[k] for k in ("nodes", "gpus", "cpus")} if m else None,
        "daemons": daemons, "nodes": [], "error": None,
    }
    if any(d["name"] == "slurmctld" and d["running"] for d in daemons):
        try:
            out["nodes"] = sinfo_nodes(layout.slurm_conf, client(version))
        except DevClusterError as e:
            out["error"] = str(e)
    return out
