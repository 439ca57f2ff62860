"""Per-task shim started by ``srun``: maps Slurm's task variables onto the torch.distributed
environment and replaces itself with the training script.

``RANK`` = ``SLURM_PROCID``, ``WORLD_SIZE`` = ``SLURM_NTASKS``, ``LOCAL_RANK`` =
``SLURM_LOCALID``, ``LOCAL_WORLD_SIZE`` = workers on this node; ``MASTER_ADDR`` and
``MASTER_PORT`` come from the launcher. This is what lets an unmodified script that only reads
the standard torch.distributed environment run under hpcsub.

Usage (by the launcher): ``python -m hpcsched.job.worker SCRIPT [ARGS...]``
"""

from __future__ import annotations

import os
import sys


def torch_env(env: dict[str, str]) -> dict[str, str]:
    """The torch.distributed variables for one srun task, from its Slurm variables."""
    out = {}
    out["RANK"] = env.get("SLURM_PROCID", "0")
    out["WORLD_SIZE"] = env.get("HPCSCHED_WORLD_SIZE") or env.get("SLURM_NTASKS", "1")
    out["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    out["LOCAL_WORLD_SIZE"] = env.get("HPCSCHED_WORKERS_PER_NODE") or env.get(
        "SLURM_NTASKS_PER_NODE", "1")
    out["GROUP_RANK"] = env.get("SLURM_NODEID", "0")
    return out


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.stderr.write("usage: python -m hpcsched.job.worker SCRIPT [ARGS...]\n")
        raise SystemExit(2)
    env = dict(os.environ)
    env.update(torch_env(env))
    python = env.get("HPCSCHED_PYTHON") or sys.executable
    os.execvpe(python, [python, *argv], env)


if __name__ == "__main__":
    main()
