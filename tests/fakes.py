"""The one Slurm fake of the unit tests: the round's observation (``observe``, as a
:class:`~hpcsched.slurm.observe.Backend`) and the actuator's, the reaper's and ``hpcsched
resize``'s :class:`~hpcsched.slurm.control.SlurmControl`, over jobs given as
:class:`~hpcsched.slurm.JobInfo`, with Slurm 22.05's rules for what the daemon does to them
(``docs/slurm-22.05-notes.md`` §3):

* ``scontrol requeue`` of a running job: PENDING, one more restart, ``Reason=BeginTime``, no
  nodes, and Slurm holds it until its begin time, now + 121 s (the credential expiry window);
  a pending job cannot be requeued ("Job is pending execution").
* ``scontrol update StartTime=now`` on a pending job starts it at once when it fits (``fits``),
  on ``node_count`` nodes; ``StartTime=now+N`` moves its begin time; a job that is no longer
  pending refuses it ("no longer pending": :func:`~hpcsched.slurm.control.set_start_time`
  reads that as "started meanwhile"). A begin time that merely passes waits for Slurm's
  periodic scheduling pass (measured on 22.05.8): :meth:`FakeSlurm.schedule`, which no call
  runs by itself.
* ``scontrol update NumNodes=a-b`` sets its node count (the smaller bound).

Every call is recorded in :attr:`FakeSlurm.calls` as ``(name, job_id)`` or, for ``update``,
``(name, job_id, fields)``; ``refuse`` makes a call raise (key: the call's name, or ``(name,
job_id)``), after recording it; ``forbid`` names calls a test must not see (they fail it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from hpcsched import slurm
from hpcsched.protocol.kinds import SlurmState
from hpcsched.slurm.observe import Observation

#: seconds Slurm 22.05 holds a requeued job (``Reason=BeginTime``) unless given a StartTime
REQUEUE_HOLD_S = 121.0


def hostlist(count: int) -> str:
    """The fake's node names for ``count`` nodes: ``n1``, ``n[1-2]``, ..."""
    return "" if count <= 0 else "n1" if count == 1 else f"n[1-{count}]"


