#!/usr/bin/env python3
"""A plain torch.distributed script that knows nothing of hpcsched.

It reads only the standard environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), as under ``torchrun``, and trains a small linear model with
DistributedDataParallel on synthetic data. Under ``hpcsub`` it runs unchanged, one process per
GPU slot; it cannot be resized in place (hpcsched refuses to try).
"""

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1234 + rank)
    true_w = torch.arange(8, dtype=torch.float32) / 8
    for _ in range(50):
        x = torch.randn(32, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), x @ true_w)
        opt.zero_grad()
        loss.backward()
        opt.step()
    w = model.module.weight.detach().clone()
    gathered = [torch.zeros_like(w) for _ in range(world)]
    dist.all_gather(gathered, w)
    in_sync = all(torch.equal(gathered[0], t) for t in gathered)
    print(f"rank {rank}/{world} node={os.environ.get('SLURMD_NODENAME', '?')} "
          f"local_rank={os.environ['LOCAL_RANK']} loss={loss.item():.4f} in_sync={in_sync}",
          flush=True)
    # Every rank must be done with its collectives before any rank goes. Then leave without
    # running gloo's C++ teardown: destroying the process group (or letting interpreter
    # shutdown do it) can still abort a rank with "terminate called without an active
    # exception" (a worker thread destroyed while joinable; seen in CI after a barrier and an
    # explicit destroy_process_group, torch 2.13 on CPU; pytorch/pytorch#190489 is the same
    # message without the destroy). Past the barrier nothing is left to send; the OS closes the
    # sockets.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
