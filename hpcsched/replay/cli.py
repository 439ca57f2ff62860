"""``hpcsched replay``: the command (docs/replay.md).

Every error a user can cause or meet (a workload that cannot be read or emulated, Slurm down,
hpcsub or the script missing, Slurm lost mid-run) ends with one line ``hpcsched replay: error:
...`` and exit status 2 (before anything was submitted) or 1 (during the run); Ctrl-C writes
what it has, says which jobs were submitted and where the partial results are, cancels nothing
(the jobs are the user's: ``scancel`` them if wanted) and exits 130.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from hpcsched.protocol.kinds import Granularity
from hpcsched.replay import ReplayError
from hpcsched.resources import shared

#: the emulated application (issue 11's part 1), as installed (:mod:`hpcsched.resources`)
DEFAULT_SCRIPT = shared("jobscripts") / "examples" / "emulated.py"


def _fail(msg: str, status: int = 2) -> None:
    click.echo(f"hpcsched replay: error: {msg}", err=True)
    sys.exit(status)


def _default_partition() -> str | None:
    """The first partition the daemon manages (its jobs elsewhere are not resized), else None."""
    from hpcsched.daemon.config import ConfigError, load

    try:
        parts = load().daemon.partitions
    except ConfigError:
        return None
    return parts[0] if parts else None


def _daemon_granularity() -> Granularity:
    """What the daemon's plans may ask for (``daemon.plan_granularity``; ``"node"`` when its
    configuration cannot be read): the replay's jobs get the limits the simulator gives them
    there, so the simulated replay and the daemon plan alike."""
    from hpcsched.daemon.config import ConfigError, load

    try:
        return load().daemon.plan_granularity
    except ConfigError:
        return Granularity.NODE


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in s)


def _plan_table(plan):
    from rich.table import Table

    t = Table(box=None, header_style="bold")
    for col in ("#", "NAME", "APP", "AT (s)", "SHAPE", "BATCH", "RANGE", "MAX N", "TIME",
                "SEED"):
        t.add_column(col, justify="left" if col in ("NAME", "APP") else "right", no_wrap=True)
    for p in plan:
        lim = p.limits
        t.add_row(str(p.index), p.name + (" (plain)" if p.rigid else ""), p.application,
                  f"{p.submit_at:.1f}",
                  f"{p.nodes}x{p.gpus_per_node}",
                  str(p.batch_size), f"{lim.min_batch_size}-{lim.max_batch_size}",
                  str(lim.max_nodes), f"{p.time_limit} min", str(p.seed))
    return t


def _progress_text(tracked) -> str:
    from hpcsched.replay.watch import counts

    c = counts(tracked)
    return (f"finished {c['finished']}  running {c['running']}  pending {c['pending']}  "
            f"to submit {c['waiting']}  failed {c['failed']}")


def _run(replay, console) -> None:
    """``replay.run()`` under a progress bar (jobs ended / all)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from hpcsched.replay.watch import counts

    with Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        task = bar.add_task("starting", total=len(replay.plan))

        def update(tracked):
            c = counts(tracked)
            bar.update(task, completed=c["finished"] + c["failed"],
                       description=_progress_text(tracked))

        replay.on_update = update
        replay.on_refused = lambda t: console.print(
            f"[yellow]refused:[/] {t.planned.name}: {t.refused} (the replay goes on)")
        replay.run()


def _save(out: Path, meta: dict, replay, started: float) -> dict:
    """Write the run's files from ``replay.tracked``; returns the summary."""
    from hpcsched.replay.report import as_result, job_rows, startup_seconds, summarize_real, write_run

    startups = {t.job_id: startup_seconds(t.job_id, t.record.start)
                for t in replay.tracked if t.job_id and t.record}
    rows = job_rows(replay.tracked, replay.start, startups)
    meta = dict(meta, start=replay.start, wall_seconds=time.time() - started)
    result = as_result(rows, meta["workload_name"], meta["nodes"] * meta["gpus_per_node"],
                       meta["wall_seconds"], {"scale": meta["scale"], "seed": meta["seed"]})
    summary = summarize_real(result)
    write_run(out, meta, rows, summary)
    return summary


