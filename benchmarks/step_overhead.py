#!/usr/bin/env python3
"""Benchmark: the step time of hpcsched's elastic wrappers against plain DDP, same model, data
and batch (issue 14: target <= 3% overhead at steady state, gradient-noise measurement
included).

Variants, each a training loop over a map-style Dataset with torch's DataLoader (same
``num_workers``, ``pin_memory``) and torch's DistributedDataParallel:

* ``plain``: DistributedSampler + DataLoader + DDP (``no_sync`` on all micro-batches but the
  last), as a torchrun script does;
* ``elastic``: :class:`hpcsched.job.loader.ElasticDataLoader` + :class:`hpcsched.job.ddp.
  ElasticDDP` in an :class:`~hpcsched.elastic.ElasticJob`'s steps, gradient-noise statistics
  measured in DDP's communication hook (the job's default);
* ``elastic-nogns``: the same without the gradient-noise measurement (its share of the cost).

The workers are started here without Slurm (``WORLD_SIZE`` processes on this machine, the
environment torchrun would give them); all variants run in the same processes, in alternating
rounds (``--rounds`` x ``--steps`` optimizer steps each, after ``--warmup`` steps), so drift of
the machine hits them alike. Figures: per variant the median and mean step time (rank 0; on
CUDA synchronised at each step end) over the measured steps, and the overhead of each elastic
variant relative to ``plain`` (ratio of means - 1). A step's time runs from the end of the one
before, so it includes what the training loop does between steps: for ``plain`` a new epoch's
iterator, for the elastic variants the job's own work in ``steps()`` (the last step's metrics
and data position, the step boundary when one is due).

    .venv/bin/python benchmarks/step_overhead.py                     # CPU, gloo, 2 ranks
    .venv/bin/python benchmarks/step_overhead.py --device cuda --backend nccl --world 1

Prints a table and writes JSON (default ``bench-results/step_overhead.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ("plain", "elastic", "elastic-nogns")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="ranks (processes) on this machine")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--local-batch", type=int, default=64, help="samples per rank per micro-batch")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--hidden", type=int, default=1024, help="width of the MLP's hidden layers")
    p.add_argument("--layers", type=int, default=3, help="hidden layers of the MLP")
    p.add_argument("--features", type=int, default=1024, help="input features per sample")
    p.add_argument("--samples", type=int, default=20000, help="samples in the synthetic data set")
    p.add_argument("--workers", type=int, default=1, help="DataLoader worker processes per rank")
    p.add_argument("--warmup", type=int, default=20, help="steps per variant before measuring")
    p.add_argument("--steps", type=int, default=50, help="measured steps per variant per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    p.add_argument("--noise-every", type=int, default=8,
                   help="ElasticDDP's noise_every: measure the gradient noise every k-th step")
    p.add_argument("--boundary-interval", type=float, default=None,
                   help="ElasticJob's boundary_interval in seconds (0: a step boundary at every "
                        "step; default: the job's own)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "step_overhead.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------ one rank
class Synthetic:
    """A map-style data set of random features and 10 classes (made once, the same on every
    rank)."""

    def __init__(self, torch, n: int, features: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, features, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _model(torch, args):
    layers, width = [], args.features
    for _ in range(args.layers):
        layers += [torch.nn.Linear(width, args.hidden), torch.nn.ReLU()]
        width = args.hidden
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def _plain(torch, dist, args, data, device, seconds):
    """Plain DDP: a generator that runs one optimizer step per next() and appends its time."""
    from torch.utils.data import DataLoader, DistributedSampler

    torch.manual_seed(1)
    model = torch.nn.parallel.DistributedDataParallel(_model(torch, args).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, args.local_batch, sampler=sampler, num_workers=args.workers,
                        pin_memory=device.type == "cuda", persistent_workers=args.workers > 0,
                        drop_last=True)
    epoch, t0 = 0, None
    while True:
        t0 = t0 or time.perf_counter()  # a new epoch's iterator counts in the step's time
        sampler.set_epoch(epoch)
        it = iter(loader)
        while True:
            t0 = t0 or time.perf_counter()
            try:
                for a in range(args.accum):
                    x, y = next(it)
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    sync = a == args.accum - 1
                    with (model.no_sync() if not sync else _null()):
                        torch.nn.functional.cross_entropy(model(x), y).backward()
            except StopIteration:
                break
            opt.step()
            opt.zero_grad()
            _sync(torch, device)
            seconds.append(time.perf_counter() - t0)
            t0 = None
            yield
        epoch += 1


def _elastic(torch, args, job, data, device, seconds):
    from hpcsched.job.ddp import ElasticDDP
    from hpcsched.job.loader import ElasticDataLoader

    torch.manual_seed(1)
    model = ElasticDDP(job, _model(torch, args).to(device), noise_every=args.noise_every)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ElasticDataLoader(job, data, num_workers=args.workers,
                               pin_memory=device.type == "cuda",
                               persistent_workers=args.workers > 0)
    job.register(model=model, optimizer=opt)
    steps = job.steps()
    while True:
        t0 = time.perf_counter()  # the job's work between two steps counts (boundary, metrics)
        step = next(steps)
        for g in opt.param_groups:
            g["lr"] = 0.01 * step.lr_scale
        for x, y in loader.micro_batches(step):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        _sync(torch, device)
        seconds.append(time.perf_counter() - t0)
        yield


def _time_calls(obj, name: str, into: list) -> None:
    """Time every call of ``obj.name`` into ``into`` (seconds)."""
    fn = getattr(obj, name)

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            into.append(time.perf_counter() - t0)

    setattr(obj, name, timed)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from hpcsched.elastic import ElasticJob

    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    data = Synthetic(torch, args.samples, args.features)
    pace = {} if args.boundary_interval is None else {"boundary_interval": args.boundary_interval}
    job = ElasticJob(dataset_size=len(data), epochs=10_000,
                     batch_size=world * args.local_batch * args.accum, seed=0,
                     backend=args.backend, **pace)
    if not dist.is_initialized():  # one rank: the job forms no group; plain DDP needs one
        dist.init_process_group(args.backend, rank=0, world_size=1)
    device = job.device if args.device == "cuda" else torch.device("cpu")
    seconds = {v: [] for v in VARIANTS}
    # ElasticJob's own work between steps
    parts = {"step_boundary": [], "data_position": [], "metrics": [], "noise_bookkeeping": []}
    _time_calls(job, "_step_boundary", parts["step_boundary"])
    _time_calls(job.state, "next_step", parts["data_position"])
    _time_calls(job.state, "advance", parts["data_position"])
    _time_calls(job._metrics, "end_step", parts["metrics"])
    _time_calls(job._metrics, "begin_step", parts["metrics"])
    for name in ("begin_step", "end_step", "record"):
        _time_calls(job._noise, name, parts["noise_bookkeeping"])
    # two jobs' worth of state cannot share one ElasticJob's steps: the no-GNS variant is the
    # same loop with the job's measurement switched off for its rounds
    runs = {"plain": _plain(torch, dist, args, data, device, seconds["plain"])}
    elastic = _elastic(torch, args, job, data, device, seconds["elastic"])
    runs["elastic"] = runs["elastic-nogns"] = elastic
    measured = {v: [] for v in VARIANTS}
    for r in range(args.rounds + 1):
        for v in VARIANTS:
            job._noise.enabled = v != "elastic-nogns"
            target = seconds["plain"] if v == "plain" else seconds["elastic"]
            n = args.warmup if r == 0 else args.steps
            start = len(target)
            for _ in range(n):
                next(runs[v])
            if r > 0:
                measured[v] += target[start:start + n]
    if rank == 0:
        print("RESULT " + json.dumps({
            "world": world, "device": str(device), "backend": args.backend,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "seconds": measured, "grad_noise": job.grad_noise,
            "job_parts_ms": {k: 1e3 * sum(v) / max(1, len(seconds["elastic"]))
                             for k, v in parts.items()},
            "boundaries": len(parts["step_boundary"]), "elastic_steps": len(seconds["elastic"])}),
            flush=True)
    dist.barrier()
    os._exit(0)  # DataLoader workers and process groups: no teardown needed for figures


# ------------------------------------------------------------------------------ driver
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarise(result: dict) -> dict:
    out = {}
    for v, xs in result["seconds"].items():
        out[v] = {"median_s": statistics.median(xs), "mean_s": statistics.fmean(xs),
                  "steps": len(xs)}
    base = out["plain"]["mean_s"]
    for v in VARIANTS[1:]:
        out[v]["overhead"] = out[v]["mean_s"] / base - 1.0
        out[v]["overhead_median"] = out[v]["median_s"] / out["plain"]["median_s"] - 1.0
    return out


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    port = _free_port()
    procs = []
    for rank in range(args.world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HPCSCHED_")}
        env.update(RANK=str(rank), WORLD_SIZE=str(args.world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   HPCSCHED_LOCAL_BATCH_SIZE=str(args.local_batch),
                   HPCSCHED_ACCUMULATION_STEPS=str(args.accum),
                   PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
        if args.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", *sys.argv[1:]],
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("a worker failed:\n" + "\n".join(o[-3000:] for o in outs))
    line = next(ln for ln in outs[0].splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    figures = summarise(result)
    print(f"{result['world']} rank(s), {result['device']} ({result['gpu'] or 'CPU'}), "
          f"{result['backend']}; local batch {args.local_batch} x {args.accum} accumulation; "
          f"MLP {args.features}-{args.hidden}x{args.layers}-10; {args.workers} loader worker(s); "
          f"gradient noise measured every {args.noise_every} step(s)")
    print(f"{'variant':16} {'median ms':>10} {'mean ms':>10} {'overhead':>9}")
    for v in VARIANTS:
        f = figures[v]
        over = f"{100 * f['overhead']:+.1f}%" if "overhead" in f else ""
        print(f"{v:16} {1e3 * f['median_s']:10.2f} {1e3 * f['mean_s']:10.2f} {over:>9}")
    print(f"target: elastic <= +3% (measured {100 * figures['elastic']['overhead']:+.1f}%)")
    print("of which ElasticJob's own work per step (the index API pays it too): "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in result["job_parts_ms"].items())
          + f"; {result['boundaries']} step boundaries in {result['elastic_steps']} steps")
    from _report import write_report

    write_report(args.out, "step_overhead", config={k: (str(v) if isinstance(v, Path) else v)
                                                    for k, v in vars(args).items()},
                 world=result["world"], device=result["device"], gpu=result["gpu"],
                 backend=result["backend"], figures=figures, grad_noise=result["grad_noise"],
                 job_parts_ms=result["job_parts_ms"], boundaries=result["boundaries"],
                 elastic_steps=result["elastic_steps"])


if __name__ == "__main__":
    main()
