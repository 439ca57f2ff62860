"""What the host and the daemon's own threads were doing during a round, for
``benchmarks/daemon_scale.py``: CPU and run-queue time, block-I/O waits (delay accounting), the
host's pressure stalls, disks' counters and memory, and the kernel stacks at which the daemon's
threads were blocked (:class:`BlockedStacks`). Linux only; each reads ``/proc``."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hpcsched.slurm.devcluster.processes import proc_stat, proc_state


def cpu_seconds() -> float:
    """CPU seconds this process (the daemon) and the children it waited for (its Slurm
    commands) have used: the round's cost apart from what else the host runs."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _over_threads(name: str, field: Callable[[str], int]) -> int:
    """``field`` of ``/proc/self/task/<tid>/<name>``, summed over this process's threads (those
    that ended are not counted; a thread that ends while it is read counts nothing)."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += field(Path(f"/proc/self/task/{task}/{name}").read_text())
    return total


def run_queue_seconds() -> float:
    """Seconds this process's threads have waited on a run queue, ready but not running
    (``/proc/<pid>/task/*/schedstat``, second field, in ns; threads that have ended are not
    counted): the part of a round's wall time the host's other processes took, apart from its
    CPU time and what it waited for (Slurm's answers, the disk)."""
    return _over_threads("schedstat", lambda text: int(text.split()[1])) / 1e9


DELAYACCT = Path("/proc/sys/kernel/task_delayacct")


def io_wait_seconds() -> float | None:
    """Seconds this process's threads have waited for block I/O (``delayacct_blkio_ticks``,
    field 42 of ``/proc/<pid>/task/*/stat``, proc(5), in clock ticks): a page read from disk,
    a write-back an ``fsync`` waits for. None unless the kernel's delay accounting is on
    (:func:`delay_accounting`); threads that have ended are not counted."""
    if DELAYACCT.exists() and DELAYACCT.read_text().strip() != "1":
        return None
    # the fields after the command name's closing parenthesis are the 3rd on
    ticks = _over_threads("stat", lambda text: int(text.rsplit(")", 1)[1].split()[39]))
    return ticks / os.sysconf("SC_CLK_TCK")


def pressure_seconds(resource: str) -> float | None:
    """Seconds in which at least one task on the host was stalled on ``resource`` (``io`` or
    ``memory``: the kernel's pressure stall information, ``/proc/pressure/<resource>``, ``some``
    ``total`` in us); None where there is none. A task that waits for a page of a file the
    kernel evicted under memory pressure counts as stalled on both."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        some = Path(f"/proc/pressure/{resource}").read_text().splitlines()[0]
        return int(some.rsplit("total=", 1)[1]) / 1e6
    return None


def disk_counters() -> dict[str, float]:
    """The host's whole disks' counters (``/proc/diskstats``, the kernel's
    Documentation/admin-guide/iostats.rst; partitions, loop and RAM devices left out), summed:
    ``writes`` and ``flushes`` completed, and the milliseconds spent writing, flushing and
    discarding. A round's difference says whether the disk under the store was slow to answer
    its syncs (a flush on a virtual disk is a sync of its image on the machine below)."""
    keys = {"writes": 7, "write_ms": 10, "discard_ms": 17, "flushes": 18, "flush_ms": 19}
    out = dict.fromkeys(keys, 0.0)
    with contextlib.suppress(OSError):
        for line in Path("/proc/diskstats").read_text().splitlines():
            f = line.split()
            if len(f) < 20 or f[2].startswith(("loop", "ram", "zram", "dm-")) \
                    or not Path(f"/sys/block/{f[2]}").exists():
                continue
            for k, i in keys.items():
                out[k] += float(f[i])
    return out


def host_memory_mib() -> dict[str, float]:
    """The host's ``MemAvailable``, ``Cached``, ``Dirty`` and ``Writeback`` (``/proc/meminfo``,
    proc(5)), MiB: whether the host was short of memory, so that files' pages were read
    again from disk."""
    fields = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("MemAvailable", "Cached", "Dirty", "Writeback"):
                fields[name] = round(int(rest.split()[0]) / 1024, 1)
    return fields


@contextlib.contextmanager
def delay_accounting():
    """The kernel's per-task delay accounting on (``kernel.task_delayacct``, off by default
    since Linux 5.14) for the block, then as it was; nothing where it cannot be set."""
    try:
        before = DELAYACCT.read_text().strip()
        DELAYACCT.write_text("1")
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            DELAYACCT.write_text(before)


