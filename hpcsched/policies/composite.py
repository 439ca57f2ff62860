"""Composite policies: an allocation policy followed by a placement stage.

:class:`Placed` adds a placement (``packed``, ``pm-first``, ``pal``: :mod:`.placement`) to any
allocation policy; ``[policy.params] placement = "pal"`` does it from the configuration.

:class:`OnesPal` (``ones-pal``) is the daemon's default: node counts and batch sizes from ONES
(Bian et al., SC'21) seeded every round with the elastic DP's answer (Saxena et al.,
MASCOTS'20), nodes chosen by PAL (Jain et al., SC'24). Why this combination:

* the DP is exact for the goodput objective within one round, fast (well under a second at
  4,096 GPUs: ``benchmarks/policy_decision.py``), and a strong starting point; ONES then
  optimises what users feel (predicted remaining completion time, i.e. average JCT) rather
  than momentary goodput, carries its population across rounds, and only grows a job as far as
  it has proved to scale -- seeded with the DP it is never worse than the DP on its own
  objective;
* PAL then puts the jobs most sensitive to GPU variability on the fastest nodes, without
  changing any size, so it composes with either allocation.
"""

from __future__ import annotations

from hpcsched.policies.ones import ONES
from hpcsched.policies.placement import PLACEMENTS, place
from hpcsched.policies.snapshot import ClusterSnapshot, Plan


class Placed:
    """``policy`` followed by the placement ``strategy`` (see module docstring)."""

    def __init__(self, policy, strategy: str = "pal", locality_penalty: float = 1.5):
        if strategy not in PLACEMENTS:
            raise TypeError(f"placement must be one of {', '.join(PLACEMENTS)}, got {strategy!r}")
        self.policy, self.strategy, self.locality_penalty = policy, strategy, locality_penalty
        self.name = f"{policy.name}+{strategy}"

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        plan = self.policy.decide(snapshot, seed)
        placed = place(plan, snapshot, self.strategy, self.locality_penalty, seed)
        return Plan(self.name, placed.targets, plan.objective, tuple(placed.notes))


class OnesPal(Placed):
    """``ones-pal``: ONES seeded with the DP, placed by PAL (see module docstring).

    Parameters: ``locality_penalty`` (PAL) and any of :class:`ONES`'s.
    """

    def __init__(self, locality_penalty: float = 1.5, **ones_params):
        super().__init__(ONES(seed_with_dp=True, **ones_params), "pal", locality_penalty)
        self.name = "ones-pal"
