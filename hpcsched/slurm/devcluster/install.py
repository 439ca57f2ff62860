"""Installing what the dev cluster runs: the Debian packages (``apt-get install slurm-wlm munge
slurmdbd mariadb-server``, never ``slurm-wlm-emulator``), undoing the emulator's takeover of the
daemons' alternatives, and the MUNGE key (``docs/slurm-22.05-notes.md`` §1, §6.1)."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from hpcsched.slurm.devcluster.base import (
    APT_PACKAGES,
    DevClusterError,
    find_bin,
    need_bin,
    run_cmd,
)

logger = logging.getLogger("hpcsched.slurm.devcluster")  # the package's logger (see base)


_NEEDED_BINARIES = (
    "slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db", "mariadb",
    "sinfo", "scontrol", "sbatch", "squeue", "sacct",
)
_MUNGE_KEY = Path("/etc/munge/munge.key")


def _missing_binaries() -> list[str]:
    return [b for b in _NEEDED_BINARIES if find_bin(b) is None]


def ensure_installed(install: bool) -> None:
    """apt-get install the packages when a needed binary is missing (the notes, §1), set the
    daemons' alternatives back from the emulator build, and create the MUNGE key if missing.

    :param install: when False, a missing binary is an error instead of an install.
    :raises DevClusterError: a binary is missing and ``install`` is False or there is no apt-get,
        or the install failed or left a binary missing.
    """
    missing = _missing_binaries()
    if missing:
        if not install:
            raise DevClusterError(f"missing {', '.join(missing)} and --no-install given; "
                                  f"apt-get install {' '.join(APT_PACKAGES)}")
        apt = find_bin("apt-get")
        if apt is None:
            raise DevClusterError(f"missing {', '.join(missing)} and no apt-get on this machine; "
                                  f"install {' '.join(APT_PACKAGES)} by hand")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        logger.info("installing %s (missing: %s)", " ".join(APT_PACKAGES), ", ".join(missing))
        t0 = time.monotonic()
        try:
            run_cmd([apt, "update"], timeout=300, env=env)
            run_cmd([apt, "install", "-y", "--no-install-recommends", *APT_PACKAGES], timeout=900, env=env)
        except DevClusterError as e:
            raise DevClusterError(f"installing {' '.join(APT_PACKAGES)} failed: {e}") from e
        logger.info("installed in %.1f s", time.monotonic() - t0)
        still = _missing_binaries()
        if still:
            raise DevClusterError(f"after apt-get install, still missing: {', '.join(still)}")
    _fix_emulator_alternatives()
    if not _MUNGE_KEY.exists():
        _create_munge_key()


def _fix_emulator_alternatives() -> None:
    """If slurm-wlm-emulator took over /usr/sbin/slurmctld etc. (notes, §6.1), set them back."""
    for prog in ("slurmctld", "slurmd", "slurmstepd"):
        target = os.path.realpath(f"/usr/sbin/{prog}")
        wlm = f"/usr/sbin/{prog}-wlm"
        if "emulator" in os.path.basename(target) and os.path.exists(wlm):
            logger.warning("%s points to the broken emulator build %s; setting it back to %s", prog, target, wlm)
            run_cmd([need_bin("update-alternatives"), "--set", prog, wlm], timeout=30)


def _create_munge_key() -> None:
    logger.info("creating %s", _MUNGE_KEY)
    _MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
    mungekey = find_bin("mungekey")
    if mungekey:
        run_cmd([mungekey, "--create", f"--keyfile={_MUNGE_KEY}"], timeout=30)
    else:
        fd = os.open(_MUNGE_KEY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
    shutil.chown(_MUNGE_KEY, "munge", "munge")
    os.chmod(_MUNGE_KEY, 0o400)
