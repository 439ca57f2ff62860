#!/usr/bin/env python3
"""Benchmark: a chaos replay (issue 33). A Pollux workload replayed through the dev cluster with
the daemon while faults are injected at random times drawn from a seed, then checked from the
jobs' own records.

The workload is the testbed's (``benchmarks/_testbed_workload.py``: a systematic sample of
Pollux workload 3 for 4 x 4 GPUs), its first ``--jobs`` jobs (24), each ``hpcsub`` of the
emulated application with ``--hpcsched-record-samples``, scaled so that the static run would
last ``--minutes``. The daemon runs its defaults (``jct``, GPU granularity, grows by extension)
with ``--interval`` s rounds. Jobs take the cluster's node MTBF from ``--node-mtbf`` (the rate of
the faults below that lose workers), so their periodic checkpoints follow it (Young/Daly).

Faults (:data:`KINDS`), one every ``0.5 x --minutes x 60 / --faults`` s on average (exponential gaps;
a fault with no target gives way to the next kind 5 s later),
each kind as often as the others (a shuffled round-robin), at least ``--min-faults`` (30) applied:

* ``daemon-kill``: SIGKILL of the daemon, started again 2 s later;
* ``slurmctld-restart``: slurmctld stopped (SIGTERM, as ``systemctl restart`` does) and started
  again (``slurmctld -i``) 3 s later. Not SIGKILL: a killed controller loses the jobs submitted
  since its last state save, and later hands their ids out again (seen in a first run: a
  workload job submitted 2 s before the kill vanished, and its id came back as another job's
  extension), which no scheduler beside Slurm can undo;
* ``slurmdbd-down``: slurmdbd stopped (SIGTERM) for 60 s;
* ``extension-cancel``: ``scancel`` of a random running extension job;
* ``worker-kill``: SIGKILL of every task of a random running hpcsched job on one of its nodes
  (a lost node; ``scontrol listpids``);
* ``node-drain``: a random node drained (``scontrol update State=DRAIN``), resumed 90 s later;
* ``time-limit``: a random running job's time limit cut to about 2.5 min from now (Slurm's
  pre-timeout signal comes 120 s before it), its own limit given back once it has requeued;
* ``metrics-garbage``: a truncated JSON line and a line of bytes that are no JSON appended to a
  random running job's step records.

A fault that stops a job or loses its workers spares a job another hit within 240 s
(:data:`JOB_COOLDOWN_S`). A fault with no target at its time (no extension job running, say)
gives way to the next kind,
5 s later; it comes back in the next round of kinds.

Checks, after every job has ended (``chaos.json`` and the printed table):

* every job finished (``COMPLETED``);
* every sample of every job exactly once: the job's step records (``metrics/launch-*-rank-*.jsonl``)
  read as one history, where a step recorded again by a later launch replaces the earlier record
  (work redone), tile every epoch's permutation with no gap and no overlap, steps consecutive, no
  sample on two ranks;
* no job left held, no extension job left active, no action of the daemon's journal applied twice
  (one action per job and generation; no phase entered twice);
* work lost per fault: the seconds of training redone (the replaced records' step times) per
  restart, given to the latest fault before it that hit the job (else the latest fault of the
  whole cluster), by kind; each at most the job's checkpoint interval (Young/Daly with the
  assumed 10 s cost before any measurement: an upper bound) plus one step.

    .venv/bin/python benchmarks/chaos.py --seed 1 [--jobs 24] [--minutes 30] [--faults 64]
        [--min-faults 30] [--interval 5] [--instance K] [--out bench-results/chaos]
    .venv/bin/python benchmarks/chaos.py --judge bench-results/chaos/seed-1/chaos.json

``--instance K`` runs on dev-cluster instance K (its own state directory and ports), so that two
seeds run side by side. Writes ``OUT/seed-N/chaos.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402
from _testbed_workload import sample_workload  # noqa: E402

BIN = Path(sys.executable).parent
KINDS = ("daemon-kill", "slurmctld-restart", "slurmdbd-down", "extension-cancel", "worker-kill",
         "node-drain", "time-limit", "metrics-garbage")
#: faults that hit the whole cluster, not one job (work lost after them is theirs when no fault
#: hit the job itself)
CLUSTER_KINDS = ("daemon-kill", "slurmctld-restart", "slurmdbd-down", "node-drain")
#: faults that cannot make a job redo training: garbage in its records (the daemon skips it),
#: an extension cancelled (Slurm's SIGTERM: its workers leave at a step boundary)
HARMLESS_TO_WORK = ("metrics-garbage", "extension-cancel")
RETRY_S = 5.0
#: seconds between two faults that lose a job's workers or stop it: more than its first
#: checkpoint interval (Young/Daly with the assumed 10 s cost and --node-mtbf: about 190 s on one
#: node), as on a real cluster where a node's MTBF is far above it. With 120 s a job killed
#: four times before its first checkpoint was given up by its launcher (seed 2)
JOB_COOLDOWN_S = 240.0
DBD_DOWN_S = 60.0
DRAIN_S = 90.0


def sh(*args: str, check: bool = False, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run a Slurm command (``SLURM_CONF`` in this process's environment)."""
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=timeout)


