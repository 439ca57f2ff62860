"""The GPU probe record: what ``slurm-plugins/prolog-gpu-probe`` (:mod:`hpcsched.probe`) writes on
a compute node and the daemon (:mod:`hpcsched.daemon.probes`) ingests (docs/slurm-plugins.md).

One JSON file per job and node, ``<node>-<job id>.json`` in the probe spool directory, written
atomically (a temporary ``.<name>.*.tmp`` beside it, then a rename; readers skip dot-files)::

    {"schema": "hpcsched.gpu-probe/1", "node": "n1", "job_id": "42", "time": 1790000000.0,
     "kind": "cuda",  "gpus": [{"index": "0", "uuid": "GPU-...", "model": "NVIDIA H100 ...",
                                "score": 612.3, "unit": "TFLOP/s", "seconds": 1.0}],
     "errors": []}

``kind`` is ``cuda`` (a CUDA matrix multiply per GPU: ``score`` in TFLOP/s) or ``cpu-stand-in``
(no CUDA on the node, as on the fake-GPU dev cluster: a NumPy matrix multiply on the CPU, in
GFLOP/s, one per Slurm GPU index, keyed by node and index; **not** a GPU measurement). Both count
2·n³ floating-point operations per n×n multiply. ``time`` is UTC Unix seconds when the probe
ended; ``seconds`` how long that GPU's timed loop ran.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from hpcsched.protocol.files import ProtocolError

SCHEMA = "hpcsched.gpu-probe/1"
KIND_CUDA = "cuda"
KIND_CPU = "cpu-stand-in"
KINDS = (KIND_CUDA, KIND_CPU)
UNITS = {KIND_CUDA: "TFLOP/s", KIND_CPU: "GFLOP/s"}
#: the most bytes a probe file may hold (a node with 64 GPUs writes about 10 KiB)
MAX_FILE_BYTES = 256 << 10
MAX_GPUS = 256

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_INDEX = re.compile(r"^\d{1,6}$")
_JOB = re.compile(r"^\d{1,12}(_\d{1,12})?$")


def file_name(node: str, job_id: str) -> str:
    """``<node>-<job id>.json``: one probe file per job and node."""
    return f"{node}-{job_id}.json"


@dataclass(frozen=True)
class GpuScore:
    """One GPU's probe: Slurm's GPU ``index`` on its node, its ``uuid`` ("" when unknown),
    ``model`` (the device name; "" for the CPU stand-in), ``score`` in ``unit``, over
    ``seconds`` of timed work."""

    index: str
    score: float
    unit: str
    seconds: float
    uuid: str = ""
    model: str = ""


@dataclass(frozen=True)
class ProbeRecord:
    """A probe file's content (see the module docstring)."""

    node: str
    job_id: str
    time: float
    kind: str
    gpus: tuple[GpuScore, ...]
    errors: tuple[str, ...] = field(default=())
    schema: str = SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.schema, "node": self.node, "job_id": self.job_id, "time": self.time,
                "kind": self.kind, "errors": list(self.errors),
                "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "score": g.score,
                          "unit": g.unit, "seconds": g.seconds} for g in self.gpus]}


def _finite(v: Any, what: str, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ProtocolError(f"{what}: expected a finite number, got {v!r:.40}")
    if positive and v <= 0:
        raise ProtocolError(f"{what}: expected a number > 0, got {v!r}")
    return float(v)


def _text(v: Any, what: str, limit: int, pattern: re.Pattern | None = None) -> str:
    if not isinstance(v, str) or len(v) > limit or (pattern is not None and not pattern.match(v)):
        raise ProtocolError(f"{what}: invalid value {v!r:.60}")
    return v


def parse_record(data: Any) -> ProbeRecord:
    """Check a decoded probe file and return it as a :class:`ProbeRecord`.

    Raises:
        ProtocolError: another schema, a missing or malformed field, an unknown kind, a unit
            that is not the kind's, or a score that is not a finite positive number.
    """
    if not isinstance(data, dict):
        raise ProtocolError("not a JSON object")
    if data.get("schema") != SCHEMA:
        raise ProtocolError(f"schema: expected {SCHEMA!r}, got {data.get('schema')!r:.60}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise ProtocolError(f"kind: expected one of {'|'.join(KINDS)}, got {kind!r:.60}")
    node = _text(data.get("node"), "node", 128, _NAME)
    job_id = _text(data.get("job_id"), "job_id", 32, _JOB)
    when = _finite(data.get("time"), "time")
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
        raise ProtocolError(f"gpus: expected a list of at most {MAX_GPUS} objects")
    errors = data.get("errors", [])
    if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
        raise ProtocolError("errors: expected a list of strings")
    scores = []
    for i, g in enumerate(gpus):
        if not isinstance(g, dict):
            raise ProtocolError(f"gpus[{i}]: not an object")
        unit = g.get("unit")
        if unit != UNITS[kind]:
            raise ProtocolError(f"gpus[{i}].unit: expected {UNITS[kind]!r} for kind {kind}, got {unit!r:.40}")
        scores.append(GpuScore(index=_text(g.get("index"), f"gpus[{i}].index", 6, _INDEX),
                               score=_finite(g.get("score"), f"gpus[{i}].score"), unit=unit,
                               seconds=_finite(g.get("seconds"), f"gpus[{i}].seconds"),
                               uuid=_text(g.get("uuid", ""), f"gpus[{i}].uuid", 64),
                               model=_text(g.get("model", ""), f"gpus[{i}].model", 128)))
    return ProbeRecord(node=node, job_id=job_id, time=when, kind=kind, gpus=tuple(scores),
                       errors=tuple(e[:500] for e in errors[:20]))
