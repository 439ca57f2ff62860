#!/usr/bin/env python3
"""Benchmark: what the throughput model's errors cost a policy (what-ifs, not policies).

The policies predict a job's goodput with Pollux's model (``hpcsched.perf.model``): step times
from seven parameters, the application's shipped prior fitted to the job's own measurements,
times the statistical efficiency of the gradient statistics measured at the job's current batch
size. This benchmark simulates Pollux's workloads (``--granularity gpu``, the simulator's
defaults, as ``docs/evaluation.md`` section 2) with the policy's predictions replaced, inside
the simulation's own process, by:

``fitted``
    nothing patched: Pollux's model fitted to each job's own measurements
    (``SimConfig.throughput_model = "fitted"``).
``shared``
    nothing patched: the committed default (``throughput_model = "shared"``,
    :mod:`hpcsched.perf.shared`): the prior corrected by what every job of the application has
    measured so far in the same simulation (mean ``log(measured / prior)`` per nodes x GPUs and
    local batch size to the nearest power of 2, else per nodes x GPUs), scaled to the job's own
    measurements. Only what the jobs measured.
``prior``
    the application's prior alone, never fitted to the job.
``scaled-prior``
    the prior times one factor, the geometric mean of the job's measured / prior step times
    (the scale :func:`hpcsched.perf.pollux.fixed_parameters` computes), without the fit.
``true-step``
    the simulator's true step time of each configuration (its physics, packed layout);
    efficiency as measured.
``true-efficiency``
    the true statistical efficiency at each batch size (the gradient statistics the physics
    has at that batch, in the job's epoch); step times fitted.
``true-both``
    both.

Every variant but ``shared`` runs with ``throughput_model = "fitted"`` and patches that model.
The ``true-*`` variants know what no policy can; they bound what a better model could give.
Each simulation runs in a fresh process, so nothing learnt leaks between simulations.

    .venv/bin/python benchmarks/model_whatif.py [--variants fitted,prior,...] [--policies jct]
        [--loads 0.5,1.0] [--workloads 1-8] [--jobs 2] [--out bench-results/model_whatif.json]

Prints the mean average JCT per variant, policy and load (and the per-workload figures), and
writes them to ``--out``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import multiprocessing  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from functools import lru_cache  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402

VARIANTS = ("fitted", "prior", "scaled-prior", "shared", "true-step", "true-efficiency",
            "true-both")


def _install(variant: str) -> None:
    """Replace the policy's goodput predictions in this process as ``variant`` says."""
    import hpcsched.perf.model as model
    import hpcsched.sim.state as state
    from hpcsched.perf import pollux, priors
    from hpcsched.perf.pollux import PolluxModel
    from hpcsched.policies import jct
    from hpcsched.sim.bound import layouts
    from hpcsched.sim.engine import SimConfig

    shape = SimConfig(granularity="gpu")   # the cluster _simulate runs on

    if variant in ("fitted", "shared"):
        return
    app_of: dict[int, str] = {}          # id(model) -> application
    truth: dict[tuple, tuple] = {}       # reported (grad_sqr, grad_var) -> (Application, epoch)

    @lru_cache(maxsize=8192)
    def pollux_model(key, app, corrections=None):
        prior = priors.prior_for(app)
        if variant in ("prior", "scaled-prior") and key:
            m = PolluxModel(prior, "prior")
            if variant != "prior":
                pts = pollux._Points.of(key)
                pred = np.asarray(pollux.step_time(prior, pts.n, pts.k, pts.b, pts.acc), float)
                m = PolluxModel(prior.scaled(float(np.exp(np.mean(np.log(pts.step / pred))))),
                                "scaled prior")
        else:
            m = original_model(key, app, corrections)
        app_of[id(m)] = app
        return m

    original_model = model._pollux_model
    model._pollux_model = pollux_model
    original_goodputs = model._goodputs

    def goodputs(m, nodes, world, local, accum, glob, base, grad_noise, throughputs=None):
        app = app_of.get(id(m))
        known = truth.get(tuple(grad_noise)) if grad_noise is not None else None
        if app is None or known is None or not variant.startswith("true"):
            return original_goodputs(m, nodes, world, local, accum, glob, base, grad_noise,
                                     throughputs)
        # the model's throughputs recomputed (without the shared model's corrections), as
        # before model._goodputs took them cached: the true-* figures stay comparable
        if variant in ("true-step", "true-both"):
            physics = known[0]
            packed = [layouts(int(w), shape.nodes, shape.gpus_per_node, packed=True)[0]
                      for w in world]
            t = np.array([physics.step_time(lay, float(b), int(s))
                          for lay, b, s in zip(packed, local, accum)])
        else:
            t = pollux._step_time(m.params, nodes, world, local, accum, np.maximum)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(t > 0, glob / t, 0.0)
        if variant in ("true-efficiency", "true-both"):
            physics, epoch = known
            x = x * np.array([min(1.0, physics.gain(float(b), epoch) / (b / physics.init_batch_size))
                              for b in glob])
        elif grad_noise is not None:
            x = x * pollux.efficiencies(grad_noise[0], grad_noise[1], base, glob)
        return np.where(np.isfinite(x), x, 0.0)

    def goodputs_of(stacked):   # best_at_each_of's one pass, job by job through goodputs
        out = []
        for job, m, key, (_, world, local, accum, glob, nodes) in stacked:
            out.append(goodputs(m, nodes, world, local, accum, glob, job.base_batch_size,
                                job.grad_noise, model._stacked_throughputs(m, key)))
        return np.concatenate(out)

    model._goodputs = goodputs
    model._goodputs_of = goodputs_of
    report = state.SimJob.report

    # jct plans on the reported noise scale times its noise_growth (jct.planning_view): the
    # physics is looked up by either
    growth = jct.decide.__kwdefaults__["noise_growth"]

    def reporting(job):   # the true-* variants look the job's physics up by what it reported
        r = report(job)
        if r.grad_noise is not None and job.app is not None:
            sqr, var = r.grad_noise
            for key in ((sqr, var), (sqr, var * growth)):
                truth[key] = (job.app, job.epoch_at(job.progress))
        return r

    state.SimJob.report = reporting


