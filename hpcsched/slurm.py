"""Thin glue over Slurm's command-line tools (Slurm 22.05: ``squeue --json``, ``scontrol``).

Every call is an argument list (never a shell) with a timeout. A controller that does not
answer raises :class:`SlurmUnavailable`; a command that answers with an error raises
:class:`SlurmError` carrying Slurm's own message. Facts this relies on were measured on
Slurm 22.05.8 and are recorded in ``shared/slurm-22.05-notes.md`` (§3): ``squeue --json``
follows openapi v0.0.38; ``scontrol`` has no ``--json``.

This is deliberately small; a backend interface with a pyslurm implementation is built on top of
it for the daemon.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import threading
from dataclasses import dataclass
from typing import Sequence

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 20.0


class SlurmError(RuntimeError):
    """A Slurm command failed; ``str()`` carries Slurm's message."""


class SlurmUnavailable(SlurmError):
    """The Slurm controller did not answer (timed out or refused the connection)."""


_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Could not establish a configuration source|Zero Bytes were transmitted",
    re.IGNORECASE,
)


_calls = 0
_calls_lock = threading.Lock()


def calls() -> int:
    """Slurm commands run through :func:`run` by this process so far (for round statistics)."""
    return _calls


def run(args: Sequence[str], timeout: float = DEFAULT_TIMEOUT, env: dict | None = None) -> str:
    """Run a Slurm command and return its stdout.

    Raises:
        SlurmUnavailable: timeout, or Slurm reports that the controller cannot be reached.
        SlurmError: non-zero exit (message: the command's stderr) or the binary is missing.
    """
    global _calls
    args = [str(a) for a in args]
    log.debug("slurm: %s", " ".join(args))
    with _calls_lock:
        _calls += 1
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout,
            env=None if env is None else {**os.environ, **env},
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnavailable(f"{args[0]} did not answer within {timeout:g} s") from exc
    except FileNotFoundError as exc:
        raise SlurmError(f"{args[0]}: not found; is Slurm installed and on PATH?") from exc
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        text = "; ".join(msg[-3:]) or f"exit status {proc.returncode}"
        err = SlurmUnavailable if _UNREACHABLE.search(text) else SlurmError
        raise err(f"{' '.join(args[:3])}: {text}")
    return proc.stdout


@dataclass(frozen=True)
class JobInfo:
    """One job as ``squeue --json`` reports it (fields we use; times in Unix seconds)."""

    job_id: str
    name: str
    user: str
    state: str              # PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, ...
    state_reason: str
    partition: str
    nodes: str              # Slurm hostlist expression, "" while pending
    node_count: int
    gpus_per_node: int      # from tres_per_node "gres:gpu:N" (0 if none)
    restarts: int
    batch_host: str
    priority: int

    @property
    def active(self) -> bool:
        return self.state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
                              "REQUEUED", "RESIZING")


_GPU_TRES = re.compile(r"(?:^|,)(?:gres:|gres/)?gpu(?::[^:,=]+)?[:=](\d+)")


def gpus_from_tres(tres: str | None) -> int:
    """GPUs per node from a ``tres_per_node`` string such as ``gres:gpu:4`` (0 if none)."""
    if not tres:
        return 0
    m = _GPU_TRES.search(tres)
    return int(m.group(1)) if m else 0


def _job_from_json(j: dict) -> JobInfo:
    state = j.get("job_state") or ""
    if isinstance(state, list):  # newer openapi versions report a list of flags
        state = state[0] if state else ""
    return JobInfo(
        job_id=str(j["job_id"]),
        name=str(j.get("name") or ""),
        user=str(j.get("user_name") or j.get("user_id") or ""),
        state=str(state),
        state_reason=str(j.get("state_reason") or ""),
        partition=str(j.get("partition") or ""),
        nodes=str(j.get("nodes") or ""),
        node_count=int(j.get("node_count") or 0),
        gpus_per_node=gpus_from_tres(j.get("tres_per_node")),
        restarts=int(j.get("restart_cnt") or 0),
        batch_host=str(j.get("batch_host") or ""),
        priority=int(j.get("priority") or 0),
    )


