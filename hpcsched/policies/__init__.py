"""Scheduling policies: pure functions from a :class:`~hpcsched.model.snapshot.ClusterSnapshot` to a
:class:`~hpcsched.model.snapshot.Plan`, run alike by the daemon and the simulator.

Policies are chosen by name (:data:`POLICIES`); :func:`make_policy` builds one from its name and
the ``[policy.params]`` table of the configuration.

The contract every policy meets is :mod:`hpcsched.policies.base`: a :class:`PolicyBase` with
frozen parameters (a :class:`~hpcsched.policies.base.Params` dataclass that checks them) and
the hooks reconcile and the round loop read (``reconcile_gate``, ``judged_view``,
``round_on_events``), each with a default.

Adding a policy: a :class:`PolicyBase` subclass with its ``Params`` and ``decide`` (pure: no
I/O, no clock, randomness only from ``seed``), or, for a policy without state between rounds,
a function ``decide(snapshot, seed, *, <parameters>) -> Plan`` made a policy by
:func:`~hpcsched.policies.base.stateless` with its ``Params``; then one line in
:data:`REGISTRY`. ``tests/test_policy_contract.py`` checks every registered policy against the
contract.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from hpcsched.policies.base import Params, Policy, PolicyBase, PolicyError, PolicyFactory

#: policy name -> ``"module:attribute"``: the policy's factory (a :class:`PolicyBase` subclass,
#: or a :func:`~hpcsched.policies.base.stateless` factory), called with the parameters; its
#: ``Params`` attribute is the parameters' class. Imported when the policy is made, so that
#: importing this package (as the Slurm glue and the configuration do, for the snapshot types
#: and the names) stays cheap.
REGISTRY: dict[str, str] = {
    "static": "hpcsched.policies.static:Static",
    "tiresias": "hpcsched.policies.tiresias:Tiresias",
    "dp": "hpcsched.policies.dp:DP",
    "ones": "hpcsched.policies.ones:ONES",
    "ones-pal": "hpcsched.policies.composite:OnesPal",
    "pollux": "hpcsched.policies.pollux:Pollux",
    "sia": "hpcsched.policies.sia:Sia",
    "jct": "hpcsched.policies.jct:JCT",
    "wham": "hpcsched.policies.wham:WHAM",
}
POLICIES = tuple(REGISTRY)
DEFAULT_POLICY = "jct"


def policy_factory(name: str) -> PolicyFactory:
    """The factory of the registered policy ``name``: called with its parameters (keywords),
    it makes the policy; its ``Params`` attribute is their :class:`Params` class.

    Raises:
        PolicyError: unknown name.
    """
    if name not in REGISTRY:
        raise PolicyError(f"unknown policy {name!r} (choose from {', '.join(sorted(REGISTRY))})")
    module, attribute = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), attribute)


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """The policy ``name`` configured with ``params`` (the ``[policy.params]`` table).

    A ``placement`` parameter (``packed``, ``pm-first``, ``pal``) adds that placement stage to
    any allocation policy (with ``locality_penalty`` for it: :class:`~hpcsched.policies.
    composite.PlacementParams`); the rest are the policy's own (its ``Params``).

    Raises:
        PolicyError: unknown name, or a parameter the policy does not take or a value it
            refuses; one line, naming the policy and listing its valid keys.
    """
    from hpcsched.policies.composite import PLACEMENT_KEYS, Placed

    factory = policy_factory(name)
    own: dict[str, Any] = dict(params or {})
    placement = own.pop("placement", None)
    stage = {k: own.pop(k) for k in PLACEMENT_KEYS[1:] if k in own} if placement else {}
    factory.Params.parse(name, own, extra=PLACEMENT_KEYS)      # every error lists every key
    policy = factory(**own)
    return Placed(policy, placement, **stage) if placement else policy


__all__ = ["DEFAULT_POLICY", "POLICIES", "REGISTRY", "Params", "Policy", "PolicyBase",
           "PolicyError", "make_policy", "policy_factory"]
