#!/usr/bin/env python3
#SBATCH --time=00:30:00
"""Elastic data-parallel MLP on scikit-learn's handwritten digits.

The data set (1,797 images of 8x8 pixels, 10 classes) ships inside scikit-learn, so nothing is
downloaded at run time. Submit it with hpcsub, e.g.::

    hpcsub -N 2 --gres=gpu:2 --hpcsched-max-nodes 3 jobscripts/examples/digits_mlp.py --epochs 30

or run it on its own (``python digits_mlp.py``, or under ``torchrun``) -- it then trains with a
fixed configuration and ignores hpcsched.

``--min-step-time`` pads each optimizer step to a minimum wall time (a job that does not scale:
more GPUs, same step time); ``--sample-time`` pads it in proportion to the rank's samples (a job
that scales: more GPUs, shorter steps). On the CPU-only dev
cluster a step of this small model takes milliseconds; padding it stands in for the compute of a
real model so that a run lasts long enough to be resized. It changes nothing numerically.
"""

import argparse
import importlib.util
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from hpcsched.elastic import ElasticJob


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64,
                   help="global batch size when run outside hpcsub (samples)")
    p.add_argument("--lr", type=float, default=0.05,
                   help="learning rate at the submitted global batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-step-time", type=float, default=0.0,
                   help="pad each step to at least this many seconds (see module docstring)")
    p.add_argument("--sample-time", type=float, default=0.0,
                   help="pad each step to at least this many seconds per sample of this rank: "
                        "emulates compute that grows with the local batch, i.e. a job that "
                        "scales with more GPUs")
    return p.parse_args()


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, read from the CSV file scikit-learn ships.

    The same data as ``sklearn.datasets.load_digits(return_X_y=True)``, without importing
    scikit-learn (about 1.8 s per worker start on the dev machine; a resized job starts its
    workers again, so start-up time is resize time).
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("this example needs scikit-learn installed (pip install scikit-learn)")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1], data[:, -1].astype(np.int64)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # same initial model on every rank
    X, y = load_digits()
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    job = ElasticJob(dataset_size=len(X), epochs=args.epochs, batch_size=args.batch_size,
                     seed=args.seed)
    resumed = job.register(model=model, optimizer=opt)
    if job.rank == 0:
        print(f"rank 0/{job.world_size}: {'resumed at step ' + str(job.state.step) if resumed else 'fresh start'}, "
              f"global batch {job.global_batch_size}", flush=True)

    for step in job.steps():
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = args.lr * step.lr_scale
        opt.zero_grad()
        loss_sum = 0.0
        for idx in step.micro_batches:
            if not idx:
                continue
            loss = F.cross_entropy(model(X[idx]), y[idx], reduction="sum")
            (loss / step.global_samples).backward()
            loss_sum += loss.item()
        job.reduce_gradients(model)
        opt.step()
        n = len(step.indices)
        if n:
            job.log(loss=loss_sum / n)
        pad = max(args.min_step_time, args.sample_time * n) - (time.perf_counter() - t0)
        if pad > 0:
            time.sleep(pad)

    if job.stopped_for is None and job.rank == 0:
        with torch.no_grad():
            full_loss = F.cross_entropy(model(X), y).item()
            acc = (model(X).argmax(1) == y).float().mean().item()
        print(json.dumps({"final_loss": full_loss, "train_accuracy": acc,
                          "steps": job.state.step}), flush=True)
    job.close()


if __name__ == "__main__":
    main()
