"""The store's ingest offsets (``ingest_offsets``: how far each per-rank metrics file has been
read, in bytes), a mixin of :class:`~hpcsched.daemon.store.Store`."""

from __future__ import annotations

import time
from collections.abc import Iterable

from sqlalchemy import select

from hpcsched.daemon.store.schema import IngestOffset


class OffsetsMixin:
    """Ingest offsets, read and written many files at a time (one query each way per job), for
    :class:`~hpcsched.daemon.store.Store` (which provides ``_read`` and ``_write`` sessions)."""

    def ingest_offset(self, path: str) -> int:
        """How many bytes of the file at ``path`` were ingested (0 if never seen)."""
        return self.ingest_offsets([path])[str(path)]

    def ingest_offsets(self, paths: Iterable[str]) -> dict[str, int]:
        """:meth:`ingest_offset` of each of ``paths``, in one query."""
        keys = [str(p) for p in paths]
        with self._read() as s:
            found = dict(s.execute(select(IngestOffset.path, IngestOffset.offset)
                                   .where(IngestOffset.path.in_(keys))).all()) if keys else {}
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
        with self._write() as s:
            rows = {r.path: r for r in s.scalars(select(IngestOffset)
                                                 .where(IngestOffset.path.in_([str(p) for p in offsets])))}
            for path, offset in offsets.items():
                row = rows.get(str(path))
                if row is None:
                    s.add(IngestOffset(path=str(path), offset=offset, updated_at=now))
                else:
                    row.offset, row.updated_at = offset, now
