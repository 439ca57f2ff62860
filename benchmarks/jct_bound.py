#!/usr/bin/env python3
"""Benchmark: a lower bound on the mean average JCT any policy can reach on Pollux's workloads.

Two bounds, and per workload the larger: the isolated bound below, and the capacity bound
(:func:`hpcsched.sim.bound.capacity_bound`: each job's fewest GPU-seconds on one machine of the
cluster's 64 GPUs, scheduled by SRPT, which is optimal there), which counts the queueing the
isolated bound cannot.

The bound of a job is its *isolated* JCT (:func:`hpcsched.sim.bound.isolated_jct`): the job alone
on the whole cluster (16 nodes x 4 GPUs, GPU granularity) from its submission, starting at once
and paying the one start cost the simulator charges every start (30 s, the first included), then
training at every point of its progress at the configuration -- GPU count up to its limit, any
layout of them, batch size in its range cut as ``fit_batch`` cuts it -- with the best true rate
of the simulator's own physics (``Application.gain / Application.step_time``, ``SimJob.rate``).

Why it is a bound: in any simulation a job starts no earlier than its submission, pays the start
cost before its first step, and never advances faster than that best rate (the rate depends on
progress only through the epoch). So each job's JCT, and so the mean over a workload's jobs,
is at least the bound, whatever the policy. What it ignores: queueing and contention with other
jobs, restarts and resize costs after the first start, extension start-up, and what a policy
cannot know (the true gradient statistics). The load changes only the workload file (arrivals
and job set: ``hpcsched/data/pollux/workloads/<load>/workload-<N>.csv``).

``--verify`` also simulates the first job of each application in ``pollux:1@0.5`` alone with
the ``jct`` and ``pollux`` policies (``--granularity gpu``) and checks simulated JCT >= bound
(exit status 1 if not). ``--results`` (``benchmarks/evaluation.py``'s JSON) adds each policy's
mean average JCT at GPU granularity beside the bound. ``--gap jct,pollux`` simulates every
workload at every load with those policies (``benchmarks/evaluation.make_run``'s settings, GPU
granularity) and says where each policy's average JCT lies above the bound, per application:
jobs, mean bound and JCT, share of the summed excess, mean wait before the first start, mean
GPUs held while running; and the mean GPU utilization of the runs.

    .venv/bin/python benchmarks/jct_bound.py [--loads 0.5,1.0,1.5,2.0] [--workloads 1-8]
        [--substeps 1] [--verify] [--results bench-results/evaluation.json] [--gap jct,pollux]

Prints a table and writes JSON to ``--out`` (default ``bench-results/jct_bound.json``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report

from hpcsched.sim.bound import capacity_bound, isolated_jct
from hpcsched.sim.engine import SimConfig, Simulator
from hpcsched.sim.workload import load_workload

CFG = SimConfig(granularity="gpu")


def workload_bounds(load: str, workload: int, substeps: int) -> dict:
    """Mean isolated-JCT bound of ``pollux:WORKLOAD@LOAD`` (any layout and packed only), and the
    largest relative change per job when the integration step is halved."""
    _, jobs = load_workload(f"pollux:{workload}@{load}")
    b = [isolated_jct(j, CFG, substeps=substeps) for j in jobs]
    b2 = [isolated_jct(j, CFG, substeps=2 * substeps) for j in jobs]
    packed = [isolated_jct(j, CFG, substeps=substeps, packed=True) for j in jobs]
    capacity = capacity_bound(jobs, CFG)
    return {"jobs": len(jobs), "mean_bound_s": statistics.fmean(b),
            "mean_bound_packed_s": statistics.fmean(packed), "capacity_bound_s": capacity,
            "lower_bound_s": max(statistics.fmean(b), capacity),
            "halved_step_max_rel_change": max(abs(x - y) / x for x, y in zip(b, b2, strict=True))}


def verify(policies: tuple[str, ...] = ("jct", "pollux")) -> list[dict]:
    """The first job of each application in ``pollux:1@0.5``, simulated alone per policy."""
    _, jobs = load_workload("pollux:1@0.5")
    firsts = {}
    for j in jobs:
        firsts.setdefault(j.application, j)
    rows = []
    for app, j in sorted(firsts.items()):
        bound = isolated_jct(j, CFG)
        for p in policies:
            res = Simulator([j], p, config=CFG, workload_name=f"{j.name} alone").run()
            r = res.jobs[0]
            jct = r.finish_time - r.submit_time
            rows.append({"job": j.name, "application": app, "gpus": j.gpus,
                         "batch_size": j.batch_size, "policy": p, "bound_s": bound,
                         "simulated_s": jct, "ratio": jct / bound, "ok": jct >= bound})
            print(f"  {j.name:>14} {p:>7} bound {bound:9.1f} s  simulated {jct:9.1f} s  "
                  f"x{jct / bound:.3f}  {'ok' if jct >= bound else 'BELOW BOUND'}", flush=True)
    return rows


def policy_means(path: Path) -> dict[str, dict[str, float]]:
    """``policy -> load -> mean over workloads of avg_jct`` at GPU granularity in
    ``benchmarks/evaluation.py``'s results JSON."""
    runs = json.loads(path.read_text())["runs"]
    acc: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        if r.get("experiment") == "grid" and r.get("granularity") == "gpu" and r.get("avg_jct"):
            acc.setdefault((r["policy"], str(r["load"])), []).append(r["avg_jct"])
    out: dict[str, dict[str, float]] = {}
    for (p, ld), v in acc.items():
        out.setdefault(p, {})[ld] = statistics.fmean(v)
    return out


