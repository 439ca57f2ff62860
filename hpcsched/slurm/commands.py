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
    cpus_per_task: int = 1  # from cpus / tasks: 22.05's JSON leaves cpus_per_task null

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
        cpus_per_task=max(1, int(j.get("cpus_per_task") or
                                 (int(j.get("cpus") or 0) // max(1, int(j.get("tasks") or 1))) or 1)),
    )


def _load_doc(text: object, what: str, key: str) -> list:
    """Decode a ``--json`` document and return its ``key`` list, or raise SlurmError."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise SlurmError(f"{what}: expected text, got {type(text).__name__}")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        tail = "(empty)" if not text.strip() else f"(at char {exc.pos} of {len(text)})"
        raise SlurmError(f"{what}: output is not valid JSON, truncated? {tail}: {exc.msg}") from exc
    if not isinstance(doc, dict):
        raise SlurmError(f"{what}: expected a JSON object at top level, got {type(doc).__name__}")
    errors = doc.get("errors") or []
    if errors:
        raise _reported_error(what, errors, doc.get(key))
    if key not in doc:
        raise SlurmError(f"{what}: no {key!r} in the output (keys: {sorted(doc)[:8]})")
    items = doc[key]
    if not isinstance(items, list):
        raise SlurmError(f"{what}: {key!r} should be a list, got {type(items).__name__} {items!r:.80}")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise SlurmError(f"{what}: {key}[{i}] should be an object, got {item!r:.80}")
    return items


def _reported_error(what: str, errors: object, items: object) -> SlurmError:
    """The exception for a document whose ``errors`` list is not empty.

    Measured on 22.05.8: with the controller unreachable, ``squeue --json`` and ``sinfo --json``
    exit **0** after about 9 s (the client's connect retries), print nothing on stderr, and print
    ``{"errors": [{"error": "Unspecified error", "errno": -1}], "nodes": []}`` (sinfo) or
    ``{"errors": [{"description": "Failed while looking for jobs", "error_number": -1,
    "error": "Unspecified error", "source": "slurm_load_jobs"}], "jobs": []}`` (squeue). Taking
    that for "no jobs, no nodes" would be a disaster, so any error fails the observation: with no
    data and an unspecified error (errno -1) or a failed ``slurm_load_*``, it is
    :class:`SlurmUnavailable`; otherwise :class:`SlurmError`.
    """
    errs = errors if isinstance(errors, list) else [errors]
    texts, unreachable = [], False
    for e in errs:
        if isinstance(e, dict):
            num = e.get("error_number", e.get("errno"))
            src = str(e.get("source") or "")
            texts.append("; ".join(str(e[k]) for k in ("source", "description", "error")
                                   if e.get(k)) + (f" (errno {num})" if num is not None else ""))
            if num == -1 or src.startswith("slurm_load_") or _UNREACHABLE.search(str(e)):
                unreachable = True
        else:
            texts.append(str(e))
            unreachable = unreachable or bool(_UNREACHABLE.search(str(e)))
    msg = f"{what} reported errors: {' | '.join(texts)[:300]}"
    if unreachable and not items:
        return SlurmUnavailable(msg + " (the controller did not answer?)")
    return SlurmError(msg)


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses and brackets (``gpu:2(IDX:0,2)``, ``n[1,3]``)."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def _expand_one(part: str, whole: str) -> list[str]:
    lb = part.find("[")
    if lb < 0:
        if "]" in part:
            raise SlurmError(f"hostlist {whole!r}: unbalanced ']'")
        return [part]
    rb = part.find("]", lb)
    if rb < 0:
        raise SlurmError(f"hostlist {whole!r}: unbalanced '['")
    head, body, tail = part[:lb], part[lb + 1:rb], part[rb + 1:]
    tails = _expand_one(tail, whole) if tail else [""]
    out = []
    for rng in body.split(","):
        lo, _, hi = rng.strip().partition("-")
        hi = hi or lo
        if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
            raise SlurmError(f"hostlist {whole!r}: bad range {rng!r}")
        width = len(lo) if lo.startswith("0") else 0
        for k in range(int(lo), int(hi) + 1):
            out.extend(f"{head}{k:0{width}d}{t}" for t in tails)
    return out


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression without calling Slurm: ``"n[1-3,5],m01"`` ->
    ``["n1", "n2", "n3", "n5", "m01"]``; zero padding is kept (``n[01-02]``), several bracket
    groups multiply (``r[1-2]n[1-2]``). Equivalent to ``scontrol show hostnames`` for these forms.

    Raises:
        SlurmError: unbalanced brackets or a range that is not numeric.
    """
    out: list[str] = []
    for part in _split_top(expr or ""):
        out.extend(_expand_one(part, expr))
    return out


def parse_squeue_json(text: str | bytes) -> dict[str, JobInfo]:
    """Parse ``squeue --json`` output into ``{job_id: JobInfo}``.

    Raises:
        SlurmUnavailable: the document reports that the controller could not be reached (22.05
            then exits 0 with an empty list: see :func:`_reported_error`).
        SlurmError: anything else that is not the JSON squeue documents (e.g. truncated).
    """
    jobs = _load_doc(text, "squeue --json", "jobs")
    out = {}
    for i, j in enumerate(jobs):
        if j.get("job_id") is None:
            raise SlurmError(f"squeue --json: jobs[{i}] has no job_id: {j!r:.120}")
        try:
            info = _job_from_json(j)
        except (TypeError, ValueError, AttributeError) as exc:
            raise SlurmError(f"squeue --json: jobs[{i}]: unexpected value ({exc})") from exc
        out[info.job_id] = info
    return out


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
