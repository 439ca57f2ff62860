"""The store's schema (SQLAlchemy 2.0 ORM), its engine settings, and where its migrations are.

Times are UTC Unix seconds (floats); durations in seconds; sizes in nodes or workers; batch
sizes in samples. The migrations in ``db/versions/`` must describe exactly these models
(``tests/test_store.py::test_migrations_match_the_orm``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    create_engine,
    event,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from hpcsched.daemon.phases import OPEN_PHASES, ResizePhase
from hpcsched.protocol.kinds import ChangeKind
from hpcsched.resources import shared

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000

#: a SQLite store file's mode when hpcsched creates it: the daemon's user's alone (it holds every
#: user's script path and arguments and sbatch arguments); SQLite gives the ``-wal``, ``-shm``
#: and ``-journal`` files it makes beside it the same mode
STORE_FILE_MODE = 0o600
#: the mode of the directory :meth:`hpcsched.daemon.store.Store.upgrade` creates for the file
STORE_DIR_MODE = 0o700
#: the files SQLite keeps beside a database file
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")

#: the journal's ``kind`` values (every :class:`~hpcsched.protocol.kinds.ChangeKind`)
ACTION_KINDS = tuple(k.value for k in ChangeKind)
#: the journal's ``phase`` values (:class:`~hpcsched.daemon.phases.ResizePhase`)
ACTION_PHASES = tuple(p.value for p in ResizePhase)
OPEN_ACTION_PHASES = tuple(p.value for p in OPEN_PHASES)

# Named constraints, so that Alembic's batch mode (SQLite table rebuilds) can find them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def sql_in(column: str, values: Iterable[str]) -> str:
    """``column IN ('a', 'b')`` for a CHECK constraint."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Job(Base):
    """An hpcsched job (one Slurm job id). Sizes in nodes, batch sizes in samples."""

    __tablename__ = "jobs"

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_uid: Mapped[str] = mapped_column(String(64), unique=True)
    user: Mapped[str] = mapped_column(String(128), default="")
    script: Mapped[str] = mapped_column(Text, default="")
    workers_per_node: Mapped[int] = mapped_column(Integer)
    min_nodes: Mapped[int] = mapped_column(Integer)
    max_nodes: Mapped[int] = mapped_column(Integer)
    min_batch_size: Mapped[int] = mapped_column(Integer)
    max_batch_size: Mapped[int] = mapped_column(Integer)
    max_local_batch_size: Mapped[int | None] = mapped_column(Integer)
    base_batch_size: Mapped[int] = mapped_column(Integer)
    lr_scaling: Mapped[str] = mapped_column(String(16), default="linear")
    min_gpu_count: Mapped[int | None] = mapped_column(Integer)
    spec_json: Mapped[str] = mapped_column(Text, default="{}")
    state: Mapped[str] = mapped_column(String(32), default="")
    submit_time: Mapped[float | None] = mapped_column(Float)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    app_class: Mapped[str] = mapped_column(String(128), default="")


