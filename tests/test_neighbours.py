"""A good neighbour (hpcsched.policies.neighbours): other users' pending jobs keep the free GPUs
they need, extension GPUs they need are released first, and the daemon's snapshot lists them
(hpcsched.daemon.views.foreign_pending)."""

from __future__ import annotations

import time
from dataclasses import replace
from types import MappingProxyType

import pytest

from hpcsched import slurm
from hpcsched.daemon.views import foreign_pending, plans_unread
from hpcsched.model.snapshot import ClusterSnapshot, ForeignJob, JobView, NodeView, ProfilePoint
from hpcsched.policies import make_policy
from hpcsched.policies.neighbours import yield_to_foreign
from hpcsched.policies.realise import Mechanism
from hpcsched.policies.reconcile import Costs
from hpcsched.policies.round import decide_round
from hpcsched.protocol.extensions import extension_comment
from hpcsched.protocol.kinds import ChangeKind
from hpcsched.protocol.limits import JobLimits
from hpcsched.slurm.observe import Observation

DAEMON = Costs(grow="extension", by_mechanism=True, hold=0, min_gain=0.0)


def _job(job_id="J", names=("n1",), layout=(4,), primary=()) -> JobView:
    """A running job that gains from every GPU (step time flat in the world size)."""
    prof = tuple(ProfilePoint(w, 1, 32, 1, 0.1, w * 320.0, 50) for w in (1, 2, 4))
    return JobView(job_id=job_id, state="RUNNING", nodes=len(names), node_names=tuple(names),
                   limits=JobLimits(4, 1, 4, 32, 4096, 64, 128, "linear", 1), batch_size=128,
                   submit_time=0.0, profile=prof, layout=tuple(layout), primary=tuple(primary),
                   remaining_samples=1e7)


def _snap(jobs, used, foreign=(), other=()) -> ClusterSnapshot:
    return ClusterSnapshot(0.0, tuple(NodeView(n, 4, u, "mixed") for n, u in used), tuple(jobs),
                           other_gpus_allocated=tuple(other), granularity="gpu",
                           foreign_pending=tuple(foreign))


def test_free_gpus_a_foreign_job_needs_are_kept_for_it():
    snap = _snap([_job()], (("n1", 4), ("n2", 0), ("n3", 2)), [ForeignJob("90", "bob", 1, 4, 100)],
                 other=(("n3", 2),))
    planned, releases, notes = yield_to_foreign(snap)
    assert releases == [] and notes == ["other users' pending jobs: 4 free GPU(s) kept for them; "
                                        "can start now: 90 (bob, priority 100) on n2"]
    assert {n.name: n.gpus_free for n in planned.nodes} == {"n1": 0, "n2": 0, "n3": 2}
    assert dict(planned.other_gpus_allocated) == {"n2": 4, "n3": 2}


def test_the_plan_does_not_grow_into_them():
    """J gains from every GPU: alone it grows onto n2; beside bob's pending 4-GPU job it grows
    only onto n3's 2 free GPUs, which bob's job cannot use."""
    used = (("n1", 4), ("n2", 0), ("n3", 2))
    alone = decide_round(_snap([_job()], used, other=(("n3", 2),)), make_policy("jct"), DAEMON, 0)
    assert any(c.kind == ChangeKind.GROW and ("n2", 4) in c.layout for c in alone.changes), alone
    beside = decide_round(_snap([_job()], used, [ForeignJob("90", "bob", 1, 4, 100)],
                                other=(("n3", 2),)), make_policy("jct"), DAEMON, 0)
    assert all(dict(c.layout).get("n2", 0) == 0 for c in beside.changes), beside.changes


def test_extension_gpus_a_foreign_job_needs_are_released_first():
    """J runs on n1:4 (primary) + n2:2 (extension); bob's job on n2's other 2 GPUs ended and
    alice's 1 x 4 job pends: n2's 2 free GPUs and J's 2 extension GPUs start it."""
    j = _job(names=("n1", "n2"), layout=(4, 2), primary=(4,))
    snap = _snap([j], (("n1", 4), ("n2", 2)), [ForeignJob("91", "alice", 1, 4, 50)])
    decision = decide_round(snap, make_policy("jct"), DAEMON, 0)
    first = decision.changes[0]
    assert (first.job_id, first.kind, first.mechanism, first.layout) == (
        "J", ChangeKind.SHRINK, Mechanism.RELEASE, (("n1", 4),))
    assert "yields GPU(s) to other users' pending jobs: 2 on n2" in first.reason
    assert [c for c in decision.changes if c.job_id == "J"] == [first]   # nothing else of J's


