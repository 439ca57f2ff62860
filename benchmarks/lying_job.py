#!/usr/bin/env python3
"""Benchmark: a job that lies about itself, beside honest jobs (issue 33, "a lying job").

``jct`` ranks jobs by what they report: their remaining work and their throughput per size.
Each run here takes one job of a Pollux workload (load 1.0, ``jct`` at ``gpu`` granularity, the
daemon's rules) and makes it lie, in the simulator (:class:`hpcsched.sim.WorkloadJob`'s claims):

``work``
    it reports 10% of its true remaining work, at every report;
``speed``
    it reports 3 x its true throughput at every size of 2 GPUs and more.

Each lie runs twice: as the daemon and the simulator run (its claims checked against its
progress, :mod:`hpcsched.views.claims`), and as a what-if that believes every job
(``SimConfig.check_claims=False``). The truth is the same workload with no liar. Per run: the
liar's GPU-hours and JCT against the truth's, and the honest jobs' average JCT against the
truth's. Issue 33's targets, with the checks: the liar gets at most 1.10 x the GPU-hours it
gets telling the truth, and the honest jobs' average JCT is at most 1.05 x the truth's.

The liars are the jobs at a quarter, half and three quarters of each workload's arrivals
(``--liars``), one at a time.

    .venv/bin/python benchmarks/lying_job.py [--workloads 1-8] [--jobs 2] [--out F]

Writes JSON (default ``bench-results/lying_job.json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402

from hpcsched.sim.cli import single_threaded_blas  # noqa: E402
from hpcsched.sim.engine import SimConfig, simulate  # noqa: E402
from hpcsched.sim.workload import load_workload  # noqa: E402

LIES = {"work": {"work_claim": 0.1}, "speed": {"speed_claim": 3.0}}
TARGET_GPU_HOURS, TARGET_HONEST = 1.10, 1.05


def _parse_range(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _liar(job, lie: str):
    """``job`` telling ``lie`` (:data:`LIES`); a speed liar overstates every size of 2 GPUs and
    more (a job only reports sizes it ran at, and starts at its fewest GPUs)."""
    return replace(job, **LIES[lie], speed_claim_from=2 if lie == "speed" else 1)


def run_one(workload: int, liar: str | None, lie: str | None, check: bool) -> dict:
    """One simulation: ``{job name: (jct s, gpu-seconds)}`` and its wall time."""
    name, jobs = load_workload(f"pollux:{workload}@1.0")
    if liar is not None:
        jobs = [_liar(j, lie) if j.name == liar else j for j in jobs]
    t = time.time()
    with single_threaded_blas():
        r = simulate(jobs, "jct", config=SimConfig(granularity="gpu", check_claims=check),
                     workload_name=name)
    return {"jobs": {j.name: (j.finish_time - j.submit_time, j.gpu_seconds) for j in r.jobs
                     if j.finish_time is not None},
            "wall": time.time() - t}


def liars_of(workload: int, fractions=(0.25, 0.5, 0.75)) -> list[str]:
    """The jobs at ``fractions`` of the workload's arrivals."""
    _, jobs = load_workload(f"pollux:{workload}@1.0")
    order = sorted(jobs, key=lambda j: (j.submit_time, j.name))
    return [order[int(f * (len(order) - 1))].name for f in fractions]


def compare(truth: dict, lied: dict, liar: str) -> dict:
    """The liar's GPU-hours and JCT, and the honest jobs' average JCT, against the truth's."""
    honest = [n for n in truth["jobs"] if n != liar]
    t_avg = statistics.mean(truth["jobs"][n][0] for n in honest)
    l_avg = statistics.mean(lied["jobs"][n][0] for n in honest)
    (t_jct, t_gs), (l_jct, l_gs) = truth["jobs"][liar], lied["jobs"][liar]
    return {"liar_gpu_hours": l_gs / 3600, "truth_gpu_hours": t_gs / 3600,
            "gpu_hours_ratio": l_gs / t_gs, "liar_jct": l_jct, "truth_jct": t_jct,
            "jct_ratio": l_jct / t_jct, "honest_avg_jct": l_avg, "truth_honest_avg_jct": t_avg,
            "honest_ratio": l_avg / t_avg}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="1-8", help="Pollux workloads, e.g. 1-8 or 3")
    p.add_argument("--jobs", type=int, default=2, help="simulations in parallel")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "lying_job.json")
    args = p.parse_args()
    workloads = _parse_range(args.workloads)
    todo = {(w, None, None, True): None for w in workloads}
    for w in workloads:
        for liar in liars_of(w):
            for lie in LIES:
                for check in (True, False):
                    todo[w, liar, lie, check] = None
    t0 = time.time()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {k: pool.submit(run_one, *k) for k in todo}
        done = {k: f.result() for k, f in futures.items()}
    rows = [{"workload": w, "liar": liar, "lie": lie, "checked": check,
             **compare(done[w, None, None, True], r, liar)}
            for (w, liar, lie, check), r in done.items() if liar is not None]
    summary = {}
    print(f"{len(done)} simulations in {(time.time() - t0) / 60:.1f} min\n")
    print(f"{'lie':<6} {'claims':<9} {'liar GPU-h / truth':>19} {'(max)':>7} {'liar JCT / truth':>17} "
          f"{'honest avg JCT / truth':>23} {'(max)':>7}")
    for lie in LIES:
        for check in (True, False):
            sel = [r for r in rows if r["lie"] == lie and r["checked"] == check]
            s = {k: statistics.mean(r[k] for r in sel) for k in
                 ("gpu_hours_ratio", "jct_ratio", "honest_ratio")}
            s.update(max_gpu_hours_ratio=max(r["gpu_hours_ratio"] for r in sel),
                     max_honest_ratio=max(r["honest_ratio"] for r in sel), runs=len(sel))
            summary[f"{lie}-{'checked' if check else 'believed'}"] = s
            print(f"{lie:<6} {'checked' if check else 'believed':<9} {s['gpu_hours_ratio']:>19.3f} "
                  f"{s['max_gpu_hours_ratio']:>7.3f} {s['jct_ratio']:>17.3f} "
                  f"{s['honest_ratio']:>23.4f} {s['max_honest_ratio']:>7.4f}")
    targets = []
    for lie in LIES:
        s = summary[f"{lie}-checked"]
        targets += [
            {"target": f"{lie} liar, checked: GPU-hours <= {TARGET_GPU_HOURS} x the truth's "
                       "(mean over runs)", "pass": s["gpu_hours_ratio"] <= TARGET_GPU_HOURS,
             "measured": round(s["gpu_hours_ratio"], 3)},
            {"target": f"{lie} liar, checked: honest jobs' average JCT <= {TARGET_HONEST} x the "
                       "truth's (mean over runs)", "pass": s["honest_ratio"] <= TARGET_HONEST,
             "measured": round(s["honest_ratio"], 4)}]
    for t in targets:
        print(f"{'PASS' if t['pass'] else 'FAIL'}  {t['target']}: {t['measured']}")
    write_report(args.out, "lying_job", workloads=workloads, summary=summary, targets=targets,
                 runs=rows)


if __name__ == "__main__":
    main()
