"""A job's resize limits, fixed at submission: one definition for hpcsub, the job's spec, the
daemon, the actuator, the policies' view and the store.

The limits come from ``hpcsub``'s options (``--hpcsched-min-nodes``, ``--hpcsched-max-batch-size``,
...) and are written to the job's ``spec.json`` (:class:`hpcsched.protocol.jobdir.JobSpec`,
where the base batch size is spelled ``batch_size``). Units: nodes, GPUs (one worker per GPU),
samples (batch sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcsched.protocol.batching import LR_RULES, BatchConfig, fit_batch, lr_scale


@dataclass(frozen=True)
class JobLimits:
    """The range within which hpcsched may resize one job.

    Attributes:
        workers_per_node: workers on each node, one per GPU (so: GPUs per node), >= 1.
        min_nodes, max_nodes: node counts the job may run on, ``1 <= min_nodes <= max_nodes``.
        min_batch_size, max_batch_size: global batch sizes (samples per optimizer step, summed
            over all workers) the job may run with, ``1 <= min_batch_size <= max_batch_size``.
        max_local_batch_size: per-GPU limit on the samples of one micro-batch (what fits in GPU
            memory), >= 1; above ``world_size * max_local_batch_size`` a global batch is reached
            by gradient accumulation. ``None``: no limit.
        base_batch_size: the global batch size the job was submitted with (samples), within
            ``[min_batch_size, max_batch_size]``; the learning rate the script sets is for it.
        lr_scaling: how the learning rate follows the global batch size, one of
            :data:`hpcsched.protocol.batching.LR_RULES`: ``linear`` (Goyal et al. 2017, §2.1),
            ``sqrt`` (Krizhevsky 2014, §5), ``none``, or the adaptive ``adascale`` (Johnson et
            al., ICML'20) and ``adamscale`` (its square root), which the job computes at every
            step from its gradient noise (:func:`hpcsched.protocol.batching.adaptive_lr_scale`).
        min_gpu_count: the fewest GPUs when that is not a whole number of nodes
            (``--hpcsched-min-gpus 2`` on 4 GPUs per node): a layout (extension allocations, or
            a requeue onto fewer GPUs per node) may go down to it, whole-node sizes stop at
            ``min_nodes``; ``1 <= min_gpu_count <= min_nodes * workers_per_node``. None:
            ``min_nodes * workers_per_node``.

    Also ``max_batch_size >= min_nodes * workers_per_node``: at the smallest size every GPU
    still gets at least one sample.

    Raises:
        ValueError: on construction, for any rule above that does not hold (the message names
            the field and the value).
    """

    workers_per_node: int
    min_nodes: int
    max_nodes: int
    min_batch_size: int
    max_batch_size: int
    max_local_batch_size: int | None
    base_batch_size: int
    lr_scaling: str = "linear"
    min_gpu_count: int | None = None

    def __post_init__(self) -> None:
        for name in ("workers_per_node", "min_nodes", "max_nodes", "min_batch_size",
                     "max_batch_size", "base_batch_size"):
            _check_count(name, getattr(self, name))
        if self.max_local_batch_size is not None:
            _check_count("max_local_batch_size", self.max_local_batch_size)
        if self.min_gpu_count is not None:
            _check_count("min_gpu_count", self.min_gpu_count)
            if self.min_gpu_count > self.min_nodes * self.workers_per_node:
                raise ValueError(f"min_gpu_count {self.min_gpu_count} exceeds the "
                                 f"{self.min_nodes * self.workers_per_node} GPUs of min_nodes")
        if self.lr_scaling not in LR_RULES:
            raise ValueError(f"lr_scaling {self.lr_scaling!r} is not one of {', '.join(LR_RULES)}")
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes {self.min_nodes} exceeds max_nodes {self.max_nodes}")
        if self.min_batch_size > self.max_batch_size:
            raise ValueError(f"min_batch_size {self.min_batch_size} exceeds max_batch_size "
                             f"{self.max_batch_size}")
        if not self.allows_batch_size(self.base_batch_size):
            raise ValueError(f"base_batch_size {self.base_batch_size} is outside "
                             f"[{self.min_batch_size}, {self.max_batch_size}]")
        if self.max_batch_size < self.min_gpus:
            raise ValueError(f"max_batch_size {self.max_batch_size} is smaller than the "
                             f"{self.min_gpus} GPUs of the smallest size: every GPU needs a sample")

    @property
    def min_gpus(self) -> int:
        """GPUs at the smallest size (:attr:`min_gpu_count`, else
        ``min_nodes * workers_per_node``)."""
        return self.min_gpu_count or self.min_nodes * self.workers_per_node

    @property
    def max_gpus(self) -> int:
        """GPUs at the largest size (``max_nodes * workers_per_node``)."""
        return self.max_nodes * self.workers_per_node

    def allows_nodes(self, nodes: int) -> bool:
        """Whether ``nodes`` is within ``[min_nodes, max_nodes]``."""
        return self.min_nodes <= nodes <= self.max_nodes

    def allows_batch_size(self, global_batch_size: int) -> bool:
        """Whether ``global_batch_size`` (samples) is within ``[min_batch_size, max_batch_size]``."""
        return self.min_batch_size <= global_batch_size <= self.max_batch_size

    def nodes_for_gpus(self, gpus: int) -> int:
        """The node count that gives ``gpus`` GPUs.

        Raises:
            ValueError: ``gpus`` is not a multiple of ``workers_per_node``.
        """
        if gpus % self.workers_per_node:
            raise ValueError(f"{gpus} GPUs is not a multiple of the {self.workers_per_node} "
                             "GPUs per node")
        return gpus // self.workers_per_node

    def fit_batch(self, requested_global: int, nodes: int) -> BatchConfig:
        """The batch configuration on ``nodes`` nodes nearest ``requested_global`` samples within
        these limits (:func:`hpcsched.protocol.batching.fit_batch`).

        Raises:
            BatchSizeError: no batch size in range fits ``nodes * workers_per_node`` GPUs.
        """
        return fit_batch(requested_global, nodes * self.workers_per_node,
                         min_global=self.min_batch_size, max_global=self.max_batch_size,
                         max_local_batch_size=self.max_local_batch_size)

    def fit_batch_gpus(self, requested_global: int, gpus: int) -> BatchConfig:
        """:meth:`fit_batch` on ``gpus`` workers in any layout (extension allocations).

        Raises:
            BatchSizeError: no batch size in range fits ``gpus`` GPUs.
        """
        return fit_batch(requested_global, gpus, min_global=self.min_batch_size,
                         max_global=self.max_batch_size,
                         max_local_batch_size=self.max_local_batch_size)

    def lr_scale(self, global_batch_size: int) -> float:
        """Learning-rate factor at ``global_batch_size`` relative to ``base_batch_size``, by
        ``lr_scaling`` (:func:`hpcsched.protocol.batching.lr_scale`)."""
        return lr_scale(self.lr_scaling, global_batch_size, self.base_batch_size)


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
