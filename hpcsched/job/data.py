"""Where training is in the data, and how the next global batch is cut across ranks.

Each epoch visits a seeded permutation of ``range(dataset_size)``. The position is
``(epoch, position)``: the next global batch is ``perm[position : position + global_batch]``,
cut into accumulation micro-batches and then across ranks (``numpy.array_split``, so a short
last batch is spread evenly). A resize changes only how the *next* samples are cut, so every
sample of every epoch is processed exactly once whatever the resizes (the same idea as AdaptDL's
``ElasticSampler``, which keeps the index of the next sample across restarts).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hpcsched.protocol.batching import BatchConfig


@lru_cache(maxsize=2)
def epoch_permutation(dataset_size: int, epoch: int, seed: int) -> np.ndarray:
    """The order in which ``epoch`` visits the data set (same on every rank, every launch):
    ``dataset_size`` sample indices, read-only. Cached (this epoch's and the last), so a step
    does not draw it again: O(dataset_size) per draw, 24 ms at ImageNet's 1.28 M samples."""
    perm = np.random.default_rng([seed, epoch]).permutation(dataset_size)
    perm.flags.writeable = False
    return perm


def rank_micro_batches(
    perm: np.ndarray, position: int, cfg: BatchConfig, rank: int
) -> tuple[list[list[int]], int, int]:
    """Cut the next global batch of ``perm`` (starting at ``position``) for ``rank``.

    Returns ``(micro_batches, global_samples, consumed)``: this rank's index lists (one per
    accumulation micro-batch, possibly empty), the number of samples the step processes over all
    ranks, and how far the position advances (== global_samples).
    """
    take = min(cfg.global_batch_size, len(perm) - position)
    chunk = perm[position : position + take]
    per_micro = cfg.world_size * cfg.local_batch_size
    micro: list[list[int]] = []
    for a in range(cfg.accumulation_steps):
        sub = chunk[a * per_micro : (a + 1) * per_micro]
        if len(sub) == 0:
            break
        micro.append(np.array_split(sub, cfg.world_size)[rank].tolist())
    return micro, take, take


@dataclass
class Step:
    """One optimizer step as seen by one rank.

    Attributes:
        step: optimizer steps completed before this one (0-based index, global).
        epoch: 0-based epoch this step belongs to.
        micro_batches: this rank's sample indices, one list per accumulation micro-batch
            (a list may be empty at the end of an epoch).
        global_samples: samples in this step over all ranks (divide the summed loss by it).
        local_batch_size, accumulation_steps, world_size: the configuration in force.
        lr_scale: factor for the base learning rate (see :mod:`hpcsched.protocol.batching`).
        generation: control generation in force.
    """

    step: int
    epoch: int
    micro_batches: list[list[int]]
    global_samples: int
    local_batch_size: int
    accumulation_steps: int
    world_size: int
    lr_scale: float
    generation: int

    @property
    def indices(self) -> list[int]:
        """All of this rank's indices for the step."""
        return [i for mb in self.micro_batches for i in mb]

    @property
    def samples(self) -> int:
        """This rank's samples in the step (all micro-batches)."""
        return sum(len(m) for m in self.micro_batches)


class DataPosition:
    """The data position of a run over ``epochs`` epochs of a data set (the same on every rank).

    Attributes:
        dataset_size: samples in the data set. epochs: epochs to train. seed: seeds the
            per-epoch permutation.
        epoch: current epoch (0-based). position: samples of this epoch already processed.
        step: optimizer steps done. samples_processed: samples trained on since the run began
            (all epochs, all ranks).
    """

    def __init__(self, dataset_size: int, epochs: int, seed: int):
        self.dataset_size, self.epochs, self.seed = dataset_size, epochs, seed
        self.epoch = self.position = self.step = self.samples_processed = 0

    @property
    def finished(self) -> bool:
        """All epochs are done."""
        return self.epoch >= self.epochs

    @property
    def total_samples(self) -> int:
        """Samples the whole run trains on (epochs x dataset size)."""
        return self.epochs * self.dataset_size

    def next_step(self, batch: BatchConfig, rank: int, lr_scale: float,
                  generation: int) -> tuple[Step, int]:
        """``rank``'s share of the next global batch, and how far it advances the position."""
        perm = epoch_permutation(self.dataset_size, self.epoch, self.seed)
        micro, global_samples, consumed = rank_micro_batches(perm, self.position, batch, rank)
        step = Step(step=self.step, epoch=self.epoch, micro_batches=micro,
                    global_samples=global_samples, local_batch_size=batch.local_batch_size,
                    accumulation_steps=batch.accumulation_steps, world_size=batch.world_size,
                    lr_scale=lr_scale, generation=generation)
        return step, consumed

    def advance(self, consumed: int) -> None:
        """One optimizer step that processed ``consumed`` samples is done."""
        self.position += consumed
        self.samples_processed += consumed
        self.step += 1
        if self.position >= self.dataset_size:
            self.epoch += 1
            self.position = 0

    def state_dict(self) -> dict:
        """The checkpoint's ``data`` entry."""
        return {"epoch": self.epoch, "position": self.position, "step": self.step,
                "samples_processed": self.samples_processed, "seed": self.seed,
                "dataset_size": self.dataset_size}

    def load_state_dict(self, data: dict, source: object = "checkpoint") -> None:
        """Continue from a checkpoint's ``data`` entry.

        Raises:
            ValueError: it was written for another data set size or seed (``source`` names the
                checkpoint in the message).
        """
        if data["dataset_size"] != self.dataset_size or data["seed"] != self.seed:
            raise ValueError(
                f"{source}: written for dataset_size={data['dataset_size']} seed={data['seed']}, "
                f"this run has dataset_size={self.dataset_size} seed={self.seed}")
        self.epoch, self.position = data["epoch"], data["position"]
        self.step, self.samples_processed = data["step"], data["samples_processed"]
