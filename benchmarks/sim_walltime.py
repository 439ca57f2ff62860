#!/usr/bin/env python3
"""Benchmark: the simulator's wall time per 160-job workload, by policy, on one core.

Each policy replays Pollux workloads (160 jobs, load 1.0) on 16 nodes x 4 GPUs with 60 s rounds,
exactly as ``hpcsched simulate`` does; the figure is the wall time of ``Simulator.run()`` (data
loading excluded: it is shared and cached). Targets (issue #5): <= 5 s with ``dp``, <= 30 s with
``ones``. The process is pinned to one CPU and numpy to one thread.

    .venv/bin/python benchmarks/sim_walltime.py [--workloads 1,2,3] [--policies dp,ones]

Prints a table and writes JSON to ``--out`` (default ``bench-results/sim_walltime.json``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report

from hpcsched.policies import POLICIES
from hpcsched.sim.cli import POLLUX_TIRESIAS
from hpcsched.sim.engine import Simulator
from hpcsched.sim.physics import APPLICATIONS, application
from hpcsched.sim.workload import load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="1,2,3")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "sim_walltime.json"))
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for a in APPLICATIONS:   # load the traces once, outside the clock
        application(a)
    rows = {}
    for p in args.policies.split(","):
        params = POLLUX_TIRESIAS if p == "tiresias" else {}
        times = []
        for w in args.workloads.split(","):
            name, jobs = load_workload(f"pollux:{w}@1.0")
            t0 = time.perf_counter()
            res = Simulator(jobs, p, policy_params=params, workload_name=name).run()
            times.append(time.perf_counter() - t0)
            print(f"{p:>9} {name:<14} {times[-1]:6.2f} s  ({res.rounds} rounds)", flush=True)
        rows[p] = {"median_s": statistics.median(times), "max_s": max(times), "runs": times}
    print(f"\n{'policy':>9} {'median s':>9} {'max s':>7}")
    for p, r in rows.items():
        print(f"{p:>9} {r['median_s']:9.2f} {r['max_s']:7.2f}")
    write_report(Path(args.out), "sim_walltime", workloads=args.workloads.split(","),
                 per_policy=rows, targets={"dp": 5.0, "ones": 30.0})


if __name__ == "__main__":
    main()
