"""What became of the changes a benchmark's daemon made: its journal, summed up."""

from __future__ import annotations

import collections
import re

from hpcsched.daemon.store import Store


def journal_outcomes(store: Store, top: int = 12) -> dict:
    """The journal's actions by kind and phase reached (``"grow failed"``: N), and the ``top``
    reasons of the failed ones, their numbers (job ids, seconds, generations) written ``N`` so
    that one kind of failure is one line: e.g. how many grows Slurm never started, and why.
    """
    rows = store.actions(limit=10 ** 9)
    by_phase = collections.Counter(f"{a.kind} {a.phase}" for a in rows)
    failed = collections.Counter(re.sub(r"\d+(?:\.\d+)?", "N", a.error or "(no reason)")[:160]
                                 for a in rows if a.phase == "failed")
    return {"actions": len(rows), "by_kind_phase": dict(by_phase.most_common()),
            "failed_reasons": dict(failed.most_common(top))}
