"""The ``hpcsched`` command: a click group whose subcommands live in their own modules.

Subcommand modules are imported lazily so that ``hpcsched status`` stays fast and does not
import torch.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from hpcsched import __version__


class _LazyGroup(click.Group):
    """Click group that imports a subcommand's module only when it is invoked."""

    _lazy = {
        "check": ("hpcsched.daemon.preflight", "check_command"),
        "install-files": ("hpcsched.resources", "install_files_command"),
        "daemon": ("hpcsched.daemon.service", "daemon_command"),
        "db": ("hpcsched.daemon.store", "db_group"),
        "devcluster": ("hpcsched.slurm.devcluster", "devcluster"),
        "replay": ("hpcsched.replay.cli", "replay_command"),
        "resize": ("hpcsched.daemon.resize_cli", "resize_command"),
        "simulate": ("hpcsched.sim.cli", "simulate_command"),
        "status": ("hpcsched.daemon.status", "status_command"),
    }

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx, name):
        if name in self._lazy:
            import importlib

            module, attr = self._lazy[name]
            try:
                return getattr(importlib.import_module(module), attr)
            except ModuleNotFoundError as exc:   # a job-side install: pip install hpcsched
                if exc.name and exc.name.split(".")[0] == "hpcsched":
                    raise
                raise click.ClickException(
                    f"hpcsched {name} needs {exc.name}, which comes with the daemon's packages: "
                    "pip install 'hpcsched[daemon]'") from None
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpcsched")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """hpcsched: elastic meta-scheduler for deep-learning jobs on Slurm."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    level = getattr(logging, os.environ.get("HPCSCHED_LOG_LEVEL", "").upper(), level)
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


if __name__ == "__main__":  # pragma: no cover
    main()
