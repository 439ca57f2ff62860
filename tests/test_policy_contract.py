"""The policy contract (:mod:`hpcsched.policies.base`), checked on every registered policy, alone
and with each placement stage: every hook is there, a wrapper's hooks are the wrapped policy's,
the parameters are a frozen dataclass, and a bad key or value is a one-line ValueError that
lists the valid keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import replace

import pytest

from hpcsched.model.snapshot import ClusterSnapshot, Plan
from hpcsched.policies import POLICIES, Params, Policy, PolicyBase, PolicyError, make_policy, policy_factory
from hpcsched.policies import round as policy_round
from hpcsched.policies.base import rounds_on_events
from hpcsched.policies.composite import PLACEMENT_KEYS, Placed
from hpcsched.policies.placement import PLACEMENTS
from hpcsched.policies.reconcile import Costs
from tests.test_policies import _contended

COMBOS = [(name, placement) for name in POLICIES for placement in (None, *PLACEMENTS)]
COSTS_FIELDS = {f.name for f in dataclasses.fields(Costs)}


def _make(name: str, placement: str | None) -> Policy:
    return make_policy(name, {"placement": placement} if placement else {})


def _noisy() -> ClusterSnapshot:
    """A contended cluster whose jobs report gradient noise (so ``jct``'s judged view is not
    the snapshot itself)."""
    snap = _contended()
    return replace(snap, jobs=tuple(replace(j, grad_noise=(1.0, 50.0)) for j in snap.jobs))


@pytest.mark.parametrize(("name", "placement"), COMBOS)
def test_every_policy_has_every_hook(name, placement):
    policy = _make(name, placement)
    assert isinstance(policy, PolicyBase) and isinstance(policy, Policy)
    assert policy.name == (f"{name}+{placement}" if placement else name)
    gate = policy.reconcile_gate
    assert isinstance(gate, Mapping) and set(gate) <= COSTS_FIELDS, gate
    assert isinstance(policy.round_on_events, bool)
    snap = _noisy()
    assert isinstance(policy.judged_view(snap), ClusterSnapshot)
    plan = policy.decide(snap, seed=1)
    assert isinstance(plan, Plan) and plan.policy == policy.name
    decision = policy_round.decide_round(snap, policy, Costs(), seed=1)
    assert decision.plan is not None


@pytest.mark.parametrize(("name", "placement"), COMBOS)
def test_parameters_are_a_frozen_dataclass_with_its_keys(name, placement):
    policy = _make(name, placement)
    params = policy.params
    assert isinstance(params, Params) and dataclasses.is_dataclass(params)
    assert type(params).keys() == tuple(f.name for f in dataclasses.fields(params))
    for key in type(params).keys():
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(params, key, getattr(params, key))
    if placement:
        assert type(params).keys() == PLACEMENT_KEYS and params.placement == placement
        assert policy.policy.params == _make(name, None).params   # the inner's are its own


@pytest.mark.parametrize(("name", "placement"), COMBOS)
def test_a_wrapper_delegates_every_hook(name, placement):
    policy, alone = _make(name, placement), _make(name, None)
    inner = policy.policy if placement else policy
    assert policy.reconcile_gate == inner.reconcile_gate == alone.reconcile_gate
    assert policy.round_on_events is inner.round_on_events is alone.round_on_events
    assert rounds_on_events(policy) is rounds_on_events(alone)
    snap = _noisy()
    view = policy.judged_view(snap)
    assert view is inner.judged_view(snap)
    assert view.jobs == alone.judged_view(snap).jobs


def test_jct_with_a_placement_is_judged_and_rounds_as_jct():
    """The bug this contract fixes: ``jct`` + a placement stage was judged on the raw snapshot
    with the daemon's gate, and ran no event rounds."""
    snap = _noisy()
    for placement in PLACEMENTS:
        placed, jct = _make("jct", placement), _make("jct", None)
        assert dict(placed.reconcile_gate) == {"min_gain": 0.0}
        assert placed.round_on_events and rounds_on_events(placed, True)
        assert not rounds_on_events(placed, False)
        view = placed.judged_view(snap)
        assert view is not snap and view.jobs == jct.judged_view(snap).jobs
        assert view.jobs[0].grad_noise[1] > snap.jobs[0].grad_noise[1]   # the noise growth


