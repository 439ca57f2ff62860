"""Alembic environment for the hpcsched daemon's store.

There is no alembic.ini: :func:`hpcsched.daemon.store.alembic_config` builds the configuration in code
(``script_location`` = this directory, ``sqlalchemy.url`` = the database). When the caller
passes an open connection in ``config.attributes["connection"]`` (as
:meth:`hpcsched.daemon.store.Store.upgrade` does, inside a ``BEGIN IMMEDIATE`` transaction on SQLite),
the migrations run on it; otherwise an engine is made from ``sqlalchemy.url`` (or
``$HPCSCHED_DATABASE_URL``) with the store's SQLite settings (WAL, foreign keys, busy timeout).

``render_as_batch`` is on so that ALTERs on SQLite become table rebuilds.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context

from hpcsched.daemon.store import Base, make_engine

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name)

target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("HPCSCHED_DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: set sqlalchemy.url or HPCSCHED_DATABASE_URL")
    return url


def run_migrations_offline() -> None:
    """Emit the SQL to stdout instead of running it (``alembic upgrade --sql``)."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True,
                      dialect_opts={"paramstyle": "named"}, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(hpcsched_write=True)
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
