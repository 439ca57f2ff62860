"""``static``: what plain Slurm does -- every job runs at the size and batch size it was submitted
with, first come first served. The baseline the other policies are measured against, and a safe
mode for the daemon (it then only observes and records).

Running jobs get no target (nothing to change). Pending jobs that fit, in submission order, in
the GPUs the running jobs leave get a target at their submitted size: the same size, so on its
own the plan changes nothing (Slurm starts them as it would), but a placement stage
(``--placement``, :mod:`hpcsched.policies.placement`) then chooses their nodes -- PAL's
evaluation runs FIFO allocation under each placement in exactly this way (Jain et al., SC'24,
§V). A job that does not fit gets no target: Slurm's backfill may still start a smaller job
behind it, as it would without hpcsched. With ``backfill=False`` the plan stops at the first
job that does not fit (strict FIFO, PAL's scheduler); that only holds back jobs Slurm would not
start anyway, i.e. jobs held until a round places them (``--hold-new-jobs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, Plan
from hpcsched.policies.base import Params, stateless
from hpcsched.policies.common import admit_fifo, capacity, pending_fifo, running


@dataclass(frozen=True)
class StaticParams(Params):
    """``static``'s parameters (:func:`decide`'s keywords).

    Attributes:
        backfill: a job that does not fit lets later jobs that fit start (``True``, Slurm's
            way) or stops the walk (``False``: strict FIFO, PAL's).
    """

    backfill: bool = True


def decide(snapshot: ClusterSnapshot, seed: int = 0, *, backfill: bool = True) -> Plan:
    """Targets only for pending jobs that fit now, FIFO, at their submitted size (module
    docstring). Objective: the GPUs hpcsched jobs hold or are about to. ``seed`` is unused.

    Args:
        backfill: see :class:`StaticParams` (which checks it when the policy is made).
    """
    held = sum(j.gpus for j in running(snapshot))
    waiting = [j for j in pending_fifo(snapshot) if not j.busy]
    admitted, _ = admit_fifo(waiting, capacity(snapshot) - held, lambda j: j.gpus, backfill)
    targets = tuple(JobTarget(j.job_id, j.nodes, j.batch_size,
                              "static: starts at its submitted size (FIFO)") for j in admitted)
    return Plan("static", targets, objective=float(held + sum(j.gpus for j in admitted)))


#: the ``static`` policy's factory: ``Static(**params)`` (:class:`StaticParams`)
Static = stateless("static", decide, StaticParams)
