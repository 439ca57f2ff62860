"""Extension allocations: the Slurm jobs a running hpcsched job adds to itself to grow without
restarting (``docs/extensions.md``), as both sides see them.

An hpcsched job is its **primary** Slurm job (what ``hpcsub`` submitted) plus zero or more
**extension** jobs, each some GPUs on one node, submitted by the job itself (its rank 0, as the
job's user) and tagged with a ``--comment`` (:func:`extension_comment`) so that ``squeue``,
``sacct``, a ``job_submit`` plugin and the daemon can tell what they are and whose. Rank 0 keeps
the list in ``extensions.json`` (:class:`Extensions`); the launcher cancels what is left when the
primary ends, and the daemon reaps any extension whose primary is gone.

A **layout** is ``{node: GPUs}``: the whole allocation a job runs on (``control.json``'s
``layout``; :func:`format_layout` / :func:`parse_layout` for its text form ``n1:4,n2:2``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from hpcsched.protocol.files import (
    ProtocolError,
    _check_fields,
    _expect,
    _expect_member,
    check_layout,
    load_json_object,
    write_valid,
)

EXTENSIONS_SCHEMA = "hpcsched.extensions/1"
#: the first field of an extension job's ``--comment``
TAG = "hpcsched-extension"
_COMMENT = re.compile(rf"{TAG}:(\d{{1,12}}):([A-Za-z0-9._-]{{1,64}}):g(\d{{1,12}})")
#: the most extension allocations ``extensions.json`` may list (rank 0 prunes released ones)
MAX_EXTENSIONS = 1024


def layout_pairs(layout: Mapping[str, int]) -> tuple[str, ...]:
    """``("n1:4", "n2:2")``: a layout as the ``node:GPUs`` pairs of a control generation and
    of the journal's placement (in the order given)."""
    return tuple(f"{n}:{g}" for n, g in layout.items())


def format_layout(layout: Mapping[str, int]) -> str:
    """``n1:4,n2:2`` (in the order given)."""
    return ",".join(layout_pairs(layout))


def parse_layout(text: str) -> dict[str, int]:
    """The inverse of :func:`format_layout`: ``"n1:4,n2:2"`` -> ``{"n1": 4, "n2": 2}``.

    Raises:
        ProtocolError: not ``NODE:GPUS`` pairs separated by commas, a node named twice, or a
            count that is not an integer >= 1.
    """
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        node, sep, count = part.partition(":")
        if not sep or not count.strip().isdigit():
            raise ProtocolError(f"layout {text!r}: {part!r} is not NODE:GPUS")
        if node in out:
            raise ProtocolError(f"layout {text!r}: node {node} named twice")
        out[node] = int(count)
    check_layout("layout", out)
    return out


def extension_comment(primary_job_id: str, job_uid: str, generation: int) -> str:
    """The ``--comment`` of an extension job: ``hpcsched-extension:<primary>:<uid>:g<gen>``."""
    return f"{TAG}:{primary_job_id}:{job_uid}:g{generation}"


def parse_extension_comment(comment: str) -> tuple[str, str, int] | None:
    """``(primary job id, job uid, generation)`` of an extension job's comment; None for any
    other comment."""
    m = _COMMENT.fullmatch((comment or "").strip())
    return (m.group(1), m.group(2), int(m.group(3))) if m else None


class ExtensionState(StrEnum):
    """Where an extension allocation is.

    * ``SUBMITTED``: Slurm took the job; its workers have not joined yet.
    * ``JOINED``: its workers are ranks of the job's process group.
    * ``RELEASED``: its workers left (a shrink or a move); the job ends and its GPUs go back.
    * ``LOST``: it ended without being released (cancelled, preempted, node failure); the job
      re-formed without it.
    * ``REFUSED``: Slurm refused it, or it did not start in time (``reason`` says which).
    """

    SUBMITTED = "submitted"
    JOINED = "joined"
    RELEASED = "released"
    LOST = "lost"
    REFUSED = "refused"

    @property
    def active(self) -> bool:
        """It may hold (or be about to hold) GPUs."""
        return self in (ExtensionState.SUBMITTED, ExtensionState.JOINED)


