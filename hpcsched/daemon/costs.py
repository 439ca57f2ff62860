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

Grows by extension allocation (issue 10; ``daemon.grow = "extension"``) cost the configured
``extension_startup`` and ``extension_stall`` (:class:`~hpcsched.policies.reconcile.Costs`), which
this module leaves as they are: they are measured by ``benchmarks/resize_latency.py`` (the
new workers' start-up, and the stall of the running ranks' steps) until the journal records
extension grows. The median grow measured here is a requeue's span, checkpoint to first
step, and prices what still restarts a job (starts, preemptions, releases, requeue grows).
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


def resize_seconds(action: ActionRow) -> float | None:
    """Seconds the job trained on nothing during ``action``: from ``checkpointed`` to
    ``running`` in its phase history; ``None`` when it did not get there (failed, still open,
    or a change that never checkpoints: batch-only, pending)."""
    times = dict(action.history)
    start, end = times.get(ResizePhase.CHECKPOINTED), times.get(ResizePhase.RUNNING)
    if start is None or end is None or end < start:
        return None
    return end - start


def measured_costs(actions: Iterable[ActionRow], configured: Costs,
                   min_samples: int = MIN_SAMPLES, window: int = WINDOW) -> tuple[Costs, str]:
    """``configured`` with its restart (grow) and shrink costs replaced by the median of the
    latest ``window`` completed grows and shrinks among ``actions`` (newest first, as
    :meth:`~hpcsched.daemon.store.Store.actions` gives them), for each kind that has at least
    ``min_samples``; and a line saying what was used."""
    spans: dict[str, list[float]] = {ChangeKind.GROW: [], ChangeKind.SHRINK: []}
    for a in actions:
        s = resize_seconds(a) if a.kind in spans else None
        if s is not None and len(spans[a.kind]) < window:
            spans[a.kind].append(s)
    costs, said = configured, []
    for kind, field, now in ((ChangeKind.GROW, "restart_cost", configured.restart_cost),
                             (ChangeKind.SHRINK, "shrink_cost", configured.shrink_cost)):
        got = spans[kind]
        if len(got) >= min_samples:
            median = statistics.median(got)
            costs = replace(costs, **{field: median})
            said.append(f"{kind} {median:.1f} s (median of the last {len(got)})")
        else:
            said.append(f"{kind} {now:.1f} s (configured; {len(got)} measured)")
    return costs, "resize costs: " + ", ".join(said)


__all__ = ["MIN_SAMPLES", "WINDOW", "measured_costs", "resize_seconds"]
