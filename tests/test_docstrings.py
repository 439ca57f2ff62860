"""Docstrings and comments in ``hpcsched/`` state the contract, not a lab notebook.

Measurements and their history live in ``docs/design-notes.md``; the code keeps one sentence
and a pointer there. This test fails, naming file and line, on a dated result in a docstring or
comment of ``hpcsched/**/*.py`` (``hpcsched/data/`` aside): an ISO date ``20YY-MM-DD``, or the
phrase "one-off run". A date followed by ``T`` and a time (``2026-11-24T08:43:03``) is a format
example, not a result, and is allowed.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hpcsched"
SKIPPED = ("hpcsched/data/",)   # shipped data sets and their scripts, not our prose

#: an ISO date that is not the date part of an ISO timestamp (a format example)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d(?!T\d\d:\d\d)")
ONE_OFF = re.compile(r"one-off\s+runs?\b", re.IGNORECASE)   # across a line break too

#: files (path from the repository root -> reason) that may still hold dated results:
#: moved in a later change. These would be the files someone else was editing while the rest
#: moved to docs/design-notes.md (hpcsched/policies/neighbours.py, hpcsched/daemon/round.py,
#: hpcsched/daemon/views.py, hpcsched/job/*.py); none of them holds a dated result or a
#: one-off run, so the list is empty. Add a file only with its reason:
#: test_allowed_files_still_need_it fails once it no longer needs to be here.
ALLOWED: dict[str, str] = {}


def _files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if not p.relative_to(ROOT).as_posix().startswith(SKIPPED))


def _docstrings(tree: ast.AST):
    """``(first line, text)`` of every string statement: module, class and function
    docstrings, and the attribute docstrings under assignments."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            yield node.value.lineno, node.value.value


def _comments(source: str):
    """``(line, text)`` of every comment (one line each)."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def _prose(path: Path):
    source = path.read_text(encoding="utf-8")
    yield from _docstrings(ast.parse(source, filename=str(path)))
    yield from _comments(source)


def _hits(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    return [f"{rel}:{line}: {what} ({found!r}) in a docstring or comment: move the "
            "measurement to docs/design-notes.md and point there"
            for line, what, found in _found(_prose(path))]


def _found(prose):
    """``(line, what, text found)`` for each match of the checks in ``(first line, text)``."""
    for first, text in prose:
        for pattern, what in ((DATE, "a dated result"), (ONE_OFF, '"one-off run"')):
            for m in pattern.finditer(text):
                yield first + text.count("\n", 0, m.start()), what, m.group(0)


def test_no_dated_results_in_docstrings_or_comments():
    hits = [h for p in _files() if p.relative_to(ROOT).as_posix() not in ALLOWED
            for h in _hits(p)]
    assert not hits, "\n".join(hits)


def test_allowed_files_still_need_it():
    """Keep :data:`ALLOWED` as short as the truth: a file leaves it once its dates have moved."""
    stale = [rel for rel in ALLOWED if not (ROOT / rel).is_file() or not _hits(ROOT / rel)]
    assert not stale, f"no dated result left in {stale}: remove them from ALLOWED"


def test_the_checks_see_what_they_should():
    assert _hits_in('"""Measured (2026-11-27, one-off runs)."""\n') == [1, 1]
    assert _hits_in('def f():\n    """Measured (one-off\n    runs, 2026-11-26)."""\n') == [2, 3]
    assert _hits_in("x = 1  # 1,290 -> 1,269 s (2026-11-26)\n") == [1]
    assert _hits_in('def f():\n    """Reads ``2026-11-24T08:43:03`` (local time)."""\n') == []
    assert _hits_in('x = "2026-11-24"   # a string, not prose\n') == []


def _hits_in(source: str) -> list[int]:
    """Lines of ``source`` the checks flag, one entry per match."""
    prose = (*_docstrings(ast.parse(source)), *_comments(source))
    return sorted(line for line, _, _ in _found(prose))
