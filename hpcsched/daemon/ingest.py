"""Ingest the jobs' metrics files (``metrics/launch-<L>-rank-<R>.jsonl``, written by
:mod:`hpcsched.job.elastic`) into profile samples and per-GPU measurements.

Pure aggregation (:func:`aggregate`) is separate from the file reading (:func:`ingest_job`),
which reads each file from where the last pass stopped (byte offsets kept in the store) up to
its last complete line, so a line being written is never half-read and nothing is counted twice.

* **Profile samples**: per (launch, generation, world size, nodes, local batch, accumulation),
  the mean step time over rank 0's steps, and throughput = samples / time. The first
  :data:`WARMUP_STEPS` steps of each configuration in a pass are dropped (lazy initialisation,
  first collective).
* **Per-GPU measurements**: for each step whose records from every rank are in this pass, each
  rank's relative speed = median compute time of the step's ranks / the rank's own compute time
  (>1: faster than the job's median GPU). The compute time is the rank's own work before the
  gradient reduction (all ranks wait for the slowest in the reduction, so whole step times
  cannot tell GPUs apart). Mean over the pass, per device. This is the per-GPU variability
  signal PAL uses (Jain et al., SC'24, §3).

**The files are untrusted**: a job's user writes them. :func:`ingest_job` reads them with
bounds and never raises for what they hold (see :func:`read_new_lines` and the metrics section of
``docs/daemon.md``): a file is opened without following a symbolic link and only if it is a
regular file (:func:`hpcsched.protocol.files.open_regular`); about :data:`FRESH_BYTES` of a
job's newest metrics lines are read per pass, less for a pass soon after the job's last
(:class:`Budgets`; older unread ones are passed over: the daemon's ingest costs the same however
fast the jobs step, and rank 0's passed-over lines still count as the job's steps), lines over
:data:`MAX_LINE_BYTES` are skipped whole, lines that are not UTF-8 or not JSON are skipped, and
the stored offset always moves past what was read, so no line is read twice, garbage included.
The records are then **claims**, checked by :mod:`hpcsched.daemon.record_claims` before they
count; every skipped line or rejected record is a warning naming the job and the file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Container, Iterable, Mapping

from hpcsched.daemon.record_claims import credible
from hpcsched.protocol.files import ProtocolError, open_regular

log = logging.getLogger("hpcsched.daemon.ingest")

WARMUP_STEPS = 2
#: bytes of one job's metrics read in one pass, all its files together (later bytes wait for
#: the next pass; a healthy job writes a few hundred bytes per step and rank)
MAX_ROUND_BYTES = 4 << 20
#: bytes of a job's **newest** lines read in one pass, all its files together (each file at
#: least :data:`MIN_FILE_WINDOW`): where more is unread, the older lines are passed over, never
#: read (a job writing faster than this per round is measured on its latest steps). A healthy
#: rank writes about 450 bytes per step: this is about 35 steps of a 1-GPU job per round. It
#: bounds the daemon's ingest by the number of jobs, not by how fast they step: at 1,000 jobs,
#: every rank writing each of its 20 steps a second, reading every line took 15 us each, 40 s a
#: minute (``benchmarks/daemon_scale.py``, ``docs/daemon.md``, "At scale")
FRESH_BYTES = 16 << 10
MIN_FILE_WINDOW = 2 << 10
#: seconds :data:`FRESH_BYTES` is the budget of (:func:`fresh_budget`): a pass sooner after the
#: job's last one reads in proportion, so that rounds at events, which come every few seconds
#: on a large cluster, do not each read a full window of every job
FRESH_PERIOD = 60.0
#: the longest metrics line read (bytes); a longer one is skipped whole, even across passes
MAX_LINE_BYTES = 64 << 10
#: metrics files read per job and pass (one per launch and rank; more are left for later passes)
MAX_FILES = 1024
#: directory entries of ``metrics/`` looked at per pass (a directory of millions of names costs
#: the daemon no more than this)
MAX_DIR_ENTRIES = 16384

METRICS_NAME = re.compile(r"launch-\d{1,9}(-ext-\d{1,12})?-rank-\d{1,9}\.jsonl")


def aggregate(records: Iterable[dict], job_id: str, app_class: str = "",
              passed_over: Mapping[int, int] | None = None) -> tuple[list[dict], list[dict]]:
    """(profile sample rows, GPU measurement rows) from step records of one job.

    ``records`` are the metrics lines (any order, any ranks); those without ``step`` and
    ``rank`` are ignored. Rows are dicts with the store's column names
    (:meth:`hpcsched.daemon.store.Store.add_profile_samples`, ``add_gpu_measurements``); see the
    module docstring for what they hold. ``passed_over``: launch -> rank 0's steps of that
    launch a pass did not read, just before its first record here (:func:`passed_over_lines`);
    they count in the ``steps`` of that record's configuration (the job ran them: its attained
    service is summed over the rows' steps), not in its means.
    """
    recs = [r for r in records if isinstance(r, dict) and "step" in r and "rank" in r]
    return _profile_rows(recs, job_id, passed_over or {}), _gpu_rows(recs, job_id, app_class)


def _profile_rows(recs: list[dict], job_id: str, passed_over: Mapping[int, int]) -> list[dict]:
    """One row per configuration of rank 0's steps: mean step time (s) and throughput
    (samples/s) over the steps after the first :data:`WARMUP_STEPS`, with a positive step time;
    ``steps`` counts them and, in the configuration of a launch's first record, the steps
    ``passed_over`` before it."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    first: dict[int, tuple] = {}   # launch -> the configuration of its earliest record here
    for r in sorted(recs, key=lambda r: (r.get("launch", 0), r["step"])):
        if r["rank"] != 0:
            continue
        key = (r.get("launch", 0), r.get("generation", 0), r["world_size"], r.get("nodes", 1),
               r["local_batch_size"], r.get("accumulation_steps", 1))
        first.setdefault(key[0], key)
        groups[key].append(r)
    extra = {first[launch]: n for launch, n in passed_over.items() if launch in first and n > 0}
    profile = []
    for key, rs in groups.items():
        launch, gen, world, nodes, local, accum = key
        rs = [r for r in rs[WARMUP_STEPS:] if r.get("step_time", 0) > 0]
        if not rs:
            continue
        total_t = sum(r["step_time"] for r in rs)
        samples = sum(r.get("global_samples", r.get("global_batch_size", 0)) for r in rs)
        profile.append({
            "job_id": job_id, "time": max(r.get("t", 0.0) for r in rs), "launch": launch,
            "generation": gen, "world_size": world, "nodes": nodes, "local_batch_size": local,
            "accumulation_steps": accum, "global_batch_size": rs[-1].get("global_batch_size", 0),
            "step_time": total_t / len(rs), "throughput": samples / total_t,
            "steps": len(rs) + extra.get(key, 0),
        })
    return profile


