"""A job's claims about itself, checked against what it is seen to do (issue 33, "claims
checked against what is observed").

``jct`` ranks jobs by their remaining time, from two things each job reports about itself: its
remaining work (``progress.json``'s total less what it has done; :class:`~hpcsched.views.build.
JobReport`) and its throughput per configuration (its step records: the
:attr:`~hpcsched.model.snapshot.JobView.profile`). A job that understates its work, or
overstates its throughput at large sizes, would be ranked ahead of honest jobs and given GPUs
that they lose: SRPT-style policies invite that (Harchol-Balter, "Performance Modeling and
Design of Computer Systems", 2013, §33: SRPT needs true sizes). So every round, before the
policy plans, each running job's claims are compared with its own progress over time:

* **Work.** The smallest total work the job has claimed since its last broken promise (what it
  had done plus what it said was left) is a promise: a job that has done more than
  ``WORK_SLACK`` x that and runs on broke it. An honest job's total stays put (its epochs x its
  data set), so it never breaks one. After ``DISTRUST_AFTER`` broken promises the job's report
  is no longer used: its remaining work is unknown, as for a job that reports none (``jct``:
  ``unknown_remaining`` seconds at its goodput).
* **Throughput.** Between two rounds at the same size and batch size, not busy and not
  resized or restarted in between (:attr:`~hpcsched.model.snapshot.JobView.resized_at`),
  the optimizer steps the job reports done times its global batch, over the wall-clock seconds,
  are its observed rate at that size (a window of at least ``RATE_WINDOW_S`` seconds). Where
  its measured throughput at that size exceeds the observed rate by more than ``RATE_SLACK`` x,
  the measurement is replaced by the observed rate, and its throughput at every larger size is
  scaled down by the same factor (an overstatement "at large sizes" is caught at the first
  large size it runs at).

A liar gains until caught and nothing after; an honest job is never touched (the slacks leave
room for checkpoints, data loading and step-boundary pauses, which the observed rate includes
and the step records do not). Pure: :func:`check_claims` takes the book of what was seen and
returns the judged snapshot, the new book and one note per new finding.

Units: seconds, samples, samples/s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hpcsched.model.snapshot import ClusterSnapshot, JobView, ProfilePoint
from hpcsched.protocol.kinds import SlurmState

#: a job that has done more than this times the work it promised, and runs on, broke its promise
WORK_SLACK = 1.10
#: broken promises after which a job's reported work is not used
DISTRUST_AFTER = 2
#: observed throughput this many times below the measured one is a false measurement
RATE_SLACK = 2.0
#: seconds of observation at one size before its throughput is judged
RATE_WINDOW_S = 60.0


@dataclass(frozen=True)
class JobClaims:
    """What was seen of one job's claims.

    Attributes:
        promised: the smallest total work (samples) claimed since the last broken promise;
            None before the first report.
        broken: how many promises of work it has broken.
        last: ``(time s, optimizer steps done, world size, nodes, global batch size)`` at
            the previous round it ran, not busy; None when there is none to measure from.
        observed: ``(world size, nodes, global batch size)`` -> ``(samples, seconds)`` seen
            done in that configuration.
        slow: world size -> observed / measured throughput, where the measurement was false.
    """

    promised: float | None = None
    broken: int = 0
    last: tuple[float, int, int, int, int] | None = None
    observed: Mapping[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)
    slow: Mapping[int, float] = field(default_factory=dict)

    @property
    def distrusted(self) -> bool:
        """Its reported remaining work is not used."""
        return self.broken >= DISTRUST_AFTER


#: every managed job's :class:`JobClaims`, by job id
ClaimBook = Mapping[str, JobClaims]


def _measured_rate(job: JobView, world: int) -> float | None:
    """The job's measured throughput (samples/s) at ``world`` GPUs on its nodes in force and
    its global batch in force: its profile's point there with the most step records (any other
    point at ``world`` GPUs, where none is that one)."""
    points = [p for p in job.profile if p.world_size == world and p.throughput > 0]
    same = [p for p in points if p.nodes == job.nodes
            and p.world_size * p.local_batch_size * p.accumulation_steps == job.batch_size]
    return max(same or points, key=lambda p: p.samples).throughput if points else None


def _observe_work(c: JobClaims, job: JobView, notes: list[str]) -> JobClaims:
    if job.remaining_samples is None:
        return c
    done = float(job.samples_processed)
    total = done + job.remaining_samples
    if c.promised is None:
        return replace(c, promised=total)
    if done > WORK_SLACK * c.promised and job.remaining_samples > 0:
        broken = c.broken + 1
        notes.append(
            f"job {job.job_id}: has done {done:.0f} samples, more than the {c.promised:.0f} it "
            f"claimed in all; broken claims of work: {broken}"
            + ("; its reported work is no longer used" if broken == DISTRUST_AFTER else ""))
        return replace(c, promised=total, broken=broken)
    return replace(c, promised=min(c.promised, total))


def _observe_rate(c: JobClaims, job: JobView, now: float, notes: list[str]) -> JobClaims:
    world, steps, batch = job.gpus, job.steps, job.batch_size
    if job.busy or job.state != SlurmState.RUNNING or world <= 0:
        return replace(c, last=None)
    config = (world, job.nodes, batch)
    last, c = c.last, replace(c, last=(now, steps, *config))
    if (last is None or last[2:] != config or steps < last[1] or now <= last[0]
            or (job.resized_at is not None and job.resized_at > last[0])):
        return c      # nothing to measure from, or it resized or restarted in between
    samples, seconds = c.observed.get(config, (0.0, 0.0))
    samples, seconds = samples + (steps - last[1]) * batch, seconds + now - last[0]
    c = replace(c, observed={**c.observed, config: (samples, seconds)})
    measured = _measured_rate(job, world)
    if seconds < RATE_WINDOW_S or not measured or world in c.slow:
        return c
    ratio = max(samples / seconds / measured, 0.01)   # a job stuck at a size: 1% of its claim
    if ratio * RATE_SLACK >= 1.0:
        return c
    notes.append(f"job {job.job_id}: at {world} GPUs it did {samples / seconds:.1f} samples/s, "
                 f"not the {measured:.1f} its step records claim; its throughput there and at "
                 "larger sizes is taken as observed")
    return replace(c, slow={**c.slow, world: ratio})


def _judged(job: JobView, c: JobClaims) -> JobView:
    """``job`` as the policy may trust it."""
    if c.distrusted:
        job = replace(job, remaining_samples=None)
    if c.slow:
        def corrected(p: ProfilePoint) -> ProfilePoint:
            below = [w for w in c.slow if w <= p.world_size]
            if not below:
                return p
            ratio = c.slow[max(below)]
            return p._replace(step_time=p.step_time / ratio, throughput=p.throughput * ratio)
        job = replace(job, profile=tuple(corrected(p) for p in job.profile),
                      throughput=job.throughput * min(c.slow.values()))
    return job


def check_claims(snapshot: ClusterSnapshot, book: ClaimBook
                 ) -> tuple[ClusterSnapshot, ClaimBook, tuple[str, ...]]:
    """Compare each job's claims with what it was seen to do (module docstring).

    Args:
        snapshot: this round's snapshot (``time`` in seconds).
        book: what earlier rounds saw (an empty mapping at first).

    Returns:
        ``(judged snapshot, new book, notes)``: the snapshot with each job as the policy may
        trust it, the book for the next round (jobs no longer in the snapshot dropped), and one
        note per broken promise or false throughput found this round.
    """
    notes: list[str] = []
    new: dict[str, JobClaims] = {}
    jobs = []
    for job in snapshot.jobs:
        c = book.get(job.job_id, JobClaims())
        if job.state == SlurmState.RUNNING:
            c = _observe_rate(_observe_work(c, job, notes), job, snapshot.time, notes)
        new[job.job_id] = c
        jobs.append(_judged(job, c))
    return replace(snapshot, jobs=tuple(jobs)), new, tuple(notes)


__all__ = ["DISTRUST_AFTER", "RATE_SLACK", "RATE_WINDOW_S", "WORK_SLACK", "ClaimBook",
           "JobClaims", "check_claims"]
