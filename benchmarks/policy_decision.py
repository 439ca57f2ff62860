#!/usr/bin/env python3
"""Benchmark: one policy decision, by policy, at three cluster scales and two granularities, on one core.

Scales (issues #4 and #9): 64 GPUs / 160 jobs, 1,024 GPUs / 500 jobs, 4,096 GPUs / 1,000 jobs, on
nodes of 4 GPUs; each at ``--granularity node`` (plans of whole nodes x the job's workers per node)
and ``gpu`` (any GPU count, packed: ``ClusterSnapshot.granularity``). Jobs are synthetic but shaped
like the dev cluster's: 1, 2 or 4 workers per node, sizes 1-8 nodes, about half of them running
(placed first-fit on the nodes, which show the GPUs they hold) with two measured configurations
(step time linear in the local batch), the rest pending. Every job reports its remaining work
(``remaining_samples``, what ``jct`` ranks by): hours of work at its current size and throughput
drawn from Pollux's job-size mix (Qiao et al., OSDI'21 §5.1: 72% small, 0.1-1 GPU-hours; 20%
medium, 1-10; 6% large, 10-100; 2% extra large, 100-1,000; log-uniform within a class; read here
as hours at the job's size, since these synthetic jobs hold 1-32 GPUs where most of Pollux's hold
a few), less a uniform share of up to 90% already done when it runs, at least a minute: from
minutes to many hours (median about half an hour). A seeded
generator makes them, so every run sees the same snapshots. The process is pinned to one CPU and
numpy to one thread.

Targets (cold, median), printed as PASS/FAIL lines from the measurement: ``jct`` <= 50 ms at
64 GPUs / 160 jobs and <= 1 s at 4,096 GPUs / 1,000 jobs at GPU granularity (issue #9); ONES
<= 50 ms at 64 GPUs and <= 1 s at 4,096, DP <= 0.5 s at 4,096, at node granularity (issue #4).
``pollux`` has no target; its figures stand beside ``jct``'s. A policy that cannot be made (e.g.
not importable yet) is reported and skipped.

    .venv/bin/python benchmarks/policy_decision.py [--repeats 5] [--policies jct,pollux,dp,ones]
        [--model linear|pollux] [--granularity node,gpu] [--scales 64x160,4096x1000]

Each repeat is timed cold (every cached fit and decision cleared first,
``hpcsched.perf.model.clear_caches``; a fresh policy object); the warm time of a second decision
on the same snapshot is recorded too. ``--model pollux`` makes every job one of the Pollux
applications; with ``--throughput-model shared`` (the daemon's default) each job's view then
carries what the snapshot's jobs of its application measured (the daemon builds it from its
store before the round; :mod:`hpcsched.perf.shared`), and with ``fitted`` the policies fit
Pollux's model (L-BFGS-B) to each job's own measurements.

The simulator's wall time per 160-job workload (issue #9: <= 5 s for ``jct`` at GPU granularity)
is measured by ``benchmarks/sim_walltime.py --policies jct --granularity gpu``.

Prints a table per granularity and the target lines; writes JSON to ``--out`` (default
``bench-results/policy_decision.json``, ``policy_decision_pollux.json`` with ``--model pollux``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402

from hpcsched.daemon.views import with_step_corrections  # noqa: E402
from hpcsched.model.snapshot import ClusterSnapshot, JobView, NodeView, ProfilePoint  # noqa: E402
from hpcsched.perf.model import clear_caches  # noqa: E402
from hpcsched.perf.pollux import step_time  # noqa: E402
from hpcsched.perf.priors import APPLICATIONS, prior_for  # noqa: E402
from hpcsched.perf.shared import THROUGHPUT_MODELS, Measured, step_corrections  # noqa: E402
from hpcsched.policies import POLICIES, make_policy  # noqa: E402
from hpcsched.protocol.limits import JobLimits

SCALES = ((64, 160), (1024, 500), (4096, 1000))
GPUS_PER_NODE = 4
#: (policy, GPUs, jobs, granularity, seconds, source): cold median decision time at most
TARGETS = (
    ("jct", 64, 160, "gpu", 0.05, "issue #9"),
    ("jct", 4096, 1000, "gpu", 1.0, "issue #9"),
    ("ones", 64, 160, "node", 0.05, "issue #4"),
    ("ones", 4096, 1000, "node", 1.0, "issue #4"),
    ("dp", 4096, 1000, "node", 0.5, "issue #4"),
)
#: Pollux's job sizes (OSDI'21 §5.1): (share of jobs, fewest GPU-hours, most GPU-hours)
SIZE_MIX = ((0.72, 0.1, 1.0), (0.20, 1.0, 10.0), (0.06, 10.0, 100.0), (0.02, 100.0, 1000.0))
MIN_REMAINING_S = 60.0


def _place(free: list[int], n: int, wpn: int) -> list[int] | None:
    """Indices of the first ``n`` nodes with ``wpn`` GPUs free (first fit), or ``None``."""
    out = [i for i, f in enumerate(free) if f >= wpn][:n]
    return out if len(out) == n else None


def _step(model: str, app: str, scale: float, alpha: float, beta: float, batch: int, wpn: int,
          nodes: int) -> float:
    """Seconds per step of a job of global ``batch`` on ``nodes`` x ``wpn`` GPUs."""
    m = max(1, batch // (nodes * wpn))
    if model == "pollux":
        return scale * step_time(prior_for(app), nodes, nodes * wpn, m, 1)
    return alpha + beta * m


def _remaining_samples(rng: np.random.Generator, running: bool, throughput: float) -> float:
    """Samples left: hours from :data:`SIZE_MIX` (less a share done if ``running``), at least
    :data:`MIN_REMAINING_S` seconds, at ``throughput`` samples/s."""
    share, lo, hi = SIZE_MIX[rng.choice(len(SIZE_MIX), p=[s for s, _, _ in SIZE_MIX])]
    gpu_hours = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    left = 1.0 - (rng.uniform(0.0, 0.9) if running else 0.0)
    seconds = max(MIN_REMAINING_S, gpu_hours * 3600.0 * left)
    return seconds * throughput


def snapshot(gpus: int, jobs: int, seed: int = 0, model: str = "linear",
             granularity: str = "node", throughput_model: str = "shared") -> ClusterSnapshot:
    """A seeded synthetic cluster of ``gpus`` GPUs (4 per node) and ``jobs`` hpcsched jobs
    (module docstring), at ``granularity`` ``"node"`` or ``"gpu"``.

    ``model="pollux"``: each job is one of the Pollux applications (so the policies use the
    Pollux model with its prior, fitted to the job's two configurations by L-BFGS-B) and its
    step times come from that application's prior, scaled by a random factor per job; with
    ``throughput_model="shared"`` every view carries its application's corrections from all
    the jobs' profiles (:func:`hpcsched.daemon.views.with_step_corrections`)."""
    rng = np.random.default_rng(seed)
    extra = np.random.default_rng((seed, 1))   # remaining work: the jobs' shapes stay as before
    free = [GPUS_PER_NODE] * (gpus // GPUS_PER_NODE)
    views = []
    for i in range(jobs):
        wpn = int(rng.choice([1, 2, 4]))
        max_nodes = int(rng.integers(1, 9))
        n = int(rng.integers(1, max_nodes + 1))
        batch = 32 * wpn * int(rng.choice([1, 2, 4]))
        place = _place(free, n, wpn)
        running = place is not None and rng.random() < 0.5
        app = APPLICATIONS[i % len(APPLICATIONS)]
        profile, names = (), ()
        if running:
            for k in place:
                free[k] -= wpn
            names = tuple(f"n{k:04d}" for k in place)
            alpha, beta = rng.uniform(0.005, 0.05), rng.uniform(1e-4, 2e-3)
            scale = rng.uniform(0.5, 2.0)
            sizes = sorted({n, max(1, n // 2) if n > 1 else min(max_nodes, 2)})
            profile = tuple(ProfilePoint(w * wpn, w, max(1, batch // (w * wpn)), 1,
                                         _step(model, app, scale, alpha, beta, batch, wpn, w),
                                         batch / _step(model, app, scale, alpha, beta, batch, wpn, w),
                                         50)
                            for w in sizes)
        else:
            alpha, beta = extra.uniform(0.005, 0.05), extra.uniform(1e-4, 2e-3)
            scale = extra.uniform(0.5, 2.0)
        rate = batch / _step(model, app, scale, alpha, beta, batch, wpn, n)
        views.append(JobView(job_id=str(1000 + i), state="RUNNING" if running else "PENDING",
                             nodes=n, node_names=names,
                             limits=JobLimits(wpn, 1, max_nodes,
                                              batch // 2 if batch >= 2 * n * wpn else batch,
                                              batch * 4, 256, batch, "sqrt"),
                             batch_size=batch, submit_time=float(i), profile=profile,
                             attained_gpu_seconds=float(rng.uniform(0, 20000)) if running else 0.0,
                             app_class=app if model == "pollux" else "",
                             remaining_samples=_remaining_samples(extra, running, rate)))
    if throughput_model == "shared":
        views = list(with_step_corrections(views, lambda app: step_corrections(app, [
            Measured(p.nodes, p.world_size, p.local_batch_size, p.accumulation_steps,
                     p.step_time, p.samples)
            for v in views if v.app_class == app for p in v.profile])))
    nodes = tuple(NodeView(f"n{k:04d}", GPUS_PER_NODE, GPUS_PER_NODE - f, "idle", ("gpu",))
                  for k, f in enumerate(free))
    return replace(ClusterSnapshot(0.0, nodes, tuple(views)), granularity=granularity)


def measure(name: str, snap: ClusterSnapshot, repeats: int) -> dict:
    """Cold and warm decision times of policy ``name`` on ``snap``, seconds: wall (what the
    targets judge) and this process's CPU (``cpu_median_s``; what the decision costs when other
    processes share the core)."""
    times, cpu, warm = [], [], []
    for r in range(repeats):
        policy = make_policy(name)  # fresh: ONES and Pollux would otherwise reuse their population
        clear_caches()              # cold: no fit or decision cached from before
        t, c = time.perf_counter(), time.process_time()
        policy.decide(snap, seed=r)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        policy = make_policy(name)  # warm: the same measurements again (a daemon's
        t = time.perf_counter()     # next round when nothing new was measured)
        policy.decide(snap, seed=r)
        warm.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "max_s": max(times), "times_s": times,
            "cpu_median_s": statistics.median(cpu), "warm_median_s": statistics.median(warm)}


def judge(results: dict, targets=TARGETS) -> list[str]:
    """One line per target: ``PASS``/``FAIL`` with the measured cold median, or ``not measured``.
    ``results[granularity][policy][f"{gpus}x{jobs}"]["median_s"]``."""
    lines = []
    for policy, g, j, gran, limit, source in targets:
        what = f"{policy} at {g} GPUs / {j} jobs, {gran} granularity, cold: <= {limit * 1e3:g} ms ({source})"
        row = results.get(gran, {}).get(policy, {}).get(f"{g}x{j}")
        if row is None:
            lines.append(f"{'-':<4}  {what}: not measured")
        else:
            verdict = "PASS" if row["median_s"] <= limit else "FAIL"
            lines.append(f"{verdict}  {what}: {row['median_s'] * 1e3:.1f} ms "
                         f"(CPU {row['cpu_median_s'] * 1e3:.1f} ms)")
    return lines


def _cell(row: dict) -> str:
    return f"{row['median_s'] * 1e3:.1f} ({row['cpu_median_s'] * 1e3:.1f})".rjust(22)


def _scales(text: str) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(g), int(j)) for g, j in (s.split("x") for s in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"scales as GPUSxJOBS,...: {text!r}") from None


def _granularities(text: str) -> tuple[str, ...]:
    out = tuple(text.split(","))
    if not out or any(g not in ("node", "gpu") for g in out):
        raise argparse.ArgumentTypeError(f"granularity: node, gpu or node,gpu: {text!r}")
    return out


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--model", choices=("linear", "pollux"), default="linear",
                   help="jobs of no known application (linear model) or of the Pollux "
                        "applications (Pollux model with priors)")
    p.add_argument("--throughput-model", choices=THROUGHPUT_MODELS, default="shared",
                   help="with --model pollux: shared (the daemon's default: each job's view "
                        "carries its application's measurements) or fitted (each job's own)")
    p.add_argument("--granularity", type=_granularities, default=("node", "gpu"),
                   help="node, gpu or node,gpu (default: both)")
    p.add_argument("--scales", type=_scales, default=SCALES,
                   help="GPUSxJOBS,... (default: 64x160,1024x500,4096x1000)")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    out = args.out or ROOT / "bench-results" / (
        "policy_decision.json" if args.model == "linear" else "policy_decision_pollux.json")
    pinned = hasattr(os, "sched_setaffinity")
    if pinned:   # one core (given back at the end, for a caller in the same process)
        cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cpus)})
    try:
        results, skipped = _run(args)
    finally:
        if pinned:
            os.sched_setaffinity(0, cpus)
    verdicts = judge(results)
    print(f"\ntargets (--model {args.model}):")
    print("\n".join(verdicts))
    write_report(out, "policy_decision", repeats=args.repeats, scales=args.scales, model=args.model,
                 throughput_model=args.throughput_model,
                 granularities=args.granularity, results=results, targets=verdicts, skipped=skipped,
                 load_average=os.getloadavg() if hasattr(os, "getloadavg") else None)
    return 0


