"""The replay's submit-and-poll loop against a scripted Slurm in virtual time (the loop's
logic only; tests/test_replay_slurm.py runs it on the dev cluster)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from hpcsched.replay import ReplayError
from hpcsched.replay.plan import ClusterShape, make_plan
from hpcsched.replay.slurmread import JobRecord, JobTimes
from hpcsched.replay.submit import Refused
from hpcsched.replay.watch import Replay, Tracked, counts
from hpcsched.sim import WorkloadJob
from hpcsched.slurm.errors import SlurmUnavailable

T0 = 1_000_000.0


@dataclass
class Life:
    """A scripted job: starts ``wait`` s after submission, runs ``run`` s, ends ``state``;
    ``requeue_at`` s after submission Slurm rewrites its submit time and start."""

    wait: float = 1.0
    run: float = 30.0
    state: str = "COMPLETED"
    requeue_at: float | None = None
    forget_at: float | None = None   # s after submission squeue stops listing it


@dataclass
class FakeSlurm:
    lives: dict[str, Life]
    now: float = T0
    submitted: dict[str, tuple[str, float]] = field(default_factory=dict)   # id -> (name, t)
    polls: int = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, dt: float) -> None:
        assert dt >= 0
        self.now += max(dt, 0.01)

    def submit(self, hpcsub, argv, cwd=None) -> str:
        name = next(a.split("=", 1)[1] for a in argv if a.startswith("--job-name="))
        if self.lives[name].state == "REFUSED":
            raise Refused("sbatch: error: Batch job submission failed: Invalid partition")
        job_id = str(100 + len(self.submitted))
        self.submitted[job_id] = (name, self.now)
        return job_id

    def poll(self) -> dict[str, JobTimes]:
        self.polls += 1
        out = {}
        for job_id, (name, t) in self.submitted.items():
            life, age = self.lives[name], self.now - t
            if life.forget_at is not None and age >= life.forget_at:
                continue
            requeued = life.requeue_at is not None and age >= life.requeue_at
            submit = t + life.requeue_at if requeued else t
            start = submit + life.wait
            end = start + life.run
            state = ("PENDING" if self.now < start else "RUNNING" if self.now < end
                     else life.state)
            out[job_id] = JobTimes(job_id, state, submit, start if self.now >= start else None,
                                   end if self.now >= end else None, int(requeued))
        return out


def _plan(*times):
    jobs = [WorkloadJob(f"j{i}", t, "cifar10", 1, 128, "A") for i, t in enumerate(times)]
    return make_plan(jobs, ClusterShape(4, 4), 1.0, script="e.py")


def _replay(slurm: FakeSlurm, plan, sacct=lambda ids: {}, **kw) -> Replay:
    return Replay(plan, "hpcsub", submit_fn=slurm.submit, poll_fn=slurm.poll, sacct_fn=sacct,
                  clock=slurm.clock, sleep=slurm.sleep, **kw)


def test_jobs_are_submitted_at_their_times_and_followed_to_the_end():
    slurm = FakeSlurm({"replay-j0": Life(run=30), "replay-j1": Life(run=5, requeue_at=3),
                       "replay-j2": Life(state="FAILED")})
    updates = []
    r = _replay(slurm, _plan(0, 10, 25), on_update=lambda tr: updates.append(counts(tr)))
    tracked = r.run()
    assert r.start == T0
    assert [t.submitted_at - T0 for t in tracked] == pytest.approx([0, 10, 25], abs=0.02)
    assert [t.state for t in tracked] == ["COMPLETED", "COMPLETED", "FAILED"]
    j1 = tracked[1]
    # the requeue rewrote Slurm's submit time 3 s after the original submission
    assert j1.record.submit == pytest.approx(T0 + 10, abs=0.02)
    assert j1.submit_time == j1.record.submit and j1.record.requeues == 1
    assert j1.record.start == pytest.approx(T0 + 14, abs=0.02)
    assert updates[0]["waiting"] == 2 and updates[-1] == {
        "waiting": 0, "pending": 0, "running": 0, "finished": 2, "failed": 1}
    assert slurm.polls <= (slurm.now - T0) / 5 + 4   # every 5 s, plus one per submission


def test_a_refused_job_is_reported_and_the_replay_goes_on():
    slurm = FakeSlurm({"replay-j0": Life(), "replay-j1": Life(state="REFUSED"),
                       "replay-j2": Life()})
    refused = []
    tracked = _replay(slurm, _plan(0, 1, 2), on_refused=refused.append).run()
    assert [t.state for t in tracked] == ["COMPLETED", "REFUSED", "COMPLETED"]
    assert refused == [tracked[1]] and "Invalid partition" in tracked[1].refused
    assert tracked[1].job_id is None and counts(tracked)["failed"] == 1


def test_a_job_forgotten_before_its_end_is_read_from_sacct_or_reported_vanished():
    slurm = FakeSlurm({"replay-j0": Life(run=60, forget_at=20), "replay-j1": Life(run=60,
                                                                                   forget_at=20)})
    asked = []

    def sacct(ids):
        asked.extend(ids)
        return {"100": JobRecord("100", "COMPLETED", T0 - 50, T0 + 1, T0 + 61, 2)}

    tracked = _replay(slurm, _plan(0, 0), sacct=sacct).run()
    assert sorted(asked) == ["100", "101"]
    assert tracked[0].state == "COMPLETED" and tracked[0].record.end == T0 + 61
    assert tracked[0].record.submit == T0 and tracked[0].record.requeues == 2   # first seen kept
    assert tracked[1].state == "VANISHED" and tracked[1].done


def test_slurm_down_for_too_long_stops_the_replay():
    slurm = FakeSlurm({"replay-j0": Life()})

    def down():
        raise SlurmUnavailable("squeue did not answer within 20 s")

    r = Replay(_plan(0), "hpcsub", submit_fn=slurm.submit, poll_fn=down, clock=slurm.clock,
               sleep=slurm.sleep, max_outage=60)
    with pytest.raises(ReplayError, match="Slurm did not answer for 6[0-9] s"):
        r.run()
    assert r.tracked[0].job_id == "100"


@pytest.mark.parametrize("submitted_at, seen, expect", [
    (100.0, 99.0, 99.0),      # Slurm's own clock
    (100.0, 100.9, 100.9),
    (100.0, 130.0, 100.0),    # requeued before the first poll: Slurm had rewritten it
    (100.0, None, 100.0),
    (None, None, None),
])
def test_original_submit_time(submitted_at, seen, expect):
    t = Tracked(_plan(0)[0], job_id="1", submitted_at=submitted_at,
                record=JobRecord("1", "RUNNING", seen))
    assert t.submit_time == expect
