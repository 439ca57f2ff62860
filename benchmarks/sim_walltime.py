#!/usr/bin/env python3
"""Benchmark: the simulator's wall time per 160-job workload, by policy, on one core.

Each policy replays Pollux workloads (160 jobs, load 1.0) on 16 nodes x 4 GPUs with 60 s rounds,
exactly as ``hpcsched simulate`` does; the figure is the wall time of ``Simulator.run()`` (data
loading excluded: it is shared and cached), at ``--granularity node`` (default) or ``gpu`` (or
both: ``node,gpu``). Targets (median), printed as PASS/FAIL lines: <= 5 s with ``dp`` and <= 30 s
with ``ones`` at node granularity (issue #5); <= 5 s with ``jct`` at GPU granularity (issue #9:
``--policies jct --granularity gpu``). The process is pinned to one CPU and BLAS to one thread.

    .venv/bin/python benchmarks/sim_walltime.py [--workloads 1,2,3] [--policies dp,ones]
        [--granularity node|gpu|node,gpu]

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
from hpcsched.sim.cli import POLLUX_TIRESIAS, single_threaded_blas
from hpcsched.sim.engine import SimConfig, Simulator
from hpcsched.sim.physics import APPLICATIONS, application
from hpcsched.sim.workload import load_workload

#: (policy, granularity, seconds, source): median wall time per workload at most
TARGETS = (("dp", "node", 5.0, "issue #5"), ("ones", "node", 30.0, "issue #5"),
           ("jct", "gpu", 5.0, "issue #9"))


def judge(rows: dict) -> list[str]:
    """One ``PASS``/``FAIL`` line per target measured (``rows[granularity][policy]["median_s"]``)."""
    lines = []
    for policy, gran, limit, source in TARGETS:
        r = rows.get(gran, {}).get(policy)
        if r is not None:
            verdict = "PASS" if r["median_s"] <= limit else "FAIL"
            lines.append(f"{verdict}  {policy} at {gran} granularity: median {r['median_s']:.2f} s "
                         f"(CPU {r['cpu_median_s']:.2f} s) per 160-job workload <= {limit:g} s "
                         f"({source})")
    return lines


def run(policy: str, workload: str, granularity: str) -> tuple[float, float, int]:
    """Wall time and this process's CPU time (s) of one simulation of ``pollux:WORKLOAD@1.0``,
    and its rounds."""
    params = POLLUX_TIRESIAS if policy == "tiresias" else {}
    name, jobs = load_workload(f"pollux:{workload}@1.0")
    t0, c0 = time.perf_counter(), time.process_time()
    res = Simulator(jobs, policy, policy_params=params, workload_name=name,
                    config=SimConfig(granularity=granularity)).run()
    return time.perf_counter() - t0, time.process_time() - c0, res.rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="1,2,3")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--granularity", default="node", help="node, gpu or node,gpu")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "sim_walltime.json"))
    args = ap.parse_args()
    grans = args.granularity.split(",")
    if any(g not in ("node", "gpu") for g in grans):
        ap.error(f"--granularity: node, gpu or node,gpu, not {args.granularity!r}")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for a in APPLICATIONS:   # load the traces once, outside the clock
        application(a)
    rows: dict[str, dict] = {g: {} for g in grans}
    with single_threaded_blas():
        for gran in grans:
            for p in args.policies.split(","):
                times, cpu = [], []
                for w in args.workloads.split(","):
                    t, c, rounds = run(p, w, gran)
                    times.append(t)
                    cpu.append(c)
                    print(f"{p:>9} {gran:>4} pollux:{w}@1.0 {t:6.2f} s (CPU {c:6.2f} s, {rounds} rounds)",
                          flush=True)
                rows[gran][p] = {"median_s": statistics.median(times), "max_s": max(times),
                                 "runs": times, "cpu_median_s": statistics.median(cpu), "cpu_s": cpu}
    print(f"\n{'policy':>9} {'gran':>4} {'median s':>9} {'max s':>7} {'CPU s':>7}")
    for gran, per in rows.items():
        for p, r in per.items():
            print(f"{p:>9} {gran:>4} {r['median_s']:9.2f} {r['max_s']:7.2f} {r['cpu_median_s']:7.2f}")
    verdicts = judge(rows)
    print("\n".join(["", "targets:", *verdicts]))
    write_report(Path(args.out), "sim_walltime", workloads=args.workloads.split(","),
                 granularities=grans, per_policy=rows, targets=verdicts,
                 load_average=os.getloadavg() if hasattr(os, "getloadavg") else None)


if __name__ == "__main__":
    main()
