"""``hpcsched devcluster up|down|status``: the click group over the Python API in
:mod:`hpcsched.slurm.devcluster.cluster`. ``up`` prints ``export SLURM_CONF=...`` on stdout
(for ``eval``); progress goes to stderr."""

from __future__ import annotations

import json
import logging
import shlex
import sys
from pathlib import Path

import click

from hpcsched.slurm.devcluster import chroot
from hpcsched.slurm.devcluster.base import (
    DEFAULT_STATE_DIR,
    STATE_DIR_ENV,
    DevClusterError,
    Layout,
)
from hpcsched.slurm.devcluster.chroot import HOST_VERSION, VERSIONS
from hpcsched.slurm.devcluster.cluster import down, status, up

logger = logging.getLogger("hpcsched.slurm.devcluster")  # the package's logger (see base)



class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (click's test runner swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _cli_logging() -> None:
    """Progress messages to stderr at INFO, even when the root logger is at WARNING."""
    if getattr(logger, "_devcluster_cli", False):
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("devcluster: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(min(logging.INFO, logging.getLogger().getEffectiveLevel()))
    logger._devcluster_cli = True  # type: ignore[attr-defined]


_state_dir_option = click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path), envvar=STATE_DIR_ENV,
    default=DEFAULT_STATE_DIR, show_default=True,
    help=f"Directory for configs, PID files, logs and the database (env {STATE_DIR_ENV}).")


_slurm_option = click.option(
    "--slurm", "version", type=click.Choice([HOST_VERSION, *VERSIONS]), default=HOST_VERSION, show_default=True,
    help="Slurm version: 22.05 is the host's; the others run from a Debian chroot (24.11 trixie, 26.05 sid) "
         "with their own ports, no slurmdbd, and the state directory /var/lib/hpcsched/devcluster-<version> "
         "unless --state-dir is given on the command line.")


def _chroot_state_dir(ctx: click.Context, version: str, state_dir: Path) -> Path | None:
    """The state directory of a chroot version: --state-dir only when given on the command line
    (the default and $HPCSCHED_DEVCLUSTER_DIR name the host cluster's)."""
    given = ctx.get_parameter_source("state_dir") == click.core.ParameterSource.COMMANDLINE
    return state_dir if given else chroot.default_state_dir(version)


@click.group("devcluster")
def devcluster() -> None:
    """A local Slurm 22.05 cluster with fake GPUs for development: up, down, status.

    With --slurm 24.11 or 26.05, that Slurm from a Debian chroot instead (see docs/devcluster.md).

    \b
    eval "$(sudo hpcsched devcluster up)"    # starts it, sets SLURM_CONF
    hpcsched devcluster status
    sudo hpcsched devcluster down
    """
    _cli_logging()


@devcluster.command("up")
@click.option("--nodes", type=int, default=4, show_default=True,
              help="Emulated nodes n1..nN (up to 1024: one slurmd each, about 5.5 MB of memory apiece).")
@click.option("--gpus-per-node", "--gpus", "gpus", type=int, default=4, show_default=True,
              help="Fake GPUs per node.")
@click.option("--cpus", type=int, default=8, show_default=True, help="CPUs per node.")
@_state_dir_option
@click.option("--clean", is_flag=True, help="Discard saved Slurm jobs and node states (slurmctld -c).")
@click.option("--no-install", is_flag=True, help="Never apt-get install; fail if a binary is missing.")
@_slurm_option
@click.pass_context
def up_command(ctx: click.Context, nodes: int, gpus: int, cpus: int, state_dir: Path, clean: bool,
               no_install: bool, version: str) -> None:
    """Start the cluster (idempotent) and print `export SLURM_CONF=...` on stdout."""
    try:
        if version == HOST_VERSION:
            conf = up(state_dir, nodes=nodes, gpus=gpus, cpus=cpus, clean=clean, install=not no_install)
        else:
            conf = chroot.up(version, _chroot_state_dir(ctx, version, state_dir), nodes=nodes, gpus=gpus,
                             cpus=cpus, clean=clean, install=not no_install)
    except DevClusterError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"export SLURM_CONF={shlex.quote(str(conf))}")


@devcluster.command("down")
@_state_dir_option
@_slurm_option
@click.pass_context
def down_command(ctx: click.Context, state_dir: Path, version: str) -> None:
    """Stop the daemons `up` started (idempotent)."""
    try:
        if version == HOST_VERSION:
            stopped = down(state_dir)
        else:
            state_dir = _chroot_state_dir(ctx, version, state_dir)
            stopped = chroot.down(version, state_dir)
    except DevClusterError as e:
        raise click.ClickException(str(e)) from e
    if not stopped:
        logger.info("dev cluster in %s is not running; nothing to stop", Layout(state_dir).root)


@devcluster.command("plugins")
@click.argument("state", type=click.Choice(["on", "off"]))
@_state_dir_option
def plugins_command(state: str, state_dir: Path) -> None:
    """Turn hpcsched's Slurm-side plugins (slurm-plugins/: job_submit.lua, the GPU probe prolog,
    the job-mapping epilog) on or off on the running 22.05 dev cluster; no restart needed."""
    from hpcsched.slurm.devcluster.plugins import set_plugins

    try:
        etc = set_plugins(state_dir, state == "on")
    except DevClusterError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"hpcsched's Slurm plugins {state} ({etc}; settings: {etc}/job_submit_hpcsched.conf)")


@devcluster.command("status")
@_state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_slurm_option
@click.pass_context
def status_command(ctx: click.Context, state_dir: Path, as_json: bool, version: str) -> None:
    """Show daemons and nodes. Exit status 0 when up, 3 when down."""
    try:
        if version == HOST_VERSION:
            st = status(state_dir)
        else:
            st = chroot.status(version, _chroot_state_dir(ctx, version, state_dir))
    except DevClusterError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(st, indent=2))
    else:
        _echo_status(st)
    ctx.exit(0 if st["up"] else 3)


def _echo_status(st: dict) -> None:
    """The human-readable form of :func:`~hpcsched.slurm.devcluster.cluster.status`'s result."""
    g = st["geometry"]
    shape = f" ({g['nodes']} nodes x {g['gpus']} GPUs x {g['cpus']} CPUs)" if g else ""
    click.echo(f"dev cluster {st['state_dir']}: {'up' if st['up'] else 'down'}{shape}")
    for d in st["daemons"]:
        who = "" if d["started_by_us"] else " (not started by devcluster)"
        state = f"running, pid {d['pid']}" if d["running"] else "not running"
        click.echo(f"  {d['name']:<12} {state}{who}")
    if st["nodes"]:
        click.echo("nodes:")
        for n in st["nodes"]:
            flags = "+" + "+".join(n["flags"]) if n["flags"] else ""
            reason = f"  ({n['reason']})" if n["reason"] else ""
            click.echo(f"  {n['name']:<6} {n['state'] + flags:<12} gres={n['gres'] or '-'} cpus={n['cpus']}{reason}")
    if st["error"]:
        click.echo(f"sinfo: {st['error']}")
    if st["up"]:
        click.echo(f"export SLURM_CONF={shlex.quote(st['slurm_conf'])}")
