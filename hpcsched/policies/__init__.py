"""Scheduling policies: pure functions from a :class:`~hpcsched.policies.snapshot.ClusterSnapshot` to a
:class:`~hpcsched.policies.snapshot.Plan`, run alike by the daemon and the simulator.

Policies are chosen by name (:data:`POLICIES`); :func:`make_policy` builds one from its name and
the ``[policy.params]`` table of the configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Protocol

from hpcsched.policies.snapshot import ClusterSnapshot, Plan


class Policy(Protocol):
    """What every policy is: a name and a pure ``decide``."""

    name: str

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan: ...


class PolicyError(ValueError):
    """Unknown policy name or invalid policy parameters."""


def _registry() -> dict[str, Callable[..., Policy]]:
    from hpcsched.policies.composite import OnesPal
    from hpcsched.policies.dp import ElasticDP
    from hpcsched.policies.ones import ONES
    from hpcsched.policies.static import Static
    from hpcsched.policies.tiresias import Tiresias

    return {"static": Static, "tiresias": Tiresias, "dp": ElasticDP, "ones": ONES,
            "ones-pal": OnesPal}


POLICIES = ("static", "tiresias", "dp", "ones", "ones-pal")
DEFAULT_POLICY = "ones-pal"


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """The policy ``name`` configured with ``params``.

    A ``placement`` parameter (``packed``, ``pm-first``, ``pal``) adds that placement stage to
    any allocation policy (with ``locality_penalty`` for it); the rest go to the policy.

    Raises:
        PolicyError: unknown name, or parameters the policy does not take.
    """
    reg = _registry()
    if name not in reg:
        raise PolicyError(f"unknown policy {name!r} (choose from {', '.join(sorted(reg))})")
    params = dict(params or {})
    placement = params.pop("placement", None)
    penalty = params.pop("locality_penalty", 1.5) if placement else None
    try:
        policy = reg[name](**params)
        if placement:
            from hpcsched.policies.composite import Placed

            policy = Placed(policy, placement, penalty)
        return policy
    except TypeError as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from None
