"""The dev cluster's Python API: :func:`up`, :func:`down`, :func:`is_up`, :func:`status`,
:func:`slurm_env`, and the manifest (``STATE/cluster.json``: geometry and the daemons ``up``
started) and lock (flock on ``STATE/.lock``) they share."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpcsched.slurm.devcluster.base import (
    CLUSTER_NAME,
    DEFAULT_PORTS,
    PARTITION,
    DevClusterError,
    Layout,
    Ports,
    need_bin,
    port_open,
    write_file,
)
from hpcsched.slurm.devcluster.config import check_geometry, node_names, write_configs
from hpcsched.slurm.devcluster.daemons import (
    configure_lend_qos,
    sinfo_nodes,
    start_accounting,
    start_daemon,
    start_munged,
    start_slurmds,
    wait_nodes_ready,
)
from hpcsched.slurm.devcluster.install import ensure_installed
from hpcsched.slurm.devcluster.processes import (
    COMM,
    STOP_ORDER,
    alive,
    daemon_kind,
    find_procs,
    pidfile_daemons,
    read_pid,
    stop_all,
)

logger = logging.getLogger("hpcsched.slurm.devcluster")  # the package's logger (see base)


def _read_manifest(layout: Layout) -> dict[str, Any] | None:
    try:
        return json.loads(layout.manifest.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _write_manifest(layout: Layout, manifest: dict[str, Any]) -> None:
    write_file(layout.manifest, json.dumps(manifest, indent=2) + "\n", 0o644)


@contextlib.contextmanager
def _locked(layout: Layout) -> Iterator[None]:
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


def _manifest_alive(layout: Layout, manifest: dict[str, Any] | None) -> bool:
    if not manifest:
        return False
    for name in manifest.get("daemons", []):
        if not alive(read_pid(layout.pidfile(name)), COMM[daemon_kind(name)]):
            return False
    return bool(find_procs("munged"))


def _geometry(manifest: dict[str, Any]) -> tuple[int, int, int]:
    return int(manifest["nodes"]), int(manifest["gpus"]), int(manifest["cpus"])


def slurm_env(state_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Environment additions for Slurm clients talking to this cluster: ``{"SLURM_CONF": path}``.

    Pure: does not check that the cluster is up (see :func:`is_up`).
    """
    return {"SLURM_CONF": str(Layout(state_dir).slurm_conf)}


