"""Real against simulated: the simulator on a replay's scaled workload, its cluster shape, the
daemon's policy and grow mode and this cluster's measured resize costs.

What the simulation is given (so that it predicts the run the replay made):

* the workload of ``run.json`` (the copy in the replay's folder, ``workload.csv``, when there is
  one), arrivals x scale (:func:`hpcsched.sim.workload.scale_workload`)
  and work x scale (``SimConfig.work_scale``): simulated seconds are the replay's seconds;
* the cluster ``nodes x gpus_per_node`` read from Slurm when the replay ran;
* the daemon's configuration (:func:`hpcsched.daemon.config.load`): ``[policy]`` name, seed and
  parameters (``--policy`` overrides the name: ``static`` for a replay without the daemon), round
  interval, grow mode, no-thrash hold, ``min_gain`` and ``horizon``;
* the resize costs :func:`hpcsched.daemon.costs.measured_costs` gives from the store's journal
  (the median of the latest completed resizes of a kind once 3 exist, else the configured
  value; the line saying which is :attr:`Settings.costs_note`). The simulator charges the
  restart cost at every start, the first included; so when the journal holds fewer than 3
  completed grows by requeue (the daemon grows by extension by default), the restart cost is
  the median start-up the replay's own jobs measured (Slurm's start to the first step,
  :func:`hpcsched.replay.report.startup_seconds`; :func:`with_startups`) rather than the
  configured 30 s, which would charge a scaled run's jobs many times what they pay here.
  ``--restart-cost`` overrides both.

:func:`compare_run` works on a finished replay's directory, so a benchmark can call it.
Outputs beside the replay's: ``compare.json`` (``{"runs": [real, simulated]}``, as
``simulate --json``, plus the per-job JCT ratios), ``simulated-jobs.csv`` and ``jct-cdf.png``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcsched.protocol.kinds import Granularity, GrowMode
from hpcsched.replay import ReplayError
from hpcsched.replay.report import as_result, read_run, summarize_real
from hpcsched.sim import SimResult

if TYPE_CHECKING:
    from rich.table import Table


@dataclass(frozen=True)
class Settings:
    """What the simulation of a replay runs with (seconds; ``params`` the policy's own)."""

    policy: str
    params: dict = field(default_factory=dict)
    seed: int = 0
    interval: float = 60.0
    grow: GrowMode = GrowMode.EXTENSION
    granularity: Granularity = Granularity.NODE      # the daemon's plan_granularity
    restart_cost: float = 30.0
    shrink_cost: float = 2.0
    extension_startup: float = 2.25
    extension_stall: float = 0.09
    hold_rounds: int = 3
    event_rounds: bool = True
    keep_free_gpus: int = 0
    min_gain: float = 0.05
    horizon: float = 600.0
    costs_note: str = ""
    #: the restart cost is measured (the journal's grows, or given): else the replay's start-ups
    restart_measured: bool = False


def daemon_settings(config, actions: Sequence, policy: str | None = None) -> Settings:
    """:class:`Settings` from the daemon's configuration ``config``
    (:class:`hpcsched.daemon.config.Settings`) and the store's journal ``actions`` (newest first);
    ``policy`` overrides the configured policy's name (its parameters then are not used)."""
    from hpcsched.daemon.costs import MIN_SAMPLES, measured_costs, resize_seconds
    from hpcsched.policies.reconcile import Costs
    from hpcsched.protocol.kinds import ChangeKind

    d = config.daemon
    configured = Costs(restart_cost=d.restart_cost, shrink_cost=d.shrink_cost,
                       extension_startup=d.extension_startup, extension_stall=d.extension_stall)
    costs, note = measured_costs(actions, configured)
    grows = sum(1 for a in actions if a.kind == ChangeKind.GROW and resize_seconds(a) is not None)
    same = policy is None or policy == config.policy.name
    return Settings(policy=config.policy.name if same else policy,
                    params=dict(config.policy.params) if same else {}, seed=config.policy.seed,
                    interval=d.round_interval, grow=d.grow, granularity=d.plan_granularity,
                    restart_cost=costs.restart_cost,
                    shrink_cost=costs.shrink_cost, extension_startup=costs.extension_startup,
                    extension_stall=costs.extension_stall, hold_rounds=d.hold_rounds,
                    event_rounds=d.event_rounds, keep_free_gpus=d.keep_free_gpus,
                    min_gain=d.min_gain, horizon=d.horizon, costs_note=note,
                    restart_measured=grows >= MIN_SAMPLES)


#: rounds of the store looked at to tell whether the daemon ran during a replay
ROUNDS_LOOKED_AT = 5000


def daemon_ran(round_starts: Sequence[float], start: float, end: float,
               complete: bool) -> bool | None:
    """Whether a daemon round started within ``[start, end]`` (epoch seconds), from the start
    times of the store's latest rounds (``complete``: they are all of them); None when the
    rounds looked at are all later than ``end`` and there may be older ones."""
    if any(start <= t <= end for t in round_starts):
        return True
    if round_starts and min(round_starts) > end and not complete:
        return None
    return False


def load_settings(policy: str | None = None, window: tuple[float, float] | None = None
                  ) -> Settings:
    """:func:`daemon_settings` of the configuration file and the store this host's daemon uses
    (no store: the configured costs, and the note says so). Without ``policy``, when
    ``window`` (the replay's start and end, epoch seconds) is given and the store shows that no
    daemon round ran within it (:func:`daemon_ran`; no store: none ran), the policy is
    ``static``: Slurm alone placed the jobs.

    Raises:
        ReplayError: the configuration cannot be read.
    """
    from hpcsched.daemon.config import ConfigError, load
    from hpcsched.daemon.status import open_store

    try:
        config = load()
    except ConfigError as exc:
        raise ReplayError(str(exc)) from None
    store = open_store()
    ran = None
    if policy is None and window is not None:
        rounds = store.rounds(limit=ROUNDS_LOOKED_AT) if store else []
        ran = daemon_ran([r.started_at for r in rounds], *window,
                         complete=len(rounds) < ROUNDS_LOOKED_AT)
    s = daemon_settings(config, store.actions(limit=200) if store else (),
                        "static" if ran is False else policy)
    if ran is False:
        s = replace(s, costs_note=s.costs_note + "; no daemon round during the replay: static")
    return s if store else replace(s, costs_note=s.costs_note + " (no store found)")


def simulate(meta: dict, s: Settings) -> SimResult:
    """The simulation of the replay described by ``meta`` (``run.json``) under ``s``.

    Raises:
        ReplayError: the workload cannot be read or simulated, or the policy is unknown.
    """
    from hpcsched.policies import PolicyError
    from hpcsched.sim.engine import SimConfig, SimulationError, Simulator
    from hpcsched.sim.workload import WorkloadError, load_workload, scale_workload

    scale = float(meta["scale"])
    try:
        name, jobs = load_workload(meta.get("workload_file") or meta["workload"],
                                   seed=int(meta.get("seed", 0)))
        name = meta.get("workload_name", name)
        base = SimConfig()
        cfg = SimConfig(nodes=int(meta["nodes"]), gpus_per_node=int(meta["gpus_per_node"]),
                        interval=s.interval, restart_cost={"*": s.restart_cost},
                        shrink_cost=s.shrink_cost, seed=s.seed, hold_rounds=s.hold_rounds,
                        grow=s.grow, granularity=s.granularity,
                        extension_startup=s.extension_startup,
                        extension_stall=s.extension_stall, work_scale=scale, early_reports=False,
                        event_rounds=s.event_rounds,
                        costs=replace(base.costs, min_gain=s.min_gain, horizon=s.horizon,
                                      keep_free=s.keep_free_gpus))
        return Simulator(scale_workload(jobs, scale), s.policy, policy_params=s.params,
                         config=cfg, workload_name=name).run()
    except (WorkloadError, SimulationError, PolicyError, ValueError) as exc:
        raise ReplayError(f"simulation: {exc}") from None


def jct_ratios(real: SimResult, sim: SimResult) -> dict[str, Any]:
    """Per job (by name) real JCT / simulated JCT over the jobs finished in both:
    ``{"jobs", "median", "mean", "min", "max", "worst"}`` (``worst``: the job whose ratio is
    farthest from 1 in either direction); figures None when no job finished in both."""
    sim_jct = {j.name: j.jct for j in sim.jobs if j.jct}
    pairs = {j.name: j.jct / sim_jct[j.name] for j in real.jobs
             if j.jct is not None and j.name in sim_jct}
    if not pairs:
        return {"jobs": 0, "median": None, "mean": None, "min": None, "max": None, "worst": None}
    vals = list(pairs.values())
    worst = max(pairs, key=lambda n: max(pairs[n], 1.0 / pairs[n]) if pairs[n] > 0 else 0.0)
    return {"jobs": len(pairs), "median": statistics.median(vals), "mean": statistics.fmean(vals),
            "min": min(vals), "max": max(vals), "worst": worst}


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def render(real: dict, sim: dict, ratios: dict) -> Table:
    """A rich table: one row per figure (finished jobs, average, median and p99 JCT, makespan,
    in seconds; with other users' plain jobs, their average and p99 wait and hpcsched's jobs'
    average JCT), columns real, simulated and real / simulated; then the per-job JCT ratios."""
    from rich.table import Table

    t = Table(title=f"real vs {sim.get('policy')}", box=None, header_style="bold")
    for col in ("", "REAL", "SIMULATED", "REAL / SIM"):
        t.add_column(col, justify="right" if col else "left")
    t.add_row("jobs finished", f"{real['finished']}/{real['jobs']}",
              f"{sim['finished']}/{sim['jobs']}", "")
    mixed = (("plain_avg_wait", "other users' jobs: avg wait (s)"),
             ("plain_p99_wait", "other users' jobs: p99 wait (s)"),
             ("elastic_avg_jct", "hpcsched's jobs: avg JCT (s)")) if "plain_jobs" in real else ()
    for key, label in (("avg_jct", "avg JCT (s)"), ("median_jct", "median JCT (s)"),
                       ("p99_jct", "p99 JCT (s)"), ("makespan", "makespan (s)"), *mixed):
        t.add_row(label, _s(real.get(key)), _s(sim.get(key)), _ratio(real.get(key), sim.get(key)))
    if ratios["jobs"]:
        t.add_row(f"per-job JCT ratio ({ratios['jobs']} jobs)",
                  f"median {ratios['median']:.2f}",
                  f"range {ratios['min']:.2f}-{ratios['max']:.2f}",
                  f"worst {ratios['worst']}")
    return t


def with_startups(s: Settings, startups: Sequence[float | None]) -> Settings:
    """``s`` with the restart cost the replay's jobs measured (the median of their start-ups,
    :func:`hpcsched.replay.report.startup_seconds`) unless ``s``'s is measured or none was."""
    got = [x for x in startups if x is not None]
    if s.restart_measured or not got:
        return s
    median = statistics.median(got)
    return replace(s, restart_cost=median, restart_measured=True,
                   costs_note=f"{s.costs_note}; start/restart cost {median:.1f} s (median start-up "
                              f"of the replay's {len(got)} jobs)")


def compare_run(out: Path, settings: Settings) -> dict[str, Any]:
    """Simulate the replay in ``out`` under ``settings``; write ``compare.json``,
    ``simulated-jobs.csv`` and ``jct-cdf.png`` into ``out``; returns ``{"runs": [real summary,
    simulated summary], "jct_ratio": jct_ratios, "costs": settings.costs_note}``.

    Raises:
        ReplayError: ``out`` is not a replay's directory, or the simulation cannot run.
    """
    from hpcsched.sim import report

    meta, rows = read_run(out)
    if meta.get("workload_file"):   # relative to the replay's folder
        meta = dict(meta, workload_file=str(out / meta["workload_file"]))
    settings = with_startups(settings, [r["startup"] for r in rows])
    real = as_result(rows, meta.get("workload_name", meta["workload"]), int(meta["nodes"]) * int(meta["gpus_per_node"]),
                     float(meta.get("wall_seconds", 0.0)), {"scale": meta["scale"]})
    sim = simulate(meta, settings)
    sim = replace(sim, policy=f"simulated ({settings.policy})")
    doc = {"runs": [summarize_real(real), report.summarize(sim)],
           "jct_ratio": jct_ratios(real, sim), "costs": settings.costs_note}
    (out / "compare.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    report.write_job_csv(sim, out / "simulated-jobs.csv")
    report.plot_jct_cdf([real, sim], out / "jct-cdf.png")
    return doc
