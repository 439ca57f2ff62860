"""The store's WAL copied into its database file off the round's thread.

Under WAL (``journal_mode=WAL``), SQLite appends every commit to the ``-wal`` file and, by
default, the commit that takes the WAL past 1,000 pages copies it back into the database file
and syncs it, in the committing thread (an *automatic checkpoint*, sqlite.org/wal.html §3.3).
A daemon round at 2,000 jobs rewrites about 700 pages (every job's ``last_seen``, the metrics,
the ingest offsets), so about every other round one of its commits also waited for a
checkpoint's writes and ``fsync`` on a disk shared with the jobs (docs/daemon.md, "At scale").

:class:`BackgroundCheckpoint` runs ``PRAGMA wal_checkpoint(PASSIVE)`` after a round in a thread
of its own, on its own connection: a passive checkpoint copies what no reader still needs and
waits for no one, readers and writers go on meanwhile (sqlite.org/c3ref/wal_checkpoint_v2.html).
The daemon's connections then leave automatic checkpoints to a larger WAL
(:data:`AUTOCHECKPOINT_PAGES`), a safety net should the thread fall behind. Other stores than
SQLite files have no WAL, and nothing is done for them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.pool import NullPool

from hpcsched.daemon.store.schema import make_engine, sqlite_file

log = logging.getLogger("hpcsched.daemon.store")

#: pages (4 KiB each by default) past which the daemon's own commits still checkpoint the WAL
#: (SQLite's default: 1,000) when the background thread has not: about 40 MiB
AUTOCHECKPOINT_PAGES = 10_000


class BackgroundCheckpoint:
    """One passive WAL checkpoint at a time, each in a thread of its own.

    Args:
        store: a :class:`~hpcsched.daemon.store.Store`. For a SQLite file, every connection its
            engine opens from now on (the daemon's one) checkpoints automatically only past
            :data:`AUTOCHECKPOINT_PAGES`; for anything else this object does nothing.

    Attributes:
        last: ``(busy, wal_pages, checkpointed_pages, seconds)`` of the last checkpoint done
            (``PRAGMA wal_checkpoint``'s three figures and its wall time), None before any.
    """

    def __init__(self, store: Any):
        self.enabled = sqlite_file(store.url) is not None
        self._thread: threading.Thread | None = None
        self.last: tuple[int, int, int, float] | None = None
        # a connection of its own for each checkpoint, never one of the store's pool: the
        # store's queries keep to its one connection and its prepared statements
        self._engine = make_engine(store.url, poolclass=NullPool) if self.enabled else None
        if self.enabled and not event.contains(store.engine, "connect", _fewer_autocheckpoints):
            # once per engine (a reloaded daemon makes a new checkpointer on the same store)
            event.listen(store.engine, "connect", _fewer_autocheckpoints)
            store.engine.dispose()   # pooled connections were opened with SQLite's default

    def start(self) -> bool:
        """Start a checkpoint unless one is still running; True when one was started."""
        if not self.enabled or (self._thread is not None and self._thread.is_alive()):
            return False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="hpcsched-wal-checkpoint")
        self._thread.start()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the running checkpoint (if any); True when none runs any more."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        t = time.perf_counter()
        try:
            # the DB-API connection, in autocommit (make_engine): no transaction around it
            assert self._engine is not None
            raw = self._engine.raw_connection()
            try:
                cur = raw.cursor()
                busy, pages, done = cur.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                cur.close()
            finally:
                raw.close()
            self.last = (int(busy), int(pages), int(done), time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001 - the next round's commits checkpoint instead
            log.warning("store: background WAL checkpoint failed (%s); SQLite's own checkpoints "
                        "take over", exc)


def _fewer_autocheckpoints(dbapi_connection: Any, _record: Any) -> None:
    cur = dbapi_connection.cursor()
    try:
        cur.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}")
    finally:
        cur.close()
