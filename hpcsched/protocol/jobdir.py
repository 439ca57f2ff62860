"""Per-job directories on the shared file system, and the job's spec (``spec.json``).

Layout under the control directory (``$HPCSCHED_CONTROL_DIR``, default ``~/.hpcsched/jobs``;
it must be on a file system that the login node and every compute node see)::

    <control_dir>/<job_uid>/          one directory per submission (job_uid from hpcsub)
        spec.json                     the job's spec and limits (hpcsub, written once)
        job.sbatch                    the rendered batch script that was submitted
        slurm_job_id                  the Slurm job id (hpcsub, after sbatch answered)
        control.json, ack.json,       the control protocol (see hpcsched.protocol.files)
        progress.json
        launcher.json                 launcher state: launches, current size (launcher)
        metrics/launch-<L>-rank-<R>.jsonl   per-rank step records (workers, append-only)
        checkpoints/                  default checkpoint directory (CHECKPOINTS_DIR)
        left/g<gen>-rank-<R>          ranks that left in an in-place shrink (LEFT_DIR)
        extensions.json               the job's extension allocations (rank 0; protocol.extensions)
        extensions/                   their batch scripts and output (rank 0, Slurm)
        resize.lock                   held by whoever is resizing the job
    <control_dir>/by-id/<slurm_job_id> -> ../<job_uid>   lookup by Slurm job id

The job id is not known until ``sbatch`` answers, so the directory is keyed by a uid chosen
before submission and linked from ``by-id/`` afterwards (by hpcsub, and again by the launcher in
case hpcsub died in between).
"""

from __future__ import annotations

import fcntl
import logging
import os
import pwd
import stat
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from hpcsched.protocol.files import (
    LauncherState,
    ProtocolError,
    load_json_object,
    read_launcher_state,
    write_json_atomic,
)
from hpcsched.protocol.limits import JobLimits

#: the default checkpoint directory, under the job directory (when the job names none)
CHECKPOINTS_DIR = "checkpoints"
#: where leaving ranks mark their exit in an in-place shrink, under the job directory
LEFT_DIR = "left"
SPEC_SCHEMA = "hpcsched.spec/1"
ENV_CONTROL_DIR = "HPCSCHED_CONTROL_DIR"

_log = logging.getLogger(__name__)


class JobNotFound(LookupError):
    """No hpcsched job directory for this Slurm job id."""


def control_dir() -> Path:
    """The control directory: ``$HPCSCHED_CONTROL_DIR`` or ``~/.hpcsched/jobs``."""
    return Path(os.environ.get(ENV_CONTROL_DIR) or Path.home() / ".hpcsched" / "jobs")


def _checked_target(job_id: str | int, link: Path, subtree: Path, user: str) -> Path:
    """Where ``link`` leads, if that is a job directory directly in ``subtree`` owned by ``user``.

    Raises:
        JobNotFound: anything else (a link out of the subtree, to a file, or to a directory of
            another user: planted, or the job is not this user's).
    """
    target = link.resolve()
    try:
        owner_uid = pwd.getpwnam(user).pw_uid
        ok = target.parent == subtree.resolve() and target.is_dir() and \
            target.stat().st_uid == owner_uid
    except (KeyError, OSError):
        ok = False
    if not ok:
        raise JobNotFound(f"job {job_id}: {link} does not lead to a job directory of {user} in "
                          f"{subtree}; ignored")
    return target


def _log_other_claims(job_id: str | int, root: Path, user: str, found: Path) -> None:
    """Log, as refused, every other ``by-id/<job_id>`` link: the earlier layout's, and (for
    root, the only one who can enter other users' subtrees, mode 0700) those in other users'
    subtrees. Such a link names a job Slurm says is ``user``'s: planted, or left over."""
    others = [root / "by-id" / str(job_id)]
    if os.geteuid() == 0:
        try:
            others += [root / e.name / "by-id" / str(job_id) for e in os.scandir(root)
                       if e.name not in (user, "by-id") and e.is_dir(follow_symlinks=False)]
        except OSError:
            pass
    for link in others:
        try:
            if not os.path.lexists(link) or link.resolve() == found:
                continue
        except (OSError, RuntimeError):   # a loop: still a foreign claim
            pass
        _log.warning("job %s: %s refused: Slurm says the job is %s's, whose directory is %s",
                     job_id, link, user, found)


