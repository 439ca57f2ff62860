"""The one Slurm call a job makes on itself: release nodes from inside the allocation.

Both ways a job shrinks use it: rank 0 of the workers in an in-place shrink
(:func:`hpcsched.job.collective.ProcessGroup.shrink_in_place`) and the launcher when it
relaunches on fewer nodes (:meth:`hpcsched.job.launcher.Launcher._shrink`).

Slurm 22.05 (measured, ``docs/slurm-22.05-notes.md`` §3): ``scontrol update JobId=<id>
NumNodes=<n>`` run inside the job keeps the first ``n`` nodes of the allocation and writes
``slurm_job_<id>_resize.sh`` (the environment of the smaller allocation) into the *current
directory*; run from outside it writes nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hpcsched import slurm

log = logging.getLogger(__name__)

#: seconds to wait for ``scontrol update`` (the controller may be busy; the job waits anyway)
UPDATE_TIMEOUT = 60.0


def shrink_from_inside(job_id: str, nodes: int, job_dir: Path) -> str | None:
    """``scontrol update JobId=<job_id> NumNodes=<nodes>`` through
    :func:`hpcsched.slurm.update_job`, run in ``job_dir`` so that Slurm's resize script lands
    there (where the launcher looks for it).

    Slurm 24.11 and 26.05 refuse ``NumNodes=`` for a running job submitted with
    ``--ntasks-per-node`` (every hpcsub job) and take ``NodeList=<the nodes kept>`` instead,
    writing the same resize script (measured, ``docs/slurm-versions.md``); 22.05 takes
    ``NumNodes=`` (measured). So ``NumNodes=`` first, and on a refusal ``NodeList=`` with the
    first ``nodes`` nodes of the allocation (the ones ``NumNodes=`` keeps).

    Error policy (the same for both callers): a failed update is not fatal. By the time this
    runs a checkpoint is on disk and the workers that stay can carry on, so the job keeps
    running on the allocation Slurm left it; the failure is logged here at ERROR and returned
    for the caller to report (in the acknowledgement, or the launcher's log).

    Returns:
        None when Slurm shrank the allocation, else Slurm's error message.
    """
    try:
        # Slurm writes the resize script into scontrol's working directory
        try:
            slurm.update_job(job_id, timeout=UPDATE_TIMEOUT, cwd=job_dir, NumNodes=nodes)
        except slurm.SlurmUnavailable:
            raise
        except slurm.SlurmError as refused:
            info = slurm.job_info(job_id)
            if info is None or not info.nodes:
                raise refused
            keep = slurm.expand_hostlist(info.nodes)[:nodes]
            log.info("NumNodes=%d refused (%s); asking for NodeList=%s", nodes, refused,
                     ",".join(keep))
            slurm.update_job(job_id, timeout=UPDATE_TIMEOUT, cwd=job_dir, NodeList=",".join(keep))
    except (slurm.SlurmError, OSError) as exc:
        log.error("scontrol update JobId=%s NumNodes=%d failed: %s", job_id, nodes, exc)
        return str(exc).strip() or type(exc).__name__
    return None
