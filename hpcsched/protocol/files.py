"""The control-file protocol between hpcsched (daemon, ``hpcsched resize``) and a running job.

Specified in ``docs/control-protocol.md``; this module is its only implementation, used by both
sides. Three files live in the job directory (see :mod:`hpcsched.protocol.jobdir`):

* ``control.json`` -- written only by hpcsched. Asks the job for a configuration: generation
  (only grows), nodes, workers per node, global/local batch size, gradient-accumulation steps,
  learning-rate scale, and the action (``continue``, ``checkpoint-and-shrink``,
  ``checkpoint-and-requeue``).
* ``ack.json`` -- written only by the job (the launcher or rank 0, never both at once): the
  last generation it has seen and what it did about it (``checkpointed``, ``applied``,
  ``rejected``).
* ``progress.json`` -- written only by rank 0, every few seconds: where training is.
* ``launcher.json`` -- written only by the job's launcher, at each phase change: what it is doing
  (:class:`LauncherState`).

Every write is atomic: a temporary file in the same directory, ``fsync``, then ``rename``
(POSIX rename is atomic within a file system), so a reader sees the old file or the new one,
never half of one. A malformed file, a file of another schema version, or one that names
another job raises :class:`ProtocolError`; callers report it and do not act on it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import MISSING, asdict, dataclass, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from hpcsched.protocol.kinds import AckState, ControlAction, LauncherPhase

CONTROL_SCHEMA = "hpcsched.control/1"
ACK_SCHEMA = "hpcsched.ack/1"
PROGRESS_SCHEMA = "hpcsched.progress/1"
LAUNCHER_SCHEMA = "hpcsched.launcher/1"

ACTIONS = tuple(a.value for a in ControlAction)
ACK_STATES = tuple(s.value for s in AckState)
LAUNCHER_PHASES = tuple(p.value for p in LauncherPhase)


class ProtocolError(ValueError):
    """A control, acknowledgement, progress or launcher file that must not be acted on."""


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temporary file + fsync + rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=1, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None if the file does not exist.

    Raises:
        ProtocolError: unreadable, not JSON, or not an object.
    """
    try:
        raw = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ProtocolError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(obj, dict):
        raise ProtocolError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _check_fields(path: Path, obj: dict[str, Any], cls: type, schema: str, job_uid: str | None):
    got = obj.get("schema")
    if got != schema:
        raise ProtocolError(f"{path}: schema {got!r} is not {schema!r}; refusing to act on it")
    if job_uid is not None and obj.get("job_uid") != job_uid:
        raise ProtocolError(
            f"{path}: written for job {obj.get('job_uid')!r}, not this job ({job_uid}); ignoring it"
        )
    out = {}
    for f in fields(cls):
        if f.name == "schema":
            continue
        if f.name not in obj:
            if f.default is not MISSING:
                continue
            raise ProtocolError(f"{path}: missing field {f.name!r}")
        out[f.name] = obj[f.name]
    return out


