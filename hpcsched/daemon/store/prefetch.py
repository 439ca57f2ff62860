"""The store as one round's snapshot reads it: every managed job's profile and latest journal
entries fetched in two queries for all jobs at once (:meth:`Store.profiles`,
:meth:`Store.recent_actions`), where reading them job by job cost two queries per job (at 500
jobs, 0.5 s of a 1.5 s round: ``benchmarks/daemon_scale.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpcsched.daemon.store.rows import ActionRow, ProfileRow

#: journal entries fetched per job: what :func:`hpcsched.daemon.views.last_resize` and
#: :func:`~hpcsched.daemon.views.held_after_preemption` look at
RECENT = 10


class Prefetched:
    """``store`` with :meth:`profile` and :meth:`actions` answered for ``job_ids`` from two
    queries made now (a job outside them, or more than :data:`RECENT` actions, asks the store);
    every other attribute is the store's own. Read-only use within one round: it does not see
    what is written after it was made."""

    def __init__(self, store: Any, job_ids: Iterable[str]):
        ids = list(job_ids)
        self._store, self._ids = store, frozenset(ids)
        self._profiles = store.profiles(ids)
        self._actions = store.recent_actions(ids, RECENT)

    def profile(self, job_id: str) -> list[ProfileRow]:
        if job_id not in self._ids:
            return self._store.profile(job_id)
        return list(self._profiles.get(job_id, []))

    def actions(self, job_id: str | None = None, limit: int = 50) -> list[ActionRow]:
        if job_id is None or job_id not in self._ids or limit > RECENT:
            return self._store.actions(job_id, limit)
        return list(self._actions.get(job_id, [])[:limit])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
