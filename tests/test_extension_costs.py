"""What a grow by extension costs (issue 10), and how reconcile, the round and ``jct`` price it:
the formula, the gain test it flips, feasibility when the job keeps its GPUs, the daemon's
settings. No Slurm."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcsched.daemon import config as cfg
from hpcsched.model.snapshot import (
    EXTENSION_STALL,
    EXTENSION_STARTUP,
    ClusterSnapshot,
    JobTarget,
    NodeView,
    Plan,
    grow_cost,
)
from hpcsched.policies import jct
from hpcsched.policies.base import PolicyBase
from hpcsched.policies.feasible import _place_extension_gpus
from hpcsched.policies.reconcile import (
    Change,
    Costs,
    classify,
    extension_spans,
    feasible_now,
    gain_test,
    predict,
)
from hpcsched.policies.round import decide_round
from hpcsched.protocol.kinds import ChangeKind
from tests.test_reconcile import RUN, _cand, _cluster, _job

# ---------------------------------------------------------------------------------- the formula


@pytest.mark.parametrize(("grow", "x_from", "x_to", "seconds"), [
    ("requeue", 100.0, 200.0, 30.0),                 # the restart cost, whatever the rates
    ("extension", 100.0, 200.0, 8 * 0.5 + 1.5),      # half the start-up is lost, then the stall
    ("extension", 100.0, 150.0, 8 / 3 + 1.5),
    ("extension", 0.0, 200.0, 8 + 1.5),              # nothing done meanwhile: all of it
    ("extension", 200.0, 100.0, 1.5),                # no speed-up: the start-up costs nothing
    ("extension", 100.0, 0.0, 8 + 1.5),              # new rate unknown: all of it
])
def test_grow_cost(grow, x_from, x_to, seconds):
    assert grow_cost(grow, 30.0, 8.0, 1.5, x_from, x_to) == pytest.approx(seconds)
    costs = Costs(restart_cost=30.0, grow=grow, extension_startup=8.0, extension_stall=1.5)
    assert costs.grow_cost(x_from, x_to) == pytest.approx(seconds)
    snap = ClusterSnapshot(0.0, (), (), restart_cost=30.0, grow=grow, extension_startup=8.0,
                           extension_stall=1.5)
    assert snap.grow_cost(x_from, x_to) == pytest.approx(seconds)


def test_the_extension_cost_is_what_the_grow_adds_to_the_remaining_time():
    """R samples left: x_from for the start-up, nothing for the stall, then x_to."""
    r, x_from, x_to, startup, stall = 1e6, 300.0, 500.0, 8.0, 1.5
    finish = startup + stall + (r - x_from * startup) / x_to
    assert finish - r / x_to == pytest.approx(grow_cost("extension", 30.0, startup, stall, x_from, x_to))


def test_extension_defaults_are_defined_once():
    assert (Costs().extension_startup, Costs().extension_stall) == (EXTENSION_STARTUP, EXTENSION_STALL)
    d = cfg.DaemonSettings()
    assert (d.grow, d.extension_startup, d.extension_stall) == ("extension", EXTENSION_STARTUP,
                                                                EXTENSION_STALL)
    assert Costs().grow == "requeue"   # reconcile's own default; the daemon and simulator say


def test_costs_refuse_an_unknown_grow_mode():
    with pytest.raises(ValueError, match="grow must be one of"):
        Costs(grow="inplace")


# ---------------------------------------------------------------------------------- gain test

@pytest.mark.parametrize(("restart_cost", "grow", "made"), [
    (400.0, "requeue", False),      # 400 s x 1,000 samples/s lost > 300,000 won over 600 s
    (400.0, "extension", True),     # (8 x (1 - 1/1.5) + 1.5) s x 1,000 lost: made
    (30.0, "requeue", True),
    (30.0, "extension", True),
])
def test_a_grow_by_extension_passes_the_gain_test_a_requeue_fails(restart_cost, grow, made):
    snap = _cluster(jobs=[_job("G", 1, **RUN)])
    x = predict(snap.jobs[0], 1, 96)
    costs = Costs(restart_cost=restart_cost, horizon=600, grow=grow)
    got, notes = gain_test([_cand("G", ChangeKind.GROW, 2, x, x * 1.5)], [], snap, costs)
    assert [c.change.job_id for c in got] == (["G"] if made else [])
    assert notes[0].startswith("made:" if made else "not made:")


@pytest.mark.parametrize("grow", ["requeue", "extension"])
def test_shrinks_cost_the_shrink_cost_whatever_the_grow_mode(grow):
    """A shrink losing 40 % of a 1,000 samples/s job's rate is never made: the loss is the
    same by either grow mode (its shrink cost)."""
    snap = _cluster(jobs=[_job("S", 2, **RUN)])
    costs = Costs(shrink_cost=2.0, grow=grow)
    assert costs.resize_cost(_cand("S", ChangeKind.SHRINK, 1, 1000.0, 600.0)) == 2.0
    got, _ = gain_test([_cand("S", ChangeKind.SHRINK, 1, 1000.0, 600.0)], [], snap, costs)
    assert got == []


def test_reconcile_through_the_round_admits_the_grow_only_by_extension():
    """decide_round with a plan that doubles job G (1,000 -> 2,000 samples/s); restarts cost
    700 s: 700,000 samples lost by requeue against 600,000 won over the 600 s horizon; by
    extension (8 x 0.5 + 1.5) s x 1,000 lost."""

    class Grow(PolicyBase):
        name = "grow"

        def decide(self, snapshot, seed=0):
            self.seen = snapshot
            return Plan("grow", (JobTarget("G", 2, 96, "test"),))

    for grow, made in (("requeue", False), ("extension", True)):
        job = replace(_job("G", 1, names=("n1",), **RUN), resized_at=-1e4)
        snap = _cluster(n_nodes=2, gpus=2, used=0, jobs=[job])
        snap = replace(snap, nodes=(NodeView("n1", 2, 2, "allocated"), NodeView("n2", 2, 0, "idle")))
        policy = Grow()
        d = decide_round(snap, policy, Costs(restart_cost=700.0, horizon=600, grow=grow), seed=0)
        assert [c.kind for c in d.changes] == ([ChangeKind.GROW] if made else [])
        # the policy saw the costs reconcile judged by
        assert (policy.seen.grow, policy.seen.restart_cost) == (grow, 700.0)


# ------------------------------------------------------------------------------- feasibility

@pytest.mark.parametrize(("free", "placement", "made", "kept"), [
    ({"n1": 0, "n2": 4, "n3": 4}, ("n1", "n3"), True, True),     # its own node and a new one
    ({"n1": 0, "n2": 4, "n3": 4}, ("n2", "n3"), True, False),    # would move it: its own + n2
    ({"n1": 0, "n2": 0, "n3": 0}, (), False, False),             # nothing beside its own: waits
])
def test_a_node_granular_extension_keeps_the_jobs_nodes(free, placement, made, kept):
    job = _job("G", 1, wpn=4, names=("n1",), **RUN)
    snap = ClusterSnapshot(0.0, tuple(NodeView(n, 4, 4 - f, "mixed") for n, f in free.items()), (job,))
    changes, _ = feasible_now([_cand("G", ChangeKind.GROW, 2, 1.0, 2.0, placement=placement)],
                              snap, "extension")
    assert [c.job_id for c in changes] == (["G"] if made else [])
    if made:
        # the job submits its extension itself: it is told the nodes claimed (its own first)
        assert changes[0].placement == (placement if kept else ("n1", "n2"))


@pytest.mark.parametrize(("free", "own", "to_gpus", "placement", "fits", "taken"), [
    # 2 more on its own node first, then packed onto the fullest
    ({"n1": 2, "n2": 4}, {"n1": 2}, 6, (), True, {"n1": 0, "n2": 2}),
    ({"n1": 0, "n2": 1, "n3": 3}, {"n1": 4}, 7, (), True, {"n1": 0, "n2": 1, "n3": 0}),
    # its own GPUs are not free for its extension (a requeue would count them)
    ({"n1": 0, "n2": 2}, {"n1": 4}, 8, (), False, None),
    # a placement naming its node is kept; one leaving it out is dropped
    ({"n1": 0, "n2": 4, "n3": 4}, {"n1": 4}, 6, ("n1", "n3"), True, {"n1": 0, "n2": 4, "n3": 2}),
    ({"n1": 0, "n2": 4, "n3": 4}, {"n1": 4}, 6, ("n3",), True, {"n1": 0, "n2": 2, "n3": 4}),
])
def test_a_gpu_granular_extension_needs_the_difference_free(free, own, to_gpus, placement, fits, taken):
    job = replace(_job("G", len(own), names=tuple(own)), layout=tuple(own.values()))
    c = Change("G", ChangeKind.GROW, len(own), 2, 64, 64, "r", placement, sum(own.values()), to_gpus)
    pool = dict(free)
    got, note = _place_extension_gpus(c, job, pool)
    assert (got is not None) == fits
    if fits:
        assert pool == taken
        assert got.placement == (placement if set(own) <= set(placement) else ())
    else:
        assert "waits" in note


# ----------------------------------------------------------------------------------------- jct

def test_jct_prices_a_grow_with_the_snapshots_grow_cost():
    """A running job's grow: the restart cost by requeue, the extension cost by extension
    (goodput now -> at the new size); a start always the restart cost."""
    job = _job("G", 1, **RUN)
    p_req = jct._Params(30.0, 2.0, ClusterSnapshot(0.0, (), (), restart_cost=30.0).grow_cost,
                        3600.0, 3600.0, 24, 0.0, {})
    ext = ClusterSnapshot(0.0, (), (), restart_cost=30.0, grow="extension")
    p_ext = replace(p_req, grow_cost=ext.grow_cost)
    assert job.gpus == 2
    assert jct._change_cost(2, 4, p_req, 1000.0, 2000.0) == 30.0
    assert jct._change_cost(2, 4, p_ext, 1000.0, 2000.0) == pytest.approx(
        EXTENSION_STARTUP * 0.5 + EXTENSION_STALL)
    assert jct._change_cost(2, 1, p_ext, 1000.0, 500.0) == 2.0                 # a shrink
    assert jct._change_cost(2, 2, p_ext, 1000.0, 1000.0) == 0.0                # stays
    assert jct._change_cost(None, 4, p_ext, 0.0, 2000.0) == 30.0               # a start


@pytest.mark.parametrize(("grow", "gpus"), [("requeue", 2), ("extension", 4)])
def test_jct_grows_a_job_by_extension_where_a_requeue_does_not_pay(grow, gpus):
    """One running job with 600 s of work left on 2 of 4 GPUs, restarts at 400 s: by requeue
    growing to 4 GPUs saves less than the restart costs; by extension it pays."""
    job = replace(_job("G", 1, max_nodes=2, names=("n1",), **RUN), remaining_samples=1000.0 * 600)
    snap = ClusterSnapshot(0.0, (NodeView("n1", 2, 2, "allocated"), NodeView("n2", 2, 0, "idle")),
                           (job,), restart_cost=400.0, grow=grow)
    plan = jct.decide(snap)
    assert plan.target("G").nodes * 2 == gpus


# -------------------------------------------------------------------------------- the daemon

@pytest.mark.parametrize(("text", "key", "expected"), [
    ('[daemon]\ngrow = "inplace"\n', "[daemon] grow", "one of extension|requeue"),
    ("[daemon]\nextension_startup = -1\n", "[daemon] extension_startup", "a number >= 0"),
    ("[daemon]\nextension_stall = -0.1\n", "[daemon] extension_stall", "a number >= 0"),
])
def test_daemon_refuses_bad_extension_settings(tmp_path, text, key, expected):
    path = tmp_path / "hpcsched.toml"
    path.write_text(text)
    with pytest.raises(cfg.ConfigError, match=expected) as err:
        cfg.load(path, env={})
    assert key in str(err.value)


def test_daemon_reads_the_extension_settings(tmp_path):
    path = tmp_path / "hpcsched.toml"
    path.write_text('[daemon]\ngrow = "extension"\nextension_startup = 6.5\nextension_stall = 0.8\n')
    d = cfg.load(path, env={}).daemon
    assert (d.grow, d.extension_startup, d.extension_stall) == ("extension", 6.5, 0.8)


@pytest.mark.parametrize(("free", "own", "to_gpus", "spans"), [
    ({"n1": 2, "n2": 4}, {"n1": 2}, 4, 1),             # the rest fits on its own node
    ({"n1": 1, "n2": 4}, {"n1": 3}, 6, 2),             # 1 on its node, 2 on the fullest other
    ({"n1": 0, "n2": 1, "n3": 3}, {"n1": 4}, 8, 3),     # 3 then 1: two more nodes
    ({"n1": 0, "n2": 4, "n3": 4}, {"n1": 4}, 6, 2),
])
def test_extension_spans_its_own_nodes_then_the_fullest(free, own, to_gpus, spans):
    job = replace(_job("G", len(own), names=tuple(own)), layout=tuple(own.values()))
    snap = ClusterSnapshot(0.0, tuple(NodeView(n, 4, 4 - f, "mixed") for n, f in free.items()), (job,),
                           granularity="gpu")
    assert extension_spans(job, to_gpus, snap) == spans


@pytest.mark.parametrize(("grow", "nodes"), [("requeue", 1), ("extension", 2)])
def test_a_grow_by_extension_is_predicted_on_the_nodes_it_will_span(grow, nodes):
    """G holds 2 GPUs of n1, which is full; a GPU-granular plan gives it 4: by requeue it is
    packed onto one node, by extension it keeps n1 and adds n2."""
    job = replace(_job("G", 1, wpn=2, max_nodes=4, names=("n1",), batch=128), layout=(2,),
                  app_class="cifar10")      # its prior: a cross-node step is slower
    snap = ClusterSnapshot(0.0, (NodeView("n1", 4, 4, "allocated"), NodeView("n2", 4, 0, "idle")),
                           (job,), granularity="gpu")
    plan = Plan("x", (JobTarget("G", 1, 128, "r", gpus=4),))
    (cand,), _ = classify(plan, snap, Costs(grow=grow))
    assert cand.x_to == pytest.approx(predict(job, nodes, 128, 4))
    assert predict(job, 2, 128, 4) < 0.5 * predict(job, 1, 128, 4)
