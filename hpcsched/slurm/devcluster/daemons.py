"""Starting the dev cluster's daemons and waiting until its nodes are ready: munged (reused when
one runs), MariaDB, slurmdbd, slurmctld, one slurmd per node; every wait polls with a deadline and
fails fast when a daemon dies (``docs/slurm-22.05-notes.md`` §2, §6)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcsched.slurm.devcluster.base import (
    DB_NAME,
    DB_PASSWORD,
    DB_USER,
    LEND_GRACE_S,
    LEND_QOS,
    DevClusterError,
    Layout,
    need_bin,
    port_open,
    run_cmd,
    spawn,
    tail,
    unix_socket_open,
    wait_for,
    write_file,
)
from hpcsched.slurm.devcluster.config import node_names
from hpcsched.slurm.devcluster.processes import (
    COMM,
    alive,
    daemon_kind,
    find_procs,
    read_pid,
)

logger = logging.getLogger("hpcsched.slurm.devcluster")  # the package's logger (see base)


_MUNGE_RUN_DIR = Path("/run/munge")
_MUNGE_SOCKET = _MUNGE_RUN_DIR / "munge.socket.2"
_MUNGE_START_LOCK = Path("/run/lock/hpcsched-devcluster-munged.lock")
_SLURM_CLIENT_TIMEOUT_S = 5.0  # every sinfo/scontrol call: a dead controller makes them retry for minutes


def slurm_env_full(layout: Layout) -> dict[str, str]:
    """This process's environment plus ``SLURM_CONF`` pointing at the cluster's slurm.conf."""
    return dict(os.environ, SLURM_CONF=str(layout.slurm_conf))


def start_munged(layout: Layout) -> bool:
    """Start munged unless one runs already. Returns True when this call started it. Clusters
    started side by side (the test suite's) take turns (a lock file in ``/run/lock``), so that
    only one of them starts it."""
    _MUNGE_START_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(_MUNGE_START_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_munged(layout)


def _start_munged(layout: Layout) -> bool:
    running = find_procs("munged")
    if running:
        logger.info("reusing running munged (pid %s)", ", ".join(map(str, running)))
        return False
    _MUNGE_RUN_DIR.mkdir(parents=True, exist_ok=True)
    shutil.chown(_MUNGE_RUN_DIR, "munge", "munge")
    os.chmod(_MUNGE_RUN_DIR, 0o755)
    munge_pidfile = _MUNGE_RUN_DIR / "munged.pid"
    with contextlib.suppress(FileNotFoundError):
        munge_pidfile.unlink()
    spawn([need_bin("runuser"), "-u", "munge", "--", need_bin("munged"), "--num-threads=10",
            f"--pid-file={munge_pidfile}"], layout.log / "munged.out")

    def ready() -> bool:
        pid = read_pid(munge_pidfile)
        return bool(pid) and alive(pid, "munged") and unix_socket_open(_MUNGE_SOCKET)

    wait_for(ready, 15, "munged", on_timeout=lambda: tail(layout.log / "munged.out"))
    write_file(layout.pidfile("munged"), f"{read_pid(munge_pidfile)}\n", 0o644)
    return True


def start_mariadb(layout: Layout, port: int) -> None:
    """Initialise (once) and start MariaDB on its own datadir/socket and TCP ``port``, create the
    slurm user."""
    layout.db_tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not (layout.datadir / "mysql").is_dir():
        logger.info("initialising MariaDB in %s", layout.datadir)
        shutil.rmtree(layout.datadir, ignore_errors=True)
        layout.datadir.mkdir(parents=True)
        try:
            run_cmd([need_bin("mariadb-install-db"), "--no-defaults", "--user=root",
                     f"--datadir={layout.datadir}", f"--tmpdir={layout.db_tmp}",
                     "--auth-root-authentication-method=normal"], timeout=180)
        except DevClusterError:
            shutil.rmtree(layout.datadir, ignore_errors=True)
            raise
    pidfile = layout.pidfile("mariadb")
    with contextlib.suppress(FileNotFoundError):
        pidfile.unlink()
    log = layout.log / "mariadb.log"
    # mariadbd does not daemonize: `setsid --fork` detaches it so that it outlives this process.
    spawn([need_bin("setsid"), "--fork", need_bin("mariadbd"), "--no-defaults", "--user=root",
            f"--datadir={layout.datadir}", f"--tmpdir={layout.db_tmp}",
            f"--socket={layout.db_socket}", "--bind-address=127.0.0.1",
            f"--port={port}", f"--pid-file={pidfile}", f"--log-error={log}",
            "--innodb-buffer-pool-size=64M"], layout.log / "mariadb.out")

    def ready() -> bool:
        pid = read_pid(pidfile)
        if pid and not alive(pid):
            raise DevClusterError(f"mariadbd exited during start: {tail(log)}")
        return bool(pid) and unix_socket_open(layout.db_socket) and port_open(port)

    wait_for(ready, 60, "MariaDB", on_timeout=lambda: tail(log))
    os.chmod(pidfile, 0o644)  # mariadbd writes it 660; status/is_up need no root
    sql = "".join(
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{host}' IDENTIFIED BY '{DB_PASSWORD}'; "
        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{host}'; "
        for host in ("127.0.0.1", "localhost")
    )
    run_cmd([need_bin("mariadb"), "--no-defaults", f"--socket={layout.db_socket}", "-uroot", "-e", sql], timeout=30)


#: what slurmdbd logs when it exits because its first queries to the database failed
ACCOUNTING_UNUSABLE = "Unable to initialize accounting_storage/mysql"


def start_accounting(layout: Layout, mariadb_port: int, slurmdbd_port: int) -> None:
    """Start MariaDB, then slurmdbd on it; once more when MariaDB died under slurmdbd's start.

    Debian 12's MariaDB (10.11) crashed once in about 100 dev-cluster starts, on slurmdbd's
    first table check (signal 11 in ``ha_maria::drop_table``, freeing an information-schema
    temporary table); slurmdbd then exits (``mysql_commit failed: 2006 Server has gone
    away``). The second try starts both again from their logs' state; any other failure, or a
    second crash, is raised.

    A slurmdbd that exits on its first queries while MariaDB runs (``fatal: Unable to initialize
    accounting_storage/mysql``, after "We should have gotten a result: 'No error'"; seen once,
    when the test suite started four clusters at once, and the next start of the same database
    worked) is started once more, 2 s later.

    :raises DevClusterError: a daemon did not start.
    """
    def slurmdbd() -> None:
        start_daemon(layout, "slurmdbd", [need_bin("slurmdbd")], slurmdbd_port,
                     layout.log / "slurmdbd.log")

    for attempt in (1, 2):
        start_mariadb(layout, mariadb_port)
        try:
            slurmdbd()
            return
        except DevClusterError as exc:
            pid = read_pid(layout.pidfile("mariadb"))
            running = bool(pid and alive(pid))
            if attempt == 1 and running and ACCOUNTING_UNUSABLE in str(exc):
                logger.warning("slurmdbd exited on its first queries to MariaDB (%s); starting "
                               "it once more", exc)
                time.sleep(2.0)
                slurmdbd()
                return
            if attempt == 2 or running:
                raise
            logger.warning("MariaDB died while slurmdbd started (%s: %s); starting both again",
                           layout.log / "mariadb.log", exc)


def start_daemon(layout: Layout, name: str, args: list[str], port: int, log: Path) -> None:
    """Start a self-daemonizing Slurm daemon and wait until it listens on ``port``."""
    pidfile = layout.pidfile(name)
    with contextlib.suppress(FileNotFoundError):
        pidfile.unlink()
    spawn(args, layout.log / f"{name}.out", env=slurm_env_full(layout))
    comm = COMM[daemon_kind(name)]

    def ready() -> bool:
        pid = read_pid(pidfile)
        if pid and not alive(pid, comm):
            raise DevClusterError(f"{name} exited during start: {tail(log)}")
        return bool(pid) and port_open(port)

    wait_for(ready, 30, name, on_timeout=lambda: tail(log))


def start_slurmds(layout: Layout, nodes: int) -> None:
    """Start one ``slurmd -N nK`` per emulated node (they daemonize; readiness is checked by
    :func:`wait_nodes_ready`)."""
    slurmd = need_bin("slurmd")
    env = slurm_env_full(layout)
    for name in node_names(nodes):
        with contextlib.suppress(FileNotFoundError):
            layout.pidfile(f"slurmd-{name}").unlink()
        spawn([slurmd, "-N", name], layout.log / f"slurmd-{name}.out", env=env)


def sinfo_nodes(slurm_conf: Path, prefix: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Nodes from ``sinfo --json`` (5 s timeout): name, state, flags, gres, cpus, reason.
    ``prefix`` runs sinfo through another command (``chroot ROOT``, for the chroot clusters).
    Node states are read the 22.05 way (a string) or the 23.02+ way (a list: base state first,
    then flags, ``["IDLE", "DRAIN"]``).

    :raises DevClusterError: when sinfo fails, times out or prints something that is not JSON.
    """
    cp = run_cmd([*prefix, need_bin("sinfo"), "--json"], timeout=_SLURM_CLIENT_TIMEOUT_S,
              env=dict(os.environ, SLURM_CONF=str(slurm_conf)))
    try:
        data = json.loads(cp.stdout)
    except json.JSONDecodeError as e:
        raise DevClusterError(f"sinfo --json printed no JSON: {cp.stdout[:200]!r}") from e
    out = [_node_row(n) for n in data.get("nodes", [])]
    out += [_node_row(_flat_sinfo(e), name) for e in data.get("sinfo", []) for name in e["nodes"]["nodes"]]
    return sorted(out, key=lambda n: (len(n["name"] or ""), n["name"] or ""))


def _flat_sinfo(e: dict[str, Any]) -> dict[str, Any]:
    """One entry of 23.02+ ``sinfo --json``'s ``sinfo`` list (nodes grouped by like state) in the
    per-node shape of 22.05's ``nodes`` list."""
    return {"state": e["node"]["state"], "gres": e["gres"]["total"], "cpus": e["cpus"]["maximum"],
            "reason": e["reason"]["description"]}


def _node_row(n: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    state = n.get("state", "")
    words = [str(w) for w in state] if isinstance(state, list) else [str(state)]
    return {
        "name": name or n.get("name") or n.get("hostname"),
        "state": (words[0] if words else "").lower(),
        "flags": [str(f).upper() for f in [*words[1:], *(n.get("state_flags") or [])]],
        "gres": n.get("gres", ""),
        "cpus": n.get("cpus"),
        "reason": n.get("reason") or "",
    }


#: Node states that count as "up": idle, or busy with jobs restored from saved state (no ``-c``).
_READY_STATES = frozenset({"idle", "mixed", "allocated"})
_BAD_FLAGS = frozenset({"DRAIN", "NOT_RESPONDING", "DOWN", "FAIL", "MAINTENANCE", "POWERED_DOWN", "REBOOT_REQUESTED"})


def _node_ready(n: dict[str, Any]) -> bool:
    return n["state"] in _READY_STATES and not _BAD_FLAGS & set(n["flags"])


def wait_nodes_ready(layout: Layout, nodes: int, deadline_s: float = 60.0, prefix: Sequence[str] = ()) -> None:
    """Poll ``sinfo --json`` (every 0.2 s, 5 s timeout per call) until all nodes are idle, or
    mixed/allocated when jobs restored from saved state run on them. Nodes still DRAINED from saved
    state are resumed once (slurmctld keeps DRAIN across restarts without -c). ``prefix``: see
    :func:`sinfo_nodes`."""
    want = set(node_names(nodes))
    resumed: set[str] = set()
    last: list[dict[str, Any]] = []
    ctld_pidfile = layout.pidfile("slurmctld")

    def ready() -> bool:
        nonlocal last
        if not alive(read_pid(ctld_pidfile), "slurmctld"):
            raise DevClusterError(f"slurmctld died: {tail(layout.log / 'slurmctld.log')}")
        for name in want:
            pid = read_pid(layout.pidfile(f"slurmd-{name}"))
            if pid and not alive(pid, "slurmd"):
                raise DevClusterError(f"slurmd {name} died: {tail(layout.log / f'slurmd-{name}.log')}")
        try:
            last = [n for n in sinfo_nodes(layout.slurm_conf, prefix) if n["name"] in want]
        except DevClusterError as e:
            logger.debug("sinfo not ready: %s", e)
            return False
        drained = [n["name"] for n in last if "DRAIN" in n["flags"] and n["name"] not in resumed]
        if drained:
            logger.warning("resuming nodes left drained by saved state: %s", ",".join(drained))
            run_cmd([*prefix, need_bin("scontrol"), "update", f"NodeName={','.join(drained)}", "State=RESUME"],
                 timeout=_SLURM_CLIENT_TIMEOUT_S, env=slurm_env_full(layout), check=False)
            resumed.update(drained)
        return len(last) == len(want) and all(_node_ready(n) for n in last)

    def describe() -> str:
        states = ", ".join(f"{n['name']}={n['state']}{'+' + '+'.join(n['flags']) if n['flags'] else ''}"
                           f"{' (' + n['reason'] + ')' if n['reason'] else ''}" for n in last)
        return (states or "sinfo answered nothing") + " " + tail(layout.log / "slurmctld.log", 4)

    wait_for(ready, deadline_s, f"{nodes} idle nodes", on_timeout=describe, interval=0.2)


def configure_lend_qos(layout: Layout) -> None:
    """Create the QOS :data:`LEND_QOS` for extension jobs and let ``normal`` preempt it
    (sacctmgr(1); ``slurm.conf`` has ``PreemptType=preempt/qos``): ``PreemptMode=cancel``,
    ``GraceTime`` :data:`LEND_GRACE_S` s. Idempotent. Extension jobs use it only when the
    job_submit plugin's ``extension_qos`` names it (``docs/slurm-plugins.md``)."""
    env = slurm_env_full(layout)
    sacctmgr = [need_bin("sacctmgr"), "-i"]
    have = run_cmd([need_bin("sacctmgr"), "-n", "-P", "show", "qos", "format=Name"],
                   timeout=_SLURM_CLIENT_TIMEOUT_S, env=env).stdout.split()
    if LEND_QOS not in have:
        run_cmd([*sacctmgr, "add", "qos", LEND_QOS], timeout=_SLURM_CLIENT_TIMEOUT_S, env=env)
    # "Nothing modified" (the values are in place already) exits 1: the show below judges
    run_cmd([*sacctmgr, "modify", "qos", LEND_QOS, "set", f"GraceTime={LEND_GRACE_S}",
             "PreemptMode=cancel", "Priority=0"], timeout=_SLURM_CLIENT_TIMEOUT_S, env=env,
            check=False)
    run_cmd([*sacctmgr, "modify", "qos", "normal", "set", f"Preempt={LEND_QOS}"],
            timeout=_SLURM_CLIENT_TIMEOUT_S, env=env, check=False)
    rows = run_cmd([need_bin("sacctmgr"), "-n", "-P", "show", "qos", "format=Name,Preempt"],
                   timeout=_SLURM_CLIENT_TIMEOUT_S, env=env).stdout.splitlines()
    if f"normal|{LEND_QOS}" not in rows:
        raise DevClusterError(f"QOS normal does not preempt {LEND_QOS} (sacctmgr: {rows})")
