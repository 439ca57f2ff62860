#!/usr/bin/env python3
"""Benchmark: what decoding one ``squeue --json`` costs the daemon, in time and Python memory, as
jobs pile up, with each job's unread fields dropped while decoding (``parse._slim_job``, the
daemon's way) and without (plain ``json.loads``).

The document is a recorded one (``tests/data/slurm/VERSION/squeue.busy.json``: Slurm 22.05,
24.11 or 26.05 from the dev clusters) with its first job repeated ``--jobs`` times under new ids,
so its size per job is a real job's. For each way it reports the median wall time of
``--repeats`` decodes (seconds) and, from one decode under ``tracemalloc``, the peak of Python
memory while decoding and what the decoded document holds (MiB); then the time of the whole
``parse.parse_squeue_json`` (decode and ``JobInfo``s). Needs no Slurm. Prints a table and writes
JSON (``--out``, default ``bench-results/squeue_parse.json``)::

    .venv/bin/python benchmarks/squeue_parse.py [--jobs 1000,3000] [--versions 22.05,24.11,26.05]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402

from hpcsched.slurm import parse  # noqa: E402

RECORDED = ROOT / "tests" / "data" / "slurm"


def document(version: str, jobs: int) -> str:
    """The recorded ``squeue --json`` of ``version`` with its first job repeated ``jobs`` times."""
    doc = json.loads((RECORDED / version / "squeue.busy.json").read_text())
    first = doc["jobs"][0]
    doc["jobs"] = [dict(copy.deepcopy(first), job_id=1_000_000 + k) for k in range(jobs)]
    return json.dumps(doc)


def measure(text: str, hook, repeats: int) -> dict:
    """Median decode seconds over ``repeats``, and one traced decode's peak and held MiB."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        json.loads(text, object_pairs_hook=hook)
        times.append(time.perf_counter() - t)
    tracemalloc.start()
    try:
        doc = json.loads(text, object_pairs_hook=hook)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del doc
    return {"seconds": statistics.median(times), "peak_mib": peak / 2**20, "held_mib": held / 2**20}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="1000,3000", help="jobs per document, comma-separated")
    recorded = ", ".join(sorted(p.name for p in RECORDED.iterdir() if p.is_dir()))
    ap.add_argument("--versions", default="22.05,24.11,26.05",
                    help=f"recorded Slurm versions, comma-separated ({recorded})")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "squeue_parse.json")
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.jobs.split(",")]
        versions = [v.strip() for v in args.versions.split(",") if v.strip()]
        missing = [v for v in versions if not (RECORDED / v / "squeue.busy.json").is_file()]
        if missing or not sizes or min(sizes) < 1 or args.repeats < 1:
            raise ValueError(f"no recorded squeue --json for {', '.join(missing)}" if missing
                             else "--jobs and --repeats must be positive")
    except ValueError as exc:
        ap.error(str(exc))
    rows = []
    print(f"{'version':>7} {'jobs':>5} {'MiB':>5} | {'plain s':>7} {'peak':>6} {'held':>6} | "
          f"{'slim s':>6} {'peak':>6} {'held':>6} | parse_squeue_json s")
    for version in versions:
        for n in sizes:
            text = document(version, n)
            plain, slim = measure(text, None, args.repeats), measure(text, parse._slim_job, args.repeats)
            t = time.perf_counter()
            parse.parse_squeue_json(text)
            whole = time.perf_counter() - t
            rows.append({"version": version, "jobs": n, "json_mib": len(text) / 2**20,
                         "plain": plain, "slim": slim, "parse_squeue_json_seconds": whole})
            print(f"{version:>7} {n:>5} {len(text) / 2**20:>5.1f} | {plain['seconds']:>7.3f} "
                  f"{plain['peak_mib']:>6.1f} {plain['held_mib']:>6.1f} | {slim['seconds']:>6.3f} "
                  f"{slim['peak_mib']:>6.1f} {slim['held_mib']:>6.1f} | {whole:.3f}")
    write_report(args.out, "squeue_parse", repeats=args.repeats, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
