"""Per-task shim started by ``srun``: maps Slurm's task variables onto the torch.distributed
environment and replaces itself with the training script.

``RANK`` = ``SLURM_PROCID``, ``WORLD_SIZE`` = the launch's world size (``SLURM_NTASKS``
without a launcher), ``LOCAL_RANK`` = ``SLURM_LOCALID``, ``LOCAL_WORLD_SIZE`` = workers on this
node, ``GROUP_RANK`` = ``SLURM_NODEID``; ``MASTER_ADDR`` and ``MASTER_PORT`` come from the
launcher (:class:`hpcsched.protocol.env.LaunchEnv`). This is what lets an unmodified script that
only reads the standard torch.distributed environment run under hpcsub.

``SIGUSR1``, which Slurm sends before the job's time limit (hpcsub's ``--signal=USR1@120``),
is ignored until the script's :class:`hpcsched.elastic.ElasticJob` listens for it (an ignored
signal stays ignored across ``exec``; its default action would end the process).

Usage (by the launcher): ``python -m hpcsched.worker SCRIPT [ARGS...]``
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

from hpcsched.protocol.env import LaunchEnv


def torch_env(env: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed variables for one srun task, from its Slurm variables and the
    launch (:class:`~hpcsched.protocol.env.LaunchEnv`) in ``env``.

    Raises:
        ValueError: a launch variable that does not parse.
    """
    launch = LaunchEnv.from_env(env)
    return {
        "RANK": env.get("SLURM_PROCID", "0"),
        "WORLD_SIZE": str(launch.world_size) if launch.world_size is not None
        else env.get("SLURM_NTASKS", "1"),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(launch.workers_per_node) if launch.workers_per_node is not None
        else env.get("SLURM_NTASKS_PER_NODE", "1"),
        "GROUP_RANK": env.get("SLURM_NODEID", "0"),
    }


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.stderr.write("usage: python -m hpcsched.worker SCRIPT [ARGS...]\n")
        raise SystemExit(2)
    env = dict(os.environ)
    env.update(torch_env(env))
    python = LaunchEnv.from_env(env).python or sys.executable
    if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.execvpe(python, [python, *argv], env)


if __name__ == "__main__":
    main()
