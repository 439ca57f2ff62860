#!/usr/bin/env python3
"""The jobs of the scale benchmark (``benchmarks/daemon_scale.py``): a Philly-like mix planned
as hpcsub command lines for the light job stand-in (:mod:`hpcsched.job.standin`), and their
submission, run as the jobs' Unix user::

    python benchmarks/_scale_jobs.py PLAN.json      # submits every job of the plan, in order

:func:`plan_jobs` (the benchmark's side, with numpy): ``count`` jobs drawn from the Philly
summary (:func:`hpcsched.sim.workload.sample_philly`: 1 to 64 GPUs, a Pollux application by
GPU-time, the tuned batch size); each asks for its GPUs as whole nodes of ``gpus_per_node``
(fewer GPUs: one node), may grow to twice its GPUs, and has the work its application does in
``duration`` seconds at its submitted size, ``duration`` log-normal (median ``median_s``,
sigma 1, between 5 minutes and 2 hours; seeded), so that some end and pending ones start within
a run of minutes while most outlast it. The submission side imports nothing but hpcsub.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def plan_jobs(count: int, gpus_per_node: int, seed: int = 0, median_s: float = 900.0,
              output: str = "/dev/null") -> list[dict]:
    """``count`` jobs: ``{"argv": hpcsub's arguments, "table": standin.json's content}``."""
    import numpy as np

    from hpcsched.sim.emulate import Emulation
    from hpcsched.sim.workload import sample_philly

    rng = np.random.default_rng(seed)
    tables: dict[str, dict] = {}
    jobs = []
    for wj in sample_philly(count, seed=seed):
        app = wj.application
        if app not in tables:
            tables[app] = Emulation.of(app).step_table(2 * 64, gpus_per_node, points=8)
        nodes = max(1, math.ceil(wj.gpus / gpus_per_node))
        per_node = min(wj.gpus, gpus_per_node)
        gpus = nodes * per_node
        emu = Emulation.of(app)
        batch = max(emu.base_batch_size, min(wj.batch_size, emu.app.max_batch_size))
        local = max(1, batch // gpus)
        step, _ = _step(tables[app], gpus, local)
        duration = float(np.clip(rng.lognormal(math.log(median_s), 1.0), 300.0, 7200.0))
        most = min(2 * gpus, 128)
        table = dict(tables[app], total_samples=int(duration / step * local * gpus),
                     dataset_size=emu.dataset_size(batch),
                     steps={g: rows for g, rows in tables[app]["steps"].items() if int(g) <= most})
        argv = ["--parsable", "-N", str(nodes), f"--gres=gpu:{per_node}", f"--output={output}",
                "--job-name", f"{app}-{len(jobs)}", "--hpcsched-application", app,
                "--hpcsched-max-gpus", str(most), "--hpcsched-batch-size", str(local * gpus),
                str(ROOT / "jobscripts" / "examples" / "emulated.py")]
        jobs.append({"argv": argv, "table": table})
    return jobs


def _step(table: dict, gpus: int, local: int) -> tuple[float, float]:
    from hpcsched.job.standin import StepPhysics

    return StepPhysics(table).step_time(gpus, local, 1)


def submit_plan(path: Path) -> int:
    """Submit every job of the plan at ``path``; prints each job id; exit status 1 if any
    submission failed (the others are submitted)."""
    from hpcsched.job.submit import submit

    failed = 0
    for job in json.loads(path.read_text()):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = submit(job["argv"], launcher="hpcsched.job.standin",
                        files={"standin.json": json.dumps(job["table"])})
        print(out.getvalue().strip() if rc == 0 else f"failed ({rc}): {out.getvalue().strip()}", flush=True)
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(submit_plan(Path(sys.argv[1])))
