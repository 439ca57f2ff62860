#!/usr/bin/env python3
"""Benchmark: the daemon's real rounds at production scale (issue 36).

For each scale (GPUs, 4 per node by default: 64, 256 and 1,024 GPUs = 16, 64 and 256 nodes of
the dev cluster, ``hpcsched devcluster up --nodes N``), a Philly-like mix of light job stand-ins
(:mod:`hpcsched.job.standin`: the real protocol, a metrics line per step for every rank at the
simulator's step times, real extension jobs; ``benchmarks/_scale_jobs.py``) is submitted with
hpcsub as the Unix user ``--user``, ``--jobs`` x GPUs / 1,024 of them (2,000 at 1,024 GPUs:
about half run, half wait), and the real daemon (its default settings and policy, a fresh
SQLite store; in this process, with the service loop's actuation ticks and early rounds between
rounds, ``hpcsched.daemon.service``) runs for ``--minutes``. Per round: wall time per part
(``RoundReport.phases``), the CPU seconds of the daemon and its Slurm commands, the seconds
the daemon's threads waited for a CPU (its run-queue wait, ``schedstat``) and for block I/O
(``delayacct_blkio_ticks``, with the kernel's delay accounting turned on for the run), the
seconds the host had a task stalled on I/O (``/proc/pressure/io``), the Slurm
commands it issued, the changes applied, the jobs running and pending, the daemon's RSS. The
daemon runs in the real-time ``SCHED_RR`` class (``--no-daemon-rt``: at nice ``--login-nice``)
and slurmctld and munged at nice ``--login-nice`` (-20), the emulated compute nodes (slurmd and the jobs)
at ``--compute-nice`` (0): on a real cluster the jobs do not share the login node's or the controller's cores.
At the end, slurmctld's RPCs from ``sdiag`` (reset at the start),
by message type and by user, with slurmctld's mean time per RPC type (its lock waits included);
hpcsched's share: the daemon's commands (counted per command) x their RPCs each (measured with
``sdiag`` around one of each), and the jobs' own (``--user``); and slurmctld's main and backfill
scheduling passes (their number, mean and longest: a pass holds the locks every RPC waits for).
``--sched-params`` appends to the cluster's ``SchedulerParameters`` before the jobs are
submitted, ``--ctld-rt`` puts slurmctld and munged in the real-time class: a controller tuned, and with
cores of its own, as a site of that size runs it (docs/daemon.md, "At scale"); the daemon then
runs at real-time priority 2, above them, as on a login node of its own. ``--store-fs GIB``
puts the daemon's store on a file system of its own (:func:`own_file_system`), as a login
node's local disk is to the shared file system the jobs write to: the store's synced commits
then no longer wait for the jobs' data in one file system journal, but still queue behind
their writes at the disk under both (fourteenth run: 23.8 s once); ``--store-in-memory`` puts that
file system's image in ``/dev/shm``, a device of its own (nineteenth run). ``--jobs-fs GIB`` does the
same for the job directories instead, a diagnosis that the jobs' writes through a loop device
stall every read and write of their files (docs/daemon.md, "At scale"). ``--ctld-state-fs GIB``
puts slurmctld's ``StateSaveLocation`` on a file system of its own in ``/dev/shm``, the
controller's own disk (:func:`controller_state`).

Targets (issue 36, at 256 x 4): round time excluding the policy <= 2 s median, <= 5 s max;
policy <= 1 s; Slurm calls per round <= 3 + one per change; RSS growth < 10% over the run;
hpcsched's RPCs <= 10% of slurmctld's total.

    .venv/bin/python benchmarks/daemon_scale.py [--scales 64,256,1024] [--minutes 30]
        [--jobs 2000] [--user alice --user-python /opt/hpcsched-multiuser-venv/bin/python]

Prints a table per scale and writes JSON to ``--out`` (default ``bench-results/daemon_scale.json``).
Needs root (the dev cluster; the jobs run as ``--user``, whose Python must import this checkout).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _host_probes import (  # noqa: E402
    BlockedStacks,
    cpu_seconds,
    delay_accounting,
    disk_counters,
    host_memory_mib,
    io_wait_seconds,
    pressure_seconds,
    run_queue_seconds,
    threads_of,
)
from _journal import journal_outcomes  # noqa: E402
from _report import rss_mib, write_report  # noqa: E402
from _scale_jobs import plan_jobs  # noqa: E402

from hpcsched import slurm  # noqa: E402
from hpcsched.daemon import service  # noqa: E402
from hpcsched.daemon.config import defaults  # noqa: E402
from hpcsched.daemon.driving import IN_FLIGHT  # noqa: E402
from hpcsched.daemon.round import PHASES, Daemon  # noqa: E402
from hpcsched.daemon.store import Store  # noqa: E402
from hpcsched.slurm import commands, devcluster, observe  # noqa: E402
from hpcsched.slurm.devcluster.base import Layout  # noqa: E402
from hpcsched.slurm.devcluster.processes import find_procs, read_pid  # noqa: E402

STATE_DIR = Path("/var/lib/hpcsched/devcluster-scale")
WORK = Path("/var/tmp/hpcsched-scale")


@contextlib.contextmanager
def own_file_system(path: Path, gib: int, options: str = "noatime", mode: int = 0o1777,
                    in_memory: bool = False):
    """``path`` on an ext4 file system of its own for the block (``gib`` > 0; nothing when 0):
    a loop device (direct I/O) over a file of ``gib`` GiB beside it, mounted with ``options``,
    its root given ``mode``. The image is written through before it is used (no extent of it
    is allocated during the run) and removed at the end.

    On a cluster the jobs' directories are on the shared file system (NFS, Lustre) and the
    daemon's store on the login node's own disk. Here 900 stand-ins write their metrics (about
    7 MB/s, 13 GB in 30 minutes) to the disk the store syncs to, and with ext4's default
    ``data=ordered`` a commit of the store's journal waits for their data too (tenth run). Either
    side on a file system of its own gets a journal of its own; the disk under both is the same.
    The store's side is the light one: its loop device carries the store's writes alone. The
    jobs' side through a loop device (``data=writeback``: eleventh and twelfth runs) stalled
    every read and write of their files once the jobs' writes queued on it.

    With ``in_memory`` the image is a sparse file in ``/dev/shm`` (tmpfs: pages are taken as
    the file system writes them): a device of its own, whose writes and flushes no longer queue
    behind the jobs' at the host's disk (eighteenth run: an ``fdatasync`` of the store waited
    8.15 s for its loop device's flush of an image on that disk), as a login node's local disk
    does not carry the shared file system's traffic. Its flushes cost nothing, where a local
    SSD's take about a millisecond; a round syncs a few commits."""
    if gib <= 0:
        yield
        return
    if in_memory:
        image = Path("/dev/shm") / f"hpcsched-bench-{path.name}.ext4"
        with open(image, "wb") as fh:
            fh.truncate(gib << 30)
    else:
        image = path.parent / f".{path.name}.ext4"
        # written through once (zeros, direct I/O: about 25 s for 24 GiB here), not fallocate'd:
        # the loop's first write into an unwritten extent of the image is a metadata change in
        # the journal of the disk's file system
        subprocess.run(["dd", "if=/dev/zero", f"of={image}", "bs=16M", f"count={gib * 64}",
                        "oflag=direct", "status=none"], check=True)
    dev = subprocess.run(["losetup", "--find", "--show", f"--direct-io={'off' if in_memory else 'on'}",
                          str(image)], check=True, capture_output=True, text=True).stdout.strip()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True)
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-o", options, dev, str(path)], check=True)
        path.chmod(mode)
        try:
            yield
        finally:
            # its writers are gone by now (the jobs scancelled or the dev cluster stopped, the
            # store closed); a straggler keeps the lazy unmount from freeing the device until
            # it exits
            subprocess.run(["umount", "--lazy", str(path)], capture_output=True)
    finally:
        subprocess.run(["losetup", "--detach", dev], capture_output=True)
        image.unlink(missing_ok=True)


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def login_priority(nice: int, realtime: bool, ctld_realtime: bool = False) -> None:
    """Give the daemon (this process) and slurmctld the CPU before the emulated compute nodes
    (slurmd and the jobs, at nice 0): on a real cluster the daemon has a login node's core and
    slurmctld the controller to themselves, here all share the host's cores. slurmctld (every
    thread) at nice ``nice``; the daemon at ``nice``, or with ``realtime`` in the ``SCHED_RR``
    class at priority 1 (sched(7): it runs whenever it is ready, as on a core of its own; the
    kernel keeps 5% of each second for everything else), inherited by its Slurm commands. With
    ``ctld_realtime`` slurmctld's threads are in ``SCHED_RR`` at priority 1 too (the threads it
    starts later for each RPC inherit it, pthread_attr_setinheritsched(3)): a controller with
    cores of its own, which the emulated nodes' load cannot delay.

    munged goes with slurmctld: here one munged signs and checks the credentials of every
    RPC of slurmctld, the 256 slurmd and every client, where a real cluster runs one per
    host; starved by the jobs' start-up (a load average of 640 when 900 stand-ins start),
    it failed slurmctld's pings, and slurmctld then took half the nodes for dead ("NODE
    FAILURE", then "Kill task failed" drains: a run on 2026-11-30)."""
    pids = [read_pid(Layout(STATE_DIR).pidfile("slurmctld")), *find_procs("munged")]
    for task in threads_of(pids):
        with contextlib.suppress(ProcessLookupError):   # a thread that ended meanwhile
            if nice:
                os.setpriority(os.PRIO_PROCESS, task, nice)
            if ctld_realtime:
                os.sched_setscheduler(task, os.SCHED_RR, os.sched_param(1))
    if realtime:   # above slurmctld's threads when they are real-time too: hosts of their own
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(2 if ctld_realtime else 1))
    elif nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)


