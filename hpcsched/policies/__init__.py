"""Scheduling policies: pure functions from a :class:`~hpcsched.snapshot.ClusterSnapshot` to a
:class:`~hpcsched.snapshot.Plan`, run alike by the daemon and the simulator.

Policies are chosen by name (:data:`POLICIES`); :func:`make_policy` builds one from its name and
the ``[policy.params]`` table of the configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Protocol

from ..snapshot import ClusterSnapshot, Plan


class Policy(Protocol):
    """What every policy is: a name and a pure ``decide``."""

    name: str

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan: ...


class PolicyError(ValueError):
    """Unknown policy name or invalid policy parameters."""


def _registry() -> dict[str, Callable[..., Policy]]:
    from .dp import ElasticDP
    from .ones import ONES
    from .static import Static
    from .tiresias import Tiresias

    return {"static": Static, "tiresias": Tiresias, "dp": ElasticDP, "ones": ONES}


POLICIES = ("static", "tiresias", "dp", "ones")


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """The policy ``name`` configured with ``params``.

    Raises:
        PolicyError: unknown name, or parameters the policy does not take.
    """
    reg = _registry()
    if name not in reg:
        raise PolicyError(f"unknown policy {name!r} (choose from {', '.join(sorted(reg))})")
    try:
        return reg[name](**dict(params or {}))
    except TypeError as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from None
