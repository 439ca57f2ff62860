"""What a resize really costs on this cluster, measured from the journal.

A grow stops the job's workers at a checkpoint, requeues the job and starts it again at its new
size; a shrink stops them at a checkpoint and re-forms the group in place. Either way the job
trains on nothing from the moment it checkpointed (``checkpointed`` in the resize's phase
history, :mod:`hpcsched.daemon.phases`) to the moment it acknowledged the new configuration,
its first step about to run (``running``). That span is the resize's measured cost, seconds.

:func:`measured_costs` replaces the configured ``restart_cost`` and ``shrink_cost`` with the
median of the latest completed grows and shrinks once there are ``min_samples`` of them, so
reconcile and the policies (which see the same figures in the snapshot) weigh a resize against
what resizes have cost here, not against an assumption. Pure: the actions in, the costs out.

A grow by extension allocation (a ``reform`` to more nodes; ``daemon.grow = "extension"``)
stops nothing: the job trains on while the new workers start, from the request (``requested``)
to its first step with them (``running``). That span is the extension's start-up as this
cluster measures it, and its median replaces the configured ``extension_startup`` the same
way. The stall at the step boundary is too short for the journal's resolution (a round): the
configured ``extension_stall`` stays (``benchmarks/resize_latency.py`` measures it). The median
grow above is a requeue's span and prices what still restarts a job (starts, preemptions,
releases, requeue grows).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import replace

from hpcsched.daemon.phases import ResizePhase
from hpcsched.daemon.store.rows import ActionRow
from hpcsched.policies.reconcile import Costs
from hpcsched.protocol.kinds import ChangeKind

#: completed resizes of a kind needed before their median replaces the configured cost
MIN_SAMPLES = 3
#: the latest completed resizes of a kind the median is over
WINDOW = 20
_NAMES = {ChangeKind.GROW: "grow", ChangeKind.SHRINK: "shrink",
          ChangeKind.REFORM: "extension start-up"}


def resize_seconds(action: ActionRow) -> float | None:
    """Seconds the job trained on nothing during ``action``: from ``checkpointed`` to
    ``running`` in its phase history; ``None`` when it did not get there (failed, still open,
    or a change that never checkpoints: batch-only, pending)."""
    times = dict(action.history)
    start, end = times.get(ResizePhase.CHECKPOINTED), times.get(ResizePhase.RUNNING)
    if start is None or end is None or end < start:
        return None
    return end - start


def extension_seconds(action: ActionRow) -> float | None:
    """Seconds from the request to the first step with the new workers of a grow by extension
    (a ``reform`` to more nodes); None for anything else, or one that did not get there."""
    if action.kind != ChangeKind.REFORM or action.to_nodes <= action.from_nodes:
        return None
    times = dict(action.history)
    start, end = times.get(ResizePhase.REQUESTED), times.get(ResizePhase.RUNNING)
    return end - start if start is not None and end is not None and end >= start else None


def measured_costs(actions: Iterable[ActionRow], configured: Costs,
                   min_samples: int = MIN_SAMPLES, window: int = WINDOW) -> tuple[Costs, str]:
    """``configured`` with its restart (grow), shrink and extension start-up costs replaced by
    the median of the latest ``window`` completed grows, shrinks and grows by extension among
    ``actions`` (newest first, as
    :meth:`~hpcsched.daemon.store.Store.actions` gives them), for each kind that has at least
    ``min_samples``; and a line saying what was used."""
    spans: dict[str, list[float]] = {ChangeKind.GROW: [], ChangeKind.SHRINK: [],
                                     ChangeKind.REFORM: []}
    for a in actions:
        s = extension_seconds(a) if a.kind == ChangeKind.REFORM else (
            resize_seconds(a) if a.kind in spans else None)
        if s is not None and len(spans[a.kind]) < window:
            spans[a.kind].append(s)
    costs, said = configured, []
    for kind, field, now in ((ChangeKind.GROW, "restart_cost", configured.restart_cost),
                             (ChangeKind.SHRINK, "shrink_cost", configured.shrink_cost),
                             (ChangeKind.REFORM, "extension_startup",
                              configured.extension_startup)):
        got = spans[kind]
        if len(got) >= min_samples:
            median = statistics.median(got)
            costs = replace(costs, **{field: median})
            said.append(f"{_NAMES[kind]} {median:.1f} s (median of the last {len(got)})")
        else:
            said.append(f"{_NAMES[kind]} {now:.1f} s (configured; {len(got)} measured)")
    return costs, "resize costs: " + ", ".join(said)


__all__ = ["MIN_SAMPLES", "WINDOW", "extension_seconds", "measured_costs", "resize_seconds"]
