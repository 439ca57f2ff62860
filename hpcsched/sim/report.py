"""The simulator's outputs: a JSON-able summary per run, the per-job CSV, plots and a terminal table.

Inputs are :class:`~hpcsched.sim.SimResult` records. Units everywhere: seconds for times and
durations (times are from the start of the trace), GPUs, GPU-seconds; the summary's
``gpu_hours_per_job`` is the one figure in hours, and the plots and the table show hours.

* :func:`summarize` -- one run into a flat dict of plain Python values (JSON-able).
* :func:`flip_flops` -- the resizes of one job undone within two rounds.
* :func:`write_job_csv` -- one row per job.
* :func:`write_summary_json` -- several summaries into ``{"runs": [...]}``.
* :func:`plot_jct_cdf`, :func:`plot_utilization` -- PNG plots (matplotlib, Agg backend; imported
  only when a plot is drawn).
* :func:`render_table` -- a :class:`rich.table.Table` with one row per run.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcsched.sim import JobResult, SimResult

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "CSV_COLUMNS",
    "FLIP_FLOP_ROUNDS",
    "flip_flops",
    "gpu_utilization",
    "plot_jct_cdf",
    "plot_utilization",
    "render_table",
    "summarize",
    "write_job_csv",
    "write_summary_json",
]

#: The per-job CSV's columns, in order (see :func:`write_job_csv`).
CSV_COLUMNS = ("name", "application", "submit_time", "start_time", "finish_time", "jct",
               "gpu_seconds", "restarts", "resizes", "requested_gpus", "max_gpus")

#: A resize undone by the job's next resize at most this many rounds later is a flip-flop
#: (issue 9: "a resize undone within two rounds").
FLIP_FLOP_ROUNDS = 2


# --------------------------------------------------------------------------------------------
# summary


def _mean(values: Sequence[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def gpu_utilization(result: SimResult, start: float, end: float) -> float | None:
    """Busy GPU-seconds / total GPU-seconds of ``result`` over ``[start, end]`` (a fraction, 0..1).

    The ``utilization`` series ``(time, gpus_busy, gpus_total)`` is read as a step function: each
    sample holds from its time until the next sample's time (the last one until ``end``); samples
    at equal times: the last one wins. Before the first sample no GPU is busy and the cluster has
    ``result.total_gpus`` GPUs. Both integrals are taken over ``[start, end]`` only, so a sample
    before ``start`` contributes from ``start`` on and anything after ``end`` is cut off.

    Returns ``None`` when the interval is empty (``end <= start``) or holds no GPU-seconds at all.
    """
    if not end > start:
        return None
    samples = sorted(result.utilization, key=lambda s: s[0])  # stable: equal times keep order
    # breakpoints: (time, busy, total) with the state before the first sample in front
    steps: list[tuple[float, float, float]] = [(-math.inf, 0.0, float(result.total_gpus))]
    steps += [(float(t), float(b), float(n)) for t, b, n in samples]
    busy = total = 0.0
    for i, (t, b, n) in enumerate(steps):
        t_next = steps[i + 1][0] if i + 1 < len(steps) else math.inf
        lo, hi = max(t, start), min(t_next, end)
        if hi > lo:
            busy += b * (hi - lo)
            total += n * (hi - lo)
    return busy / total if total > 0 else None


def _moves(log: Sequence[tuple[float, int, int, int]]) -> list[tuple[int, int]]:
    """``(round, +1 grow / -1 shrink)`` of the entries of a resize log that change the GPUs."""
    return [(int(rnd), 1 if after > before else -1) for _, rnd, before, after in log
            if after != before]


def flip_flops(log: Sequence[tuple[float, int, int, int]], within: int = FLIP_FLOP_ROUNDS) -> int:
    """How many resizes of one job were undone within ``within`` rounds (flip-flops).

    ``log`` is the job's :attr:`~hpcsched.sim.JobResult.resize_log`, in order: ``(time s, round
    number, GPUs before, GPUs after)``. A resize is a grow when it ends with more GPUs than it
    started with, a shrink when fewer; a preemption (to 0 GPUs) is a shrink and its release (from
    0) a grow; an entry that changes nothing has no direction and is skipped. A flip-flop is a
    resize whose next resize (of the same job) goes the opposite way -- a grow then a shrink, or
    a shrink then a grow -- with a round number at most ``within`` after its own. Each resize is
    counted at most once, as the undone one: grow, shrink, grow in rounds 1, 2, 3 is 2
    flip-flops (the grow undone by the shrink, the shrink by the second grow); grow, grow, shrink
    in rounds 1, 2, 3 is 1 (only the second grow is undone). Returns a count >= 0.
    """
    moves = _moves(log)
    return sum(1 for (r0, d0), (r1, d1) in zip(moves, moves[1:])
               if d1 != d0 and r1 - r0 <= within)


def _jsonable(value: Any) -> Any:
    """``value`` with numpy scalars/arrays as Python values, tuples as lists, keys as strings;
    anything else JSON cannot hold becomes its ``str``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)