#: kernel functions that say only that a task sleeps, not on what (left out of a stack's key)
_GENERIC = ("__schedule", "schedule", "io_schedule", "schedule_timeout", "schedule_preempt_disabled",
            "do_syscall_64", "entry_SYSCALL_64_after_hwframe", "ret_from_fork", "kthread")


def _stack_key(text: str, depth: int = 4) -> str:
    """The first ``depth`` meaningful frames of a ``/proc/<pid>/task/<tid>/stack`` (function
    names without offsets), innermost first, joined by ``<``."""
    names = [line.split("]", 1)[-1].strip().split("+", 1)[0] for line in text.splitlines()]
    names = [n for n in names if n and n not in _GENERIC]
    return " < ".join(names[:depth]) or "?"


def kernel_threads() -> list[int]:
    """PIDs of the host's kernel threads (children of ``kthreadd``, PID 2; proc(5)): among them
    the workers that carry a loop device's I/O and flushes (``kworker/...-loopN``) and the file
    systems' journal threads (``jbd2/...``)."""
    stats = {int(e): proc_stat(e) for e in os.listdir("/proc") if e.isdigit()}
    return [pid for pid, st in stats.items() if st is not None and st[1][1:2] == ["2"]]


def thread_kind(comm: str) -> str:
    """A kernel thread's name with its numbers as ``N`` (``kworker/u8:2-loop0`` ->
    ``kworker/uN:N-loopN``): kernel workers are many and come and go, their kinds are few."""
    return "kernel " + re.sub(r"\d+", "N", comm.strip())


def threads_of(pids) -> list[int]:
    """The thread ids of the processes ``pids`` (``/proc/<pid>/task``; a None or a process
    that ended meanwhile has none)."""
    out = []
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            out += [int(t) for t in os.listdir(f"/proc/{pid}/task")] if pid else []
    return out


class BlockedStacks:
    """Samples, every ``interval`` seconds on a thread of its own, which of this process's
    threads, and of the host's kernel threads, are in uninterruptible sleep (state ``D``,
    proc(5): waiting for I/O or a kernel lock) and at which kernel stack
    (``/proc/<pid>/task/<tid>/stack``, root only); :meth:`take` returns the seconds per (thread
    kind, stack) since the last take. The thread kind is ``round`` for the main thread (the
    daemon's round), ``other`` for its other threads (step and checkpoint threads),
    :func:`thread_kind` for a kernel thread, and the name given in ``processes`` (``name ->
    pid``, e.g. ``{"slurmctld": pid}``) for every thread of that process (the lists of kernel
    threads and of those processes' threads renewed every ``refresh`` seconds). Answers where
    a synced commit or a command waited, which wall time cannot, what the kernel's workers
    under it were waiting for, and whether slurmctld's threads were waiting on its disk
    while a command waited for its answer."""

    def __init__(self, interval: float = 0.05, refresh: float = 5.0,
                 processes: dict[str, int] | None = None):
        self.interval, self.refresh = interval, refresh
        self.processes = dict(processes or {})
        self._main = threading.main_thread().native_id
        self._seen: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="blocked-stacks", daemon=True)

    def start(self) -> BlockedStacks:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me, kernel, watched, listed = threading.get_native_id(), [], {}, 0.0
        while not self._stop.wait(self.interval):
            if time.monotonic() - listed >= self.refresh:
                kernel, listed = kernel_threads(), time.monotonic()
                watched = {t: name for name, pid in self.processes.items() for t in threads_of([pid])}
            # a thread's /proc/<tid> is there beside its process's, though /proc does not list it
            own = {int(t): "round" if int(t) == self._main else "other"
                   for t in os.listdir("/proc/self/task") if int(t) != me}
            own.update(watched)
            for tid in [*own, *kernel]:
                st = proc_state(tid)
                if st is None or st[1] != "D":
                    continue
                with contextlib.suppress(OSError):   # a thread that ended meanwhile
                    key = (own.get(tid) or thread_kind(st[0]),
                           _stack_key(Path(f"/proc/{tid}/stack").read_text()))
                    with self._lock:
                        self._seen[key] += 1

    def take(self, top: int = 5) -> list[dict]:
        """The ``top`` (thread kind, stack) pairs by time blocked since the last take, each
        ``{"thread", "stack", "s"}`` (seconds, estimated as samples x the interval)."""
        with self._lock:
            seen, self._seen = self._seen, collections.Counter()
        return [{"thread": k[0], "stack": k[1], "s": round(n * self.interval, 2)}
                for k, n in seen.most_common(top)]
