"""A replay's outputs: ``run.json`` (what was replayed), ``jobs.csv`` (one row per job) and
``summary.json`` (the keys of ``hpcsched simulate --json``), and reading them back.

Times are seconds from the replay's start (``run.json`` ``start``, epoch seconds), as the
simulator's are from the start of the trace. A job's JCT is its end minus its *original*
submission (:attr:`hpcsched.replay.watch.Tracked.submit_time`), and only a job that ended
``COMPLETED`` has one: a failed, cancelled, timed-out, refused or vanished job is reported
with its state and counts as unfinished.

The summary is :func:`hpcsched.sim.report.summarize` of the real run as a
:class:`~hpcsched.sim.SimResult` (policy ``real``), so the JCT figures and the makespan mean
what they mean for a simulation; the figures a replay does not measure (GPU utilization,
GPU-hours, resizes and flip-flops, rounds) are ``None``, and ``restarts_per_job`` counts Slurm
requeues.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcsched.protocol.kinds import SlurmState
from hpcsched.replay import ReplayError
from hpcsched.replay.watch import Tracked
from hpcsched.sim import JobResult, SimResult

#: the per-job CSV's columns, in order
CSV_COLUMNS = ("name", "application", "job_id", "planned_submit", "submit_time", "start_time",
               "end_time", "jct", "gpus", "final_state", "requeues", "startup", "rigid")
#: summary keys a replay does not measure (None in its summary)
NOT_MEASURED = ("gpu_utilization", "gpu_hours_per_job", "resizes_per_job", "resizes",
                "flip_flops", "flip_flop_fraction", "rounds")
REAL = "real"


def _rel(t: float | None, start: float) -> float | None:
    return None if t is None else t - start


def startup_seconds(job_id: str, started: float | None) -> float | None:
    """Seconds from Slurm's (latest) start of ``job_id`` to its first step: the first record of
    rank 0's metrics in its latest launch (``<job dir>/metrics/launch-N-rank-0.jsonl``, field
    ``t``; not an extension's newcomers' ``launch-N-ext-J-rank-0.jsonl``); None when the job
    directory or the record cannot be read. Slurm's start is whole seconds, so this reads up to
    1 s long."""
    from hpcsched.protocol.jobdir import JobDir, JobNotFound

    if started is None:
        return None
    try:
        metrics = JobDir.for_job(job_id).metrics_dir
        # the primary's rank 0 (an extension's newcomers write launch-N-ext-J-rank-R.jsonl)
        files = sorted((p for p in metrics.glob("launch-*-rank-0.jsonl")
                        if re.fullmatch(r"launch-\d+-rank-0\.jsonl", p.name)),
                       key=lambda p: int(p.name.split("-")[1]))
        if not files:
            return None
        with files[-1].open(encoding="utf-8") as f:
            first = json.loads(f.readline())
        return max(0.0, float(first["t"]) - started)
    except (JobNotFound, OSError, ValueError, KeyError, TypeError):   # not measured
        return None


def job_rows(tracked: Sequence[Tracked], start: float,
             startups: dict[str, float | None] | None = None) -> list[dict[str, Any]]:
    """One dict per job (keys :data:`CSV_COLUMNS`), times from ``start``; ``jct`` only for a
    ``COMPLETED`` job; ``startup`` from ``startups`` (by job id; see :func:`startup_seconds`)."""
    startups = startups or {}
    rows = []
    for t in tracked:
        rec, p = t.record, t.planned
        submit = _rel(t.submit_time, start)
        end = _rel(rec.end, start) if rec else None
        done = t.state == SlurmState.COMPLETED and end is not None and submit is not None
        rows.append({"name": p.name, "application": p.application, "job_id": t.job_id,
                     "planned_submit": p.submit_at, "submit_time": submit,
                     "start_time": _rel(rec.start, start) if rec else None, "end_time": end,
                     "jct": end - submit if done else None, "gpus": p.gpus,
                     "final_state": t.state, "requeues": rec.requeues if rec else 0,
                     "startup": startups.get(t.job_id), "rigid": int(p.rigid)})
    return rows


def as_result(rows: Sequence[dict[str, Any]], workload: str, total_gpus: int,
              wall_seconds: float, params: dict) -> SimResult:
    """The real run as a :class:`SimResult` (policy ``real``): a job finished iff it has a
    JCT; a job never submitted counts as submitted at its planned time."""
    jobs = []
    for r in rows:
        submit = r["submit_time"] if r["submit_time"] is not None else r["planned_submit"]
        finish = submit + r["jct"] if r["jct"] is not None else None
        jobs.append(JobResult(name=r["name"], application=r["application"], submit_time=submit,
                              start_time=r["start_time"], finish_time=finish, gpu_seconds=0.0,
                              restarts=int(r["requeues"] or 0), resizes=0,
                              requested_gpus=int(r["gpus"]), max_gpus=int(r["gpus"]),
                              rigid=bool(r.get("rigid"))))
    return SimResult(policy=REAL, workload=workload, jobs=tuple(jobs), utilization=(),
                     total_gpus=total_gpus, rounds=0, wall_seconds=wall_seconds, params=params)


def summarize_real(result: SimResult) -> dict:
    """:func:`hpcsched.sim.report.summarize` with :data:`NOT_MEASURED` set to None."""
    from hpcsched.sim.report import summarize

    s = summarize(result)
    s.update(dict.fromkeys(NOT_MEASURED))
    return s


def _cell(v: Any) -> Any:
    return "" if v is None else v


def write_run(out: Path, meta: dict, rows: Sequence[dict[str, Any]], summary: dict) -> None:
    """``run.json`` (``meta``), ``jobs.csv`` (``rows``) and ``summary.json`` (``{"runs":
    [summary]}``, as ``simulate --json``) into ``out`` (created)."""
    from hpcsched.sim.report import write_summary_json

    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    with (out / "jobs.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r[k]) for k in CSV_COLUMNS})
    write_summary_json([summary], out / "summary.json")


#: the replayed workload, as run (Pollux format), in a replay's folder
WORKLOAD_FILE = "workload.csv"


def write_workload(out: Path, jobs: Sequence) -> Path:
    """The workload jobs (:class:`~hpcsched.sim.WorkloadJob`, Pollux applications' convergence
    jobs) as a Pollux-format CSV ``out/workload.csv``, unscaled, so that a comparison
    simulates exactly what was replayed (a ``store`` or ``philly`` spec read later could give
    other jobs); its ``rigid`` column marks other users' plain jobs. Returns the path."""
    from hpcsched.sim.workload import POLLUX_COLUMNS

    out.mkdir(parents=True, exist_ok=True)
    path = out / WORKLOAD_FILE
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow((*POLLUX_COLUMNS, "rigid"))
        for j in jobs:
            w.writerow([j.name, repr(float(j.submit_time)), j.application, j.gpus, j.batch_size,
                        int(j.rigid)])
    return path