def test_higher_priority_first_and_primaries_are_never_taken():
    """Two foreign jobs want n2; the higher priority gets it. A job that needs a primary's GPUs
    (1 x 4 on n1, J's primary) is not served by taking them."""
    j = _job(names=("n1", "n2"), layout=(4, 2), primary=(4,))
    low, high = ForeignJob("92", "carol", 1, 4, 10), ForeignJob("93", "dave", 1, 4, 99)
    snap = _snap([j], (("n1", 4), ("n2", 2)), [low, high])
    planned, releases, notes = yield_to_foreign(snap)
    assert [r.job_id for r in releases] == ["J"]
    assert notes == ["other users' pending jobs: 2 free GPU(s) kept for them, 2 extension GPU(s) "
                     "released; can start now: 93 (dave, priority 99) on n2; 1 wait for running "
                     "jobs to end"]
    assert planned.job("J").busy


def _pending(job_id="P", gpus=3, priority=200, held=False) -> JobView:
    """hpcsched's own pending 1-node job, ``gpus`` GPUs, at Slurm priority ``priority``."""
    return replace(_job(job_id, names=(), layout=(gpus,)), state="PENDING", nodes=1,
                   slurm_priority=priority, held=held, submit_time=5.0)


def _lender() -> JobView:
    """J: primary n1:4, extension GPUs n2:4 and n3:4 beyond its submitted 4 (all lent)."""
    return replace(_job(names=("n1", "n2", "n3"), layout=(4, 4, 4), primary=(4,)),
                   submitted_gpus=4)


def test_own_pending_jobs_ahead_in_slurms_queue_take_released_gpus_first():
    """Seen in a replay: the daemon released n2 for bob's 4-GPU job, Slurm started hpcsched's
    own pending 3-GPU job P (ahead of it in its queue) there, and bob's job waited for the next
    round. Released GPUs go to P first in the model too, so n2 and n3 go back at once."""
    snap = _snap([_lender(), _pending()], (("n1", 4), ("n2", 4), ("n3", 4)),
                 [ForeignJob("94", "bob", 1, 4, 100)])
    planned, releases, notes = yield_to_foreign(snap)
    assert [(r.job_id, r.layout) for r in releases] == [("J", (("n1", 4),))]
    assert notes == ["other users' pending jobs: 0 free GPU(s) kept for them, 8 extension GPU(s) "
                     "released; can start now: 94 (bob, priority 100) on n3 (after hpcsched's "
                     "P, ahead of them in Slurm's queue)"]


@pytest.mark.parametrize("own", [_pending(priority=50), _pending(held=True), _pending(priority=0)],
                         ids=["behind", "held", "unknown-priority"])
def test_own_pending_jobs_slurm_does_not_start_first_take_nothing(own):
    """Behind the foreign job in Slurm's queue, held, or of unknown priority (the simulator's
    views): one node's extension GPUs are enough, as before."""
    snap = _snap([_lender(), own], (("n1", 4), ("n2", 4), ("n3", 4)),
                 [ForeignJob("94", "bob", 1, 4, 100)])
    _, releases, notes = yield_to_foreign(snap)
    assert [(r.job_id, r.layout) for r in releases] == [("J", (("n1", 4), ("n3", 4)))]
    assert notes[0].endswith("can start now: 94 (bob, priority 100) on n2")


def test_nothing_is_released_when_own_jobs_ahead_would_take_all_of_it():
    """Only n3's extension GPUs can go back and P, ahead, would start on them: bob's job could
    not start this round, so nothing is released (the lender is not shrunk for nothing)."""
    j = replace(_job(names=("n1", "n3"), layout=(4, 4), primary=(4,)), submitted_gpus=4)
    snap = _snap([j, _pending()], (("n1", 4), ("n2", 4), ("n3", 4)),
                 [ForeignJob("94", "bob", 1, 4, 100)], other=(("n2", 4),))
    planned, releases, notes = yield_to_foreign(snap)
    assert releases == [] and not planned.job("J").busy
    assert notes == ["other users' pending jobs: 0 free GPU(s) kept for them; 1 wait for running "
                     "jobs to end"]


