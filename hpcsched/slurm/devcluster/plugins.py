"""hpcsched's Slurm-side plugins on the dev cluster (``slurm-plugins/``; docs/slurm-plugins.md):
wired into the host cluster's ``slurm.conf`` on every start, each one off until
``hpcsched devcluster plugins on``, so the rest of the test suite runs on a plain Slurm.

* ``JobSubmitPlugins=lua``: slurmctld runs ``etc/job_submit.lua``, a pass-through while the
  plugins are off and a copy of ``slurm-plugins/job_submit.lua`` while on. The lua plugin loads
  the script again when its modification time changes, so switching needs no restart.
  Its settings are ``etc/job_submit_hpcsched.conf`` (read at every submission).
* ``Prolog=`` / ``Epilog=``: ``etc/prolog`` and ``etc/epilog``, which run
  ``slurm-plugins/prolog-gpu-probe`` and ``slurm-plugins/epilog-job-mapping`` only while the flag
  file ``etc/hpcsched-plugins.on`` exists, with the settings of ``etc/hpcsched-plugins.env``.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from pathlib import Path

from hpcsched.resources import shared
from hpcsched.slurm.devcluster.base import DevClusterError, Layout, write_file

logger = logging.getLogger("hpcsched.slurm.devcluster")

FLAG = "hpcsched-plugins.on"
ENV_FILE = "hpcsched-plugins.env"
LUA = "job_submit.lua"
LUA_SETTINGS = "job_submit_hpcsched.conf"
PROLOG, EPILOG = "prolog-gpu-probe", "epilog-job-mapping"

_PASS_THROUGH = """\
-- Written by `hpcsched devcluster`: hpcsched's job_submit.lua is off (every job passes).
-- `hpcsched devcluster plugins on` puts slurm-plugins/job_submit.lua here.
function slurm_job_submit(job_desc, part_list, submit_uid)
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

return slurm.SUCCESS
"""


def plugins_dir() -> Path:
    """hpcsched's ``slurm-plugins/`` (:func:`hpcsched.resources.shared`)."""
    return shared("slurm-plugins")


def plugin_lines(layout: Layout) -> str:
    """The ``slurm.conf`` lines that wire the plugins (each hook is a no-op while off)."""
    return (f"JobSubmitPlugins=lua\nProlog={layout.etc}/prolog\nEpilog={layout.etc}/epilog\n"
            "PrologEpilogTimeout=60\n")


def _hook(layout: Layout, script: str) -> str:
    flag, env = shlex.quote(str(layout.etc / FLAG)), shlex.quote(str(layout.etc / ENV_FILE))
    target = shlex.quote(str(plugins_dir() / script))
    return f"""#!/bin/sh
# Written by `hpcsched devcluster`: runs slurm-plugins/{script} while the dev cluster's plugins
# are on (`hpcsched devcluster plugins on`); a no-op otherwise. Exit 0 always: a failing prolog
# would drain the node.
[ -e {flag} ] || exit 0
[ -r {env} ] && . {env}
[ -x {target} ] && exec {target}
exit 0
"""


def write_plugin_hooks(layout: Layout) -> None:
    """Write the hooks ``slurm.conf`` names, keeping the plugins' on/off state."""
    write_file(layout.etc / "prolog", _hook(layout, PROLOG), 0o755)
    write_file(layout.etc / "epilog", _hook(layout, EPILOG), 0o755)
    write_file(layout.etc / ENV_FILE, _env_text(layout), 0o644)
    _write_lua(layout, is_on(layout))


def _env_text(layout: Layout) -> str:
    """Settings the prolog and epilog read (docs/slurm-plugins.md): this Python, and state
    under the dev cluster's directory."""
    return (f"# Written by `hpcsched devcluster`.\nHPCSCHED_PYTHON={shlex.quote(sys.executable)}\n"
            f"HPCSCHED_PROBE_DIR={shlex.quote(str(layout.root / 'gpu-probes'))}\n"
            f"HPCSCHED_JOB_MAPPING_DIR={shlex.quote(str(layout.root / 'job-mapping'))}\n"
            # a second of stand-in work (no CUDA here: fake GPUs), well inside the prolog's 60 s
            "HPCSCHED_PROBE_SECONDS=1\nHPCSCHED_PROBE_TIMEOUT=20\nHPCSCHED_PROBE_BACKEND=cpu\n"
            "export HPCSCHED_PYTHON HPCSCHED_PROBE_DIR HPCSCHED_JOB_MAPPING_DIR "
            "HPCSCHED_PROBE_SECONDS HPCSCHED_PROBE_TIMEOUT HPCSCHED_PROBE_BACKEND\n")


def _write_lua(layout: Layout, on: bool) -> None:
    text = (plugins_dir() / LUA).read_text() if on else _PASS_THROUGH
    path = layout.etc / LUA
    write_file(path, text, 0o644)
    st = path.stat()   # a new mtime even within the same second: the plugin reloads by mtime
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def is_on(layout: Layout) -> bool:
    return (layout.etc / FLAG).exists()


def _started(state_dir: str | os.PathLike[str] | None) -> Layout:
    """The layout of the dev cluster in ``state_dir``; DevClusterError if it was never started."""
    layout = Layout(state_dir)
    if not (layout.etc / "prolog").exists():
        raise DevClusterError(f"no dev cluster in {layout.root}: run `hpcsched devcluster up` first")
    return layout


def set_plugins(state_dir: str | os.PathLike[str] | None, on: bool) -> Path:
    """Turn the dev cluster's plugins on or off; returns the ``etc`` directory.

    :raises DevClusterError: the dev cluster was never started in ``state_dir``, or
        ``slurm-plugins/`` is not beside this package (an installed, not checked-out, hpcsched).
    """
    layout = _started(state_dir)
    if on and not (plugins_dir() / LUA).exists():
        raise DevClusterError(f"{plugins_dir()} not found: the dev cluster's plugins run from a "
                              "checkout of hpcsched")
    flag = layout.etc / FLAG
    if on:
        flag.touch()
    else:
        flag.unlink(missing_ok=True)
    _write_lua(layout, on)
    logger.debug("hpcsched's Slurm plugins turned %s in %s", "on" if on else "off",
                 layout.root)
    return layout.etc


def set_job_submit(state_dir: str | os.PathLike[str] | None, settings: str | None) -> None:
    """Only the job_submit plugin, with ``settings`` as its ``job_submit_hpcsched.conf``
    (None: back to the pass-through, the settings file removed); the prolog and epilog stay as
    they are. For benchmarks that need the plugin's site settings (``extension_qos``) without
    the GPU probe's second at every job start.

    :raises DevClusterError: as :func:`set_plugins`.
    """
    layout = _started(state_dir)
    path = layout.etc / LUA_SETTINGS
    if settings is None:
        path.unlink(missing_ok=True)
    else:
        write_file(path, settings, 0o644)
    _write_lua(layout, settings is not None or is_on(layout))