@dataclass(frozen=True)
class Extension:
    """One extension allocation.

    Attributes:
        job_id: its Slurm job id. node: the node it runs on. gpus: GPUs (= workers) it holds.
        generation: the control generation it was submitted for.
        state: an :class:`ExtensionState`. submitted_at, updated_at: Unix seconds.
        reason: why it was refused or lost (Slurm's reason where there is one).
        ready_at: Unix seconds when the last of its workers was ready to join (0: not yet):
            ``ready_at - submitted_at`` is the extension's start-up time (Slurm scheduling,
            Python and torch imports, the script's set-up).
    """

    job_id: str
    node: str
    gpus: int
    generation: int
    state: ExtensionState
    submitted_at: float
    updated_at: float
    reason: str = ""
    ready_at: float = 0.0

    def to(self, state: ExtensionState, at: float, reason: str = "") -> Extension:
        return replace(self, state=state, updated_at=at, reason=reason or self.reason)


@dataclass(frozen=True)
class Extensions:
    """``extensions.json``: a job's extension allocations, written only by its rank 0.

    Attributes:
        job_uid: the job directory's id. primary_job_id: the primary Slurm job.
        extensions: oldest first. time: Unix seconds of the write.
    """

    job_uid: str
    primary_job_id: str
    extensions: tuple[Extension, ...] = ()
    time: float = 0.0
    schema: str = EXTENSIONS_SCHEMA

    @property
    def active(self) -> tuple[Extension, ...]:
        return tuple(e for e in self.extensions if e.state.active)

    def layout(self, primary: dict[str, int]) -> dict[str, int]:
        """The job's layout: ``primary`` plus the GPUs of every joined extension."""
        out = dict(primary)
        for e in self.extensions:
            if e.state == ExtensionState.JOINED:
                out[e.node] = out.get(e.node, 0) + e.gpus
        return out

    def validate(self, path: Path | str = "extensions.json") -> Extensions:
        _expect(path, "primary_job_id", self.primary_job_id, str)
        if len(self.extensions) > MAX_EXTENSIONS:
            raise ProtocolError(f"{path}: {len(self.extensions)} extensions (at most "
                                f"{MAX_EXTENSIONS})")
        for e in self.extensions:
            _expect(path, "extensions[].job_id", e.job_id, str)
            _expect(path, "extensions[].node", e.node, str)
            check_layout(path, {e.node: e.gpus})
            _expect(path, "extensions[].generation", e.generation, int, 0)
            _expect_member(path, "extensions[].state", e.state, ExtensionState)
            _expect(path, "extensions[].submitted_at", e.submitted_at, (int, float))
            _expect(path, "extensions[].updated_at", e.updated_at, (int, float))
            _expect(path, "extensions[].reason", e.reason, str)
            _expect(path, "extensions[].ready_at", e.ready_at, (int, float))
        return self


def write_extensions(path: Path, ext: Extensions) -> None:
    """Validate and atomically write ``extensions.json``.

    Raises:
        ProtocolError: ``ext`` is invalid.
    """
    write_valid(path, ext)


def read_extensions(path: Path, job_uid: str | None = None) -> Extensions | None:
    """Read ``extensions.json``; None if absent.

    Raises:
        ProtocolError: malformed, wrong schema, wrong job, or invalid values.
    """
    obj = load_json_object(path)
    if obj is None:
        return None
    fields_ = _check_fields(path, obj, Extensions, EXTENSIONS_SCHEMA, job_uid)
    raw = fields_.get("extensions", [])
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise ProtocolError(f"{path}: field 'extensions' must be a list of objects")
    items = []
    for e in raw[:MAX_EXTENSIONS + 1]:
        try:
            items.append(Extension(**e))
        except TypeError as exc:
            raise ProtocolError(f"{path}: an extension entry: {exc}") from None
    ext = Extensions(**{**fields_, "extensions": tuple(items)}).validate(path)
    return replace(ext, extensions=tuple(replace(e, state=ExtensionState(e.state))
                                         for e in ext.extensions))


__all__ = ["EXTENSIONS_SCHEMA", "TAG", "Extension", "ExtensionState", "Extensions",
           "extension_comment", "format_layout", "layout_pairs", "parse_extension_comment", "parse_layout",
           "read_extensions", "write_extensions"]
