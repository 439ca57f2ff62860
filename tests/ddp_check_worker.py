"""One rank of the ElasticDDP check (tests/test_ddp_gloo.py): the same steps trained twice in
lockstep, by ElasticDataLoader + ElasticDDP and by the explicit index API (summed loss / N,
collective.allreduce_flat, a GNSTracker of its own); prints one JSON line of the differences.

argv: dataset size, epochs, step at which the process group is re-formed (-1: never), and
optionally ``hooked`` (the all-reduce in ElasticDDP's communication hook, as with extension
members; default: DDP's own) and ``noise_every`` (default 1: the gradient noise compared too).
"""

import copy
import json
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from hpcsched.elastic import ElasticDataLoader, ElasticDDP, ElasticJob
from hpcsched.job.collective import allreduce_flat
from hpcsched.job.gradient_noise import GNSTracker


def main() -> None:
    n, epochs, reform_at = (int(a) for a in sys.argv[1:4])
    hooked = len(sys.argv) > 4 and sys.argv[4] == "hooked"
    noise_every = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    if hooked:
        ElasticJob.survives_lost_workers = property(lambda self: True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    X = torch.randn(n, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (n,))
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(),
                              torch.nn.Linear(7, 3)).double()
    twin = copy.deepcopy(net)
    job = ElasticJob(dataset_size=n, epochs=epochs, batch_size=12, seed=3,
                     grad_noise_smoothing=0.5)
    model = ElasticDDP(job, net, noise_every=noise_every)  # 1: the steps of the reference
    loader = ElasticDataLoader(job, TensorDataset(X, y), num_workers=1, persistent_workers=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=0.1)
    job.register(model=model, optimizer=opt)
    ref = GNSTracker(torch, True, job.global_batch_size, 0.5)
    params = list(twin.parameters())
    worst, padded = 0.0, 0
    for step in job.steps():
        if step.step == reform_at:
            job._group.reform(7, job.rank, job.world_size, 60.0)
        opt.zero_grad()
        for xb, yb in loader.micro_batches(step):
            F.cross_entropy(model(xb), yb).backward()
        padded += step.samples == 0
        opt_twin.zero_grad()
        for idx in step.micro_batches:
            if idx:
                (F.cross_entropy(twin(X[idx]), y[idx], reduction="sum")
                 / step.global_samples).backward()
        ref.begin_step(step, single_rank=False)
        local = ref.local_stats(step)
        flat, stats = allreduce_flat(torch, job._group.dist, params, local, 2)
        ref.after_reduce(step, flat, stats)
        ref.end_step()
        for p, q in zip(net.parameters(), twin.parameters()):
            worst = max(worst, (p.grad - q.grad).abs().max().item())
        opt.step()
        opt_twin.step()
    print(json.dumps({"rank": job.rank, "grad_diff": worst, "padded_steps": int(padded),
                      "steps": job.state.step, "wraps": model.wraps,
                      "gns": job.grad_noise, "gns_explicit": ref.estimate}), flush=True)
    job.close()


if __name__ == "__main__":
    main()
