"""Other users' plain jobs in the simulator (issue 37): a workload's rigid jobs run at their
submitted size from start to end, are never held or resized, reach the policy only as Slurm
shows them (a foreign pending job, or GPUs held), and hpcsched's grows yield to them as the
daemon's do (:mod:`hpcsched.policies.neighbours`). No Slurm.

The scenario: 2 nodes x 4 GPUs; an elastic cifar10 job of 2 GPUs at t = 0, which ``jct`` grows
by extension to all 8; another user's plain ncf job of 4 GPUs at t = 600.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcsched.sim import WorkloadJob
from hpcsched.sim.cli import simulate_command
from hpcsched.sim.engine import SimConfig, Simulator
from hpcsched.sim.report import summarize
from hpcsched.sim.workload import WorkloadError, make_rigid

ELASTIC = WorkloadJob(name="e", submit_time=0.0, application="cifar10", gpus=2, batch_size=256,
                      app_class="A")
PLAIN = WorkloadJob(name="p", submit_time=600.0, application="ncf", gpus=4, batch_size=256,
                    app_class="A", rigid=True)


def _run(policy: str):
    sim = Simulator([ELASTIC, PLAIN], policy,
                    config=SimConfig(nodes=2, gpus_per_node=4, granularity="gpu"))
    return sim, sim.run()


def test_make_rigid_marks_a_fraction_spread_over_the_trace():
    jobs = [WorkloadJob(f"j{i}", float(i), "cifar10", 1, 128, "A") for i in range(10)]
    assert [i for i, j in enumerate(make_rigid(jobs, 0.3)) if j.rigid] == [3, 6, 9]
    assert not any(j.rigid for j in make_rigid(jobs, 0.0))
    assert all(j.rigid for j in make_rigid(jobs, 1.0))
    assert make_rigid(jobs, 0.3) == make_rigid(jobs, 0.3), "no randomness"
    with pytest.raises(WorkloadError, match="rigid fraction"):
        make_rigid(jobs, 1.5)


def test_grows_yield_to_a_plain_job_at_once():
    _, res = _run("jct")
    e, p = res.jobs
    assert e.max_gpus == 8, "the elastic job grew into the idle GPUs"
    assert p.start_time == PLAIN.submit_time, "the plain job did not wait"
    assert (600.0, e.resize_log[-1][1], 8, 4) in e.resize_log, "extension GPUs went back"
    assert p.resize_log == () and p.max_gpus == p.requested_gpus == 4 and p.restarts == 0


def test_a_plain_job_runs_the_same_whoever_schedules():
    """Fixed size and duration: what the policy does around it does not change its run."""
    _, on = _run("jct")
    _, off = _run("static")
    assert on.jobs[1].finish_time - on.jobs[1].start_time == pytest.approx(
        off.jobs[1].finish_time - off.jobs[1].start_time, rel=1e-9)
    assert off.jobs[0].max_gpus == 2


def test_the_policy_sees_it_only_as_slurm_shows_it():
    sim = Simulator([ELASTIC, PLAIN], "static",
                    config=SimConfig(nodes=1, gpus_per_node=4, granularity="gpu"))
    e, p = sim.jobs
    e.state = p.state = "PENDING"
    sim._schedule()                                   # e on 2 GPUs; p (4) finds no room
    snap = sim.snapshot()
    assert [v.job_id for v in snap.jobs] == [e.job_id]
    assert [(f.job_id, f.user, f.gpus) for f in snap.foreign_pending] == [(p.job_id, "other", 4)]
    e.state = "DONE"
    sim._release(e)
    sim._schedule()
    snap = sim.snapshot()
    assert snap.jobs == () and snap.foreign_pending == ()
    assert dict(snap.other_gpus_allocated) == {"n1": 4}, "its GPUs are another user's"


def test_the_summary_splits_plain_and_elastic_jobs():
    _, res = _run("jct")
    s = summarize(res)
    assert s["plain_jobs"] == 1 and s["plain_avg_wait"] == 0.0
    assert s["elastic_avg_jct"] == pytest.approx(res.jobs[0].jct)
    assert s["avg_jct"] == pytest.approx((res.jobs[0].jct + res.jobs[1].jct) / 2)
    alone = Simulator([ELASTIC], "jct", config=SimConfig(nodes=2, gpus_per_node=4)).run()
    assert "plain_jobs" not in summarize(alone), "an all-elastic summary keeps its keys"


def test_simulate_rigid_fraction(tmp_path):
    out = tmp_path / "s.json"
    r = CliRunner().invoke(simulate_command, ["-w", "pollux:1@0.5", "-p", "static",
                                              "--rigid-fraction", "0.5", "--max-days", "0.05",
                                              "--json", str(out), "-q"])
    assert r.exit_code == 0, r.output
    (s,) = json.loads(out.read_text())["runs"]
    assert s["plain_jobs"] == 40 and s["workload"] == "pollux:1@0.5 (0.5 plain)"
    r = CliRunner().invoke(simulate_command, ["-w", "pollux:1", "-p", "static",
                                              "--rigid-fraction", "2"])
    assert r.exit_code == 2 and "rigid-fraction" in r.output


def test_a_traces_rigid_column(tmp_path):
    from hpcsched.sim.workload import load_csv

    p = tmp_path / "w.csv"
    p.write_text("name,time,application,num_replicas,batch_size,rigid\n"
                 "a,0,cifar10,1,128,0\nb,5,ncf,2,256,1\nc,9,ncf,1,256,true\n")
    assert [j.rigid for j in load_csv(p)] == [False, True, True]
    p.write_text("name,time,application,num_replicas,batch_size,rigid\na,0,cifar10,1,128,yes\n")
    with pytest.raises(WorkloadError, match=r"w.csv:2: rigid must be 0 or 1, got 'yes'"):
        load_csv(p)
