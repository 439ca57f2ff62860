#!/usr/bin/env python3
"""Benchmark: the simulator at production scale (issue 36) -- a 2,000-job Philly-like workload on
1,024 GPUs (256 nodes x 4) with ``jct`` at GPU granularity (the daemon's mode), in at most
10 minutes.

The workload is ``philly:2000`` (2,000 jobs sampled from the Philly summary with the seed,
:func:`hpcsched.sim.workload.sample_philly`) at load 1.0 for the cluster: the sample spreads its
arrivals over 8 h whatever its size, and Pollux's workloads at load 1.0 bring 160 jobs in 8 h to
64 GPUs (20 jobs an hour), so 1,024 GPUs at load ``L`` take ``320 L`` jobs an hour and the
sample's arrival times are scaled onto ``COUNT / (20 L GPUs / 64)`` hours (6.25 h here;
:func:`arrivals_at_load`). It is written as a Pollux CSV beside ``--out`` and replayed by the CLI
in a child process, exactly as one would by hand::

    hpcsched simulate -w bench-results/sim_scale-workload.csv -p jct --granularity gpu \\
        --nodes 256 --gpus-per-node 4 --json bench-results/sim_scale-run.json -q

Figures: the command's wall time (process start and data loading included), its CPU time
(user and system, from the child's resource usage: less affected than the wall time by other
work on the machine), the simulated rounds, the average JCT and the makespan. Target, printed as
a PASS/FAIL line: wall time <= 600 s.

    .venv/bin/python benchmarks/sim_scale.py [--jobs 2000] [--nodes 256] [--gpus-per-node 4]
        [--load 1.0] [--seed 0] [--out bench-results/sim_scale.json]

Writes JSON to ``--out`` (default ``bench-results/sim_scale.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402
from _testbed_workload import POLLUX_CLUSTER_GPUS, write_pollux_csv  # noqa: E402

from hpcsched.sim import WorkloadJob  # noqa: E402
from hpcsched.sim.workload import PHILLY_SPAN, sample_philly  # noqa: E402

#: jobs an hour that Pollux's workloads bring to their 64 GPUs at load 1.0 (160 in 8 h)
POLLUX_RATE = 160 / 8.0
#: issue 36's target: wall time of the whole command, s
TARGET_S = 600.0


def arrivals_at_load(jobs: list[WorkloadJob], gpus: int, load: float) -> list[WorkloadJob]:
    """``jobs`` (a ``philly:COUNT`` sample, arrivals over 8 h) with their submit times scaled
    onto ``COUNT / (POLLUX_RATE x load x gpus / 64)`` hours (to the millisecond): the arrival
    rate per GPU of Pollux's workloads at ``load``. ``load`` 0: the sample's own 8 h."""
    if not load:
        return list(jobs)
    span = len(jobs) / (POLLUX_RATE * load * gpus / POLLUX_CLUSTER_GPUS) * 3600.0
    factor = span / PHILLY_SPAN
    return [replace(j, submit_time=round(j.submit_time * factor, 3)) for j in jobs]


def command(workload: Path, nodes: int, per_node: int, run_json: Path) -> list[str]:
    """The ``hpcsched simulate`` command line (after the program's name) of the benchmark."""
    return ["simulate", "-w", str(workload), "-p", "jct", "--granularity", "gpu",
            "--nodes", str(nodes), "--gpus-per-node", str(per_node), "--json", str(run_json),
            "-q"]


def timed(args: list[str]) -> tuple[float, float, float]:
    """Run ``hpcsched ARGS`` in a child process (this checkout's package); its wall time and
    its user and system CPU time, s. Raises ``CalledProcessError`` when it fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hpcsched", *args], check=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2000, help="jobs sampled from Philly")
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--load", type=float, default=1.0,
                    help="arrival rate per GPU relative to Pollux's load 1.0 (0: the sample's 8 h)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "sim_scale.json"))
    args = ap.parse_args()
    if args.jobs < 1 or args.nodes < 1 or args.gpus_per_node < 1 or args.load < 0:
        ap.error("--jobs, --nodes and --gpus-per-node must be >= 1, --load >= 0")
    out = Path(args.out)
    gpus = args.nodes * args.gpus_per_node
    jobs = arrivals_at_load(sample_philly(args.jobs, seed=args.seed), gpus, args.load)
    workload = write_pollux_csv(jobs, out.with_name(f"{out.stem}-workload.csv"))
    run_json = out.with_name(f"{out.stem}-run.json")
    argv = command(workload, args.nodes, args.gpus_per_node, run_json)
    shown = shlex.join(["hpcsched", *argv])
    print(f"philly:{args.jobs} (seed {args.seed}) at load {args.load:g} on {gpus} GPUs: "
          f"arrivals over {jobs[-1].submit_time / 3600:.2f} h\n{shown}", flush=True)
    wall, user, system = timed(argv)
    run = json.loads(run_json.read_text())["runs"][0]
    verdict = "PASS" if wall <= TARGET_S else "FAIL"
    line = (f"{verdict}  {args.jobs} jobs on {gpus} GPUs: wall {wall:.1f} s <= {TARGET_S:g} s "
            "(issue 36)")
    print(f"wall {wall:.1f} s, CPU {user:.1f} s user + {system:.1f} s system, "
          f"{run['rounds']} rounds; average JCT {run['avg_jct']:.1f} s, makespan "
          f"{run['makespan']:.1f} s, {run['finished']}/{run['jobs']} finished\n{line}")
    write_report(out, "sim_scale", command=shown, jobs=args.jobs, gpus=gpus, nodes=args.nodes,
                 gpus_per_node=args.gpus_per_node, load=args.load, seed=args.seed,
                 arrival_span_s=jobs[-1].submit_time, wall_s=wall, cpu_user_s=user,
                 cpu_system_s=system, rounds=run["rounds"], avg_jct=run["avg_jct"],
                 makespan=run["makespan"], finished=run["finished"], simulated=run,
                 target=line, load_average=os.getloadavg() if hasattr(os, "getloadavg") else None)


if __name__ == "__main__":
    main()