class _Spy(PolicyBase):
    """A policy with every hook away from its default, and what reconcile was handed."""

    name = "spy"
    reconcile_gate = {"min_gain": 0.25, "hold": 7.0}
    round_on_events = True

    def __init__(self):
        self.view = None

    def judged_view(self, snapshot):
        self.view = replace(snapshot, time=snapshot.time + 1.0)
        return self.view

    def decide(self, snapshot, seed=0):
        return Plan(self.name, ())


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_decide_round_gives_reconcile_the_wrapped_policys_gate_and_view(placement, monkeypatch):
    seen = []

    def fake_reconcile(plan, snapshot, costs):
        seen.append((snapshot, costs))
        return [], []

    monkeypatch.setattr(policy_round, "reconcile", fake_reconcile)
    spy = _Spy()
    placed = Placed(spy, placement)
    assert placed.round_on_events and placed.reconcile_gate == spy.reconcile_gate
    policy_round.decide_round(_contended(), placed, Costs(min_gain=0.05, hold=180.0), seed=0)
    (snapshot, costs), = seen
    assert snapshot is spy.view and snapshot.time == _contended().time + 1.0
    assert (costs.min_gain, costs.hold) == (0.25, 7.0)


def test_the_defaults_are_no_gate_the_snapshot_and_no_event_rounds():
    class Plain(PolicyBase):
        name = "plain"

        def decide(self, snapshot, seed=0):
            return Plan(self.name, ())

    snap = _contended()
    plain = Plain()
    assert dict(plain.reconcile_gate) == {} and not plain.round_on_events
    assert plain.judged_view(snap) is snap and not rounds_on_events(plain)
    assert not rounds_on_events(None)


@pytest.mark.parametrize(("name", "placement"), COMBOS)
def test_an_unknown_key_is_a_value_error_listing_every_key(name, placement):
    params = {"nosuch": 1, **({"placement": placement} if placement else {})}
    with pytest.raises(ValueError) as info:
        make_policy(name, params)
    assert isinstance(info.value, PolicyError)
    message = str(info.value)
    assert "\n" not in message and f"policy {name!r}" in message and "nosuch" in message
    for key in policy_factory(name).Params.keys() + PLACEMENT_KEYS:
        assert key in message, (key, message)


#: a value of the wrong type for each policy's first key, and one out of range
BAD = {
    "static": [{"backfill": "no"}, {"backfill": 1}],
    "tiresias": [{"queue_thresholds": ["x"]}, {"queue_thresholds": [5, 3]}, {"promote_knob": 0}],
    "dp": [],
    "ones": [{"population": "many"}, {"population": 1}, {"mutation": 2.0}],
    "ones-pal": [{"locality_penalty": "far"}, {"locality_penalty": 0}, {"elite": -1}],
    "pollux": [{"population": 2.5}, {"mutation": "wild"}, {"max_work": 0}],
    "jct": [{"aging": None}, {"hesrpt": 1.0}, {"noise_growth": 0.5}, {"max_options": 0},
            {"speedup_at": "max"}, {"restart_cost": -1}],
    "sia": [{"p": "low"}, {"p": 0}, {"lambda_n": -1}, {"configs": "some"}],
    "wham": [{"holding_costs": ["x"]}, {"noise_growth": 0.5}, {"aging": 0}, {"max_options": 0}],
}


@pytest.mark.parametrize(("name", "bad"), [(n, b) for n in POLICIES for b in BAD[n]]
                         + [(n, {"placement": "scattered"}) for n in POLICIES]
                         + [(n, {"placement": "pal", "locality_penalty": 0}) for n in POLICIES])
