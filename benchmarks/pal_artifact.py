"""Benchmark: PAL's experiment under the semantics of PAL's own simulator, rebuilt from its code.

``benchmarks/evaluation.py --pal`` runs PAL's experiment in hpcsched's simulator, where a job
keeps its Slurm shape (a 2-GPU job is one node x 2 GPUs), a placement chooses nodes, and a
moved job pays a restart. Run that way, PAL and PM-First cut the geomean average JCT by 22-28%
against packed, where PAL publishes 43% and 40%. This benchmark answers where the rest of that
gap lies. It replays the same eight Philly traces, on the same 64 GPUs with the same per-GPU,
per-class slowdowns (seed 42, ``hpcsched.sim.physics.pal_gpu_slowdowns``) and the same fixed
work (``hpcsched.sim.workload.PAL_MODELS``), under the rules of the PAL artifact's simulator
(github.com/hal-uw/blox-pal, branch ``artifact``; read there, rewritten here):

* **Rounds** of 360 s (``simulator_sia.py`` run with ``--round-duration 360``). At each round
  start, every running job advances ``360 / (pm_penalty x locality x iteration_time)``
  iterations (``blox/deployment/grpc_client_rm.py``, ``get_metrics``). A job that reaches its
  iterations is recorded as finished at that round start, and a job submitted since the last
  round joins the queue (``blox/blox_manager.py``, ``update_metrics``). ``pm_penalty`` is the
  largest per-class slowdown among the job's GPUs. ``locality`` is 1.7 when the GPUs span
  nodes, else 1 (``exec_jobs``).
* **FIFO** by submission (``schedulers/fifo.py``); a placement stops at the first job it cannot
  place.
* **GPUs, not nodes.** Every placement picks individual GPUs anywhere in the cluster:
  * *Packed-Sticky* (``placement/packing_sticky.py``): a running job keeps its GPUs. A waiting
    job takes a node with exactly its count free, else the node with the fewest free GPUs that
    has room, else ("soft consolidation") the GPUs of the nodes with the most free GPUs. If even
    that fails it preempts running jobs from the back of the queue until it fits.
  * *PM-First* (``placement/pmfirst.py``): every round, all running jobs are taken off. The
    jobs that fit into the cluster in FIFO order are sorted by class (A first), then each takes
    the free GPUs with the smallest binned slowdown for its class, ties to the node whose free
    count best matches the job.
  * *PAL* (``placement/pal.py``): the same, except that a job of 2-4 GPUs walks the
    locality x variability matrix. Entries are (bin, within a node) at cost ``bin`` and
    (bin, across nodes) at cost ``1.7 x bin``, cheapest first. It takes the first entry that
    has room: within a node, the node's ``k`` GPUs at or below the bin with the smallest
    slowest bin; across nodes, PM-First on the GPUs at or below the bin.
  * Bins: per class, K-Means over the 64 GPUs' slowdowns with ``k = 2`` plus one per outlier
    (above the mean + 3 sigma), as ``get_slowdown_factors`` ends up doing: its ``get_optimal_k``
    returns from inside its loop. Each GPU counts at its bin's centre over the median centre.
    Here the bins come from :func:`hpcsched.policies.placement.binning.bin_gpus` with
    ``k_max=2``, which bins the outliers among themselves.
* Moving a job costs nothing. A round's re-placement that gives a job other GPUs terminates it
  and relaunches it with its progress kept.

Ties the artifact leaves to pandas' unstable sort are broken by GPU number here. The JCT is
``finish round - submit time`` over all 160 jobs of a trace (``--start-id-track 0
--stop-id-track 159``).

Usage::

    .venv/bin/python benchmarks/pal_artifact.py [--traces 1-8] [--round 360] [--seed 42]
        [--out bench-results/pal_artifact.json]

Prints a table per trace and the geomean of PM-First's and PAL's average JCT over packed's
(PAL's published figures: -40% and -43%), and writes them to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from itertools import combinations
from pathlib import Path

import numpy as np
from scipy.stats import gmean

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402

from hpcsched.policies.placement.binning import bin_gpus  # noqa: E402
from hpcsched.sim.physics import PAL_CLASS_ORDER, pal_gpu_slowdowns  # noqa: E402
from hpcsched.sim.workload import load_workload  # noqa: E402

NODES, PER_NODE = 16, 4
LOCALITY = 1.7
PLACEMENTS = ("packed", "pm-first", "pal")
PUBLISHED = {"pm-first": -0.40, "pal": -0.43}


@dataclass
class Job:
    """One fixed-work job of a trace (``WorkloadJob`` of ``pal:N``)."""

    idx: int
    submit: float
    gpus: int
    cls: int                # column of the class in the slowdown table
    iterations: float
    iteration_time: float
    done: float = 0.0       # iterations trained
    held: tuple[int, ...] = ()
    finish: float | None = None


@dataclass
class Cluster:
    """64 GPUs, GPU ``g`` on node ``g // 4``: raw slowdowns (speed) and bins (placement)."""

    raw: np.ndarray                          # (gpus, classes): slowdown, 1 = median
    sf: np.ndarray                           # (gpus, classes): bin centre / median centre
    owner: dict[int, int] = field(default_factory=dict)   # GPU -> job index

    def free(self) -> list[int]:
        return [g for g in range(len(self.raw)) if g not in self.owner]

    def take(self, job: Job, gpus: tuple[int, ...]) -> None:
        job.held = gpus
        for g in gpus:
            self.owner[g] = job.idx

    def release(self, job: Job) -> None:
        for g in job.held:
            self.owner.pop(g, None)
        job.held = ()


