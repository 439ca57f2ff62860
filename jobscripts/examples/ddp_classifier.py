#!/usr/bin/env python3
"""A small CNN on scikit-learn's digits with DistributedDataParallel, twice: a standard
torchrun-style script (ddp_classifier_plain.py) and the same made elastic by the diff in
docs/training-api.md (ddp_classifier.py).

The data (1,797 images of 8x8 pixels, 10 classes) is read from the CSV file scikit-learn ships
(nothing is downloaded) into a map-style Dataset, loaded by a DataLoader with worker processes.
Run the plain script with ``torchrun --nproc-per-node 2 ddp_classifier_plain.py``. Submit the
elastic one with hpcsub, e.g.::

    hpcsub -N 1 --gres=gpu:2 --hpcsched-max-nodes 2 jobscripts/examples/ddp_classifier.py --epochs 30

(``--hpcsched-record-samples`` records every step's sample indices in the job's metrics, to
check exactly-once), or run it under ``torchrun`` or plain ``python``: it then trains with a
fixed configuration. ``--batch-time`` pads each micro-batch with sleep, standing in for the
compute of a bigger model on the CPU-only dev cluster (it changes nothing numerically).
"""

import argparse
import importlib.util
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from hpcsched.elastic import ElasticDataLoader, ElasticDDP, ElasticJob


class Digits(torch.utils.data.Dataset):
    """scikit-learn's digits as (1x8x8 image in [0, 1], label)."""

    def __init__(self):
        spec = importlib.util.find_spec("sklearn")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("this example needs scikit-learn installed (pip install scikit-learn)")
        path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
        data = np.loadtxt(path, delimiter=",")
        self.x = torch.tensor(data[:, :-1] / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)
        self.y = torch.tensor(data[:, -1], dtype=torch.long)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def small_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 2 * 2, 10))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64, help="global batch size (samples)")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate at --batch-size")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-time", type=float, default=0.0,
                   help="seconds of extra compute per micro-batch (stands in for a bigger model)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # the same initial model on every rank
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    dataset = Digits()
    job = ElasticJob(dataset_size=len(dataset), epochs=args.epochs, batch_size=args.batch_size, seed=args.seed)
    loader = ElasticDataLoader(job, dataset,
                                         num_workers=args.workers, pin_memory=cuda, persistent_workers=args.workers > 0)
    net = small_cnn().to(device)
    model = ElasticDDP(job, net)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    job.register(model=model, optimizer=opt)
    for step in job.steps():
        opt.param_groups[0]["lr"] = args.lr * step.lr_scale
        for x, y in loader.micro_batches(step):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            time.sleep(args.batch_time)
        opt.step()
        opt.zero_grad()
    job.close()
    if rank == 0:
        with torch.no_grad():
            out = net(dataset.x.to(device))
            print(json.dumps({"final_loss": F.cross_entropy(out, dataset.y.to(device)).item(),
                              "train_accuracy": (out.argmax(1).cpu() == dataset.y).float().mean().item()}), flush=True)


if __name__ == "__main__":
    main()
