"""How a GPU-granular plan is made real on Slurm (hpcsched.policies.realise): the mechanism of
each change, the layout it reaches, its price in reconcile, the daemon's journal action for it,
and the daemon's view of a job on a primary plus extension jobs (4 + 2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcsched import slurm
from hpcsched.daemon.round import realised_action
from hpcsched.daemon.views import allocation_of
from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, NodeView, Plan, ProfilePoint
from hpcsched.policies import realise
from hpcsched.policies.realise import Mechanism, primary_shape
from hpcsched.policies.reconcile import Candidate, Costs, classify, reconcile
from hpcsched.protocol.kinds import ChangeKind
from hpcsched.protocol.limits import JobLimits

DAEMON = Costs(grow="extension", by_mechanism=True, hold=0, min_gain=0.0)


def _job(job_id="J", names=("n1",), layout=(4,), primary=(), *, state="RUNNING", fewest=1,
         max_nodes=4) -> JobView:
    prof = tuple(ProfilePoint(w, 1, 32, 1, 0.1 + 0.01 * w, w * 32 / (0.1 + 0.01 * w), 50)
                 for w in (1, 2, 4))
    return JobView(job_id=job_id, state=state, nodes=len(names), node_names=tuple(names),
                   limits=JobLimits(4, 1, max_nodes, 32, 1024, 64, 128, "linear", fewest),
                   batch_size=128, submit_time=0.0, profile=prof, layout=tuple(layout),
                   primary=tuple(primary), remaining_samples=1e9)


def _snap(jobs, used=(("n1", 0), ("n2", 0), ("n3", 0))) -> ClusterSnapshot:
    return ClusterSnapshot(0.0, tuple(NodeView(n, 4, u, "mixed") for n, u in used), tuple(jobs),
                           granularity="gpu")


@pytest.mark.parametrize(("fewest", "shape"), [(1, (1, 1)), (2, (1, 2)), (4, (1, 4)), (8, (2, 4)),
                                                (6, (2, 3)), (5, (2, 3)), (12, (3, 4))])
def test_primary_shape_is_the_fewest_nodes_then_gpus_per_node(fewest, shape):
    assert primary_shape(fewest, 4) == shape


SHRINKS = {
    "an extension released": ((4, 2), (4,), 4, Mechanism.RELEASE, (("n1", 4),)),
    # Slurm cannot cut an extension job's GRES: a node's extension GPUs go back whole
    "never part of a node's extensions": ((4, 2), (4,), 5, Mechanism.RELEASE, (("n1", 4),)),
    "the node whose extensions come closest above what goes": (
        (2, 4, 1), (1,), 5, Mechanism.RELEASE, (("n1", 1), ("n2", 4))),
    "the largest nodes' extensions until enough": (
        (3, 4), (1,), 2, Mechanism.RELEASE, (("n1", 1),)),
    "whole primary nodes, in place": ((4, 4), (), 4, Mechanism.SHRINK_PRIMARY, (("n1", 4),)),
    "into a primary node: requeue": ((4,), (), 2, Mechanism.REQUEUE, (("n1", 2),)),
    "past the extensions into the primary: requeue onto the same GPUs per node": (
        (4, 4, 2), (4, 4), 6, Mechanism.REQUEUE, (("n1", 3), ("n2", 3))),
}


@pytest.mark.parametrize(("layout", "primary", "to", "mechanism", "after"), SHRINKS.values(),
                         ids=SHRINKS.keys())
def test_a_shrink_takes_the_cheapest_mechanism(layout, primary, to, mechanism, after):
    names = ("n1", "n2", "n3")[:len(layout)]
    r = realise.shrink(_job(names=names, layout=layout, primary=primary), to, 4)
    assert (r.mechanism, r.layout) == (mechanism, after)
    assert r.gpus == sum(g for _, g in after) <= to


@pytest.mark.parametrize(("extra", "drop", "nodes"), [
    ({"n1": 3, "n2": 4}, 1, ("n1",)),          # the fewest GPUs over what goes
    ({"n1": 4, "n2": 4}, 4, ("n2",)),          # among equals the last (the job stays packed)
    ({"n1": 2, "n2": 4, "n3": 1}, 6, ("n2", "n1")),
    ({"n1": 2}, 3, ()),                        # not enough: none
    ({"n1": 2}, 0, ()),
])
def test_a_nodes_extensions_go_back_whole(extra, drop, nodes):
    assert realise.release_nodes(extra, drop) == nodes


def test_reconcile_releases_an_extension_and_prices_it_at_the_stall():
    job = _job(names=("n1", "n2"), layout=(4, 2), primary=(4,))
    snap = _snap([job], used=(("n1", 4), ("n2", 4)))
    (cand,), _ = classify(Plan("x", (JobTarget("J", 1, 128, "r", gpus=4),)), snap, DAEMON)
    c = cand.change
    assert (c.kind, c.mechanism, c.layout) == (ChangeKind.SHRINK, Mechanism.RELEASE, (("n1", 4),))
    assert DAEMON.resize_cost(cand) == DAEMON.extension_stall
    primary_only = replace(cand, change=replace(c, mechanism=Mechanism.SHRINK_PRIMARY))
    assert DAEMON.resize_cost(primary_only) == DAEMON.shrink_cost
    assert DAEMON.resize_cost(replace(cand, change=replace(c, mechanism=Mechanism.REQUEUE))) \
        == DAEMON.restart_cost


def test_reconcile_grows_by_extension_onto_a_half_used_node():
    """J holds n1; n2's other 2 GPUs are a foreign job's: the plan's 6 GPUs are 4 + 2."""
    job = _job()
    snap = replace(_snap([job], used=(("n1", 4), ("n2", 2))), other_gpus_allocated=(("n2", 2),))
    changes, notes = reconcile(Plan("x", (JobTarget("J", 2, 128, "r", gpus=6),)), snap, DAEMON)
    (c,) = changes
    assert (c.kind, c.mechanism, c.layout) == (ChangeKind.GROW, Mechanism.EXTEND,
                                               (("n1", 4), ("n2", 2))), notes
    assert realised_action(c, 4) == (ChangeKind.REFORM, 2, ("n1:4", "n2:2"))


