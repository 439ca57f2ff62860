#!/usr/bin/env python3
"""Benchmark: ``jct`` against the anchors ``pollux``, ``sia`` and ``wham``, and its makespan
guard (issue 35).

Runs, on Pollux's workloads 1-8 at ``gpu`` granularity (the daemon's rules; the setting of
``docs/evaluation.md`` section 2), per load:

``sia``, ``wham``
    the two policies at their defaults (:mod:`hpcsched.policies.sia`, :mod:`hpcsched.policies.wham`);
``jct``
    the default policy as it is;
``jct-guard``
    with its makespan guard (``--param jct.makespan_guard=1.2``: once nothing is pending, every
    job gets at least the GPUs that end it within 1.2 x the jobs' earliest common finish,
    :mod:`hpcsched.policies.jct_tail`);
``jct-guard-late``
    the same once nothing has been submitted for 30 minutes either (``jct.tail_after=1800``);

and takes ``pollux``'s from the evaluation's results (``--evaluation``, default
``bench-results/evaluation.json``, its ``gpu`` grid rows; runs ``pollux`` here for a load the
file lacks). With ``--bound`` (default ``bench-results/jct_bound.json``, written by
``benchmarks/jct_bound.py``) also each policy's average JCT over the lower bound of
``docs/evaluation.md`` section 6 (the larger of the isolated and the capacity bound, per
workload). Prints, per load, each policy's mean average JCT, mean p99 JCT and mean makespan
over the workloads, and checks issue 35's targets for each ``jct`` variant: average JCT at
most 0.85 x min(``pollux``, ``sia``) and at most ``wham``'s; p99 no worse than any of them;
makespan at most 1.02 x ``pollux``'s.

    .venv/bin/python benchmarks/anchors.py [--loads 0.5,1.0,1.5,2.0] [--jobs 2] [--out F] [--docs docs]

Writes JSON (default ``bench-results/anchors.json``).
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

import _evaluation_render as render  # noqa: E402
from _evaluation_runs import execute_all, make_run  # noqa: E402
from _report import write_report  # noqa: E402
from _run_cache import RunCache, code_version  # noqa: E402

from hpcsched.sim.cli import single_threaded_blas  # noqa: E402

#: name -> (policy, its parameters)
VARIANTS = {"sia": ("sia", {}), "wham": ("wham", {}), "jct": ("jct", {}),
            "jct-guard": ("jct", {"makespan_guard": 1.2}),
            "jct-guard-late": ("jct", {"makespan_guard": 1.2, "tail_after": 1800.0})}
JCT_VARIANTS = ("jct", "jct-guard", "jct-guard-late")
WORKLOADS = range(1, 9)
FIGURES = ("avg_jct", "p99_jct", "makespan")


def pollux_means(path: Path, loads) -> dict[str, dict[str, float]]:
    """``load -> {figure: pollux's mean over workloads 1-8}`` at ``gpu`` granularity, from an
    evaluation results file (loads it lacks are left out)."""
    if not path.exists():
        return {}
    rows = [r for r in json.loads(path.read_text())["runs"]
            if r.get("experiment") == "grid" and r.get("policy") == "pollux"
            and r.get("granularity") == "gpu" and not r.get("variability")]
    out = {}
    for load in loads:
        sel = [r for r in rows if r["load"] == load]
        if len(sel) == len(WORKLOADS):
            out[load] = {f: statistics.mean(r[f] for r in sel) for f in FIGURES}
    return out


def lower_bounds(path: Path, loads) -> dict[str, float]:
    """``load -> the mean lower bound on average JCT`` (s) from ``benchmarks/jct_bound.py``'s
    results (``lower_bound_s``); loads it lacks, or no file, are left out."""
    if not path.exists():
        return {}
    got = json.loads(path.read_text()).get("lower_bound_s", {})
    return {x: float(got[x]) for x in loads if x in got}


def checks(means: dict, loads) -> list[tuple[str, bool, str]]:
    """Issue 35's targets for each ``jct`` variant, at every load run."""
    out = []
    for v in JCT_VARIANTS:
        avg = max(means[(v, x)]["avg_jct"] / min(means[("pollux", x)]["avg_jct"],
                                                 means[("sia", x)]["avg_jct"]) for x in loads)
        wham = max(means[(v, x)]["avg_jct"] / means[("wham", x)]["avg_jct"] for x in loads)
        p99 = max(means[(v, x)]["p99_jct"] / min(means[(o, x)]["p99_jct"] for o in ("pollux", "sia", "wham"))
                  for x in loads)
        mk = max(means[(v, x)]["makespan"] / means[("pollux", x)]["makespan"] for x in loads)
        out += [(f"{v}: avg JCT <= 0.85 x min(pollux, sia)", avg <= 0.85, f"worst {avg:.3f}"),
                (f"{v}: avg JCT <= wham's", wham <= 1.0, f"worst {wham:.3f}"),
                (f"{v}: p99 JCT <= every anchor's", p99 <= 1.0, f"worst {p99:.3f}"),
                (f"{v}: makespan <= 1.02 x pollux", mk <= 1.02, f"worst {mk:.3f}")]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", default="0.5,1.0,1.5,2.0", help="comma-separated loads")
    p.add_argument("--jobs", type=int, default=2, help="simulations at once (processes)")
    p.add_argument("--evaluation", type=Path, default=ROOT / "bench-results" / "evaluation.json")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "anchors.json")
    p.add_argument("--bound", type=Path, default=ROOT / "bench-results" / "jct_bound.json",
                   help="benchmarks/jct_bound.py's results: the lower bound per load")
    p.add_argument("--docs", type=Path, default=None,
                   help="also write section 11 of DOCS/evaluation.md from this run")
    args = p.parse_args(argv)
    loads = args.loads.split(",")
    anchor = pollux_means(args.evaluation, loads)
    # keys (variant, policy, workload, load): execute_all runs pollux and high loads first
    runs = {(v, pol, w, load): make_run(f"pollux:{w}@{load}", pol, granularity="gpu", params=params)
            for v, (pol, params) in VARIANTS.items() for load in loads for w in WORKLOADS}
    runs |= {("pollux", "pollux", w, load): make_run(f"pollux:{w}@{load}", "pollux", granularity="gpu")
             for load in loads if load not in anchor for w in WORKLOADS}
    t0 = time.time()
    with single_threaded_blas():
        out = execute_all(runs, args.jobs, RunCache(code_version()))
    means = {(v, load): {f: statistics.mean(out[(v, pol, w, load)][1][f] for w in WORKLOADS)
                         for f in FIGURES}
             for (v, pol, w1, load) in out if w1 == 1}
    for load, m in anchor.items():
        means[("pollux", load)] = m
    names = ("pollux", *VARIANTS)
    for load in loads:
        print(f"\nload {load}: {'policy':<15} {'avg JCT':>10} {'p99 JCT':>10} {'makespan':>10}")
        for v in names:
            m = means[(v, load)]
            print(f"          {v:<15} {m['avg_jct']:>10,.0f} {m['p99_jct']:>10,.0f} {m['makespan']:>10,.0f}")
    bound = lower_bounds(args.bound, loads)
    if bound:
        print("\navg JCT / lower bound: " + "; ".join(
            f"{v} " + " ".join(f"{means[(v, x)]['avg_jct'] / bound[x]:.2f}" for x in loads if x in bound)
            for v in names))
    results = checks(means, loads)
    print()
    for name, ok, text in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {text}")
    write_report(args.out, "anchors", loads=loads,
                 means={f"{v}@{x}": means[(v, x)] for v in names for x in loads},
                 checks=[{"check": n, "pass": ok, "detail": t} for n, ok, t in results],
                 wall_seconds=time.time() - t0,
                 per_workload={f"{k[0]}@{k[3]}/w{k[2]}": {f: s[f] for f in FIGURES}
                               for k, (_, s) in out.items()})
    if args.docs:
        doc = args.docs / "evaluation.md"
        doc.write_text(render.replace_section(doc.read_text() if doc.exists() else "",
                                              SECTION, section(loads, means, results, bound)))
        print(f"wrote section 11 of {doc}")


