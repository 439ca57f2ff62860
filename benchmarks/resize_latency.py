#!/usr/bin/env python3
"""Benchmark: what a grow, a shrink and a move cost a running job, three ways.

* **extension** (issue 10): ``hpcsched resize --layout``; GPUs are added as an extension Slurm
  job whose workers join at a step boundary and take the state from rank 0; no worker restarts.
  Grow ``n1:2 -> n1:2,n2:2``, move ``-> n1:2,n3:2``, shrink ``-> n1:2``.
* **requeue** (the actuator's other path): grow ``--nodes 2`` = checkpoint, ``scontrol
  requeue``, resume at the new size; shrink ``--nodes 1`` = checkpoint and release the node in
  place. No move.
* **resubmit** (no hpcsched): a checkpoint asked through the control file, ``scancel``, and a
  new ``hpcsub`` job at the new size (a move: on another node) that restores from it.

For each: **seconds** from the request (the ``hpcsched resize`` command's launch; for resubmit,
the checkpoint request) to the first step at the new size (rank 0's ``applied``
acknowledgement, or the new job's first); the **stall**: the longest gap between two
consecutive steps of rank 0 (the process that runs throughout, where there is one) from one
second before the request to two seconds after the new size is in force, which includes one
ordinary step (~50 ms here); for extension grows and moves, the newcomers' **start-up**
(submission to all ready: ``extensions.json``). The job is the digits example with 2 workers
per node, each step padded to 50 ms, on the dev cluster (started if needed; root).

    .venv/bin/python benchmarks/resize_latency.py [--repeats 3] [--out FILE]

It prints a table and the targets of issue 10, and writes JSON (default
``bench-results/resize_latency.json``).
"""

from __future__ import annotations

import argparse
import json
import os
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

from hpcsched.protocol import files as ctl  # noqa: E402
from hpcsched.protocol.extensions import read_extensions  # noqa: E402
from hpcsched.protocol.jobdir import JobDir  # noqa: E402
from hpcsched.slurm import devcluster  # noqa: E402

EXAMPLE = ROOT / "jobscripts" / "examples" / "digits_mlp.py"
BIN = Path(sys.executable).parent
STEP = 0.05
CHANGES = ("grow", "move", "shrink")
METHODS = ("extension", "requeue", "resubmit")


def sh(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args))} -> exit {proc.returncode}: "
                         f"{proc.stderr.strip()}")
    return proc


def wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


def ack(jd: JobDir, generation: int, state: str = "applied") -> ctl.Ack | None:
    try:
        a = ctl.read_ack(jd.ack_path, jd.uid)
    except ctl.ProtocolError:
        return None
    return a if a and a.generation == generation and a.state == state else None


def submit(workdir: Path, nodes: int, node: str | None = None, extra=()) -> tuple[str, JobDir]:
    """hpcsub the example (2 GPUs per node) and wait for its first step."""
    where = ("-w", node) if node else ()
    out = sh(BIN / "hpcsub", "--parsable", "-N", nodes, *where, "--gres=gpu:2",
             "--output=slurm-%j.out", "--hpcsched-min-nodes", 1, "--hpcsched-max-nodes", 2,
             "--hpcsched-batch-size", 64, "--hpcsched-min-batch-size", 32,
             "--hpcsched-max-batch-size", 256, *extra, EXAMPLE, "--epochs", 1000,
             "--min-step-time", STEP, cwd=workdir).stdout
    job_id = out.strip().split(";")[0]
    jd = JobDir.for_job(job_id)
    wait(lambda: ack(jd, 0), 180, f"job {job_id} to start")
    time.sleep(2.0)   # steady state
    return job_id, jd


def rank0_step_ends(*jds: JobDir) -> list[float]:
    """End times of rank 0's steps (the primary's rank 0, every launch), sorted."""
    ts = []
    for jd in jds:
        for f in jd.metrics_dir.glob("launch-*-rank-0.jsonl"):
            if "-ext-" in f.name:
                continue
            for line in f.read_text().splitlines():
                r = json.loads(line)
                if r.get("rank", 0) == 0:
                    ts.append(r["t"])
    return sorted(ts)


def stall(t0: float, t1: float, *jds: JobDir) -> float:
    """The longest gap between consecutive rank-0 steps ending in [t0 - 1, t1 + 2]."""
    time.sleep(2.5)
    ts = [t for t in rank0_step_ends(*jds) if t0 - 1 <= t <= t1 + 2]
    return max((b - a for a, b in zip(ts, ts[1:])), default=float("nan"))


def resize(job_id: str, jd: JobDir, args: list) -> dict:
    t0 = time.time()
    res = json.loads(sh(BIN / "hpcsched", "resize", job_id, "--json", *args).stdout)
    rec = {"seconds": res["applied"] - t0, "stall": stall(t0, res["applied"], jd)}
    if res["checkpointed"] is not None:
        rec["checkpoint_seconds"] = res["checkpointed"] - t0
    return rec


def run_extension(work: Path) -> tuple[dict, list[str]]:
    job_id, jd = submit(work, 1, "n1")
    out = {}
    for change, layout in zip(CHANGES, ("n1:2,n2:2", "n1:2,n3:2", "n1:2")):
        time.sleep(1.0)
        out[change] = resize(job_id, jd, ["--layout", layout])
        if change in ("grow", "move"):
            ext = read_extensions(jd.extensions_path, jd.uid).extensions[-1]
            out[change]["startup"] = ext.ready_at - ext.submitted_at
    ids = [job_id] + [e.job_id for e in read_extensions(jd.extensions_path, jd.uid).extensions]
    return out, ids


