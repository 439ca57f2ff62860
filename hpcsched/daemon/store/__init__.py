"""The daemon's store: the SQLite/SQLAlchemy database and the ``hpcsched db`` commands.

* :mod:`~hpcsched.daemon.store.store`: :class:`Store`, every read and write the daemon makes;
* :mod:`~hpcsched.daemon.store.journal`: the journal of resizes (phases and their history);
* :mod:`~hpcsched.daemon.store.gpus`: the GPUs' measurements and probes;
* :mod:`~hpcsched.daemon.store.schema`: the ORM models, engine settings, Alembic configuration
  (migrations in ``db/`` at the repository's top level);
* :mod:`~hpcsched.daemon.store.rows`: the frozen rows handed out;
* :mod:`~hpcsched.daemon.store.checkpoint`: the WAL copied into the database file after each
  round, in a thread of its own;
* :mod:`~hpcsched.daemon.store.cli`: ``hpcsched db upgrade|current``.

``from hpcsched.daemon.store import Store`` is the import path for users of the store.
"""

from hpcsched.daemon.store.cli import db_group
from hpcsched.daemon.store.rows import ActionRow, GpuProbeRow, JobRow, ProfileRow, RoundRow
from hpcsched.daemon.store.schema import (
    ACTION_KINDS,
    ACTION_PHASES,
    BUSY_TIMEOUT_MS,
    NAMING_CONVENTION,
    OPEN_ACTION_PHASES,
    Base,
    alembic_config,
    make_engine,
    script_location,
)
from hpcsched.daemon.store.store import Store

__all__ = [
    "ACTION_KINDS",
    "ACTION_PHASES",
    "BUSY_TIMEOUT_MS",
    "NAMING_CONVENTION",
    "OPEN_ACTION_PHASES",
    "ActionRow",
    "Base",
    "GpuProbeRow",
    "JobRow",
    "ProfileRow",
    "RoundRow",
    "Store",
    "alembic_config",
    "db_group",
    "make_engine",
    "script_location",
]