def parse_squeue_json(text: str) -> dict[str, JobInfo]:
    """Parse ``squeue --json`` output into ``{job_id: JobInfo}``.

    Raises:
        SlurmError: the output is not the JSON squeue documents (e.g. truncated).
    """
    try:
        doc = json.loads(text)
        jobs = doc["jobs"]
        return {info.job_id: info for info in map(_job_from_json, jobs)}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise SlurmError(f"squeue --json: unexpected output ({exc})") from exc


def squeue(timeout: float = DEFAULT_TIMEOUT) -> dict[str, JobInfo]:
    """All jobs Slurm still knows (one call, whatever the number of jobs)."""
    return parse_squeue_json(run(["squeue", "--json"], timeout=timeout))


def job_info(job_id: str | int, timeout: float = DEFAULT_TIMEOUT) -> JobInfo | None:
    """One job (finished ones too, until MinJobAge), or ``None`` once Slurm has forgotten it.

    Slurm 22.05's ``squeue --json`` ignores ``--jobs`` and ``--states`` and always returns every
    job it knows, finished ones included (measured), so this filters by itself.
    """
    return squeue(timeout=timeout).get(str(job_id))


def update_job(job_id: str | int, timeout: float = DEFAULT_TIMEOUT, **fields: object) -> None:
    """``scontrol update JobId=<id> Key=Value ...`` (e.g. ``NumNodes=3``, ``StartTime="now"``)."""
    args = ["scontrol", "update", f"JobId={job_id}"]
    args += [f"{k}={v}" for k, v in fields.items()]
    run(args, timeout=timeout)


def requeue(job_id: str | int, hold: bool = False, timeout: float = DEFAULT_TIMEOUT) -> None:
    """``scontrol requeue`` (or ``requeuehold``) a running job."""
    run(["scontrol", "requeuehold" if hold else "requeue", str(job_id)], timeout=timeout)


def release(job_id: str | int, timeout: float = DEFAULT_TIMEOUT) -> None:
    run(["scontrol", "release", str(job_id)], timeout=timeout)


def hostnames(nodelist: str, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Expand a hostlist expression (``n[1-3]``) with ``scontrol show hostnames``."""
    if not nodelist:
        return []
    return run(["scontrol", "show", "hostnames", nodelist], timeout=timeout).split()


_HOSTLIST_PART = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?([^,\[]*)")


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist (``n[1-3,5]``, ``gpu[01-02],login1``) without calling Slurm.

    Handles one bracket group per name with ranges, lists and zero padding, which is what
    Slurm prints for node lists (hostlist(3)); anything else is returned as it is.
    """
    out: list[str] = []
    for m in _HOSTLIST_PART.finditer(expr or ""):
        prefix, body, suffix = m.group(1), m.group(2), m.group(3)
        if not prefix.strip() and body is None:
            continue
        if body is None:
            out.append(prefix + suffix)
            continue
        for item in body.split(","):
            lo, _, hi = item.partition("-")
            if not hi:
                out.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo) if lo.startswith("0") else 0
            out.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    return out


def node_addr(node: str, timeout: float = DEFAULT_TIMEOUT) -> str:
    """The address Slurm reaches ``node`` at (``NodeAddr``), falling back to the node name."""
    out = run(["scontrol", "show", "node", "-o", node], timeout=timeout)
    m = re.search(r"\bNodeAddr=(\S+)", out)
    return m.group(1) if m else node


def parse_resize_script(text: str) -> tuple[dict[str, str], list[str]]:
    """Parse ``slurm_job_<id>_resize.sh`` into (variables to set, variables to unset).

    Slurm writes ``export NAME="value"`` and ``unset NAME`` lines (22.05, measured: see the
    notes §3). Anything else is ignored.
    """
    setv: dict[str, str] = {}
    unset: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r'export\s+([A-Za-z_][A-Za-z0-9_]*)=(?:"([^"]*)"|(\S*))', line)
        if m:
            setv[m.group(1)] = m.group(2) if m.group(2) is not None else m.group(3)
            continue
        m = re.match(r"unset\s+([A-Za-z_][A-Za-z0-9_]*)", line)
        if m:
            unset.append(m.group(1))
    return setv, unset
