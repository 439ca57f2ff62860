"""An elastic DataLoader: torch's own :class:`torch.utils.data.DataLoader` fed, micro-batch by
micro-batch, from the exact data position of an :class:`hpcsched.elastic.ElasticJob`.

Usage (the micro-batches of each step, with the DataLoader's worker processes, prefetching,
pinned memory and collate function)::

    loader = ElasticDataLoader(job, dataset, num_workers=4, pin_memory=True)
    for step in job.steps():
        for x, y in loader.micro_batches(step):   # this rank's micro-batches of the step
            ...

How it stays exact: the DataLoader is given a ``batch_sampler`` whose index lists are computed
with the same cutting as the index API (:func:`hpcsched.job.data.rank_micro_batches`), so the
micro-batches of a step are exactly ``step.micro_batches`` and every guarantee of the index API
(every sample of every epoch once, across batch-size and world-size changes, requeues and
extension joins) carries over. To keep the DataLoader's prefetching across steps, the sampler
runs ahead: it predicts the next steps' index lists from the configuration in force (the cutting
is a pure function of epoch, position, batch configuration and rank). Every batch that comes
out of the DataLoader is checked against the step's own indices before it is handed out; on the
first mismatch (a new batch configuration or world size, a rank that changed, a voided step)
the prefetched batches are dropped and the DataLoader iterator restarts from the step's true
indices (persistent workers are kept: torch resets their iterator, discarding what they had
prefetched). A stale batch is never yielded.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator

from hpcsched.job.data import DataPosition, Step, epoch_permutation, rank_micro_batches
from hpcsched.protocol.batching import BatchConfig

#: keyword arguments of DataLoader that the elastic loader sets itself
_OWNED = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "in_order")


def rank_lists(micro_batches: list[list[int]]) -> tuple[list[list[int]], bool]:
    """The index lists this rank loads for a step: its non-empty micro-batches, or, when it has
    no sample in the step, one padding list ``[0]`` whose gradient counts zero (so the rank still
    takes part in the all-reduce). Returns ``(lists, padded)``."""
    lists = [m for m in micro_batches if m]
    return (lists, False) if lists else ([[0]], True)


class MicroBatchCursor:
    """Which micro-batch of which step the training loop is on (shared by the loader and
    :class:`hpcsched.job.ddp.ElasticDDP` of one job).

    Attributes:
        step: the :class:`~hpcsched.job.data.Step` being iterated, None outside.
        index: the micro-batch handed out last (0-based, among this rank's lists).
        weight: its share of the global batch, ``samples / step.global_samples`` (0 for
            padding): the factor that turns its mean loss into its part of the global mean.
        last: it is this rank's last micro-batch of the step (the one DDP synchronises on).
        uniform: all of this rank's micro-batches of the step have the same weight (every
            step but a short last one of an epoch).
    """

    def __init__(self):
        self.step: Step | None = None
        self.index, self.weight, self.last, self.uniform = 0, 1.0, True, True
        self.finishers: list[Callable[[Step], None]] = []

    def finish(self) -> None:
        """The loop asked for the micro-batch after the last: every backward of the step is
        done. Runs the finishers (e.g. ElasticDDP's gradient-noise measurement)."""
        step, self.step = self.step, None
        if step is not None:
            for f in self.finishers:
                f(step)


_CURSORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cursor_of(job) -> MicroBatchCursor:
    """The micro-batch cursor of ``job`` (one per job, created on first use)."""
    cur = _CURSORS.get(job)
    if cur is None:
        cur = _CURSORS[job] = MicroBatchCursor()
    return cur


class _Plan:
    """The DataLoader's ``batch_sampler``: yields the lists of the run armed last, and notes each
    one it gives out (the DataLoader hands batches back in the same order)."""

    def __init__(self):
        self.run: Iterator[list[int]] = iter(())
        self.given: deque[list[int]] = deque()

    def __iter__(self):
        for lists in self.run:
            self.given.append(lists)
            yield lists


class ElasticDataLoader:
    """This rank's micro-batches of each step of ``job``, loaded by a torch DataLoader.

    Args:
        job: the :class:`hpcsched.elastic.ElasticJob` whose steps are iterated.
        dataset: a map-style :class:`torch.utils.data.Dataset` of ``job.dataset_size`` samples
            (``dataset[i]`` for the indices of the job's permutation).
        **loader_args: passed to :class:`torch.utils.data.DataLoader` (``num_workers``,
            ``pin_memory``, ``collate_fn``, ``persistent_workers``, ``prefetch_factor``,
            ``worker_init_fn``, ``multiprocessing_context``, ``timeout``...), except the
            batching arguments the job decides (``batch_size``, ``shuffle``, ``sampler``,
            ``batch_sampler``, ``drop_last``, ``in_order``).

    Attributes:
        loader: the underlying DataLoader.
        restarts: times the DataLoader iterator was restarted (the first start included):
            one per configuration change, plus one per step whose indices were not predicted.

    Raises:
        TypeError: ``dataset`` is an :class:`~torch.utils.data.IterableDataset` (an iterable
            data set decides its own order, so no exact data position can be kept across
            resizes: each worker would re-read or skip samples after a change; wrap it as a
            map-style data set, or use the index API), or a batching argument was given.
        ValueError: ``len(dataset)`` is not ``job.dataset_size``.
    """

    def __init__(self, job, dataset, **loader_args):
        from torch.utils.data import DataLoader, IterableDataset

        if isinstance(dataset, IterableDataset):
            raise TypeError(
                "ElasticDataLoader needs a map-style Dataset: an IterableDataset decides its own "
                "order, so the job cannot keep an exact data position across resizes (samples "
                "would be repeated or skipped); index it (a map-style Dataset) or use the index "
                "API (step.micro_batches)")
        owned = sorted(set(loader_args) & set(_OWNED))
        if owned:
            raise TypeError(f"ElasticDataLoader sets {', '.join(owned)} itself (the job decides "
                            "the batches)")
        if len(dataset) != job.dataset_size:
            raise ValueError(f"the dataset has {len(dataset)} samples, the job "
                             f"{job.dataset_size}")
        self._job = job
        self._plan = _Plan()
        self.loader = DataLoader(dataset, batch_sampler=self._plan, **loader_args)
        self._it = None
        self.restarts = 0
        self._cursor = cursor_of(job)

    def __iter__(self):
        raise TypeError("iterate loader.micro_batches(step) for each step of job.steps()")

    def micro_batches(self, step: Step) -> Iterator:
        """This rank's micro-batches of ``step`` (a step of ``job.steps()``, in order), as the
        DataLoader gives them (collated). A rank with no sample in the step gets one padding
        micro-batch (sample 0) whose gradient :class:`~hpcsched.job.ddp.ElasticDDP` weighs
        zero; ``step.samples`` counts the real ones. Exhaust it once per step (a ``for``
        loop): after the last micro-batch the step's gradients are final."""
        lists, padded = rank_lists(step.micro_batches)
        cur = self._cursor
        cur.step = step
        n_global = step.global_samples
        cur.uniform = len({len(m) for m in lists}) == 1
        for k, want in enumerate(lists):
            batch = self._next(step, lists, k)
            cur.index, cur.last = k, k == len(lists) - 1
            cur.weight = 0.0 if padded else len(want) / n_global
            yield batch
        cur.finish()

    # ----------------------------------------------------------------- internals
    def _next(self, step: Step, lists: list[list[int]], k: int):
        if self._it is not None:
            try:
                batch = next(self._it)
                if self._plan.given.popleft() == lists[k]:
                    return batch
            except StopIteration:
                pass
        self._restart(self._run(step, lists[k:]))
        batch = next(self._it)
        got = self._plan.given.popleft()
        assert got == lists[k], "DataLoader gave the batches out of order"
        return batch

    def _restart(self, run: Iterator[list[int]]) -> None:
        """Drop what was prefetched and start the DataLoader over on ``run``."""
        self._it = None  # a non-persistent iterator shuts its workers down when dropped
        self._plan.given.clear()
        self._plan.run = run
        self._it = iter(self.loader)  # persistent workers: torch resets them, drops their queue
        self.restarts += 1

    def _run(self, step: Step, rest: list[list[int]]) -> Iterator[list[int]]:
        """``rest`` (this step's lists still to load), then the lists of the steps that follow
        at the configuration in force, as the job will cut them."""
        job = self._job  # the position now (a generator's body runs later, when pulled)
        pos = DataPosition(job.dataset_size, job.epochs, job.seed)
        pos.epoch, pos.position = job.state.epoch, job.state.position
        pos.advance(step.global_samples)
        cfg = BatchConfig(step.world_size, step.local_batch_size, step.accumulation_steps)
        return self._predicted(rest, pos, cfg, job.rank)

    @staticmethod
    def _predicted(rest, pos: DataPosition, cfg: BatchConfig, rank: int):
        yield from rest
        perm, epoch = None, -1
        while not pos.finished:
            if pos.epoch != epoch:  # one permutation per epoch (O(dataset) to draw)
                perm, epoch = epoch_permutation(pos.dataset_size, pos.epoch, pos.seed), pos.epoch
            micro, _, consumed = rank_micro_batches(perm, pos.position, cfg, rank)
            yield from rank_lists(micro)[0]
            pos.advance(consumed)