def gap(policies: list[str], loads: list[str], wls: list[int]) -> dict:
    """Per policy and load: per application, where the policy's JCTs lie above the bound
    (``--gap`` above); seconds, GPUs."""
    from evaluation import make_run

    from hpcsched.sim.cli import execute
    from hpcsched.sim.report import summarize

    out: dict = {}
    for p in policies:
        for ld in loads:
            rows: dict[str, dict[str, list[float]]] = {}
            util = []
            for w in wls:
                wl = f"pollux:{w}@{ld}"
                bound = {j.name: isolated_jct(j, CFG) for j in load_workload(wl)[1]}
                res = execute(make_run(wl, p, granularity="gpu"))
                util.append(summarize(res).get("gpu_utilization") or 0.0)
                for j in res.jobs:
                    if j.jct is None or j.start_time is None:
                        continue
                    r = rows.setdefault(j.application, {k: [] for k in ("bound", "jct", "wait", "gpus")})
                    r["bound"].append(bound[j.name])
                    r["jct"].append(j.jct)
                    r["wait"].append(j.start_time - j.submit_time)
                    r["gpus"].append(j.gpu_seconds / max(1e-9, j.finish_time - j.start_time))
            excess = sum(sum(r["jct"]) - sum(r["bound"]) for r in rows.values())
            apps = {a: {"jobs": len(r["jct"]), "mean_bound_s": statistics.fmean(r["bound"]),
                        "mean_jct_s": statistics.fmean(r["jct"]),
                        "share_of_excess": (sum(r["jct"]) - sum(r["bound"])) / excess if excess else 0.0,
                        "mean_wait_s": statistics.fmean(r["wait"]),
                        "mean_gpus_held": statistics.fmean(r["gpus"])}
                    for a, r in sorted(rows.items())}
            out.setdefault(p, {})[ld] = {"gpu_utilization": statistics.fmean(util), "applications": apps}
            print(f"{p} at load {ld}: mean GPU utilization {statistics.fmean(util):.1%}")
            print(f"  {'application':>12} {'jobs':>5} {'bound s':>8} {'JCT s':>8} {'excess':>7} "
                  f"{'wait s':>7} {'GPUs':>5}")
            for a, r in apps.items():
                print(f"  {a:>12} {r['jobs']:5d} {r['mean_bound_s']:8.0f} {r['mean_jct_s']:8.0f} "
                      f"{r['share_of_excess']:7.1%} {r['mean_wait_s']:7.0f} {r['mean_gpus_held']:5.1f}",
                      flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loads", default="0.5,1.0,1.5,2.0")
    ap.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--substeps", type=int, default=1, help="integration steps per epoch")
    ap.add_argument("--verify", action="store_true", help="one-job simulations (a few minutes)")
    ap.add_argument("--results", default=None, help="evaluation.json to compare policies with")
    ap.add_argument("--gap", default=None, help="policies to simulate against the bound, per application")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "jct_bound.json"))
    args = ap.parse_args()
    if args.substeps < 1:
        ap.error("--substeps must be >= 1")
    loads, wls = args.loads.split(","), [int(w) for w in args.workloads.split(",")]
    t0 = time.perf_counter()
    table = {ld: {w: workload_bounds(ld, w, args.substeps) for w in wls} for ld in loads}
    means = {ld: statistics.fmean(r["mean_bound_s"] for r in table[ld].values()) for ld in loads}
    packed = {ld: statistics.fmean(r["mean_bound_packed_s"] for r in table[ld].values())
              for ld in loads}
    halved = max(r["halved_step_max_rel_change"] for t in table.values() for r in t.values())
    print("mean isolated-JCT bound (s), any layout; load x workload")
    print(f"{'load':>5} " + " ".join(f"{'w' + str(w):>8}" for w in wls) + f" {'mean':>8} {'packed':>8}")
    for ld in loads:
        print(f"{ld:>5} " + " ".join(f"{table[ld][w]['mean_bound_s']:8.1f}" for w in wls)
              + f" {means[ld]:8.1f} {packed[ld]:8.1f}")
    print(f"halving the integration step changes a job's bound by at most {halved:.2e} (relative)")
    capacity = {ld: statistics.fmean(r["capacity_bound_s"] for r in table[ld].values()) for ld in loads}
    lower = {ld: statistics.fmean(r["lower_bound_s"] for r in table[ld].values()) for ld in loads}
    print("capacity bound (s): " + "  ".join(f"{ld}: {capacity[ld]:.0f}" for ld in loads))
    print("lower bound, the larger per workload (s): "
          + "  ".join(f"{ld}: {lower[ld]:.0f}" for ld in loads))
    compare = policy_means(Path(args.results)) if args.results else {}
    for p, per in sorted(compare.items()):
        print(f"{p:>9}: " + "  ".join(f"{ld}: {per[ld]:.0f} s = x{per[ld] / lower[ld]:.2f} bound"
                                      for ld in loads if ld in per))
    rows = verify() if args.verify else []
    gaps = gap(args.gap.split(","), loads, wls) if args.gap else {}
    wall = time.perf_counter() - t0
    write_report(Path(args.out), "jct_bound", loads=loads, workloads=wls, substeps=args.substeps,
                 per_workload={ld: {str(w): r for w, r in t.items()} for ld, t in table.items()},
                 mean_bound_s=means, mean_bound_packed_s=packed, capacity_bound_s=capacity,
                 lower_bound_s=lower,
                 halved_step_max_rel_change=halved, policies_mean_avg_jct=compare,
                 verification=rows, gap=gaps, wall_seconds=wall)
    if any(not r["ok"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
