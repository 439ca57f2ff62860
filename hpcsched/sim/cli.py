"""``hpcsched simulate``: replay workloads under one or more policies and compare them.

Every (workload, policy, placement) combination is one simulation
(:class:`hpcsched.sim.engine.Simulator`); ``--jobs N`` runs N of them at once in separate
processes. Results: a table on the terminal, and with ``--json PATH`` the summaries
(:func:`hpcsched.sim.report.summarize`), with ``--out DIR`` also per-job CSVs, the summaries and
plots (JCT CDF, GPU utilization over time).

BLAS and OpenMP thread pools are pinned to one thread for the whole run, in this process and in
every worker process (:func:`single_threaded_blas`): a simulation is single-threaded Python, and
OpenBLAS otherwise kept a second thread spinning beside it (about 0.9 CPU-seconds per second), so
``--jobs N`` used twice the cores it asked for.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click

from hpcsched.model.snapshot import EXTENSION_STALL, EXTENSION_STARTUP, GRANULARITIES, GROW_MODES
from hpcsched.perf.shared import THROUGHPUT_MODELS
from hpcsched.policies import POLICIES, PolicyError
from hpcsched.policies.placement import PLACEMENTS
from hpcsched.protocol.kinds import Granularity, GrowMode

# Pollux's re-implementation of Tiresias (simulator/tiresias.py): 2 queues at 16 GPU-hours.
POLLUX_TIRESIAS = {"queue_thresholds": [16 * 3600.0]}


@dataclass(frozen=True)
class Run:
    """One simulation to make (picklable: it crosses to worker processes)."""

    workload: str
    policy: str
    placement: str | None
    params: tuple[tuple[str, object], ...]
    nodes: int
    gpus_per_node: int
    interval: float
    restart_cost: tuple[tuple[str, float], ...]
    shrink_cost: float
    variability: bool | str     # False, True / "longhorn", or "pal" (SimConfig.variability)
    locality_penalty: float
    seed: int
    max_time: float
    hold_new_jobs: bool = False
    granularity: Granularity = Granularity.NODE
    grow: GrowMode = GrowMode.EXTENSION     # SimConfig.grow
    extension_startup: float = EXTENSION_STARTUP
    extension_stall: float = EXTENSION_STALL
    scale: float = 1.0                      # arrivals and work x scale (SimConfig.work_scale)
    soft_consolidate: bool = False          # SimConfig.soft_consolidate
    fastest_gpus: bool = False              # SimConfig.fastest_gpus
    throughput_model: str = "shared"        # SimConfig.throughput_model
    event_rounds: bool = True               # SimConfig.event_rounds
    rigid_fraction: float = 0.0             # workload.make_rigid: other users' plain jobs
    keep_free_gpus: int = 0                 # Costs.keep_free (daemon.keep_free_gpus)

    @property
    def label(self) -> str:
        return self.policy + (f"+{self.placement}" if self.placement else "")


def _limit_blas(limits: int = 1):
    """Limit the BLAS and OpenMP thread pools of this process to ``limits`` threads (threadpoolctl);
    returns the ``threadpool_limits`` object (``restore_original_limits()`` undoes it). The
    simulator is imported first, so that numpy's and scipy's BLAS libraries are loaded and limited
    both (threadpoolctl only reaches libraries already loaded)."""
    from threadpoolctl import threadpool_limits

    import hpcsched.sim.engine  # noqa: F401 -- loads numpy's and scipy's BLAS

    return threadpool_limits(limits=limits)


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Within the block, BLAS and OpenMP use one thread (the limits before are restored after).
    For anything that runs simulations in this process: ``hpcsched simulate``, benchmarks."""
    limiter = _limit_blas(1)
    try:
        yield
    finally:
        limiter.restore_original_limits()


_WORKER_LIMITS: list = []


def _init_worker() -> None:
    """Initializer of ``--jobs N``'s worker processes: one BLAS thread for the process's life."""
    _WORKER_LIMITS.append(_limit_blas(1))


