"""Claims checked against what a job is seen to do (hpcsched/views/claims.py): an honest job is
never touched; one that understates its work loses its report after two broken promises; one
that overstates its throughput at large sizes is taken at its observed rate there and above."""

from __future__ import annotations

from dataclasses import replace

from hpcsched.model.snapshot import ClusterSnapshot, JobView, ProfilePoint
from hpcsched.protocol.limits import JobLimits
from hpcsched.views.claims import DISTRUST_AFTER, RATE_WINDOW_S, check_claims

BATCH = 64
TOTAL = 100_000.0


def _point(world: int, rate: float) -> ProfilePoint:
    return ProfilePoint(world, 1, BATCH // world, 1, BATCH / rate, rate, 50)


def _job(done: float, steps: int, *, gpus: int = 4, remaining: float | None = None,
         profile=(), busy=False, job_id="1") -> JobView:
    return JobView(job_id=job_id, state="RUNNING", nodes=1, node_names=("n1",),
                   limits=JobLimits(gpus, 1, 4, BATCH, BATCH, None, BATCH), batch_size=BATCH,
                   submit_time=0.0, samples_processed=int(done), steps=steps,
                   remaining_samples=TOTAL - done if remaining is None else remaining,
                   profile=tuple(profile), busy=busy, layout=(gpus,))


def _run(rounds, book=None):
    """``rounds``: ``(time, job)`` pairs; returns the last judged job, the book and all notes."""
    book, notes, judged = book or {}, [], None
    for t, job in rounds:
        snap, book, found = check_claims(ClusterSnapshot(time=t, nodes=(), jobs=(job,)), book)
        notes += found
        (judged,) = snap.jobs
    return judged, book, notes


def test_an_honest_job_is_never_touched():
    profile = (_point(4, 100.0), _point(8, 180.0))
    rounds = [(t, _job(100.0 * t, int(100.0 * t) // BATCH, profile=profile))
              for t in range(0, 900, 10)]
    judged, book, notes = _run(rounds)
    assert notes == [] and judged == rounds[-1][1]
    assert not book["1"].distrusted and book["1"].promised == TOTAL


def test_a_job_that_understates_its_work_loses_its_report():
    """It says 10% of its true remaining work at every report: its claimed total grows with
    what it has done, so it overruns each promise."""
    rounds = [(t, _job(100.0 * t, 0, remaining=0.1 * (TOTAL - 100.0 * t))) for t in range(0, 900, 10)]
    judged, book, notes = _run(rounds)
    assert book["1"].broken >= DISTRUST_AFTER and book["1"].distrusted
    assert judged.remaining_samples is None                 # as a job that reports nothing
    assert "no longer used" in notes[DISTRUST_AFTER - 1] and len(notes) >= DISTRUST_AFTER
    # caught early: by the second broken promise it had done about a fifth of its work
    caught = next(t for t, j in rounds if _run([r for r in rounds if r[0] <= t])[1]["1"].distrusted)
    assert 100.0 * caught < 0.25 * TOTAL, caught


def test_a_job_that_overstates_its_throughput_at_large_sizes_is_taken_as_observed():
    """True rate 100 samples/s at 4 GPUs and 150 at 8; it claims 3 x at 8 and more."""
    profile = (_point(4, 100.0), _point(8, 450.0), _point(16, 900.0))
    small = [(t, _job(100.0 * t, int(100.0 * t) // BATCH, profile=profile))
             for t in range(0, 200, 10)]
    judged, book, notes = _run(small)
    assert notes == [] and judged.profile == profile        # at 4 GPUs it tells the truth
    t0, s0 = small[-1][0], small[-1][1].steps
    big = [(t0 + t, _job(0, s0 + int(150.0 * t) // BATCH, gpus=8, profile=profile))
           for t in range(0, int(RATE_WINDOW_S) + 30, 10)]
    judged, book, notes = _run(big, book)
    assert len(notes) == 1 and "at 8 GPUs" in notes[0], notes
    by_world = {p.world_size: p.throughput for p in judged.profile}
    assert by_world[4] == 100.0
    assert 130 < by_world[8] < 170 and 260 < by_world[16] < 340   # 1/3 of the claims
    assert judged.remaining_samples is not None                  # its work claim stands


def test_busy_rounds_and_batch_changes_measure_nothing():
    profile = (_point(4, 100.0),)
    rounds = [(t, _job(0, 0 if t < 100 else int(100.0 * (t - 100)) // BATCH, profile=profile,
                       busy=t < 100)) for t in range(0, 300, 10)]
    judged, book, notes = _run(rounds)        # stalled while busy: not counted
    assert notes == [] and book["1"].observed[4, 1, BATCH][1] == 190.0
    other = replace(rounds[-1][1], batch_size=2 * BATCH, steps=rounds[-1][1].steps + 1)
    _, book2, _ = _run([(300, other)], book)
    assert book2["1"].observed == book["1"].observed   # a batch change starts a new window


def test_jobs_that_left_are_dropped_from_the_book():
    _, book, _ = _run([(0, _job(0, 0)), (10, _job(1000, 15))])
    snap, book, _ = check_claims(ClusterSnapshot(time=20, nodes=(), jobs=()), book)
    assert book == {}