class FakeSlurm:
    """Slurm over the jobs ``infos`` (module docstring).

    Args:
        infos: the jobs, each a :class:`~hpcsched.slurm.JobInfo`.
        refuse: call name, or ``(call name, job id)`` -> the exception that call raises.
        forbid: call names that fail the test (an :class:`AssertionError`), e.g. ``job`` where
            the round's observation must do.
        clock: seconds now (Slurm's clock for begin times); default :func:`time.time`.
        fits: whether a pending job can start now; default: always.
    """

    name = "fake"

    def __init__(self, *infos: slurm.JobInfo, refuse: Mapping[object, Exception] | None = None,
                 forbid: Iterable[str] = (), clock: Callable[[], float] = time.time,
                 fits: Callable[[slurm.JobInfo], bool] = lambda job: True):
        self.jobs: dict[str, slurm.JobInfo] = {i.job_id: i for i in infos}
        self.calls: list[tuple] = []
        self.cancelled: list[str] = []
        self.refuse = dict(refuse or {})
        self.forbid = frozenset(forbid)
        self.clock, self.fits = clock, fits

    # -- one job ------------------------------------------------------------------------------

    @property
    def info(self) -> slurm.JobInfo:
        """The only job (tests of one job's resize)."""
        (job,) = self.jobs.values()
        return job

    @info.setter
    def info(self, job: slurm.JobInfo) -> None:
        self.jobs[job.job_id] = job

    def count(self, name: str, **fields: object) -> int:
        """How many ``name`` calls were made (with these ``update`` fields, if given)."""
        return sum(1 for c in self.calls if c[0] == name
                   and all(k in (c[2] if len(c) > 2 else {}) and c[2][k] == v
                           for k, v in fields.items()))

    # -- what the daemon sees -----------------------------------------------------------------

    def observe(self, jobs_only: bool = False) -> Observation:
        """``squeue`` and ``sinfo`` (``jobs_only``: ``squeue``): every job, no nodes (2 Slurm
        calls, 1 with ``jobs_only``)."""
        return Observation(time.time(), (), MappingProxyType(dict(self.jobs)), 1 if jobs_only else 2)

    def with_planned_nodes(self, obs: Observation) -> Observation:
        """``obs``: the fake's jobs say their planned nodes themselves (0 calls)."""
        return obs

    def job(self, job_id: str) -> slurm.JobInfo | None:
        self._call("job", job_id)
        return self.jobs.get(job_id)

    # -- what the daemon does -----------------------------------------------------------------

    def update(self, job_id: str, **fields: object) -> None:
        self._call("update", job_id, fields)
        j = self.jobs[job_id]
        if "NumNodes" in fields:
            j = replace(j, node_count=int(str(fields["NumNodes"]).split("-")[0]))
        if "StartTime" in fields:
            if j.state != SlurmState.PENDING:
                raise slurm.SlurmError(f"scontrol update JobId={job_id} StartTime: Job is no "
                                       f"longer pending execution for job {job_id}")
            when = str(fields["StartTime"])
            begin = self.clock() + (float(when[4:]) if when.startswith("now+") else 0.0)
            j = replace(j, start_time=begin)
        self.jobs[job_id] = j
        if fields.get("StartTime") == "now":
            self.schedule(job_id)

    def requeue(self, job_id: str) -> None:
        """Slurm's requeue: PENDING with one more restart, held until now + 121 s."""
        self._call("requeue", job_id)
        j = self.jobs[job_id]
        if j.state == SlurmState.PENDING:
            raise slurm.SlurmError(f"scontrol requeue {job_id}: Job is pending execution for "
                                   f"job {job_id}")
        self.jobs[job_id] = replace(j, state=SlurmState.PENDING.value, nodes="",
                                    restarts=j.restarts + 1, state_reason="BeginTime",
                                    start_time=self.clock() + REQUEUE_HOLD_S)

    def hold(self, job_id: str) -> None:
        self._call("hold", job_id)

    def release(self, job_id: str) -> None:
        self._call("release", job_id)

    def cancel(self, *job_ids: str) -> None:
        """``scancel`` of each, in one command as Slurm's: a refused job does not stop the
        others, and the error names each refused one as scancel does (``Kill job error on job
        id <id>: ...``); an unreachable controller cancels none."""
        errors = []
        for job_id in job_ids:
            try:
                self._call("cancel", job_id)
            except slurm.SlurmUnavailable:
                raise
            except slurm.SlurmError as exc:
                errors.append(f"scancel: error: Kill job error on job id {job_id}: {exc}")
                continue
            self.cancelled.append(job_id)
        if errors:
            raise slurm.SlurmError("\n".join(errors))

    # -- Slurm's rules ------------------------------------------------------------------------

    def _call(self, name: str, job_id: str, fields: dict | None = None) -> None:
        if name in self.forbid:
            raise AssertionError(f"the test forbids {name} (job {job_id})")
        self.calls.append((name, job_id) if fields is None else (name, job_id, fields))
        exc = self.refuse.get((name, job_id), self.refuse.get(name))
        if exc is not None:
            raise exc

    def schedule(self, *job_ids: str) -> None:
        """Slurm's scheduling pass: start the pending jobs (``job_ids``, else all) whose begin
        time has come and that fit, RUNNING on their node count, started now."""
        now = self.clock()
        for job_id in job_ids or tuple(self.jobs):
            j = self.jobs[job_id]
            if (j.state == SlurmState.PENDING and j.start_time is not None and j.start_time <= now
                    and self.fits(j)):
                self.jobs[job_id] = replace(j, state=SlurmState.RUNNING.value,
                                            nodes=hostlist(j.node_count), state_reason="None",
                                            start_time=now)


__all__ = ["REQUEUE_HOLD_S", "FakeSlurm", "hostlist"]