def compute_priority(nice: int) -> int:
    """Put the emulated compute nodes (every thread of every slurmd) at nice ``nice``; the jobs
    they start inherit it (slurm.conf(5), ``PropagatePrioProcess=0``: tasks inherit slurmd's
    scheduling priority). Returns how many threads were set.

    On a real cluster the jobs run on other hosts; here 900 stand-ins share two cores with the
    kernel's own threads at nice 0: the store's loop device's workers and its file system's
    journal thread (``jbd2``), which the daemon's synced commits wait for and which a real-time
    daemon does not lift. A nice above 0 leaves them the CPU before the jobs, as their own hosts
    would."""
    count = 0
    for task in threads_of(find_procs("slurmd")):
        with contextlib.suppress(ProcessLookupError):   # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, task, nice)
            count += 1
    return count


def sdiag_text() -> str:
    """``sdiag``'s report (its own ``REQUEST_STATS_INFO`` RPC)."""
    return subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout


def sdiag(out: str | None = None) -> dict[str, dict[str, int]]:
    """slurmctld's RPC counts since the last reset: ``{"types": {...}, "users": {...}}``, and
    ``"types_ave_us"``: the mean microseconds slurmctld took per RPC of each type; from ``out``
    (:func:`sdiag_text`), else from a new report."""
    out = sdiag_text() if out is None else out
    part = {"types": out.split("by message type", 1)[-1].split("by user", 1)[0],
            "users": out.split("by user", 1)[-1].split("Pending RPC", 1)[0]}
    rows = {k: list(re.finditer(r"^\s*(\S+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:(\d+)", v, re.M))
            for k, v in part.items()}
    got = {k: {m.group(1): int(m.group(2)) for m in v} for k, v in rows.items()}
    # slurmctld's own time per RPC, waits for its locks included (sdiag(1): ave_time)
    got["types_ave_us"] = {m.group(1): int(m.group(3)) for m in rows["types"]}
    return got


