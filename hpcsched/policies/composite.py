"""Composite policies: an allocation policy followed by a placement stage.

:class:`Placed` adds a placement (``packed``, ``pm-first``, ``pal``: :mod:`.placement`) to any
allocation policy; ``[policy.params] placement = "pal"`` does it from the configuration (the
daemon's default policy is ``jct``, :data:`hpcsched.policies.DEFAULT_POLICY`, with no placement
stage: Slurm places). The wrapper is the policy it wraps as far as the round is concerned: its
plan has the same sizes and batch sizes, and every hook of the policy contract
(:mod:`hpcsched.policies.base`: reconcile's gate, the judged view, rounds at events) is the
wrapped policy's.

:class:`OnesPal` (``ones-pal``): node counts and batch sizes from ONES (Bian et al., SC'21)
seeded every round with the elastic DP's answer (Saxena et al., MASCOTS'20), nodes chosen by PAL
(Jain et al., SC'24). The DP is exact for the goodput objective within one round and a strong
starting point; ONES then optimises the predicted remaining completion time and only grows a job
as far as it has proved to scale; PAL puts the jobs most sensitive to GPU variability on the
fastest nodes without changing any size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from hpcsched.model.snapshot import ClusterSnapshot, Plan
from hpcsched.policies.base import Params, Policy, PolicyBase
from hpcsched.policies.ones import ONES, ONESParams
from hpcsched.policies.placement import PLACEMENTS, place

#: the keys a placement stage takes from ``[policy.params]`` (:class:`PlacementParams`)
PLACEMENT_KEYS = ("placement", "locality_penalty")


@dataclass(frozen=True)
class PlacementParams(Params):
    """A placement stage's parameters.

    Attributes:
        placement: the strategy, one of :data:`~hpcsched.policies.placement.PLACEMENTS`.
        locality_penalty: PAL's across-node factor ``L`` (> 0; :mod:`.placement`).

    Raises (when made):
        ValueError: an unknown strategy or a penalty that is not positive.
    """

    placement: str = "pal"
    locality_penalty: float = 1.5

    def check(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, "
                             f"got {self.placement!r}")
        if not self.locality_penalty > 0:
            raise ValueError(f"locality_penalty must be > 0, got {self.locality_penalty!r}")


class Placed(PolicyBase):
    """``policy`` followed by the placement ``strategy`` (module docstring). Every hook is
    ``policy``'s; ``params`` are the stage's (``policy.params`` the policy's).

    Raises (constructor):
        PolicyError: an unknown strategy or a penalty that is not positive.
    """

    Params: type[Params] = PlacementParams    # the base's type: OnesPal's are not these

    def __init__(self, policy: Policy, strategy: str = "pal", locality_penalty: float = 1.5):
        self.params = PlacementParams.parse(
            policy.name, {"placement": strategy, "locality_penalty": locality_penalty},
            extra=policy.params.keys())
        self.policy, self.strategy = policy, self.params.placement
        self.locality_penalty = self.params.locality_penalty
        self.name = f"{policy.name}+{strategy}"

    @property
    def reconcile_gate(self) -> Mapping[str, float]:  # type: ignore[override]
        """The wrapped policy's gate."""
        return self.policy.reconcile_gate

    @property
    def round_on_events(self) -> bool:  # type: ignore[override]
        """Whether the wrapped policy asks for rounds at events."""
        return self.policy.round_on_events

    def judged_view(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """The wrapped policy's judged view: reconcile judges the plan on what it was made on."""
        return self.policy.judged_view(snapshot)

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        """The wrapped policy's plan with placements filled by the stage; sizes unchanged.
        The stage bins the GPUs with a fixed seed, not the round's: the same measurements give
        the same bins every round (and are binned once, :func:`~.placement.binning.
        bin_gpus_cached`)."""
        plan = self.policy.decide(snapshot, seed)
        placed = place(plan, snapshot, self.strategy, self.locality_penalty, seed=0)
        return Plan(self.name, placed.targets, plan.objective, tuple(placed.notes))


@dataclass(frozen=True)
class OnesPalParams(ONESParams):
    """``ones-pal``'s parameters: :class:`~hpcsched.policies.ones.ONESParams` (seeded with the
    DP by default) and PAL's ``locality_penalty`` (> 0)."""

    seed_with_dp: bool = True
    locality_penalty: float = 1.5

    def check(self) -> None:
        super().check()
        if not self.locality_penalty > 0:
            raise ValueError(f"locality_penalty must be > 0, got {self.locality_penalty!r}")


class OnesPal(Placed):
    """``ones-pal``: ONES seeded with the DP, placed by PAL (module docstring).

    Raises (constructor):
        PolicyError: an unknown key or a bad value (the message lists the valid keys).
    """

    Params = OnesPalParams

    def __init__(self, **values):
        params = OnesPalParams.parse("ones-pal", values)
        ones = {f.name: getattr(params, f.name) for f in fields(ONESParams)}
        super().__init__(ONES(**ones), "pal", params.locality_penalty)
        self.params, self.name = params, "ones-pal"
