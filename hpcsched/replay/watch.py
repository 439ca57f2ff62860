"""The replay's loop: submit each planned job at its time, poll Slurm until every job has ended.

One ``squeue --json`` every ``poll_interval`` seconds (default 5: far below the dev cluster's
``MinJobAge`` of 300 s, so every job's end is read before Slurm forgets it), and one right after
each submission, so a job's first ``submit_time`` is read before anything can requeue it (its
original submission; :mod:`hpcsched.replay.slurmread`). Only the jobs this replay submitted are
followed: the extension jobs hpcsched submits for them (``<job>+ext``) have other ids and are
part of their primary job, not workload jobs.

A submission hpcsub refuses is recorded (state ``REFUSED``, never counted as finished) and the
replay goes on with the other jobs: one bad job should not throw away a run of tens of minutes.
A job that leaves ``squeue`` before its end was read is looked up in ``sacct``; without
accounting it is ``VANISHED``. Slurm not answering for ``max_outage`` seconds stops the replay
(:class:`~hpcsched.replay.ReplayError`); Ctrl-C (``KeyboardInterrupt``) propagates with
:attr:`Replay.tracked` as it stood, and cancels nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpcsched.protocol.kinds import SlurmState
from hpcsched.replay import ReplayError
from hpcsched.replay.plan import PlannedJob
from hpcsched.replay.slurmread import JobRecord, JobTimes, poll, read_sacct
from hpcsched.replay.submit import Refused, submit
from hpcsched.slurm.errors import SlurmError

#: seconds between polls of squeue
POLL_INTERVAL = 5.0
#: seconds of Slurm not answering after which the replay stops
MAX_OUTAGE = 120.0
#: polls that do not list a job just submitted before it counts as lost
UNSEEN_POLLS = 3
#: a Slurm submit time later than hpcsub's return by more than this was a requeue's (seconds)
CLOCK_SLACK = 1.0


@dataclass
class Tracked:
    """One planned job during the replay: its Slurm id and record once submitted, the
    refusal's message if hpcsub refused it, ``vanished`` once Slurm forgot it unread."""

    planned: PlannedJob
    job_id: str | None = None
    submitted_at: float | None = None     # epoch seconds when hpcsub returned
    record: JobRecord | None = None
    refused: str | None = None
    vanished: bool = False
    unseen: int = 0                       # polls since submission that did not list it

    @property
    def state(self) -> str:
        """``NOT_SUBMITTED``, ``REFUSED``, ``VANISHED``, or Slurm's last state."""
        if self.refused is not None:
            return "REFUSED"
        if self.vanished:
            return "VANISHED"
        if self.job_id is None:
            return "NOT_SUBMITTED"
        return self.record.state if self.record else SlurmState.PENDING

    @property
    def done(self) -> bool:
        """Nothing more will happen to it: refused, vanished, or ended in Slurm."""
        return self.refused is not None or self.vanished or bool(self.record and self.record.ended)

    @property
    def submit_time(self) -> float | None:
        """The original submission (epoch seconds): Slurm's first ``submit_time`` seen, unless
        that is later than hpcsub's return (then a requeue had rewritten it before the first
        poll, and hpcsub's return is used)."""
        seen = self.record.submit if self.record else None
        if seen is None or (self.submitted_at is not None
                            and seen > self.submitted_at + CLOCK_SLACK):
            return self.submitted_at
        return seen


def counts(tracked: Sequence[Tracked]) -> dict[str, int]:
    """``{"waiting", "pending", "running", "finished", "failed"}``: not submitted yet, pending or
    running in Slurm, completed, and ended otherwise (failed, cancelled, timed out, refused,
    vanished)."""
    out = dict.fromkeys(("waiting", "pending", "running", "finished", "failed"), 0)
    for t in tracked:
        s = t.state
        key = ("waiting" if s == "NOT_SUBMITTED" else "finished" if s == SlurmState.COMPLETED
               else "failed" if t.done else "running" if s in (SlurmState.RUNNING, SlurmState.COMPLETING)
               else "pending")
        out[key] += 1
    return out


