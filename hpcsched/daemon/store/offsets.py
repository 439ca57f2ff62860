"""The store's ingest offsets (``ingest_offsets``: how far each per-rank metrics file has been
read, in bytes), a mixin of :class:`~hpcsched.daemon.store.Store`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

from sqlalchemy import delete, insert, select, update

from hpcsched.daemon.store.lists import among, chunks
from hpcsched.daemon.store.schema import IngestOffset


class OffsetsMixin:
    """Ingest offsets, read and written many files at a time (a few queries each way per round), for
    :class:`~hpcsched.daemon.store.Store` (which provides ``_read`` and ``_write`` sessions)."""

    def ingest_offset(self, path: str) -> int:
        """How many bytes of the file at ``path`` were ingested (0 if never seen)."""
        return self.ingest_offsets([path])[str(path)]

    def ingest_offsets(self, paths: Iterable[str]) -> dict[str, int]:
        """:meth:`ingest_offset` of each of ``paths``, in one query per
        :data:`~hpcsched.daemon.store.lists.CHUNK` paths."""
        keys = [str(p) for p in paths]
        found: dict[str, int] = {}
        with self._read() as s:
            for part in chunks(keys):
                found.update((path, offset) for path, offset in s.execute(
                    select(IngestOffset.path, IngestOffset.offset).where(among(IngestOffset.path, part))))
        return {k: found.get(k, 0) for k in keys}

    def set_ingest_offset(self, path: str, offset: int, *, at: float | None = None) -> None:
        """Record that ``offset`` bytes of ``path`` are ingested (``at``: Unix s, default now)."""
        self.set_ingest_offsets({path: offset}, at=at)

    def set_ingest_offsets(self, offsets: dict[str, int], *, at: float | None = None) -> None:
        """:meth:`set_ingest_offset` of each ``path: offset``, in one transaction.

        Raises:
            ValueError: an offset below 0 (nothing is written).
        """
        if any(off < 0 for off in offsets.values()):
            raise ValueError(f"offsets must be >= 0, got {min(offsets.values())}")
        if not offsets:
            return
        now = time.time() if at is None else at
        rows = [{"path": str(p), "offset": off, "updated_at": now} for p, off in offsets.items()]
        with self._write() as s:
            known: set[str] = set()
            for part in chunks([r["path"] for r in rows]):
                known.update(s.scalars(select(IngestOffset.path).where(among(IngestOffset.path, part))))
            old = [r for r in rows if r["path"] in known]
            new = [r for r in rows if r["path"] not in known]
            if old:   # ORM bulk UPDATE by primary key: one executemany
                s.execute(update(IngestOffset), old)
            if new:
                s.execute(insert(IngestOffset), new)

    def prune_ingest_offsets(self, before: float, exists: Callable[[str], bool] = os.path.exists
                             ) -> int:
        """Delete the offsets of files that are gone (``exists`` false: the job's directory was
        removed, :mod:`hpcsched.daemon.retention`) and were last read before ``before`` (Unix
        s), so the table does not grow with every metrics file ever read. A file that is still
        there keeps its offset, however old. Returns how many rows were deleted."""
        with self._read() as s:
            old = list(s.scalars(select(IngestOffset.path).where(IngestOffset.updated_at < before)))
        gone = [p for p in old if not exists(p)]
        if gone:
            with self._write() as s:
                for part in chunks(gone):
                    s.execute(delete(IngestOffset).where(among(IngestOffset.path, part))
                              .execution_options(synchronize_session=False))
        return len(gone)
