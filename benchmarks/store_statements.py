#!/usr/bin/env python3
"""Benchmark: what the store's per-round ``IN (job ids)`` queries leave in the daemon's memory
when the number of jobs changes every round, with the id lists padded to a power of two
(:func:`hpcsched.daemon.store.lists.among`, the store's way) and without (one SQL text per
length, as SQLAlchemy renders a plain ``in_``).

A fresh SQLite store in a temporary folder gets ``--jobs`` jobs; then, on the store's one
connection, ``--rounds`` rounds each ask what the daemon's round asks of all its jobs
(``touch_jobs``, ``recent_actions``, ``profiles``, ``ingest_offsets``) for a number of jobs drawn
between ``--jobs`` / 4 x 3 and ``--jobs`` (seeded). Each way runs in a process of its own, and
reports its resident set (``VmRSS``) after the first round and at the end, the growth, and the
distinct ``IN`` texts run. Needs no Slurm. Prints a table and writes JSON (``--out``, default
``bench-results/store_statements.json``)::

    .venv/bin/python benchmarks/store_statements.py [--jobs 2000] [--rounds 200]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import rss_mib, write_report  # noqa: E402

JOB = dict(job_uid="", user="u", script="train.py", workers_per_node=4, min_nodes=1, max_nodes=4,
           min_batch_size=32, max_batch_size=4096, base_batch_size=128, lr_scaling="linear",
           spec_json="{}", state="RUNNING", last_seen=0.0)



def one_way(padded: bool, jobs: int, rounds: int, seed: int) -> dict:
    """The figures of one way, in this process (``--way``)."""
    from sqlalchemy import event

    from hpcsched.daemon.store import Store, lists

    if not padded:
        lists.padded = list        # what among() pads with: nothing
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/hpcsched.db")
        store.upgrade()
        ids = [str(100000 + i) for i in range(jobs)]
        store.upsert_jobs({**JOB, "job_id": j, "job_uid": f"uid-{j}"} for j in ids)
        texts: set[str] = set()
        event.listen(store.engine, "before_cursor_execute",
                     lambda conn, cursor, statement, *rest: " IN (" in statement and texts.add(statement))
        rng = random.Random(seed)
        first = None
        for r in range(rounds):
            some = ids[:rng.randint(jobs * 3 // 4, jobs)]
            store.touch_jobs(some, at=float(r))
            store.recent_actions(some)
            store.profiles(some)
            store.ingest_offsets([f"/jobs/{j}/metrics.rank0.jsonl" for j in some])
            if first is None:
                first = rss_mib()
        end = rss_mib()
        store.close()
    return {"padded": padded, "rss_first_round_mib": first, "rss_end_mib": end,
            "growth_mib": end - first, "in_texts": len(texts)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--way", choices=("padded", "plain"), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "store_statements.json")
    args = p.parse_args()
    if args.way:
        print(json.dumps(one_way(args.way == "padded", args.jobs, args.rounds, args.seed)))
        return
    results = []
    for way in ("padded", "plain"):
        out = subprocess.run([sys.executable, __file__, "--way", way, "--jobs", str(args.jobs),
                              "--rounds", str(args.rounds), "--seed", str(args.seed)],
                             capture_output=True, text=True, check=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    print(f"{args.jobs} jobs, {args.rounds} rounds of {args.jobs * 3 // 4}-{args.jobs} ids, one connection")
    print(f"{'IN lists':<10} {'RSS after round 1 (MiB)':>24} {'at the end':>11} {'growth':>8} {'IN texts':>9}")
    for r in results:
        print(f"{'padded' if r['padded'] else 'plain':<10} {r['rss_first_round_mib']:>24.1f} "
              f"{r['rss_end_mib']:>11.1f} {r['growth_mib']:>8.1f} {r['in_texts']:>9}")
    write_report(args.out, "store_statements", jobs=args.jobs, rounds=args.rounds, seed=args.seed,
                 results=results)


if __name__ == "__main__":
    main()
