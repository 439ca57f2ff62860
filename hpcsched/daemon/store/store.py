"""The daemon's store: SQLAlchemy 2.0 ORM over SQLite by default, any SQLAlchemy URL accepted.

What is kept (times are UTC Unix seconds, floats; durations in seconds; sizes in nodes or
workers; batch sizes in samples):

- ``jobs``: every hpcsched job the daemon has seen: its Slurm id, spec and limits, last state;
- ``profile_samples``: measured step time and throughput per job and configuration;
- ``gpu_measurements``: how fast each GPU ran relative to the job's median rank;
- ``gpu_probes``: each GPU's probe at a job's start (slurm-plugins/prolog-gpu-probe);
- ``rounds``: one row per scheduling round;
- ``actions``: the journal of resizes (:mod:`hpcsched.daemon.store.journal`). Every action is
  written here (``requested``) and committed before the daemon acts, then moved along its
  phases (:mod:`hpcsched.daemon.phases`) to ``running`` or ``failed``, one committed
  transition at a time, so a daemon killed mid-resize resumes without doing anything twice;
- ``ingest_offsets``: how far each per-rank metrics file has been read, in bytes.

SQLite: every connection gets ``journal_mode=WAL``, ``foreign_keys=ON`` and
``busy_timeout=5000`` (ms); write transactions start with ``BEGIN IMMEDIATE`` so that two
writers wait for each other (up to the busy timeout) instead of failing. Every commit is synced
(``synchronous=FULL``) except those a caller asks not to be (``durable=False``: a round's
record and bookkeeping, which the next round writes again; never the resize journal). **The SQLite file must
be on a local disk, not NFS or another network file system**: WAL needs shared memory between
the processes using the file, and network file systems break SQLite's locking. Put the jobs'
directories on the shared file system, and the daemon's database next to the daemon.

Permissions: the store holds every user's script path, script arguments and sbatch arguments, so
it is the daemon's user's alone. A SQLite file is created mode 0600 whatever the umask (before
SQLite opens it: :func:`~hpcsched.daemon.store.schema.secure_sqlite_file`), and SQLite gives the
``-wal``, ``-shm`` and ``-journal`` files beside it the same mode; the directory
:meth:`Store.upgrade` creates for it is 0700. Opening an existing file of the process's own user
that grants its group or others any access takes that access away (0644 becomes 0600), with a
warning; no mode is ever loosened. A user who is not the file's owner (``hpcsched status`` run by
anyone but the daemon's user) cannot open the store, and status then goes without it.

The schema (:mod:`hpcsched.daemon.store.schema`) is created and migrated by Alembic (migrations
in ``db/``): :meth:`Store.upgrade` or ``hpcsched db upgrade``. ``Store(url)`` itself never
creates tables.

Every method returns plain frozen dataclasses (:mod:`hpcsched.daemon.store.rows`), never ORM
objects, and every write method commits its own short transaction, so callers never hold a
session.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Self

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from hpcsched.daemon.store.gpus import GpuMixin
from hpcsched.daemon.store.journal import JournalMixin
from hpcsched.daemon.store.lease import LeaseMixin
from hpcsched.daemon.store.lists import among
from hpcsched.daemon.store.offsets import OffsetsMixin
from hpcsched.daemon.store.rows import (
    JobRow,
    ProfileRow,
    RoundRow,
    check_keys,
    columns,
    insert_checked,
    require,
    to_row,
)
from hpcsched.daemon.store.schema import (
    STORE_DIR_MODE,
    Job,
    ProfileSample,
    Round,
    alembic_config,
    make_engine,
    safe_url,
    sqlite_file,
)
from hpcsched.perf.priors import application_key
from hpcsched.perf.shared import Measured

log = logging.getLogger("hpcsched.daemon.store")

_JOB_REQUIRED = ("job_uid", "workers_per_node", "min_nodes", "max_nodes", "min_batch_size",
                 "max_batch_size", "base_batch_size")
_SAMPLE_REQUIRED = ("job_id", "time", "world_size", "nodes", "local_batch_size", "step_time",
                    "throughput")
_ROUND_END_FIELDS = {"duration", "objective", "jobs", "actions", "slurm_calls",
                     "policy_seconds", "error"}


def _write_options(durable: bool) -> dict[str, bool]:
    """A write transaction's options (:func:`~hpcsched.daemon.store.schema.make_engine`)."""
    return {"hpcsched_write": True, "hpcsched_durable": durable}


