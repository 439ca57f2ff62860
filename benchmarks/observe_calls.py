#!/usr/bin/env python3
"""Benchmark: what one daemon observation costs, in Slurm calls and wall time, as jobs pile up.

It measures ``Backend.observe()`` (``hpcsched.slurm.observe``; the CLI backend unless ``--backend``
says otherwise) over ``--rounds`` rounds in two phases:

* **baseline**: whatever the cluster holds now (other users' jobs included);
* **loaded**: after submitting ``--jobs`` held jobs, one ``sbatch --hold --wrap true`` each
  (individual jobs, submitted ``--parallel`` at a time: a held ``--array`` would not do, since
  Slurm 22.05's ``squeue --json`` lists a pending array as one record, e.g.
  ``array_task_string: "0-199"``).

Per round it records the Slurm calls made (the backend's ``calls`` counter; 2 expected whatever
the number of jobs) and the wall time of ``observe()`` in seconds; it reports median, p95 (nearest
rank) and max. For scale, it also times one round of the per-job alternative, one
``scontrol show job -o <id>`` per submitted job. All submitted jobs are cancelled at the end,
whatever happens. Needs the local dev cluster (``hpcsched devcluster up``, started here if it
is down, which needs root). Prints a table and writes JSON (``--out``, default
``bench-results/observe_calls.json``)::

    /work/venv/bin/python benchmarks/observe_calls.py [--jobs 200] [--rounds 20] [--backend cli]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402

from hpcsched.slurm import devcluster  # noqa: E402
from hpcsched.slurm.observe import make_backend  # noqa: E402

JOB_NAME = "hpcsched-bench-observe"


def sh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} -> exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def submit_held(n: int, parallel: int, ids: list[str]) -> float:
    """Submit ``n`` held jobs, appending their ids to ``ids`` as they come; returns seconds."""
    def one(_: int) -> str:
        out = sh("sbatch", "--parsable", "--hold", "-J", JOB_NAME, "-o", "/dev/null",
                 "--wrap", "true").stdout
        return out.strip().split(";")[0]

    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for jid in pool.map(one, range(n)):
            ids.append(jid)
    return time.perf_counter() - t


def cancel(ids: list[str]) -> None:
    for k in range(0, len(ids), 100):
        subprocess.run(["scancel", *ids[k:k + 100]], capture_output=True, timeout=60)


def p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def measure(backend, rounds: int, expect: list[str]) -> dict:
    calls, walls, njobs = [], [], []
    for _ in range(rounds):
        before = backend.calls
        t = time.perf_counter()
        obs = backend.observe()
        walls.append(time.perf_counter() - t)
        calls.append(backend.calls - before)
        njobs.append(len(obs.jobs))
        missing = [j for j in expect if j not in obs.jobs or obs.jobs[j].state != "PENDING"]
        if missing:
            raise SystemExit(f"observe() does not show {len(missing)} held jobs as PENDING, "
                             f"e.g. {missing[:5]}")
    return {
        "rounds": rounds,
        "jobs_listed": {"min": min(njobs), "max": max(njobs)},
        "calls_per_round": {"min": min(calls), "max": max(calls), "all": calls},
        "wall_s": {"median": statistics.median(walls), "p95": p95(walls), "max": max(walls),
                   "all": walls},
    }


def naive_round(ids: list[str]) -> dict:
    """One ``scontrol show job -o`` per job: the per-job alternative, once."""
    t = time.perf_counter()
    for jid in ids:
        sh("scontrol", "show", "job", "-o", jid, timeout=20)
    return {"calls": len(ids), "wall_s": time.perf_counter() - t}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=200, help="held jobs to submit (default 200)")
    p.add_argument("--rounds", type=int, default=20, help="observe() rounds per phase (default 20)")
    p.add_argument("--backend", default="cli", choices=("auto", "cli", "pyslurm"))
    p.add_argument("--parallel", type=int, default=16, help="concurrent sbatch (default 16)")
    p.add_argument("--no-naive", action="store_true", help="skip the per-job scontrol round")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "observe_calls.json")
    args = p.parse_args()

    state = devcluster.default_state_dir()
    if not devcluster.is_up(state):
        print("dev cluster is down: starting it", flush=True)
    os.environ["SLURM_CONF"] = str(devcluster.up(state))  # no-op when already up

    backend = make_backend(args.backend)
    release = sh("sinfo", "--version").stdout.strip()        # e.g. "slurm-wlm 22.05.8"
    ids: list[str] = []
    try:
        baseline = measure(backend, args.rounds, [])
        submit_s = submit_held(args.jobs, args.parallel, ids)
        print(f"submitted {len(ids)} held jobs in {submit_s:.2f} s", flush=True)
        loaded = measure(backend, args.rounds, ids)
        squeue_bytes = len(sh("squeue", "--json").stdout.encode())
        naive = None if args.no_naive else naive_round(ids)
    finally:
        cancel(ids)
        print(f"cancelled {len(ids)} jobs", flush=True)

    print(f"\nbackend={backend.name}  rounds={args.rounds}  {release}")
    print(f"{'phase':<10} {'jobs listed':>11} {'calls/round':>11} {'median ms':>10} "
          f"{'p95 ms':>8} {'max ms':>8}")
    for name, ph in (("baseline", baseline), (f"+{args.jobs} held", loaded)):
        c, w, j = ph["calls_per_round"], ph["wall_s"], ph["jobs_listed"]
        calls = str(c["min"]) if c["min"] == c["max"] else f"{c['min']}-{c['max']}"
        jobs = str(j["min"]) if j["min"] == j["max"] else f"{j['min']}-{j['max']}"
        print(f"{name:<10} {jobs:>11} {calls:>11} {w['median'] * 1e3:>10.1f} "
              f"{w['p95'] * 1e3:>8.1f} {w['max'] * 1e3:>8.1f}")
    print(f"squeue --json with the held jobs: {squeue_bytes / 1024:.0f} KiB")
    if naive:
        print(f"per-job alternative (scontrol show job -o, once): {naive['calls']} calls, "
              f"{naive['wall_s']:.2f} s")

    write_report(args.out, "observe_calls",
                 slurm=release,
                 backend=backend.name,
                 held_jobs=args.jobs,
                 submit_s=submit_s,
                 squeue_json_bytes=squeue_bytes,
                 baseline=baseline,
                 loaded=loaded,
                 per_job_scontrol=naive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
