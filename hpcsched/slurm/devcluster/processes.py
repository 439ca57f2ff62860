"""The dev cluster's processes: PID files under ``run/``, liveness (a zombie counts as dead,
because PID 1 here does not reap: notes §6.8), and stopping them in the order of the notes
(§2, §6.8): slurmd before slurmctld, then slurmdbd, MariaDB, munged."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from hpcsched.slurm.devcluster.base import DevClusterError, Layout, wait_for

logger = logging.getLogger("hpcsched.slurm.devcluster")  # the package's logger (see base)


# Daemon kinds in stop order, with their /proc/PID/comm name and the SIGTERM deadline in seconds.
STOP_ORDER = ("slurmd", "slurmctld", "slurmdbd", "mariadb", "munged")
COMM = {"slurmd": "slurmd", "slurmctld": "slurmctld", "slurmdbd": "slurmdbd",
        "mariadb": "mariadbd", "munged": "munged"}
_TERM_DEADLINE_S = {"slurmd": 20.0, "slurmctld": 20.0, "slurmdbd": 20.0, "mariadb": 60.0, "munged": 10.0}
#: seconds a SIGKILLed daemon is given to be gone: one in uninterruptible sleep dies once its
#: I/O ends (256 slurmd killed together on a host whose disk was stalled took over 5 s)
_KILL_DEADLINE_S = 30.0



def proc_stat(pid: int | str) -> tuple[str, list[str]] | None:
    """``(comm, the fields after it)`` of ``/proc/<pid>/stat`` (proc(5): state, ppid, ...), or
    None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # Format: "PID (comm) S PPID ..."; comm may contain spaces and parentheses.
    lpar, rpar = raw.find("("), raw.rfind(")")
    if lpar < 0 or rpar < 0:
        return None
    return raw[lpar + 1:rpar], raw[rpar + 2:].split()


def proc_state(pid: int) -> tuple[str, str] | None:
    """``(comm, state letter)`` of a process, or None when there is no such process."""
    st = proc_stat(pid)
    return None if st is None or not st[1] else (st[0], st[1][0])


def alive(pid: int | None, comm: str | None = None) -> bool:
    """True when ``pid`` runs and is not a zombie (PID 1 here does not reap; see the notes, §6.8).

    With ``comm``, the process must also have that name, so that a stale PID file whose number
    was reused by an unrelated process is not mistaken for our daemon.
    """
    if not pid or pid <= 0:
        return False
    st = proc_state(pid)
    if st is None or st[1] in ("Z", "X", "x"):
        return False
    return comm is None or st[0] == comm


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def find_procs(comm: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose name is ``comm``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry), comm):
            pids.append(int(entry))
    return sorted(pids)


def daemon_kind(name: str) -> str:
    """Daemon kind from a PID-file stem: ``slurmd-n3`` -> ``slurmd``."""
    return name.split("-", 1)[0]


def pidfile_daemons(layout: Layout) -> dict[str, int | None]:
    """Every daemon with a PID file under ``run/``: name -> PID."""
    if not layout.run.is_dir():
        return {}
    return {p.stem: read_pid(p) for p in sorted(layout.run.glob("*.pid")) if daemon_kind(p.stem) in COMM}


def _stop_group(names: dict[str, int | None]) -> list[str]:
    """SIGTERM a group of daemons, wait for them, SIGKILL what is left. Returns the names stopped."""
    live = {n: pid for n, pid in names.items() if alive(pid, COMM[daemon_kind(n)])}
    if not live:
        return []
    for name, pid in live.items():
        logger.debug("SIGTERM %s (pid %d)", name, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    kind = daemon_kind(next(iter(live)))

    def all_dead() -> bool:
        return not any(alive(pid) for pid in live.values())

    try:
        wait_for(all_dead, _TERM_DEADLINE_S[kind], f"{kind} to exit")
    except DevClusterError:
        for name, pid in live.items():
            if alive(pid):
                logger.warning("%s (pid %d) ignored SIGTERM for %g s; sending SIGKILL", name, pid,
                               _TERM_DEADLINE_S[kind])
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        wait_for(all_dead, _KILL_DEADLINE_S, f"{kind} to die after SIGKILL")
    return sorted(live)


def stop_all(layout: Layout) -> list[str]:
    """Stop every daemon with a PID file under ``run/``, in the order of the notes (§2):
    slurmd, slurmctld, slurmdbd, MariaDB, munged. PID files are removed. Returns names stopped.
    munged is shared by every cluster on the host: it is left running (and no longer this
    cluster's) while another cluster's Slurm daemons run."""
    daemons = pidfile_daemons(layout)
    stopped: list[str] = []
    failed: list[str] = []
    for kind in STOP_ORDER:
        group = {n: pid for n, pid in daemons.items() if daemon_kind(n) == kind}
        if kind == "munged" and group and any(find_procs(COMM[k]) for k in ("slurmd", "slurmctld", "slurmdbd")):
            # another dev cluster on this host (tests run several side by side) still uses it
            logger.info("left munged running: other Slurm daemons on this host use it")
            group = {}
            with contextlib.suppress(FileNotFoundError):
                layout.pidfile("munged").unlink()
        t0 = time.monotonic()
        try:
            done = _stop_group(group)
        except DevClusterError as exc:   # the later kinds are stopped all the same
            logger.error("%s", exc)
            failed.append(str(exc))
            continue
        if done:
            logger.info("stopped %s in %.2f s", ", ".join(done), time.monotonic() - t0)
        stopped += done
        for n in group:
            with contextlib.suppress(FileNotFoundError):
                layout.pidfile(n).unlink()
        if kind == "slurmd":
            _kill_orphan_stepds(layout)
    if failed:
        raise DevClusterError("; ".join(failed) + " (the other daemons were stopped)")
    return stopped


def _kill_orphan_stepds(layout: Layout) -> None:
    """SIGKILL this cluster's ``slurmstepd`` left after its slurmd are gone, and their jobs'
    processes (a batch script and what it started): a step whose slurmd was killed (it ignored
    SIGTERM while ending hundreds of jobs) waits for it forever, and its job's processes with
    it (seen after the 1,024-GPU runs: up to 733 left). A step is this cluster's when its
    environment (slurmd's) names this cluster's ``slurm.conf``; other clusters' steps on the
    host are left alone."""
    mine = f"SLURM_CONF={layout.slurm_conf}".encode()
    left = []
    for pid in find_procs("slurmstepd"):
        with contextlib.suppress(OSError):
            if mine in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                left.append(pid)
    doomed = _with_descendants(left)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        logger.warning("killed %d slurmstepd left by this cluster's stopped slurmd, and %d "
                       "processes of their jobs", len(left), len(doomed) - len(left))


def _with_descendants(pids: list[int]) -> list[int]:
    """``pids`` and every live process below them (``/proc/<pid>/stat``'s parent)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        st = proc_stat(entry) if entry.isdigit() else None
        if st is not None and len(st[1]) > 1:
            children.setdefault(int(st[1][1]), []).append(int(entry))
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out