@dataclass
class Replay:
    """Submit ``plan`` with ``hpcsub`` (other users' plain jobs with ``sbatch``) and follow it to
    the end (:meth:`run`).

    ``submit_fn``, ``poll_fn``, ``sacct_fn``, ``clock`` and ``sleep`` are Slurm and time (fakes
    in unit tests); ``on_update(tracked)`` is called after every poll, ``on_refused(tracked)``
    for each refusal.
    """

    plan: Sequence[PlannedJob]
    hpcsub: str
    sbatch: str = "sbatch"   # other users' plain jobs (PlannedJob.rigid)
    cwd: str | None = None
    poll_interval: float = POLL_INTERVAL
    max_outage: float = MAX_OUTAGE
    submit_fn: Callable[..., str] = submit
    poll_fn: Callable[[], dict[str, JobTimes]] = poll
    sacct_fn: Callable[[Sequence[str]], dict[str, JobRecord]] = read_sacct
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    on_update: Callable[[list[Tracked]], None] | None = None
    on_refused: Callable[[Tracked], None] | None = None
    tracked: list[Tracked] = field(default_factory=list)
    start: float = 0.0

    def run(self) -> list[Tracked]:
        """Submit every job at ``start + submit_at`` and poll until all are done.

        Raises:
            ReplayError: Slurm did not answer for ``max_outage`` seconds.
            KeyboardInterrupt: as raised; :attr:`tracked` holds what was submitted.
        """
        self.tracked = [Tracked(p) for p in sorted(self.plan, key=lambda p: p.submit_at)]
        self.start = self.clock()
        queue = list(self.tracked)
        last_poll, outage_since = None, None
        while True:
            due = [t for t in queue if self.start + t.planned.submit_at <= self.clock()]
            for t in due:
                queue.remove(t)
                self._submit(t)
            now = self.clock()
            if due or last_poll is None or now - last_poll >= self.poll_interval:
                outage_since = self._poll_or_wait(now, outage_since)
                last_poll = now
            if not queue and all(t.done for t in self.tracked):
                return self.tracked
            wake = min([last_poll + self.poll_interval]
                       + [self.start + t.planned.submit_at for t in queue[:1]])
            self.sleep(max(0.0, min(self.poll_interval, wake - self.clock())))

    def _poll_or_wait(self, now: float, outage_since: float | None) -> float | None:
        """One poll; returns since when Slurm has not answered (None: it answered).

        Raises:
            ReplayError: it has not answered for ``max_outage`` seconds.
        """
        try:
            self._poll()
            outage_since = None
        except SlurmError as exc:
            outage_since = now if outage_since is None else outage_since
            if now - outage_since >= self.max_outage:
                raise ReplayError(f"Slurm did not answer for {now - outage_since:.0f} s "
                                  f"({exc})") from None
        if self.on_update:
            self.on_update(self.tracked)
        return outage_since

    def _submit(self, t: Tracked) -> None:
        try:
            t.job_id = self.submit_fn(self.hpcsub if not t.planned.rigid else self.sbatch,
                                      t.planned.argv, cwd=self.cwd)
            t.submitted_at = self.clock()
        except Refused as exc:
            t.refused = str(exc)
            if self.on_refused:
                self.on_refused(t)

    def _poll(self) -> None:
        jobs = self.poll_fn()
        lost = []
        for t in self.tracked:
            if t.job_id is None or t.done:
                continue
            seen = jobs.get(t.job_id)
            if seen is not None:
                t.record = (t.record or JobRecord(t.job_id)).seen(seen)
                continue
            t.unseen += 1
            if t.record is not None or t.unseen >= UNSEEN_POLLS:   # forgotten before its end
                lost.append(t)
        if lost:
            acct = self.sacct_fn([t.job_id for t in lost])
            for t in lost:
                rec = acct.get(t.job_id)
                if rec is not None and rec.ended:
                    old = t.record or JobRecord(t.job_id)
                    t.record = JobRecord(t.job_id, rec.state, old.submit or rec.submit,
                                         rec.start, rec.end, max(old.requeues, rec.requeues))
                else:
                    t.vanished = True
