"""GPUs each node has left for the jobs a placement stage (re)places (module docstring of
:mod:`hpcsched.policies.placement`, "Capacity"). Pure."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from hpcsched.model.snapshot import ClusterSnapshot, NodeView, Plan
from hpcsched.protocol.kinds import SlurmState


def capacity_left(plan: Plan, snapshot: ClusterSnapshot, replaced: Collection[str],
                  usable: Mapping[str, NodeView]) -> dict[str, int]:
    """Free GPUs per usable node before any of the ``replaced`` jobs is placed: the node's GPUs
    minus those of unmanaged jobs (``other_gpus_allocated``, or more if ``gpus_allocated`` shows
    GPUs no managed job explains) and minus the GPUs of running managed jobs that stay where they
    are (not re-placed, and not given 0 nodes by the plan unless ``busy``). May be negative."""
    targeted = {t.job_id: t for t in plan.targets}
    other = dict(snapshot.other_gpus_allocated)
    managed_now: dict[str, int] = {}
    stays_on: dict[str, int] = {}
    for j in snapshot.jobs:
        if j.state != SlurmState.RUNNING:
            continue
        t = targeted.get(j.job_id)
        stays = j.job_id not in replaced and not (t is not None and t.nodes <= 0 and not j.busy)
        for n in set(j.node_names):
            managed_now[n] = managed_now.get(n, 0) + j.workers_per_node
            if stays:
                stays_on[n] = stays_on.get(n, 0) + j.workers_per_node
    free = {}
    for name, node in usable.items():
        unmanaged = max(other.get(name, 0), node.gpus_allocated - managed_now.get(name, 0), 0)
        free[name] = node.gpus - unmanaged - stays_on.get(name, 0)
    return free
