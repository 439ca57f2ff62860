#!/usr/bin/env python3
"""A plain torch.distributed script that knows nothing of hpcsched.

It reads only the standard environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), as under ``torchrun``, and trains a small linear model with
DistributedDataParallel on synthetic data. Under ``hpcsub`` it runs unchanged, one process per
GPU slot; it cannot be resized in place (hpcsched refuses to try).
"""

import os

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
    # DDP's reducer holds work on the process group: free it first, so nothing of it is left
    # for interpreter shutdown. Then every rank must be done with its collectives before any
    # rank tears gloo down; without the barrier a fast rank's destroy can abort a slower peer
    # ("terminate called without an active exception", seen in CI).
    del model, opt
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