def _upsert_all(s: Session, rows: list[dict[str, Any]]) -> None:
    """The jobs' rows in session ``s`` (:meth:`Store.upsert_jobs`; each of ``rows`` checked and
    with ``last_seen``): the rows there are read in one query and updated, the new ones
    inserted in one statement (executemany)."""
    have = {j.job_id: j for j in s.scalars(select(Job).where(among(Job.job_id, [f["job_id"] for f in rows])))}
    new = []
    for fields in rows:
        job = have.get(fields["job_id"])
        if job is not None and fields.get("job_uid") not in (None, job.job_uid):
            log.warning("Slurm job id %s now names another job (job directory %s, was %s): "
                        "the earlier job's history is dropped", job.job_id,
                        fields["job_uid"], job.job_uid)
            s.delete(job)
            s.flush()
            job = None
        if job is None:
            require(f"upsert_job: new job {fields['job_id']}", fields, _JOB_REQUIRED)
            new.append({"first_seen": fields["last_seen"], **fields})
        else:
            for k, v in fields.items():
                if k != "first_seen":
                    setattr(job, k, v)
    if new:
        s.execute(insert(Job), new)


class Store(JournalMixin, LeaseMixin, GpuMixin, OffsetsMixin):
    """The daemon's database. ``url``: any SQLAlchemy URL (SQLite on a local disk by default).

    Creating a Store opens nothing and creates no tables; run :meth:`upgrade` once (or
    ``hpcsched db upgrade``) before using it. Methods are safe to call from several processes
    on one SQLite file: writers wait for each other up to the busy timeout (5 s).
    """

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._batch: Session | None = None
        #: seconds this Store has spent committing (flush, write, sync), summed over its life;
        #: a round's difference of it is its ``journal`` phase (:mod:`hpcsched.daemon.round`)
        self.commit_seconds = 0.0

    def _commit(self, s: Session) -> None:
        t = time.perf_counter()
        try:
            s.commit()
        finally:
            self.commit_seconds += time.perf_counter() - t

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def batch(self, durable: bool = True) -> Iterator[None]:
        """Every read and write of this store inside the block is one transaction, committed at
        its end: the round's bookkeeping of thousands of jobs costs one commit (one ``fsync``),
        not one per job (their rows themselves in one write: :meth:`upsert_jobs`). A write that
        fails inside is rolled back alone (a savepoint) and its exception propagates as without
        a batch; an exception that leaves the block rolls the whole batch back. A batch inside
        a batch is part of the outer one. Not for threads sharing one Store.

        ``durable=False`` (SQLite): the commit is not synced (``synchronous=NORMAL`` under WAL);
        it survives the process being killed, and is synced with the next durable commit or
        checkpoint, but a crash of the host may roll it back. For what can be written again
        (a round's record, the jobs' rows, ingested metrics with their offsets), never for the
        resize journal."""
        if self._batch is not None:
            yield
            return
        with self._sessions() as s:
            s.connection(execution_options=_write_options(durable))
            self._batch = s
            try:
                yield
                self._commit(s)
            except BaseException:
                s.rollback()
                raise
            finally:
                self._batch = None

    @contextmanager
    def _read(self) -> Iterator[Session]:
        if self._batch is not None:
            yield self._batch
            return
        with self._sessions() as s:
            yield s

    @contextmanager
    def _write(self, durable: bool = True) -> Iterator[Session]:
        """A session whose transaction takes SQLite's write lock at once and commits on exit
        (inside :meth:`batch`: the batch's, under a savepoint); ``durable``: as for
        :meth:`batch`."""
        if self._batch is not None:
            with self._batch.begin_nested():
                yield self._batch
            return
        with self._sessions() as s:
            s.connection(execution_options=_write_options(durable))
            try:
                yield s
                self._commit(s)
            except BaseException:
                s.rollback()
                raise

    # -- schema ------------------------------------------------------------------------------

    def upgrade(self, revision: str = "head") -> str:
        """Migrate the schema to ``revision`` (default: the newest); returns the revision reached.

        Safe to run again (a no-op when already there) and from two processes at once. For a
        SQLite file, its directory is created when missing, mode 0700 (:data:`STORE_DIR_MODE`;
        an existing directory is left as it is), and the file itself is created 0600
        (:func:`~hpcsched.daemon.store.schema.secure_sqlite_file`).
        """
        from alembic import command

        file = sqlite_file(self.url)
        if file is not None:
            file.parent.mkdir(mode=STORE_DIR_MODE, parents=True, exist_ok=True)
        cfg = alembic_config(self.url)
        with self.engine.connect() as conn:
            conn = conn.execution_options(hpcsched_write=True)
            with conn.begin():
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
        reached = self.current_revision()
        if reached is None:
            raise RuntimeError(f"{safe_url(self.url)}: no schema revision after upgrade to {revision}")
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

        A Slurm job id names one job only until the controller's ids start again (a reset
        state, a new cluster): a row whose ``job_uid`` (the job directory's, unique per
        submission) differs from the one given is an earlier job's, and it is deleted with its
        history (profile, GPU measurements and journal: ``ON DELETE CASCADE``) before the new
        job is inserted, so a reused id starts fresh. Logged as a warning.
        """
        self.upsert_jobs([fields])

    def upsert_jobs(self, rows: Iterable[dict[str, Any]]) -> None:
        """:meth:`upsert_job` for each of ``rows`` (dicts of its fields), in one write: inside
        a :meth:`batch`, one savepoint for them all, not one each, the rows there read in one
        query and the new ones inserted in one statement (a daemon's first round writes every
        job's row: 2,000 at the scale of ``benchmarks/daemon_scale.py``).
        A row that fails leaves none of them written.

        Raises:
            ValueError: a field that is not a job column, a row without ``job_id``, or a new
                job without the fields :meth:`upsert_job` names.
        """
        checked = []
        for fields in rows:
            check_keys("upsert_job", fields, columns(Job))
            require("upsert_job", fields, ["job_id"])
            checked.append({"last_seen": time.time(), **fields})
        if not checked:
            return
        with self._write() as s:
            _upsert_all(s, checked)

    def touch_jobs(self, job_ids: Iterable[str], at: float | None = None) -> None:
        """Set ``last_seen`` of the jobs ``job_ids`` (those that exist) to ``at`` (Unix s,
        default now), in one statement."""
        ids = list(job_ids)
        if ids:
            with self._write() as s:
                s.execute(update(Job).where(among(Job.job_id, ids)).values(last_seen=time.time() if at is None else at)
                          .execution_options(synchronize_session=False))

    def prune(self, before: float) -> dict[str, int]:
        """Delete the jobs that finished before ``before`` (Unix s) with their history (profile,
        GPU measurements, journal: ``ON DELETE CASCADE``), and the rounds that started before it
        (actions keep their row; their ``round_id`` becomes null). Returns ``{"jobs": n,
        "rounds": m}`` deleted."""
        with self._write() as s:
            jobs = s.execute(delete(Job).where(Job.finished_at.is_not(None),
                                               Job.finished_at < before)).rowcount
            rounds = s.execute(delete(Round).where(Round.started_at < before)).rowcount
        return {"jobs": jobs, "rounds": rounds}

    def job(self, job_id: str) -> JobRow | None:
        """The job with this Slurm job id, or None."""
        with self._read() as s:
            job = s.get(Job, job_id)
            return None if job is None else to_row(JobRow, job)

    def jobs(self, active_only: bool = False) -> list[JobRow]:
        """All jobs (``active_only``: those without ``finished_at``), oldest first."""
        q = select(Job).order_by(Job.first_seen, Job.job_id)
        if active_only:
            q = q.where(Job.finished_at.is_(None))
        with self._read() as s:
            return [to_row(JobRow, j) for j in s.scalars(q)]

    # -- profile samples ---------------------------------------------------------------------

    def add_profile_samples(self, rows: Iterable[dict]) -> int:
        """Store profile samples; returns how many. Each row: ``job_id``, ``time`` (Unix s),
        ``world_size``, ``nodes``, ``local_batch_size``, ``step_time`` (s, mean over the
        steps), ``throughput`` (samples/s); optional ``accumulation_steps`` (1), ``steps``
        (how many step records the row aggregates, >= 1, default 1), ``launch`` (0),
        ``generation`` (0), ``global_batch_size`` (default world_size x local_batch_size x
        accumulation_steps). The job must exist."""
        def prepare(r: dict) -> dict:
            r = {"launch": 0, "generation": 0, "accumulation_steps": 1, "steps": 1, **r}
            if r.get("global_batch_size") is None:
                r["global_batch_size"] = (r["world_size"] * r["local_batch_size"]
                                          * r["accumulation_steps"])
            if r["steps"] < 1:
                raise ValueError(f"add_profile_samples: steps must be >= 1, got {r['steps']}")
            return r

        return insert_checked(self._write, "add_profile_samples", ProfileSample, rows,
                              _SAMPLE_REQUIRED, prepare)

    def profile(self, job_id: str) -> list[ProfileRow]:
        """The job's profile: one row per (world_size, nodes, local_batch_size,
        accumulation_steps), with steps-weighted mean step time (s) and throughput
        (samples/s), total steps and the latest sample time; ordered by those keys."""
        return self.profiles([job_id]).get(job_id, [])

    def profiles(self, job_ids: Iterable[str]) -> dict[str, list[ProfileRow]]:
        """:meth:`profile` of each job of ``job_ids``, in one query; a job without samples is
        absent."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        P = ProfileSample
        total = func.sum(P.steps)
        keys = (P.job_id, P.world_size, P.nodes, P.local_batch_size, P.accumulation_steps)
        q = (select(*keys, func.max(P.global_batch_size),
                    func.sum(P.step_time * P.steps) / total,
                    func.sum(P.throughput * P.steps) / total,
                    total, func.count(), func.max(P.time))
             .where(among(P.job_id, ids)).group_by(*keys).order_by(*keys))
        out: dict[str, list[ProfileRow]] = {}
        with self._read() as s:
            for job, ws, n, lbs, acc, gbs, st, tp, steps, count, t in s.execute(q):
                out.setdefault(job, []).append(ProfileRow(job, ws, n, lbs, acc, int(gbs), float(st),
                                                          float(tp), int(steps), int(count), float(t)))
        return out

    def application_profile(self, applications: Iterable[str]) -> dict[str, list[Measured]]:
        """What every job of each of ``applications`` measured (finished jobs' included): per
        application (lower case; names match without regard to case or surrounding spaces)
        and configuration ``(nodes, world_size, local_batch_size, accumulation_steps)``, the
        steps-weighted mean step time (s) over all its jobs' steps there, and how many steps.
        The input of :func:`hpcsched.perf.shared.step_corrections`."""
        names = {application_key(a) for a in applications} - {""}
        if not names:
            return {}
        P, app = ProfileSample, func.lower(func.trim(Job.app_class))
        total = func.sum(P.steps)
        q = (select(app, P.nodes, P.world_size, P.local_batch_size, P.accumulation_steps,
                    func.sum(P.step_time * P.steps) / total, total)
             .join(Job, Job.job_id == P.job_id)
             .where(among(app, sorted(names)), P.steps > 0)
             .group_by(app, P.nodes, P.world_size, P.local_batch_size, P.accumulation_steps)
             .order_by(app, P.nodes, P.world_size, P.local_batch_size, P.accumulation_steps))
        out: dict[str, list[Measured]] = {}
        with self._read() as s:
            for a, n, w, m, k, st, steps in s.execute(q):
                out.setdefault(a, []).append(Measured(int(n), int(w), int(m), int(k), float(st),
                                                      float(steps)))
        return out

    # -- rounds ------------------------------------------------------------------------------

    def begin_round(self, policy: str, started_at: float, dry_run: bool) -> int:
        """Record the start of a round (``started_at``: Unix s); returns its id. Not synced
        (``durable=False`` of :meth:`batch`): a host crash may lose a round's record, nothing
        the daemon acts on."""
        with self._write(durable=False) as s:
            r = Round(policy=policy, started_at=started_at, dry_run=bool(dry_run))
            s.add(r)
            s.flush()
            return r.id

    def end_round(self, round_id: int, **fields: Any) -> None:
        """Complete a round: any of ``duration`` (s), ``objective``, ``jobs``, ``actions``,
        ``slurm_calls`` (counts), ``policy_seconds`` (s), ``error`` (text)."""
        check_keys("end_round", fields, _ROUND_END_FIELDS)
        with self._write(durable=False) as s:
            r = s.get(Round, round_id)
            if r is None:
                raise KeyError(f"no round {round_id}")
            for k, v in fields.items():
                setattr(r, k, v)

    def rounds(self, limit: int = 20) -> list[RoundRow]:
        """The latest ``limit`` rounds, newest first."""
        with self._read() as s:
            q = select(Round).order_by(Round.id.desc()).limit(limit)
            return [to_row(RoundRow, r) for r in s.scalars(q)]
