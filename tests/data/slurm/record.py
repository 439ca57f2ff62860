"""Record what a dev cluster's Slurm prints, into tests/data/slurm/<version>/ (run as root).

    python tests/data/slurm/record.py 24.11      # against `hpcsched devcluster up --slurm 24.11 --nodes 2`
    python tests/data/slurm/record.py 22.05 --state-dir DIR   # a scratch 22.05 cluster, never the shared one

(The 22.05 files came from a scratch cluster of the host's binaries, rendered by
``devcluster.config.write_configs`` with ``Ports(16937, 16938, 17900, accounting=False)``.)

The cluster must have 2 nodes x 4 GPUs and no jobs (start it with ``--clean``). The scenario
leaves, at the moment of the ``busy`` recording: a running 2-node job (gpu:2), a resized job
(2 nodes -> 1, ``scontrol update
NumNodes=1``), a requeued one (``scontrol requeue``), a held one, one pending for resources, a
completed, a failed and a cancelled job; then node n2 drained (``drain``). Each state is written
as ``squeue.<state>.json``, ``squeue-t-all.<state>.json``, ``sinfo.<state>.json``, ``sinfo-N.<state>.json`` and
``scontrol-show-job.<state>.txt``; ``jobs.json`` maps scenario names to job ids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    version = sys.argv[1]
    state_dir = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--state-dir" else None
    if version == "22.05":
        prefix: list[str] = []
        conf = Path(state_dir) / "etc/slurm.conf"
    else:
        from hpcsched.slurm.devcluster import chroot
        prefix = chroot.client(version)
        conf = Path(state_dir or chroot.default_state_dir(version)) / "etc/slurm.conf"
    env = dict(os.environ, SLURM_CONF=str(conf))
    out = HERE / version
    out.mkdir(exist_ok=True)

    def sh(*args: str, check: bool = True) -> str:
        cp = subprocess.run([*prefix, *args], env=env, capture_output=True, text=True, timeout=30, cwd="/tmp")
        if check and cp.returncode:
            raise SystemExit(f"{args}: {cp.stderr}")
        return cp.stdout

    def sbatch(*args: str) -> str:
        return sh("sbatch", "--parsable", "-o", "/dev/null", *args).strip().split(";")[0]

    def state(j: str) -> str:
        return sh("squeue", "-h", "-t", "all", "-j", j, "-o", "%T").strip()

    def wait(j: str, want: set[str], limit: float = 30) -> None:
        end = time.monotonic() + limit
        while state(j) not in want:
            if time.monotonic() > end:
                raise SystemExit(f"job {j} stuck in {state(j)}, wanted {want}")
            time.sleep(0.3)

    def record(tag: str) -> None:
        for name, args in (("squeue", ("squeue", "--json")), ("squeue-t-all", ("squeue", "--json", "-t", "all")),
                           ("sinfo", ("sinfo", "--json")),
                           ("sinfo-N", ("sinfo", "-N", "--json"))):
            text = json.dumps(json.loads(sh(*args)), indent=1) + "\n"
            (out / f"{name}.{tag}.json").write_text(text)
        (out / f"scontrol-show-job.{tag}.txt").write_text(sh("scontrol", "show", "job", "-d"))

    record("idle")
    jobs = {"running": sbatch("-N2", "--gres=gpu:2", "--wrap", "sleep 600")}
    wait(jobs["running"], {"RUNNING"})
    jobs["resized"] = sbatch("-N2", "--gres=gpu:1", "--wrap", "sleep 600")
    wait(jobs["resized"], {"RUNNING"})
    sh("scontrol", "update", f"JobId={jobs['resized']}", "NumNodes=1")
    jobs["requeued"] = sbatch("--gres=gpu:1", "--wrap", "sleep 600")
    wait(jobs["requeued"], {"RUNNING"})
    sh("scontrol", "requeue", jobs["requeued"])
    jobs["completed"] = sbatch("--wrap", "true")
    jobs["failed"] = sbatch("--wrap", "exit 3")
    jobs["cancelled"] = sbatch("-H", "--wrap", "true")
    sh("scancel", jobs["cancelled"])
    wait(jobs["completed"], {"COMPLETED"})
    wait(jobs["failed"], {"FAILED"})
    jobs["held"] = sbatch("-H", "--wrap", "true")
    jobs["pending"] = sbatch("-N2", "--gres=gpu:4", "--wrap", "sleep 1")
    end = time.monotonic() + 30
    while sh("squeue", "-h", "-j", jobs["pending"], "-o", "%r").strip() != "Resources" and time.monotonic() < end:
        time.sleep(0.5)
    record("busy")
    sh("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=recorded")
    time.sleep(1)
    record("drain")
    sh("scontrol", "update", "NodeName=n2", "State=RESUME")
    sh("scancel", *(j for k, j in jobs.items()), check=False)
    (out / "jobs.json").write_text(json.dumps(jobs, indent=1) + "\n")
    print(f"recorded into {out}: {jobs}")


if __name__ == "__main__":
    main()