def _run(args: argparse.Namespace) -> tuple[dict, dict[str, str]]:
    """``(results[granularity][policy][scale], {policy not measured: why})``."""
    results: dict[str, dict[str, dict[str, dict]]] = {}
    skipped: dict[str, str] = {}
    for gran in args.granularity:
        print(f"\n--granularity {gran} --model {args.model}: cold decision, median of "
              f"{args.repeats}, ms wall (CPU)\n{'policy':<10}"
              + "".join(f"{f'{g} GPUs/{j} jobs':>22}" for g, j in args.scales))
        snaps = {(g, j): snapshot(g, j, model=args.model, granularity=gran,
                                  throughput_model=args.throughput_model)
                 for g, j in args.scales}
        results[gran] = {}
        for name in args.policies.split(","):
            try:   # a policy that cannot be made or decide (not finished yet) is reported
                row = {f"{g}x{j}": measure(name, snaps[g, j], args.repeats) for g, j in args.scales}
            except Exception as exc:
                skipped[name] = f"{type(exc).__name__}: {exc}"
                print(f"{name:<10}  not measured: {skipped[name]}", flush=True)
                continue
            results[gran][name] = row
            print(f"{name:<10}" + "".join(_cell(row[f"{g}x{j}"]) for g, j in args.scales),
                  flush=True)
    return results, skipped


if __name__ == "__main__":
    sys.exit(main())
