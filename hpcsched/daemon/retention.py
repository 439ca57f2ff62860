"""Nothing kept for ever: finished jobs' directories and store rows expire (``[retention]``).

About once an hour (:data:`SWEEP_EVERY_S`) the daemon removes

* the **job directory** of every job that finished more than ``job_days`` ago (its spec,
  control and acknowledgement files, metrics, and its checkpoints when they are in it: a
  ``--hpcsched-checkpoint-dir`` elsewhere is the user's, never touched), with its ``by-id`` link;
* from the **store**, the jobs that finished more than ``store_days`` ago with their profile,
  GPU measurements and journal, and the rounds older than that (:meth:`Store.prune`);
* from the **store**, whatever ``job_days`` and ``store_days`` say, the ingest offsets of
  metrics files that are gone and were last read more than a day ago
  (:meth:`Store.prune_ingest_offsets`): one row per rank's file of every job ever run would
  otherwise pile up.

A job counts as finished when the store says so (``finished_at``, set the round Slurm stopped
listing it as active) and Slurm does not list it as active now. A directory is removed only if
it is a real directory (no link followed) at ``<control_dir>/<user>/<job_uid>`` and holds that
job's spec; anything else is left alone and logged. 0 days keeps things for ever.

:func:`expired_dirs` is pure; :class:`Retention` does the removing.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Collection, Iterable
from pathlib import Path

from hpcsched.daemon.config import RetentionSettings
from hpcsched.daemon.store.rows import JobRow

log = logging.getLogger("hpcsched.daemon.retention")

#: seconds between two sweeps
SWEEP_EVERY_S = 3600.0
DAY_S = 86400.0


def expired_dirs(jobs: Iterable[JobRow], active: Collection[str], now: float,
                 job_days: float) -> list[JobRow]:
    """The jobs whose directories have expired: finished more than ``job_days`` days before
    ``now`` (Unix s) and not among the job ids Slurm lists as ``active``; none with 0 days."""
    if job_days <= 0:
        return []
    before = now - job_days * DAY_S
    return [j for j in jobs if j.finished_at is not None and j.finished_at < before
            and j.job_id not in active]


class Retention:
    """The sweeps of one daemon (module docstring): ``settings``, its ``store`` and the
    ``control_dir`` of the job directories."""

    def __init__(self, settings: RetentionSettings, store, control_dir: Path):
        self.settings, self.store, self.control_dir = settings, store, control_dir
        self._last = -SWEEP_EVERY_S

    def due(self, monotonic: float | None = None) -> bool:
        return (time.monotonic() if monotonic is None else monotonic) - self._last >= SWEEP_EVERY_S

    def sweep(self, active: Collection[str], now: float | None = None) -> dict[str, int]:
        """Remove what has expired; returns the counts (``dirs``, ``jobs``, ``rounds``,
        ``offsets``). Never raises for a directory it cannot remove (logged, tried again next
        sweep)."""
        self._last = time.monotonic()
        now = time.time() if now is None else now
        dirs = 0
        for job in expired_dirs(self.store.jobs(), active, now, self.settings.job_days):
            dirs += self._remove(job)
        pruned = {"jobs": 0, "rounds": 0}
        if self.settings.store_days > 0:
            pruned = self.store.prune(now - self.settings.store_days * DAY_S)
        offsets = self.store.prune_ingest_offsets(now - DAY_S)
        if dirs or pruned["jobs"] or pruned["rounds"] or offsets:
            log.info("retention: removed %d job director(y/ies) older than %g days; %d job(s) "
                     "and %d round(s) from the store older than %g days; %d ingest offset(s) "
                     "of metrics files gone", dirs, self.settings.job_days, pruned["jobs"],
                     pruned["rounds"], self.settings.store_days, offsets)
        return {"dirs": dirs, **pruned, "offsets": offsets}

    def _remove(self, job: JobRow) -> int:
        """Remove ``job``'s directory and its ``by-id`` link; 1 if removed, else 0."""
        subtree = self.control_dir / job.user
        path = subtree / job.job_uid
        if not job.user or not job.job_uid or "/" in job.job_uid or job.job_uid in (".", ".."):
            return 0
        try:
            if path.is_symlink() or not path.is_dir():
                return 0       # gone already, or not a directory we made
            if not (path / "spec.json").is_file():
                log.warning("retention: %s has no spec.json; not removed", path)
                return 0
            link = subtree / "by-id" / job.job_id
            if link.is_symlink() and os.path.realpath(link) == os.path.realpath(path):
                link.unlink()
            shutil.rmtree(path)
        except OSError as exc:
            log.warning("retention: %s not removed (%s); next sweep tries again", path, exc)
            return 0
        return 1


__all__ = ["DAY_S", "SWEEP_EVERY_S", "Retention", "expired_dirs"]
