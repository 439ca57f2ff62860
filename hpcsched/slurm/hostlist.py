"""Slurm hostlist expressions (``n[1-3,5],m01``) expanded without calling Slurm.

Pure; the same result as ``scontrol show hostnames`` for the forms below (scontrol(1),
"hostnames"). :func:`split_top` is also what the GRES parser splits lists with, since both
formats nest commas inside brackets or parentheses.
"""

from __future__ import annotations

from hpcsched.slurm.errors import SlurmError


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses and brackets, dropping empty parts:
    ``"gpu:2(IDX:0,2),mps:1"`` -> ``["gpu:2(IDX:0,2)", "mps:1"]``, ``"n[1,3],m1"`` ->
    ``["n[1,3]", "m1"]``."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def _range(rng: str, whole: str) -> range:
    """``"3-5"`` -> range(3, 6); ``"7"`` -> range(7, 8)."""
    lo, _, hi = rng.strip().partition("-")
    hi = hi or lo
    if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
        raise SlurmError(f"hostlist {whole!r}: bad range {rng!r}")
    return range(int(lo), int(hi) + 1)


def _expand_one(part: str, whole: str) -> list[str]:
    """Expand one comma-free (at top level) hostlist item; bracket groups multiply."""
    lb = part.find("[")
    if lb < 0:
        if "]" in part:
            raise SlurmError(f"hostlist {whole!r}: unbalanced ']'")
        return [part]
    rb = part.find("]", lb)
    if rb < 0:
        raise SlurmError(f"hostlist {whole!r}: unbalanced '['")
    head, body, tail = part[:lb], part[lb + 1:rb], part[rb + 1:]
    tails = _expand_one(tail, whole) if tail else [""]
    out: list[str] = []
    for rng in body.split(","):
        lo = rng.strip().partition("-")[0]
        width = len(lo) if lo.startswith("0") else 0
        for k in _range(rng, whole):
            out.extend(f"{head}{k:0{width}d}{t}" for t in tails)
    return out


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression without calling Slurm: ``"n[1-3,5],m01"`` ->
    ``["n1", "n2", "n3", "n5", "m01"]``; zero padding is kept (``n[01-02]``), several bracket
    groups multiply (``r[1-2]n[1-2]``). Equivalent to ``scontrol show hostnames`` for these forms.

    Raises:
        SlurmError: unbalanced brackets or a range that is not numeric.
    """
    out: list[str] = []
    for part in split_top(expr or ""):
        out.extend(_expand_one(part, expr))
    return out
