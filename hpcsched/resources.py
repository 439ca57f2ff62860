"""The files hpcsched ships beside its code, found wherever it is installed.

They live once in the source tree, at its top level (``jobscripts/``, ``db/``,
``slurm-plugins/``, ``tools/systemd/``, ``docs/grafana-hpcsched.json``); ``hpcsched/_share/``
holds a symbolic link to each, which setuptools follows when it builds the wheel, so an
installed hpcsched carries copies inside its package. :func:`shared` finds them through
:mod:`importlib.resources` in both cases: a checkout, a virtual environment, ``pip install
--user`` or ``--target`` (no lookup under ``sys.prefix``). ``hpcsched install-files DIR``
(:func:`install_files`) copies out what an admin installs by hand.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import click

#: what ``hpcsched/_share`` holds: name -> what it is
SHARED = {
    "jobscripts": "hpcsub's batch-script template and the example training scripts",
    "db": "the store's Alembic migrations",
    "slurm-plugins": "job_submit.lua, the GPU-probe prolog and the job-mapping epilog",
    "systemd": "the daemon's systemd unit, hpcsched.service",
    "grafana-hpcsched.json": "the Grafana dashboard",
}
#: what ``install-files`` copies out (the rest is used in place)
ADMIN_FILES = ("slurm-plugins", "systemd", "grafana-hpcsched.json", "jobscripts")


def shared(name: str) -> Path:
    """The shipped file or directory ``name`` (a key of :data:`SHARED`).

    Raises:
        FileNotFoundError: this installation lacks it (a broken install).
    """
    if name not in SHARED:
        raise KeyError(name)
    path = Path(str(resources.files("hpcsched") / "_share" / name)).resolve()
    if not path.exists():
        raise FileNotFoundError(f"{name} ({SHARED[name]}) not found at {path}: reinstall hpcsched")
    return path


def install_files(dest: Path) -> list[Path]:
    """Copy :data:`ADMIN_FILES` into ``dest`` (created; existing files are replaced), keeping
    the executable bits. Returns what was written, top-level entries only.

    Raises:
        FileNotFoundError: as :func:`shared`. OSError: ``dest`` cannot be written.
    """
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name in ADMIN_FILES:
        src, to = shared(name), dest / name
        if src.is_dir():
            shutil.copytree(src, to, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, to)
        out.append(to)
    return out


@click.command("install-files")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
def install_files_command(dest: Path) -> None:
    """Copy what an admin installs by hand into DEST: the Slurm plugins (slurm-plugins/), the
    systemd unit (systemd/hpcsched.service), the Grafana dashboard and the batch-script
    template with the example scripts (jobscripts/). See docs/slurm-plugins.md and
    docs/daemon.md, "Running it", for where each goes."""
    try:
        written = install_files(dest)
    except OSError as exc:   # FileNotFoundError included
        raise click.ClickException(str(exc)) from None
    for path in written:
        click.echo(f"{path}  ({SHARED[path.name]})")