def sdiag_cycles(out: str) -> dict[str, dict[str, int]]:
    """slurmctld's scheduling passes since the last reset, from ``sdiag``'s report ``out``:
    ``{"main": {...}, "backfill": {...}}`` with ``max_cycle_us``, ``mean_cycle_us``, ``cycles``
    (sdiag(1): a pass holds the job locks, so an ``squeue`` or ``scontrol update`` waits for the
    one under way)."""
    main = out.split("Main schedule statistics", 1)[-1].split("Backfilling stats", 1)[0]
    backfill = out.split("Backfilling stats", 1)[-1].split("Latency for", 1)[0].split("Remote Procedure", 1)[0]

    def fields(text: str) -> dict[str, int]:
        got = {k: re.search(rf"^\s*{label}:\s*(\d+)", text, re.M)
               for k, label in (("max_cycle_us", "Max cycle"), ("mean_cycle_us", "Mean cycle"),
                                ("cycles", "Total cycles"), ("last_queue_length", "Last queue length"))}
        return {k: int(m.group(1)) for k, m in got.items() if m}

    return {"main": fields(main), "backfill": fields(backfill)}


def scheduler_parameters(conf: Path, extra: str) -> str:
    """Append ``extra`` (``max_sched_time=1,bf_yield_interval=500000``...) to the dev cluster's
    ``SchedulerParameters`` in ``conf`` and ``scontrol reconfigure``, as a site's admin tunes
    slurmctld's scheduling passes (slurm.conf(5), SchedulerParameters); returns the line."""
    text = conf.read_text()
    old = re.search(r"^SchedulerParameters=(.*)$", text, re.M)
    line = f"SchedulerParameters={old.group(1)},{extra}"
    conf.write_text(text.replace(old.group(0), line))
    subprocess.run(["scontrol", "reconfigure"], check=True, capture_output=True, timeout=120)
    return line


def rpc_cost(argv: list[str], tries: int = 5) -> int:
    """slurmctld RPCs of one run of ``argv`` (``sdiag`` before and after; its own
    ``REQUEST_STATS_INFO`` not counted): per RPC type the fewest over ``tries`` runs, summed.
    RPCs of others that arrive meanwhile (the nodes' registrations and pings, just after the
    cluster starts) only add; counted as a whole, the fewest of three runs once made ``squeue`` 4
    RPCs and ``sinfo`` 2, and in another run ``sinfo`` 4 and ``scontrol update`` 2 (2026-11-30),
    where alone on a small cluster they are 1, 2 and 1."""
    def count() -> collections.Counter:
        return collections.Counter({t: n for t, n in sdiag()["types"].items() if t != "REQUEST_STATS_INFO"})

    def once() -> collections.Counter:
        before = count()
        subprocess.run(argv, capture_output=True, timeout=60)
        return count() - before

    runs = [once() for _ in range(tries)]
    return sum(min(r.get(t, 0) for r in runs) for t in set().union(*runs))


def command_kind(args) -> str:
    """``scontrol update``, ``squeue``, ``scancel``: a Slurm command by what it asks."""
    words = [str(x) for x in args]
    return " ".join(words[:2]) if words[0] == "scontrol" and len(words) > 1 else words[0]