def _gpu_rows(recs: list[dict], job_id: str, app_class: str) -> list[dict]:
    """One row per device: mean relative speed (median compute time of a step's ranks / the
    rank's own) over the steps whose records from every rank (``world_size`` >= 2) are here."""
    by_step: dict[tuple, list[dict]] = defaultdict(list)
    for r in recs:
        if r.get("compute_time"):
            by_step[(r.get("launch", 0), r["step"])].append(r)
    speeds: dict[tuple, list[float]] = defaultdict(list)
    last_t: dict[tuple, float] = {}
    for rs in by_step.values():
        if len(rs) < 2 or len(rs) != rs[0].get("world_size"):
            continue
        med = statistics.median(r["compute_time"] for r in rs)
        for r in rs:
            key = _device_key(r)
            speeds[key].append(med / r["compute_time"])
            last_t[key] = max(last_t.get(key, 0.0), r.get("t", 0.0))
    return [{"job_id": job_id, "time": last_t[k], "node": k[0], "local_rank": k[1],
             "gpu_index": k[2], "gpu_uuid": k[3], "app_class": app_class,
             "relative_speed": statistics.fmean(v), "steps": len(v)}
            for k, v in speeds.items()]


def _device_key(r: dict) -> tuple:
    """(node, local rank, GPU index, GPU UUID) of a record's device; the rank stands in for the
    local rank of a record without one."""
    d = r.get("device") or {}
    return (d.get("node", "?"), int(d.get("local_rank", r["rank"])), d.get("gpu_index"),
            d.get("gpu_uuid"))