# ------------------------------------------------------------------ the cluster's processes

class Processes:
    """The daemon (ours to start) and the dev cluster's slurmctld and slurmdbd (by pid file)."""

    def __init__(self, out: Path, layout, ports):
        self.out, self.layout, self.ports = out, layout, ports
        self.daemon: subprocess.Popen | None = None
        self.starts = 0
        self.lock = threading.Lock()

    def start_daemon(self) -> None:
        self.starts += 1
        log = open(self.out / f"daemon-{self.starts}.log", "ab")
        self.daemon = subprocess.Popen([str(BIN / "hpcsched"), "-v", "daemon"], stdout=log,
                                       stderr=subprocess.STDOUT)

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.daemon.kill()

    def pid(self, name: str) -> int | None:
        try:
            return int(self.layout.pidfile(name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self, name: str, sig: int) -> None:
        pid = self.pid(name)
        if pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            end = time.time() + 30
            while time.time() < end and _alive(pid):
                time.sleep(0.1)

    def start(self, name: str) -> None:
        from hpcsched.slurm.devcluster.base import need_bin
        from hpcsched.slurm.devcluster.daemons import start_daemon

        args = [need_bin(name)] + (["-i"] if name == "slurmctld" else [])
        port = self.ports.slurmctld if name == "slurmctld" else self.ports.slurmdbd
        with self.lock:
            start_daemon(self.layout, name, args, port, self.layout.log / f"{name}.log")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------ faults

@dataclasses.dataclass
class Fault:
    kind: str
    at: float                    # seconds since the replay's start
    job: str | None = None       # the hpcsched job it hit (its primary id), if one
    detail: str = ""


class Injector(threading.Thread):
    """Applies faults at the drawn times until told to stop; records what it did."""

    def __init__(self, procs: Processes, tracked_ids, start: float, seed: int, mean_gap: float,
                 plan_limits: dict[str, int], control_dir: Path):
        super().__init__(daemon=True)
        self.procs, self.tracked_ids, self.start_t = procs, tracked_ids, start
        self.rng = random.Random(seed)
        self.mean_gap, self.plan_limits, self.control_dir = mean_gap, plan_limits, control_dir
        self.stop_ev = threading.Event()
        self.applied: list[Fault] = []
        self.skipped: Counter = Counter()
        self.timers: list[threading.Thread] = []
        self.cut: dict[str, int] = {}   # job id -> its own time limit (minutes), to give back
        self.errors: list[str] = []
        self.last_hit: dict[str, float] = {}   # job id -> when a fault last hit it

    def _order(self):
        while True:
            kinds = list(KINDS)
            self.rng.shuffle(kinds)
            yield from kinds

    def run(self) -> None:
        order = self._order()
        kind = next(order)
        due = time.time() + self.rng.expovariate(1.0 / self.mean_gap)
        while not self.stop_ev.wait(max(0.0, min(5.0, due - time.time()))):
            self._give_back_limits()
            if time.time() < due:
                continue
            try:
                fault = getattr(self, "_" + kind.replace("-", "_"))()
            except Exception as exc:   # noqa: BLE001 - a fault that failed is reported, not fatal
                self.errors.append(f"{kind}: {exc!r}")
                fault = None
            if fault is None:   # nothing to hit now: the next kind, soon (this one comes back)
                self.skipped[kind] += 1
                kind = next(order)
                due = time.time() + RETRY_S
                continue
            fault.at = round(time.time() - self.start_t, 1)
            self.applied.append(fault)
            if fault.job and fault.kind != "metrics-garbage":
                self.last_hit[fault.job] = time.time()
            print(f"[chaos {fault.at:7.1f} s] {fault.kind} {fault.job or ''} {fault.detail}", flush=True)
            kind = next(order)
            due = time.time() + self.rng.expovariate(1.0 / self.mean_gap)

    def _later(self, seconds: float, fn) -> None:
        t = threading.Timer(seconds, fn)
        t.daemon = True
        t.start()
        self.timers.append(t)

    def finish(self) -> None:
        """Stop injecting; wait for pending recoveries; give every limit back."""
        self.stop_ev.set()
        self.join()
        for t in self.timers:
            t.join()
        self._give_back_limits(force=True)

    # the running jobs ----------------------------------------------------------------
    def _running(self) -> dict:
        from hpcsched import slurm

        return {j: i for j, i in slurm.squeue().items() if i.state == "RUNNING"}

    def _running_primaries(self) -> list:
        ids = set(self.tracked_ids())
        return [i for j, i in self._running().items() if j in ids and self._cool(j)]

    def _cool(self, job: str | None) -> bool:
        """No fault has hit ``job`` (a primary's id) for :data:`JOB_COOLDOWN_S`."""
        return job is None or time.time() - self.last_hit.get(job, 0.0) >= JOB_COOLDOWN_S

    # the faults ------------------------------------------------------------------------
    def _daemon_kill(self) -> Fault:
        if self.procs.daemon is not None and self.procs.daemon.poll() is None:
            self.procs.daemon.send_signal(signal.SIGKILL)
            self.procs.daemon.wait(timeout=30)
        self._later(2.0, self.procs.start_daemon)
        return Fault("daemon-kill", 0.0, detail=f"restart {self.procs.starts + 1}")

    def _slurmctld_restart(self) -> Fault:
        self.procs.stop("slurmctld", signal.SIGTERM)
        self._later(3.0, lambda: self.procs.start("slurmctld"))
        return Fault("slurmctld-restart", 0.0)

    def _slurmdbd_down(self) -> Fault | None:
        if not self.procs.pid("slurmdbd") or not _alive(self.procs.pid("slurmdbd")):
            return None   # still down from the last one
        self.procs.stop("slurmdbd", signal.SIGTERM)
        self._later(DBD_DOWN_S, lambda: self.procs.start("slurmdbd"))
        return Fault("slurmdbd-down", 0.0, detail=f"{DBD_DOWN_S:g} s")

    def _extension_cancel(self) -> Fault | None:
        ext = [i for i in self._running().values()
               if i.name.endswith("+ext") and self._cool(_primary_of(i))]
        if not ext:
            return None
        e = self.rng.choice(ext)
        sh("scancel", e.job_id)
        return Fault("extension-cancel", 0.0, job=_primary_of(e), detail=f"extension {e.job_id} on {e.nodes}")

    def _worker_kill(self) -> Fault | None:
        from hpcsched.slurm.hostlist import expand_hostlist

        ids = set(self.tracked_ids())
        jobs = [i for i in self._running().values()
                if (i.job_id in ids and self._cool(i.job_id))
                or (i.name.endswith("+ext") and self._cool(_primary_of(i)))]
        self.rng.shuffle(jobs)
        for info in jobs:
            node = self.rng.choice(expand_hostlist(info.nodes))
            out = sh("scontrol", "listpids", info.job_id, node).stdout
            pids = [int(f[0]) for f in (ln.split() for ln in out.splitlines()[1:])
                    if len(f) >= 4 and f[2].isdigit() and f[3] != "-"]
            if not pids:
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            job = info.job_id if info.job_id in ids else _primary_of(info)
            return Fault("worker-kill", 0.0, job=job,
                         detail=f"{len(pids)} task(s) of {info.job_id} on {node}")
        return None

    def _node_drain(self) -> Fault | None:
        nodes = [ln.split()[0] for ln in sh("sinfo", "-h", "-N", "-o", "%N %t").stdout.splitlines()
                 if ln.split()[1].rstrip("*") in ("idle", "mix", "alloc")]
        if not nodes:
            return None
        node = self.rng.choice(sorted(set(nodes)))
        sh("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=chaos")
        self._later(DRAIN_S, lambda: sh("scontrol", "update", f"NodeName={node}", "State=RESUME"))
        return Fault("node-drain", 0.0, detail=f"{node} for {DRAIN_S:g} s")

    def _time_limit(self) -> Fault | None:
        jobs = [i for i in self._running_primaries() if i.job_id not in self.cut and i.start_time]
        if not jobs:
            return None
        info = self.rng.choice(jobs)
        minutes = math.ceil((time.time() - info.start_time + 150.0) / 60.0)
        r = sh("scontrol", "update", f"JobId={info.job_id}", f"TimeLimit={minutes}")
        if r.returncode != 0:
            return None
        self.cut[info.job_id] = info.restarts
        return Fault("time-limit", 0.0, job=info.job_id, detail=f"TimeLimit={minutes} min")

    def _give_back_limits(self, force: bool = False) -> None:
        """A job whose limit was cut gets its own back once it has requeued (or ended)."""
        from hpcsched import slurm

        if not self.cut:
            return
        try:
            infos = slurm.squeue()
        except Exception:   # noqa: BLE001 - Slurm down: next time
            return
        for job, restarts in list(self.cut.items()):
            info = infos.get(job)
            if info is None or info.restarts > restarts or not info.active or force:
                if info is not None and info.active:
                    sh("scontrol", "update", f"JobId={job}", f"TimeLimit={self.plan_limits[job]}")
                del self.cut[job]

    def _metrics_garbage(self) -> Fault | None:
        from hpcsched.protocol.jobdir import JobDir, JobNotFound

        for info in sorted(self._running_primaries(), key=lambda _: self.rng.random()):
            try:
                files = sorted((JobDir.for_job(info.job_id, self.control_dir).path / "metrics")
                               .glob("launch-*-rank-*.jsonl"))
            except JobNotFound:
                continue
            if files:
                f = self.rng.choice(files)
                with open(f, "ab") as fh:
                    fh.write(b'{"t": 17, "step": \n\x00\xff not json at all\n')
                return Fault("metrics-garbage", 0.0, job=info.job_id, detail=f.name)
        return None


def _primary_of(info) -> str | None:
    """An extension job's primary (its comment: ``hpcsched.protocol.extensions``)."""
    from hpcsched.protocol.extensions import parse_extension_comment

    tag = parse_extension_comment(info.comment)
    return tag[0] if tag else None


# ------------------------------------------------------------------ the jobs' records

def read_records(job_dir: Path) -> tuple[list[dict], int]:
    """A job's step records and the number of lines that are no record (injected garbage)."""
    recs, junk = [], 0
    for f in sorted((job_dir / "metrics").glob("launch-*-rank-*.jsonl")):
        for line in f.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                junk += 1
                continue
            if isinstance(rec, dict) and "step" in rec and "indices" in rec:
                recs.append(rec)
            else:
                junk += 1
    return recs, junk


def history(recs: list[dict]) -> tuple[list[dict], list[dict]]:
    """``(kept, redone)``: the job's history, launch by launch, where a launch that starts at
    step S (from a checkpoint, or from the start) replaces every earlier record of a step >= S
    (work redone, whether or not the later launch reached that step again), and the records it
    replaced."""
    by_launch: dict[int, list[dict]] = defaultdict(list)
    for r in recs:
        by_launch[r["launch"]].append(r)
    kept: list[dict] = []
    redone: list[dict] = []
    for launch in sorted(by_launch):
        first = min(r["step"] for r in by_launch[launch])
        redone += [r for r in kept if r["step"] >= first]
        kept = [r for r in kept if r["step"] < first] + by_launch[launch]
    return kept, redone


def exactly_once(kept: list[dict], seed: int, size: int) -> str | None:
    """None when the kept history trains every sample of every epoch of a data set of ``size``
    samples exactly once (the last epoch may end early: an emulated job ends on its work, not on
    an epoch), else what is wrong."""
    from hpcsched.job.data import epoch_permutation

    steps: dict[int, tuple] = {}
    for r in kept:
        key = (r["epoch"], r["position"], r["consumed"])
        if steps.setdefault(r["step"], key) != key:
            return f"step {r['step']}: ranks disagree on its range"
    if sorted(steps) != list(range(len(steps))):
        return f"steps missing: {sorted(set(range(max(steps) + 1)) - set(steps))[:5]}"
    by_epoch: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for epoch, pos, n in steps.values():
        by_epoch[epoch].append((pos, n))
    if sorted(by_epoch) != list(range(len(by_epoch))):
        return f"epochs seen: {sorted(by_epoch)}"
    ends = {}
    for e, ranges in by_epoch.items():
        at = 0
        for pos, n in sorted(ranges):
            if pos != at:
                return f"epoch {e}: positions {at}..{pos} skipped or repeated"
            at = pos + n
        ends[e] = at
    short = [e for e, at in ends.items() if at != size and e != max(ends)]
    if short or ends[max(ends)] > size:
        return f"epochs {short or [max(ends)]} do not end at {size}"
    seen: dict[int, set] = defaultdict(set)
    for r in kept:
        epoch, pos, n = steps[r["step"]]
        allowed = set(epoch_permutation(size, epoch, seed)[pos:pos + n].tolist())
        idx = set(r["indices"])
        if not idx <= allowed:
            return f"step {r['step']}: rank {r['rank']} trained samples outside its range"
        if idx & seen[r["step"]]:
            return f"step {r['step']}: a sample on two ranks"
        seen[r["step"]] |= idx
    return None


def restarts_lost(redone: list[dict], kept: list[dict]) -> list[tuple[float, float]]:
    """``[(restart time (Unix s), seconds redone)]``: per launch that replaced earlier steps, the
    step times of the records it replaced (one rank's: every rank's record of a step has its
    time), at the start of that launch's first step."""
    starts: dict[int, tuple[int, float]] = {}
    for r in kept:
        at = (r["step"], r["t"] - r["step_time"])
        starts[r["launch"]] = min(starts.get(r["launch"], at), at)
    replaced: dict[int, dict[int, float]] = defaultdict(dict)
    for r in redone:   # replaced by the first later launch that starts at or before its step
        by = min(L for L, (first, _) in starts.items() if L > r["launch"] and first <= r["step"])
        replaced[by][r["step"]] = r["step_time"]
    return [(starts[L][1], sum(steps.values())) for L, steps in sorted(replaced.items())]


# ------------------------------------------------------------------ the checks

def journal_twice(store, job_ids) -> list[str]:
    """Actions of the daemon's journal applied twice: two actions of one job for one generation
    that did not fail (a failed action's generation is handed out again), or an action that
    entered a phase twice."""
    bad = []
    for job in job_ids:
        acts = store.actions(job, limit=10_000)
        gens = Counter(a.generation for a in acts if a.phase != "failed")
        bad += [f"job {job}: {n} actions for generation {g}" for g, n in gens.items() if n > 1]
        for a in acts:
            phases = [p for p, _ in a.history]
            twice = [p for p, n in Counter(phases).items() if n > 1]
            if twice:
                bad.append(f"job {job}: action {a.id} ({a.kind}) entered {twice} twice")
    return bad


def leftovers() -> dict:
    """Jobs left held and extension jobs left active once every workload job has ended."""
    from hpcsched import slurm

    infos = slurm.squeue()
    return {"held": sorted(j for j, i in infos.items() if i.state == "PENDING" and "Held" in i.state_reason),
            "extensions": sorted(j for j, i in infos.items() if i.active and i.name.endswith("+ext"))}


def attribute(job: str, at: float, faults: list[Fault], start: float) -> Fault | None:
    """The fault a restart of ``job`` at ``at`` (Unix s) follows: the latest before it that hit
    the job, else the latest that hit the cluster; never one that cannot make a job redo work
    (:data:`HARMLESS_TO_WORK`)."""
    before = [f for f in faults if start + f.at <= at + 1.0 and f.kind not in HARMLESS_TO_WORK]
    own = [f for f in before if f.job == job]
    if own:
        return own[-1]
    cluster = [f for f in before if f.kind in CLUSTER_KINDS]
    return cluster[-1] if cluster else None


def check_jobs(tracked, control_dir: Path, faults: list[Fault], start: float, node_mtbf: float,
               scale: float) -> dict:
    """Per job: ended state, exactly once, junk lines, restarts with their lost seconds."""
    from hpcsched.job.checkpoint import ASSUMED_COST_S, young_daly_interval
    from hpcsched.protocol.jobdir import JobDir, JobNotFound
    from hpcsched.sim.emulate import Emulation

    jobs, lost = {}, []
    for t in tracked:
        row = {"name": t.planned.name, "state": t.state}
        try:
            recs, junk = read_records(JobDir.for_job(t.job_id, control_dir).path)
        except (JobNotFound, TypeError):
            row["problem"] = "no job directory"
            jobs[t.job_id or t.planned.name] = row
            continue
        kept, redone = history(recs)
        emu = Emulation.of(t.planned.application, scale)
        size = emu.dataset_size(emu.base_batch_size)   # emulated.py's, without --batch-size
        row.update(steps=len({r["step"] for r in kept}), junk_lines=junk,
                   exactly_once=exactly_once(kept, t.planned.seed, size) if kept else "no records")
        step = max((r["step_time"] for r in kept), default=0.0)
        bound = young_daly_interval(ASSUMED_COST_S, node_mtbf / max(1, t.planned.nodes)) + step
        for at, seconds in restarts_lost(redone, kept):
            f = attribute(t.job_id, at, faults, start)
            lost.append({"job": t.job_id, "at": round(at - start, 1), "seconds": round(seconds, 1),
                         "fault": f.kind if f else "none", "fault_at": f.at if f else None,
                         "bound": round(bound, 1), "within": seconds <= bound})
        jobs[t.job_id] = row
    return {"jobs": jobs, "lost": lost}


def by_kind(faults: list[Fault], lost: list[dict]) -> dict:
    out = {k: {"faults": 0, "restarts": 0, "lost_s": 0.0, "max_lost_s": 0.0} for k in (*KINDS, "none")}
    for f in faults:
        out[f.kind]["faults"] += 1
    for row in lost:
        k = out[row["fault"]]
        k["restarts"] += 1
        k["lost_s"] = round(k["lost_s"] + row["seconds"], 1)
        k["max_lost_s"] = max(k["max_lost_s"], row["seconds"])
    return out


def verdicts(doc: dict, want_faults: int) -> list[tuple[str, bool, str]]:
    jobs = doc["jobs"].values()
    not_done = [j for j, r in doc["jobs"].items() if r["state"] != "COMPLETED"]
    twice = [f"{j}: {r.get('exactly_once') or r.get('problem')}" for j, r in doc["jobs"].items()
             if r.get("exactly_once") or r.get("problem")]
    over = [r for r in doc["lost"] if not r["within"]]
    return [
        ("faults applied", len(doc["faults"]) >= want_faults, f"{len(doc['faults'])} (>= {want_faults})"),
        ("every job finished", not not_done, f"{len(jobs) - len(not_done)}/{len(jobs)} COMPLETED"
                                              + (f"; not: {not_done}" if not_done else "")),
        ("every sample exactly once", not twice, "all jobs" if not twice else "; ".join(twice[:4])),
        ("no job left held", not doc["left"]["held"], str(doc["left"]["held"] or "none")),
        ("no orphan extension", not doc["left"]["extensions"], str(doc["left"]["extensions"] or "none")),
        ("no action applied twice", not doc["journal"], "; ".join(doc["journal"][:4]) or "none"),
        ("work lost <= one checkpoint interval", not over,
         f"{len(doc['lost'])} restarts, max {max((r['seconds'] for r in doc['lost']), default=0):.0f} s"
         + (f"; over: {over[:3]}" if over else "")),
    ]


# ------------------------------------------------------------------ the run

def _config(out: Path, interval: float) -> Path:
    cfg = out / "hpcsched.toml"
    cfg.write_text(f'[daemon]\nround_interval = {interval}\nlock_file = "{out}/daemon.lock"\n'
                   f'database_url = "sqlite:///{out}/hpcsched.db"\n')
    return cfg


def _plan(args, out: Path):
    from testbed import choose_scale

    from hpcsched.replay.plan import make_plan
    from hpcsched.replay.slurmread import read_cluster_shape

    shape = read_cluster_shape(None)
    jobs = sample_workload(args.workload, args.offset, shape.nodes * shape.gpus_per_node)[:args.jobs]
    scale, _ = choose_scale(jobs, shape.nodes, shape.gpus_per_node, args.minutes)
    plan = make_plan(jobs, shape, scale, script=str(ROOT / "jobscripts/examples/emulated.py"),
                     seed=args.seed * 1000, output_dir=str(out / "output"), granularity="gpu")
    for i, pj in enumerate(plan):
        at = pj.argv.index("--hpcsched-batch-size")
        plan[i] = dataclasses.replace(pj, argv=(*pj.argv[:at], "--hpcsched-record-samples",
                                                *pj.argv[at:]))
    return plan, scale


def run(args) -> dict:
    from hpcsched.daemon.store import Store
    from hpcsched.replay.submit import find_hpcsub
    from hpcsched.replay.watch import Replay
    from hpcsched.slurm import devcluster
    from hpcsched.slurm.devcluster.base import Layout, instance_ports

    out = (args.out / f"seed-{args.seed}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "output").mkdir(exist_ok=True)
    ports = instance_ports(args.instance)
    state = devcluster.default_state_dir()
    if args.instance:
        state = Path(f"{state}-chaos{args.instance}")
    was_up = devcluster.is_up(state)
    os.environ["SLURM_CONF"] = str(devcluster.up(state, ports=ports))
    control = out / "jobs"
    os.environ.update(HPCSCHED_CONTROL_DIR=str(control), HPCSCHED_CONFIG=str(_config(out, args.interval)),
                      HPCSCHED_NODE_MTBF=f"{args.node_mtbf:g}")
    plan, scale = _plan(args, out)
    procs = Processes(out, Layout(state), ports)
    procs.start_daemon()
    replay = Replay(plan, find_hpcsub(), cwd=str(out), poll_interval=5.0, max_outage=600.0)
    limits = {}

    def tracked_ids():
        for t in replay.tracked:
            if t.job_id and t.job_id not in limits:
                limits[t.job_id] = t.planned.time_limit
        return [t.job_id for t in replay.tracked if t.job_id and not t.done]

    started = time.time()
    # the daemon finishes the workload in about 0.6 x the static run: the faults fit inside it
    inj = Injector(procs, tracked_ids, started, args.seed, 0.5 * args.minutes * 60.0 / args.faults,
                   limits, control)
    inj.start()
    try:
        replay.run()
    finally:
        inj.finish()
        time.sleep(15)   # an extension's end after its primary's
        left = leftovers()
        procs.stop_daemon()
        if not was_up and os.environ.get("HPCSCHED_KEEP_DEVCLUSTER") != "1":
            devcluster.down(state)      # a cluster this run started is not left running
    faults = inj.applied
    checked = check_jobs(replay.tracked, control, faults, replay.start, args.node_mtbf, scale)
    store = Store(f"sqlite:///{out}/hpcsched.db")
    doc = {"seed": args.seed, "scale": scale, "jobs_planned": len(plan), "minutes": args.minutes,
           "wall_s": round(time.time() - started), "node_mtbf": args.node_mtbf,
           "faults": [dataclasses.asdict(f) for f in faults], "skipped": dict(inj.skipped),
           "injector_errors": inj.errors, "left": left,
           "journal": journal_twice(store, [t.job_id for t in replay.tracked if t.job_id]),
           **checked, "daemon_starts": procs.starts}
    doc["by_kind"] = by_kind(faults, doc["lost"])
    return doc


def _print(doc: dict, checks) -> None:
    print(f"\nchaos replay, seed {doc['seed']}: {doc['jobs_planned']} jobs, {len(doc['faults'])} faults, "
          f"{doc['wall_s']} s")
    print(f"{'fault':20} {'applied':>7} {'restarts':>8} {'lost s':>8} {'max s':>7}")
    for k, r in doc["by_kind"].items():
        print(f"{k:20} {r['faults']:7d} {r['restarts']:8d} {r['lost_s']:8.1f} {r['max_lost_s']:7.1f}")
    for name, ok, text in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {text}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=24)
    p.add_argument("--workload", type=int, default=3, help="Pollux workload number (1..8)")
    p.add_argument("--offset", type=int, default=3, help="first job of the sample")
    p.add_argument("--minutes", type=float, default=30.0, help="the static run's length (scale)")
    p.add_argument("--faults", type=int, default=64,
                   help="the fault rate: this many over half the static run's length")
    p.add_argument("--min-faults", type=int, default=30, help="a run must apply at least this many")
    p.add_argument("--judge", type=Path, default=None, metavar="CHAOS_JSON",
                   help="judge a finished run's chaos.json again; run nothing")
    p.add_argument("--interval", type=float, default=5.0, help="daemon round (s)")
    p.add_argument("--node-mtbf", type=float, default=1800.0,
                   help="the jobs' node MTBF (s; $HPCSCHED_NODE_MTBF): their checkpoint interval")
    p.add_argument("--instance", type=int, default=0,
                   help="dev-cluster instance (0: the default cluster)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "chaos")
    args = p.parse_args()
    if args.judge:
        doc = json.loads(args.judge.read_text())
        checks = verdicts(doc, args.min_faults)
        _print(doc, checks)
        sys.exit(0 if all(ok for _, ok, _ in checks) else 1)
    if os.geteuid() != 0:
        sys.exit("chaos.py runs the dev cluster's daemons: run it as root")
    doc = run(args)
    checks = verdicts(doc, args.min_faults)
    doc["checks"] = [{"check": n, "pass": ok, "detail": t} for n, ok, t in checks]
    path = args.out / f"seed-{args.seed}" / "chaos.json"
    write_report(path, "chaos", **doc)
    _print(doc, checks)
    print(f"written: {path}")
    sys.exit(0 if all(ok for _, ok, _ in checks) else 1)


if __name__ == "__main__":
    main()
