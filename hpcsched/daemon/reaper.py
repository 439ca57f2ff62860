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
import threading
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
        background: run each round's ``scancel`` in a thread of its own and take its outcome
            at the next :meth:`reap` (the daemon: a controller slow to answer, 20 s at most
            per command, then holds up no round; measured at 1,024 GPUs, ``docs/daemon.md``,
            "At scale"); False: within :meth:`reap`.

    Attributes:
        reaped: orphans cancelled since this reaper was made (each counted once).
    """

    def __init__(self, control_dir: Path, partitions: Sequence[str] = (), dry_run: bool = False,
                 background: bool = False):
        self.control_dir = Path(control_dir)
        self.partitions, self.dry_run, self.background = tuple(partitions), dry_run, background
        self.reaped = 0
        self._cancelled: set[str] = set()   # cancelled by us (Slurm may list them a while)
        self._said: set[str] = set()        # suspects left alone, already logged
        self._inflight: _Cancelling | None = None   # a background scancel, not yet taken in

    def job_dir_uid(self, primary_job_id: str, user: str) -> str | None:
        """The uid of job ``primary_job_id``'s directory in ``user``'s subtree, or None."""
        try:
            return JobDir.for_job(primary_job_id, self.control_dir, user=user).uid
        except (LookupError, OSError, RuntimeError):
            return None

    def reap(self, obs: Observation, control: SlurmControl) -> list[str]:
        """Cancel the orphans in ``obs`` through ``control`` (the daemon's Slurm operations:
        ``cancel`` is ``scancel``); returns the ids cancelled: now, or with ``background``,
        those whose ``scancel`` ended since the last call (none in a dry run).

        Each orphan is logged at WARNING with its primary the first time, and cancelled again
        in a later round if Slurm still shows it running or pending (not completing). With
        ``background``, no new ``scancel`` starts while the last one runs. Never raises: a
        refused ``scancel`` is logged and tried next round; a controller that does not answer
        stops this round's reaping.
        """
        done = self.settle(wait=False)
        found = suspects(obs.jobs, self.partitions)
        keys = {(t.primary_job_id, t.user) for t in found}
        verdict = decide(obs.jobs, {k: self.job_dir_uid(*k) for k in keys}, self.partitions)
        for t, why in verdict.untouched:
            if t.job_id not in self._said:
                self._said.add(t.job_id)
                log.warning("job %s is tagged as an extension of job %s, which is not active; "
                            "not cancelled: %s", t.job_id, t.primary_job_id, why)
        todo = self._to_cancel(verdict.cancel) if self._inflight is None else []
        if todo and self.background:
            self._inflight = _Cancelling(todo, control)
        elif todo:
            done += self._outcome(todo, _cancel_batches(todo, control))
        active = {j for j, info in obs.jobs.items() if info.active}
        self._cancelled &= active
        self._said &= active
        return done

    def settle(self, wait: bool = True) -> list[str]:
        """Take in the background ``scancel``'s outcome (waiting for it with ``wait``, else
        only if it has ended): the ids it cancelled, each counted and logged as by
        :meth:`reap`; [] when none ran or it still runs."""
        c = self._inflight
        if c is None or not c.ended(wait):
            return []
        self._inflight = None
        return self._outcome(c.todo, c.results)

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

    def _outcome(self, todo: list[Tagged], results: list[tuple[list[Tagged], Exception | None]]
                 ) -> list[str]:
        """Count and log what :func:`_cancel_batches` did with ``todo`` (``results``: each
        ``scancel`` command's orphans and error, in order; fewer when the controller stopped
        answering); returns the ids cancelled."""
        done: list[str] = []
        at = 0
        for part, result in results:
            if isinstance(result, slurm.SlurmUnavailable):
                log.warning("%d orphaned extension(s) not cancelled: Slurm did not answer (%s); "
                            "next round retries", len(todo) - at, result)
                break
            at += len(part)
            refused: set[str] = set()
            if result is not None:
                named = set(_REFUSED.findall(str(result)))
                refused = {t.job_id for t in part if t.job_id in named} or {t.job_id for t in part}
                log.warning("orphaned extension(s) %s: scancel refused: %s; next round retries",
                            ", ".join(sorted(refused)), result)
            for t in part:
                if t.job_id in refused:
                    continue
                done.append(t.job_id)
                if t.job_id in self._cancelled:
                    log.info("job %s, an orphaned extension of job %s, still %s: cancelled again",
                             t.job_id, t.primary_job_id, t.state)
                    continue
                self._cancelled.add(t.job_id)
                self.reaped += 1
                log.warning("cancelled job %s, an extension of job %s (%s), which is not active: "
                            "an orphan (%d reaped so far)", t.job_id, t.primary_job_id, t.job_uid,
                            self.reaped)
        return done


def _cancel_batches(todo: list[Tagged], control: SlurmControl
                    ) -> list[tuple[list[Tagged], Exception | None]]:
    """One ``scancel`` per :data:`CANCEL_BATCH` of ``todo``: per command, its orphans and None
    or the :class:`~hpcsched.slurm.SlurmError` it raised; stops after a
    :class:`~hpcsched.slurm.SlurmUnavailable` (the controller does not answer). Touches no
    :class:`Reaper` state, so it may run in a thread of its own."""
    results: list[tuple[list[Tagged], Exception | None]] = []
    for at in range(0, len(todo), CANCEL_BATCH):
        part = todo[at:at + CANCEL_BATCH]
        try:
            control.cancel(*(t.job_id for t in part))
            results.append((part, None))
        except slurm.SlurmError as exc:   # SlurmUnavailable included
            results.append((part, exc))
            if isinstance(exc, slurm.SlurmUnavailable):
                break
    return results


class _Cancelling:
    """:func:`_cancel_batches` of ``todo`` running in a daemon thread (the process does not
    wait for it at exit: a ``scancel`` it leaves running ends on its own)."""

    def __init__(self, todo: list[Tagged], control: SlurmControl):
        self.todo = todo
        self.results: list[tuple[list[Tagged], Exception | None]] = []
        self._thread = threading.Thread(target=self._run, args=(control,), daemon=True,
                                        name="hpcsched-reaper")
        self._thread.start()

    def _run(self, control: SlurmControl) -> None:
        try:
            self.results = _cancel_batches(self.todo, control)
        except Exception as exc:   # a bug, not Slurm: logged, and the next round tries again
            log.exception("orphaned extension(s) not cancelled: %s", exc)
            self.results = [(self.todo, slurm.SlurmUnavailable(f"scancel thread failed: {exc}"))]

    def ended(self, wait: bool) -> bool:
        if wait:
            self._thread.join()
        return not self._thread.is_alive()


#: orphans per ``scancel`` (one command for a round's orphans: 250 of them came at once at
#: 1,024 GPUs, one command each; ``benchmarks/daemon_scale.py``)
CANCEL_BATCH = 200
#: how scancel names a job it refused: ``scancel: error: Kill job error on job id 11: ...``
_REFUSED = re.compile(r"job id (\d+)")


__all__ = ["Reaper", "Tagged", "Verdict", "decide", "suspects"]
