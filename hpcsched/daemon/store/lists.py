"""Lists of keys in the store's SQL: ``IN (...)`` lists of a few shapes, in chunks.

A round asks the store about all of its jobs at once (their profiles, their latest actions,
their metrics files' offsets), and the number of jobs changes from round to round. SQLAlchemy
renders ``column IN (list)`` with one bound parameter per value, so each new length is a new
SQL text, and the database driver prepares and keeps each text per connection: Python's
``sqlite3`` keeps up to 128 per connection (``cached_statements``), about 0.37 MiB each at
1,500-2,000 job ids (measured on a copy of a 1,024-GPU run's store, ``docs/daemon.md``, "At
scale"), so a daemon whose job count keeps changing would hold tens of MiB of statements it
never runs again. :func:`among` pads the list to the next power of two (its last value
repeated, which changes no ``IN``), so a query site has at most one text per power of two.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

#: values per ``IN (...)`` query at most (SQLite allows 32,766 bound parameters since 3.32; a
#: chunk is padded to at most 16,384)
CHUNK = 10_000
#: the longest list :func:`padded` pads to: a longer one is left as it is, so padding never
#: takes a list that fits SQLite's 32,766 bound parameters beyond them
PAD_LIMIT = 16_384


def padded(values: Sequence[Any]) -> list[Any]:
    """``values`` with its last value repeated up to the next power of two in length, up to
    :data:`PAD_LIMIT` (a longer list, or an empty one, is returned as it is)."""
    out = list(values)
    size = 1 << (len(out) - 1).bit_length() if out else 0
    if out and size <= PAD_LIMIT:
        out += [out[-1]] * (size - len(out))
    return out


def among(column: Any, values: Sequence[Any]) -> Any:
    """``column IN (values)`` with the list :func:`padded`: the same rows, one SQL text per
    power of two of ``len(values)`` (module docstring)."""
    return column.in_(padded(values))


def chunks(values: Sequence[Any], size: int | None = None) -> Iterator[Sequence[Any]]:
    """``values`` in slices of at most ``size`` (default :data:`CHUNK`), in order."""
    size = size or CHUNK
    for i in range(0, len(values), size):
        yield values[i:i + size]
