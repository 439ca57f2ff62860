"""A cache of finished simulations for the evaluation benchmark, keyed by the run and the code.

A simulation is deterministic for a given :class:`hpcsched.sim.cli.Run` (its seed included) and
a given state of the ``hpcsched`` package (code and shipped data), so a result computed once can
stand for a later run of the same code: a full ``benchmarks/evaluation.py`` run (over 500
simulations, more than an hour on 2 cores) that is stopped can be started again and goes on
where it stopped, and ``--pal`` or ``--grow-modes`` reuse what the full run already simulated.

The code's state is :func:`code_version`: git's tree hash of ``hpcsched/`` at ``HEAD`` plus a
hash of any uncommitted change under it (``git diff`` and the untracked files' contents), so
any edit to the package, committed or not, starts a new cache. The wall time of a cached run
is the one it took when it was simulated. Entries live under ``bench-results/evaluation-cache/``
(ignored by git), one pickle per run: ``(SimResult, summary)``.
"""

from __future__ import annotations

import hashlib
import pickle
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = ROOT / "bench-results" / "evaluation-cache"


def _git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          timeout=60).stdout


def code_version() -> str | None:
    """A hash of the ``hpcsched`` package as it is on disk (module docstring); ``None`` when it
    cannot be told (not a git checkout, or git missing): nothing is then cached."""
    try:
        tree = _git("rev-parse", "HEAD:hpcsched").strip()
        diff = _git("diff", "HEAD", "--binary", "--", "hpcsched")
        untracked = _git("ls-files", "--others", "--exclude-standard", "-z", "--", "hpcsched")
    except (OSError, subprocess.SubprocessError):
        return None
    h = hashlib.sha256(tree + b"\0" + diff)
    for name in sorted(p for p in untracked.split(b"\0") if p):
        h.update(b"\0" + name + b"\0" + (ROOT / name.decode()).read_bytes())
    return h.hexdigest()[:20]


def describe() -> str:
    """Which code ran, for a document's provenance line: ``"commit abc1234"``, with ``" plus
    uncommitted changes to hpcsched/"`` when there are some; ``"an unknown commit"`` outside git."""
    try:
        head = _git("rev-parse", "--short", "HEAD").decode().strip()
        dirty = _git("status", "--porcelain", "--", "hpcsched").strip()
    except (OSError, subprocess.SubprocessError):
        return "an unknown commit"
    return f"commit {head}" + (" plus uncommitted changes to hpcsched/" if dirty else "")


class RunCache:
    """Results of simulations by run, for one code version (``None``: a cache that holds
    nothing and keeps nothing)."""

    def __init__(self, version: str | None, directory: Path = CACHE_DIR):
        self.version = version
        self.dir = directory / version if version else None

    def _path(self, run) -> Path:
        return self.dir / (hashlib.sha256(repr(run).encode()).hexdigest()[:24] + ".pkl")

    def get(self, run):
        """``(SimResult, summary)`` of ``run`` simulated by this code, or ``None``. An entry
        that cannot be read (a run killed while writing it) counts as missing."""
        if self.dir is None:
            return None
        try:
            with self._path(run).open("rb") as f:
                saved_run, value = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, AttributeError):
            return None
        return value if saved_run == run else None

    def put(self, run, value) -> None:
        """Keep ``(SimResult, summary)`` of ``run`` (written to a temporary file, then renamed)."""
        if self.dir is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self._path(run)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            pickle.dump((run, value), f, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)