def summarize(result: SimResult) -> dict:
    """One simulation run as a flat dict of plain Python values (``json.dumps``-able).

    Keys and units:

    * ``policy``, ``workload`` -- names, from ``result``.
    * ``jobs``, ``finished``, ``unfinished`` -- counts (``unfinished``: no ``finish_time``, the
      simulation ended first).
    * ``avg_jct``, ``median_jct``, ``p99_jct`` -- job completion time (finish - submit) in
      seconds, over the finished jobs only; ``p99_jct`` is ``numpy.percentile(jcts, 99)`` with
      numpy's default linear interpolation.
    * ``makespan`` -- seconds from the first submit (over all jobs) to the last finish.
    * ``gpu_utilization`` -- busy GPU-seconds / total GPU-seconds (fraction, 0..1) over the
      simulated span from the first submit to the last finish, integrating the ``utilization``
      series as a step function: each sample holds until the next (see :func:`gpu_utilization`).
    * ``gpu_hours_per_job`` -- mean over all jobs of ``gpu_seconds / 3600`` (GPU-hours).
    * ``restarts_per_job``, ``resizes_per_job`` -- means over all jobs.
    * ``resizes`` -- resize events over all jobs' ``resize_log`` (entries that change the GPUs,
      preemptions and releases included); ``flip_flops`` -- how many of them were undone within
      :data:`FLIP_FLOP_ROUNDS` rounds (:func:`flip_flops`, summed over jobs);
      ``flip_flop_fraction`` -- ``flip_flops / resizes`` (0..1), ``None`` without resizes.
    * ``rounds`` -- how many times the policy ran; ``wall_seconds`` -- the simulator's own run
      time (s); ``params`` -- the run's parameters (numpy values converted, tuples as lists).

    * with other users' plain jobs in the workload (:attr:`hpcsched.sim.WorkloadJob.rigid`):
      ``plain_jobs`` (count), ``plain_avg_wait`` and ``plain_p99_wait`` (s from submission to
      start, over those that started), and ``elastic_avg_jct``, ``elastic_p99_jct`` (s, over
      hpcsched's finished jobs); the JCT figures above stay over all jobs.

    Figures that are not defined are ``None``: the JCT figures, ``makespan`` and
    ``gpu_utilization`` when no job finished; the per-job means when there are no jobs.
    """
    jobs = result.jobs
    jcts = [float(j.jct) for j in jobs if j.jct is not None]
    finished = [j for j in jobs if j.finish_time is not None]
    if finished:
        first_submit = float(min(j.submit_time for j in jobs))
        last_finish = float(max(j.finish_time for j in finished))
        makespan: float | None = last_finish - first_submit
        utilization = gpu_utilization(result, first_submit, last_finish)
    else:
        makespan = utilization = None
    resizes = sum(len(_moves(j.resize_log)) for j in jobs)
    flips = sum(flip_flops(j.resize_log) for j in jobs)
    return {
        "policy": result.policy,
        "workload": result.workload,
        "jobs": len(jobs),
        "finished": len(finished),
        "unfinished": len(jobs) - len(finished),
        "avg_jct": _mean(jcts),
        "median_jct": float(np.median(jcts)) if jcts else None,
        "p99_jct": _p99(jcts),
        "makespan": makespan,
        "gpu_utilization": utilization,
        "gpu_hours_per_job": _mean([float(j.gpu_seconds) / 3600.0 for j in jobs]),
        "restarts_per_job": _mean([float(j.restarts) for j in jobs]),
        "resizes_per_job": _mean([float(j.resizes) for j in jobs]),
        "resizes": resizes,
        "flip_flops": flips,
        "flip_flop_fraction": flips / resizes if resizes else None,
        **_mixed(jobs),
        "rounds": int(result.rounds),
        "wall_seconds": float(result.wall_seconds),
        "params": _jsonable(dict(result.params)),
    }