def user_subtree(root: Path, user: str | None = None) -> Path:
    """``<root>/<user>`` (default: this process's user), created with mode 0700 if missing.

    Raises:
        ProtocolError: it exists but is owned by another user, or ``root`` cannot be written
            (on a shared control directory the admin makes ``root`` mode 1777, like /tmp).
    """
    user = user or current_user()
    path = root / user
    try:
        root.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.stat()
    except OSError as exc:
        raise ProtocolError(f"cannot create {path}: {exc.strerror}; the control directory {root} "
                            "must let every user create their own subtree (mode 1777, like /tmp)"
                            ) from None
    if st.st_uid != os.geteuid():
        raise ProtocolError(f"{path} belongs to uid {st.st_uid}, not to you ({user}); ask the "
                            "admin to remove it")
    return path


# spec.json's key for each JobLimits field, in the file's order (the base batch size is the
# submitted ``batch_size``)
_LIMIT_KEYS = {
    "workers_per_node": "workers_per_node",
    "min_nodes": "min_nodes",
    "max_nodes": "max_nodes",
    "batch_size": "base_batch_size",
    "min_batch_size": "min_batch_size",
    "max_batch_size": "max_batch_size",
    "max_local_batch_size": "max_local_batch_size",
    "lr_scaling": "lr_scaling",
}
#: limit keys a spec may leave out (older hpcsub versions wrote none)
_OPTIONAL_LIMIT_KEYS = {"min_gpus": "min_gpu_count"}


@dataclass(frozen=True)
class JobSpec:
    """What a job was submitted with and the limits hpcsched must respect (``spec.json``).

    Attributes:
        job_uid: the job directory's name, chosen by hpcsub before submission.
        script, script_args, python, submit_dir: what the launcher runs, and where.
        sbatch_args: the sbatch options given on hpcsub's command line.
        nodes: the submitted node count.
        limits: the resize limits (:class:`~hpcsched.protocol.limits.JobLimits`: GPUs per node,
            node range, global batch-size range, per-GPU limit, base batch size, LR rule).
        checkpoint_dir: where the job writes checkpoints (shared by all nodes).
        checkpoint_interval: seconds between the job's own checkpoints (0 = by ``mtbf``).
        mtbf: the job's mean time between failures, seconds: with ``checkpoint_interval`` 0
            its own checkpoints follow the Young/Daly interval of their measured cost
            (:func:`hpcsched.job.checkpoint.young_daly_interval`); 0 as well = only when hpcsched
            or Slurm asks.
        record_samples: whether workers record each step's sample indices.
        user, created_at: who submitted, and when (Unix seconds).
        application: what the job trains (``--hpcsched-application``; "" = the script's file
            name): the daemon's key for throughput priors and the GPU-variability class.

    ``spec.json`` is flat: the limits' fields are top-level keys, the base batch size under
    ``batch_size``; in Python they are read from ``spec.limits`` only
    (``spec.limits.workers_per_node``, ``spec.limits.base_batch_size``, ...).
    """

    job_uid: str
    script: str
    script_args: tuple[str, ...]
    python: str
    submit_dir: str
    sbatch_args: tuple[str, ...]
    nodes: int
    limits: JobLimits
    checkpoint_dir: str
    checkpoint_interval: float = 0.0
    record_samples: bool = False
    user: str = ""
    created_at: float = 0.0
    application: str = ""
    mtbf: float = 0.0
    schema: str = SPEC_SCHEMA
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """``spec.json``'s object: flat, keys in the order hpcsub has always written them."""
        d = asdict(self)
        limits = d.pop("limits")
        out: dict = {}
        for name in self.__dataclass_fields__:
            if name == "limits":
                out.update({key: limits[attr] for key, attr in _LIMIT_KEYS.items()})
                out.update({key: limits[attr] for key, attr in _OPTIONAL_LIMIT_KEYS.items()
                            if limits[attr] is not None})
            elif (name not in ("application", "mtbf")) or d[name]:   # written only when given
                out[name] = d[name]
        out["script_args"] = list(self.script_args)
        out["sbatch_args"] = list(self.sbatch_args)
        return out

    @classmethod
    def from_json(cls, obj: dict, path: Path | str = "spec.json") -> "JobSpec":
        """The spec in ``obj`` (as :meth:`to_json` writes it; unknown keys are ignored).

        Raises:
            ProtocolError: not a spec of this schema, a key missing, or limits that break
                :class:`~hpcsched.protocol.limits.JobLimits`' rules.
        """
        if not isinstance(obj, dict) or obj.get("schema") != SPEC_SCHEMA:
            raise ProtocolError(f"{path}: not an hpcsched job spec (schema {SPEC_SCHEMA})")
        missing = [key for key in _LIMIT_KEYS if key not in obj]
        if missing:
            raise ProtocolError(f"{path}: missing {', '.join(missing)}")
        known = set(cls.__dataclass_fields__) - {"limits"}
        try:
            kwargs = {k: v for k, v in obj.items() if k in known}
            kwargs["script_args"] = tuple(kwargs.get("script_args", ()))
            kwargs["sbatch_args"] = tuple(kwargs.get("sbatch_args", ()))
            limits = JobLimits(**{attr: obj[key] for key, attr in _LIMIT_KEYS.items()},
                               **{attr: obj[key] for key, attr in _OPTIONAL_LIMIT_KEYS.items()
                                  if obj.get(key) is not None})
            return cls(limits=limits, **kwargs)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"{path}: {exc}") from exc