def test_a_bad_value_is_a_value_error_listing_every_key(name, bad):
    with pytest.raises(PolicyError) as info:
        make_policy(name, bad)
    message = str(info.value)
    assert "\n" not in message and f"policy {name!r}" in message
    assert "valid keys: " in message
    for key in policy_factory(name).Params.keys():
        assert key in message, (key, message)


def test_every_registered_policy_is_covered_here():
    assert set(BAD) == set(POLICIES)


@pytest.mark.parametrize("name", POLICIES)
def test_the_factory_takes_the_same_keys_as_make_policy(name):
    """Made directly (as the tests and the benchmarks do) or by name, the same parameters."""
    factory = policy_factory(name)
    assert issubclass(factory.Params, Params)
    assert factory().params == make_policy(name).params == factory.Params()
    with pytest.raises(PolicyError, match="valid keys"):
        factory(nosuch=1)


# ------------------------------------------------- a GPU-granular plan placed (jct + pal)

def _gpu_snap(nodes, jobs, speeds, allocated=(), grow="requeue"):
    """Nodes of 4 GPUs (``allocated``: GPUs in use per node), GPU-granular, class A's slowdown
    per node."""
    from hpcsched.model.snapshot import NodeView
    from tests.test_placement import _gpus

    used = dict(allocated)
    return ClusterSnapshot(0.0, tuple(NodeView(n, 4, used.get(n, 0), "mixed" if used.get(n) else "idle")
                                      for n in nodes), tuple(jobs),
                           gpus=_gpus({n: {"A": s} for n, s in speeds.items()}),
                           granularity="gpu", grow=grow)


def _gpu_target(job_id, gpus):
    from hpcsched.model.snapshot import JobTarget

    return JobTarget(job_id, -(-gpus // 4), 64, "sized", gpus=gpus)


def test_a_pending_job_of_a_gpu_plan_takes_free_gpus_of_the_fastest_bin():
    """2 GPUs: packed takes the tightest node (n1, slow for A), PAL the fast bin (n2)."""
    from hpcsched.policies.placement import place
    from tests.test_placement import _job

    snap = _gpu_snap(["n1", "n2"], [_job("a", 1, wpn=4, cls="A")], {"n1": 1.3, "n2": 1.0},
                     allocated=[("n1", 2)])
    plan = Plan("t", (_gpu_target("a", 2),))
    assert place(plan, snap, "packed").target("a").placement == ("n1",)
    assert place(plan, snap, "pal").target("a").placement == ("n2",)
    # 6 GPUs: the fast bin alone has 4 free, both bins 2 + 4 (the nodes in the order their
    # GPUs are taken: the most free first); 7 fit nowhere now: Slurm chooses
    assert place(Plan("t", (_gpu_target("a", 6),)), snap, "pal").target("a").placement == \
        ("n2", "n1")
    out = place(Plan("t", (_gpu_target("a", 7),)), snap, "pal")
    assert out.target("a").placement == () and any("left to Slurm" in n for n in out.notes)


def test_a_running_job_of_a_gpu_plan_keeps_its_gpus_and_grows_by_extension_onto_fast_nodes():
    from hpcsched.policies.placement import place
    from tests.test_placement import _job

    run = _job("r", 1, wpn=4, cls="A", state="RUNNING", names=("n1",))
    snap = _gpu_snap(["n1", "n2", "n3"], [run, _job("p", 1, wpn=4, cls="A")],
                     {"n1": 1.0, "n2": 1.0, "n3": 1.3}, allocated=[("n1", 4), ("n3", 2)],
                     grow="extension")
    # the same size: no placement, and its node is no one else's
    kept = place(Plan("t", (_gpu_target("r", 4), _gpu_target("p", 4))), snap, "pal")
    assert kept.target("r").placement == () and kept.target("p").placement == ("n2",)
    # grown to 6 by extension: 2 GPUs of the fast bin (packed: the tightest), then its own node
    # (full: it gives none; the nodes are listed in the order their GPUs are taken)
    grown = Plan("t", (_gpu_target("r", 6),))
    assert place(grown, snap, "pal").target("r").placement == ("n2", "n1")
    assert place(grown, snap, "packed").target("r").placement == ("n3", "n1")
