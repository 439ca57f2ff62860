#!/usr/bin/env python3
"""Benchmark: Slurm calls and wall time of one daemon round with 200 hpcsched jobs queued.

A foreign job holds every node, then 200 elastic jobs (the digits example) are submitted with
hpcsub (in-process, to save 200 Python start-ups): they wait in the queue for resources, as on a
full cluster. Then
the real daemon round (observe, ingest, snapshot, policy, reconcile, journal) runs ``--rounds``
times against the dev cluster with a fresh SQLite store, for each policy. Per round it reports
the Slurm commands issued (every one, counted in ``hpcsched.slurm.run``), the round's wall time,
the policy's share, and the round time without the policy. Targets (issue #3): <= 3 Slurm calls
per round whatever the job count; <= 1 s per round excluding the policy.

    .venv/bin/python benchmarks/daemon_round.py [--jobs 200] [--rounds 20]

Prints a table and writes JSON to ``--out`` (default ``bench-results/daemon_round.json``).
Needs root for the dev cluster (started if down).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402

from hpcsched.daemon.config import defaults  # noqa: E402
from hpcsched.daemon.round import Daemon  # noqa: E402
from hpcsched.daemon.store import Store  # noqa: E402
from hpcsched.job.submit import submit  # noqa: E402
from hpcsched.slurm import devcluster  # noqa: E402

EXAMPLE = ROOT / "jobscripts" / "examples" / "digits_mlp.py"


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "daemon_round.json")
    args = p.parse_args()

    os.environ["SLURM_CONF"] = str(devcluster.up(devcluster.default_state_dir()))
    work = Path(tempfile.mkdtemp(prefix="hpcsched-bench-round-"))
    os.environ["HPCSCHED_CONTROL_DIR"] = str(work / "jobs")
    os.chdir(work)
    ids: list[str] = []
    t0 = time.perf_counter()
    try:
        blocker = subprocess.run(["sbatch", "--parsable", "-N4", "--gres=gpu:4", "--output=/dev/null",
                                  "--wrap", "sleep 3600"], capture_output=True, text=True, check=True)
        ids.append(blocker.stdout.strip().split(";")[0])
        for i in range(args.jobs):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rc = submit(["--parsable", "-N", str(1 + i % 2),
                             "--gres=gpu:2", "--hpcsched-max-nodes", "2", str(EXAMPLE)])
            if rc != 0:
                raise SystemExit(f"hpcsub failed with status {rc}")
            ids.append(buf.getvalue().strip())
        print(f"submitted {len(ids)} jobs in {time.perf_counter() - t0:.1f} s", flush=True)
        results = {}
        for policy in ("static", "dp"):
            base = defaults()
            settings = replace(base, daemon=replace(base.daemon, partitions=(),
                                                    database_url=f"sqlite:///{work}/{policy}.db",
                                                    lock_file=str(work / "lock")),
                               policy=replace(base.policy, name=policy))
            store = Store(settings.daemon.database_url)
            store.upgrade()
            daemon = Daemon(settings, store=store)
            reps = [daemon.round() for _ in range(args.rounds)]
            assert all(r.error is None for r in reps), [r.error for r in reps]
            assert all(r.jobs == args.jobs for r in reps), [r.jobs for r in reps]
            quiet = [r for r in reps if not r.changes]   # rounds that observed and decided only
            dur = [r.duration for r in quiet]
            nopol = [r.duration - r.policy_seconds for r in quiet]
            results[policy] = {
                "jobs": reps[-1].jobs,
                "rounds_with_changes": len(reps) - len(quiet),
                "slurm_calls_per_round": {"max": max(r.slurm_calls for r in quiet),
                                          "min": min(r.slurm_calls for r in quiet)},
                "changes_per_round": [len(r.changes) for r in reps],
                "round_s": {"median": statistics.median(dur), "p95": pct(dur, 0.95), "max": max(dur)},
                "round_without_policy_s": {"median": statistics.median(nopol),
                                           "p95": pct(nopol, 0.95), "max": max(nopol)},
                "policy_s": {"median": statistics.median(r.policy_seconds for r in reps),
                             "max": max(r.policy_seconds for r in reps)},
            }
    finally:
        for k in range(0, len(ids), 100):
            subprocess.run(["scancel", *ids[k:k + 100]], capture_output=True)
    print(f"\n{args.jobs} hpcsched jobs in the queue, {args.rounds} rounds per policy "
          "(figures over the rounds that changed nothing; each change costs its own calls)")
    print(f"{'policy':<8} {'Slurm calls/round':>18} {'round s (med/p95/max)':>24} "
          f"{'without policy s (med/p95/max)':>32} {'policy s (med)':>15}")
    for pol, r in results.items():
        c, d, n = r["slurm_calls_per_round"], r["round_s"], r["round_without_policy_s"]
        print(f"{pol:<8} {c['max']:>18} {d['median']:>8.3f}/{d['p95']:.3f}/{d['max']:.3f}      "
              f"{n['median']:>8.3f}/{n['p95']:.3f}/{n['max']:.3f}        {r['policy_s']['median']:>10.4f}")
    write_report(args.out, "daemon_round", jobs=args.jobs, rounds=args.rounds, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