def _simulate(args: tuple[str, str, str, int]) -> tuple[tuple, float]:
    variant, policy, load, workload = args
    _install(variant)
    from hpcsched.sim import report
    from hpcsched.sim.engine import SimConfig, Simulator
    from hpcsched.sim.workload import load_workload

    name, jobs = load_workload(f"pollux:{workload}@{load}")
    model = "shared" if variant == "shared" else "fitted"
    res = Simulator(jobs, policy, workload_name=name,
                    config=SimConfig(granularity="gpu", throughput_model=model)).run()
    return args, float(report.summarize(res)["avg_jct"])


def _numbers(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi) + 1)) if hi else [int(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--variants", default="fitted,prior,scaled-prior,shared,true-step,"
                    "true-efficiency,true-both")
    ap.add_argument("--policies", default="jct")
    ap.add_argument("--loads", default="0.5,1.0")
    ap.add_argument("--workloads", default="1-8")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "model_whatif.json"))
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    policies, loads = args.policies.split(","), args.loads.split(",")
    wls = _numbers(args.workloads)
    todo = [(v, p, ld, w) for v in variants for p in policies for ld in loads for w in wls]
    t0 = time.time()
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        got = dict(pool.imap_unordered(_simulate, todo))
    rows = []
    print(f"{'variant':>16} {'policy':>7} {'load':>5} {'mean avg JCT (s)':>17}  per workload")
    for v in variants:
        for p in policies:
            for ld in loads:
                per = [got[(v, p, ld, w)] for w in wls]
                rows.append({"variant": v, "policy": p, "load": ld, "workloads": wls,
                             "avg_jct": per, "mean_avg_jct": float(np.mean(per))})
                print(f"{v:>16} {p:>7} {ld:>5} {np.mean(per):17.0f}  "
                      + " ".join(f"{x:.0f}" for x in per))
    write_report(Path(args.out), "model_whatif", rows=rows, wall_seconds=round(time.time() - t0, 1))


if __name__ == "__main__":
    main()