def test_kept_free_gpus_are_left_out_of_grows():
    """keep_free = 4: J alone grows onto n2's 4 free GPUs; keeping 4 free it grows onto
    n3's 2 only, and the note says why n2 stays free."""
    used = (("n1", 4), ("n2", 0), ("n3", 2))
    snap = _snap([_job()], used, other=(("n3", 2),))
    planned, releases, notes = yield_to_foreign(snap, keep_free=4)
    assert releases == [] and {n.name: n.gpus_free for n in planned.nodes} == {
        "n1": 0, "n2": 0, "n3": 2}
    assert notes == ["other users' pending jobs: 4 free GPU(s) kept for them (4 for jobs not "
                     "yet submitted: keep_free_gpus)"]
    kept = decide_round(snap, make_policy("jct"), replace(DAEMON, keep_free=4), 0)
    grows = [c for c in kept.changes if c.kind == ChangeKind.GROW]
    assert grows and all(dict(c.layout).get("n2", 0) == 0 for c in grows), kept.changes
    alone = decide_round(snap, make_policy("jct"), DAEMON, 0)
    assert any(dict(c.layout).get("n2", 0) == 4 for c in alone.changes), alone.changes


def test_kept_free_gpus_are_taken_back_from_lenders_and_after_pending_jobs():
    """A foreign job took the GPUs kept free; J lends n2 and n3: one node's extension GPUs go
    back so that 4 are free again, with their own reason, after bob's pending 1 x 4 job got the
    other node. Within the submitted size nothing goes back, and with too few lent GPUs the
    free ones left (2 on n2) are kept."""
    snap = _snap([_lender()], (("n1", 4), ("n2", 4), ("n3", 4)))
    _, (release,), notes = yield_to_foreign(snap, keep_free=4)
    assert release.layout in ((("n1", 4), ("n2", 4)), (("n1", 4), ("n3", 4)))
    assert release.reason.startswith("keeps GPU(s) free for other users' next jobs")
    assert notes == ["other users' pending jobs: 0 free GPU(s) kept for them, 4 extension GPU(s) "
                     "released (4 to keep GPUs free: keep_free_gpus)"]
    bob = ForeignJob("94", "bob", 1, 4, 100)
    _, (both,), notes = yield_to_foreign(replace(snap, foreign_pending=(bob,)), keep_free=4)
    assert both.layout == (("n1", 4),) and both.reason.startswith("yields GPU(s) to other users'")
    own = replace(_lender(), submitted_gpus=12)
    assert yield_to_foreign(replace(snap, jobs=(own,)), keep_free=4)[1] == []
    short = _snap([replace(_job(names=("n1", "n3"), layout=(4, 4), primary=(4,)), submitted_gpus=4)],
                  (("n1", 4), ("n2", 2), ("n3", 4)), other=(("n2", 2),))
    planned, releases, _ = yield_to_foreign(short, keep_free=8)
    assert releases == [] and planned.free_gpus == {"n1": 0, "n2": 0, "n3": 0}


def test_no_foreign_job_changes_nothing():
    snap = _snap([_job()], (("n1", 4), ("n2", 0)))
    assert yield_to_foreign(snap) == (snap, [], [])


def _info(job_id, state="PENDING", reason="Resources", gpus=4, comment="", partition="gpu"):
    return slurm.JobInfo(job_id=job_id, name="", user="bob", state=state, state_reason=reason,
                         partition=partition, nodes="", node_count=2, gpus_per_node=gpus,
                         restarts=0, batch_host="", priority=7, comment=comment, submit_time=5.0)


def test_the_daemon_lists_other_users_pending_gpu_jobs_slurm_could_start():
    jobs = [_info("1"), _info("2", reason="JobHeldUser"), _info("3", reason="Dependency"),
            _info("4", gpus=0), _info("5", comment=extension_comment("10", "u-10", 1)),
            _info("6", state="RUNNING"), _info("7", partition="cpu"), _info("10"),
            _info("8", reason="Priority")]
    obs = Observation(time.time(), (), MappingProxyType({i.job_id: i for i in jobs}), 2)
    got = foreign_pending(obs, mine={"10"}, partitions=("gpu",))
    assert [(f.job_id, f.nodes, f.gpus_per_node, f.priority, f.partition) for f in got] == [
        ("1", 2, 4, 7, "gpu"), ("8", 2, 4, 7, "gpu")]
    assert got[0].gpus == 8


def test_a_foreign_job_claims_only_nodes_of_its_partition():
    """bob's job is in partition ``long``, which has n3 only: n2's free GPUs stay usable."""
    nodes = (NodeView("n1", 4, 4, "mixed", ("gpu",)), NodeView("n2", 4, 0, "idle", ("gpu",)),
             NodeView("n3", 4, 0, "idle", ("gpu", "long")))
    snap = ClusterSnapshot(0.0, nodes, (_job(),), granularity="gpu",
                           foreign_pending=(ForeignJob("90", "bob", 1, 4, 100, partition="long"),))
    planned, _, notes = yield_to_foreign(snap)
    assert {n.name: n.gpus_free for n in planned.nodes} == {"n1": 0, "n2": 4, "n3": 0}, notes


