"""The daemon's store: SQLAlchemy 2.0 ORM over SQLite by default, any SQLAlchemy URL accepted.

What is kept (times are UTC Unix seconds, floats; durations in seconds; sizes in nodes or
workers; batch sizes in samples):

- ``jobs``: every hpcsched job the daemon has seen: its Slurm id, spec and limits, last state;
- ``profile_samples``: measured step time and throughput per job and configuration;
- ``gpu_measurements``: how fast each GPU ran relative to the job's median rank;
- ``rounds``: one row per scheduling round;
- ``actions``: the journal. Every action is written here (``planned``) and committed before the
  daemon acts, then marked ``applied`` and ``observed`` (or ``failed``), so a daemon killed
  mid-round resumes without doing anything twice (see docs/ "Shape" in DESIGN.md);
- ``ingest_offsets``: how far each per-rank metrics file has been read, in bytes.

SQLite: every connection gets ``journal_mode=WAL``, ``foreign_keys=ON`` and
``busy_timeout=5000`` (ms); write transactions start with ``BEGIN IMMEDIATE`` so that two
writers wait for each other (up to the busy timeout) instead of failing. **The SQLite file must
be on a local disk, not NFS or another network file system**: WAL needs shared memory between
the processes using the file, and network file systems break SQLite's locking. Put the jobs'
directories on the shared file system, and the daemon's database next to the daemon.

The schema is created and migrated by Alembic (migrations in ``db/``): :meth:`Store.upgrade`
or ``hpcsched db upgrade``. ``Store(url)`` itself never creates tables.

Every method returns plain frozen dataclasses (:class:`JobRow`, :class:`ProfileRow`,
:class:`RoundRow`, :class:`ActionRow`), never ORM objects, and every write method commits its
own short transaction, so callers never hold a session.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
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
    cast,
    create_engine,
    event,
    func,
    insert,
    select,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

BUSY_TIMEOUT_MS = 5000

ACTION_KINDS = ("batch", "shrink", "grow", "pending")
ACTION_STATUSES = ("planned", "applied", "observed", "failed")
OPEN_STATUSES = ("planned", "applied")
#: legal journal transitions: planned -> applied | failed, applied -> observed | failed
TRANSITIONS: dict[str, frozenset[str]] = {
    "planned": frozenset({"applied", "failed"}),
    "applied": frozenset({"observed", "failed"}),
    "observed": frozenset(),
    "failed": frozenset(),
}

# Named constraints, so that Alembic's batch mode (SQLite table rebuilds) can find them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _in(column: str, values: Iterable[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


# -- ORM ---------------------------------------------------------------------------------------


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
    """A journal entry: one change to one job, from its plan to its outcome."""

    __tablename__ = "actions"
    __table_args__ = (
        Index(None, "job_id", "status"),
        CheckConstraint(_in("kind", ACTION_KINDS), name="kind"),
        CheckConstraint(_in("status", ACTION_STATUSES), name="status"),
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
    status: Mapped[str] = mapped_column(String(16), default="planned")
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    restarts_at_plan: Mapped[int] = mapped_column(Integer, default=0)


class IngestOffset(Base):
    """How many bytes of a metrics file have been ingested."""

    __tablename__ = "ingest_offsets"

    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[float] = mapped_column(Float)


# -- rows handed out ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    """A job as stored. Sizes in nodes; batch sizes in samples; times in Unix seconds."""

    job_id: str
    job_uid: str
    user: str
    script: str
    workers_per_node: int
    min_nodes: int
    max_nodes: int
    min_batch_size: int
    max_batch_size: int
    max_local_batch_size: int | None
    base_batch_size: int
    lr_scaling: str
    spec_json: str
    state: str
    submit_time: float | None
    first_seen: float
    last_seen: float
    finished_at: float | None
    app_class: str


@dataclass(frozen=True)
class ProfileRow:
    """A job's profile in one configuration, aggregated over all its samples.

    ``step_time`` (s per optimizer step) and ``throughput`` (samples/s) are means weighted by
    each sample's ``steps``; ``steps`` is their total, ``samples`` the number of rows and
    ``time`` the latest sample's time.
    """

    job_id: str
    world_size: int
    nodes: int
    local_batch_size: int
    accumulation_steps: int
    global_batch_size: int
    step_time: float
    throughput: float
    steps: int
    samples: int
    time: float


@dataclass(frozen=True)
class RoundRow:
    """A scheduling round: start (Unix s), duration and policy time (s), counts."""

    id: int
    started_at: float
    duration: float | None
    policy: str
    objective: float | None
    jobs: int
    actions: int
    slurm_calls: int
    policy_seconds: float
    error: str | None
    dry_run: bool


@dataclass(frozen=True)
class ActionRow:
    """A journal entry. Sizes in nodes, batch sizes in samples, times in Unix seconds."""

    id: int
    round_id: int | None
    job_id: str
    kind: str
    generation: int
    from_nodes: int
    to_nodes: int
    from_batch_size: int
    to_batch_size: int
    reason: str
    status: str
    error: str | None
    created_at: float
    updated_at: float
    restarts_at_plan: int


def _row(cls: type, obj: Any) -> Any:
    return cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)})


def _columns(model: type) -> set[str]:
    return {c.key for c in model.__table__.columns}


def _check_keys(what: str, given: Iterable[str], allowed: set[str]) -> None:
    extra = sorted(set(given) - allowed)
    if extra:
        raise TypeError(f"{what}: unknown field(s) {', '.join(extra)}; "
                        f"valid: {', '.join(sorted(allowed))}")


def _require(what: str, given: dict, required: Iterable[str]) -> None:
    missing = [k for k in required if given.get(k) is None]
    if missing:
        raise ValueError(f"{what}: missing field(s) {', '.join(missing)}")


_JOB_REQUIRED = ("job_uid", "workers_per_node", "min_nodes", "max_nodes", "min_batch_size",
                 "max_batch_size", "base_batch_size")
_SAMPLE_REQUIRED = ("job_id", "time", "world_size", "nodes", "local_batch_size", "step_time",
                    "throughput")
_GPU_REQUIRED = ("job_id", "time", "node", "local_rank", "relative_speed")
_ACTION_REQUIRED = ("job_id", "kind", "generation", "from_nodes", "to_nodes",
                    "from_batch_size", "to_batch_size")
_ROUND_END_FIELDS = {"duration", "objective", "jobs", "actions", "slurm_calls",
                     "policy_seconds", "error"}


# -- engine ------------------------------------------------------------------------------------


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url``; for SQLite, with WAL, foreign keys and a 5 s busy timeout on every
    connection, and ``BEGIN IMMEDIATE`` for connections with execution option
    ``hpcsched_write=True`` (used by :class:`Store` for every write)."""
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
                cur.execute("PRAGMA journal_mode = WAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get("hpcsched_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def script_location() -> Path:
    """The Alembic migrations: ``<repo>/db`` (source tree) or ``<prefix>/share/hpcsched/db``."""
    candidates = [Path(__file__).resolve().parents[2] / "db",
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


# -- the store ---------------------------------------------------------------------------------


class Store:
    """The daemon's database. ``url``: any SQLAlchemy URL (SQLite on a local disk by default).

    Creating a Store opens nothing and creates no tables; run :meth:`upgrade` once (or
    ``hpcsched db upgrade``) before using it. Methods are safe to call from several processes
    on one SQLite file: writers wait for each other up to the busy timeout (5 s).
    """

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._sessions() as s:
            yield s

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """A session whose transaction takes SQLite's write lock at once and commits on exit."""
        with self._sessions() as s:
            s.connection(execution_options={"hpcsched_write": True})
            try:
                yield s
                s.commit()
            except BaseException:
                s.rollback()
                raise

    # -- schema ------------------------------------------------------------------------------

    def upgrade(self, revision: str = "head") -> str:
        """Migrate the schema to ``revision`` (default: the newest); returns the revision reached.

        Safe to run again (a no-op when already there) and from two processes at once. For a
        SQLite file, its directory is created when missing.
        """
        from alembic import command

        sa_url = make_url(self.url)
        if sa_url.get_backend_name() == "sqlite" and sa_url.database not in (None, "",
                                                                             ":memory:"):
            Path(sa_url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        cfg = alembic_config(self.url)
        with self.engine.connect() as conn:
            conn = conn.execution_options(hpcsched_write=True)
            with conn.begin():
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
        reached = self.current_revision()
        if reached is None:
            raise RuntimeError(f"{_safe(self.url)}: no schema revision after upgrade to {revision}")
        return reached

    def current_revision(self) -> str | None:
        """The schema revision of the database, or None when it was never migrated."""
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    # -- jobs --------------------------------------------------------------------------------

    def upsert_job(self, **fields: Any) -> None:
        """Insert or update the job ``job_id``; only the given fields change.

        Fields are :class:`JobRow`'s. A new job needs ``job_uid``, ``workers_per_node``,
        the node limits and the batch sizes. ``last_seen`` defaults to now; ``first_seen``
        is set when the job is inserted (default: ``last_seen``) and never changed after.
        """
        _check_keys("upsert_job", fields, _columns(Job))
        _require("upsert_job", fields, ["job_id"])
        fields = dict(fields)
        fields.setdefault("last_seen", time.time())
        with self._write() as s:
            job = s.get(Job, fields["job_id"])
            if job is None:
                _require(f"upsert_job: new job {fields['job_id']}", fields, _JOB_REQUIRED)
                fields.setdefault("first_seen", fields["last_seen"])
                s.add(Job(**fields))
            else:
                fields.pop("first_seen", None)
                for k, v in fields.items():
                    setattr(job, k, v)

    def job(self, job_id: str) -> JobRow | None:
        """The job with this Slurm job id, or None."""
        with self._read() as s:
            job = s.get(Job, job_id)
            return None if job is None else _row(JobRow, job)

    def jobs(self, active_only: bool = False) -> list[JobRow]:
        """All jobs (``active_only``: those without ``finished_at``), oldest first."""
        q = select(Job).order_by(Job.first_seen, Job.job_id)
        if active_only:
            q = q.where(Job.finished_at.is_(None))
        with self._read() as s:
            return [_row(JobRow, j) for j in s.scalars(q)]

    # -- profile samples ---------------------------------------------------------------------

    def add_profile_samples(self, rows: Iterable[dict]) -> int:
        """Store profile samples; returns how many. Each row: ``job_id``, ``time`` (Unix s),
        ``world_size``, ``nodes``, ``local_batch_size``, ``step_time`` (s, mean over the
        steps), ``throughput`` (samples/s); optional ``accumulation_steps`` (1), ``steps``
        (how many step records the row aggregates, >= 1, default 1), ``launch`` (0),
        ``generation`` (0), ``global_batch_size`` (default world_size x local_batch_size x
        accumulation_steps). The job must exist."""
        allowed = _columns(ProfileSample) - {"id"}
        batch = []
        for r in rows:
            _check_keys("add_profile_samples", r, allowed)
            _require("add_profile_samples", r, _SAMPLE_REQUIRED)
            r = {"launch": 0, "generation": 0, "accumulation_steps": 1, "steps": 1, **r}
            if r.get("global_batch_size") is None:
                r["global_batch_size"] = (r["world_size"] * r["local_batch_size"]
                                          * r["accumulation_steps"])
            if r["steps"] < 1:
                raise ValueError(f"add_profile_samples: steps must be >= 1, got {r['steps']}")
            batch.append(r)
        if batch:
            with self._write() as s:
                s.execute(insert(ProfileSample), batch)
        return len(batch)

    def profile(self, job_id: str) -> list[ProfileRow]:
        """The job's profile: one row per (world_size, nodes, local_batch_size,
        accumulation_steps), with steps-weighted mean step time (s) and throughput
        (samples/s), total steps and the latest sample time; ordered by those keys."""
        P = ProfileSample
        total = func.sum(P.steps)
        q = (select(P.world_size, P.nodes, P.local_batch_size, P.accumulation_steps,
                    func.max(P.global_batch_size),
                    func.sum(P.step_time * P.steps) / total,
                    func.sum(P.throughput * P.steps) / total,
                    total, func.count(), func.max(P.time))
             .where(P.job_id == job_id)
             .group_by(P.world_size, P.nodes, P.local_batch_size, P.accumulation_steps)
             .order_by(P.world_size, P.nodes, P.local_batch_size, P.accumulation_steps))
        with self._read() as s:
            return [ProfileRow(job_id, ws, n, lbs, acc, int(gbs), float(st), float(tp),
                               int(steps), int(count), float(t))
                    for ws, n, lbs, acc, gbs, st, tp, steps, count, t in s.execute(q)]

    # -- GPU measurements --------------------------------------------------------------------

    def add_gpu_measurements(self, rows: Iterable[dict]) -> int:
        """Store per-rank speed measurements; returns how many. Each row: ``job_id``, ``time``
        (Unix s), ``node``, ``local_rank``, ``relative_speed`` (the rank's speed over its job's
        median rank; >1 = faster); optional ``gpu_index`` (str, e.g. from
        CUDA_VISIBLE_DEVICES), ``gpu_uuid``, ``app_class`` (""), ``steps`` (>= 1, default 1).
        The job must exist."""
        allowed = _columns(GpuMeasurement) - {"id"}
        batch = []
        for r in rows:
            _check_keys("add_gpu_measurements", r, allowed)
            _require("add_gpu_measurements", r, _GPU_REQUIRED)
            r = {"gpu_index": None, "gpu_uuid": None, "app_class": "", "steps": 1, **r}
            if r["gpu_index"] is not None:
                r["gpu_index"] = str(r["gpu_index"])
            if r["steps"] < 1:
                raise ValueError(f"add_gpu_measurements: steps must be >= 1, got {r['steps']}")
            batch.append(r)
        if batch:
            with self._write() as s:
                s.execute(insert(GpuMeasurement), batch)
        return len(batch)

    def gpu_speeds(self, app_class: str | None = None, since: float | None = None
                   ) -> dict[tuple[str, str], float]:
        """Relative speed per GPU: ``(node, gpu_index)`` -> steps-weighted mean
        ``relative_speed`` (1.0 = the median rank of its job). Where no ``gpu_index`` was
        recorded the key is ``(node, str(local_rank))``. ``app_class`` restricts to one
        application class (None: all); ``since`` to measurements at or after that time."""
        G = GpuMeasurement
        gpu = func.coalesce(G.gpu_index, cast(G.local_rank, String))
        q = (select(G.node, gpu, func.sum(G.relative_speed * G.steps) / func.sum(G.steps))
             .group_by(G.node, gpu))
        if app_class is not None:
            q = q.where(G.app_class == app_class)
        if since is not None:
            q = q.where(G.time >= since)
        with self._read() as s:
            return {(node, str(g)): float(v) for node, g, v in s.execute(q)}

    # -- rounds ------------------------------------------------------------------------------

    def begin_round(self, policy: str, started_at: float, dry_run: bool) -> int:
        """Record the start of a round (``started_at``: Unix s); returns its id."""
        with self._write() as s:
            r = Round(policy=policy, started_at=started_at, dry_run=bool(dry_run))
            s.add(r)
            s.flush()
            return r.id

    def end_round(self, round_id: int, **fields: Any) -> None:
        """Complete a round: any of ``duration`` (s), ``objective``, ``jobs``, ``actions``,
        ``slurm_calls`` (counts), ``policy_seconds`` (s), ``error`` (text)."""
        _check_keys("end_round", fields, _ROUND_END_FIELDS)
        with self._write() as s:
            r = s.get(Round, round_id)
            if r is None:
                raise KeyError(f"no round {round_id}")
            for k, v in fields.items():
                setattr(r, k, v)

    def rounds(self, limit: int = 20) -> list[RoundRow]:
        """The latest ``limit`` rounds, newest first."""
        with self._read() as s:
            q = select(Round).order_by(Round.id.desc()).limit(limit)
            return [_row(RoundRow, r) for r in s.scalars(q)]

    # -- journal -----------------------------------------------------------------------------

    def plan_action(self, **fields: Any) -> int:
        """Journal an action as ``planned`` and commit it; returns its id.

        Fields: ``job_id``, ``kind`` (batch|shrink|grow|pending), ``generation`` (the control
        generation the action writes), ``from_nodes``, ``to_nodes``, ``from_batch_size``,
        ``to_batch_size`` (samples); optional ``round_id``, ``reason``, ``restarts_at_plan``
        (the job's Slurm restart count now, default 0), ``created_at`` (Unix s, default now).
        The row is committed when this returns: act only after that.
        """
        _check_keys("plan_action", fields,
                    _columns(Action) - {"id", "status", "error", "updated_at"})
        _require("plan_action", fields, _ACTION_REQUIRED)
        if fields["kind"] not in ACTION_KINDS:
            raise ValueError(f"plan_action: kind must be one of {'|'.join(ACTION_KINDS)}, "
                             f"got {fields['kind']!r}")
        fields = {"reason": "", "restarts_at_plan": 0, "created_at": time.time(), **fields}
        fields["updated_at"] = fields["created_at"]
        with self._write() as s:
            a = Action(status="planned", **fields)
            s.add(a)
            s.flush()
            return a.id

    def set_action_status(self, action_id: int, status: str, error: str | None = None,
                          *, at: float | None = None) -> None:
        """Move an action along the journal: planned -> applied | failed, applied -> observed
        | failed. Anything else raises ValueError; an unknown id raises KeyError.
        ``error`` is recorded (for ``failed``); ``at`` (Unix s, default now) is ``updated_at``.
        """
        if status not in ACTION_STATUSES:
            raise ValueError(f"unknown action status {status!r}; "
                             f"valid: {'|'.join(ACTION_STATUSES)}")
        with self._write() as s:
            a = s.get(Action, action_id)
            if a is None:
                raise KeyError(f"no action {action_id}")
            if status not in TRANSITIONS[a.status]:
                raise ValueError(f"action {action_id}: illegal transition {a.status} -> {status}")
            a.status = status
            if error is not None:
                a.error = error
            a.updated_at = time.time() if at is None else at

    def open_actions(self, job_id: str | None = None) -> list[ActionRow]:
        """Actions still ``planned`` or ``applied`` (of one job, or all), oldest first: what a
        restarted daemon must finish or check."""
        q = select(Action).where(Action.status.in_(OPEN_STATUSES)).order_by(Action.id)
        if job_id is not None:
            q = q.where(Action.job_id == job_id)
        with self._read() as s:
            return [_row(ActionRow, a) for a in s.scalars(q)]

    def actions(self, job_id: str | None = None, limit: int = 50) -> list[ActionRow]:
        """The latest ``limit`` actions (of one job, or all), newest first."""
        q = select(Action).order_by(Action.id.desc()).limit(limit)
        if job_id is not None:
            q = q.where(Action.job_id == job_id)
        with self._read() as s:
            return [_row(ActionRow, a) for a in s.scalars(q)]

    # -- ingest bookkeeping ------------------------------------------------------------------

    def ingest_offset(self, path: str) -> int:
        """How many bytes of the file at ``path`` were ingested (0 if never seen)."""
        with self._read() as s:
            row = s.get(IngestOffset, str(path))
            return 0 if row is None else row.offset

    def set_ingest_offset(self, path: str, offset: int, *, at: float | None = None) -> None:
        """Record that ``offset`` bytes of ``path`` are ingested (``at``: Unix s, default now)."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        now = time.time() if at is None else at
        with self._write() as s:
            row = s.get(IngestOffset, str(path))
            if row is None:
                s.add(IngestOffset(path=str(path), offset=offset, updated_at=now))
            else:
                row.offset, row.updated_at = offset, now


# -- hpcsched db -------------------------------------------------------------------------------


def _resolve_url(database_url: str | None, config_path: str | None) -> str:
    if database_url:
        return database_url
    from hpcsched.daemon.config import ConfigError, load

    try:
        return load(config_path).daemon.database_url
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


_url_option = click.option(
    "--database-url", metavar="URL",
    help="SQLAlchemy URL (default: the config's [daemon] database_url, or "
         "$HPCSCHED_DATABASE_URL).")
_config_option = click.option(
    "--config", "config_path", metavar="PATH", type=click.Path(dir_okay=False),
    help="daemon config file (default: $HPCSCHED_CONFIG, else /etc/hpcsched/hpcsched.toml).")


@click.group("db")
def db_group() -> None:
    """The daemon's database: create or migrate its schema."""


@db_group.command("upgrade")
@_url_option
@_config_option
def db_upgrade(database_url: str | None, config_path: str | None) -> None:
    """Create or migrate the schema; prints the revision reached.

    Safe to repeat; creates a SQLite file's directory when missing."""
    url = _resolve_url(database_url, config_path)
    store = Store(url)
    try:
        click.echo(store.upgrade())
    except Exception as exc:  # one line, not a traceback, for an operator
        raise click.ClickException(f"{_safe(url)}: upgrade failed: {exc}") from exc
    finally:
        store.close()


@db_group.command("current")
@_url_option
@_config_option
def db_current(database_url: str | None, config_path: str | None) -> None:
    """Print the schema revision ("none": never migrated)."""
    url = _resolve_url(database_url, config_path)
    store = Store(url)
    try:
        click.echo(store.current_revision() or "none")
    except Exception as exc:
        raise click.ClickException(f"{_safe(url)}: {exc}") from exc
    finally:
        store.close()


def _safe(url: str) -> str:
    """The URL with any password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<database>"
