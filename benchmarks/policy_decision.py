#!/usr/bin/env python3
"""Benchmark: one policy decision, by policy, at three cluster scales, on one core.

Scales (issue #4): 64 GPUs / 160 jobs, 1,024 GPUs / 500 jobs, 4,096 GPUs / 1,000 jobs, on nodes
of 4 GPUs. Jobs are synthetic but shaped like the dev cluster's: 1, 2 or 4 workers per node,
sizes 1-8 nodes, half of them running with two measured configurations (step time linear in
the local batch), the rest pending; a seeded generator makes them, so every run sees the same
snapshots. The process is pinned to one CPU and numpy to one thread. Targets: ONES <= 50 ms at
64 GPUs and <= 1 s at 4,096; DP <= 0.5 s at 4,096.

    .venv/bin/python benchmarks/policy_decision.py [--repeats 5] [--policies static,dp,ones]
        [--model linear|pollux]

Each repeat is timed cold (every cached fit and decision cleared first); the warm time of a
second decision on the same snapshot is recorded too. ``--model pollux`` makes every job one of
the Pollux applications, so the policies fit Pollux's model (L-BFGS-B) to each job.

Prints a table and writes JSON to ``--out`` (default ``bench-results/policy_decision.json``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402

from hpcsched.perf.model import clear_caches  # noqa: E402
from hpcsched.perf.pollux import step_time  # noqa: E402
from hpcsched.perf.priors import APPLICATIONS, prior_for  # noqa: E402
from hpcsched.policies import POLICIES, make_policy  # noqa: E402
from hpcsched.policies.snapshot import ClusterSnapshot, JobView, NodeView, ProfilePoint  # noqa: E402

SCALES = ((64, 160), (1024, 500), (4096, 1000))


def snapshot(gpus: int, jobs: int, seed: int = 0, model: str = "linear") -> ClusterSnapshot:
    """A seeded synthetic cluster of ``gpus`` GPUs (4 per node) and ``jobs`` hpcsched jobs.

    ``model="pollux"``: each job is one of the Pollux applications (so the policies use the
    Pollux model with its prior, fitted to the job's two configurations by L-BFGS-B) and its
    step times come from that application's prior, scaled by a random factor per job."""
    rng = np.random.default_rng(seed)
    nodes = tuple(NodeView(f"n{i:04d}", 4, 0, "idle", ("gpu",)) for i in range(gpus // 4))
    views, used = [], 0
    for i in range(jobs):
        wpn = int(rng.choice([1, 2, 4]))
        max_nodes = int(rng.integers(1, 9))
        n = int(rng.integers(1, max_nodes + 1))
        batch = 32 * wpn * int(rng.choice([1, 2, 4]))
        running = used + n * wpn <= gpus and rng.random() < 0.5
        profile = ()
        if running:
            used += n * wpn
            alpha, beta = rng.uniform(0.005, 0.05), rng.uniform(1e-4, 2e-3)
            app = APPLICATIONS[i % len(APPLICATIONS)]
            scale = rng.uniform(0.5, 2.0)

            def step(w):
                m = max(1, batch // (w * wpn))
                if model == "pollux":
                    return scale * step_time(prior_for(app), w, w * wpn, m, 1)
                return alpha + beta * m
            profile = tuple(ProfilePoint(w * wpn, w, max(1, batch // (w * wpn)), 1, step(w),
                                         batch / step(w), 50)
                            for w in sorted({n, max(1, n // 2) if n > 1 else min(max_nodes, 2)}))
        views.append(JobView(
            job_id=str(1000 + i), state="RUNNING" if running else "PENDING", nodes=n,
            node_names=(), workers_per_node=wpn, min_nodes=1, max_nodes=max_nodes,
            batch_size=batch, min_batch_size=batch // 2 if batch >= 2 * n * wpn else batch,
            max_batch_size=batch * 4, max_local_batch_size=256, base_batch_size=batch,
            lr_scaling="sqrt", submit_time=float(i), profile=profile,
            attained_gpu_seconds=float(rng.uniform(0, 20000)) if running else 0.0,
            app_class=APPLICATIONS[i % len(APPLICATIONS)] if model == "pollux" else ""))
    return ClusterSnapshot(0.0, nodes, tuple(views))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--model", choices=("linear", "pollux"), default="linear",
                   help="jobs of no known application (linear model) or of the Pollux "
                        "applications (Pollux model with priors)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    out = args.out or ROOT / "bench-results" / (
        "policy_decision.json" if args.model == "linear" else "policy_decision_pollux.json")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    results: dict[str, dict[str, dict]] = {}
    print(f"{'policy':<10}" + "".join(f"{f'{g} GPUs/{j} jobs':>22}" for g, j in SCALES)
          + "   (median of %d, ms)" % args.repeats)
    for name in args.policies.split(","):
        row = {}
        for g, j in SCALES:
            snap = snapshot(g, j, model=args.model)
            times, warm = [], []
            for r in range(args.repeats):
                policy = make_policy(name)  # fresh: ONES would otherwise reuse its population
                clear_caches()              # cold: no fit or decision cached from before
                t = time.perf_counter()
                policy.decide(snap, seed=r)
                times.append(time.perf_counter() - t)
                policy = make_policy(name)  # warm: the same measurements again (a daemon's
                t = time.perf_counter()     # next round when nothing new was measured)
                policy.decide(snap, seed=r)
                warm.append(time.perf_counter() - t)
            row[f"{g}x{j}"] = {"median_s": statistics.median(times), "max_s": max(times),
                               "times_s": times, "warm_median_s": statistics.median(warm)}
        results[name] = row
        print(f"{name:<10}" + "".join(f"{row[f'{g}x{j}']['median_s'] * 1e3:>22.1f}"
                                      for g, j in SCALES), flush=True)
    write_report(out, "policy_decision", repeats=args.repeats, scales=SCALES, model=args.model,
                 results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