def _expect(path: Path, name: str, value: Any, typ: type | tuple, minimum: float | None = None):
    ok = isinstance(value, typ) and not (typ in (int, float, (int, float)) and isinstance(value, bool))
    if not ok:
        want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise ProtocolError(f"{path}: field {name!r} must be {want}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ProtocolError(f"{path}: field {name!r} must be >= {minimum}, got {value!r}")


def _expect_member(path: Path, name: str, value: Any, kind: type[StrEnum]) -> None:
    values = tuple(m.value for m in kind)
    if value not in values:
        raise ProtocolError(f"{path}: {name} {value!r} is not one of {', '.join(values)}")


@dataclass(frozen=True)
class Control:
    """One request from hpcsched to a job (``control.json``).

    Attributes:
        job_uid: the job directory's id (assigned by ``hpcsub``); guards against foreign files.
        generation: >= 1, strictly greater than every earlier generation for this job.
        action: ``continue`` (same nodes: change batch size at the next step boundary, or no
            change), ``checkpoint-and-shrink`` (checkpoint, release nodes from inside the job,
            relaunch on fewer nodes), ``checkpoint-and-requeue`` (checkpoint and wait to be
            requeued at a new size by hpcsched).
        nodes: nodes the job should run on.
        workers_per_node: workers (GPU slots) per node.
        global_batch_size, local_batch_size, accumulation_steps: samples; see
            :class:`hpcsched.protocol.batching.BatchConfig`.
        lr_scale: factor applied to the base learning rate (dimensionless).
        issued_at: Unix time (seconds) of the request.
        issued_by: who wrote it (free text, e.g. ``hpcsched resize``).
        reason: why (free text, shown by ``hpcsched status``).
    """

    job_uid: str
    generation: int
    action: ControlAction
    nodes: int
    workers_per_node: int
    global_batch_size: int
    local_batch_size: int
    accumulation_steps: int
    lr_scale: float
    issued_at: float
    issued_by: str = ""
    reason: str = ""
    schema: str = CONTROL_SCHEMA

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node

    def validate(self, path: Path | str = "control.json") -> Control:
        path = Path(path)
        _expect(path, "job_uid", self.job_uid, str)
        _expect(path, "generation", self.generation, int, 1)
        _expect_member(path, "action", self.action, ControlAction)
        for name in ("nodes", "workers_per_node", "global_batch_size", "local_batch_size",
                     "accumulation_steps"):
            _expect(path, name, getattr(self, name), int, 1)
        _expect(path, "lr_scale", self.lr_scale, (int, float))
        if not self.lr_scale > 0:
            raise ProtocolError(f"{path}: field 'lr_scale' must be > 0, got {self.lr_scale!r}")
        _expect(path, "issued_at", self.issued_at, (int, float))
        if self.global_batch_size != self.world_size * self.local_batch_size * self.accumulation_steps:
            raise ProtocolError(
                f"{path}: global_batch_size {self.global_batch_size} != nodes {self.nodes} x "
                f"workers_per_node {self.workers_per_node} x local_batch_size "
                f"{self.local_batch_size} x accumulation_steps {self.accumulation_steps}"
            )
        return self


@dataclass(frozen=True)
class Ack:
    """The job's answer to a generation (``ack.json``).

    Attributes:
        job_uid: as in :class:`Control`.
        generation: the generation answered (0 = the submitted configuration).
        state: ``checkpointed`` (a consistent checkpoint is on disk and the workers have stopped
            for a resize), ``applied`` (the first step at this generation's configuration is
            about to run), ``rejected`` (the job cannot apply it; see ``message``).
        world_size, nodes, global_batch_size, local_batch_size, accumulation_steps: what is
            really in force (may differ from the request, e.g. when Slurm gave fewer nodes).
        step: optimizer steps completed so far.
        time: Unix time (seconds) of the acknowledgement.
        checkpoint: path of the checkpoint written for this generation, if any.
        message: free text.
    """

    job_uid: str
    generation: int
    state: AckState
    world_size: int
    nodes: int
    global_batch_size: int
    local_batch_size: int
    accumulation_steps: int
    step: int
    time: float
    checkpoint: str = ""
    message: str = ""
    schema: str = ACK_SCHEMA

    def validate(self, path: Path | str = "ack.json") -> Ack:
        path = Path(path)
        _expect(path, "generation", self.generation, int, 0)
        _expect_member(path, "state", self.state, AckState)
        for name in ("world_size", "nodes", "global_batch_size", "local_batch_size",
                     "accumulation_steps"):
            _expect(path, name, getattr(self, name), int, 1)
        _expect(path, "step", self.step, int, 0)
        _expect(path, "time", self.time, (int, float))
        return self


@dataclass(frozen=True)
class Progress:
    """Where training is (``progress.json``), written by rank 0 every few seconds.

    Attributes:
        generation: configuration in force. step: optimizer steps done. epoch: current epoch
        (0-based). samples_processed: samples trained on since the job began (all epochs, all
        ranks; work lost to a crash is not counted). epoch_position: samples done in this
        epoch. throughput: samples/s over the last reporting interval. world_size,
        global_batch_size: in force. time: Unix seconds. finished: training loop ended.
        total_samples: samples the whole run trains on (epochs x dataset size), so the work left
        is ``total_samples - samples_processed``; None if the job does not say.
        grad_sqr, grad_var: the job's smoothed gradient-noise statistics, |G|^2 and tr(Sigma)
        (per-sample covariance), from :class:`hpcsched.job.elastic.GradientNoiseEstimator`; None
        until the first estimate. Optional, so files written before these fields still read.
    """

    job_uid: str
    generation: int
    step: int
    epoch: int
    samples_processed: int
    epoch_position: int
    throughput: float
    world_size: int
    global_batch_size: int
    time: float
    finished: bool = False
    total_samples: int | None = None
    grad_sqr: float | None = None
    grad_var: float | None = None
    schema: str = PROGRESS_SCHEMA


@dataclass(frozen=True)
class LauncherState:
    """What the job's launcher is doing (``launcher.json``), written at each phase change.

    Attributes:
        job_uid: as in :class:`Control`.
        job_id: the Slurm job id the launcher runs in.
        phase: :class:`~hpcsched.protocol.kinds.LauncherPhase` (``running``, ``resizing``,
            ``awaiting-requeue``, ``finished``, ``failed``); the daemon gives a job whose phase
            is ``in_transition`` no other change.
        launches: ``srun`` launches of the workers so far in this Slurm run (and the runs before
            a requeue, whose state it read back).
        resizes: allocation changes the launcher adopted (Slurm's resize script).
        restarts: Slurm requeues of the job so far (``SLURM_RESTART_COUNT``).
        time: Unix time (seconds) of the write.
        nodelist: the allocation (Slurm hostlist expression) when written.
        generation, nodes, world_size, global_batch_size: the launch configuration in force
            (None outside a launch, e.g. while resizing).
        target_nodes: the node count a resize in progress goes to (``resizing``,
            ``awaiting-requeue``).
        exit_code: the workers' ``srun`` exit status (``finished``, ``failed``).
        error: why the launcher failed (``failed``), "" otherwise.
    """

    job_uid: str
    job_id: str
    phase: LauncherPhase
    launches: int
    resizes: int
    restarts: int
    time: float
    nodelist: str = ""
    generation: int | None = None
    nodes: int | None = None
    world_size: int | None = None
    global_batch_size: int | None = None
    target_nodes: int | None = None
    exit_code: int | None = None
    error: str = ""
    schema: str = LAUNCHER_SCHEMA

    def validate(self, path: Path | str = "launcher.json") -> LauncherState:
        path = Path(path)
        _expect(path, "job_uid", self.job_uid, str)
        _expect(path, "job_id", self.job_id, str)
        _expect_member(path, "phase", self.phase, LauncherPhase)
        for name in ("launches", "resizes", "restarts"):
            _expect(path, name, getattr(self, name), int, 0)
        _expect(path, "time", self.time, (int, float))
        for name in ("generation", "nodes", "world_size", "global_batch_size", "target_nodes"):
            if getattr(self, name) is not None:
                _expect(path, name, getattr(self, name), int, 0)
        if self.exit_code is not None:
            _expect(path, "exit_code", self.exit_code, int)
        return self


def write_control(path: Path, control: Control) -> None:
    """Validate and atomically write ``control``.

    Raises:
        ProtocolError: ``control`` is invalid, or its generation does not exceed the one on disk.
    """
    control.validate(path)
    try:
        current = read_control(path, control.job_uid)
    except ProtocolError:
        current = None  # a broken file is replaced, never trusted
    if current is not None and control.generation <= current.generation:
        raise ProtocolError(
            f"{path}: generation {control.generation} does not exceed the current "
            f"{current.generation}; generations only grow"
        )
    write_json_atomic(path, asdict(control))


def read_control(path: Path, job_uid: str | None = None) -> Control | None:
    """Read ``control.json``; ``None`` if absent.

    Raises:
        ProtocolError: malformed, wrong schema, wrong job, or invalid values.
    """
    obj = load_json_object(path)
    if obj is None:
        return None
    c = Control(**_check_fields(path, obj, Control, CONTROL_SCHEMA, job_uid)).validate(path)
    return replace(c, action=ControlAction(c.action))


def write_ack(path: Path, ack: Ack) -> None:
    """Validate and atomically write ``ack``."""
    ack.validate(path)
    write_json_atomic(path, asdict(ack))


def read_ack(path: Path, job_uid: str | None = None) -> Ack | None:
    """Read ``ack.json``; ``None`` if absent. Raises :class:`ProtocolError` if malformed."""
    obj = load_json_object(path)
    if obj is None:
        return None
    a = Ack(**_check_fields(path, obj, Ack, ACK_SCHEMA, job_uid)).validate(path)
    return replace(a, state=AckState(a.state))


def write_progress(path: Path, progress: Progress) -> None:
    write_json_atomic(path, asdict(progress))


def read_progress(path: Path, job_uid: str | None = None) -> Progress | None:
    """Read ``progress.json``; ``None`` if absent. Raises :class:`ProtocolError` if malformed."""
    obj = load_json_object(path)
    if obj is None:
        return None
    return Progress(**_check_fields(path, obj, Progress, PROGRESS_SCHEMA, job_uid))


def write_launcher_state(path: Path, state: LauncherState) -> None:
    """Validate and atomically write ``state`` (``launcher.json``).

    Raises:
        ProtocolError: ``state`` is invalid.
    """
    state.validate(path)
    write_json_atomic(path, asdict(state))


def read_launcher_state(path: Path, job_uid: str | None = None) -> LauncherState | None:
    """Read ``launcher.json``; ``None`` if absent.

    Raises:
        ProtocolError: malformed, wrong schema (a launcher older than the schema wrote none:
            ``schema None``), wrong job, or invalid values.
    """
    obj = load_json_object(path)
    if obj is None:
        return None
    st = LauncherState(**_check_fields(path, obj, LauncherState, LAUNCHER_SCHEMA, job_uid))
    st.validate(path)
    return replace(st, phase=LauncherPhase(st.phase))
