"""The evaluation's simulations: one :class:`~hpcsched.sim.cli.Run` per figure, run on a
process pool or as a Slurm job array (:mod:`_evaluation_slurm`), each kept in the run cache
(:mod:`_run_cache`) as soon as it ends, so a stopped ``evaluation.py`` goes on where it stopped.
Used by :mod:`evaluation` (sections 2, 4 and 5)."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import _evaluation_render as render
from _evaluation_slurm import SlurmOptions, run_array
from _run_cache import CACHE_DIR, RunCache, code_version

from hpcsched.sim import report
from hpcsched.sim.cli import POLLUX_TIRESIAS, Run, execute


def _params(policy: str) -> dict:
    return dict(POLLUX_TIRESIAS) if policy == "tiresias" else {}


def make_run(workload: str, policy: str, *, placement: str | None = None, variability=False,
             hold: bool = False, interval: float = 60.0, seed: int = 0,
             granularity: str = "node", grow: str | None = None, params: dict | None = None,
             restart_cost: float = 30.0, soft_consolidate: bool = False,
             fastest_gpus: bool = False) -> Run:
    """A :class:`Run` by keyword; ``granularity`` is passed only where ``Run`` has the field;
    ``grow`` (``None``: the simulator's default, by extension) likewise. ``params`` add to the
    policy's parameters; ``restart_cost`` (s) is every application's; ``soft_consolidate``,
    ``fastest_gpus``: those of :class:`~hpcsched.sim.engine.SimConfig`."""
    params = tuple((k, tuple(v) if isinstance(v, list) else v)
                   for k, v in sorted({**_params(policy), **(params or {})}.items()))
    kw = dict(workload=workload, policy=policy, placement=placement, params=params, nodes=16,
              gpus_per_node=4, interval=interval, restart_cost=(("*", restart_cost),), shrink_cost=2.0,
              variability=variability, locality_penalty=1.7, seed=seed, max_time=60 * 86400.0,
              hold_new_jobs=hold)
    if soft_consolidate:
        kw["soft_consolidate"] = True
    if fastest_gpus:
        kw["fastest_gpus"] = True
    if "granularity" in {f.name for f in dataclasses.fields(Run)}:
        kw["granularity"] = granularity
    if grow is not None:
        kw["grow"] = grow
    return Run(**kw)


def _cache(args) -> RunCache:
    """The run cache for the code on disk (:mod:`_run_cache`) in ``--cache-dir``, or none with
    ``--no-cache``."""
    return RunCache(None if args.no_cache else code_version(), Path(args.cache_dir or CACHE_DIR))


def _ran(out, wall: float) -> str:
    """The provenance line's words on the simulations: how many, how long, and how many were
    taken from the cache of earlier runs of the same code (:mod:`_run_cache`)."""
    hits = [s for _, s in out.values() if s.get("cached")]
    if not hits:
        return f"{len(out)} simulations in {wall / 60:.1f} min"
    return (f"{len(out)} simulations: {len(out) - len(hits)} run now in {wall / 60:.1f} min, "
            f"{len(hits)} taken from the cache of earlier runs of the same code "
            f"(`benchmarks/_run_cache.py`), where they had taken "
            f"{sum(s['wall_seconds'] for s in hits) / 60:.0f} min of simulation")


def _execute(run: Run):
    res = execute(run)
    return res, report.summarize(res)


#: where :func:`execute_all` runs what the cache lacks when its caller does not say: ``None``,
#: on ``jobs`` local processes, or a Slurm job array (``evaluation.py --executor slurm`` sets it)
SLURM: SlurmOptions | None = None


def _on_pool(todo: list[tuple], runs: dict[tuple, Run], jobs: int, cache: RunCache):
    """``(key, (SimResult, summary))`` of each run in ``todo`` as it ends on ``jobs``
    processes, kept in ``cache`` as it comes."""
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futs = {pool.submit(_execute, runs[k]): k for k in todo}
        for f in as_completed(futs):
            k, value = futs[f], f.result()
            cache.put(runs[k], value)
            yield k, value


def execute_all(runs: dict[tuple, Run], jobs: int, cache: RunCache | None = None,
                slurm: SlurmOptions | None = None) -> dict[tuple, tuple]:
    """Run every simulation on ``jobs`` processes, or with ``slurm`` (default :data:`SLURM`) as
    one Slurm job array whose tasks put their results into ``cache``; ``key -> (SimResult,
    summary)``. A run ``cache`` holds (simulated earlier by the same code, :mod:`_run_cache`) is
    taken from it; every run simulated here is added to it as soon as it ends, so a stopped run
    goes on where it stopped."""
    cache = cache or RunCache(None)
    slurm = slurm or SLURM
    out: dict[tuple, tuple] = {}
    for k, r in runs.items():
        hit = cache.get(r)
        if hit is not None:
            out[k] = (hit[0], {**hit[1], "cached": True})
    if out:
        print(f"{len(out)} of {len(runs)} simulations from the cache of code {cache.version}", flush=True)
    # the slowest first (pollux's search; the higher loads), so the pool does not end on one long run
    todo = sorted((k for k in runs if k not in out), key=lambda k: (k[1] != "pollux", -float(k[3] or 0)))
    done = (zip(todo, run_array([runs[k] for k in todo], cache, slurm)) if slurm and todo
            else _on_pool(todo, runs, jobs, cache))
    for i, (k, (res, summ)) in enumerate(done, len(out) + 1):
        out[k] = (res, summ)
        print(f"[{i}/{len(runs)}] {k[0]:>4} {runs[k].label:>16} {k[2]:>4} on {runs[k].workload:<12} "
              f"avg JCT {render.fmt(summ['avg_jct'])} s ({summ['wall_seconds']:.1f} s)", flush=True)
    return out