def _p99(values: Sequence[float]) -> float | None:
    return float(np.percentile(values, 99)) if values else None


def _mixed(jobs: Sequence[JobResult]) -> dict:
    """:func:`summarize`'s figures of a mixed workload (none when no job is rigid)."""
    plain = [j for j in jobs if j.rigid]
    if not plain:
        return {}
    waits = [float(j.wait) for j in plain if j.wait is not None]
    elastic = [float(j.jct) for j in jobs if not j.rigid and j.jct is not None]
    return {"plain_jobs": len(plain), "plain_avg_wait": _mean(waits), "plain_p99_wait": _p99(waits),
            "elastic_avg_jct": _mean(elastic), "elastic_p99_jct": _p99(elastic)}


# --------------------------------------------------------------------------------------------
# files


def _prepare(path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _cell(value: Any) -> Any:
    return "" if value is None else value


def _job_row(job: JobResult) -> dict[str, Any]:
    return {"name": job.name, "application": job.application, "submit_time": job.submit_time,
            "start_time": _cell(job.start_time), "finish_time": _cell(job.finish_time),
            "jct": _cell(job.jct), "gpu_seconds": job.gpu_seconds, "restarts": job.restarts,
            "resizes": job.resizes, "requested_gpus": job.requested_gpus,
            "max_gpus": job.max_gpus}


def write_job_csv(result: SimResult, path: str | Path) -> Path:
    """Write one CSV row per job of ``result`` (in ``result.jobs`` order) to ``path``.

    Columns (:data:`CSV_COLUMNS`): ``name, application, submit_time, start_time, finish_time,
    jct, gpu_seconds, restarts, resizes, requested_gpus, max_gpus`` -- times and ``jct`` in
    seconds, ``gpu_seconds`` in GPU-seconds, GPU counts in GPUs. A ``None`` (a job that never
    started or did not finish) is an empty cell. Floats are written with ``repr``, so they read
    back exactly. Creates the parent directories; returns the path.
    """
    path = _prepare(path)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for job in result.jobs:
            writer.writerow(_job_row(job))
    return path


def write_summary_json(summaries: Sequence[dict], path: str | Path) -> Path:
    """Write ``{"runs": [summary, ...]}`` (the dicts of :func:`summarize`, in the given order) to
    ``path`` as indented JSON.

    Nothing else is added: when several policies ran on the same workload, compare them by
    grouping ``runs`` on their ``workload`` key. Creates the parent directories; returns the path.
    """
    path = _prepare(path)
    path.write_text(summary_json(summaries), encoding="utf-8")
    return path


def summary_json(summaries: Sequence[dict]) -> str:
    """:func:`write_summary_json`'s text: ``{"runs": [summary, ...]}``, indented, with a final
    newline."""
    return json.dumps({"runs": [_jsonable(dict(s)) for s in summaries]}, indent=2) + "\n"


# --------------------------------------------------------------------------------------------
# plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextmanager
def _png(path: str | Path, figsize: tuple[float, float], legend: bool) -> Iterator:
    """Axes to draw on; written to ``path`` as PNG (with a legend if asked) when the block ends
    without error. The figure is closed either way."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=figsize)
    try:
        yield ax
        if legend:
            ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=120)
    finally:
        plt.close(fig)


def _labels(results: Sequence[SimResult]) -> list[str]:
    """The policy, plus the workload when the results span several workloads."""
    several = len({r.workload for r in results}) > 1
    return [f"{r.policy} ({r.workload})" if several else r.policy for r in results]


def plot_jct_cdf(results: Sequence[SimResult], path: str | Path) -> Path:
    """Plot the CDF of the finished jobs' JCT, one curve per result, to a PNG at ``path``.

    x: JCT in hours on a log axis; y: fraction of that run's finished jobs with a JCT at most x.
    Curves are labelled with the policy (and the workload when the results span several); a run
    with unfinished jobs says ``k/n finished`` in its label, and a run with no finished job is
    listed in the legend without a curve. Creates the parent directories; returns the path.
    """
    path = _prepare(path)
    with _png(path, (7, 4.5), legend=bool(results)) as ax:
        plotted = False
        for r, label in zip(results, _labels(results)):
            jcts = np.sort([j.jct for j in r.jobs if j.jct is not None]) / 3600.0
            n, k = len(r.jobs), len(jcts)
            if k < n:
                label += f", {k}/{n} finished"
            if k == 0:
                ax.plot([], [], label=label)
                continue
            jcts = np.maximum(jcts, 1e-6)  # a log axis cannot show 0
            frac = np.arange(1, k + 1) / k
            ax.step(np.concatenate(([jcts[0]], jcts)), np.concatenate(([0.0], frac)),
                    where="post", label=label)
            plotted = True
        ax.set_xscale("log")
        if not plotted:
            ax.set_xlim(1e-2, 1e2)
            ax.text(0.5, 0.5, "no finished jobs", transform=ax.transAxes, ha="center")
        ax.set_ylim(0.0, 1.02)
        ax.set_xlabel("job completion time (hours, log scale)")
        ax.set_ylabel("fraction of finished jobs")
        ax.set_title("JCT CDF")
        ax.grid(True, which="both", alpha=0.3)
    return path


def plot_utilization(results: Sequence[SimResult], path: str | Path) -> Path:
    """Plot GPU utilization (busy / total GPUs, 0..1) against time (hours from the start of the
    trace), one step line per result, to a PNG at ``path``.

    Each sample of ``result.utilization`` holds until the next one (steps drawn ``where="post"``);
    a sample with no GPUs in the cluster shows as 0. Labels as in :func:`plot_jct_cdf`. Creates
    the parent directories; returns the path.
    """
    path = _prepare(path)
    with _png(path, (8, 4.5), legend=bool(results)) as ax:
        for r, label in zip(results, _labels(results)):
            samples = sorted(r.utilization, key=lambda s: s[0])
            t = np.array([s[0] for s in samples], dtype=float) / 3600.0
            frac = np.array([s[1] / s[2] if s[2] else 0.0 for s in samples], dtype=float)
            ax.step(t, frac, where="post", label=label)
        ax.set_ylim(0.0, 1.05)
        ax.set_xlabel("time (hours)")
        ax.set_ylabel("GPU utilization (busy / total)")
        ax.set_title("GPU utilization")
        ax.grid(True, alpha=0.3)
    return path


# --------------------------------------------------------------------------------------------
# terminal


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600.0:.2f}"


def _flip_flop_cell(summary: dict) -> str:
    flips, resizes = summary.get("flip_flops"), summary.get("resizes")
    if flips is None or resizes is None:
        return "-"
    return f"{flips}/{resizes}" + (f" ({100.0 * flips / resizes:.1f}%)" if resizes else "")


def render_table(summaries: Sequence[dict]) -> Table:
    """A :class:`rich.table.Table` with one row per summary (from :func:`summarize`).

    Columns: policy, workload, jobs (``finished/total``), average, median and p99 JCT and the
    makespan in hours (2 decimals), GPU utilization in percent (1 decimal), restarts per job
    (2 decimals), flip-flops as ``flip-flops/resizes (percent, 1 decimal)`` (``0/0`` without
    resizes). Undefined figures show as ``-``.
    """
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    table.add_column("POLICY")
    table.add_column("WORKLOAD")
    for col in ("JOBS", "AVG JCT (h)", "MEDIAN JCT (h)", "P99 JCT (h)", "MAKESPAN (h)",
                "GPU UTIL (%)", "RESTARTS/JOB", "FLIP-FLOPS"):
        table.add_column(col, justify="right")
    for s in summaries:
        util = s.get("gpu_utilization")
        restarts = s.get("restarts_per_job")
        table.add_row(
            str(s.get("policy", "-")), str(s.get("workload", "-")),
            f"{s.get('finished', 0)}/{s.get('jobs', 0)}",
            _hours(s.get("avg_jct")), _hours(s.get("median_jct")), _hours(s.get("p99_jct")),
            _hours(s.get("makespan")),
            "-" if util is None else f"{100.0 * util:.1f}",
            "-" if restarts is None else f"{restarts:.2f}",
            _flip_flop_cell(s),
        )
    return table
