"""What a replay reads from Slurm: the cluster's shape and each job's submit/start/end.

Sources (Slurm 22.05; ``docs/slurm-22.05-notes.md``):

* ``sinfo --json`` (:func:`hpcsched.slurm.parse.parse_sinfo_json`): nodes and GPUs per node of
  the partition.
* ``squeue --json --states=all``, polled every few seconds while the replay runs: the job's
  state, ``submit_time``, ``start_time``, ``end_time`` (epoch seconds; 24.11+ wraps them as
  ``{"set", "infinite", "number"}``) and ``restart_cnt``. A finished job stays listed for
  ``MinJobAge`` (300 s on the dev cluster), so a poll every few seconds reads every job's end.
  After a requeue Slurm rewrites ``submit_time`` to the requeue's time and ``start_time`` to
  the latest start (measured: a job submitted 08:43:03 and requeued at 08:43:06 reads
  ``submit_time`` 08:43:06), so the *original* submit is the first one seen
  (:class:`JobRecord` keeps it). While a job runs, ``end_time`` is its time limit: read only
  once the job has ended.
* ``sacct -X -P -n --duplicates`` when the accounting database is on: every record of the job,
  the first one's ``Submit`` the original submit, one ``REQUEUED`` record per requeue. Used only
  for a job that left ``squeue`` before its end was read (the replay was stopped longer than
  ``MinJobAge``); without accounting such a job is reported ``VANISHED``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from hpcsched.model.snapshot import NodeView
from hpcsched.protocol.kinds import SlurmState
from hpcsched.replay import ReplayError
from hpcsched.replay.plan import ClusterShape
from hpcsched.slurm import commands
from hpcsched.slurm.errors import SlurmError
from hpcsched.slurm.parse import parse_squeue_json

#: a job in one of these states has ended for good (squeue(1) JOB STATE CODES)
ENDED = SlurmState.ENDED


def cluster_shape(nodes: Sequence[NodeView], partition: str | None) -> ClusterShape:
    """``nodes`` x GPUs per node of ``partition`` (every node when None): the fewest GPUs any
    of its nodes has, so every job the plan makes fits any node.

    Raises:
        ReplayError: the partition has no node, or no GPUs.
    """
    mine = [n for n in nodes if partition is None or partition in n.partitions]
    if not mine:
        raise ReplayError(f"partition {partition!r} has no nodes" if partition
                          else "Slurm lists no nodes")
    gpus = min(n.gpus for n in mine)
    if gpus < 1:
        raise ReplayError(f"{'partition ' + repr(partition) if partition else 'the cluster'} has "
                          "a node without GPUs (gres/gpu)")
    return ClusterShape(len(mine), gpus, partition)


def read_cluster_shape(partition: str | None, timeout: float = commands.DEFAULT_TIMEOUT
                       ) -> ClusterShape:
    """:func:`cluster_shape` of ``sinfo --json``. Raises SlurmError, SlurmUnavailable,
    ReplayError."""
    return cluster_shape(commands.nodes(timeout=timeout), partition)


@dataclass(frozen=True)
class JobTimes:
    """One job at one poll: Slurm's state, its times (epoch seconds; None when unset; ``end``
    only once the job has ended) and requeues so far."""

    job_id: str
    state: str
    submit: float | None
    start: float | None
    end: float | None
    restarts: int

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def parse_job_times(text: str | bytes) -> dict[str, JobTimes]:
    """``squeue --json`` into ``{job id: JobTimes}``.

    Raises:
        SlurmUnavailable, SlurmError: as :func:`hpcsched.slurm.parse.parse_squeue_json`.
    """
    return {i.job_id: JobTimes(i.job_id, i.state, i.submit_time, i.start_time,
                               i.end_time if i.state in ENDED else None, i.restarts)
            for i in parse_squeue_json(text).values()}


def poll(timeout: float = commands.DEFAULT_TIMEOUT) -> dict[str, JobTimes]:
    """Every job Slurm holds, now (one ``squeue --json --states=all``)."""
    return parse_job_times(commands.run(["squeue", "--json", "--states=all"], timeout=timeout))


@dataclass(frozen=True)
class JobRecord:
    """What a replay knows of one of its jobs, merged over polls: the original ``submit`` (the
    first seen), the latest ``start``, the ``end``, the last ``state`` and ``requeues``."""

    job_id: str
    state: str = SlurmState.PENDING
    submit: float | None = None
    start: float | None = None
    end: float | None = None
    requeues: int = 0

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def seen(self, t: JobTimes) -> JobRecord:
        """This record after a poll that saw ``t``."""
        return replace(self, state=t.state, submit=self.submit if self.submit is not None
                       else t.submit, start=t.start if t.start is not None else self.start,
                       end=t.end, requeues=max(self.requeues, t.restarts))


# ---------------------------------------------------------------------------------- sacct

SACCT_FIELDS = "JobID,State,Submit,Start,End"


def _sacct_time(text: str) -> float | None:
    """``2026-11-24T08:43:03`` (local time) as epoch seconds; None for Unknown/None/empty."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def parse_sacct(text: str) -> dict[str, JobRecord]:
    """``sacct -X -P -n --duplicates -o JobID,State,Submit,Start,End`` into a record per job:
    submit of the first record (the original submission), state/start/end of the last, one
    requeue per ``REQUEUED`` record. ``CANCELLED by 0`` reads ``CANCELLED``; lines that are not
    five fields are skipped."""
    rows: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        f = line.split("|")
        if len(f) != 5 or not f[0].strip():
            continue
        rows.setdefault(f[0].strip(), []).append(f)
    out = {}
    for job, recs in rows.items():
        last = recs[-1]
        state = (last[1].split() or ["UNKNOWN"])[0]
        out[job] = JobRecord(job, state, _sacct_time(recs[0][2]), _sacct_time(last[3]),
                             _sacct_time(last[4]) if state in ENDED else None,
                             sum(1 for r in recs if r[1].startswith(SlurmState.REQUEUED)))
    return out


def read_sacct(job_ids: Sequence[str], timeout: float = commands.DEFAULT_TIMEOUT
               ) -> dict[str, JobRecord]:
    """:func:`parse_sacct` for ``job_ids``; ``{}`` when accounting is off (sacct fails)."""
    if not job_ids:
        return {}
    try:
        text = commands.run(["sacct", "-X", "-P", "-n", "--duplicates", "-o", SACCT_FIELDS,
                             "-j", ",".join(job_ids)], timeout=timeout)
    except SlurmError:
        return {}
    return parse_sacct(text)
