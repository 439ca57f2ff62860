"""Scheduling policies: pure functions from a :class:`~hpcsched.policies.snapshot.ClusterSnapshot` to a
:class:`~hpcsched.policies.snapshot.Plan`, run alike by the daemon and the simulator.

Policies are chosen by name (:data:`POLICIES`); :func:`make_policy` builds one from its name and
the ``[policy.params]`` table of the configuration.

Adding a policy: write ``decide(snapshot, seed, *, <parameters>) -> Plan`` in a module of this
package (pure: no I/O, no clock, randomness only from ``seed``) and add one line to
:data:`REGISTRY`. A policy that keeps state between rounds is a class instead (its constructor
takes the parameters, its instances ``decide``), as :class:`~hpcsched.policies.ones.ONES`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from hpcsched.policies.base import Policy, PolicyError, stateless

#: policy name -> ``"module:attribute"``: a pure ``decide`` function, or a class for a policy
#: with state. Imported when the policy is made, so that importing this package (as the Slurm
#: glue and the configuration do, for the snapshot types and the names) stays cheap.
REGISTRY: dict[str, str] = {
    "static": "hpcsched.policies.static:decide",
    "tiresias": "hpcsched.policies.tiresias:Tiresias",
    "dp": "hpcsched.policies.dp:decide",
    "ones": "hpcsched.policies.ones:ONES",
    "ones-pal": "hpcsched.policies.composite:OnesPal",
    "pollux": "hpcsched.policies.pollux:Pollux",
    "jct": "hpcsched.policies.jct:JCT",
}
POLICIES = tuple(REGISTRY)
DEFAULT_POLICY = "jct"


def _factory(name: str) -> Callable[..., Policy]:
    module, attribute = REGISTRY[name].split(":")
    obj = getattr(importlib.import_module(module), attribute)
    return obj if inspect.isclass(obj) else stateless(name, obj)


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """The policy ``name`` configured with ``params``.

    A ``placement`` parameter (``packed``, ``pm-first``, ``pal``) adds that placement stage to
    any allocation policy (with ``locality_penalty`` for it); the rest go to the policy.

    Raises:
        PolicyError: unknown name, or parameters the policy does not take or accept.
    """
    if name not in REGISTRY:
        raise PolicyError(f"unknown policy {name!r} (choose from {', '.join(sorted(REGISTRY))})")
    params = dict(params or {})
    placement = params.pop("placement", None)
    penalty = params.pop("locality_penalty", 1.5) if placement else None
    factory = _factory(name)
    try:
        policy = factory(**params)
        if placement:
            from hpcsched.policies.composite import Placed

            policy = Placed(policy, placement, penalty)
        return policy
    except TypeError as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from None


__all__ = ["DEFAULT_POLICY", "POLICIES", "REGISTRY", "Policy", "PolicyError", "make_policy"]