def calibrate() -> dict[str, int]:
    """slurmctld RPCs of one of each command the daemon issues, on the cluster before any job
    runs (so that nothing else is counted): ``squeue`` and ``sinfo`` as the daemon runs them,
    ``scontrol`` commands as a no-op ``scontrol update`` of a held job, ``scancel`` of it."""
    held = subprocess.run(["sbatch", "--parsable", "-H", "--output=/dev/null", "--wrap", "true"],
                          capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    cost = {"squeue": rpc_cost(["squeue", "--json", "--states=all"]), "sinfo": rpc_cost(["sinfo", "--json"]),
            "scontrol": rpc_cost(["scontrol", "update", f"JobId={held}", "Comment=hpcsched-scale-benchmark"])}
    cost["scancel"] = rpc_cost(["scancel", held])
    return cost


class CommandLog:
    """Counts the daemon's Slurm commands by their first two words (``squeue --json``, ``scontrol
    update``), and the seconds they took (Slurm's answer, before the daemon parses it): wraps
    ``hpcsched.slurm.commands.run`` where the daemon's modules call it, for this benchmark only
    (:meth:`close` puts it back)."""

    PLACES = (commands, slurm, observe)   # the modules that hold a reference to run

    def __init__(self):
        self.counts: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self._run = commands.run
        lock = threading.Lock()   # a round's steps run their commands side by side (driving.py)

        def run(args, *a, **k):
            key = command_kind(args)
            with lock:
                self.counts[key] += 1
            t = time.monotonic()
            try:
                return self._run(args, *a, **k)
            finally:
                with lock:
                    self.seconds[key] += time.monotonic() - t

        for module in self.PLACES:
            module.run = run

    def close(self) -> None:
        """Put Slurm's ``run`` back where it was wrapped."""
        for module in self.PLACES:
            module.run = self._run


#: the share of the plan's jobs a run needs submitted to go on
SUBMITTED_AT_LEAST = 0.99


def submit_jobs(jobs: list[dict], user: str, python: str, control: Path, conf: Path) -> tuple[list[str], float]:
    """Submit the plan as ``user`` (one process, hpcsub in-process); their ids and the seconds."""
    plan = WORK / "plan.json"
    plan.write_text(json.dumps(jobs))
    plan.chmod(0o644)
    env = ["env", f"SLURM_CONF={conf}", f"HPCSCHED_CONTROL_DIR={control}", "HPCSCHED_LOG_LEVEL=WARNING",
           f"PYTHONPATH={ROOT}",  # the user's Python imports this checkout (jobs inherit it)
           f"PATH={os.environ['PATH']}"]
    cmd = [*env, python, str(ROOT / "benchmarks" / "_scale_jobs.py"), str(plan)]
    if user != "root":
        cmd = ["runuser", "-u", user, "--", *cmd]
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp")
    ids = [ln for ln in out.stdout.split() if ln.isdigit()]
    # slurmctld, busy starting the first jobs on a host it shares with them, times out a few
    # sbatch (11 of 2,000 in a run on 2026-11-30); a run goes on without them, and says so
    if len(ids) < SUBMITTED_AT_LEAST * len(jobs):
        raise SystemExit(f"submission as {user} failed ({len(ids)} of {len(jobs)} submitted):\n"
                         f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    if len(ids) < len(jobs):
        print(f"{len(jobs) - len(ids)} of {len(jobs)} submissions failed (the run goes on "
              f"without them):\n{out.stderr[-1000:]}", flush=True)
    return ids, time.perf_counter() - t


def traced_growth(snapshot: tracemalloc.Snapshot, top: int) -> list[dict]:
    """The ``top`` places (file:line, with the 4 frames above) holding the most memory
    allocated since tracing started, and not freed: what the daemon's RSS grew by."""
    stats = snapshot.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)]
                                   ).statistics("traceback")[:top]
    return [{"kib": round(s.size / 1024, 1), "blocks": s.count,
             "where": [f"{f.filename.replace(str(ROOT) + '/', '')}:{f.lineno}" for f in s.traceback]}
            for s in stats]


