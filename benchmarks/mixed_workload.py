#!/usr/bin/env python3
"""Benchmark: hpcsched beside other users' plain jobs, in the simulator (issue 37).

Pollux workloads 1-8 at load 1.0 on 16 x 4 GPUs, planned at the daemon's granularity (``gpu``,
its rules: starts at a job's fewest GPUs, grows by extension, shrinks by release), each twice:
all jobs elastic, and with ``--rigid-fraction`` (default 0.3) of them other users' plain
``sbatch`` jobs (:func:`hpcsched.sim.workload.make_rigid`: fixed size and duration, Slurm's
order, seen by the policy only as Slurm shows them). Each under ``jct`` (the daemon on) and
``static`` (the daemon off: every job as submitted). 32 simulations, kept in the evaluation's
run cache (``benchmarks/_run_cache.py``).

    .venv/bin/python benchmarks/mixed_workload.py [--jobs 2] [--rigid-fraction 0.3] [--out F]

It prints, per workload and over all eight (the plain jobs' waits pooled, the JCTs averaged per
workload):

* the plain jobs' average and p99 wait (s, submission to start), daemon on and off, and on/off
  (issue 37's target: <= 1.05 for both);
* the elastic jobs' gain in average JCT over static, ``1 - jct / static``, in the mixed workload
  and in the all-elastic one, and their ratio (target: >= 0.80);

and writes them as JSON (default ``bench-results/mixed_workload.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _evaluation_runs  # noqa: E402
import _evaluation_slurm  # noqa: E402
from _evaluation_runs import execute_all, make_run  # noqa: E402
from _report import write_report  # noqa: E402
from _run_cache import RunCache, code_version  # noqa: E402

from hpcsched.sim.cli import single_threaded_blas  # noqa: E402

WORKLOADS = range(1, 9)
POLICIES = ("jct", "static")


def runs(fraction: float, keep_free: int = 0) -> dict:
    """``(f"w{N}", policy, fraction as text, 1.0) -> Run`` for the grid (module docstring);
    ``keep_free`` GPUs kept free (``--keep-free-gpus``) in the mixed runs only, so that the
    all-elastic gain they are judged against is the default daemon's."""
    out = {}
    for w in WORKLOADS:
        for p in POLICIES:
            for f in (fraction, 0.0):
                out[(f"w{w}", p, f"{f:g}", 1.0)] = dataclasses.replace(
                    make_run(f"pollux:{w}@1.0", p, granularity="gpu"), rigid_fraction=f,
                    keep_free_gpus=keep_free if f else 0)
    return out


def _gain(on: float, off: float) -> float:
    return 1.0 - on / off


def figures(results: dict, fraction: float) -> dict:
    """Per workload and overall (module docstring), from ``key -> (SimResult, summary)``."""
    f = f"{fraction:g}"
    per, waits = {}, {p: [] for p in POLICIES}
    for w in WORKLOADS:
        k = f"w{w}"
        mixed = {p: results[(k, p, f, 1.0)] for p in POLICIES}
        alone = {p: results[(k, p, "0", 1.0)][1] for p in POLICIES}
        row = {}
        for p in POLICIES:
            res, s = mixed[p]
            waits[p].extend(j.wait for j in res.jobs if j.rigid and j.wait is not None)
            row[p] = {"plain_avg_wait": s["plain_avg_wait"], "plain_p99_wait": s["plain_p99_wait"],
                      "elastic_avg_jct": s["elastic_avg_jct"], "all_elastic_avg_jct": alone[p]["avg_jct"]}
        row["gain_mixed"] = _gain(row["jct"]["elastic_avg_jct"], row["static"]["elastic_avg_jct"])
        row["gain_all_elastic"] = _gain(row["jct"]["all_elastic_avg_jct"],
                                        row["static"]["all_elastic_avg_jct"])
        per[k] = row
    mean = {key: float(np.mean([per[k][key] for k in per])) for key in ("gain_mixed", "gain_all_elastic")}
    pooled = {p: {"avg": float(np.mean(waits[p])), "p99": float(np.percentile(waits[p], 99)),
                  "jobs": len(waits[p])} for p in POLICIES}
    return {"per_workload": per, "plain_wait": pooled, **mean,
            "gain_ratio": mean["gain_mixed"] / mean["gain_all_elastic"],
            "wait_ratio": {q: pooled["jct"][q] / pooled["static"][q] if pooled["static"][q] else None
                           for q in ("avg", "p99")}}


def _print(fig: dict, fraction: float) -> None:
    print(f"\n{'':<4} {'plain jobs wait (s): avg on/off':>32} {'p99 on/off':>16}  "
          f"{'elastic gain: mixed':>20} {'all-elastic':>12}")
    for k, r in fig["per_workload"].items():
        print(f"{k:<4} {r['jct']['plain_avg_wait']:>15.0f} / {r['static']['plain_avg_wait']:<14.0f} "
              f"{r['jct']['plain_p99_wait']:>7.0f} / {r['static']['plain_p99_wait']:<7.0f}  "
              f"{100 * r['gain_mixed']:>19.1f}% {100 * r['gain_all_elastic']:>11.1f}%")
    w, r = fig["plain_wait"], fig["wait_ratio"]
    print(f"all  {w['jct']['avg']:>14.0f} / {w['static']['avg']:<14.0f} {w['jct']['p99']:>7.0f} / "
          f"{w['static']['p99']:<7.0f}  {100 * fig['gain_mixed']:>19.1f}% "
          f"{100 * fig['gain_all_elastic']:>11.1f}%")
    checks = [("plain jobs' average wait, daemon on <= 1.05 x off", r["avg"], 1.05, True),
              ("plain jobs' p99 wait, daemon on <= 1.05 x off", r["p99"], 1.05, True),
              ("elastic gain with plain jobs >= 0.80 x all-elastic gain", fig["gain_ratio"], 0.80,
               False)]
    print(f"\n{w['jct']['jobs']} plain jobs ({fraction:g} of each workload)")
    for what, value, bound, at_most in checks:
        ok = value is not None and (value <= bound if at_most else value >= bound)
        print(f"{'PASS' if ok else 'FAIL'}  {what}: "
              + ("no wait either way" if value is None else f"{value:.3f}"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2, help="simulations at once (processes)")
    p.add_argument("--rigid-fraction", type=float, default=0.3)
    p.add_argument("--keep-free-gpus", type=int, default=0, metavar="N",
                   help="the mixed runs keep N GPUs free for other users' next jobs "
                        "(hpcsched simulate --keep-free-gpus; daemon.keep_free_gpus)")
    p.add_argument("--no-cache", action="store_true", help="simulate everything again")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "mixed_workload.json")
    _evaluation_slurm.add_options(p)
    args = p.parse_args()
    _evaluation_runs.SLURM = _evaluation_slurm.options(args)
    with single_threaded_blas():
        results = execute_all(runs(args.rigid_fraction, args.keep_free_gpus), args.jobs,
                              RunCache(None if args.no_cache else code_version()))
    fig = figures(results, args.rigid_fraction)
    _print(fig, args.rigid_fraction)
    write_report(args.out, "mixed_workload", rigid_fraction=args.rigid_fraction,
                 keep_free_gpus=args.keep_free_gpus,
                 granularity="gpu", load=1.0, figures=fig)


if __name__ == "__main__":
    main()
