"""The ``store[:URL]`` workload: the jobs recorded in hpcsched's store, as a workload
(:func:`hpcsched.sim.workload.load_workload`; the format is in that module's docstring, "Store
history"). Split from :mod:`hpcsched.sim.workload`: it is the one workload that reads a
database."""

from __future__ import annotations

import json
from pathlib import Path

from hpcsched.perf.priors import application_key
from hpcsched.sim import WorkloadJob
from hpcsched.sim.workload import (
    MAX_COUNT,
    POLLUX_APP_CLASS,
    WorkloadError,
    _batch_limit,
    _one_line,
    _sorted,
)


def load_store(url: str | None = None) -> list[WorkloadJob]:
    """The jobs recorded in hpcsched's store at ``url`` (default: the daemon's configured
    database, ``$HPCSCHED_DATABASE_URL`` overriding), as a workload (module docstring)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from hpcsched.daemon.store import Store

    url = store_url(url)
    where = store_name(url)
    try:
        sa_url = make_url(url)
    except ArgumentError as exc:
        raise WorkloadError(f"{where}: not a database URL: {_one_line(exc)}") from None
    if sa_url.get_backend_name() == "sqlite" and sa_url.database not in (None, "", ":memory:"):
        db = Path(sa_url.database).expanduser()
        if not db.is_file():                       # do not let SQLite create an empty file
            raise WorkloadError(f"{where}: no such database file")
    try:
        store = Store(url)
    except (SQLAlchemyError, ImportError) as exc:
        raise WorkloadError(f"{where}: cannot open: {_one_line(exc)}") from None
    try:
        rows = store.jobs()
    except SQLAlchemyError as exc:
        raise WorkloadError(f"{where}: cannot read its jobs (run 'hpcsched db upgrade'?): "
                            f"{_one_line(exc)}") from None
    finally:
        store.close()
    if not rows:
        raise WorkloadError(f"{where}: the store holds no jobs, so there is no history to replay")
    times = [r.submit_time if r.submit_time is not None else r.first_seen for r in rows]
    t0 = min(times)
    jobs = []
    for row, t in zip(rows, times):
        app = application_key(row.app_class)
        if app not in POLLUX_APP_CLASS:
            app = "cifar10"
        gpus = _stored_nodes(row) * row.workers_per_node
        if not (1 <= gpus <= MAX_COUNT and 1 <= row.base_batch_size <= _batch_limit(app)[0]):
            raise WorkloadError(f"{where}: job {row.job_id}: needs a GPU count in 1..{MAX_COUNT} "
                                f"and a batch size in 1..{_batch_limit(app)[0]}, got {gpus} GPUs "
                                f"and batch {row.base_batch_size}")
        jobs.append(WorkloadJob(name=f"{app}-{row.job_id}", submit_time=float(t - t0),
                                application=app, gpus=gpus, batch_size=row.base_batch_size,
                                app_class=POLLUX_APP_CLASS[app]))
    return _sorted(jobs)


def store_url(url: str | None) -> str:
    """``url``, or the daemon's configured database URL when it is None."""
    if url is not None:
        return url
    from hpcsched.daemon.config import ConfigError, load

    try:
        return load().daemon.database_url
    except ConfigError as exc:
        raise WorkloadError(f"store: {exc}") from None


def store_name(url: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return "store:" + make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):        # a malformed URL is reported by load_store
        return "store:" + url


def _stored_nodes(row) -> int:
    """The node count the job asked for: the stored spec's ``nodes``, else ``max_nodes``."""
    try:
        nodes = json.loads(row.spec_json or "{}").get("nodes")
    except (ValueError, AttributeError):
        nodes = None
    if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1:
        return nodes
    return row.max_nodes
