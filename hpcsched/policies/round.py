"""One scheduling decision, the same in the daemon and the simulator.

``decide_round(snapshot, policy, costs, seed) -> RoundDecision(plan, changes, notes)``: the pure
middle of a round, between observing the cluster and acting on it. The daemon
(:mod:`hpcsched.daemon.round`) calls it on a snapshot built from Slurm and the job directories;
the simulator (:mod:`hpcsched.sim.engine`) on a snapshot built from its simulated Slurm. Both
build the snapshot with the same job-view builder (:mod:`hpcsched.views.build`), so a
simulated result speaks for the daemon's decisions.

Pure: no I/O, no clock; randomness only from ``seed`` (the daemon and the simulator pass the
configured seed plus the round number). A stateful policy (ONES keeps its population between
rounds) carries its own state, which is the only state a round changes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, Plan
from hpcsched.policies import Policy
from hpcsched.policies.neighbours import yield_to_foreign
from hpcsched.policies.reconcile import Change, Costs, reconcile


class RoundDecision(NamedTuple):
    """What one round decided.

    Attributes:
        plan: the policy's plan (a target per job it has an opinion on), or ``None`` when there
            was no job to decide for (the policy is not called).
        changes: the changes to make now, in the order to make them (reconcile's output).
        notes: the policy's notes, then reconcile's (why something was or was not changed).
        reconcile_seconds: wall time of reconcile (the rest of the round's decision is the
            policy's own), for the daemon's per-phase timings.
    """

    plan: Plan | None
    changes: tuple[Change, ...]
    notes: tuple[str, ...]
    reconcile_seconds: float = 0.0


def decide_round(snapshot: ClusterSnapshot, policy: Policy, costs: Costs, seed: int) -> RoundDecision:
    """The policy's plan for ``snapshot`` and the changes worth making now.

    Args:
        snapshot: the cluster and the managed jobs at one instant.
        policy: a policy from :func:`hpcsched.policies.make_policy`.
        costs: reconcile's parameters (restart and shrink costs in seconds, how grows are made
            and what an extension costs, ``min_gain``, ``horizon``, ``hold``; see
            :class:`~hpcsched.policies.reconcile.Costs`); the policy's ``reconcile_gate``
            overrides some of them for its plans, and its ``judged_view(snapshot)`` gives the
            snapshot reconcile judges its plan on (the view the policy planned on: ``jct``'s
            noise growth). Both are hooks of the policy contract
            (:class:`~hpcsched.policies.base.PolicyBase`), delegated by wrappers.
        seed: the policy's seed for this round.

    Raises:
        Whatever the policy raises on a snapshot it cannot handle (a bug: policies are total).
    """
    if not snapshot.jobs:
        return RoundDecision(None, (), ())
    # a policy that prices restarts itself may loosen reconcile's gate (Pollux: no minimum gain,
    # no hold): its ``reconcile_gate`` replaces those fields of ``costs``
    # (float values for Costs' float fields; typed Any as Costs also has bool and str fields)
    gate: dict[str, Any] = dict(policy.reconcile_gate)
    costs = replace(costs, **gate)
    # the policy prices changes with the costs reconcile judges them by, and sees its hold
    snapshot = replace(snapshot, restart_cost=costs.restart_cost, shrink_cost=costs.shrink_cost,
                       grow=costs.grow, extension_startup=costs.extension_startup,
                       extension_stall=costs.extension_stall, hold=costs.hold)
    # a good neighbour: other users' pending jobs keep the free GPUs they need (and
    # ``keep_free`` more stay free for their next ones), and extension GPUs they need are
    # released first (hpcsched.policies.neighbours)
    snapshot, releases, yielded = yield_to_foreign(snapshot, costs.keep_free)
    plan = policy.decide(snapshot, seed=seed)
    # a policy that plans on its own view of the jobs (``jct``'s noise growth) is judged on it
    t = time.perf_counter()
    changes, notes = reconcile(plan, policy.judged_view(snapshot), costs)
    return RoundDecision(plan, tuple(releases + changes),
                         tuple(yielded) + tuple(plan.notes) + tuple(notes), time.perf_counter() - t)


class PartitionOverlap(ValueError):
    """Partitions planned by different policies share nodes (``str`` names them): one node's
    GPUs cannot be planned twice."""


def partition_view(snapshot: ClusterSnapshot, partitions: frozenset[str]) -> ClusterSnapshot:
    """The part of ``snapshot`` in ``partitions``: their nodes (with the GPUs other jobs hold
    there, and their GPU measurements), the managed jobs and the other users' pending jobs
    submitted to one of them (pure)."""
    nodes = tuple(n for n in snapshot.nodes if partitions.intersection(n.partitions))
    names = {n.name for n in nodes}
    return replace(
        snapshot, nodes=nodes, jobs=tuple(j for j in snapshot.jobs if j.partition in partitions),
        other_gpus_allocated=tuple((n, g) for n, g in snapshot.other_gpus_allocated if n in names),
        gpus=tuple(g for g in snapshot.gpus if g.node in names),
        foreign_pending=tuple(f for f in snapshot.foreign_pending if f.partition in partitions),
        partitions=tuple(sorted(partitions)))


def _partition_groups(snapshot: ClusterSnapshot, policy: Policy,
                      by_partition: Mapping[str, Policy]) -> list[tuple[frozenset[str], Policy]]:
    """The groups of partitions planned together, each with its policy: one per partition of
    ``by_partition``, in name order, then, if any, the rest of ``snapshot.partitions`` together
    with the partitions of jobs in none of them (strays), planned by ``policy``."""
    rest = frozenset(snapshot.partitions) - set(by_partition)
    groups = [(frozenset({p}), pol) for p, pol in sorted(by_partition.items())]
    known = set().union(*(g for g, _ in groups), rest)
    strays = frozenset(j.partition for j in snapshot.jobs if j.partition not in known)
    if rest or strays:
        groups.append((rest | strays, policy))
    return groups


def _check_disjoint(views: list[tuple[str, Policy, ClusterSnapshot]]) -> None:
    """Raise :class:`PartitionOverlap` when two of the labelled partition views share a
    node (one node's GPUs cannot be planned twice); nothing otherwise."""
    seen: dict[str, str] = {}
    for label, _, view in views:
        for n in view.nodes:
            if n.name in seen:
                raise PartitionOverlap(f"node {n.name} is in partition(s) {seen[n.name]} and "
                                       f"{label}, planned by different policies")
            seen[n.name] = label


def decide_by_partition(snapshot: ClusterSnapshot, policy: Policy,
                        by_partition: Mapping[str, Policy], costs: Costs,
                        seed: int) -> RoundDecision:
    """:func:`decide_round` with a policy of its own for each partition of ``by_partition``
    (``[policy.partitions.<name>]``) and ``policy`` for the rest of ``snapshot.partitions``
    (and for a job whose partition is none of them, e.g. a pending job submitted to several):
    each group of partitions is planned on its own part of the snapshot
    (:func:`partition_view`), and the decisions are put together (plans' targets and
    objectives summed, changes and notes in group order, each note prefixed by the partition).

    Raises:
        PartitionOverlap: two groups share a node.
    """
    if not by_partition:
        return decide_round(snapshot, policy, costs, seed)
    groups = _partition_groups(snapshot, policy, by_partition)
    views = [(",".join(sorted(parts)) or "-", pol, partition_view(snapshot, parts))
             for parts, pol in groups]
    _check_disjoint(views)
    targets: list[JobTarget] = []
    changes: list[Change] = []
    notes: list[str] = []
    objective: float | None = None
    reconciling = 0.0
    for label, pol, view in views:
        d = decide_round(view, pol, costs, seed)
        reconciling += d.reconcile_seconds
        if d.plan is not None:
            targets += d.plan.targets
            if d.plan.objective is not None:
                objective = (objective or 0.0) + d.plan.objective
        changes += d.changes
        notes += [f"[{label}] {n}" for n in d.notes]
    plan = Plan(policy="+".join(p.name for _, p in groups), targets=tuple(targets),
                objective=objective) if targets else None
    return RoundDecision(plan, tuple(changes), tuple(notes), reconciling)


__all__ = ["PartitionOverlap", "RoundDecision", "decide_by_partition", "decide_round",
           "partition_view"]