def run_daemon(minutes: float, control: Path, cmds: CommandLog, trace: int = 0
               ) -> tuple[list[dict], list[dict], dict]:
    """The daemon's rounds (default settings) for ``minutes``: one record per round, with
    ``trace`` the ``trace`` places whose memory grew most from the second round on
    (``tracemalloc``, 5 frames; it slows the daemon, so its times then are not the figures),
    and what became of its changes (:func:`journal_outcomes`)."""
    base = defaults()
    settings = replace(base, daemon=replace(base.daemon, partitions=(), control_dir=str(control),
                                            database_url=f"sqlite:///{WORK}/store/daemon.db",
                                            lock_file=str(WORK / "daemon.lock")))
    service.steady_heap()   # as hpcsched daemon does
    store = Store(settings.daemon.database_url)
    store.upgrade()
    daemon = Daemon(settings, store=store)
    rounds, state, end = [], {"stop": False, "reload": False}, time.monotonic() + 60 * minutes
    blocked = BlockedStacks(processes={"slurmctld": read_pid(Layout(STATE_DIR).pidfile("slurmctld"))}).start()
    while time.monotonic() < end:
        t0, calls0, cpu0, queued0 = time.monotonic(), commands.calls(), cpu_seconds(), run_queue_seconds()
        io0, stall0, mem0 = io_wait_seconds(), pressure_seconds("io"), pressure_seconds("memory")
        disk0 = disk_counters()
        before, before_s = collections.Counter(cmds.counts), collections.Counter(cmds.seconds)
        blocked.take()   # what the threads did between rounds is not the round's
        rep = daemon.round()
        stacks = blocked.take(top=8)
        cpu, queued = cpu_seconds() - cpu0, run_queue_seconds() - queued0
        io, stall = _delta(io_wait_seconds(), io0), _delta(pressure_seconds("io"), stall0)
        mem_stall = _delta(pressure_seconds("memory"), mem0)
        disk = {k: v - disk0[k] for k, v in disk_counters().items()}
        if trace and len(rounds) == 1:   # after the second round, as the RSS growth is counted
            tracemalloc.start(5)
        states = collections.Counter(rep.slurm_states.values())
        rounds.append({
            "t": round(time.time(), 3), "duration": rep.duration, "policy": rep.policy_seconds, "cpu": cpu,
            "run_queue": queued, "io_wait": io, "io_pressure": stall, "memory_pressure": mem_stall,
            "host_mib": host_memory_mib(), "disk": disk, "blocked": stacks,
            "phases": rep.phases, "slurm_calls": rep.slurm_calls, "changes": len(rep.changes),
            # resize steps the round stopped waiting for (daemon.step_wait), and its wait
            "in_flight": sum(o == IN_FLIGHT for o in rep.outcomes.values()),
            "step_waited": rep.step_waited,
            "commands": dict(cmds.counts - before), "error": rep.error, "jobs": rep.jobs,
            # seconds in Slurm's commands during the round, by kind (a step carried over may
            # add its command's to a later round's)
            "command_s": {k: round(v, 3) for k, v in (cmds.seconds - before_s).items()},
            "running": states.get("RUNNING", 0), "pending": states.get("PENDING", 0),
            "rss_mib": rss_mib(),
            "traced_mib": tracemalloc.get_traced_memory()[0] / 2 ** 20 if tracemalloc.is_tracing() else None})
        r = rounds[-1]
        print(f"  round {len(rounds):3d}: {r['duration']:6.2f} s (policy {r['policy']:5.2f}, CPU {cpu:5.2f}, "
              f"run queue {queued:5.2f}"
              + ("" if io is None else f", I/O wait {io:5.2f}")
              + ("" if stall is None else f", host I/O stall {stall:5.2f}")
              + ("" if mem_stall is None else f", memory stall {mem_stall:5.2f}")
              + (f", {r['host_mib']['MemAvailable']:.0f} MiB available" if "MemAvailable" in r["host_mib"] else "")
              + "), "
              f"{r['slurm_calls']} calls, {r['changes']} changes, {r['running']} running / "
              f"{r['pending']} pending, RSS {r['rss_mib']:.0f} MiB" + (f", error {r['error']}" if r["error"] else ""),
              flush=True)
        if r["duration"] - r["policy"] > 5:
            for b in stacks[:5]:
                print(f"    blocked {b['s']:5.2f} s ({b['thread']}): {b['stack']}", flush=True)
        del rep
        service.trim_heap()   # as hpcsched daemon does after each round
        why = service._between_rounds(daemon, settings.daemon, t0, state)
        r["between_calls"], r["next"] = commands.calls() - calls0 - r["slurm_calls"], why or "interval"
    blocked.stop()
    growth = traced_growth(tracemalloc.take_snapshot(), trace) if tracemalloc.is_tracing() else []
    tracemalloc.stop()
    daemon.steps.close(store, settings.daemon.slurm_timeout)   # as hpcsched daemon does at its stop
    outcomes = journal_outcomes(store)
    store.close()
    return rounds, growth, outcomes


def summarise(rounds: list[dict]) -> dict:
    """Medians and maxima per phase, the Slurm-call check, RSS growth."""
    ok = [r for r in rounds if r["error"] is None] or rounds
    nopol = [r["duration"] - r["policy"] for r in ok]
    phases = {p: _spread([r["phases"].get(p, 0.0) for r in ok]) for p in PHASES}
    over = [r["slurm_calls"] - 3 - r["changes"] for r in ok]
    steady = ok[1:] or ok   # the first round builds the store and imports the policy
    warm = next((r for r in steady if r["t"] >= steady[0]["t"] + (steady[-1]["t"] - steady[0]["t"]) / 10),
                steady[0])
    return {
        "rounds": len(rounds), "errors": len(rounds) - len([r for r in rounds if r["error"] is None]),
        "round_without_policy_s": _spread(nopol),
        "policy_s": _spread([r["policy"] for r in ok]),
        "cpu_s": _spread([r["cpu"] for r in ok]),
        "run_queue_s": _spread([r.get("run_queue", 0.0) for r in ok]),
        **{f"{k}_s": _spread([r[k] for r in ok if r.get(k) is not None])
           for k in ("io_wait", "io_pressure", "memory_pressure")},
        # the host disk's mean latency per write and per flush in each round, ms
        "disk_write_ms": _spread(_per_round(ok, "write_ms", "writes")),
        "disk_flush_ms": _spread(_per_round(ok, "flush_ms", "flushes")),
        "host_available_mib": _spread([r["host_mib"]["MemAvailable"] for r in ok
                                       if "MemAvailable" in r.get("host_mib", {})], low=True),
        "phases_s": phases,
        # where the daemon's threads were blocked in the rounds over 5 s without the policy
        "blocked_in_long_rounds": blocked_in(r for r in ok if r["duration"] - r["policy"] > 5),
        "slurm_calls": {"max": max(r["slurm_calls"] for r in ok), "max_over_3_plus_changes": max(over)},
        "changes": {"total": sum(r["changes"] for r in ok), "max": max(r["changes"] for r in ok)},
        # steps carried over a round (daemon.step_wait); older records have none
        "in_flight": {"total": sum(r.get("in_flight", 0) for r in ok),
                      "rounds": sum(1 for r in ok if r.get("in_flight"))},
        "step_waited_s": _spread([r["step_waited"] for r in ok if "step_waited" in r]),
        # of the observation, the seconds Slurm took to answer (squeue and sinfo)
        "observe_commands_s": _spread([r["command_s"].get("squeue", 0) + r["command_s"].get("sinfo", 0)
                                       for r in ok if "command_s" in r]),
        "running": {"median": statistics.median(r["running"] for r in ok), "max": max(r["running"] for r in ok)},
        "pending": {"median": statistics.median(r["pending"] for r in ok), "max": max(r["pending"] for r in ok)},
        "rss_mib": {"first": steady[0]["rss_mib"], "last": steady[-1]["rss_mib"],
                    "growth": steady[-1]["rss_mib"] / steady[0]["rss_mib"] - 1,
                    # from the first round after a tenth of the run: caches filled once
                    "growth_after_warmup": steady[-1]["rss_mib"] / warm["rss_mib"] - 1},
    }


