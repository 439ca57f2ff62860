"""The unit tests' one Slurm fake (tests/fakes.py) keeps Slurm 22.05's rules
(docs/slurm-22.05-notes.md §3): a requeue holds the job for 121 s, StartTime=now starts a pending
job that fits, a pending job cannot be requeued nor a running one given a StartTime."""

from __future__ import annotations

import pytest

from hpcsched import slurm
from hpcsched.slurm.control import set_start_time
from tests.fakes import REQUEUE_HOLD_S, FakeSlurm, hostlist


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def job(job_id="7", state="RUNNING", node_count=1, restarts=0) -> slurm.JobInfo:
    return slurm.JobInfo(job_id=job_id, name="", user="bob", state=state, state_reason="None",
                         partition="gpu", nodes=hostlist(node_count) if state == "RUNNING" else "",
                         node_count=node_count, gpus_per_node=2, restarts=restarts,
                         batch_host="n1", priority=1)


def test_a_requeue_holds_the_job_121_s_until_start_time_now():
    clock = Clock()
    sl = FakeSlurm(job(), clock=clock)
    sl.requeue("7")
    j = sl.info
    assert (j.state, j.restarts, j.state_reason, j.nodes) == ("PENDING", 1, "BeginTime", "")
    assert j.start_time == clock.t + REQUEUE_HOLD_S == clock.t + 121
    clock.t += 60
    sl.schedule()
    assert sl.info.state == "PENDING", "held until its begin time"
    sl.update("7", NumNodes="2-2")
    assert set_start_time(sl, "7", "now")
    j = sl.info
    assert (j.state, j.node_count, j.nodes, j.state_reason, j.start_time) == (
        "RUNNING", 2, "n[1-2]", "None", clock.t)
    assert sl.calls == [("requeue", "7"), ("update", "7", {"NumNodes": "2-2"}),
                        ("update", "7", {"StartTime": "now"})]


def test_the_hold_ends_at_slurms_next_scheduling_pass():
    clock = Clock()
    sl = FakeSlurm(job(), clock=clock)
    sl.requeue("7")
    clock.t += REQUEUE_HOLD_S
    sl.observe()
    assert sl.info.state == "PENDING", "a passing begin time waits for the scheduling pass"
    sl.schedule()
    assert sl.info.state == "RUNNING"


def test_a_later_start_time_moves_the_begin_time():
    clock = Clock()
    sl = FakeSlurm(job(), clock=clock)
    sl.requeue("7")
    sl.update("7", StartTime="now+1800")
    assert (sl.info.state, sl.info.start_time) == ("PENDING", clock.t + 1800)
    assert sl.count("update", StartTime="now+1800") == 1 and sl.count("update") == 1


def test_start_time_now_starts_only_a_job_that_fits():
    sl = FakeSlurm(job(state="PENDING", node_count=3), fits=lambda j: j.node_count <= 2)
    sl.update("7", StartTime="now")
    assert sl.info.state == "PENDING"
    sl.update("7", NumNodes="2")
    sl.update("7", StartTime="now")
    assert sl.info.state == "RUNNING"


def test_slurm_refuses_a_requeue_of_a_pending_job_and_a_start_time_of_a_running_one():
    sl = FakeSlurm(job(state="PENDING"), job("8"))
    with pytest.raises(slurm.SlurmError, match="pending execution"):
        sl.requeue("7")
    assert sl.jobs["7"].restarts == 0
    with pytest.raises(slurm.SlurmError, match="no longer pending"):
        sl.update("8", StartTime="now")
    assert set_start_time(sl, "8", "now") is False, "started meanwhile: not an error"


def test_refused_and_forbidden_calls():
    sl = FakeSlurm(job(), job("8"), refuse={("cancel", "7"): slurm.SlurmError("denied"),
                                            "requeue": slurm.SlurmUnavailable("timed out")},
                   forbid=("hold",))
    with pytest.raises(slurm.SlurmError):
        sl.cancel("7")
    sl.cancel("8")
    with pytest.raises(slurm.SlurmUnavailable):
        sl.requeue("8")
    with pytest.raises(AssertionError, match="forbids hold"):
        sl.hold("7")
    assert sl.cancelled == ["8"] and sl.count("cancel") == 2 and sl.count("requeue") == 1
    assert sl.jobs["8"].state == "RUNNING", "a refused requeue changes nothing"
    obs = sl.observe()
    assert set(obs.jobs) == {"7", "8"} and sl.job("9") is None
