#!/usr/bin/env python3
"""Benchmark: ``jct`` settings against issue 35's targets, a load at a time.

For each ``--setting`` (a JSON object of ``jct``'s parameters, as ``--param jct.KEY=VALUE``
gives them: ``hesrpt``, ``makespan_guard``, ``tail_after``, ...) and each load, runs ``jct`` on
Pollux's workloads 1-8 at ``gpu`` granularity (the setting of ``docs/evaluation.md`` section 2,
through the evaluation's runner and its cache) and the anchors ``pollux``, ``sia`` and ``wham``
beside it, then prints the means over the workloads of average JCT, p99 JCT and makespan as
ratios to ``pollux``'s, and whether the setting meets issue 35's three targets at that load
(``anchors.verdict``, as ``benchmarks/anchors.py`` judges): average JCT at most ``wham``'s
and 0.85 x min(``pollux``, ``sia``); p99 at most every anchor's; makespan at most 1.02 x
``pollux``'s. Section 13 of
``docs/evaluation.md`` is made of these rows.

    .venv/bin/python benchmarks/jct_settings.py --loads 2.0 \\
        --setting '{"hesrpt": 0.4, "makespan_guard": 1.5, "tail_after": 1800}' [--setting ...] [--jobs 2]

Writes JSON to ``--out`` (default ``bench-results/jct_settings.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _evaluation_runs import execute_all, make_run  # noqa: E402
from _report import write_report  # noqa: E402
from _run_cache import RunCache, code_version  # noqa: E402
from anchors import ANCHORS, FIGURES, WORKLOADS, verdict  # noqa: E402

from hpcsched.sim.cli import single_threaded_blas  # noqa: E402


def label(setting: dict) -> str:
    """``h0.4-g1.5-1800`` for heSRPT's exponent, the guard and ``tail_after``; other keys as
    ``key=value``."""
    short = {"hesrpt": "h", "makespan_guard": "g", "tail_after": ""}
    parts = [f"{short[k]}{setting[k]:g}" for k in short if k in setting]
    parts += [f"{k}={v}" for k, v in sorted(setting.items()) if k not in short]
    return "-".join(parts) or "jct"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", default="2.0", help="comma-separated loads")
    p.add_argument("--setting", action="append", required=True, type=json.loads,
                   help="jct's parameters as a JSON object (repeatable)")
    p.add_argument("--jobs", type=int, default=2, help="simulations at once (processes)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "jct_settings.json")
    args = p.parse_args(argv)
    if not all(isinstance(s, dict) for s in args.setting):
        p.error("--setting: a JSON object, e.g. '{\"hesrpt\": 0.4}'")
    loads = args.loads.split(",")
    runs = {(label(s), "jct", w, x): make_run(f"pollux:{w}@{x}", "jct", granularity="gpu", params=s)
            for s in args.setting for x in loads for w in WORKLOADS}
    runs |= {(a, a, w, x): make_run(f"pollux:{w}@{x}", a, granularity="gpu")
             for a in ANCHORS for x in loads for w in WORKLOADS}
    t0 = time.time()
    with single_threaded_blas():
        out = execute_all(runs, args.jobs, RunCache(code_version()))
    means = {(name, x): {f: statistics.mean(out[(name, pol, w, x)][1][f] for w in WORKLOADS) for f in FIGURES}
             for (name, pol, w, x) in runs if w == WORKLOADS[0]}
    rows = []
    for x in loads:
        anchors = {a: means[(a, x)] for a in ANCHORS}
        pol = anchors["pollux"]
        print(f"\nload {x}: ratios to pollux's (avg {pol['avg_jct']:,.0f} s, p99 {pol['p99_jct']:,.0f} s, "
              f"makespan {pol['makespan']:,.0f} s)")
        for name in (*ANCHORS, *(label(s) for s in args.setting)):
            m = means[(name, x)]
            ratios = [m[f] / pol[f] for f in FIGURES]
            met = verdict(m, anchors) if name not in ANCHORS else None
            text = "" if met is None else ("  meets all" if all(met.values()) else
                                           "  misses: " + "; ".join(k for k, ok in met.items() if not ok))
            print(f"  {name:<24} " + " / ".join(f"{r:.3f}" for r in ratios) + text)
            rows.append({"load": x, "setting": name, **m, "ratios_to_pollux": ratios, "targets": met})
    write_report(args.out, "jct_settings", loads=loads, settings=args.setting, rows=rows,
                 wall_seconds=time.time() - t0)


if __name__ == "__main__":
    main()
