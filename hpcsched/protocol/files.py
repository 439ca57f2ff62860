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

import errno
import json
import math
import os
import re
import stat
import tempfile
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
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
    """Write ``obj`` as JSON to ``path`` atomically (temporary file + fsync + rename).

    The file is mode 0600 and belongs to the owner of its directory: a control file the daemon
    (root) writes into a user's job directory is that user's to read, and nobody else's.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if os.geteuid() == 0:
            st = os.stat(path.parent)
            if st.st_uid != 0:
                os.fchown(fd, st.st_uid, st.st_gid)
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


def write_valid(path: Path, record: Any) -> None:
    """``record.validate(path)`` (a protocol dataclass), then write it atomically as JSON.

    Raises:
        ProtocolError: the record is invalid (nothing is written).
    """
    record.validate(path)
    write_json_atomic(path, asdict(record))


#: the most bytes a control, ack, progress or launcher file may hold (they are a few hundred)
MAX_JSON_BYTES = 1 << 20
#: the largest integer a protocol field may hold (a 64-bit count), so no arithmetic overflows
MAX_INT = 2**63 - 1


def open_regular(path: Path | str, *, dir_fd: int | None = None) -> int | None:
    """A read-only descriptor of the regular file ``path``, or None if it does not exist.

    Opened with ``O_NOFOLLOW`` (a symbolic link as the last component is refused, so a job
    cannot point the daemon at another job's or the system's files) and ``O_NONBLOCK`` (a FIFO
    never blocks the opener), then checked with ``fstat`` to be a regular file. ``dir_fd``: open
    ``path`` relative to this directory descriptor (as :func:`os.open`). The caller closes it.

    Raises:
        ProtocolError: a symbolic link, not a regular file (FIFO, device, directory, socket), or
            not readable.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProtocolError(f"{path}: is a symbolic link; not followed") from exc
        raise ProtocolError(f"{path}: cannot open: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise ProtocolError(f"{path}: cannot stat: {exc.strerror}") from exc
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ProtocolError(f"{path}: not a regular file; not read")
    return fd


def read_bounded(path: Path | str, limit: int = MAX_JSON_BYTES) -> bytes | None:
    """The bytes of the regular file ``path`` (see :func:`open_regular`); None if it does not
    exist. At most ``limit`` bytes are read, whatever the file claims its size is.

    Raises:
        ProtocolError: as :func:`open_regular`; or the file holds more than ``limit`` bytes.
    """
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise ProtocolError(f"{path}: cannot read: {exc.strerror}") from exc
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise ProtocolError(f"{path}: larger than {limit} bytes; not read")
    return data


def parse_json_bytes(data: bytes, where: Path | str) -> Any:
    """The JSON value in ``data`` (UTF-8).

    Raises:
        ProtocolError: not UTF-8, not JSON, nested too deep for the parser (Python's ``json``
            raises RecursionError at about 1000 levels), or an integer too long to convert.
    """
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{where}: not UTF-8 (byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except RecursionError as exc:
        raise ProtocolError(f"{where}: JSON nested too deep") from exc
    except ValueError as exc:  # e.g. an integer over sys.get_int_max_str_digits() digits
        raise ProtocolError(f"{where}: not valid JSON ({exc})") from exc


def load_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None if the file does not exist.

    The file is read with bounds (:func:`read_bounded`: a regular file, no symbolic link, at
    most :data:`MAX_JSON_BYTES`), as everything a job can write must be.

    Raises:
        ProtocolError: unreadable, a symbolic link or not a regular file, too large, not UTF-8,
            not JSON, too deep, or not an object.
    """
    raw = read_bounded(path)
    if raw is None:
        return None
    obj = parse_json_bytes(raw, path)
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
            if f.default is not MISSING or f.default_factory is not MISSING:
                continue   # a field added later (e.g. layout): files written before lack it
            raise ProtocolError(f"{path}: missing field {f.name!r}")
        out[f.name] = obj[f.name]
    return out


def _expect(path: Path | str, name: str, value: Any, typ: type | tuple[type, ...],
            minimum: float | None = None) -> None:
    ok = isinstance(value, typ) and not (typ in (int, float, (int, float)) and isinstance(value, bool))
    if not ok:
        want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise ProtocolError(f"{path}: field {name!r} must be {want}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value) or isinstance(value, int) and abs(value) > MAX_INT:
        raise ProtocolError(f"{path}: field {name!r} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ProtocolError(f"{path}: field {name!r} must be >= {minimum}, got {value!r}")


def _expect_member(path: Path | str, name: str, value: Any, kind: type[StrEnum]) -> None:
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
        layout: ``{node: GPUs}``, the whole allocation the job should run on (the primary's
            GPUs and any extension allocations'); required by ``reform``, empty otherwise.
            With a layout the world size is its sum and ``nodes`` the number of its nodes.
        ack_by: Unix time (seconds) after which hpcsched stops waiting for the job's
            acknowledgement (``issued_at`` + ``daemon.ack_timeout``); 0: no deadline given
            (files written before it existed). A grow that cannot be done by then is refused
            with its reason (:func:`hpcsched.job.extension.out_of_time`).
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
    layout: dict[str, int] = field(default_factory=dict)
    ack_by: float = 0.0
    schema: str = CONTROL_SCHEMA

    @property
    def world_size(self) -> int:
        return sum(self.layout.values()) if self.layout else self.nodes * self.workers_per_node

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
        _expect(path, "ack_by", self.ack_by, (int, float), 0)
        check_layout(path, self.layout)
        if self.action == ControlAction.REFORM and not self.layout:
            raise ProtocolError(f"{path}: action 'reform' needs a layout")
        if self.layout and len(self.layout) != self.nodes:
            raise ProtocolError(f"{path}: nodes {self.nodes} != the layout's {len(self.layout)} "
                                "node(s)")
        if self.global_batch_size != self.world_size * self.local_batch_size * self.accumulation_steps:
            raise ProtocolError(
                f"{path}: global_batch_size {self.global_batch_size} != world size "
                f"{self.world_size} x local_batch_size {self.local_batch_size} x "
                f"accumulation_steps {self.accumulation_steps}"
            )
        return self


#: the most nodes a layout may name (a bound on what a job file can make anyone read)
MAX_LAYOUT_NODES = 4096
#: a Slurm node name (slurm.conf(5) NodeName: a host name, no hostlist expression)
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_layout(path: Path | str, layout: Any) -> None:
    """A layout is ``{node name: GPUs >= 1}`` with at most :data:`MAX_LAYOUT_NODES` nodes.

    Raises:
        ProtocolError: anything else.
    """
    if not isinstance(layout, dict):
        raise ProtocolError(f"{path}: field 'layout' must be an object {{node: GPUs}}, "
                            f"got {type(layout).__name__}")
    if len(layout) > MAX_LAYOUT_NODES:
        raise ProtocolError(f"{path}: layout names {len(layout)} nodes (at most "
                            f"{MAX_LAYOUT_NODES})")
    for node, gpus in layout.items():
        if not isinstance(node, str) or not NODE_NAME.fullmatch(node):
            raise ProtocolError(f"{path}: layout: {node!r} is not a node name")
        _expect(path, f"layout[{node}]", gpus, int, 1)


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
        layout: ``{node: GPUs}`` in force when the job runs on extension allocations (empty:
            ``nodes`` x the submitted GPUs per node).
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
    layout: dict[str, int] = field(default_factory=dict)
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
        check_layout(path, self.layout)
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
            ``awaiting-requeue``, ``requeued``, ``stopped``, ``finished``, ``failed``); the
            daemon gives a job whose phase is ``in_transition`` no other change.
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
    write_valid(path, ack)


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
    return _checked_progress(path, Progress(**_check_fields(path, obj, Progress, PROGRESS_SCHEMA,
                                                             job_uid)))


def _checked_progress(path: Path, p: Progress) -> Progress:
    """``p`` if its fields have their types and ranges (counts: integers >= 0; throughput and
    time: finite numbers); gradient statistics that are not finite numbers are
    read as not measured (None), as a job whose estimate diverged reports them.

    Raises:
        ProtocolError: a field of the wrong type or out of range.
    """
    path = Path(path)
    _expect(path, "job_uid", p.job_uid, str)
    for name in ("generation", "step", "epoch", "samples_processed", "epoch_position",
                 "world_size", "global_batch_size"):
        _expect(path, name, getattr(p, name), int, 0)
    _expect(path, "throughput", p.throughput, (int, float))  # < 0 after a restart lost work
    _expect(path, "time", p.time, (int, float))
    _expect(path, "finished", p.finished, bool)
    if p.total_samples is not None:
        _expect(path, "total_samples", p.total_samples, int, 0)
    grad_sqr, grad_var = _statistic(p.grad_sqr), _statistic(p.grad_var)
    if grad_sqr is p.grad_sqr and grad_var is p.grad_var:
        return p
    return replace(p, grad_sqr=grad_sqr, grad_var=grad_var)


def _statistic(v: object) -> float | None:
    """A gradient statistic as read: ``v`` if a finite number, else None (not measured)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 1e300:
        return v
    return None


def write_launcher_state(path: Path, state: LauncherState) -> None:
    """Validate and atomically write ``state`` (``launcher.json``).

    Raises:
        ProtocolError: ``state`` is invalid.
    """
    write_valid(path, state)


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