def _summary_line(s: dict) -> str:
    def sec(key):
        return "-" if s.get(key) is None else f"{s[key]:.0f} s"
    return (f"{s['finished']}/{s['jobs']} jobs finished; JCT avg {sec('avg_jct')}, median "
            f"{sec('median_jct')}, p99 {sec('p99_jct')}; makespan {sec('makespan')}; "
            f"requeues/job {s['restarts_per_job'] or 0:.2f}")


def _interrupted(out: Path, meta: dict, replay, started: float) -> None:
    _save(out, dict(meta, interrupted=True), replay, started)
    ids = [t.job_id for t in replay.tracked if t.job_id]
    left = [t.job_id for t in replay.tracked if t.job_id and not t.done]
    click.echo(f"hpcsched replay: interrupted: {len(ids)} of {len(replay.tracked)} jobs submitted"
               f" ({', '.join(ids) or 'none'}); still in Slurm, not cancelled: "
               f"{' '.join(left) or 'none'}; partial results in {out}/", err=True)
    sys.exit(130)


def _compare(out: Path, policy: str | None, restart_cost: float | None, console) -> None:
    from dataclasses import replace

    from hpcsched.replay import compare
    from hpcsched.replay.report import read_run

    meta, _ = read_run(out)
    start = float(meta.get("start", 0.0))
    settings = compare.load_settings(policy, (start, start + float(meta.get("wall_seconds", 0))))
    if restart_cost is not None:
        settings = replace(settings, restart_cost=restart_cost, restart_measured=True,
                           costs_note=f"{settings.costs_note}; start/restart cost "
                                      f"{restart_cost:g} s (--restart-cost)")
    doc = compare.compare_run(out, settings)
    console.print(f"simulated: policy {settings.policy}, grow {settings.grow}, round "
                  f"{settings.interval:g} s; {doc['costs']}")
    real, sim = doc["runs"]
    console.print(compare.render(real, sim, doc["jct_ratio"]))
    console.print(f"JCT CDF: {out / 'jct-cdf.png'}")


def _plan(workload: str, scale: float, seed: int, partition: str | None, script: str,
          out: Path | None, rigid_fraction: float = 0.0):
    """``(workload name, jobs, shape, plan)``; Slurm is asked for the cluster's shape."""
    from hpcsched.replay.plan import check_emulatable, make_plan
    from hpcsched.replay.slurmread import read_cluster_shape
    from hpcsched.sim.workload import load_workload, make_rigid

    name, jobs = load_workload(workload, seed=seed)
    if rigid_fraction:
        jobs = make_rigid(jobs, rigid_fraction)
        name += f" ({rigid_fraction:g} plain)"
    check_emulatable(jobs)   # before Slurm is asked anything
    shape = read_cluster_shape(partition)
    plan = make_plan(jobs, shape, scale, script=script, seed=seed,
                     output_dir=str(out) if out else None, granularity=_daemon_granularity())
    return name, jobs, shape, plan


@click.command("replay")
@click.argument("workload", required=False)
@click.option("--scale", type=click.FloatRange(min=0, min_open=True, max=1), default=1.0,
              show_default=True, help="Multiplies arrival times and every job's work (0 < F <= 1).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Results folder (default ./replay-<workload>-<timestamp>/).")
@click.option("--compare", is_flag=True,
              help="After the run, simulate the same scaled workload and print real vs simulated.")
@click.option("--policy", default=None,
              help="With --compare: the policy to simulate (default: the daemon's configured "
                   "one; static for a replay without the daemon).")
@click.option("--restart-cost", type=click.FloatRange(min=0), default=None,
              help="With --compare: seconds the simulation charges a start or restart (default: "
                   "the daemon's measured grows, else the replay's measured start-ups).")
