#!/usr/bin/env python3
"""Benchmark: what the default periodic checkpoint costs the examples (issue 33: at most 2% of
training time).

Each example in ``jobscripts/examples`` that registers state with its ``ElasticJob`` is run
here without Slurm (``--world`` gloo workers on this machine, the environment the launcher
gives them, a job directory) with a checkpoint forced every ``--every`` seconds, so that it
writes many; rank 0 logs each checkpoint's time (write, fsync, rename and the barrier every rank
waits at: ``hpcsched/job/elastic_boundary.py``). From the median time ``C`` the benchmark
computes the default interval, ``sqrt(2 x C x M)`` (Young/Daly,
:func:`hpcsched.job.checkpoint.young_daly_interval`) for a job of 1, 4 and 16 nodes of the
default node MTBF (7 days, so ``M`` = 7 days / nodes), and its overhead, ``C / interval``:
the share of training time spent writing checkpoints. The examples' models are tiny, so a
synthetic state of ``--state-mb`` MiB (default 1 GiB) is timed too, as rank 0 writes it.

    .venv/bin/python benchmarks/checkpoint_overhead.py [--world 2] [--every 0.5] [--out F]

Prints a table and writes JSON (default ``bench-results/checkpoint_overhead.json``).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402

from hpcsched.job.checkpoint import young_daly_interval  # noqa: E402
from hpcsched.job.launcher import port_is_free  # noqa: E402
from hpcsched.job.submit import NODE_MTBF_S  # noqa: E402
from hpcsched.protocol.env import LaunchEnv  # noqa: E402
from hpcsched.protocol.jobdir import JobDir  # noqa: E402

EXAMPLES = ROOT / "jobscripts" / "examples"
#: example -> its arguments for a run of some seconds
RUNS = {
    "digits_mlp.py": ["--epochs", "30", "--min-step-time", "0.02"],
    "ddp_classifier.py": ["--epochs", "8", "--workers", "0"],
    "emulated.py": ["--application", "cifar10", "--scale", "0.0005"],
}
NODES = (1, 4, 16)
#: runs an example as its own ``__main__`` with hpcsched's INFO log on stderr (the examples
#: configure no logging), where each checkpoint's time is logged
_WRAPPER = ("import logging, runpy, sys; logging.basicConfig(level=logging.INFO); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
_LINE = re.compile(r"checkpoint \S+ \(epoch \d+, position \d+\) in ([0-9.]+) s")


def run_example(name: str, world: int, every: float) -> list[float]:
    """Seconds of each checkpoint of one run of example ``name`` with ``world`` workers."""
    with tempfile.TemporaryDirectory() as tmp:
        jd = JobDir.create(Path(tmp))
        port = next(p for p in range(29700, 29900) if port_is_free(p))
        procs = []
        for rank in range(world):
            env = LaunchEnv(job_dir=str(jd.path), launch=1, nodes=1, workers_per_node=world,
                            world_size=world, checkpoint_interval=every, master_port=port,
                            master_addr="127.0.0.1").to_env()
            env = {**os.environ, **env, "RANK": str(rank),
                   "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "GLOO_SOCKET_IFNAME": "lo",
                   "OMP_NUM_THREADS": "1"}
            procs.append(subprocess.Popen([sys.executable, "-c", _WRAPPER, str(EXAMPLES / name),
                                           *RUNS[name]],
                                          env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        out = [p.communicate(timeout=900)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"{name} failed:\n{out[0][-3000:]}")
    return [float(m.group(1)) for m in _LINE.finditer(out[0])]


def synthetic(mb: int, repeats: int = 3) -> list[float]:
    """Seconds of each of ``repeats`` :meth:`~hpcsched.job.checkpoint.Checkpointer.save` calls
    of a state of ``mb`` MiB (one float32 tensor; rank 0's write, fsync and rename, no
    barrier): what a model of that size costs where the examples' are tiny."""
    import torch

    from hpcsched.job.checkpoint import Checkpointer

    state = {"model": {"w": torch.zeros(mb * 2**18, dtype=torch.float32)}}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        ck = Checkpointer(Path(tmp))
        for i in range(repeats):
            t0 = time.monotonic()
            ck.save(torch, state, i)
            out.append(time.monotonic() - t0)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="workers per run (gloo, this machine)")
    p.add_argument("--every", type=float, default=0.5, help="forced checkpoint interval (s)")
    p.add_argument("--state-mb", type=int, default=1024,
                   help="also a synthetic state of this many MiB (0: none)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "checkpoint_overhead.json")
    args = p.parse_args(argv)
    rows = {}
    print(f"{'example':<20} {'checkpoints':>11} {'median C (s)':>13} "
          + " ".join(f"{f'{n} node(s): interval / overhead':>34}" for n in NODES))
    cases = list(RUNS) + ([f"synthetic {args.state_mb} MiB"] if args.state_mb else [])
    for name in cases:
        t0 = time.time()
        costs = (synthetic(args.state_mb) if name.startswith("synthetic")
                 else run_example(name, args.world, args.every))
        if not costs:
            print(f"{name:<20} no checkpoint logged (the example registers no state?)")
            continue
        c = statistics.median(costs)
        per = {n: (young_daly_interval(c, NODE_MTBF_S / n),) for n in NODES}
        per = {n: (iv, c / iv) for n, (iv,) in per.items()}
        rows[name] = {"checkpoints": len(costs), "median_s": c, "max_s": max(costs),
                      "run_s": time.time() - t0,
                      "by_nodes": {str(n): {"interval_s": iv, "overhead": ov}
                                   for n, (iv, ov) in per.items()}}
        print(f"{name:<20} {len(costs):>11} {c:>13.4f} "
              + " ".join(f"{f'{iv:.0f} s / {100 * ov:.3f}%':>34}" for iv, ov in per.values()))
    worst = max((r["by_nodes"][str(n)]["overhead"] for r in rows.values() for n in NODES),
                default=None)
    if worst is not None:
        print(f"\n{'PASS' if worst <= 0.02 else 'FAIL'}  the default interval's overhead <= 2%: "
              f"worst {100 * worst:.3f}%")
    write_report(args.out, "checkpoint_overhead", world=args.world, every_s=args.every,
                 node_mtbf_s=NODE_MTBF_S, examples=rows, worst_overhead=worst)


if __name__ == "__main__":
    main()
