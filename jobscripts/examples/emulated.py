#!/usr/bin/env python3
#SBATCH --time=04:00:00
"""Emulated application: a Pollux application's training, for testbeds without real GPUs.

What is real: the elastic API (``hpcsched.elastic.ElasticJob``) with its process groups,
gradient all-reduce, gradient-noise measurement, checkpoints, data positions, resizes and
extensions. What is slept: the compute. Each step sleeps what the simulator's physics
(``hpcsched/sim/physics.py``, Pollux's measurements) says the application's step takes at the
job's current placement (GPUs per node, extensions included), local batch size and accumulation
steps, less the time the real step took. Progress and end follow the same physics
(``hpcsched/sim/emulate.py``): each step adds the statistical efficiency of its batch, and the job
ends at ``--scale`` x the application's work, the work ``hpcsched simulate --scale`` counts.

The model is one vector ``w``; a sample's loss is ``w . (G + sigma z)`` with synthetic ``G`` and
noise ``z``, so the gradient noise the API measures is the application's at its current epoch
(its estimate's smoothing shortened by ``--scale``, as the epochs are). The step updates ``w``
by plain SGD written out (``w -= lr * grad``, at a learning rate of 1e-12: the gradient does not
depend on ``w``), not through ``torch.optim``: every ``torch.optim`` step imports
``torch._dynamo`` (``torch/optim/optimizer.py``, ``_use_grad_for_differentiable``), about 1.1 s
of CPU in every worker's start, which is every resize's.
Progress reports give the work left in the simulator's units (``ElasticJob.set_work``).

Submit it with hpcsub, e.g.::

    hpcsub -N 1 --gres=gpu:4 --hpcsched-batch-size 256 --hpcsched-max-nodes 4 \\
        jobscripts/examples/emulated.py --application ncf --scale 0.05

or run it on its own: ``python jobscripts/examples/emulated.py --application ncf --scale 0.001``
(one process, ``--batch-size`` global, default the application's base batch size).
"""

import argparse
import json
import time

import torch

from hpcsched.elastic import ElasticJob
from hpcsched.sim.emulate import Emulation
from hpcsched.sim.physics import APPLICATIONS

LARGEST_BATCH = 2 ** 24  # samples: no job's global batch is larger (the data must outlast it)
LEARNING_RATE = 1e-12    # the update only has to be one (module docstring)


def scale_factor(text: str) -> float:
    x = float(text)
    if not 0.0 < x <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return x


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--application", required=True, choices=APPLICATIONS,
                   help="the Pollux application whose physics the job follows")
    p.add_argument("--scale", type=scale_factor, default=1.0,
                   help="factor in (0, 1] on the application's work (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None,
                   help="global batch size outside hpcsub (default: the application's base)")
    p.add_argument("--claim-work", type=scale_factor, default=1.0, metavar="F",
                   help="report F x the true work left (a lying job, for tests of the daemon's "
                        "claim checks; default 1: the truth)")
    return p.parse_args(argv)


class Synthetic(torch.nn.Module):
    """``w . g``: the gradient with respect to ``w`` is ``g``."""

    def __init__(self, dim: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(dim, dtype=torch.float64))

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return self.w @ g


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    emu = Emulation.of(args.application, args.scale)
    batch = args.batch_size or emu.base_batch_size
    size = emu.dataset_size(batch)
    model = Synthetic(emu.dim)
    job = ElasticJob(dataset_size=size, epochs=emu.data_epochs(size, LARGEST_BATCH),
                     batch_size=batch, seed=args.seed,
                     grad_noise_smoothing=emu.grad_noise_smoothing())
    job.register(model=model, progress=0.0)
    progress = float(job.extra_state["progress"])   # restored by a requeue, sent to newcomers
    def report(progress: float) -> None:
        done = emu.samples(progress)
        job.set_work(done, done + args.claim_work * (emu.samples(emu.total) - done))

    report(progress)
    start = time.monotonic()
    for step in job.steps():
        t0 = time.perf_counter()
        stats = emu.grad_stats(job.global_batch_size, progress)
        model.w.grad = torch.zeros_like(model.w)
        for idx in step.micro_batches:
            if idx:
                g = torch.from_numpy(emu.gradient_sum(stats, idx[0], len(idx), step.epoch, args.seed))
                (model(g) / step.global_samples).backward()
        job.reduce_gradients(model)
        if model.w.grad is None:   # a lost peer voided the step: it does not count
            continue
        with torch.no_grad():
            model.w -= LEARNING_RATE * model.w.grad
        progress += emu.gain(step.global_samples, progress)
        job.extra_state["progress"] = progress
        report(progress)
        compute = emu.step_seconds(job.layout, step.global_samples, step.accumulation_steps)
        time.sleep(max(0.0, compute - (time.perf_counter() - t0)))

    if job.stopped_for is None and job.rank == 0:
        print(json.dumps({"application": args.application, "scale": args.scale,
                          "progress": progress, "total": emu.total, "steps": job.state.step,
                          "seconds": time.monotonic() - start}), flush=True)
    job.close()


if __name__ == "__main__":
    main()