def test_a_nodes_extension_gpus_go_back_whole_even_for_one():
    """J holds n1:4 (primary) + n2:4 (extension); bob's 1-GPU job needs one of n2's: all 4 go
    back (Slurm cannot cut the extension job's GRES; a 3-GPU replacement would never start on
    the full node), and the 3 bob does not need are free for the next round."""
    j = _job(names=("n1", "n2"), layout=(4, 4), primary=(4,))
    snap = _snap([j], (("n1", 4), ("n2", 4)), [ForeignJob("92", "bob", 1, 1, 50)])
    _, (release,), _ = yield_to_foreign(snap)
    assert (release.mechanism, release.layout, release.to_gpus) == (
        Mechanism.RELEASE, (("n1", 4),), 4)
    assert "4 on n2" in release.reason


def test_a_job_keeps_the_gpus_it_was_submitted_with():
    """J was submitted with 8 GPUs and the daemon started it on 4 (its primary, n1) and grew
    it by extension onto n2 (4): all 8 are its own, as Slurm alone would have held them, so
    bob's 1 x 4 job waits. Grown on onto n3 too, J gives back n3's block, its growth beyond
    what it was submitted with, and keeps n2's."""
    own = replace(_job(names=("n1", "n2"), layout=(4, 4), primary=(4,)), submitted_gpus=8)
    bob = ForeignJob("94", "bob", 1, 4, 50)
    planned, releases, notes = yield_to_foreign(_snap([own], (("n1", 4), ("n2", 4)), [bob]))
    assert releases == [] and not planned.job("J").busy
    assert notes == ["other users' pending jobs: 0 free GPU(s) kept for them; 1 wait for running "
                     "jobs to end"]
    grown = replace(own, nodes=3, node_names=("n1", "n2", "n3"), layout=(4, 4, 4))
    _, (release,), _ = yield_to_foreign(_snap([grown], (("n1", 4), ("n2", 4), ("n3", 4)), [bob]))
    assert (release.mechanism, release.layout) == (Mechanism.RELEASE, (("n1", 4), ("n2", 4)))


def test_a_foreign_job_that_cannot_start_yet_claims_no_free_gpus():
    """bob's 1 x 4 job fits nowhere (n2 has 2 free beside another user's 2): the 2 free GPUs
    stay free for grows, by extension, which go back once bob's job fits."""
    snap = _snap([_job()], (("n1", 4), ("n2", 2)), [ForeignJob("95", "bob", 1, 4, 50)],
                 other=(("n2", 2),))
    planned, releases, notes = yield_to_foreign(snap)
    assert releases == [] and {n.name: n.gpus_free for n in planned.nodes} == {"n1": 0, "n2": 2}
    assert notes[0].endswith("1 wait for running jobs to end")


def test_a_waiting_job_keeps_the_free_gpus_on_the_nodes_slurm_plans_it_onto():
    """bob's 2 x 4 job waits for another user's job on n2 (Slurm planned it onto n2 and n3 at
    t=600): n3's 4 free GPUs are kept for it, where Slurm would not start an extension job
    that outlives t=600 (module docstring); n4's 2, beside another user's 2, stay free for
    grows. Without a plan the same job claims nothing (the test above)."""
    used = (("n1", 4), ("n2", 4), ("n3", 0), ("n4", 2))
    other = (("n2", 4), ("n4", 2))
    bob = ForeignJob("96", "bob", 2, 4, 50, start_time=600.0, scheduled_nodes=("n2", "n3"))
    planned, releases, notes = yield_to_foreign(_snap([_job()], used, [bob], other=other))
    assert releases == []
    assert {n.name: n.gpus_free for n in planned.nodes} == {"n1": 0, "n2": 0, "n3": 0, "n4": 2}
    assert notes == ["other users' pending jobs: 4 free GPU(s) kept for them (4 on nodes Slurm "
                     "plans them onto); 1 wait for running jobs to end"]
    beside = decide_round(_snap([_job()], used, [bob], other=other), make_policy("jct"), DAEMON, 0)
    assert all(dict(c.layout).get("n3", 0) == 0 for c in beside.changes), beside.changes
    assert any(dict(c.layout).get("n4", 0) for c in beside.changes), beside.changes
    unplanned = bob._replace(start_time=None)   # nodes without a start: not a plan
    planned, _, _ = yield_to_foreign(_snap([_job()], used, [unplanned], other=other))
    assert {n.name: n.gpus_free for n in planned.nodes}["n3"] == 4