class ProfileSample(Base):
    """Mean step time of one job in one configuration over ``steps`` steps."""

    __tablename__ = "profile_samples"
    __table_args__ = (
        Index(None, "job_id", "world_size", "local_batch_size"),
        CheckConstraint("steps >= 1", name="steps_positive"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id", ondelete="CASCADE"))
    time: Mapped[float] = mapped_column(Float)
    launch: Mapped[int] = mapped_column(Integer, default=0)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    world_size: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[int] = mapped_column(Integer)
    local_batch_size: Mapped[int] = mapped_column(Integer)
    accumulation_steps: Mapped[int] = mapped_column(Integer, default=1)
    global_batch_size: Mapped[int] = mapped_column(Integer)
    step_time: Mapped[float] = mapped_column(Float)
    throughput: Mapped[float] = mapped_column(Float)
    steps: Mapped[int] = mapped_column(Integer, default=1)


class GpuMeasurement(Base):
    """One rank's speed relative to its job's median rank (>1: faster), over ``steps`` steps."""

    __tablename__ = "gpu_measurements"
    __table_args__ = (
        Index(None, "app_class", "node"),
        CheckConstraint("steps >= 1", name="steps_positive"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id", ondelete="CASCADE"))
    time: Mapped[float] = mapped_column(Float)
    node: Mapped[str] = mapped_column(String(128))
    local_rank: Mapped[int] = mapped_column(Integer)
    gpu_index: Mapped[str | None] = mapped_column(String(32))
    gpu_uuid: Mapped[str | None] = mapped_column(String(64))
    app_class: Mapped[str] = mapped_column(String(128), default="")
    relative_speed: Mapped[float] = mapped_column(Float)
    steps: Mapped[int] = mapped_column(Integer, default=1)


class GpuProbe(Base):
    """One GPU's probe at a job's start (slurm-plugins/prolog-gpu-probe, docs/slurm-plugins.md):
    ``score`` in ``unit`` (TFLOP/s for ``kind`` ``cuda``; GFLOP/s of the CPU for
    ``cpu-stand-in``) over ``seconds`` of timed work. ``gpu_uuid`` is null where the node has no
    UUID to give (the CPU stand-in): such a GPU is known by ``node`` and ``gpu_index``.
    ``job_id`` is the Slurm job whose prolog probed it (any job, not only hpcsched's)."""

    __tablename__ = "gpu_probes"
    __table_args__ = (
        Index(None, "node", "gpu_index"),
        Index(None, "gpu_uuid"),
        CheckConstraint("score > 0", name="score_positive"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float)
    node: Mapped[str] = mapped_column(String(128))
    gpu_index: Mapped[str] = mapped_column(String(32))
    gpu_uuid: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128), default="")
    kind: Mapped[str] = mapped_column(String(32))
    score: Mapped[float] = mapped_column(Float)
    unit: Mapped[str] = mapped_column(String(16))
    seconds: Mapped[float] = mapped_column(Float)
    job_id: Mapped[str | None] = mapped_column(String(64))


class Round(Base):
    """One scheduling round; ``duration`` and the counts are set when it ends."""

    __tablename__ = "rounds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    started_at: Mapped[float] = mapped_column(Float)
    duration: Mapped[float | None] = mapped_column(Float)
    policy: Mapped[str] = mapped_column(String(64))
    objective: Mapped[float | None] = mapped_column(Float)
    jobs: Mapped[int] = mapped_column(Integer, default=0)
    actions: Mapped[int] = mapped_column(Integer, default=0)
    slurm_calls: Mapped[int] = mapped_column(Integer, default=0)
    policy_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    dry_run: Mapped[bool] = mapped_column(default=False)


class Action(Base):
    """A journal entry: one change to one job, from its request to its outcome.

    ``phase`` is the resize's :class:`~hpcsched.daemon.phases.ResizePhase`; ``history`` the
    JSON list ``[[phase, unix_time], ...]`` of every phase entered, oldest first;
    ``placement`` the comma-separated nodes to start on ("" lets Slurm choose), or for a
    GPU-granular change its layout (``n1:4,n2:2``); ``mechanism`` how a GPU-granular change is
    carried out (:class:`hpcsched.policies.realise.Mechanism`'s value; null at node granularity).
    """

    __tablename__ = "actions"
    __table_args__ = (
        Index(None, "job_id", "phase"),
        CheckConstraint(sql_in("kind", ACTION_KINDS), name="kind"),
        CheckConstraint(sql_in("phase", ACTION_PHASES), name="phase"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_id: Mapped[int | None] = mapped_column(ForeignKey("rounds.id", ondelete="SET NULL"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    generation: Mapped[int] = mapped_column(Integer)
    from_nodes: Mapped[int] = mapped_column(Integer)
    to_nodes: Mapped[int] = mapped_column(Integer)
    from_batch_size: Mapped[int] = mapped_column(Integer)
    to_batch_size: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text, default="")
    phase: Mapped[str] = mapped_column(String(16), default=ResizePhase.REQUESTED.value)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    restarts_at_plan: Mapped[int] = mapped_column(Integer, default=0)
    history: Mapped[str] = mapped_column(Text, default="[]", server_default="[]")
    placement: Mapped[str] = mapped_column(Text, default="", server_default="")
    mechanism: Mapped[str | None] = mapped_column(String(16), nullable=True)


class DaemonLease(Base):
    """Who runs the cluster's daemon (:mod:`hpcsched.daemon.store.lease`): one row per lease
    ``name``; its ``holder`` (host, pid and a nonce) holds it until ``expires_at`` (Unix
    seconds), renewing it every round."""

    __tablename__ = "daemon_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(256))
    acquired_at: Mapped[float] = mapped_column(Float)
    renewed_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


class IngestOffset(Base):
    """How many bytes of a metrics file have been ingested."""

    __tablename__ = "ingest_offsets"

    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[float] = mapped_column(Float)


# -- engine and migrations -----------------------------------------------------------------------


def _use_wal(cur: Any) -> None:
    """Put the database file in WAL mode (persistent: once per file).

    Switching the journal mode needs the file to itself, and SQLite answers "database is
    locked" at once instead of waiting out the busy timeout when another connection holds it
    (two processes opening a new file together: measured in tests/test_store.py), so the switch
    is retried for up to :data:`BUSY_TIMEOUT_MS`; a file already in WAL mode is left alone.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL; None for another database, an in-memory one, or a
    URI filename (``?uri=true``, left as it is written)."""
    sa_url = make_url(url)
    if sa_url.get_backend_name() != "sqlite" or sa_url.database in (None, "", ":memory:"):
        return None
    if sa_url.database.startswith("file:") or str(sa_url.query.get("uri", "")).lower() in (
            "true", "1"):
        return None
    return Path(sa_url.database).expanduser()


def secure_sqlite_file(path: Path) -> None:
    """Keep a SQLite store file private to its owner, before SQLite opens it.

    A missing file is created empty with :data:`STORE_FILE_MODE` (0600, whatever the umask), so
    that SQLite, which gives its ``-wal``, ``-shm`` and ``-journal`` files the database file's
    mode, never makes any of them readable by others. An existing file, and each of those files
    beside it, that belongs to this process's effective user and grants its group or others any
    access loses that access (0644 becomes 0600; nothing is ever added), with a warning. Files of
    another user are left alone (``hpcsched status`` run by a user opening the daemon's store),
    and so is anything that is not a regular file. Errors are left for SQLite to report.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     STORE_FILE_MODE)
    except FileExistsError:
        pass
    except OSError:
        return                      # no directory, or not ours to write: SQLite says why
    else:
        os.close(fd)
    for p in [path, *(path.with_name(path.name + s) for s in SQLITE_SIDE_FILES)]:
        _tighten(p)


#: how :func:`_tighten` opens a file: without following a link, and, where the system has it,
#: as a path only (``O_PATH``, open(2)), never for reading: closing a file descriptor opened for
#: reading releases every POSIX lock this process holds on the file (fcntl(2)), SQLite's own
#: included, so a new connection's check would take the locks of the connections already open
#: ("How To Corrupt An SQLite Database File", sqlite.org/howtocorrupt.html §2.2); an ``O_PATH``
#: descriptor's close releases none
_PATH_ONLY = getattr(os, "O_PATH", os.O_RDONLY | os.O_NONBLOCK)


def _tighten(path: Path) -> None:
    """Take group and other access off ``path`` if it is a regular file of ours."""
    try:
        fd = os.open(path, _PATH_ONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return                      # absent, a link, or not readable by us: not ours to mend
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or not mode & 0o077:
            return
        try:
            _fchmod(fd, mode & ~0o077)
        except OSError as exc:
            log.warning("%s: mode %04o gives other users access to the store, and it cannot be "
                        "changed: %s", path, mode, exc)
            return
    finally:
        os.close(fd)
    log.warning("%s: mode %04o gave other users access to every job's script and sbatch "
                "arguments; changed to %04o", path, mode, mode & ~0o077)


def _fchmod(fd: int, mode: int) -> None:
    """chmod the file ``fd`` is open on; an ``O_PATH`` descriptor through its /proc link (the
    file itself: ``fchmod`` refuses such descriptors)."""
    if hasattr(os, "O_PATH"):
        os.chmod(f"/proc/self/fd/{fd}", mode)
    else:
        os.fchmod(fd, mode)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url``; for SQLite, with WAL, foreign keys and a 5 s busy timeout on every
    connection, ``BEGIN IMMEDIATE`` for connections with execution option
    ``hpcsched_write=True`` (used by :class:`~hpcsched.daemon.store.Store` for every write), and
    ``synchronous=FULL`` (the WAL synced at every commit) unless execution option
    ``hpcsched_durable=False`` asks for ``NORMAL`` (synced at the next checkpoint or FULL commit:
    kept through a killed process, possibly lost with the host; sqlite.org/pragma.html).
    Before each new connection to a SQLite file, :func:`secure_sqlite_file` creates it 0600 or
    takes other users' access off it."""
    sa_url = make_url(url)
    if sa_url.get_backend_name() != "sqlite":
        return create_engine(sa_url, **kwargs)
    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", BUSY_TIMEOUT_MS / 1000)
    engine = create_engine(sa_url, connect_args=connect_args, **kwargs)
    file = sqlite_file(url)

    @event.listens_for(engine, "do_connect")
    def _before_connect(*_args: Any) -> None:
        if file is not None:
            secure_sqlite_file(file)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own implicit BEGIN would ignore ours; we issue BEGIN in "begin" below.
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys = ON")
            if sa_url.database not in (None, "", ":memory:"):
                _use_wal(cur)
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        options = conn.get_execution_options()
        if not options.get("hpcsched_write", False):
            conn.exec_driver_sql("BEGIN")
            return
        # SQLite reads the level when the transaction commits: FULL syncs the WAL on every
        # commit; NORMAL leaves it to the next checkpoint or FULL commit (sqlite.org/pragma.html
        # #pragma_synchronous), a commit that survives a killed process but may be lost with
        # the host. A read commits nothing, so only writes set it.
        durable = options.get("hpcsched_durable", True)
        conn.exec_driver_sql(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def script_location() -> Path:
    """The Alembic migrations hpcsched ships (``db/``, :func:`hpcsched.resources.shared`).

    Raises:
        FileNotFoundError: they are missing, or lack ``env.py``.
    """
    path = shared("db")
    if not (path / "env.py").is_file():
        raise FileNotFoundError(f"Alembic migrations not found: {path} has no env.py")
    return path


def alembic_config(url: str) -> Any:
    """An Alembic ``Config`` built in code (no alembic.ini) for the database at ``url``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def safe_url(url: str) -> str:
    """The URL with any password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<database>"
