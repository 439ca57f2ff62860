#!/usr/bin/env python3
"""Benchmark: ``jct`` without perfect knowledge of the jobs' remaining work (issue 35).

``jct`` ranks jobs by the remaining work they report (``ElasticJob.set_work``, epochs x data
set). Pollux and Sia know nothing of it. This what-if runs ``jct`` on Pollux's workloads at
``gpu`` granularity (the daemon's rules; the setting of ``docs/evaluation.md`` section 2) with
its knowledge degraded through its own parameters (:mod:`hpcsched.policies.jct`):

``exact``
    the reports as they are (the evaluation's ``jct``);
``noise-0.5``, ``noise-1.0``
    each job's report seen times ``exp(sigma z)``, ``z`` standard normal and fixed per job
    (``--param jct.work_noise=SIGMA``): a log-normal error of median 1;
``none``
    no report used (``--param jct.work_known=false``): every job's remaining work is
    ``unknown_remaining`` (3,600) seconds at its goodput, as for a job that reports none.

and prints each variant's mean average JCT over the workloads, per load, and its ratio to
``pollux``'s from the evaluation's results (``--evaluation``, default
``bench-results/evaluation.json``, written by ``benchmarks/evaluation.py``; its ``gpu`` grid
rows), or from ``pollux`` runs made here when that file has none. Issue 35's target: ``noise-1.0``
at most 0.90 x ``pollux`` at every load.

    .venv/bin/python benchmarks/knowledge_whatif.py [--loads 1.0] [--jobs 2] [--out F] [--docs docs]

Writes JSON (default ``bench-results/knowledge_whatif.json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _evaluation_render as render  # noqa: E402
import _evaluation_runs  # noqa: E402
import _evaluation_slurm  # noqa: E402
import anchors  # noqa: E402
from _evaluation_runs import execute_all, make_run  # noqa: E402
from _report import write_report  # noqa: E402
from _run_cache import RunCache, code_version  # noqa: E402

from hpcsched.sim.cli import single_threaded_blas  # noqa: E402

VARIANTS = {"exact": {}, "noise-0.5": {"work_noise": 0.5}, "noise-1.0": {"work_noise": 1.0},
            "none": {"work_known": False}}
WORKLOADS = range(1, 9)


def pollux_means(path: Path, loads) -> dict[str, float]:
    """``load -> pollux``'s mean average JCT over workloads 1-8 at ``gpu`` granularity, from an
    evaluation results file (loads it lacks are left out; :func:`anchors.pollux_means`)."""
    return {load: m["avg_jct"] for load, m in anchors.pollux_means(path, loads).items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", default="1.0", help="comma-separated loads (0.5,1.0,1.5,2.0)")
    p.add_argument("--jobs", type=int, default=2, help="simulations at once (processes)")
    p.add_argument("--evaluation", type=Path, default=ROOT / "bench-results" / "evaluation.json")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "knowledge_whatif.json")
    p.add_argument("--docs", type=Path, default=None,
                   help="also write section 9 of DOCS/evaluation.md from this run")
    _evaluation_slurm.add_options(p)
    args = p.parse_args(argv)
    _evaluation_runs.SLURM = _evaluation_slurm.options(args)
    loads = args.loads.split(",")
    anchor = pollux_means(args.evaluation, loads)
    # keys (variant, policy, workload, load): execute_all runs pollux and high loads first
    runs = {(v, "jct", w, load): make_run(f"pollux:{w}@{load}", "jct", granularity="gpu",
                                          params=params)
            for v, params in VARIANTS.items() for load in loads for w in WORKLOADS}
    runs |= {("pollux", "pollux", w, load): make_run(f"pollux:{w}@{load}", "pollux", granularity="gpu")
             for load in loads if load not in anchor for w in WORKLOADS}
    t0 = time.time()
    with single_threaded_blas():
        out = execute_all(runs, args.jobs, RunCache(code_version()))
    means = {(k[0], k[3]): statistics.mean(out[(k[0], k[1], w, k[3])][1]["avg_jct"] for w in WORKLOADS)
             for k in out if k[2] == 1}
    for load in loads:
        anchor.setdefault(load, means.get(("pollux", load)))
    print(f"\n{'variant':<10} " + " ".join(f"{f'load {x}: avg JCT / x pollux':>30}" for x in loads))
    figures = {}
    for v in VARIANTS:
        cells = []
        for load in loads:
            m = means[(v, load)]
            figures[f"{v}@{load}"] = {"avg_jct": m, "vs_pollux": m / anchor[load]}
            cells.append(f"{m:>10,.0f} s / {m / anchor[load]:.3f}")
        print(f"{v:<10} " + " ".join(f"{c:>30}" for c in cells))
    print("pollux     " + " ".join(f"{anchor[x]:>28,.0f} s" for x in loads))
    worst = max(figures[f"noise-1.0@{x}"]["vs_pollux"] for x in loads)
    print(f"\n{'PASS' if worst <= 0.90 else 'FAIL'}  jct with sigma 1.0 noise <= 0.90 x pollux at "
          f"every load run: worst {worst:.3f}")
    write_report(args.out, "knowledge_whatif", loads=loads, pollux=anchor, figures=figures,
                 wall_seconds=time.time() - t0,
                 per_workload={f"{k[0]}@{k[3]}/w{k[2]}": s["avg_jct"] for k, (_, s) in out.items()})
    if args.docs:
        doc = args.docs / "evaluation.md"
        render.write_section(doc, SECTION, section(loads, anchor, figures, args))
        print(f"wrote section 9 of {doc}")


SECTION = "## 9. `jct` without perfect knowledge of the remaining work"


def section(loads, anchor, figures, args) -> list[str]:
    """Section 9 of docs/evaluation.md from this run's figures."""
    head = "| variant | " + " | ".join(f"load {x}" for x in loads) + " |"
    rows = [head, "|---|" + "---:|" * len(loads)]
    for v in VARIANTS:
        rows.append(f"| `{v}` | " + " | ".join(
            f"{figures[f'{v}@{x}']['avg_jct']:,.0f} s ({figures[f'{v}@{x}']['vs_pollux']:.3f})"
            for x in loads) + " |")
    rows.append("| `pollux` | " + " | ".join(f"{anchor[x]:,.0f} s" for x in loads) + " |")
    cmd = f".venv/bin/python benchmarks/knowledge_whatif.py --loads {','.join(loads)} --docs docs"
    return [f"{SECTION}\n",
            f"Generated by `{cmd}` on {time.strftime('%Y-%m-%d')}. `jct` ranks jobs by the "
            "remaining work they report; Pollux and Sia know nothing of it. Here `jct` sees each "
            "job's report times a log-normal error of median 1 fixed per job (`--param "
            "jct.work_noise=0.5`, `1.0`), or no report at all (`--param jct.work_known=false`: every "
            "job's remaining work is 3,600 s at its goodput, as for a job that reports none). Pollux "
            "workloads 1-8, `--granularity gpu`, the section 2 setting; mean average JCT, and in "
            "brackets over `pollux`'s of section 2.\n",
            "\n".join(rows) + "\n"]


if __name__ == "__main__":
    main()
