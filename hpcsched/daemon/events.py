"""When the daemon wants a round before the next periodic one (``daemon.event_rounds``, for a
policy that rounds on events, and ``daemon.event_poll``): a managed job ended or found no room,
or another user's GPU job started pending (pure; :func:`hpcsched.daemon.service._between_rounds`
looks between rounds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hpcsched.model.snapshot import ForeignJob
from hpcsched.protocol.kinds import SlurmState
from hpcsched.slurm.parse import ACTIVE_STATES


def round_event(before: Mapping[str, str], after: Mapping[str, str]) -> str | None:
    """Why a policy that rounds on events (``round_on_events``) wants a round now, or None.

    ``before`` is the last round's managed jobs (Slurm job id -> Slurm state), ``after`` the
    same map observed since. A job *ended* when it was active in ``before`` (a state of
    :data:`~hpcsched.slurm.parse.ACTIVE_STATES`, as :attr:`JobInfo.active`) and is gone or no
    longer active in ``after``; it counts only while some managed job is still active (else
    there is nothing to decide, as in the simulator). A job was *submitted* when it is not in
    ``before`` and is PENDING in ``after`` (Slurm found no room for it). A job that started, or
    was requeued by a resize, is no event. Returns e.g. ``"job 123 ended, job 124 submitted"``.
    """
    ended = [j for j, s in before.items()
             if s in ACTIVE_STATES and after.get(j) not in ACTIVE_STATES]
    if ended and not any(s in ACTIVE_STATES for s in after.values()):
        ended = []
    submitted = [j for j, s in after.items() if j not in before and s == SlurmState.PENDING]
    reasons = [f"job {j} ended" for j in ended] + [f"job {j} submitted" for j in submitted]
    return ", ".join(reasons) or None


def foreign_event(before: frozenset[str], pending: Sequence[ForeignJob],
                  managed: Mapping[str, str]) -> str | None:
    """Why a round is wanted now for other users' jobs, or None: a pending GPU job hpcsched does
    not manage (:func:`~hpcsched.daemon.views.foreign_pending`) that was not pending at the last
    round (``before``: their job ids), while some managed job runs (its extension GPUs may be
    what the newcomer needs: :mod:`hpcsched.policies.neighbours`). So another user's job waits
    for at most ``daemon.event_poll`` seconds, not a whole round, before hpcsched yields to it.
    Returns e.g. ``"job 130 of user bob pends"``."""
    if not any(s == SlurmState.RUNNING for s in managed.values()):
        return None
    new = [f"job {f.job_id} of user {f.user} pends" for f in pending if f.job_id not in before]
    return ", ".join(new) or None