def blocked_in(rounds, top: int = 8) -> list[dict]:
    """The ``top`` (thread, kernel stack) pairs by seconds blocked over ``rounds``
    (:class:`~_host_probes.BlockedStacks`), ``{"thread", "stack", "s"}``."""
    total: collections.Counter = collections.Counter()
    for r in rounds:
        for b in r.get("blocked", ()):
            total[(b["thread"], b["stack"])] += b["s"]
    return [{"thread": t, "stack": k, "s": round(v, 2)} for (t, k), v in total.most_common(top)]


def _per_round(rounds: list[dict], ms: str, count: str) -> list[float]:
    """Each round's ``disk[ms] / disk[count]`` (:func:`disk_counters`), where it counted any."""
    return [r["disk"][ms] / r["disk"][count] for r in rounds if r.get("disk", {}).get(count)]


def _spread(values: list[float], low: bool = False) -> dict | None:
    """``{"median", "max"}`` of ``values`` (with ``low`` also ``"min"``); None for none (a figure
    this host did not give)."""
    if not values:
        return None
    out = {"median": statistics.median(values), "max": max(values)}
    return {**out, "min": min(values)} if low else out


def rpc_share(rpcs: dict, cmds: CommandLog, user: str, span_s: float, cost: dict[str, int]) -> dict:
    """hpcsched's share of slurmctld's RPCs: the daemon's (its commands x each one's RPCs,
    :func:`calibrate`) and the jobs' (``user``'s, from sdiag's table by user)."""
    total = sum(rpcs["types"].values())
    daemon = sum(n * cost.get(k.split()[0], 1) for k, n in cmds.counts.items())
    top = dict(sorted(rpcs["types"].items(), key=lambda kv: -kv[1])[:15])   # the busiest types
    jobs = rpcs["users"].get(user, 0) if user != "root" else None
    return {"total": total, "per_s": total / span_s, "daemon": daemon, "daemon_share": daemon / total,
            "jobs": jobs, "jobs_share": None if jobs is None else jobs / total,
            "daemon_commands": dict(cmds.counts), "rpc_per_command": cost,
            "by_type": top, "by_user": rpcs["users"],
            "ave_us_by_type": {t: rpcs["types_ave_us"].get(t) for t in top}}


def one_scale(gpus: int, gpus_per_node: int, jobs: int, minutes: float, args) -> dict:
    nodes = gpus // gpus_per_node
    print(f"\n== {gpus} GPUs ({nodes} nodes x {gpus_per_node}), {jobs} jobs, {minutes:g} min", flush=True)
    devcluster.down(STATE_DIR)
    with controller_state(args.ctld_state_fs, args.keep, args.user):
        conf = devcluster.up(STATE_DIR, nodes=nodes, gpus=gpus_per_node, clean=True)
        return _with_job_file_systems(gpus, gpus_per_node, jobs, minutes, conf, args)


def _with_job_file_systems(gpus: int, gpus_per_node: int, jobs: int, minutes: float, conf: Path,
                           args) -> dict:
    os.environ["SLURM_CONF"] = str(conf)
    shutil.rmtree(WORK, ignore_errors=True)
    control = WORK / "jobs"
    control.mkdir(parents=True)
    for d in (WORK, control):
        d.chmod(0o1777)
    (WORK / "store").mkdir(mode=0o700)
    with own_file_system(control, args.jobs_fs, "data=writeback,noatime"), \
            own_file_system(WORK / "store", args.store_fs, mode=0o700, in_memory=args.store_in_memory):
        return _run_scale(gpus, gpus_per_node, jobs, minutes, conf, control, args)


@contextlib.contextmanager
def controller_state(gib: int, keep: bool, user: str):
    """slurmctld's ``StateSaveLocation`` on a file system of its own for the block (``gib`` > 0;
    nothing when 0), its image in ``/dev/shm`` (:func:`own_file_system` with ``in_memory``):
    the controller's own disk. slurmctld writes and syncs a job's script and environment
    files there when it is submitted, and its job and node state files every few seconds;
    with the state on the disk 900 stand-ins write their metrics to, its threads waited on
    writeback in 47 of 119 rounds (twentieth run: 3.3 s once) and slurmctld answered an
    ``squeue`` in 4.8 s. The cluster is stopped before the file system goes (unless ``keep``)."""
    if gib <= 0:
        yield
        return
    with own_file_system(Layout(STATE_DIR).state, gib, mode=0o755, in_memory=True):
        try:
            yield
        finally:
            if not keep:
                stop_cluster(user)


