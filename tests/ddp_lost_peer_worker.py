"""One rank of the lost-peer check of ElasticDDP (tests/test_ddp_gloo.py): two gloo ranks train
a few steps; at step 3 rank 1 dies before its forward. Rank 0's all-reduce fails in the
communication hook; ElasticDDP must end the backward normally, hand the failure to the job
(``_peer_lost``, here a stand-in that records it) and void the step. Prints one JSON line."""

import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from hpcsched.job.data import Step
from hpcsched.job.ddp import ElasticDDP
from hpcsched.job.gradient_noise import GNSTracker
from hpcsched.job.loader import cursor_of


class StandIn:
    """What ElasticDDP asks of its job, with ``_peer_lost`` recording instead of re-forming."""

    device = torch.device("cpu")
    survives_lost_workers = True   # as with extension members: ElasticDDP's hook all-reduces

    def __init__(self):
        self._void = False
        self._noise = GNSTracker(torch, True, 4, 0.5)
        self.lost: list[str] = []

    def _peer_lost(self, exc):
        self.lost.append(type(exc).__name__)


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    job = StandIn()
    model = ElasticDDP(job, torch.nn.Linear(3, 2))
    cur = cursor_of(job)
    seen = []
    for s in range(5):
        step = Step(step=s, epoch=0, micro_batches=[[2 * rank, 2 * rank + 1]], global_samples=4,
                    local_batch_size=2, accumulation_steps=1, world_size=2, lr_scale=1.0,
                    generation=0)
        if rank == 1 and s == 3:
            os._exit(0)
        job._noise.begin_step(step, single_rank=False)
        cur.step, cur.index, cur.weight, cur.last, cur.uniform = step, 0, 0.5, True, True
        model.zero_grad()
        model(torch.ones(2, 3)).pow(2).mean().backward()
        cur.finish()
        job._noise.end_step()
        seen.append({"step": s, "void": job._void, "lost": list(job.lost),
                     "grads": all(p.grad is not None for p in model.parameters())})
        if job._void:
            break
    print(json.dumps({"rank": rank, "steps": seen, "gns": job._noise.estimate}), flush=True)
    os._exit(0)  # the group is broken: no teardown


if __name__ == "__main__":
    main()
