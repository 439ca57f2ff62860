"""Section 7 of docs/evaluation.md: how long a decision and a simulation take (issue 9's timing
targets), rendered from the JSON that ``benchmarks/policy_decision.py`` and
``benchmarks/sim_walltime.py`` write. Those benchmarks pin themselves to one core and must run on
a machine doing nothing else, so ``benchmarks/evaluation.py`` does not run them: ``--timings``
rewrites this section from their latest results, and the full run carries it over."""

from __future__ import annotations

import json
from pathlib import Path

TIMING_SECTION = "## 7. Decision time and simulator wall time"
DECISION = ("policy_decision.json", "policy_decision_pollux.json")
WALLTIME = "sim_walltime.json"


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _scale(key: str) -> str:
    g, j = key.split("x")
    return f"{int(g):,} GPUs / {int(j):,} jobs"


def decision_table(report: dict) -> list[str]:
    """One table per granularity: cold median decision time, ms wall (CPU), per policy and
    scale; then the benchmark's own target lines."""
    tm = report.get("throughput_model")
    out = [f"`benchmarks/policy_decision.py --model {report.get('model', 'linear')}"
           f"{f' --throughput-model {tm}' if tm and report.get('model') == 'pollux' else ''}` "
           f"({report.get('time', '?')}, {report.get('machine', {}).get('cpus', '?')} CPUs, "
           f"pinned to one; median of {report.get('repeats', '?')} cold decisions):\n"]
    for gran, per in report.get("results", {}).items():
        scales = sorted({k for row in per.values() for k in row}, key=lambda k: int(k.split("x")[0]))
        out += [f"*{gran} granularity*, ms wall (CPU)\n",
                "| policy | " + " | ".join(_scale(s) for s in scales) + " |",
                "|---|" + "---:|" * len(scales)]
        for policy, row in per.items():
            cells = [f"{row[s]['median_s'] * 1e3:.1f} ({row[s]['cpu_median_s'] * 1e3:.1f})" if s in row
                     else "-" for s in scales]
            out.append(f"| `{policy}` | " + " | ".join(cells) + " |")
        out.append("")
    # the benchmark's verdicts, without those on policies this run did not measure
    out += [f"- {line}" for line in report.get("targets", []) if line.startswith(("PASS", "FAIL"))]
    return out + [""]


def walltime_table(report: dict) -> list[str]:
    """Median wall time of one simulation of a 160-job workload, per policy and granularity."""
    wls = ", ".join(report.get("workloads", []))
    out = [f"`benchmarks/sim_walltime.py` ({report.get('time', '?')}; Pollux workloads {wls} at "
           "load 1.0, one core): seconds per simulation, median (max; CPU median)"
           + (f" over the workloads, each the fastest of {report['repeats']} runs" if report.get("repeats")
              else "") + "\n",
           "| policy | granularity | median | max | CPU |", "|---|---|---:|---:|---:|"]
    for gran, per in report.get("per_policy", {}).items():
        for policy, r in per.items():
            out.append(f"| `{policy}` | {gran} | {r['median_s']:.2f} | {r['max_s']:.2f} | "
                       f"{r['cpu_median_s']:.2f} |")
    out += [""] + [f"- {line}" for line in report.get("targets", [])] + [""]
    return out


def timing_section(results: Path) -> list[str]:
    """Section 7's lines from the JSON files in ``results`` (a line says which is missing)."""
    out = [TIMING_SECTION + "\n",
           "Rendered by `.venv/bin/python benchmarks/evaluation.py --timings` from the latest "
           "results of the two benchmarks below (each pins itself to one core: run them on an "
           "otherwise idle machine). Issue 9's targets: `jct` decides in <= 50 ms at 64 GPUs / "
           "160 jobs and <= 1 s at 4,096 GPUs / 1,000 jobs, cold, at `gpu` granularity, with "
           "`pollux`'s figures beside it; a 160-job simulation with `jct` at `gpu` granularity "
           "takes <= 5 s.\n"]
    for name in DECISION:
        report = _load(results / name)
        if report is not None:
            out += decision_table(report)
        elif name == DECISION[0]:
            out.append(f"- `bench-results/{name}`: not measured yet "
                       "(`benchmarks/policy_decision.py --policies jct,pollux`)\n")
    report = _load(results / WALLTIME)
    out += walltime_table(report) if report is not None else [
        f"- `bench-results/{WALLTIME}`: not measured yet (`benchmarks/sim_walltime.py "
        "--policies jct,pollux --granularity gpu`)\n"]
    return out
