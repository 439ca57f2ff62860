#!/usr/bin/env python3
"""Benchmark: time from a resize request to the first training step at the new size.

Three changes: batch size only (64 -> 128, 2 nodes); shrink (2 -> 1 node); grow (1 -> 2 nodes).

* **hpcsched**: ``hpcsched resize --json`` on the running job. The clock starts when the command
  is launched (so Python start-up is included). It stops at the job's ``applied``
  acknowledgement, which rank 0 writes at the start of the first step at the new configuration.
  The checkpoint share (request -> ``checkpointed``) is reported beside it.
* **naive**: the same change without hpcsched's actuator. The job is asked for a checkpoint
  through the same mechanism, so the checkpoint costs the same, then ``scancel`` and a
  resubmission with ``hpcsub`` at the new size that restores from that checkpoint. The clock
  starts at the checkpoint request and stops at the new job's first step.

It runs on the local dev cluster (``hpcsched devcluster up``, 4 nodes x 4 GPUs, started if
needed, which needs root) with the digits example at 2 workers per node, padded to 20 ms a step.
It prints a table and writes JSON (``--out``, default ``bench-results/resize_latency.json``):

    .venv/bin/python benchmarks/resize_latency.py [--repeats 3]
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
from hpcsched.protocol.jobdir import JobDir  # noqa: E402
from hpcsched.slurm import devcluster  # noqa: E402

EXAMPLE = ROOT / "jobscripts" / "examples" / "digits_mlp.py"
BIN = Path(sys.executable).parent
CHANGES = (  # kind, hpcsched resize arguments, naive resubmission (nodes, global batch)
    ("batch", ["--batch-size", "128"], (2, 128)),
    ("shrink", ["--nodes", "1"], (1, 128)),
    ("grow", ["--nodes", "2"], (2, 128)),
)


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


def submit(workdir: Path, nodes: int, batch: int, extra=()) -> tuple[str, JobDir]:
    """hpcsub the example and wait for its first step."""
    out = sh(BIN / "hpcsub", "--parsable", "-N", nodes, "--gres=gpu:2", "--output=slurm-%j.out",
             "--hpcsched-min-nodes", 1, "--hpcsched-max-nodes", 2, "--hpcsched-batch-size", batch,
             "--hpcsched-min-batch-size", 32, "--hpcsched-max-batch-size", 256, *extra,
             EXAMPLE, "--epochs", 1000, "--min-step-time", 0.02, cwd=workdir).stdout
    job_id = out.strip().split(";")[0]
    jd = JobDir.for_job(job_id)
    wait(lambda: ack(jd, 0), 180, f"job {job_id} to start")
    return job_id, jd


def steps_in_flight(jd: JobDir, t0: float, generation: int) -> int | None:
    """Steps rank 0 started after the request and before the new configuration (0 = next step)."""
    before, first = -1, None
    for f in (jd.path / "metrics").glob("launch-*-rank-0.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r["t"] - r["step_time"] <= t0:  # the step had started before the request
                before = max(before, r["step"])
            if r["generation"] == generation:
                first = r["step"] if first is None else min(first, r["step"])
    return None if first is None else first - before - 1


def run_hpcsched(job_id: str, jd: JobDir, kind: str, args: list[str]) -> dict:
    t0 = time.time()
    res = json.loads(sh(BIN / "hpcsched", "resize", job_id, "--json", *args).stdout)
    rec = {"seconds": res["applied"] - t0}
    if res["checkpointed"] is not None:
        rec["checkpoint_seconds"] = res["checkpointed"] - t0
        rec["after_checkpoint_seconds"] = res["applied"] - res["checkpointed"]
    if kind == "batch":
        # counted from the moment the control file was written, not from the CLI's start-up
        issued = ctl.read_control(jd.control_path, jd.uid).issued_at
        rec["steps_in_flight"] = steps_in_flight(jd, issued, res["generation"])
    return rec


def run_naive(job_id: str, jd: JobDir, workdir: Path, nodes: int, batch: int):
    c = ctl.read_control(jd.control_path, jd.uid)
    a = ctl.read_ack(jd.ack_path, jd.uid)
    gen = max(c.generation if c else 0, a.generation) + 1
    t0 = time.time()
    ctl.write_control(jd.control_path, ctl.Control(
        job_uid=jd.uid, generation=gen, action="checkpoint-and-requeue", nodes=a.nodes,
        workers_per_node=2, global_batch_size=a.global_batch_size,
        local_batch_size=a.local_batch_size, accumulation_steps=a.accumulation_steps,
        lr_scale=1.0, issued_at=t0, issued_by="benchmark", reason="naive: checkpoint"))
    ck = wait(lambda: ack(jd, gen, "checkpointed"), 120, "the checkpoint")
    sh("scancel", job_id)
    new_id, new_jd = submit(workdir, nodes, batch,
                            extra=("--hpcsched-checkpoint-dir", jd.path / "checkpoints"))
    first = ack(new_jd, 0)
    rec = {"seconds": first.time - t0, "checkpoint_seconds": ck.time - t0,
           "after_checkpoint_seconds": first.time - ck.time}
    return rec, new_id, new_jd


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "resize_latency.json")
    args = p.parse_args()

    state = Path(os.environ.get("HPCSCHED_DEVCLUSTER_DIR") or "/var/lib/hpcsched/devcluster")
    os.environ["SLURM_CONF"] = str(devcluster.up(state))
    work = Path(tempfile.mkdtemp(prefix="hpcsched-bench-"))
    os.environ["HPCSCHED_CONTROL_DIR"] = str(work / "jobs")
    runs: dict[str, dict[str, list]] = {k: {"hpcsched": [], "naive": []} for k, _, _ in CHANGES}
    submitted: list[str] = []
    try:
        for rep in range(args.repeats):
            job_id, jd = submit(work, 2, 64)
            submitted.append(job_id)
            for kind, cli_args, _ in CHANGES:
                time.sleep(1.0)
                rec = run_hpcsched(job_id, jd, kind, cli_args)
                runs[kind]["hpcsched"].append(rec)
                print(f"[{rep}] hpcsched {kind:<6} {rec['seconds']:6.2f} s", flush=True)
            sh("scancel", job_id)

            job_id, jd = submit(work, 2, 64)
            submitted.append(job_id)
            for kind, _, (nodes, batch) in CHANGES:
                time.sleep(1.0)
                rec, job_id, jd = run_naive(job_id, jd, work, nodes, batch)
                submitted.append(job_id)
                runs[kind]["naive"].append(rec)
                print(f"[{rep}] naive    {kind:<6} {rec['seconds']:6.2f} s", flush=True)
            sh("scancel", job_id)
    finally:
        subprocess.run(["scancel", *submitted], capture_output=True)

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    summary = {}
    print(f"\n{'change':<7} {'hpcsched':>9} {'checkpoint':>11} {'after ckpt':>11} {'naive':>8} "
          f"{'speed-up':>9}   (medians of {args.repeats}, seconds)")
    for kind, r in runs.items():
        h = med(x["seconds"] for x in r["hpcsched"])
        n = med(x["seconds"] for x in r["naive"])
        ck = med(x.get("checkpoint_seconds") for x in r["hpcsched"])
        after = med(x.get("after_checkpoint_seconds") for x in r["hpcsched"])
        summary[kind] = {"hpcsched_s": h, "hpcsched_checkpoint_s": ck,
                         "hpcsched_after_checkpoint_s": after, "naive_s": n, "speedup": n / h}
        if kind == "batch":
            summary[kind]["steps_in_flight"] = [x["steps_in_flight"] for x in r["hpcsched"]]
        fmt = lambda v: f"{v:.2f}" if v is not None else "-"  # noqa: E731
        print(f"{kind:<7} {fmt(h):>9} {fmt(ck):>11} {fmt(after):>11} {fmt(n):>8} {n / h:>8.1f}x")
    print("batch-only: steps started between the request and the new configuration:",
          summary["batch"]["steps_in_flight"], "(0 = applied at the next step)")
    write_report(args.out, "resize_latency", repeats=args.repeats, summary=summary, runs=runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
