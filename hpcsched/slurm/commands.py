"""Running Slurm's command-line tools (Slurm 22.05: ``squeue --json``, ``scontrol``).

Every call is an argument list (never a shell) with a timeout. A controller that does not
answer raises :class:`SlurmUnavailable`; a command that answers with an error raises
:class:`SlurmError` carrying Slurm's own message. Every call, through :func:`run` or through
pyslurm (:func:`count_call`), adds one to the process-wide counter :func:`calls` that the
daemon's round statistics read. Facts this relies on were measured on Slurm 22.05.8 and are
recorded in ``docs/slurm-22.05-notes.md`` (§3): ``squeue --json`` follows openapi v0.0.38;
``scontrol`` has no ``--json``.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
from collections.abc import Sequence

from hpcsched.model.snapshot import NodeView
from hpcsched.slurm.errors import SlurmError, SlurmUnavailable, says_unreachable
from hpcsched.slurm.parse import JobInfo, parse_sinfo_json, parse_squeue_json

__all__ = [
    "DEFAULT_TIMEOUT", "SlurmError", "SlurmUnavailable", "calls", "count_call", "hostnames",
    "cancel", "drain_node", "job_info", "node_addr", "nodes", "requeue", "run", "squeue", "submit",
    "time_left", "update_job",
]

log = logging.getLogger(__name__)

#: Seconds a Slurm command may take before it is killed and SlurmUnavailable raised.
DEFAULT_TIMEOUT = 20.0

_calls = 0
_calls_lock = threading.Lock()


def count_call(n: int = 1) -> None:
    """Add ``n`` Slurm calls to the counter :func:`calls` reads: :func:`run` does it for every
    command; the pyslurm backend does it for every ``load()`` (one RPC batch each)."""
    global _calls
    with _calls_lock:
        _calls += n


def calls() -> int:
    """Slurm calls made by this process so far, by commands and by pyslurm (for round statistics)."""
    return _calls


def run(args: Sequence[str], timeout: float = DEFAULT_TIMEOUT, env: dict | None = None,
        cwd: str | os.PathLike | None = None) -> str:
    """Run a Slurm command and return its stdout.

    Args:
        args: the command and its arguments (never a shell line).
        timeout: seconds before the command is killed.
        env: variables added to this process's environment (e.g. ``{"SLURM_CONF": path}``).
        cwd: the command's working directory (``scontrol update NumNodes`` run inside a job
            writes its resize script there); None: this process's.

    Raises:
        SlurmUnavailable: timeout, or Slurm reports that the controller cannot be reached.
        SlurmError: non-zero exit (message: the command's stderr) or the binary is missing.
    """
    args = [str(a) for a in args]
    log.debug("slurm: %s", " ".join(args))
    count_call()
    try:
        proc = subprocess.run(
            args, check=False, capture_output=True, text=True, timeout=timeout,
            env=None if env is None else {**os.environ, **env}, cwd=cwd,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnavailable(f"{args[0]} did not answer within {timeout:g} s") from exc
    except FileNotFoundError as exc:
        raise SlurmError(f"{args[0]}: not found; is Slurm installed and on PATH?") from exc
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        text = "; ".join(msg[-3:]) or f"exit status {proc.returncode}"
        err = SlurmUnavailable if says_unreachable(text) else SlurmError
        raise err(f"{' '.join(args[:3])}: {text}")
    return proc.stdout


def squeue(timeout: float = DEFAULT_TIMEOUT) -> dict[str, JobInfo]:
    """All jobs Slurm still knows (one call, whatever the number of jobs), by job id.

    ``--states=all``: from 24.11 (data_parser v0.0.40+) ``squeue --json`` leaves finished jobs
    out unless asked; 22.05 lists them anyway and ignores the option (measured,
    ``docs/slurm-versions.md``).

    Raises:
        SlurmUnavailable, SlurmError: as :func:`run` and :func:`~hpcsched.slurm.parse.parse_squeue_json`.
    """
    return parse_squeue_json(run(["squeue", "--json", "--states=all"], timeout=timeout))


def nodes(timeout: float = DEFAULT_TIMEOUT) -> tuple[NodeView, ...]:
    """Every node with its GPUs configured and allocated (one ``sinfo --json``; 22.05 ignores
    ``--nodes`` there and lists them all, measured).

    Raises:
        SlurmUnavailable, SlurmError: as :func:`run` and :func:`~hpcsched.slurm.parse.parse_sinfo_json`.
    """
    return parse_sinfo_json(run(["sinfo", "--json"], timeout=timeout))


def job_info(job_id: str | int, timeout: float = DEFAULT_TIMEOUT) -> JobInfo | None:
    """One job (finished ones too, until MinJobAge), or ``None`` once Slurm has forgotten it.

    Slurm 22.05's ``squeue --json`` ignores ``--jobs`` and ``--states`` and always returns every
    job it knows, finished ones included (measured), so this filters by itself.
    """
    return squeue(timeout=timeout).get(str(job_id))


def update_job(job_id: str | int, timeout: float = DEFAULT_TIMEOUT,
               cwd: str | os.PathLike | None = None, **fields: object) -> None:
    """``scontrol update JobId=<id> Key=Value ...`` (e.g. ``NumNodes=3``, ``StartTime="now"``),
    run in ``cwd`` (see :func:`run`)."""
    args = ["scontrol", "update", f"JobId={job_id}"]
    args += [f"{k}={v}" for k, v in fields.items()]
    run(args, timeout=timeout, cwd=cwd)


def requeue(job_id: str | int, hold: bool = False, timeout: float = DEFAULT_TIMEOUT) -> None:
    """``scontrol requeue`` (or ``requeuehold``) a running job."""
    run(["scontrol", "requeuehold" if hold else "requeue", str(job_id)], timeout=timeout)


def time_left(job_id: str | int, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """The time a running job has left, as ``squeue -o %L`` prints it (``[days-]h:mm:ss`` or
    ``m:ss``, which ``sbatch --time`` reads the same way); None when it has no limit.

    Raises:
        SlurmUnavailable, SlurmError: as :func:`run`.
    """
    out = run(["squeue", "-h", "-j", str(job_id), "-o", "%L"], timeout=timeout).strip()
    return None if out in ("", "UNLIMITED", "NOT_SET", "INVALID") else out


def submit(args: Sequence[str], script: str | os.PathLike, env: dict | None = None,
           timeout: float = DEFAULT_TIMEOUT) -> str:
    """``sbatch --parsable ARGS SCRIPT``; returns the new job's id.

    ``env``: the whole environment of the submission (None: this process's); sbatch
    propagates it to the job (``--export=ALL``, sbatch's default).

    Raises:
        SlurmUnavailable: as :func:`run`. SlurmError: sbatch refused the job (its message).
    """
    args = ["sbatch", "--parsable", *[str(a) for a in args], str(script)]
    log.debug("slurm: %s", " ".join(args))
    count_call()
    try:
        proc = subprocess.run(args, check=False, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnavailable(f"sbatch did not answer within {timeout:g} s") from exc
    except FileNotFoundError as exc:
        raise SlurmError("sbatch: not found; is Slurm installed and on PATH?") from exc
    if proc.returncode != 0:
        text = "; ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise (SlurmUnavailable if says_unreachable(text) else SlurmError)(f"sbatch: {text}")
    return proc.stdout.strip().split(";")[0]


def cancel(*job_ids: str | int, timeout: float = DEFAULT_TIMEOUT) -> None:
    """``scancel JOB...`` (one call).

    Raises:
        SlurmUnavailable, SlurmError: as :func:`run`.
    """
    run(["scancel", *(str(j) for j in job_ids)], timeout=timeout)


def hostnames(nodelist: str, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Expand a hostlist expression (``n[1-3]``) with ``scontrol show hostnames``."""
    if not nodelist:
        return []
    return run(["scontrol", "show", "hostnames", nodelist], timeout=timeout).split()


def node_addr(node: str, timeout: float = DEFAULT_TIMEOUT) -> str:
    """The address Slurm reaches ``node`` at (``NodeAddr``), falling back to the node name."""
    out = run(["scontrol", "show", "node", "-o", node], timeout=timeout)
    m = re.search(r"\bNodeAddr=(\S+)", out)
    return m.group(1) if m else node


def drain_node(node: str, reason: str, timeout: float = DEFAULT_TIMEOUT) -> None:
    """``scontrol update NodeName=<node> State=DRAIN Reason=<reason>``: Slurm starts no new job on
    the node and keeps the reason (``sinfo -R``) until an admin resumes it (``State=RESUME``).
    Needs a Slurm admin (SlurmUser or root; ``man scontrol``, "update"). The reason is one
    argument, so it may hold spaces.

    Raises:
        ValueError: an empty node name or reason.
        SlurmUnavailable, SlurmError: as :func:`run` (e.g. not permitted, unknown node).
    """
    if not node or not reason:
        raise ValueError("drain_node: node and reason must not be empty")
    run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"],
        timeout=timeout)
