"""Measured resize costs: the journal's phase histories (a real SQLite store) into the costs
reconcile and the policies weigh resizes with."""

from __future__ import annotations

import pytest

from hpcsched.daemon.costs import measured_costs, resize_seconds
from hpcsched.daemon.store import Store
from hpcsched.policies.reconcile import Costs


def _journal(store: Store, kind: str, phases: list[tuple[str, float]], job: str = "1") -> int:
    aid = store.plan_action(job_id=job, kind=kind, generation=1, from_nodes=1, to_nodes=2,
                            from_batch_size=64, to_batch_size=64, created_at=phases[0][1] - 1)
    for phase, t in phases:
        store.set_action_phase(aid, phase, at=t)
    return aid


def _grow(store, t0, seconds):
    return _journal(store, "grow", [("checkpointed", t0), ("requeued", t0 + 1),
                                    ("released", t0 + 2), ("running", t0 + seconds)])


def _shrink(store, t0, seconds):
    return _journal(store, "shrink", [("checkpointed", t0), ("running", t0 + seconds)])


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'h.db'}")
    s.upgrade()
    s.upsert_job(job_id="1", job_uid="uid-1", user="alice", script="train.py",
                 workers_per_node=4, min_nodes=1, max_nodes=4, min_batch_size=32,
                 max_batch_size=512, base_batch_size=128, lr_scaling="linear", spec_json="{}",
                 state="RUNNING", last_seen=100.0)
    yield s
    s.close()


def test_a_resize_costs_from_its_checkpoint_to_its_first_step(store):
    _grow(store, 1000.0, 13.5)
    _shrink(store, 2000.0, 0.4)
    failed = _journal(store, "grow", [("checkpointed", 3000.0), ("failed", 3005.0)])
    batch = _journal(store, "batch", [("running", 4000.0)])
    by_id = {a.id: a for a in store.actions()}
    spans = sorted(s for a in store.actions() if (s := resize_seconds(a)) is not None)
    assert spans == [pytest.approx(0.4), pytest.approx(13.5)]
    assert resize_seconds(by_id[failed]) is None and resize_seconds(by_id[batch]) is None


@pytest.mark.parametrize(("grows", "shrinks", "restart", "shrink"), [
    ([], [], 30.0, 2.0),                         # nothing measured: the configured costs
    ([10.0, 14.0], [0.3], 30.0, 2.0),            # fewer than 3 of each: still configured
    ([10.0, 14.0, 12.0], [0.3, 0.5, 0.4], 12.0, 0.4),   # medians
    ([10.0, 14.0, 12.0, 90.0], [], 13.0, 2.0),   # one slow requeue moves the median little
])
def test_the_median_of_measured_resizes_replaces_the_configured_cost(store, grows, shrinks,
                                                                    restart, shrink):
    t = 1000.0
    for g in grows:
        _grow(store, t, g)
        t += 100
    for s in shrinks:
        _shrink(store, t, s)
        t += 100
    costs, said = measured_costs(store.actions(limit=200), Costs(restart_cost=30.0, min_gain=0.07))
    assert (costs.restart_cost, costs.shrink_cost) == (pytest.approx(restart), pytest.approx(shrink))
    assert costs.min_gain == 0.07                      # the rest is kept
    assert ("median" in said) == bool(len(grows) >= 3 or len(shrinks) >= 3)


def test_only_the_latest_window_counts(store):
    for i in range(5):
        _grow(store, 1000.0 + 100 * i, 100.0)       # old, slow
    for i in range(3):
        _grow(store, 5000.0 + 100 * i, 8.0)         # recent, fast
    costs, _ = measured_costs(store.actions(limit=200), Costs(), window=3)
    assert costs.restart_cost == pytest.approx(8.0)


def _extension(store, t0, seconds, to_nodes=2):
    aid = store.plan_action(job_id="1", kind="reform", generation=1, from_nodes=1,
                            to_nodes=to_nodes, from_batch_size=64, to_batch_size=64,
                            placement=("n1:4", "n2:4")[:to_nodes], created_at=t0)
    store.set_action_phase(aid, "running", at=t0 + seconds)
    return aid


@pytest.mark.parametrize(("spans", "startup"), [
    ([4.0, 6.0], 2.25),                 # fewer than 3: the configured start-up
    ([4.0, 6.0, 5.0], 5.0),             # the median of the grows by extension
])
def test_a_grow_by_extension_is_measured_from_its_request_to_its_first_step(store, spans, startup):
    for i, s in enumerate(spans):
        _extension(store, 1000.0 + 100 * i, s)
    _extension(store, 2000.0, 0.1, to_nodes=1)        # a release: not a start-up
    costs, said = measured_costs(store.actions(limit=200),
                                 Costs(grow="extension", extension_startup=2.25))
    assert costs.extension_startup == pytest.approx(startup)
    assert costs.extension_stall == Costs().extension_stall     # not measured here
    assert ("extension start-up" in said) and (("median" in said) == (len(spans) >= 3))