def stop_cluster(user: str) -> None:
    """Stop the dev cluster and whatever ``user``'s stand-ins outlived it."""
    compute_priority(0)   # slurmd at nice 19 among 900 stand-ins outlived SIGKILL by 30 s
    try:
        devcluster.down(STATE_DIR)
    finally:
        # stand-ins whose slurmstepd went down with the cluster before they saw their
        # scancel (seen after the 1,024-GPU run: four extension stand-ins left; 624
        # when the cluster's stop failed)
        subprocess.run(["pkill", "-u", user, "-f", "hpcsched.job.standin"], capture_output=True)


def _run_scale(gpus: int, gpus_per_node: int, jobs: int, minutes: float, conf: Path, control: Path,
               args) -> dict:
    if args.job_output:
        (WORK / "out").mkdir(mode=0o1777)
        (WORK / "out").chmod(0o1777)
    if args.sched_params:
        print(scheduler_parameters(conf, args.sched_params), flush=True)
    login_priority(args.login_nice, args.daemon_rt, args.ctld_rt)
    if args.compute_nice:
        print(f"compute nodes at nice {args.compute_nice}: {compute_priority(args.compute_nice)} slurmd "
              "threads", flush=True)
    cost = calibrate()
    plan = plan_jobs(jobs, gpus_per_node, seed=args.seed,
                     output=str(WORK / "out" / "slurm-%j.out") if args.job_output else "/dev/null")
    ids, took = submit_jobs(plan, args.user, args.user_python, control, conf)
    print(f"submitted {len(ids)} jobs as {args.user} in {took:.0f} s", flush=True)
    subprocess.run(["sdiag", "--reset"], check=True, capture_output=True)
    cmds, t0 = CommandLog(), time.monotonic()
    try:
        with delay_accounting():
            rounds, growth, outcomes = run_daemon(minutes, control, cmds, args.tracemalloc)
        span = time.monotonic() - t0
        report = sdiag_text()
        rpcs, cycles = sdiag(report), sdiag_cycles(report)
        cmds.close()
        share = rpc_share(rpcs, cmds, args.user, span, cost)
    finally:
        cmds.close()
        if not args.keep:
            subprocess.run(["scancel", "-u", args.user], capture_output=True)
    return {"gpus": gpus, "nodes": gpus // gpus_per_node, "jobs": jobs, "submitted": len(ids), "minutes": minutes,
            "submit_s": took,
            "summary": summarise(rounds), "rpcs": share, "scheduler_cycles": cycles, "rounds": rounds,
            "memory_growth": growth, "changes": outcomes}


