"""What a policy is, and the one error a policy's configuration raises.

A policy is an object with a ``name`` and a pure ``decide(snapshot, seed) -> Plan``. A policy
that keeps no state between rounds is just a function ``decide(snapshot, seed, **params) ->
Plan``; :func:`stateless` makes it a policy, with its parameters bound and checked.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from hpcsched.policies.snapshot import ClusterSnapshot, Plan


class Policy(Protocol):
    """What every policy is: a name and a pure ``decide``."""

    name: str

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan: ...


def rounds_on_events(policy: object, enabled: bool = True) -> bool:
    """Whether rounds run also at job ends and at submissions that find no room: ``enabled``
    (the daemon's ``daemon.event_rounds``, the simulator's ``SimConfig.event_rounds``) and the
    policy asks for them (its ``round_on_events`` attribute: ``jct``)."""
    return bool(enabled and getattr(policy, "round_on_events", False))


class PolicyError(ValueError):
    """Unknown policy name or invalid policy parameters."""


DecideFunction = Callable[..., Plan]    # decide(snapshot, seed, **params) -> Plan


class FunctionPolicy:
    """A stateless policy: ``decide(snapshot, seed, **params)`` with ``params`` bound."""

    def __init__(self, name: str, decide: DecideFunction, params: dict[str, Any]):
        self.name, self._decide, self.params = name, decide, dict(params)

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        return self._decide(snapshot, seed, **self.params)


def stateless(name: str, decide: DecideFunction) -> Callable[..., Policy]:
    """A factory of :class:`FunctionPolicy`: ``factory(**params)`` checks ``params`` against
    ``decide``'s keyword parameters, then their values by deciding once on an empty cluster (a
    bad value is refused when the policy is made, not at the daemon's first round).

    Raises (from the factory):
        TypeError: a parameter ``decide`` does not take, or a value it refuses
            (:func:`hpcsched.policies.make_policy` reports it as :class:`PolicyError`).
    """
    signature = inspect.signature(decide)

    def factory(**params: Any) -> Policy:
        signature.bind(None, 0, **params)
        decide(ClusterSnapshot(0.0, (), ()), 0, **params)
        return FunctionPolicy(name, decide, params)

    return factory