def execute(run: Run):
    """Run one simulation; returns its :class:`~hpcsched.sim.SimResult` (label as policy)."""
    from dataclasses import replace

    from hpcsched.sim.engine import SimConfig, Simulator
    from hpcsched.sim.workload import load_workload, make_rigid, scale_workload

    name, jobs = load_workload(run.workload, seed=run.seed)
    jobs = scale_workload(jobs, run.scale)
    if run.rigid_fraction:
        jobs = make_rigid(jobs, run.rigid_fraction)
        name += f" ({run.rigid_fraction:g} plain)"
    params = dict(run.params)
    if run.placement:
        params["placement"] = run.placement
    cfg = SimConfig(nodes=run.nodes, gpus_per_node=run.gpus_per_node, interval=run.interval,
                    restart_cost=dict(run.restart_cost), shrink_cost=run.shrink_cost,
                    variability=run.variability, locality_penalty=run.locality_penalty,
                    seed=run.seed, max_time=run.max_time, hold_new_jobs=run.hold_new_jobs,
                    granularity=run.granularity, grow=run.grow,
                    extension_startup=run.extension_startup, extension_stall=run.extension_stall,
                    work_scale=run.scale, soft_consolidate=run.soft_consolidate,
                    fastest_gpus=run.fastest_gpus, throughput_model=run.throughput_model,
                    event_rounds=run.event_rounds,
                    costs=replace(SimConfig.costs, keep_free=run.keep_free_gpus))
    res = Simulator(jobs, run.policy, policy_params=params, config=cfg,
                    workload_name=name).run()
    return replace(res, policy=run.label)