def test_the_daemon_reads_the_planned_nodes_of_other_users_pending_jobs():
    planned = replace(_info("1"), start_time=600.0, scheduled_nodes="n[2-3]")
    bad = replace(_info("2"), start_time=600.0, scheduled_nodes="n[2-")   # malformed: no plan
    obs = Observation(time.time(), (), MappingProxyType({"1": planned, "2": bad}), 2)
    got = {f.job_id: f.scheduled_nodes for f in foreign_pending(obs, mine=())}
    assert got == {"1": ("n2", "n3"), "2": ()}
    assert not plans_unread(obs)


def test_slurm_is_asked_for_planned_nodes_only_for_a_planned_job_it_could_start():
    """22.05's JSON: a planned start, nodes unknown (None). A pending job Slurm could start,
    another user's or hpcsched's own, makes the daemon ask: not an extension job, a held job,
    a job without a planned start, or one in a partition it does not manage."""
    unread = replace(_info("1"), start_time=600.0)
    assert unread.scheduled_nodes is None
    def obs(*jobs):
        return Observation(time.time(), (), MappingProxyType({i.job_id: i for i in jobs}), 2)
    assert plans_unread(obs(unread)) and plans_unread(obs(unread), partitions=("gpu",))
    assert not plans_unread(obs(unread), partitions=("cpu",))
    assert not plans_unread(obs(replace(unread, comment=extension_comment("10", "u-10", 1))))
    assert not plans_unread(obs(replace(unread, state_reason="JobHeldUser")))
    assert not plans_unread(obs(replace(unread, start_time=None)))
    assert not plans_unread(obs(replace(unread, scheduled_nodes="")))  # 23.02+: read


def _planned_own(job_id="P", gpus=4, nodes=("n2",), priority=200) -> JobView:
    """hpcsched's own pending 1-node job that Slurm's backfill plans onto ``nodes``."""
    return replace(_pending(job_id, gpus, priority), scheduled_nodes=tuple(nodes))


def test_own_pending_jobs_keep_the_free_gpus_slurm_plans_them_onto():
    """Seen at 1,024 GPUs: jct grew J into the GPUs Slurm kept for hpcsched's own waiting job
    P, and J's extension job pended for Priority until the daemon gave the grow up. P (4 GPUs,
    planned onto n2, which has 3 free beside another job's 1) keeps n2's 3 free GPUs; n3's stay
    free for J's grow, and J grows only there."""
    used = (("n1", 4), ("n2", 1), ("n3", 0))
    other = (("n2", 1),)
    snap = _snap([_job(), _planned_own()], used, other=other)
    planned, releases, notes = yield_to_foreign(snap)
    assert releases == [] and {n.name: n.gpus_free for n in planned.nodes} == {
        "n1": 0, "n2": 0, "n3": 4}
    assert notes == ["hpcsched's pending jobs: 3 free GPU(s) kept on the nodes Slurm plans them "
                     "onto, where no grow's extension job would start: P (3)"]
    d = decide_round(snap, make_policy("jct"), DAEMON, 0)
    grows = [c for c in d.changes if c.kind != ChangeKind.PENDING and c.to_gpus > c.from_gpus]
    assert grows and all(dict(c.layout).get("n2", 0) == 0 for c in grows), d.changes
    alone = decide_round(replace(snap, jobs=(_job(),)), make_policy("jct"), DAEMON, 0)
    assert any(dict(c.layout).get("n2", 0) for c in alone.changes), alone.changes


def test_own_pending_jobs_without_a_plan_or_started_first_keep_nothing():
    """No planned nodes: nothing kept (the simulator's Slurm plans none). A held job is left
    alone (whoever held it decides). An own job Slurm starts ahead of another user's, on free
    GPUs, takes them as a start, not as a plan."""
    used = (("n1", 4), ("n2", 0), ("n3", 0))
    for own in (_pending(), replace(_planned_own(), held=True)):
        planned, _, notes = yield_to_foreign(_snap([_job(), own], used))
        assert notes == [] and planned.free_gpus == {"n1": 0, "n2": 4, "n3": 4}
    started = _planned_own(gpus=4, nodes=("n2",), priority=200)
    snap = _snap([_job(), started], used, [ForeignJob("97", "bob", 1, 4, 100)])
    planned, _, notes = yield_to_foreign(snap)
    assert len(notes) == 1 and "after hpcsched's P" in notes[0], notes