SECTION = "## 11. The anchors `sia` and `wham`, and `jct`'s makespan guard"


def section(loads, means, results, bound) -> list[str]:
    """Section 11 of docs/evaluation.md from this run's figures."""
    names = ("pollux", *VARIANTS)
    parts = [f"{SECTION}\n"]
    cmd = f".venv/bin/python benchmarks/anchors.py --loads {','.join(loads)} --docs docs"
    parts.append(
        f"Generated by `{cmd}` on {time.strftime('%Y-%m-%d')}. Pollux workloads 1-8, "
        "`--granularity gpu`, the section 2 setting; means over the workloads; `pollux` is "
        "section 2's. `sia` and `wham`: `docs/simulator.md`. `jct-guard`: `jct` with "
        "`makespan_guard = 1.2` (once nothing is pending, every job gets at least the GPUs that "
        "end it within 1.2 x the jobs' earliest common finish, `hpcsched/policies/jct_tail.py`); "
        "`jct-guard-late`: the same once nothing has been submitted for 30 minutes either "
        "(`tail_after = 1800`). The guard is off by default.\n")
    for fig, title in (("avg_jct", "Average JCT (s)"), ("p99_jct", "p99 JCT (s)"),
                       ("makespan", "Makespan (s)")):
        rows = [f"**{title}**\n", "| policy | " + " | ".join(f"load {x}" for x in loads) + " |",
                "|---|" + "---:|" * len(loads)]
        for v in names:
            rows.append(f"| `{v}` | " + " | ".join(f"{means[(v, x)][fig]:,.0f}" for x in loads) + " |")
        parts.append("\n".join(rows) + "\n")
    if all(x in bound for x in loads):
        rows = ["**Average JCT over the lower bound** (section 6: the larger of the isolated and "
                "the capacity bound, per workload; " + ", ".join(f"{bound[x]:,.0f} s at load {x}"
                                                                for x in loads) + ")\n",
                "| policy | " + " | ".join(f"load {x}" for x in loads) + " |",
                "|---|" + "---:|" * len(loads)]
        for v in names:
            rows.append(f"| `{v}` | " + " | ".join(f"{means[(v, x)]['avg_jct'] / bound[x]:.2f}"
                                                    for x in loads) + " |")
        parts.append("\n".join(rows) + "\n")
    parts.append("Issue 35's targets, at every load:\n\n" + "\n".join(
        f"* {'PASS' if ok else 'FAIL'}: {name} ({text})" for name, ok, text in results) + "\n")
    return parts


if __name__ == "__main__":
    main()