def test_a_start_puts_the_primary_at_the_fewest_gpus():
    pending = replace(_job(state="PENDING", names=(), layout=(), fewest=2), nodes=1)
    snap = _snap([pending], used=(("n1", 3), ("n2", 1)))
    (cand,), _ = classify(Plan("x", (JobTarget("J", 2, 128, "r", gpus=6),)), snap, DAEMON)
    c = cand.change
    assert (c.kind, c.mechanism, c.to_gpus) == (ChangeKind.PENDING, Mechanism.START, 6)
    assert c.layout == (("n2", 2),)                 # 1 x 2 GPUs, on the fullest node they fit
    assert realised_action(c, 4) == (ChangeKind.PENDING, 1, ("n2:2",))
    whole = replace(c, layout=(("n2", 4),))
    assert realised_action(whole, 4) == (ChangeKind.PENDING, 1, ("n2",))


def test_the_node_granular_reconcile_carries_no_mechanism():
    job = _job(names=("n1", "n2"), layout=(4, 2), primary=(4,))
    snap = _snap([job], used=(("n1", 4), ("n2", 4)))
    (cand,), _ = classify(Plan("x", (JobTarget("J", 1, 128, "r", gpus=4),)), snap,
                          replace(DAEMON, by_mechanism=False))
    assert isinstance(cand, Candidate) and cand.change.mechanism is None


def test_the_daemon_sees_a_primary_plus_extensions_gpu_by_gpu():
    def info(job_id, nodes, gpus):
        return slurm.JobInfo(job_id=job_id, name="", user="u", state="RUNNING", state_reason="None",
                             partition="gpu", nodes=nodes, node_count=1, gpus_per_node=gpus,
                             restarts=0, batch_host=nodes, priority=1)
    per, primary = allocation_of(info("10", "n1", 4), [info("11", "n2", 2), info("12", "n1", 0)], 4)
    assert per == {"n1": 4, "n2": 2} and primary == {"n1": 4}


@pytest.mark.parametrize(("reason", "shown"), [
    ("jct: 4 GPU(s); goodput 3014 -> 2022 samples/s predicted [by release]", "release"),
    ("jct: 6 GPU(s) [by shrink-primary]", "shrink-primary"),
    ("dp: predicted 2 -> 3 samples/s", None), ("odd [bracket]", None)])
def test_status_reads_the_mechanism_of_a_change_journaled_before_its_column(reason, shown):
    from hpcsched.daemon.status import _suffix_mechanism
    assert _suffix_mechanism(reason) == shown