def run_requeue(work: Path) -> tuple[dict, list[str]]:
    job_id, jd = submit(work, 1, "n1")
    out = {"grow": resize(job_id, jd, ["--nodes", "2"])}
    time.sleep(1.0)
    out["shrink"] = resize(job_id, jd, ["--nodes", "1"])
    return out, [job_id]


def checkpoint_now(jd: JobDir) -> tuple[float, ctl.Ack]:
    """Ask the job for a checkpoint as hpcsched would (checkpoint-and-requeue)."""
    c = ctl.read_control(jd.control_path, jd.uid)
    a = ctl.read_ack(jd.ack_path, jd.uid)
    gen = max(c.generation if c else 0, a.generation) + 1
    t0 = time.time()
    ctl.write_control(jd.control_path, ctl.Control(
        job_uid=jd.uid, generation=gen, action="checkpoint-and-requeue", nodes=a.nodes,
        workers_per_node=2, global_batch_size=a.global_batch_size,
        local_batch_size=a.local_batch_size, accumulation_steps=a.accumulation_steps,
        lr_scale=1.0, issued_at=t0, issued_by="benchmark", reason="resubmit: checkpoint"))
    return t0, wait(lambda: ack(jd, gen, "checkpointed"), 120, "the checkpoint")


def run_resubmit(work: Path) -> tuple[dict, list[str]]:
    job_id, jd = submit(work, 1, "n1")
    checkpoints = jd.path / "checkpoints"   # every resubmission restores from and writes here
    ids, out = [job_id], {}
    for change, (nodes, node) in zip(CHANGES, ((2, None), (2, "n3,n4"), (1, None))):
        time.sleep(1.0)
        t0, ck = checkpoint_now(jd)
        sh("scancel", job_id)
        new_id, new_jd = submit(work, nodes, node, extra=("--hpcsched-checkpoint-dir", checkpoints))
        first = ack(new_jd, 0)
        out[change] = {"seconds": first.time - t0, "checkpoint_seconds": ck.time - t0,
                       "stall": stall(t0, first.time, jd, new_jd)}
        job_id, jd = new_id, new_jd
        ids.append(job_id)
    return out, ids


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: dict) -> dict:
    out = {}
    for method, changes in runs.items():
        for change, recs in changes.items():
            out.setdefault(method, {})[change] = {
                key: med(r.get(key) for r in recs)
                for key in ("seconds", "stall", "startup", "checkpoint_seconds")
                if any(key in r for r in recs)}
    return out


def targets(s: dict) -> list[tuple[str, float | None, str, bool | None]]:
    g = s["extension"]["grow"]
    resub = s["resubmit"]["grow"]["seconds"]
    return [
        ("grow stall (extension), s", g["stall"], "<= 1 s + state transfer (~0 here)",
         g["stall"] <= 1.0),
        ("grow decision -> new size - newcomers' start-up, s", g["seconds"] - g["startup"],
         "<= 1 s", g["seconds"] - g["startup"] <= 1.0),
        ("resubmit's time to resume / grow stall", resub / g["stall"], ">= 5", resub / g["stall"] >= 5),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "resize_latency.json")
    args = p.parse_args()

    state = Path(os.environ.get("HPCSCHED_DEVCLUSTER_DIR") or "/var/lib/hpcsched/devcluster")
    os.environ["SLURM_CONF"] = str(devcluster.up(state))
    work = Path(tempfile.mkdtemp(prefix="hpcsched-bench-"))
    os.environ["HPCSCHED_CONTROL_DIR"] = str(work / "jobs")
    runs: dict[str, dict[str, list]] = {m: {} for m in METHODS}
    submitted: list[str] = []
    try:
        for rep in range(args.repeats):
            for method, fn in (("extension", run_extension), ("requeue", run_requeue),
                               ("resubmit", run_resubmit)):
                res, ids = fn(work)
                submitted += ids
                subprocess.run(["scancel", *ids], capture_output=True)
                for change, rec in res.items():
                    runs[method].setdefault(change, []).append(rec)
                    print(f"[{rep}] {method:<9} {change:<6} {rec['seconds']:6.2f} s, stall "
                          f"{rec['stall']:6.2f} s", flush=True)
                time.sleep(2.0)
    finally:
        subprocess.run(["scancel", *submitted], capture_output=True)

    summary = summarize(runs)
    fmt = lambda v: f"{v:.2f}" if v is not None else "-"  # noqa: E731
    print(f"\n{'method':<10} {'change':<7} {'seconds':>8} {'stall':>7} {'start-up':>9} "
          f"{'checkpoint':>11}   (medians of {args.repeats}; seconds)")
    for method in METHODS:
        for change in CHANGES:
            r = summary[method].get(change)
            if r is None:
                print(f"{method:<10} {change:<7} {'-':>8} {'-':>7} {'-':>9} {'-':>11}")
                continue
            print(f"{method:<10} {change:<7} {fmt(r.get('seconds')):>8} {fmt(r.get('stall')):>7} "
                  f"{fmt(r.get('startup')):>9} {fmt(r.get('checkpoint_seconds')):>11}")
    print("\ntargets (issue 10):")
    checks = targets(summary)
    for name, value, want, ok in checks:
        print(f"  {name:<52} {fmt(value):>7}  {want:<36} {'PASS' if ok else 'FAIL'}")
    write_report(args.out, "resize_latency", repeats=args.repeats, summary=summary, runs=runs,
                 targets=[{"name": n, "value": v, "target": w, "pass": ok}
                          for n, v, w, ok in checks])
    return 0


if __name__ == "__main__":
    sys.exit(main())