def is_up(state_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when ``up`` completed in ``state_dir`` and every daemon it started still runs
    (zombies count as dead) and a munged runs. Does not query Slurm; needs no root."""
    layout = Layout(state_dir)
    return _manifest_alive(layout, _read_manifest(layout))


def up(state_dir: str | os.PathLike[str] | None = None, nodes: int = 4, gpus: int = 4, cpus: int = 8,
       clean: bool = False, install: bool = True, ports: Ports | None = None) -> Path:
    """Start the dev cluster (or find it already up) and return the path of its ``slurm.conf``.

    Starts munged (unless one runs), MariaDB (port 16820), slurmdbd (16819), slurmctld (16817) and
    one slurmd per node (17001+), then waits until all ``nodes`` nodes are idle (or busy with jobs
    restored from saved state; deadline 60 s). Takes about 1-2.5 s on
    the reference machine once installed (notes, §2); the first job is scheduled about 3 s later.

    :param state_dir: state directory (default :func:`default_state_dir`).
    :param nodes: emulated nodes (1..1024). :param gpus: fake GPUs per node (0..64).
    :param cpus: CPUs per node as Slurm sees them.
    :param clean: start slurmctld with ``-c``: discard saved jobs and node states.
    :param install: apt-get install the packages when a needed binary is missing.
    :param ports: the ports (and first job id) of a further cluster beside the default one
        (:func:`~hpcsched.slurm.devcluster.base.instance_ports`; its own ``state_dir`` too).
        Default: those this state directory was last started with, else the default ports.
    :returns: absolute path of ``STATE/etc/slurm.conf`` (export it as ``SLURM_CONF``).
    :raises DevClusterError: not root; geometry out of range; the cluster is up with another
        geometry (run ``down`` first); a port is taken; install failed; a daemon failed to start
        or the nodes did not become idle within the deadline (what was started is stopped again).
    """
    check_geometry(nodes, gpus, cpus)
    _require_root("up")
    layout = Layout(state_dir)
    with _locked(layout):
        manifest = _read_manifest(layout)
        if _manifest_alive(layout, manifest):
            _check_same_geometry(layout, _geometry(manifest), (nodes, gpus, cpus))
            if clean:
                logger.warning("already up; --clean ignored (run down first to discard saved jobs)")
            logger.info("dev cluster already up in %s (%d nodes x %d GPUs x %d CPUs); nothing to do",
                        layout.root, nodes, gpus, cpus)
            return layout.slurm_conf
        leftovers = stop_all(layout)
        if leftovers:
            logger.warning("stopped leftovers of an incomplete cluster: %s", ", ".join(leftovers))
        with contextlib.suppress(FileNotFoundError):
            layout.manifest.unlink()

        t0 = time.monotonic()
        ports = ports or _last_ports(layout)
        ensure_installed(install)
        _check_ports_free(ports, nodes)
        write_configs(layout, nodes, gpus, cpus, ports)
        write_file(layout.ports, json.dumps(dataclasses.asdict(ports)) + "\n", 0o644)
        daemons = _start_all(layout, ports, nodes, clean)
        _write_manifest(layout, {
            "version": 1, "state_dir": str(layout.root), "slurm_conf": str(layout.slurm_conf),
            "cluster_name": CLUSTER_NAME, "partition": PARTITION,
            "nodes": nodes, "gpus": gpus, "cpus": cpus, "node_names": node_names(nodes),
            "ports": {"slurmctld": ports.slurmctld, "slurmd": ports.slurmd, "slurmdbd": ports.slurmdbd,
                      "mariadb": ports.mariadb, "nodes": [ports.node(k) for k in range(1, nodes + 1)]},
            "munged": "started" if "munged" in daemons else "reused",
            "daemons": daemons,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "startup_s": round(time.monotonic() - t0, 3),
        })
        logger.info("dev cluster up in %.1f s: %d nodes x %d GPUs x %d CPUs, SLURM_CONF=%s",
                    time.monotonic() - t0, nodes, gpus, cpus, layout.slurm_conf)
    return layout.slurm_conf


def _check_same_geometry(layout: Layout, have: tuple[int, int, int], want: tuple[int, int, int]) -> None:
    if have != want:
        raise DevClusterError(
            f"the dev cluster in {layout.root} is already up with {have[0]} nodes x {have[1]} GPUs x "
            f"{have[2]} CPUs (asked: {want[0]} x {want[1]} x {want[2]}); run "
            f"`hpcsched devcluster down --state-dir {layout.root}` first")


def _last_ports(layout: Layout) -> Ports:
    """The ports ``up`` last started this state directory with (``STATE/ports.json``), else the
    default ones."""
    try:
        return Ports(**json.loads(layout.ports.read_text()))
    except (OSError, ValueError, TypeError):
        return DEFAULT_PORTS


def _check_ports_free(ports: Ports, nodes: int) -> None:
    taken = [f"{p} ({who})" for who, p in ports.all(nodes).items() if port_open(p)]
    if taken:
        raise DevClusterError(f"port(s) {', '.join(taken)} already in use on 127.0.0.1: another Slurm or "
                              "dev cluster (another --state-dir?) is running; stop it first")


def _start_all(layout: Layout, ports: Ports, nodes: int, clean: bool) -> list[str]:
    """Start every daemon in order and wait for idle nodes; returns what was started, in start
    order (``munged`` only when this call started it). On any failure, stops what was started."""
    daemons: list[str] = []
    try:
        if start_munged(layout):
            daemons.append("munged")
        t1 = time.monotonic()
        start_accounting(layout, ports.mariadb, ports.slurmdbd)
        daemons += ["mariadb", "slurmdbd"]
        logger.info("MariaDB and slurmdbd up (%.1f s)", time.monotonic() - t1)
        ctld = [need_bin("slurmctld"), "-i"] + (["-c"] if clean else [])
        start_daemon(layout, "slurmctld", ctld, ports.slurmctld, layout.log / "slurmctld.log")
        daemons.append("slurmctld")
        start_slurmds(layout, nodes)
        daemons += [f"slurmd-{n}" for n in node_names(nodes)]
        wait_nodes_ready(layout, nodes)
        configure_lend_qos(layout)
    except BaseException:
        # Cleanup goes by the PID files the daemons wrote, so it also covers a half-started one.
        logger.error("start failed; stopping what was started (logs stay in %s)", layout.log)
        stop_all(layout)
        raise
    return daemons


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
    layout = Layout(state_dir)
    if not layout.root.is_dir():
        return False
    live = [n for n, pid in pidfile_daemons(layout).items() if alive(pid, COMM[daemon_kind(n)])]
    if live:
        _require_root("down")
    with _locked(layout):
        stopped = stop_all(layout)
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
    layout = Layout(state_dir)
    manifest = _read_manifest(layout)
    daemons = _daemon_rows(layout, manifest)
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
            result["nodes"] = sinfo_nodes(layout.slurm_conf)
        except DevClusterError as e:
            result["error"] = str(e)
    return result


def _daemon_rows(layout: Layout, manifest: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``status()["daemons"]``: those the manifest names plus any with a PID file, in start
    order; a munged ``up`` reused is listed first with ``started_by_us`` False."""
    names = list(manifest.get("daemons", [])) if manifest else []
    names += [n for n in pidfile_daemons(layout) if n not in names]
    order = {k: i for i, k in enumerate(reversed(STOP_ORDER))}
    names.sort(key=lambda n: (order[daemon_kind(n)], len(n), n))
    rows = []
    for n in names:
        pid = read_pid(layout.pidfile(n))
        rows.append({"name": n, "pid": pid, "running": alive(pid, COMM[daemon_kind(n)]), "started_by_us": True})
    if "munged" not in names:
        munged = find_procs("munged")
        rows.insert(0, {"name": "munged", "pid": munged[0] if munged else None, "running": bool(munged),
                        "started_by_us": False})
    return rows
