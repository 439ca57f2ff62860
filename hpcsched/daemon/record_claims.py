"""Claims of a job's metrics records, checked before they count (:mod:`hpcsched.daemon.ingest`).

The metrics files are written by the job's user: each step record is a claim. A record is
rejected when it cannot be true on its own (:func:`claim_problem`: a field missing or of the
wrong kind, a negative duration, a world size its own fields contradict, a time in the future)
or against the others of its file (:func:`sequence_problems`: steps going backwards, a claimed
throughput the records' own clock does not allow). :func:`credible` keeps the rest and logs
what it dropped, naming the job and the file.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import defaultdict

log = logging.getLogger("hpcsched.daemon.ingest")   # ingest's warnings, under its name as before

#: a claimed throughput may exceed what the records' own clock allows (global batch size / the
#: median time per step between consecutive records) by at most this factor (the time between
#: steps also holds the step boundary and metrics writing: the clock's figure is an underestimate)
THROUGHPUT_SLACK = 10.0
#: seconds a record's time may lie ahead of the daemon's clock (clock skew between nodes)
CLOCK_SKEW = 300.0

_COUNTS = {  # field: (required, minimum) of the integer fields ingest.aggregate reads
    "step": (True, 0), "rank": (True, 0), "world_size": (True, 1), "local_batch_size": (True, 1),
    "launch": (False, 0), "generation": (False, 0), "nodes": (False, 1),
    "accumulation_steps": (False, 1), "global_batch_size": (False, 1), "global_samples": (False, 0),
}


_ABSENT = object()


def _is_int(v) -> bool:
    """An integer the store's columns hold (32-bit, as PostgreSQL's INTEGER)."""
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**31


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and abs(v) < 1e15)


def claim_problem(r: dict, now: float | None = None) -> str | None:
    """Why the step record ``r`` cannot be true, or None if it can be.

    A record is rejected when:

    * a field :func:`hpcsched.daemon.ingest.aggregate` reads is missing or not a number of its kind (counts: integers
      within their range; ``t``, ``step_time``, ``compute_time``: finite numbers), or ``device``
      is not an object of short strings and integers;
    * ``step_time`` < 0 or ``compute_time`` < 0 (seconds);
    * its world size does not match its own fields: ``rank`` >= ``world_size``, ``nodes`` >
      ``world_size``, ``global_batch_size`` != ``world_size`` x ``local_batch_size`` x
      ``accumulation_steps`` (:mod:`hpcsched.protocol.batching`), or ``global_samples`` (the
      step's samples, all ranks) > ``global_batch_size``;
    * its time ``t`` lies more than :data:`CLOCK_SKEW` seconds after ``now`` (the daemon's clock).

    Checks across records (steps going backwards, throughput against the records' clock) are in
    :func:`sequence_problems`.
    """
    if not isinstance(r, dict):
        return f"not an object ({type(r).__name__})"
    return _count_problem(r) or _time_problem(r) or _world_problem(r) \
        or _device_problem(r.get("device")) or (
        f"time {r['t']} is in the future" if r["t"] > (now or time.time()) + CLOCK_SKEW else None)


def _count_problem(r: dict) -> str | None:
    """Why one of record ``r``'s counts (:data:`_COUNTS`: required, or optional when absent)
    is not an integer the store holds at or above its minimum; None if none."""
    for name, (required, minimum) in _COUNTS.items():
        v = r.get(name, _ABSENT)
        if v is _ABSENT:
            if not required:
                continue
            v = None
        if type(v) is int and minimum <= v < 2**31:   # the common case, as _is_int (minimum >= 0)
            continue
        if not _is_int(v) or v < minimum:
            return f"{name} {v!r:.40} is not an integer >= {minimum}"
    return None


def _time_problem(r: dict) -> str | None:
    """Why record ``r``'s ``t``, ``step_time`` or (optional) ``compute_time`` is not a finite
    number, or a duration (seconds) is negative; None if none."""
    for name in ("t", "step_time"):
        if not _is_number(r.get(name)):
            return f"{name} {r.get(name)!r:.40} is not a finite number"
    if r.get("compute_time") is not None and not _is_number(r["compute_time"]):
        return f"compute_time {r['compute_time']!r:.40} is not a finite number"
    if r["step_time"] < 0:
        return f"negative step_time {r['step_time']}"
    if r.get("compute_time") is not None and r["compute_time"] < 0:
        return f"negative compute_time {r['compute_time']}"
    return None


def _world_problem(r: dict) -> str | None:
    world, local = r["world_size"], r["local_batch_size"]
    accum, nodes = r.get("accumulation_steps", 1), r.get("nodes", 1)
    gbs = r.get("global_batch_size", world * local * accum)
    if r["rank"] >= world or nodes > world:
        return f"rank {r['rank']} / nodes {nodes} do not fit world_size {world}"
    if gbs != world * local * accum:
        return (f"global_batch_size {gbs} != world_size {world} x local_batch_size {local} x "
                f"accumulation_steps {accum}")
    if r.get("global_samples", 0) > gbs:
        return f"global_samples {r['global_samples']} > global_batch_size {gbs}"
    return None


_DEVICE_STR = {"node": 128, "gpu_index": 32, "gpu_uuid": 64}  # the store's column widths


def _device_problem(d) -> str | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        return "device is not an object"
    for k, v in d.items():
        ok = v is None or (isinstance(v, str) and len(v) <= _DEVICE_STR.get(k, 64)) or _is_int(v)
        if not ok or (k == "local_rank" and not _is_int(v)):
            return f"device field {k!r:.40} is {v!r:.40}"
    return None


def sequence_problems(records: list[dict]) -> list[tuple[int, str]]:
    """(index, why) of the records of one metrics file (one rank, in the order written) that
    contradict the others:

    * **steps going backwards**: within a launch, a step number not above the one before, or a
      time ``t`` before the one before (the file is append-only and a rank's steps are
      sequential);
    * **impossible throughput**: per (launch, generation), the step times must account for the
      time that passed between consecutive steps by the records' own clock: a claimed
      throughput (global batch size / median ``step_time``) above :data:`THROUGHPUT_SLACK` x
      what the clock allows (global batch size / median time per step between consecutive
      records' ``t``)
      means steps claimed to take far less time than they did. Medians, so that a rare pause
      between steps (a checkpoint) does not count. Every record of such a group is rejected.
    """
    bad: dict[int, str] = {}
    last: dict = {}
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        launch = r.get("launch", 0)
        prev = last.get(launch)
        if prev is not None and (r["step"] <= prev["step"] or r["t"] < prev["t"]):
            bad[i] = f"step {r['step']} at t={r['t']} after step {prev['step']} at t={prev['t']}"
            continue
        last[launch] = r
        groups[(launch, r.get("generation", 0))].append(i)
    for idx in groups.values():
        rs = [records[i] for i in idx]
        gaps = [(b["t"] - a["t"]) / (b["step"] - a["step"]) for a, b in zip(rs, rs[1:])]
        if len(gaps) < 2:
            continue
        step_time, gap = statistics.median(r["step_time"] for r in rs), statistics.median(gaps)
        if step_time * THROUGHPUT_SLACK < gap:
            gbs = max(r.get("global_batch_size", 0) for r in rs)
            why = (f"throughput {gbs / step_time if step_time else math.inf:.4g} samples/s claimed "
                   f"(median step {step_time:.4g} s) but steps came {gap:.4g} s apart")
            bad.update((i, why) for i in idx)
    return sorted(bad.items())


def credible(records: list, job_id: str, where: str, now: float | None = None) -> list[dict]:
    """The records of one metrics file that pass :func:`claim_problem` and
    :func:`sequence_problems`; the others are logged (one warning per file, naming the job, the
    file, how many and the first reason)."""
    ok, why = [], []
    for r in records:
        problem = claim_problem(r, now)
        (why.append(problem) if problem else ok.append(r))
    seq = sequence_problems(ok)
    if seq:
        drop = {i for i, _ in seq}
        why.extend(w for _, w in seq)
        ok = [r for i, r in enumerate(ok) if i not in drop]
    if why:
        log.warning("job %s: %s: rejected %d impossible record(s), e.g. %s", job_id, where,
                    len(why), why[0])
    return ok
