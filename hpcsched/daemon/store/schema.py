"""The store's schema (SQLAlchemy 2.0 ORM), its engine settings, and where its migrations are.

Times are UTC Unix seconds (floats); durations in seconds; sizes in nodes or workers; batch
sizes in samples. The migrations in ``db/versions/`` must describe exactly these models
(``tests/test_store.py::test_migrations_match_the_orm``).
"""

from __future__ import annotations

import sqlite3
import sys
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

BUSY_TIMEOUT_MS = 5000

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


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url``; for SQLite, with WAL, foreign keys and a 5 s busy timeout on every
    connection, and ``BEGIN IMMEDIATE`` for connections with execution option
    ``hpcsched_write=True`` (used by :class:`~hpcsched.daemon.store.Store` for every write)."""
    sa_url = make_url(url)
    if sa_url.get_backend_name() != "sqlite":
        return create_engine(sa_url, **kwargs)
    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", BUSY_TIMEOUT_MS / 1000)
    engine = create_engine(sa_url, connect_args=connect_args, **kwargs)

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
        immediate = conn.get_execution_options().get("hpcsched_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def script_location() -> Path:
    """The Alembic migrations: ``<repo>/db`` (source tree) or ``<prefix>/share/hpcsched/db``.

    Raises:
        FileNotFoundError: neither holds ``env.py``.
    """
    candidates = [Path(__file__).resolve().parents[3] / "db",
                  Path(sys.prefix) / "share" / "hpcsched" / "db"]
    for c in candidates:
        if (c / "env.py").is_file():
            return c
    raise FileNotFoundError("Alembic migrations not found (looked in "
                            + ", ".join(map(str, candidates)) + ")")


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
