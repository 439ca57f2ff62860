"""The GPU count of any GRES or TRES string Slurm prints, or of pyslurm's GRES dict: the one
parser (:func:`gpu_count`). squeue's ``tres_per_node`` and ``gres_detail``, sinfo's ``gres``,
``gres_used`` and ``tres_used`` and the pyslurm backend all go through it
(:mod:`hpcsched.slurm.parse`, :mod:`hpcsched.slurm.observe`). Pure.

The forms and the rules, with their sources (sbatch(1) ``--gres``, slurm.conf(5)): :func:`gpu_count`;
tested form by form in ``tests/test_slurm_parse.py``. Units: GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from hpcsched.slurm.errors import SlurmError
from hpcsched.slurm.hostlist import split_top

#: what Slurm prints for a field without a value, lower-cased
NO_VALUE = frozenset({"", "(null)", "n/a", "none"})

_GPU = "gpu"
_SUFFIX = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4, "p": 1024 ** 5}
_NUMBER = re.compile(r"(\d+)([kmgtp]?)", re.IGNORECASE)
_PAREN = re.compile(r"\([^)]*\)")
_IDX = re.compile(r"\(IDX:([^)]*)\)")


class _Entry(NamedTuple):
    """One ``name[:type]`` entry of a GRES/TRES list with its count."""

    type: str            # "" when untyped
    amount: int          # (not "count": that would shadow tuple.count)
    tres: bool           # "gres/gpu=4" (TRES form) rather than "gpu:4" (GRES form)


def _number(text: str) -> int | None:
    """A GRES count: digits with an optional K/M/G/T/P suffix (x1024 each, sbatch(1) --gres),
    or None when ``text`` is not one."""
    m = _NUMBER.fullmatch(text.strip())
    return int(m.group(1)) * _SUFFIX[m.group(2).lower()] if m else None


def _count(text: object, whole: object) -> int:
    n = _number(str(text))
    if n is None:
        raise SlurmError(f"GRES {whole!r}: count {str(text)!r} of {_GPU} is not a whole number")
    return n


def _strip_prefix(key: str) -> str:
    for prefix in ("gres:", "gres/"):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def _indexes(item: str, whole: str) -> int | None:
    """How many device indexes an ``(IDX:0-1,3)`` suffix lists (``N/A`` -> 0), None without one."""
    idx = gpu_indexes(item, whole)
    return None if idx is None else len(idx)


def gpu_indexes(item: str, whole: str | None = None) -> tuple[int, ...] | None:
    """The device indexes an ``(IDX:0-1,3)`` suffix lists, ascending (``(0, 1, 3)``; ``N/A``:
    none), ``None`` without one: the GPUs of a node a job holds, as ``squeue --json``'s
    ``gres_detail`` gives them (one ``gpu:2(IDX:0-1)`` per node, squeue(1) ``%b``/``-d``).

    Raises:
        SlurmError: a range that is not ``N`` or ``N-M`` with ``M >= N``.
    """
    m = _IDX.search(item)
    if m is None:
        return None
    body = m.group(1).strip()
    if body.upper() in ("", "N/A"):
        return ()
    out: set[int] = set()
    for rng in body.split(","):
        lo, _, hi = rng.strip().partition("-")
        if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) < int(lo):
            raise SlurmError(f"GRES {whole if whole is not None else item!r}: bad index range {rng!r}")
        out.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(out))


def _gres_entry(item: str, bare: str, whole: str) -> _Entry:
    """One list item, ``bare`` being it without prefix and parenthesised suffixes:
    ``[gres:|gres/]gpu[:type][:no_consume][:count][(IDX:..)(S:..)]`` or
    ``[gres/]gpu[:type]=count`` (TRES). A count omitted is 1 (sbatch(1) ``--gres``: "The count is
    the number of those resources with a default value of 1"), or the number of indexes when an
    ``(IDX:...)`` list stands in for it (``scontrol show job -d`` ``GRES=gpu(IDX:0-3)``). A
    second field that is a number is the count, anything else the type (``gpu:2`` vs
    ``gpu:a100``), as Slurm reads it."""
    if "=" in bare:
        key, _, cnt = bare.partition("=")
        return _Entry(key.partition(":")[2], _count(cnt, whole), True)
    rest = [p for p in bare.split(":")[1:] if p != "no_consume"]
    if len(rest) >= 2:
        return _Entry(rest[0], _count(rest[-1], whole), False)
    n = _number(rest[0]) if rest else None
    if n is not None:
        return _Entry("", n, False)
    implied = _indexes(item, whole)
    return _Entry(rest[0] if rest else "", 1 if implied is None else implied, False)


def _dict_entry(key: object, val: object, whole: object) -> _Entry:
    """pyslurm's form: ``{"gpu": 4}``, ``{"gpu:a100": "2"}``, ``{"gpu": {"count": 2, ...}}``."""
    if isinstance(val, Mapping):
        val = val.get("count", 0)
    if val is None or isinstance(val, bool):
        raise SlurmError(f"GRES {whole!r}: count {val!r} of {key} is not a whole number")
    return _Entry(_strip_prefix(str(key)).partition(":")[2], _count(val, whole), False)


def _name(key: str) -> str:
    return re.split("[:=]", key, maxsplit=1)[0]


def _entries(value: str | Mapping) -> list[_Entry]:
    if isinstance(value, Mapping):
        return [_dict_entry(k, v, value) for k, v in value.items()
                if _name(_strip_prefix(str(k))) == _GPU]
    if value.strip().lower() in NO_VALUE:
        return []
    out = []
    for item in split_top(value):
        bare = _strip_prefix(_PAREN.sub("", item).strip())    # (IDX:0-1), (S:0-1), (null)
        if _name(bare) == _GPU:
            out.append(_gres_entry(item, bare, value))
    return out


def gpu_count(value: str | Mapping | None) -> int:
    """GPUs in a Slurm GRES or TRES string, or in a pyslurm GRES dict.

    One parser for every place Slurm reports GPUs (per node, in GPUs): squeue's ``tres_per_node``
    (``gres:gpu:4``; ``gres/gpu:4`` in later versions), sinfo's ``gres`` and ``gres_used``
    (``gpu:4``, ``gpu:a100:2(S:0-1)``, ``gpu:(null):0(IDX:N/A)``), TRES strings (``tres_used``:
    ``cpu=2,gres/gpu=2``) and pyslurm's ``{"gpu:a100": 2}``. The rules, with their sources:

    * a count omitted is 1: ``gpu`` -> 1, ``gpu:a100`` -> 1 (sbatch(1) ``--gres``
      ``name[[:type]:count]``, "a default value of 1"), unless an ``(IDX:...)`` list stands in
      for it: ``gpu(IDX:0-3)`` -> 4; a count may carry K/M/G/T/P (x1024, sbatch(1));
    * GRES entries add up, types included: ``gpu:a100:2,gpu:v100:2`` -> 4 (a job asking
      ``--gres=gpu:a100:2,gpu:v100:2`` gets both; slurm.conf(5) ``Gres=gpu:tesla:2,gpu:kepler:2``
      is 4 GPUs);
    * in a TRES string an untyped ``gres/gpu=N`` is the total over types and typed entries
      ``gres/gpu:a100=M`` are counted inside it, so with an untyped entry only that is used;
      without one the typed entries add up (slurm.conf(5) ``AccountingStorageTRES``: "gres/gpu"
      tracks "allocated GPUs of any type", typed ones the jobs of that type);
    * index, socket and link suffixes in parentheses do not change a given count
      (``gpu:2(IDX:0,2)`` -> 2, ``gpu:2(S:0)`` -> 2); ``None``, ``""``, ``(null)``, ``N/A`` -> 0;
      other GRES (``mps:100``, ``shard:8``, ``gres/gpumem=1G``) are not GPUs.

    Raises:
        SlurmError: ``value`` is neither a string, a mapping nor None, or a GPU entry has a
            count that is not a whole number (``gpu:a100:four``).
    """
    if value is None:
        return 0
    if not isinstance(value, (str, Mapping)):
        raise SlurmError(f"GRES: expected a string or a mapping, got {type(value).__name__} {value!r:.80}")
    entries = _entries(value)
    gres = sum(e.amount for e in entries if not e.tres)
    untyped = [e.amount for e in entries if e.tres and not e.type]
    tres = sum(untyped) if untyped else sum(e.amount for e in entries if e.tres)
    return gres + tres


__all__ = ["NO_VALUE", "gpu_count"]