def current_user() -> str:
    """This process's user name (effective uid), as Slurm reports a job's user."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class JobDir:
    """Paths and small helpers for one job's directory.

    Layout (``docs/control-protocol.md``, "Many users"): every user has a subtree
    ``<control_dir>/<user>/`` that only they (and root) can enter (mode 0700), holding their job
    directories and their ``by-id/`` links. A job is found from Slurm's record of it -- its id
    and its user -- as ``<control_dir>/<user>/by-id/<job_id>``, so a link planted in one user's
    subtree never names another user's job. Directories of the earlier single-user layout
    (``<control_dir>/by-id/<job_id>``) are still found.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)

    @classmethod
    def create(cls, root: Path | None = None) -> "JobDir":
        """A new job directory in this user's subtree of ``root`` (the control directory).

        Raises:
            ProtocolError: the user's subtree exists but belongs to someone else, or ``root``
                cannot be written (the message says what to ask the admin).
        """
        root = Path(root) if root is not None else control_dir()
        mine = user_subtree(root)
        (mine / "by-id").mkdir(exist_ok=True)
        uid = uuid.uuid4().hex[:12]
        path = mine / uid
        path.mkdir(mode=0o700)
        (path / "metrics").mkdir()
        return cls(path)

    @classmethod
    def for_job(cls, job_id: str | int, root: Path | None = None,
                user: str | None = None) -> "JobDir":
        """The directory of Slurm job ``job_id`` of ``user`` (default: this process's user;
        give Slurm's user of the job to look up someone else's, as the daemon does).

        Raises:
            JobNotFound: no such job directory (not submitted through hpcsub, under another
                control dir, or by another user), or a ``by-id`` link that leads out of its
                user's subtree.
        """
        root = Path(root) if root is not None else control_dir()
        user = user or current_user()
        for subtree in (root / user, root):   # this layout, then the earlier one
            link = subtree / "by-id" / str(job_id)
            if link.is_symlink() or link.exists():
                found = cls(_checked_target(job_id, link, subtree, user))
                _log_other_claims(job_id, root, user, found.path)
                return found
        raise JobNotFound(
            f"job {job_id} is not an hpcsched job of {user} (no {root / user / 'by-id' / str(job_id)}"
            f"; was it submitted with hpcsub, with the same {ENV_CONTROL_DIR}?)")

    @classmethod
    def locate(cls, job_id: str | int, root: Path | None = None) -> "JobDir":
        """The directory of job ``job_id`` in whichever user's subtree holds it (for a job whose
        Slurm user is no longer known: Slurm forgot it). The directory must belong to the user
        its subtree is named after.

        Raises:
            JobNotFound: in no subtree this process can read.
        """
        root = Path(root) if root is not None else control_dir()
        try:
            subtrees = [d for d in root.iterdir() if d.name != "by-id" and d.is_dir()]
        except OSError:
            subtrees = []
        for d in subtrees:
            link = d / "by-id" / str(job_id)
            try:
                if link.is_symlink() or link.exists():
                    return cls(_checked_target(job_id, link, d, d.name))
            except (OSError, JobNotFound):
                continue
        return cls.for_job(job_id, root)   # this user's, or the earlier layout

    @staticmethod
    def known_job_ids(root: Path | None = None) -> list[str]:
        """Slurm job ids with a job directory (every user's subtree that this process can read,
        and the earlier layout's ``by-id``), in ascending numeric order."""
        root = Path(root) if root is not None else control_dir()
        ids: set[str] = set()
        try:
            dirs = [root] + [d for d in root.iterdir() if d.is_dir() and d.name != "by-id"]
        except OSError:
            return []
        for d in dirs:
            try:
                ids.update(p.name for p in (d / "by-id").iterdir() if p.name.isdigit())
            except OSError:       # not a user subtree, or another user's: not ours to list
                continue
        return sorted(ids, key=int)

    def owner(self) -> str:
        """The user owning the directory (who submitted the job), or "" if it cannot be told."""
        try:
            return pwd.getpwuid(self.path.stat().st_uid).pw_name
        except (KeyError, OSError):
            return ""

    @property
    def uid(self) -> str:
        return self.path.name

    spec_path = property(lambda self: self.path / "spec.json")
    control_path = property(lambda self: self.path / "control.json")
    ack_path = property(lambda self: self.path / "ack.json")
    progress_path = property(lambda self: self.path / "progress.json")
    launcher_path = property(lambda self: self.path / "launcher.json")
    metrics_dir = property(lambda self: self.path / "metrics")
    checkpoints_dir = property(lambda self: self.path / CHECKPOINTS_DIR)
    left_dir = property(lambda self: self.path / LEFT_DIR)
    extensions_path = property(lambda self: self.path / "extensions.json")
    extensions_dir = property(lambda self: self.path / "extensions")
    script_path = property(lambda self: self.path / "job.sbatch")

    def write_spec(self, spec: JobSpec) -> None:
        write_json_atomic(self.spec_path, spec.to_json())

    def read_spec(self) -> JobSpec:
        """The job's spec, read with the bounds of every job-written file
        (:func:`hpcsched.protocol.files.load_json_object`: a regular file, no link, at most
        1 MiB).

        Raises:
            ProtocolError: missing, unreadable, too large, not JSON, or not a valid spec.
        """
        obj = load_json_object(self.spec_path)
        if obj is None:
            raise ProtocolError(f"{self.spec_path}: missing")
        return JobSpec.from_json(obj, self.spec_path)

    def link_job_id(self, job_id: str | int) -> None:
        """Record the Slurm job id and create ``by-id/<job_id>`` (idempotent, race-safe)."""
        (self.path / "slurm_job_id").write_text(f"{job_id}\n")
        link = self.path.parent / "by-id" / str(job_id)
        link.parent.mkdir(exist_ok=True)
        target = Path("..") / self.uid
        try:
            os.symlink(target, link)
        except FileExistsError:
            if os.readlink(link) != str(target):
                tmp = link.with_name(f".{link.name}.{os.getpid()}")
                os.symlink(target, tmp)
                os.replace(tmp, link)

    @property
    def slurm_job_id(self) -> str | None:
        try:
            return (self.path / "slurm_job_id").read_text().strip() or None
        except FileNotFoundError:
            return None

    def read_launcher_state(self) -> LauncherState | None:
        """What the job's launcher is doing (``launcher.json``), or None when unknown.

        Unknown means: no file yet, or one that cannot be trusted. A launcher older than the
        file's schema wrote no ``schema`` and no ``job_uid``; such a file, like a malformed or a
        foreign one, is read as None with a warning in the log, never raised.
        """
        import logging

        try:
            return read_launcher_state(self.launcher_path, self.uid)
        except ProtocolError as exc:
            logging.getLogger(__name__).warning("launcher state unknown: %s", exc)
            return None

    @contextmanager
    def resize_lock(self, blocking: bool = False) -> Iterator[None]:
        """Exclusive lock so two actuators never resize one job at once.

        The lock file belongs to the job directory's owner, mode 0600, like the protocol's
        files (:func:`~hpcsched.protocol.files.write_json_atomic`): one root (an admin) creates
        stays openable by the job's user. It is never opened through a symbolic link, and must
        be a regular file with no other name: root truncates and writes it.

        Raises:
            BlockingIOError: held by another process and ``blocking`` is false.
            ProtocolError: ``resize.lock`` is not a regular file, or has other (hard) links.
            OSError: it is a symbolic link (``ELOOP``), or cannot be opened.
        """
        path = self.path / "resize.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise ProtocolError(f"{path}: not a regular file of its own; not used")
            owner = os.stat(self.path)
            if os.geteuid() == 0 and st.st_uid != owner.st_uid:
                os.fchown(fd, owner.st_uid, owner.st_gid)
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            yield
        finally:
            os.close(fd)