def _restart_costs(values: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    out = {"*": 30.0}
    for v in values:
        app, _, sec = v.rpartition("=")
        try:
            s = float(sec)
        except ValueError:
            raise click.BadParameter(f"{v!r}: expected SECONDS or APPLICATION=SECONDS",
                                     param_hint="--restart-cost") from None
        if s < 0:
            raise click.BadParameter(f"{v!r}: seconds must be >= 0", param_hint="--restart-cost")
        out[app or "*"] = s
    return tuple(sorted(out.items()))


def _params(values: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """``POLICY.KEY=VALUE`` -> {policy: {key: value}}; VALUE is JSON when it parses, else a
    string."""
    out: dict[str, dict[str, object]] = {}
    for v in values:
        key, eq, raw = v.partition("=")
        pol, dot, name = key.partition(".")
        if not (eq and dot and pol and name):
            raise click.BadParameter(f"{v!r}: expected POLICY.KEY=VALUE", param_hint="--param")
        if pol not in POLICIES:
            raise click.BadParameter(f"{v!r}: unknown policy {pol!r} (choose from "
                                     f"{', '.join(POLICIES)})", param_hint="--param")
        try:
            val = json.loads(raw)
        except json.JSONDecodeError:
            val = raw
        out.setdefault(pol, {})[name] = val
    return out


@click.command("simulate")
@click.option("--workload", "-w", "workloads", multiple=True, required=True, metavar="SPEC",
              help="CSV file (Pollux or PAL/Blox format), or pollux:N[@LOAD], pal:N, "
                   "philly:COUNT, store[:URL]. Repeatable.")
@click.option("--policy", "-p", "policies", multiple=True, required=True,
              type=click.Choice(POLICIES), help="Policy to run. Repeatable: one run each.")
@click.option("--placement", "placements", multiple=True, type=click.Choice(PLACEMENTS),
              help="Placement stage added to every policy (repeatable; default: none, Slurm "
                   "places).")
@click.option("--param", "raw_params", multiple=True, metavar="POLICY.KEY=VALUE",
              help="A policy parameter, e.g. tiresias.queue_thresholds=[57600] (VALUE in JSON).")
@click.option("--pollux-tiresias/--no-pollux-tiresias", default=True, show_default=True,
              help="Run tiresias with the thresholds of Pollux's baseline (2 queues at 16 "
                   "GPU-hours) unless --param sets them.")
@click.option("--nodes", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--interval", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds between policy rounds.")
@click.option("--restart-cost", "restart_cost", multiple=True, metavar="[APP=]SECONDS",
              help="Seconds a start or restart costs (default 30, Pollux's); APP=SECONDS for "
                   "one application. Repeatable.")
@click.option("--shrink-cost", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Seconds an in-place shrink costs.")
@click.option("--variability/--no-variability", default=False, show_default=True,
              help="Per-GPU slowdowns drawn from PAL's Longhorn measurements.")
@click.option("--variability-draws", type=click.Choice(("longhorn", "pal")), default="longhorn",
              show_default=True,
              help="With --variability: longhorn, one draw per GPU shared by the classes; pal, "
                   "PAL's simulator's independent draw per GPU and class (docs/simulator.md).")
@click.option("--locality-penalty", type=click.FloatRange(min=1), default=1.7,
              show_default=True, help="Slowdown of a fixed-work (PAL trace) job across nodes.")
@click.option("--hold-new-jobs", is_flag=True,
              help="What-if: jobs arrive held and start only when the policy's plan gives them "
                   "GPUs (and nodes: lets a placement stage place every job).")
@click.option("--soft-consolidate", is_flag=True,
              help="A PAL trace job that cannot get its shape (no node with its GPUs free) "
                   "takes any free GPUs, packed, and pays --locality-penalty across nodes "
                   "(PAL's Packed-Sticky baseline); default: it waits, as on Slurm.")
@click.option("--fastest-gpus", is_flag=True,
              help="What-if: a job started on whole nodes (node granularity, or a PAL trace's "
                   "jobs) takes the free GPUs of each node that are fastest for its class "
                   "(PAL's simulator places on GPUs); default: the lowest-numbered, as Slurm. "
                   "A GPU-granular job's GPUs are Slurm's either way.")
@click.option("--granularity", type=click.Choice([g.value for g in GRANULARITIES]),
              default=Granularity.NODE.value,
              show_default=True,
              help="gpu: plans may give a job any GPUs per node (4 + 2), made real by the "
                   "daemon's rules (a start at the job's fewest GPUs, grows by extension, shrinks "
                   "by release; docs/daemon.md): what the daemon does by default; node: whole "
                   "nodes x the GPUs per node it was submitted with (the daemon's granularity = "
                   "node). gpu with --grow requeue is a what-if: the daemon needs extension jobs "
                   "for GPU-granular plans.")
@click.option("--grow", type=click.Choice([g.value for g in GROW_MODES]), default=GrowMode.EXTENSION.value,
              show_default=True,
              help="How a running job grows: extension, a second Slurm job whose workers start "
                   "while the job trains on, then join it after a short stall; requeue, the job "
                   "gives its GPUs back and restarts at the new size (pays --restart-cost).")
@click.option("--throughput-model", type=click.Choice(THROUGHPUT_MODELS), default="shared",
              show_default=True,
              help="How the policies predict step times: shared, the application's prior "
                   "corrected by what all its jobs measured (as the daemon); fitted, Pollux's "
                   "model fitted to each job's own measurements.")
@click.option("--event-rounds/--no-event-rounds", default=True, show_default=True,
              help="For a policy that asks for them (jct), also run a round the moment a job "
                   "ends or a submitted job finds no room, as the daemon does "
                   "(daemon.event_rounds); off: every --interval seconds only.")
@click.option("--extension-startup", type=click.FloatRange(min=0), default=EXTENSION_STARTUP,
              show_default=True,
              help="Seconds an extension's new workers take to start (the job trains on at its "
                   "old size meanwhile).")
@click.option("--extension-stall", type=click.FloatRange(min=0), default=EXTENSION_STALL,
              show_default=True,
              help="Seconds every rank stalls when an extension's workers join the group.")
@click.option("--scale", type=click.FloatRange(min=0, max=1, min_open=True), default=1.0,
              show_default=True,
              help="Time scale in (0, 1]: every submit time and every job's work x SCALE (what "
                   "'hpcsched replay --scale' and the emulated application's --scale run).")
@click.option("--rigid-fraction", type=click.FloatRange(min=0, max=1), default=0.0,
              show_default=True,
              help="Make this fraction of each workload's jobs other users' plain sbatch jobs "
                   "(every 1/F-th in submission order): they run at their submitted size, are "
                   "never resized, and the policy sees them only as Slurm shows them (GPUs "
                   "held, or a pending request its grows yield to). The summary adds their "
                   "wait and the elastic jobs' JCT.")
@click.option("--keep-free-gpus", type=click.IntRange(min=0), default=0, show_default=True,
              help="GPUs no grow takes, kept free for other users' jobs not yet submitted "
                   "(daemon.keep_free_gpus): lent GPUs are released to keep them free.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-days", type=click.FloatRange(min=0.01), default=60.0, show_default=True,
              help="Stop a simulation after this many simulated days.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True),
              default=None, help="Write the summaries here as JSON ('-': on stdout, instead of "
              "the table).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write per-job CSVs, summary.json and plots into this folder.")
@click.option("--jobs", "-j", "n_procs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Simulations to run at once (processes).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no table.")
def simulate_command(workloads, policies, placements, raw_params, pollux_tiresias, nodes,
                     gpus_per_node, interval, restart_cost, shrink_cost, variability,
                     variability_draws, locality_penalty, hold_new_jobs, soft_consolidate,
                     fastest_gpus, granularity, grow, throughput_model, event_rounds,
                     extension_startup,
                     extension_stall, scale, rigid_fraction, keep_free_gpus, seed, max_days,
                     json_path, out_dir, n_procs, quiet):
    """Replay WORKLOADs on a simulated Slurm cluster with the daemon's own POLICYs.

    \b
    Examples:
      hpcsched simulate -w pollux:1 -p tiresias -p dp -p ones-pal
      hpcsched simulate -w pal:1 -p static --placement packed --placement pal --variability
      hpcsched simulate -w pollux:3@2.0 -p dp --json dp.json --out results/
      hpcsched simulate -w pollux:1 -p dp --granularity gpu
      hpcsched simulate -w pollux:1 -p jct --grow requeue
      hpcsched simulate -w pollux:1 -p jct --scale 0.05
      hpcsched simulate -w pollux:1 -p jct -p static --granularity gpu --rigid-fraction 0.3
    """
    from hpcsched.sim.engine import SimulationError
    from hpcsched.sim.workload import WorkloadError, load_workload

    params = _params(raw_params)
    if pollux_tiresias and "queue_thresholds" not in params.get("tiresias", {}):
        params.setdefault("tiresias", {}).update(POLLUX_TIRESIAS)
    _check_params(policies, placements, params)
    costs = _restart_costs(restart_cost)
    if variability and variability_draws == "pal":
        variability = "pal"
    for w in workloads:   # fail fast, before any simulation, on a bad workload
        try:
            load_workload(w, seed=seed)
        except WorkloadError as exc:
            raise click.UsageError(str(exc)) from None
    runs = [Run(w, p, pl, tuple(sorted(params.get(p, {}).items(), key=lambda kv: kv[0])),
                nodes, gpus_per_node, interval, costs, shrink_cost, variability,
                locality_penalty, seed, max_days * 86400.0, hold_new_jobs, Granularity(granularity), GrowMode(grow),
                extension_startup, extension_stall, scale, soft_consolidate, fastest_gpus,
                throughput_model, event_rounds, rigid_fraction, keep_free_gpus)
            for w in workloads for p in policies for pl in (placements or (None,))]
    try:
        with single_threaded_blas():
            results = _run_all(runs, n_procs, quiet)
    except (SimulationError, WorkloadError, PolicyError) as exc:
        click.echo(f"hpcsched simulate: error: {exc}", err=True)
        sys.exit(2)
    _report(results, json_path, out_dir, quiet)


def _check_params(policies: tuple[str, ...], placements: tuple[str, ...],
                  params: dict[str, dict[str, object]]) -> None:
    """Fail fast, before any simulation: make every policy with its parameters and each
    placement stage; a bad key or value exits 2 with the policy's one-line error (it lists the
    valid keys)."""
    from hpcsched.policies import make_policy

    for p in policies:
        for pl in placements or (None,):
            try:
                make_policy(p, {**params.get(p, {}), **({"placement": pl} if pl else {})})
            except PolicyError as exc:
                click.echo(f"hpcsched simulate: error: {exc}", err=True)
                sys.exit(2)


def _run_all(runs: list[Run], n_procs: int, quiet: bool) -> list:
    """Every run's :class:`~hpcsched.sim.SimResult`, in the order of ``runs``, ``n_procs`` at a
    time, with a progress bar on stderr unless ``quiet``."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    results = [None] * len(runs)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True),
                  disable=quiet, transient=False) as bar:
        task = bar.add_task("simulating", total=len(runs))
        if n_procs == 1 or len(runs) == 1:
            for i, r in enumerate(runs):
                bar.update(task, description=f"{r.label} on {r.workload}")
                results[i] = execute(r)
                bar.advance(task)
        else:
            with ProcessPoolExecutor(max_workers=n_procs, initializer=_init_worker) as pool:
                futs = {pool.submit(execute, r): i for i, r in enumerate(runs)}
                for f in as_completed(futs):
                    results[futs[f]] = f.result()
                    bar.advance(task)
    return results


def _report(results: list, json_path: str | None, out_dir: str | None, quiet: bool) -> None:
    """The table on stdout (unless ``quiet``), the summaries as JSON, and the per-job CSVs,
    summaries and plots in ``out_dir``."""
    from rich.console import Console

    from hpcsched.sim import report

    summaries = [report.summarize(r) for r in results]
    if not quiet and json_path != "-":
        Console().print(report.render_table(summaries))
    if json_path == "-":
        click.echo(report.summary_json(summaries), nl=False)
    elif json_path:
        report.write_summary_json(summaries, Path(json_path))
    if out_dir:
        out = Path(out_dir)
        for r in results:
            stem = f"{_safe(r.workload)}--{_safe(r.policy)}"
            report.write_job_csv(r, out / f"{stem}.csv")
        report.write_summary_json(summaries, out / "summary.json")
        report.plot_jct_cdf(results, out / "jct-cdf.png")
        report.plot_utilization(results, out / "utilization.png")
        if not quiet:
            Console(stderr=True).print(f"results in {out}/")


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in s)
