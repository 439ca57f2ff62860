#!/usr/bin/env python3
"""Benchmark: does PAL's placement add to the default policy? ``jct`` with and without the
``pal`` placement stage, with GPU variability, over seeds (issue 32).

Pollux workloads 1-8 at load 1.0 on 16 x 4 GPUs, at the daemon's granularity (``gpu``), per-GPU
slowdowns drawn from PAL's Longhorn measurements (``--variability``; Jain et al., SC'24), each
run as ``jct`` and as ``jct+pal``, once per seed (the seed draws the slowdowns and seeds the
policy). The same runs as::

    hpcsched simulate -w pollux:N@1.0 -p jct --granularity gpu --variability --seed S [--placement pal]

    .venv/bin/python benchmarks/pal_compose.py [--seeds 0,1,2,3] [--jobs 2] [--out F]

64 simulations with the default four seeds (about 5 minutes on 2 cores), kept in the
evaluation's run cache (``benchmarks/_run_cache.py``). It prints, per seed, the mean over the
eight workloads of each policy's average JCT and their ratio (issue 32's figure: ``jct+pal``'s
mean average JCT over ``jct``'s, target <= 0.97), and the simulation wall-time ratio (target
<= 1.5); then, over all seeds, the mean of the per-seed ratios with the spread of the per-seed
ratios, and the per-(workload, seed) ratios' mean with its 95% confidence interval (Student's
t). One seed is one draw of the cluster: a difference smaller than the spread between seeds is
not a measured gain. Writes them as JSON (default ``bench-results/pal_compose.json``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy import stats

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
#: the two runs compared: label -> placement stage
POLICIES = {"jct": None, "jct+pal": "pal"}
TARGET_RATIO = 0.97
TARGET_WALL = 1.5


def runs(seeds: list[int]) -> dict:
    """``(f"w{N}", label, f"s{seed}", 1.0) -> Run`` for the grid (module docstring)."""
    return {(f"w{w}", label, f"s{s}", 1.0): make_run(f"pollux:{w}@1.0", "jct", placement=placement,
                                                    variability=True, seed=s, granularity="gpu")
            for s in seeds for w in WORKLOADS for label, placement in POLICIES.items()}


def figures(summaries: dict, seeds: list[int]) -> dict:
    """Per seed and over all seeds (module docstring), from ``key -> summary`` (the summary's
    ``avg_jct`` in seconds, ``wall_seconds``)."""
    per_seed, pairs = {}, []
    for s in seeds:
        jct = {w: summaries[(f"w{w}", "jct", f"s{s}", 1.0)] for w in WORKLOADS}
        pal = {w: summaries[(f"w{w}", "jct+pal", f"s{s}", 1.0)] for w in WORKLOADS}
        ratios = [pal[w]["avg_jct"] / jct[w]["avg_jct"] for w in WORKLOADS]
        pairs.extend(ratios)
        mean_jct = float(np.mean([jct[w]["avg_jct"] for w in WORKLOADS]))
        mean_pal = float(np.mean([pal[w]["avg_jct"] for w in WORKLOADS]))
        per_seed[f"s{s}"] = {
            "jct_mean_avg_jct": mean_jct, "pal_mean_avg_jct": mean_pal, "ratio": mean_pal / mean_jct,
            "wall_ratio": (sum(pal[w]["wall_seconds"] for w in WORKLOADS)
                           / sum(jct[w]["wall_seconds"] for w in WORKLOADS)),
            "per_workload": {f"w{w}": r for w, r in zip(WORKLOADS, ratios)}}
    seed_ratios = [v["ratio"] for v in per_seed.values()]
    mean = float(np.mean(pairs))
    half = (float(stats.t.ppf(0.975, len(pairs) - 1) * stats.sem(pairs)) if len(pairs) > 1
            else float("nan"))
    return {"per_seed": per_seed, "ratio_mean_of_seeds": float(np.mean(seed_ratios)),
            "ratio_seed_min": min(seed_ratios), "ratio_seed_max": max(seed_ratios),
            "pair_ratio_mean": mean, "pair_ratio_ci95": [mean - half, mean + half],
            "pairs": len(pairs),
            "wall_ratio": float(np.mean([v["wall_ratio"] for v in per_seed.values()]))}


def _print(fig: dict) -> None:
    print(f"\n{'seed':<5} {'jct (s)':>9} {'jct+pal (s)':>12} {'ratio':>7} {'wall x':>7}   "
          "per workload 1-8")
    for s, v in fig["per_seed"].items():
        print(f"{s:<5} {v['jct_mean_avg_jct']:>9.0f} {v['pal_mean_avg_jct']:>12.0f} "
              f"{v['ratio']:>7.3f} {v['wall_ratio']:>7.2f}   "
              + " ".join(f"{r:.3f}" for r in v["per_workload"].values()))
    lo, hi = fig["pair_ratio_ci95"]
    print(f"\nmean of the per-seed ratios {fig['ratio_mean_of_seeds']:.3f} "
          f"(seeds {fig['ratio_seed_min']:.3f} to {fig['ratio_seed_max']:.3f}); "
          f"{fig['pairs']} (workload, seed) ratios: mean {fig['pair_ratio_mean']:.3f}, "
          f"95% CI {lo:.3f} to {hi:.3f}")
    ok = fig["ratio_mean_of_seeds"] <= TARGET_RATIO
    print(f"{'PASS' if ok else 'FAIL'}  jct+pal mean average JCT <= {TARGET_RATIO} x jct's "
          f"(mean over seeds): {fig['ratio_mean_of_seeds']:.3f}")
    ok = fig["wall_ratio"] <= TARGET_WALL
    print(f"{'PASS' if ok else 'FAIL'}  simulation wall time <= {TARGET_WALL} x: "
          f"{fig['wall_ratio']:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2,3", help="comma-separated seeds")
    p.add_argument("--jobs", type=int, default=2, help="simulations at once (processes)")
    p.add_argument("--no-cache", action="store_true", help="simulate everything again")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "pal_compose.json")
    _evaluation_slurm.add_options(p)
    args = p.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds:
        p.error("--seeds names no seed")
    _evaluation_runs.SLURM = _evaluation_slurm.options(args)
    with single_threaded_blas():
        results = execute_all(runs(seeds), args.jobs,
                              RunCache(None if args.no_cache else code_version()))
    fig = figures({k: summ for k, (_, summ) in results.items()}, seeds)
    _print(fig)
    write_report(args.out, "pal_compose", granularity="gpu", load=1.0, variability="longhorn",
                 seeds=seeds, figures=fig)


if __name__ == "__main__":
    main()
