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
"""

from __future__ import annotations

import json
import logging
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Iterable

log = logging.getLogger("hpcsched.daemon.ingest")

WARMUP_STEPS = 2


def aggregate(records: Iterable[dict], job_id: str, app_class: str = "") -> tuple[list[dict], list[dict]]:
    """(profile sample rows, GPU measurement rows) from step records of one job.

    ``records`` are the metrics lines (any order, any ranks); those without ``step`` and
    ``rank`` are ignored. Rows are dicts with the store's column names
    (:meth:`hpcsched.daemon.store.Store.add_profile_samples`, ``add_gpu_measurements``); see the
    module docstring for what they hold.
    """
    recs = [r for r in records if isinstance(r, dict) and "step" in r and "rank" in r]
    return _profile_rows(recs, job_id), _gpu_rows(recs, job_id, app_class)


def _profile_rows(recs: list[dict], job_id: str) -> list[dict]:
    """One row per configuration of rank 0's steps: mean step time (s) and throughput
    (samples/s) over the steps after the first :data:`WARMUP_STEPS`, with a positive step time."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in sorted(recs, key=lambda r: (r.get("launch", 0), r["step"])):
        if r["rank"] != 0:
            continue
        key = (r.get("launch", 0), r.get("generation", 0), r["world_size"], r.get("nodes", 1),
               r["local_batch_size"], r.get("accumulation_steps", 1))
        groups[key].append(r)
    profile = []
    for (launch, gen, world, nodes, local, accum), rs in groups.items():
        rs = [r for r in rs[WARMUP_STEPS:] if r.get("step_time", 0) > 0]
        if not rs:
            continue
        total_t = sum(r["step_time"] for r in rs)
        samples = sum(r.get("global_samples", r.get("global_batch_size", 0)) for r in rs)
        profile.append({
            "job_id": job_id, "time": max(r.get("t", 0.0) for r in rs), "launch": launch,
            "generation": gen, "world_size": world, "nodes": nodes, "local_batch_size": local,
            "accumulation_steps": accum, "global_batch_size": rs[-1].get("global_batch_size", 0),
            "step_time": total_t / len(rs), "throughput": samples / total_t, "steps": len(rs),
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


def read_new_lines(path: Path, offset: int) -> tuple[list[dict], int, int]:
    """Complete JSON lines of ``path`` after byte ``offset``: (records, new offset, bad lines)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset, 0
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset, 0
    out, bad = [], 0
    for line in data[: end + 1].splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            bad += 1
    return out, offset + end + 1, bad


def ingest_job(store, job_id: str, job_dir: Path, app_class: str = "") -> tuple[int, int]:
    """Read a job's new metrics into ``store``; returns (profile rows, GPU rows) added."""
    records = []
    advanced: list[tuple[str, int]] = []
    for f in sorted((Path(job_dir) / "metrics").glob("launch-*-rank-*.jsonl")):
        off = store.ingest_offset(str(f))
        recs, new_off, bad = read_new_lines(f, off)
        if bad:
            log.warning("%s: skipped %d malformed line(s)", f, bad)
        if new_off != off:
            advanced.append((str(f), new_off))
        records.extend(recs)
    profile, gpus = aggregate(records, job_id, app_class)
    n_p = store.add_profile_samples(profile) if profile else 0
    n_g = store.add_gpu_measurements(gpus) if gpus else 0
    for path, off in advanced:  # after the rows are stored: a crash re-reads, never skips
        store.set_ingest_offset(path, off)
    return n_p, n_g
