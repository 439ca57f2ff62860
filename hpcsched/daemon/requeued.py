"""Jobs that requeued themselves on Slurm's signal: the daemon starts them again at once.

A job near its time limit checkpoints on Slurm's ``SIGUSR1`` and its launcher runs ``scontrol
requeue`` on it (:mod:`hpcsched.job.launcher`, ``docs/control-protocol.md``, "Slurm's own
signals"). Slurm then holds the requeued job for 121 s (``Reason=BeginTime``: the credential
expiry window plus one second, ``docs/slurm-22.05-notes.md`` §3), which no one inside the job
can shorten: once it is PENDING the daemon sends ``scontrol update StartTime=now``, as it does
after its own requeues, and Slurm starts the job as soon as it fits.

:func:`to_release` is pure (the jobs' Slurm records and launcher states in, job ids out);
:func:`release_requeued` reads the launcher states and sends the updates.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from hpcsched import slurm
from hpcsched.daemon.phases import REQUEUE_START_DELAY_S
from hpcsched.protocol import files as ctl
from hpcsched.protocol.kinds import LauncherPhase, SlurmState
from hpcsched.slurm.control import SlurmControl, set_start_time

log = logging.getLogger("hpcsched.daemon.requeued")


def to_release(jobs: Mapping[str, tuple[slurm.JobInfo, ctl.LauncherState | None]],
               busy: Collection[str], now: float) -> list[str]:
    """The jobs to send ``StartTime=now``: PENDING with ``Reason=BeginTime``, whose launcher
    said it requeued the job itself (phase ``requeued``, written just before the requeue) more
    than :data:`~hpcsched.daemon.phases.REQUEUE_START_DELAY_S` seconds ago (a job started
    within a second of its requeue is killed by slurmd, ``docs/control-protocol.md``), and
    with no requeue of the daemon's open (``busy``: a grow or preemption by requeue sets its
    own start time; a job that requeued itself in the middle of any other resize, such as a
    reform by extension, is released like any other).
    ``now``: Unix seconds."""
    return sorted(job_id for job_id, (info, state) in jobs.items()
                  if info.state == SlurmState.PENDING and info.state_reason == "BeginTime"
                  and job_id not in busy and state is not None
                  and state.phase == LauncherPhase.REQUEUED
                  and now - state.time >= REQUEUE_START_DELAY_S + 1)


def release_requeued(managed: Mapping[str, tuple], busy: Collection[str], control: SlurmControl,
                     now: float, dry_run: bool = False) -> list[str]:
    """Send ``StartTime=now`` to :func:`to_release`'s jobs among ``managed`` (job id ->
    ``(JobDir, JobSpec, JobInfo)``); returns the ids released. A launcher state that cannot be
    read counts as none; a job that started meanwhile is not an error; Slurm trouble is logged
    and left to the next round."""
    jobs = {}
    for job_id, (jd, _spec, info) in managed.items():
        if info.state != SlurmState.PENDING:
            continue
        try:
            jobs[job_id] = (info, ctl.read_launcher_state(jd.launcher_path, jd.uid))
        except (ctl.ProtocolError, TypeError):
            jobs[job_id] = (info, None)
    released = []
    for job_id in to_release(jobs, busy, now):
        if dry_run:
            log.info("job %s requeued itself on Slurm's signal: would start it now", job_id)
            continue
        try:
            if set_start_time(control, job_id, "now"):
                log.info("job %s requeued itself on Slurm's signal: StartTime=now", job_id)
                released.append(job_id)
        except slurm.SlurmError as exc:
            log.warning("job %s requeued itself; StartTime=now failed (%s): next round retries",
                        job_id, exc)
    return released


__all__ = ["release_requeued", "to_release"]