@cache
def gpu_tables(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The cluster's raw per-GPU, per-class slowdowns (PAL's draws, ``seed``) and their bins,
    computed once per seed (every trace and placement runs on the same cluster). Read-only."""
    raw = pal_gpu_slowdowns(NODES * PER_NODE, PAL_CLASS_ORDER, seed)
    sf = binned(raw)
    raw.flags.writeable = sf.flags.writeable = False
    return raw, sf


def binned(raw: np.ndarray) -> np.ndarray:
    """Each GPU's bin centre over the median centre, per class (module docstring)."""
    out = np.empty_like(raw)
    for c in range(raw.shape[1]):
        b = bin_gpus(raw[:, c], k_max=2)
        centres = np.asarray(b.centres)
        out[:, c] = centres[list(b.labels)] / np.median(centres)
    return out


def by_node(gpus: list[int]) -> dict[int, list[int]]:
    nodes: dict[int, list[int]] = {}
    for g in gpus:
        nodes.setdefault(g // PER_NODE, []).append(g)
    return nodes


def packed_gpus(n: int, free: list[int]) -> tuple[int, ...] | None:
    """Packed-Sticky's consolidated, else soft-consolidated, choice of ``n`` free GPUs."""
    nodes = by_node(free)
    for gs in nodes.values():
        if len(gs) == n:
            return tuple(gs)
    fits = [(len(gs), node) for node, gs in nodes.items() if len(gs) >= n]
    if fits:
        return tuple(nodes[min(fits)[1]][:n])
    if len(free) < n:
        return None
    left, got = Counter({node: len(gs) for node, gs in nodes.items()}), []
    while len(got) < n:
        node, count = left.most_common(1)[0]
        k = min(count, n - len(got))
        got += nodes[node][:k]            # each node is drawn once: k < count ends the loop
        left[node] -= k
    return tuple(got)


def pmfirst_gpus(n: int, free: list[int], sf: np.ndarray) -> tuple[int, ...] | None:
    """The ``n`` free GPUs of smallest binned slowdown ``sf`` (per GPU), ties to the node whose
    free count is nearest ``n``, then by GPU number."""
    if len(free) < n:
        return None
    count = {node: len(gs) for node, gs in by_node(free).items()}
    order = sorted(free, key=lambda g: (sf[g], abs(count[g // PER_NODE] - n), g))
    return tuple(order[:n])


def pal_gpus(n: int, free: list[int], sf: np.ndarray) -> tuple[int, ...] | None:
    """PAL's choice: the locality x variability matrix for 2..4 GPUs, else PM-First."""
    if not 1 < n <= PER_NODE:
        return pmfirst_gpus(n, free, sf)
    levels = sorted(set(float(x) for x in sf))
    matrix = sorted([(v, True, v) for v in levels] + [(v, False, LOCALITY * v) for v in levels],
                    key=lambda t: t[2])
    for level, within, _ in matrix:
        ok = [g for g in free if sf[g] <= level]
        if within:
            combos = [(max(sf[g] for g in c), c) for gs in by_node(ok).values() if len(gs) >= n
                      for c in combinations(gs, n)]
            if combos:
                return min(combos, key=lambda t: t[0])[1]
        elif len(ok) >= n:
            return pmfirst_gpus(n, ok, sf)
    return None


@dataclass(frozen=True)
class Rules:
    """Switches away from the artifact's rules, to measure what each contributes."""

    backfill: bool = False   # a job that cannot be placed is skipped, not the end of the round
    preempt: bool = True     # Packed-Sticky preempts later jobs to place an earlier one


def place_round(kind: str, queue: list[Job], cluster: Cluster, rules: Rules = Rules()) -> None:
    """One round's placement of the active jobs ``queue`` (FIFO order) by ``kind``."""
    if kind == "packed":
        for i, job in enumerate(queue):
            if job.held:
                continue
            got = packed_gpus(job.gpus, cluster.free())
            for victim in reversed(queue[i + 1:]) if rules.preempt else ():
                if got is not None:
                    break
                if victim.held:
                    cluster.release(victim)
                    got = packed_gpus(job.gpus, cluster.free())
            if got is None and not rules.backfill:
                return
            if got is not None:
                cluster.take(job, got)
        return
    for job in queue:
        cluster.release(job)
    total, head = 0, []
    for job in queue:
        total += job.gpus
        if total > len(cluster.raw):
            break
        head.append(job)
    placed_first = {j.idx for j in head}
    order = sorted(head, key=lambda j: j.cls) + [j for j in queue if j.idx not in placed_first]
    for job in order:
        sf = cluster.sf[:, job.cls]
        pick = pmfirst_gpus if kind == "pm-first" else pal_gpus
        got = pick(job.gpus, cluster.free(), sf)
        if got is None and not rules.backfill:
            return
        if got is not None:
            cluster.take(job, got)


def run_trace(trace: int, kind: str, round_s: float = 360.0, seed: int = 42,
              rules: Rules = Rules()) -> dict:
    """Simulate one trace under one placement; the average JCT (s) and the jobs' JCTs."""
    _, wjs = load_workload(f"pal:{trace}")
    raw, sf = gpu_tables(seed)
    cluster = Cluster(raw, sf)
    jobs = sorted((Job(i, w.submit_time, w.gpus,
                       PAL_CLASS_ORDER.index(w.app_class.removeprefix("class")),
                       w.iterations, w.iteration_time) for i, w in enumerate(wjs)),
                  key=lambda j: (j.submit, j.idx))
    t, active, arrived = 0.0, [], 0
    while any(j.finish is None for j in jobs):
        while arrived < len(jobs) and jobs[arrived].submit <= t:
            active.append(jobs[arrived])
            arrived += 1
        place_round(kind, active, cluster, rules)
        for job in active:            # the round runs; its end is the next round's start
            if job.held:
                pm = max(cluster.raw[g, job.cls] for g in job.held)
                loc = LOCALITY if len({g // PER_NODE for g in job.held}) > 1 else 1.0
                job.done += round_s / (pm * loc * job.iteration_time)
                if job.done >= job.iterations:
                    job.finish = t + round_s
                    cluster.release(job)
        active = [j for j in active if j.finish is None]
        t += round_s
        if t > 1e8:
            raise RuntimeError(f"trace {trace}, {kind}: not done after {t:.0f} s")
    jcts = [j.finish - j.submit for j in jobs]
    return {"avg_jct": float(np.mean(jcts)), "jobs": len(jobs)}


def geomean_change(rows: dict[int, dict[str, float]], kind: str) -> float:
    """Geomean over the traces of ``kind``'s average JCT over packed's, minus 1."""
    return float(gmean([r[kind] / r["packed"] for r in rows.values()])) - 1.0


def run_all(traces: list[int], rules: Rules = Rules(), round_s: float = 360.0, seed: int = 42
            ) -> tuple[dict[int, dict[str, float]], dict[str, float]]:
    """Every placement on every trace: ``trace -> placement -> average JCT (s)``, and the
    geomean change of PM-First and PAL against packed (``-0.4``: 40% lower)."""
    rows = {w: {k: run_trace(w, k, round_s, seed, rules)["avg_jct"] for k in PLACEMENTS}
            for w in traces}
    return rows, {k: geomean_change(rows, k) for k in ("pm-first", "pal")}


#: the runs ``benchmarks/evaluation.py --pal`` shows in docs/evaluation.md section 4
EVALUATION_RUNS = {
    "artifact": (Rules(), "PAL's simulator rebuilt (`benchmarks/pal_artifact.py`): GPUs picked "
                 "anywhere in the cluster, strict FIFO, every running job re-placed each round "
                 "for free, 360 s rounds, PAL's draws"),
    "artifact-backfill": (Rules(backfill=True), "PAL's simulator rebuilt, but a job that cannot "
                          "be placed is skipped (backfill, as Slurm), not the end of the round"),
}


def for_evaluation(traces: list[int]) -> tuple[dict, dict]:
    """:data:`EVALUATION_RUNS` in the shapes of ``evaluation.pal_geomeans``: ``mode -> [(trace,
    placement -> average JCT)]`` and ``mode -> placement -> geomean change``."""
    rows, geo = {}, {}
    for mode, (rules, _) in EVALUATION_RUNS.items():
        r, geo[mode] = run_all(traces, rules)
        rows[mode] = sorted(r.items())
    return rows, geo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--traces", default="1-8", help="trace numbers: 1-8 or 1,3,5")
    ap.add_argument("--round", type=float, default=360.0, help="round length (s)")
    ap.add_argument("--seed", type=int, default=42, help="seed of the per-GPU draws")
    ap.add_argument("--backfill", action="store_true",
                    help="skip a job that cannot be placed instead of ending the round there")
    ap.add_argument("--no-preempt", action="store_true",
                    help="Packed-Sticky does not preempt later jobs to place an earlier one")
    ap.add_argument("--out", default="bench-results/pal_artifact.json")
    args = ap.parse_args()
    lo, _, hi = args.traces.partition("-")
    traces = list(range(int(lo), int(hi) + 1)) if hi else [int(x) for x in args.traces.split(",")]
    t0 = time.time()
    rules = Rules(backfill=args.backfill, preempt=not args.no_preempt)
    rows, geo = run_all(traces, rules, args.round, args.seed)
    print(f"{'trace':>5} {'packed':>9} {'PM-First':>9} {'PAL':>9} {'PM-First':>9} {'PAL':>7}")
    for w, r in rows.items():
        print(f"{w:>5} {r['packed']:9.0f} {r['pm-first']:9.0f} {r['pal']:9.0f} "
              f"{r['pm-first'] / r['packed'] - 1:+9.1%} {r['pal'] / r['packed'] - 1:+7.1%}")
    for k, v in geo.items():
        print(f"geomean {k}: {v:+.1%} vs packed (published {PUBLISHED[k]:+.0%})")
    write_report(Path(args.out), "pal_artifact", round_s=args.round, seed=args.seed,
                 traces=traces, rules={"backfill": rules.backfill, "preempt": rules.preempt},
                 avg_jct={str(w): r for w, r in rows.items()}, geomean_vs_packed=geo,
                 published=PUBLISHED, wall_seconds=round(time.time() - t0, 1))

if __name__ == "__main__":
    main()