@click.option("--from", "from_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="With --compare: compare a finished replay's folder instead of running one.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Workload seed (philly:COUNT) and first per-job seed of the emulation.")
@click.option("--partition", default=None,
              help="Slurm partition (default: the first the daemon manages).")
@click.option("--script", type=click.Path(dir_okay=False), default=str(DEFAULT_SCRIPT),
              show_default=False, help="The emulated application (default "
              "jobscripts/examples/emulated.py).")
@click.option("--poll", type=click.FloatRange(min=0.5), default=5.0, show_default=True,
              help="Seconds between polls of squeue.")
@click.option("--rigid-fraction", type=click.FloatRange(min=0, max=1), default=0.0,
              show_default=True,
              help="Submit this fraction of the jobs (every 1/F-th) as other users' plain "
                   "sbatch jobs: their GPUs for their run time alone at their submitted size "
                   "(a sleep), hpcsched not involved; the summary adds their wait "
                   "(as simulate --rigid-fraction).")
@click.option("--dry-run", is_flag=True, help="Print the plan; submit nothing.")
def replay_command(workload, scale, out_dir, compare, policy, restart_cost, from_dir, seed,
                   partition, script, poll, rigid_fraction, dry_run):
    """Submit WORKLOAD's jobs to Slurm with hpcsub at their arrival times, as the emulated
    application (other users' plain jobs with sbatch, --rigid-fraction), wait for them, and
    report their JCTs (docs/replay.md).

    \b
    Examples:
      hpcsched replay pollux:1@0.5 --scale 0.05 --dry-run
      hpcsched replay my-workload.csv --scale 0.1 --compare
      hpcsched replay --from replay-my-workload.csv-20261124-0900 --compare --policy static
    """
    from rich.console import Console

    from hpcsched.replay.report import write_workload
    from hpcsched.replay.submit import find_hpcsub
    from hpcsched.sim.workload import WorkloadError
    from hpcsched.slurm.errors import SlurmError

    if from_dir:
        if not compare or workload:
            raise click.UsageError("--from DIR compares a finished replay: give --compare and "
                                   "no WORKLOAD")
        try:
            _compare(Path(from_dir), policy, restart_cost, Console())
        except ReplayError as exc:
            _fail(str(exc))
        return
    if not workload:
        raise click.UsageError("missing WORKLOAD (or --from DIR --compare)")
    partition = partition or _default_partition()
    out = Path(out_dir or f"replay-{_safe(workload)}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    try:
        name, jobs, shape, plan = _plan(workload, scale, seed, partition, script, out,
                                        rigid_fraction)
        if dry_run:
            Console().print(_plan_table(plan))
            click.echo(f"{len(plan)} jobs on {shape.nodes} x {shape.gpus_per_node} GPUs"
                       f"{' in ' + shape.partition if shape.partition else ''}; nothing submitted")
            return
        hpcsub = find_hpcsub()
        if not Path(script).is_file():
            raise ReplayError(f"emulated application {script} not found (give --script)")
    except (WorkloadError, ReplayError) as exc:
        _fail(str(exc))
    except SlurmError as exc:
        _fail(f"Slurm: {exc}")
    meta = {"workload": os.path.abspath(workload) if Path(workload).is_file() else workload,
            "workload_name": name, "scale": scale, "seed": seed, "partition": shape.partition,
            "nodes": shape.nodes, "gpus_per_node": shape.gpus_per_node, "script": script,
            "interrupted": False,
            "workload_file": write_workload(out, jobs).name}
    _execute(out, meta, plan, hpcsub, poll, (policy, restart_cost) if compare else None)


def _execute(out: Path, meta: dict, plan, hpcsub: str, poll: float,
             compare: tuple[str | None, float | None] | None) -> None:
    """Run the replay, write and print its results, then compare if asked."""
    from rich.console import Console

    from hpcsched.replay.watch import Replay

    console = Console(stderr=True)
    out.mkdir(parents=True, exist_ok=True)
    replay = Replay(plan, hpcsub, cwd=str(out), poll_interval=poll)
    started = time.time()
    try:
        _run(replay, console)
    except KeyboardInterrupt:
        _interrupted(out, meta, replay, started)
    except ReplayError as exc:
        _save(out, dict(meta, interrupted=True), replay, started)
        _fail(f"{exc}; partial results in {out}/", status=1)
    Console().print(_summary_line(_save(out, meta, replay, started)))
    console.print(f"results in {out}/")
    if compare:
        try:
            _compare(out, *compare, Console())
        except ReplayError as exc:
            _fail(str(exc), status=1)