def read_new_lines(path: Path, offset: int, limit: int = MAX_ROUND_BYTES, *,
                   dir_fd: int | None = None) -> tuple[list, int, int]:
    """Complete JSON lines of ``path`` after byte ``offset``: (values, new offset, lines skipped).

    Reads at most ``limit`` bytes (at least one whole line of :data:`MAX_LINE_BYTES`). A line
    longer than :data:`MAX_LINE_BYTES` is skipped whole: read up to the budget, the rest skipped
    in later passes (an offset not preceded by a newline is inside such a line). A line that is
    not UTF-8 or not JSON (or nested too deep, or with an integer too long) is skipped. A last line
    without its newline is left for the next pass, unless it is already too long. Blank lines are
    not counted. A missing file reads as nothing; ``dir_fd`` as :func:`os.open`.

    Raises:
        ProtocolError: ``path`` is a symbolic link or not a regular file, or cannot be read.
    """
    values, new_offset, skipped = _read_lines(path, offset, limit, dir_fd)
    return values, new_offset, sum(skipped.values())


def newest_offset(path, offset: int, window: int, dir_fd: int | None = None) -> int:
    """Where to read ``path`` from so that about ``window`` bytes, its newest lines, are read:
    ``offset`` itself when no more than ``window`` bytes are unread; else the start of the first
    line that begins in the last ``window`` bytes; when none does (a line longer than the window
    ends the file), the start of the newest complete line if it is within :data:`MAX_LINE_BYTES`,
    else the end of the file. A missing or unreadable file: ``offset`` (the read that follows
    reports it).
    """
    try:
        fd = open_regular(path, dir_fd=dir_fd)
    except ProtocolError:
        return offset
    if fd is None:
        return offset
    try:
        size = os.fstat(fd).st_size
        if size - offset <= window:
            return offset
        start = size - window
        chunk = os.pread(fd, window + 1, start - 1)   # with the byte before the window
        nl = chunk.find(b"\n")
        if 0 <= nl < len(chunk) - 1:
            return start + nl
        start = max(offset, size - MAX_LINE_BYTES - 2)
        tail = os.pread(fd, size - start, start)
        end = tail.rfind(b"\n")
        before = tail.rfind(b"\n", 0, max(end, 0))
        if end < 0 or (before < 0 and start > offset):
            return size
        return start + before + 1
    except OSError:
        return offset
    finally:
        os.close(fd)


def _read_lines(path, offset: int, limit: int, dir_fd: int | None) -> tuple[list, int, Counter]:
    """:func:`read_new_lines` with the skipped lines counted by reason."""
    skipped: Counter = Counter()
    fd = open_regular(path, dir_fd=dir_fd)
    if fd is None:
        return [], offset, skipped
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, max(0, min(max(limit, MAX_LINE_BYTES + 1), size - offset)), offset)
        inside_long_line = offset > 0 and os.pread(fd, 1, offset - 1) not in (b"\n", b"")
    except OSError as exc:
        raise ProtocolError(f"{path}: cannot read: {exc.strerror}") from exc
    finally:
        os.close(fd)
    pos = 0
    if inside_long_line:  # the rest of a line skipped as too long
        nl = data.find(b"\n")
        if nl < 0:
            return [], offset + len(data), skipped
        pos = nl + 1
    values = []
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:  # the last line, maybe being written
            if len(data) - pos > MAX_LINE_BYTES:
                skipped[f"longer than {MAX_LINE_BYTES} bytes"] += 1
                pos = len(data)
            break
        line, pos = data[pos:nl], nl + 1
        if len(line) > MAX_LINE_BYTES:
            skipped[f"longer than {MAX_LINE_BYTES} bytes"] += 1
        elif line.strip():
            try:
                values.append(json.loads(line.decode("utf-8")))
            except UnicodeDecodeError:
                skipped["not UTF-8"] += 1
            except (ValueError, RecursionError):
                skipped["not JSON"] += 1
    return values, offset + pos, skipped


# -- reading a job's metrics -------------------------------------------------------------------


