#!/usr/bin/env python3
"""Benchmark: a Pollux workload replayed on the dev cluster, daemon off and daemon on, each
against the simulator's prediction (issue 11).

The workload is a systematic sample of a Pollux workload sized for the cluster
(``benchmarks/_testbed_workload.py``: every 4th job of 160 for 4 x 4 GPUs, each asking for a
quarter of its GPUs, rounded up, at a tuned batch size). The time scale ``F`` shrinks arrivals and
work together so that the simulated static run lasts ``--minutes`` (default 40). Two runs, each
``hpcsched replay`` of the emulated application (``jobscripts/examples/emulated.py``):

* **on**: ``hpcsched daemon`` with the default policy (a fresh store; ``--interval`` s rounds);
* **off**: no daemon: every job runs as submitted (the simulator's ``static``).

The daemon-on run goes first: its store's journal gives the resize costs measured on this
cluster, and both runs are simulated with them (``hpcsched.replay.compare``). While each run
lasts, a watcher samples ``squeue`` and ``sinfo`` every 5 s and counts jobs left held, lost, or
pending while the free GPUs could start them (for longer than two rounds plus Slurm's 30 s
backfill pass).

    .venv/bin/python benchmarks/testbed.py [--workload 3 --offset 3] [--minutes 40] [--out DIR]
        [--granularity auto|gpu|node] [--rigid-fraction 0.3 --all-elastic DIR/testbed.json]

With ``--rigid-fraction F`` every 1/F-th job is another user's plain ``sbatch`` job of fixed
size and duration (``hpcsched replay --rigid-fraction``), in both runs; the figures add those
jobs' average and p99 wait and hpcsched's own jobs' average JCT, and the targets of issue 37
(their waits with the daemon on at most 1.05 x off; hpcsched's jobs' gain at least 0.80 x the
all-elastic run's, given by ``--all-elastic``).

It prints real and simulated average and p99 JCT and makespan for each run, the daemon's gain
over static (real and simulated) and the targets of issue 11, and writes JSON (default
``bench-results/testbed.json``) beside each run's replay folder (``DIR/on``, ``DIR/off``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402
from _testbed_workload import sample_workload, write_pollux_csv  # noqa: E402

from hpcsched.daemon.config import load as load_config  # noqa: E402
from hpcsched.slurm import devcluster  # noqa: E402
from hpcsched.slurm.gres import gpu_count  # noqa: E402

BIN = Path(sys.executable).parent
#: a mixed run's figures (other users' plain jobs: ``hpcsched replay --rigid-fraction``)
MIXED = ("plain_jobs", "plain_avg_wait", "plain_p99_wait", "elastic_avg_jct")
#: a pending job the free GPUs could start is a fault once it waits longer than this (s):
#: two daemon rounds plus Slurm's backfill interval (30 s, bf_interval's default)
PENDING_GRACE = 30.0


def choose_scale(jobs, nodes: int, gpus_per_node: int, minutes: float) -> tuple[float, float]:
    """``(F, unscaled static makespan s)``: the scale at which the simulated static run lasts
    ``minutes``."""
    from hpcsched.sim.engine import SimConfig, simulate

    r = simulate(jobs, "static", config=SimConfig(nodes=nodes, gpus_per_node=gpus_per_node))
    makespan = max(j.finish_time for j in r.jobs) - min(j.submit_time for j in r.jobs)
    return min(1.0, minutes * 60.0 / makespan), makespan


class Watcher(threading.Thread):
    """Samples Slurm every ``interval`` s: jobs pending while enough GPUs are free to start
    them (``pending_free``: job id -> longest such wait, s) and jobs held at the latest sample
    (``held``)."""

    def __init__(self, env: dict, interval: float = 5.0):
        super().__init__(daemon=True)
        self.env, self.interval = env, interval
        self.stop = threading.Event()
        self.since: dict[str, float] = {}          # job id -> pending with free GPUs since
        self.pending_free: dict[str, float] = {}   # job id -> longest such wait (s)
        self.held: set[str] = set()

    def _free_per_node(self) -> list[int]:
        """Free GPUs on each node that can run jobs (``sinfo``'s Gres minus GresUsed)."""
        out = subprocess.run(["sinfo", "-h", "-N", "-O", "NodeList:12,Gres:24,GresUsed:40,StateLong:16"],
                             capture_output=True, text=True, env=self.env).stdout
        free = []
        for line in out.splitlines():
            node, gres, used, state = line.split()[:4]
            if state.rstrip("*") in ("idle", "mixed", "allocated"):
                free.append(gpu_count(gres) - gpu_count(used))
        return free

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                free = self._free_per_node()
                pend = subprocess.run(["squeue", "-h", "-t", "PD", "-o", "%i %D %b %r"],
                                      capture_output=True, text=True, env=self.env).stdout
            except (OSError, ValueError):
                continue
            now, seen, held = time.time(), set(), set()
            for line in pend.splitlines():
                jid, n, tres, reason = (line.split(None, 3) + [""])[:4]
                if "Held" in reason:
                    held.add(jid)
                    continue
                fits = sum(1 for f in free if f >= gpu_count(tres)) >= int(n)
                if fits and not reason.startswith("BeginTime"):
                    seen.add(jid)
                    t0 = self.since.setdefault(jid, now)
                    self.pending_free[jid] = max(self.pending_free.get(jid, 0.0), now - t0)
            self.since = {j: t for j, t in self.since.items() if j in seen}
            self.held = held   # held at the latest sample: at the end, left held

    def faults(self) -> dict:
        long = {j: round(w) for j, w in self.pending_free.items() if w > PENDING_GRACE}
        return {"pending_with_free_gpus": long, "held": sorted(self.held)}


def _daemon_config(run_dir: Path, interval: float, granularity: str, stamp: Path | None = None,
                   keep_free: int = 0) -> Path:
    cfg = run_dir / "hpcsched.toml"
    cfg.write_text(f'[daemon]\nround_interval = {interval}\nlock_file = "{run_dir}/daemon.lock"\n'
                   f'database_url = "sqlite:///{run_dir}/hpcsched.db"\n'
                   f'granularity = "{granularity}"\nkeep_free_gpus = {keep_free}\n'
                   + (f'submit_stamp = "{stamp}"\n' if stamp else ""))
    return cfg


def replay(run_dir: Path, csv_path: Path, scale: float, env: dict, daemon: bool,
           rigid_fraction: float = 0.0) -> dict:
    """One replay of the workload (with the daemon when ``daemon``); returns its summary and
    the watcher's faults."""
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = None
    if daemon:
        log = open(run_dir / "daemon.log", "ab")
        proc = subprocess.Popen([str(BIN / "hpcsched"), "-v", "daemon"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    watcher = Watcher(env)
    watcher.start()
    try:
        subprocess.run([str(BIN / "hpcsched"), "replay", str(csv_path), "--scale", f"{scale:.6g}",
                        "--rigid-fraction", f"{rigid_fraction:g}", "--out", str(run_dir / "replay")],
                       env=env, check=True)
    finally:
        watcher.stop.set()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=120)
    return {"summary": json.loads((run_dir / "replay" / "summary.json").read_text()),
            "faults": watcher.faults()}


#: a finished run's summary, the watcher's faults and its comparison, in its folder
RUN_FILE = "testbed-run.json"


def reused(run_dir: Path) -> dict:
    """A finished run of the same workload and scale (``--reuse MODE=DIR``): its
    :data:`RUN_FILE`, else (a run written before that file existed) its replay's summary and
    compare.json with the faults that the ``testbed.json`` beside ``run_dir`` recorded."""
    if (run_dir / RUN_FILE).exists():
        return json.loads((run_dir / RUN_FILE).read_text())
    report = json.loads((run_dir.parent / "testbed.json").read_text())
    return {"summary": json.loads((run_dir / "replay" / "summary.json").read_text()),
            "compare": json.loads((run_dir / "replay" / "compare.json").read_text()),
            "faults": report["figures"][run_dir.name]["faults"]}


def compare(run_dir: Path, policy: str, env: dict) -> dict:
    """Simulate the finished replay in ``run_dir/replay`` with ``policy`` and the costs of the
    daemon-on run's store (``env``); returns compare.json."""
    subprocess.run([str(BIN / "hpcsched"), "replay", "--from", str(run_dir / "replay"),
                    "--compare", "--policy", policy], env=env, check=True)
    return json.loads((run_dir / "replay" / "compare.json").read_text())


def _gain(static: float | None, elastic: float | None) -> float | None:
    return None if not static or elastic is None else 1.0 - elastic / static


def figures(runs: dict) -> dict:
    """Real and simulated avg/p99 JCT and makespan per run, the daemon's gain and the targets."""
    out: dict = {}
    for mode, doc in runs.items():
        real, sim = doc["compare"]["runs"]
        out[mode] = {k: {"real": real.get(k), "simulated": sim.get(k)}
                     for k in ("avg_jct", "p99_jct", "makespan", "finished", "jobs", *MIXED)
                     if k in real}
        out[mode]["faults"] = doc["faults"]
    if {"on", "off"} <= set(runs):
        for who in ("real", "simulated"):
            out.setdefault("gain", {})[who] = _gain(out["off"]["avg_jct"][who],
                                                    out["on"]["avg_jct"][who])
            if "elastic_avg_jct" in out["on"]:   # mixed: the gain of hpcsched's own jobs
                out.setdefault("elastic_gain", {})[who] = _gain(
                    out["off"]["elastic_avg_jct"][who], out["on"]["elastic_avg_jct"][who])
    return out


def judge_mixed(fig: dict, all_elastic_gain: float | None) -> list[tuple[str, bool, str]]:
    """Issue 37's targets for a run with other users' plain jobs: their average and p99 wait
    with the daemon on at most 1.05 x off (real), and hpcsched's jobs' real gain at least 0.80
    x the all-elastic run's real gain (``all_elastic_gain``, from its testbed.json)."""
    if "plain_avg_wait" not in fig.get("on", {}) or "off" not in fig:
        return []
    checks = []
    for key, what in (("plain_avg_wait", "average"), ("plain_p99_wait", "p99")):
        on, off = fig["on"][key]["real"], fig["off"][key]["real"]
        ok = on is not None and off is not None and on <= 1.05 * off + 1.0   # 1 s: sacct's grain
        checks.append((f"other users' jobs' {what} wait, daemon on <= 1.05 x off (+1 s)", ok,
                       f"{on:.0f} vs {off:.0f} s" if on is not None and off is not None
                       else "missing"))
    g = fig.get("elastic_gain", {}).get("real")
    if g is not None and all_elastic_gain:
        checks.append(("hpcsched's jobs' gain >= 0.80 x the all-elastic gain",
                       g >= 0.80 * all_elastic_gain,
                       f"{100 * g:.1f}% vs {100 * all_elastic_gain:.1f}% "
                       f"({g / all_elastic_gain:.2f} x)"))
    return checks


def judge(fig: dict) -> list[tuple[str, bool, str]]:
    checks = []
    for mode in ("off", "on"):
        if mode not in fig:
            continue
        real, sim = fig[mode]["avg_jct"]["real"], fig[mode]["avg_jct"]["simulated"]
        ok = bool(real and sim and abs(real / sim - 1) <= 0.20)
        checks.append((f"{mode}: real avg JCT within 20% of simulated", ok,
                       f"{real:.0f} vs {sim:.0f} s" if real and sim else "missing"))
        f = fig[mode]
        lost = f["finished"]["real"] != f["jobs"]["real"]
        faults = f["faults"]
        checks.append((f"{mode}: no job lost, held or pending with free GPUs",
                       not lost and not faults["held"] and not faults["pending_with_free_gpus"],
                       f"{f['finished']['real']}/{f['jobs']['real']} finished, held "
                       f"{faults['held'] or 'none'}, pending with free GPUs "
                       f"{faults['pending_with_free_gpus'] or 'none'}"))
    g = fig.get("gain")
    if g and g["real"] is not None and g["simulated"] is not None:
        checks.append(("daemon's gain (real) within 10 points of simulated",
                       abs(g["real"] - g["simulated"]) <= 0.10,
                       f"{100 * g['real']:.1f}% vs {100 * g['simulated']:.1f}%"))
    return checks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", type=int, default=3, help="Pollux workload number (1..8)")
    p.add_argument("--offset", type=int, default=3, help="first job of the sample")
    p.add_argument("--minutes", type=float, default=40.0,
                   help="simulated static run length the scale aims at")
    p.add_argument("--scale", type=float, default=None, help="time scale (default: chosen)")
    p.add_argument("--interval", type=float, default=10.0, help="daemon round (s)")
    p.add_argument("--runs", default="on,off", help="which runs, in order")
    p.add_argument("--granularity", choices=("auto", "gpu", "node"), default="auto",
                   help="the daemon's [daemon] granularity (auto, the default: gpu, as the "
                        "daemon's own default with grows by extension); replay plans and the "
                        "simulations follow it")
    p.add_argument("--rigid-fraction", type=float, default=0.0,
                   help="replay this fraction of the jobs as other users' plain sbatch jobs "
                        "(hpcsched replay --rigid-fraction)")
    p.add_argument("--all-elastic", type=Path, default=None,
                   help="with --rigid-fraction: the all-elastic run's testbed.json, whose real "
                        "gain hpcsched's jobs' gain is judged against")
    p.add_argument("--extension-qos", default=None, metavar="QOS",
                   help="put extension jobs in this preemptible QOS (the job_submit plugin's "
                        "extension_qos; the dev cluster's is hpcsched-lend), so that Slurm "
                        "itself gives lent GPUs back to other jobs")
    p.add_argument("--submit-stamp", action="store_true",
                   help="the job_submit plugin rewrites a stamp file at every other user's "
                        "submission and the daemon looks at Slurm when it changes ([daemon] "
                        "submit_stamp), instead of at its next event_poll")
    p.add_argument("--keep-free-gpus", type=int, default=0, metavar="N",
                   help="the daemon's keep_free_gpus: N GPUs no grow takes, kept free for other "
                        "users' next jobs (the simulations follow it)")
    p.add_argument("--reuse", action="append", default=[], metavar="MODE=DIR",
                   help="take run MODE (on or off) from a finished run's folder DIR of the same "
                        "workload and scale instead of running it again (repeatable)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "testbed")
    args = p.parse_args()

    env = dict(os.environ, **devcluster.slurm_env(), PATH=f"{BIN}:{os.environ['PATH']}")
    devcluster.up()
    nodes, per_node = 4, 4
    jobs = sample_workload(args.workload, args.offset, nodes * per_node)
    csv_path = write_pollux_csv(jobs, args.out / "workload.csv")
    scale, makespan = (args.scale, None) if args.scale else choose_scale(jobs, nodes, per_node,
                                                                          args.minutes)
    print(f"{len(jobs)} jobs from pollux:{args.workload} (offset {args.offset}); scale {scale:.4g}"
          + (f" (unscaled static makespan {makespan:.0f} s)" if makespan else ""), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = args.out.resolve() / "submitted" if args.submit_stamp else None
    on_cfg = _daemon_config(args.out.resolve(), args.interval, args.granularity, stamp,
                            args.keep_free_gpus)
    granularity = load_config(on_cfg).daemon.plan_granularity
    print(f"daemon plans at {granularity} granularity", flush=True)
    env_on = dict(env, HPCSCHED_CONFIG=str(on_cfg))
    env_on.pop("HPCSCHED_DATABASE_URL", None)
    runs: dict = {mode: reused(Path(d)) for mode, d in (r.split("=", 1) for r in args.reuse)}
    plugin = ((f"extension_qos = {args.extension_qos}\n" if args.extension_qos else "")
              + (f"submit_stamp = {stamp}\n" if stamp else ""))
    if plugin:
        from hpcsched.slurm.devcluster.plugins import set_job_submit
        set_job_submit(None, plugin)
        if args.extension_qos:
            print(f"extension jobs run in QOS {args.extension_qos}", flush=True)
        if stamp:
            print(f"submissions stamp {stamp}; the daemon looks at Slurm when it changes",
                  flush=True)
    try:
        _run_all(args, runs, csv_path, scale, env_on, on_cfg)
    finally:
        if plugin:
            set_job_submit(None, None)
    fig = figures(runs)
    all_elastic = (json.loads(args.all_elastic.read_text())["figures"]["gain"]["real"]
                   if args.all_elastic else None)
    checks = judge(fig) + judge_mixed(fig, all_elastic)
    _print(fig, checks)
    write_report(args.out / "testbed.json", "testbed", workload=f"pollux:{args.workload}",
                 offset=args.offset, granularity=granularity, rigid_fraction=args.rigid_fraction,
                 extension_qos=args.extension_qos, submit_stamp=bool(stamp),
                 keep_free_gpus=args.keep_free_gpus,
                 jobs=len(jobs), scale=scale, interval=args.interval,
                 figures=fig, targets=[{"target": t, "pass": ok, "measured": m}
                                       for t, ok, m in checks])


def _run_all(args, runs: dict, csv_path: Path, scale: float, env_on: dict, on_cfg: Path) -> None:
    """Replay and compare each run of ``--runs`` that ``--reuse`` did not give (into ``runs``)."""
    for mode in args.runs.split(","):
        if mode in runs:
            print(f"{mode}: the finished run in {dict(r.split('=', 1) for r in args.reuse)[mode]}")
            continue
        t0 = time.time()
        run_dir = args.out / mode
        doc = replay(run_dir, csv_path, scale, env_on, daemon=mode == "on",
                     rigid_fraction=args.rigid_fraction)
        doc["compare"] = compare(run_dir, "static" if mode == "off" else load_config(on_cfg).policy.name,
                                 env_on)
        doc["wall_seconds"] = time.time() - t0
        (run_dir / RUN_FILE).write_text(json.dumps(doc, indent=1) + "\n")
        runs[mode] = doc
        print(f"{mode}: done in {doc['wall_seconds'] / 60:.1f} min", flush=True)


def _print(fig: dict, checks) -> None:
    print(f"\n{'run':<5} {'':<10} {'avg JCT':>9} {'p99 JCT':>9} {'makespan':>9}")
    for mode in ("off", "on"):
        if mode not in fig:
            continue
        for who in ("real", "simulated"):
            row = [fig[mode][k][who] for k in ("avg_jct", "p99_jct", "makespan")]
            print(f"{mode:<5} {who:<10} " + " ".join(f"{v:>9.0f}" if v else f"{'-':>9}"
                                                       for v in row))
    if "plain_avg_wait" in fig.get("on", {}):
        print(f"\n{'run':<5} {'':<10} {'plain jobs: avg wait':>21} {'p99 wait':>9} "
              f"{'elastic avg JCT':>16}")
        for mode in ("off", "on"):
            if mode not in fig:   # --runs on: no daemon-off run to set beside it
                continue
            for who in ("real", "simulated"):
                row = [fig[mode][k][who] for k in ("plain_avg_wait", "plain_p99_wait",
                                                   "elastic_avg_jct")]
                print(f"{mode:<5} {who:<10} {row[0] or 0:>21.0f} {row[1] or 0:>9.0f} "
                      f"{row[2] or 0:>16.0f}")
    for key, what in (("gain", "daemon's gain in avg JCT"),
                      ("elastic_gain", "daemon's gain in hpcsched's jobs' avg JCT")):
        if key in fig:
            g = fig[key]
            print(f"{what}: real {100 * (g['real'] or 0):.1f}%, simulated "
                  f"{100 * (g['simulated'] or 0):.1f}%")
    for target, ok, measured in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {target}: {measured}")


if __name__ == "__main__":
    main()