def _num(text: str, kind=float):
    return None if text == "" else kind(text)


def read_run(out: Path) -> tuple[dict, list[dict[str, Any]]]:
    """``(run.json, jobs.csv rows)`` of a replay's directory, rows typed as
    :func:`job_rows` makes them.

    Raises:
        ReplayError: the directory is not a replay's (a file missing or unreadable).
    """
    try:
        meta = json.loads((out / "run.json").read_text(encoding="utf-8"))
        with (out / "jobs.csv").open(newline="", encoding="utf-8") as f:
            raw = list(csv.DictReader(f))
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{out}: not a replay's directory ({exc})") from None
    rows = []
    for r in raw:
        try:
            rows.append({"name": r["name"], "application": r["application"],
                         "job_id": r["job_id"] or None,
                         "planned_submit": float(r["planned_submit"]),
                         **{k: _num(r[k]) for k in ("submit_time", "start_time", "end_time",
                                                    "jct")},
                         "gpus": int(r["gpus"]), "final_state": r["final_state"],
                         "requeues": _num(r["requeues"], int) or 0,
                         "startup": _num(r.get("startup") or ""),
                         "rigid": _num(r.get("rigid") or "0", int)})
        except (KeyError, ValueError) as exc:
            raise ReplayError(f"{out / 'jobs.csv'}: bad row {r!r:.120} ({exc})") from None
    return meta, rows