def _open_metrics_dir(job_id: str, metrics: Path) -> int | None:
    """A descriptor of ``metrics/``, opened without following a symbolic link; None when there
    is none or it cannot be used (logged)."""
    try:
        return os.open(metrics, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("job %s: %s: not read: %s (a symbolic link or not a directory?)", job_id,
                    metrics, exc.strerror)
        return None


def _metrics_files(job_id: str, metrics: Path) -> list[str]:
    """Names of the metrics files in ``metrics/`` (:func:`_open_metrics_dir`), at most
    :data:`MAX_FILES`, sorted; [] when there is none or it cannot be used (logged)."""
    dfd = _open_metrics_dir(job_id, metrics)
    if dfd is None:
        return []
    names = []
    try:
        with os.scandir(dfd) as it:
            for n, entry in enumerate(it):
                if n >= MAX_DIR_ENTRIES:
                    log.warning("job %s: %s: more than %d entries; the rest not looked at",
                                job_id, metrics, MAX_DIR_ENTRIES)
                    break
                if METRICS_NAME.fullmatch(entry.name):
                    names.append(entry.name)
    except OSError as exc:
        log.warning("job %s: %s: cannot list: %s", job_id, metrics, exc.strerror)
    finally:
        os.close(dfd)
    if len(names) > MAX_FILES:
        log.warning("job %s: %s: %d metrics files; %d read this pass", job_id, metrics,
                    len(names), MAX_FILES)
    return sorted(names)[:MAX_FILES]


def ingest_job(store, job_id: str, job_dir: Path, app_class: str = "",
               sink: Pending | None = None) -> tuple[int, int]:
    """Read a job's new metrics into ``store`` (or, given ``sink``, into it, for the caller to
    write: :meth:`Pending.flush`); returns (profile rows, GPU rows) found.

    Never raises for what the job's files hold (the store's own errors propagate): every problem
    is a warning naming the job and the file, and the job's offsets still move past what was
    read. About :data:`FRESH_BYTES` of the newest lines are read in all, shared among the
    files (:func:`newest_offset`); older unread lines are passed over (logged at debug level).
    """
    rows = sink if sink is not None else Pending()
    found = ingest_jobs(store, [(job_id, Path(job_dir), app_class)], rows)[job_id]
    if sink is None:
        rows.flush(store)
    return found


def passed_over_lines(passed: int, read: int, lines: int) -> int:
    """How many lines ``passed`` bytes that a pass did not read hold, estimated from the
    ``lines`` lines in the ``read`` bytes after them (a rank's lines have the same fields, so
    about the same length: a few digits apart); 0 when nothing was read to go by."""
    if passed <= 0 or read <= 0 or lines <= 0:
        return 0
    return round(passed * lines / read)


def fresh_budget(since: float | None, period: float = FRESH_PERIOD) -> int:
    """Bytes of a job's newest lines to read in a pass ``since`` seconds after its last one
    (None: it has had none): :data:`FRESH_BYTES` once ``period`` seconds or more have passed,
    that share of it sooner (at least :data:`MIN_FILE_WINDOW`). So a job's ingest costs about
    :data:`FRESH_BYTES` per ``period`` however often rounds come."""
    if since is None or since >= period:
        return FRESH_BYTES
    return max(MIN_FILE_WINDOW, int(FRESH_BYTES * max(0.0, since) / period))


class Budgets:
    """Each job's budget for a pass (:func:`fresh_budget`) from the time since its last one,
    for a caller that passes over the same jobs again and again (the daemon's rounds): the
    full window for a job it has not read yet or that ended (its last pass), in proportion
    otherwise. ``period``: seconds the full window is the budget of (the daemon's
    ``round_interval``); ``clock``: seconds, monotonic."""

    def __init__(self, period: float = FRESH_PERIOD, clock: Callable[[], float] = time.monotonic):
        self.period, self._clock = period, clock
        self._last: dict[str, float] = {}   # job id -> its last pass

    def take(self, job_ids: Iterable[str], ended: Container[str] = ()) -> dict[str, int]:
        """Bytes of each of ``job_ids``' newest lines to read now (the jobs in ``ended``: the
        full window), each taken as read now."""
        now, out = self._clock(), {}
        for job_id in job_ids:
            last = None if job_id in ended else self._last.get(job_id)
            out[job_id] = fresh_budget(None if last is None else now - last, self.period)
            self._last[job_id] = now
        return out

    def keep(self, job_ids: Container[str]) -> None:
        """Forget every job but ``job_ids`` (those Slurm still lists): nothing is kept forever."""
        self._last = {j: t for j, t in self._last.items() if j in job_ids}

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._last


def ingest_jobs(store, jobs: Iterable[tuple[str, Path, str]], sink: Pending,
                budgets: Mapping[str, int] | None = None) -> dict[str, tuple[int, int]]:
    """:func:`ingest_job` of each (Slurm job id, job directory, application class) into
    ``sink``, with the stored offsets of all their files read in one query (a round of a
    thousand jobs asked the store a thousand times); per job id, (profile rows, GPU rows)
    found. ``budgets``: job id -> bytes of its newest lines read in all (:func:`fresh_budget`;
    :data:`FRESH_BYTES` for a job it lacks)."""
    listed = [(job_id, Path(job_dir) / "metrics", app) for job_id, job_dir, app in jobs]
    names = {job_id: _metrics_files(job_id, metrics) for job_id, metrics, _ in listed}
    offsets = store.ingest_offsets([str(metrics / n) for job_id, metrics, _ in listed
                                    for n in names[job_id]])
    now, budgets = time.time(), budgets or {}
    return {job_id: _ingest_files(job_id, metrics, names[job_id], offsets, app, sink, now,
                                  budgets.get(job_id, FRESH_BYTES))
            if names[job_id] else (0, 0) for job_id, metrics, app in listed}


def _ingest_files(job_id: str, metrics: Path, names: list[str], offsets: dict[str, int],
                  app_class: str, sink: Pending, now: float, budget: int) -> tuple[int, int]:
    """One job's part of :func:`ingest_jobs`: its files ``names`` in ``metrics/`` read from
    ``offsets`` (keyed by path) into ``sink``, about ``budget`` bytes of their newest lines in
    all (each file at least :data:`MIN_FILE_WINDOW`); rank 0's lines passed over count as
    steps (:func:`passed_over_lines`, :func:`aggregate`)."""
    dfd = _open_metrics_dir(job_id, metrics)
    if dfd is None:
        return 0, 0
    records, passed = [], Counter()
    share = max(MIN_FILE_WINDOW, budget // max(1, len(names)))
    try:
        for name in names:
            key = str(metrics / name)  # the store's key: the file's path, as before
            off = offsets[key]
            start = newest_offset(name, off, share, dfd)
            if start != off:
                log.debug("job %s: %s: %d bytes of older steps passed over", job_id, key, start - off)
            try:
                values, new_off, skipped = _read_lines(name, start, share, dfd)
            except ProtocolError as exc:
                log.warning("job %s: %s", job_id, str(exc).replace(name, key, 1))
                continue
            if skipped:
                log.warning("job %s: %s: skipped %d line(s): %s", job_id, key, sum(skipped.values()),
                            ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())))
            if new_off != off:
                sink.offsets[key] = new_off
            ok = credible(values, job_id, key, now)
            if start > off and ok and ok[0]["rank"] == 0:
                passed[ok[0].get("launch", 0)] += passed_over_lines(
                    start - off, new_off - start, len(values) + sum(skipped.values()))
            records.extend(ok)
    finally:
        os.close(dfd)
    profile, gpus = aggregate(records, job_id, app_class, passed)
    sink.profile += profile
    sink.gpus += gpus
    return len(profile), len(gpus)


@dataclass
class Pending:
    """What ingest passes found, to be written to the store together (:meth:`flush`): a round
    ingests every job into one ``Pending`` and writes it with three statements, where writing
    job by job cost several per job."""

    profile: list[dict] = field(default_factory=list)
    gpus: list[dict] = field(default_factory=list)
    offsets: dict[str, int] = field(default_factory=dict)

    def flush(self, store) -> None:
        """Write the rows, then the offsets (in the caller's transaction, if any: a crash in
        between re-reads, never skips); empty afterwards."""
        if self.profile:
            store.add_profile_samples(self.profile)
        if self.gpus:
            store.add_gpu_measurements(self.gpus)
        store.set_ingest_offsets(self.offsets)
        self.profile, self.gpus, self.offsets = [], [], {}
