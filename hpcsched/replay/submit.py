"""Submitting a planned job with the real ``hpcsub`` (a subprocess, as a user would)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hpcsched.replay import ReplayError

#: seconds hpcsub (and the sbatch it runs) may take
SUBMIT_TIMEOUT = 60.0


def find_hpcsub() -> str:
    """The ``hpcsub`` beside this Python (a virtual environment's ``bin/``), else on ``PATH``.

    Raises:
        ReplayError: neither exists.
    """
    beside = Path(sys.executable).parent / "hpcsub"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("hpcsub")
    if found is None:
        raise ReplayError("hpcsub not found (neither beside this Python nor on PATH); "
                          "install hpcsched (pip install -e .)")
    return found


class Refused(Exception):
    """hpcsub or sbatch refused a job; the message is their last line."""


def submit(hpcsub: str, argv: Sequence[str], cwd: str | None = None,
           timeout: float = SUBMIT_TIMEOUT) -> str:
    """Run ``hpcsub ARGV`` (whose sbatch options include ``--parsable``; or ``sbatch ARGV``, a
    plain job's); returns the job id.

    Raises:
        Refused: non-zero exit, a timeout, or an answer that is not a job id (the message says
            which, with hpcsub's last line).
    """
    try:
        proc = subprocess.run([hpcsub, *argv], capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, check=False)
    except subprocess.TimeoutExpired:
        raise Refused(f"{Path(hpcsub).name} did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise Refused(f"cannot run {hpcsub}: {exc.strerror}") from None
    out = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not out.isdigit():
        lines = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}")
        raise Refused(lines.splitlines()[-1])
    return out