def print_table(results: list[dict]) -> None:
    print(f"\n{'part of the round (s)':<24}" + "".join(f"{r['gpus']:>8} GPUs med/max" for r in results))
    for p in PHASES:
        cells = (r["summary"]["phases_s"][p] for r in results)
        print(f"{p:<24}" + "".join(f"{c['median']:>11.3f}/{c['max']:<7.3f}" for c in cells))
    rows = [("round w/o policy", "round_without_policy_s"), ("policy", "policy_s"), ("round's CPU", "cpu_s"),
            ("round's run-queue wait", "run_queue_s"), ("round's I/O wait", "io_wait_s"),
            ("host's I/O stall", "io_pressure_s"), ("host's memory stall", "memory_pressure_s"),
            ("disk: ms per write", "disk_write_ms"), ("disk: ms per flush", "disk_flush_ms"),
            ("observe: Slurm's answers", "observe_commands_s")]
    for name, key in rows:
        cells = [r["summary"].get(key) for r in results]
        if any(c is None for c in cells):   # a figure some host did not give
            continue
        print(f"{name:<24}" + "".join(f"{c['median']:>11.3f}/{c['max']:<7.3f}" for c in cells))
    available = [r["summary"].get("host_available_mib") for r in results]
    if all(available):
        print(f"{'host memory avail. (MiB)':<24}"
              + "".join(f"{c['median']:>11.0f}/min {c['min']:<7.0f}" for c in available))
    for r in results:
        s, q = r["summary"], r["rpcs"]
        print(f"{r['gpus']} GPUs: {s['rounds']} rounds, running {s['running']['median']:.0f} / pending "
              f"{s['pending']['median']:.0f} (median), {s['changes']['total']} changes; Slurm calls per round max "
              f"{s['slurm_calls']['max']} (max over 3 + changes: {s['slurm_calls']['max_over_3_plus_changes']}); "
              f"RSS {s['rss_mib']['first']:.0f} -> {s['rss_mib']['last']:.0f} MiB "
              f"({100 * s['rss_mib']['growth']:+.1f}%); "
              f"steps carried over a round: {s['in_flight']['total']} in {s['in_flight']['rounds']} "
              f"round(s); "
              f"slurmctld {q['total']} RPCs ({q['per_s']:.1f}/s), daemon {100 * q['daemon_share']:.1f}%"
              + ("" if q["jobs_share"] is None else f", the jobs {100 * q['jobs_share']:.1f}%"))
        for kind, c in r["scheduler_cycles"].items():
            print(f"{r['gpus']} GPUs: slurmctld's {kind} scheduling passes: {c.get('cycles', 0)}, "
                  f"mean {c.get('mean_cycle_us', 0) / 1e6:.2f} s, max {c.get('max_cycle_us', 0) / 1e6:.2f} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scales", default="64,256,1024", help="GPU counts, comma-separated")
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--jobs", type=int, default=2000, help="jobs at 1,024 GPUs (proportionally fewer below)")
    p.add_argument("--minutes", default="30", help="minutes per scale: one value, or one per scale")
    p.add_argument("--user", default="root", help="Unix user the jobs run as (e.g. alice)")
    p.add_argument("--user-python", default=sys.executable,
                   help="a Python the user can run that imports this checkout's hpcsched")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--login-nice", type=int, default=-20,
                   help="nice value of slurmctld and munged (and of the daemon with --no-daemon-rt); the compute "
                        "nodes' processes run at 0: slurmctld has a host of its own on a real cluster")
    p.add_argument("--daemon-rt", action=argparse.BooleanOptionalAction, default=True,
                   help="run the daemon in the SCHED_RR class, as on a login node core of its own "
                        "(default); --no-daemon-rt: at --login-nice")
    p.add_argument("--ctld-rt", action=argparse.BooleanOptionalAction, default=False,
                   help="run slurmctld (and munged) in the SCHED_RR class too, as on a controller of its own "
                        "(default: at --login-nice only)")
    p.add_argument("--compute-nice", type=int, default=0, metavar="N",
                   help="run the emulated compute nodes (slurmd, and so the jobs) at nice N: below the "
                        "kernel's own threads (the store's loop device and file system journal), as on "
                        "hosts of their own (default 0)")
    p.add_argument("--sched-params", default="", metavar="PARAMS",
                   help="append to the dev cluster's SchedulerParameters (then scontrol reconfigure), "
                        "e.g. max_sched_time=1,bf_yield_interval=500000: how long slurmctld's "
                        "scheduling passes hold the job locks an squeue waits for")
    p.add_argument("--jobs-fs", type=int, default=0, metavar="GIB",
                   help="put the job directories on an ext4 file system of their own (a loop device over a "
                        "file of GIB GiB, data=writeback): a diagnosis of what the jobs' writes do to the "
                        "daemon's synced ones (default 0: on the daemon's disk)")
    p.add_argument("--store-fs", type=int, default=0, metavar="GIB",
                   help="put the daemon's store on an ext4 file system of its own (a loop device over a "
                        "file of GIB GiB), as a login node's local disk is to the jobs' shared file "
                        "system (default 0: on the jobs' disk)")
    p.add_argument("--store-in-memory", action="store_true",
                   help="with --store-fs: the file system's image in /dev/shm, a device whose writes "
                        "and flushes do not queue behind the jobs' at the host's disk")
    p.add_argument("--ctld-state-fs", type=int, default=0, metavar="GIB",
                   help="put slurmctld's StateSaveLocation on an ext4 file system of its own of GIB GiB, "
                        "its image in /dev/shm: the controller's own disk, whose syncs do not queue "
                        "behind the jobs' writes (default 0: on the host's disk)")
    p.add_argument("--keep", action="store_true",
                   help="leave the dev cluster and the last scale's jobs running at the end")
    p.add_argument("--job-output", action="store_true",
                   help=f"keep each job's output in {WORK}/out (default: /dev/null)")
    p.add_argument("--tracemalloc", type=int, default=0, metavar="N",
                   help="trace the daemon's Python allocations from its second round and report the "
                        "N places that grew most (a diagnosis of RSS growth: the daemon runs slower)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "daemon_scale.json")
    args = p.parse_args()
    scales = [int(x) for x in args.scales.split(",")]
    minutes = [float(x) for x in args.minutes.split(",")]
    minutes = minutes * len(scales) if len(minutes) == 1 else minutes
    if len(minutes) != len(scales) or any(g % args.gpus_per_node for g in scales):
        p.error("--minutes needs one value or one per scale; every scale a multiple of --gpus-per-node")
    if args.store_in_memory and args.store_fs <= 0:
        p.error("--store-in-memory needs --store-fs GIB (the size of the store's file system)")
    results = []
    try:
        for gpus, mins in zip(scales, minutes):
            results.append(one_scale(gpus, args.gpus_per_node, max(1, round(args.jobs * gpus / 1024)), mins, args))
            write_report(args.out, "daemon_scale", results=results,
                         options={k: str(v) for k, v in vars(args).items()})
    finally:
        if not args.keep:
            stop_cluster(args.user)
    print_table(results)
    for r in results:
        for g in r["memory_growth"]:
            where = " <- ".join(reversed(g["where"]))   # the allocation first, then its callers
            print(f"{r['gpus']} GPUs: +{g['kib']:.0f} KiB in {g['blocks']} blocks at {where}")
        ch = r.get("changes", {})
        print(f"{r['gpus']} GPUs, the changes by kind and phase reached: {ch.get('by_kind_phase')}")
        for why, n in ch.get("failed_reasons", {}).items():
            print(f"  {n:5d} failed: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
