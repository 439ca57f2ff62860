"""Orphaned extension allocations: the daemon cancels them, once per round.

An hpcsched job is its primary Slurm job plus the extension jobs it submitted to grow
(:mod:`hpcsched.protocol.extensions`, ``docs/extensions.md``). They must end with the primary:
its launcher cancels them when the primary's workers end
(:func:`hpcsched.job.extension.cancel_all`) and an extension's workers exit when the job's
rendezvous is gone; but a launcher killed with its node, or an extension still pending when
the primary ended, can leave one holding (or about to hold) GPUs. The daemon reaps those.

An **orphan** is an active Slurm job (``PENDING``, ``RUNNING``, ...: :data:`hpcsched.slurm.
parse.ACTIVE_STATES`) whose ``--comment`` is an extension tag
(``hpcsched-extension:<primary job id>:<job uid>:g<generation>``) while its primary is not
active in the same observation (ended, or unknown to Slurm). It is cancelled only if the tag
names the primary's real job: ``by-id/<primary>`` in the extension's user's subtree of the
control directory leads to a job directory whose uid is the tag's. Anything else (no such job
directory, another uid: a job id Slurm reused, or a hand-written comment) is left alone and
logged once.

:func:`suspects` and :func:`decide` are pure (observation and job-directory uids in, ids to
cancel out); :class:`Reaper` looks the job directories up and cancels through the daemon's
:class:`~hpcsched.slurm.control.SlurmControl` (one ``scancel`` for a round's orphans).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcsched import slurm
from hpcsched.protocol.extensions import parse_extension_comment
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import SlurmState
from hpcsched.slurm.control import SlurmControl
from hpcsched.slurm.observe import Observation

log = logging.getLogger("hpcsched.daemon.reaper")


@dataclass(frozen=True)
class Tagged:
    """An active Slurm job whose comment is an extension tag.

    Attributes:
        job_id: the extension's Slurm job id. user: its Slurm user. state: its Slurm state.
        primary_job_id, job_uid, generation: what its tag says (the primary Slurm job, the
            job directory's uid, the control generation it was submitted for).
    """

    job_id: str
    user: str
    state: str
    primary_job_id: str
    job_uid: str
    generation: int


@dataclass(frozen=True)
class Verdict:
    """What :func:`decide` found: ``cancel``, the orphans to cancel; ``untouched``, suspects
    left alone, each with why."""

    cancel: tuple[Tagged, ...] = ()
    untouched: tuple[tuple[Tagged, str], ...] = ()


def suspects(jobs: Mapping[str, slurm.JobInfo], partitions: Sequence[str] = ()) -> list[Tagged]:
    """Active jobs tagged as extensions whose primary is not active in ``jobs`` (``squeue``'s
    jobs by id), in job id order; only those in ``partitions`` when some are given (the
    daemon's managed partitions). Pure."""
    out = []
    for info in jobs.values():
        tag = parse_extension_comment(info.comment) if info.active else None
        if tag is None or (partitions and info.partition not in partitions):
            continue
        primary = jobs.get(tag[0])
        if primary is not None and primary.active:
            continue
        out.append(Tagged(info.job_id, info.user, info.state, *tag))
    return sorted(out, key=lambda t: (len(t.job_id), t.job_id))


def decide(jobs: Mapping[str, slurm.JobInfo], job_dir_uids: Mapping[tuple[str, str], str | None],
           partitions: Sequence[str] = ()) -> Verdict:
    """The orphans to cancel among :func:`suspects` (pure).

    ``job_dir_uids``: ``(primary job id, user)`` -> the uid of the primary's job directory in
    that user's subtree (``by-id/<primary>``), or None if there is none; a suspect whose key is
    missing counts as None.
    """
    cancel, untouched = [], []
    for t in suspects(jobs, partitions):
        uid = job_dir_uids.get((t.primary_job_id, t.user))
        if uid is None:
            untouched.append((t, f"no job directory of job {t.primary_job_id} for user {t.user}"))
        elif uid != t.job_uid:
            untouched.append((t, f"tagged for job directory {t.job_uid}, but job "
                                 f"{t.primary_job_id}'s is {uid}"))
        else:
            cancel.append(t)
    return Verdict(tuple(cancel), tuple(untouched))


class Reaper:
    """Cancels orphaned extension jobs (module docstring), one :meth:`reap` per round.

    Args:
        control_dir: where the job directories are. partitions: the managed partitions
            (empty: all). dry_run: log what would be cancelled, cancel nothing.

    Attributes:
        reaped: orphans cancelled since this reaper was made (each counted once).
    """

    def __init__(self, control_dir: Path, partitions: Sequence[str] = (), dry_run: bool = False):
        self.control_dir = Path(control_dir)
        self.partitions, self.dry_run = tuple(partitions), dry_run
        self.reaped = 0
        self._cancelled: set[str] = set()   # cancelled by us (Slurm may list them a while)
        self._said: set[str] = set()        # suspects left alone, already logged

    def job_dir_uid(self, primary_job_id: str, user: str) -> str | None:
        """The uid of job ``primary_job_id``'s directory in ``user``'s subtree, or None."""
        try:
            return JobDir.for_job(primary_job_id, self.control_dir, user=user).uid
        except (LookupError, OSError, RuntimeError):
            return None

    def reap(self, obs: Observation, control: SlurmControl) -> list[str]:
        """Cancel the orphans in ``obs`` through ``control`` (the daemon's Slurm operations:
        ``cancel`` is ``scancel``); returns the ids cancelled now (none in a dry run).

        Each orphan is logged at WARNING with its primary the first time, and cancelled again
        in a later round if Slurm still shows it running or pending (not completing). Never
        raises: a refused ``scancel`` is logged and tried next round; a controller that does
        not answer stops this round's reaping.
        """
        found = suspects(obs.jobs, self.partitions)
        keys = {(t.primary_job_id, t.user) for t in found}
        verdict = decide(obs.jobs, {k: self.job_dir_uid(*k) for k in keys}, self.partitions)
        for t, why in verdict.untouched:
            if t.job_id not in self._said:
                self._said.add(t.job_id)
                log.warning("job %s is tagged as an extension of job %s, which is not active; "
                            "not cancelled: %s", t.job_id, t.primary_job_id, why)
        todo = self._to_cancel(verdict.cancel)
        done = []
        for at in range(0, len(todo), CANCEL_BATCH):
            part = todo[at:at + CANCEL_BATCH]
            try:
                refused = self._cancel(part, control)
            except slurm.SlurmUnavailable as exc:
                log.warning("%d orphaned extension(s) not cancelled: Slurm did not answer (%s); "
                            "next round retries", len(todo) - at, exc)
                break
            done += [t.job_id for t in part if t.job_id not in refused]
        active = {j for j, info in obs.jobs.items() if info.active}
        self._cancelled &= active
        self._said &= active
        return done

    def _to_cancel(self, orphans: Sequence[Tagged]) -> list[Tagged]:
        """The orphans to ``scancel`` now: none that Slurm is already ending (COMPLETING); in a
        dry run none, each logged once instead."""
        todo = []
        for t in orphans:
            if t.state == SlurmState.COMPLETING or (self.dry_run and t.job_id in self._cancelled):
                continue
            if self.dry_run:
                self._cancelled.add(t.job_id)
                log.warning("dry run: would cancel job %s, an extension of job %s (not active)",
                            t.job_id, t.primary_job_id)
                continue
            todo.append(t)
        return todo

    def _cancel(self, orphans: list[Tagged], control: SlurmControl) -> set[str]:
        """One ``scancel`` of ``orphans``, each counted and logged at WARNING the first time;
        the ids Slurm refused (logged; all of them when its error names none).

        Raises:
            SlurmUnavailable: the controller did not answer.
        """
        refused: set[str] = set()
        try:
            control.cancel(*(t.job_id for t in orphans))
        except slurm.SlurmUnavailable:
            raise
        except slurm.SlurmError as exc:
            named = set(_REFUSED.findall(str(exc)))
            refused = {t.job_id for t in orphans if t.job_id in named} or {t.job_id for t in orphans}
            log.warning("orphaned extension(s) %s: scancel refused: %s; next round retries",
                        ", ".join(sorted(refused)), exc)
        for t in orphans:
            if t.job_id in refused:
                continue
            if t.job_id in self._cancelled:
                log.info("job %s, an orphaned extension of job %s, still %s: cancelled again",
                         t.job_id, t.primary_job_id, t.state)
                continue
            self._cancelled.add(t.job_id)
            self.reaped += 1
            log.warning("cancelled job %s, an extension of job %s (%s), which is not active: an "
                        "orphan (%d reaped so far)", t.job_id, t.primary_job_id, t.job_uid, self.reaped)
        return refused


#: orphans per ``scancel`` (one command for a round's orphans: 250 of them came at once at
#: 1,024 GPUs, one command each; ``benchmarks/daemon_scale.py``)
CANCEL_BATCH = 200
#: how scancel names a job it refused: ``scancel: error: Kill job error on job id 11: ...``
_REFUSED = re.compile(r"job id (\d+)")


__all__ = ["Reaper", "Tagged", "Verdict", "decide", "suspects"]
