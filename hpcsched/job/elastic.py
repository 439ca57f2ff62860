"""The elastic training API: what a training script uses to be resized by hpcsched.

A script written against this module gets, at every optimizer step, the indices of the samples
this rank must process (one list per gradient-accumulation micro-batch), the learning-rate
factor in force, and a training loop that stops cleanly when hpcsched asks for a checkpoint.
It runs unchanged under ``hpcsub`` (elastic), ``torchrun`` or plain ``python`` (not elastic)::

    from hpcsched.job.elastic import ElasticJob

    job = ElasticJob(dataset_size=len(X), epochs=10, batch_size=128, seed=0)
    job.register(model=model, optimizer=opt, scheduler=sched)   # restores the last checkpoint
    for step in job.steps():
        for g in opt.param_groups:
            g["lr"] = base_lr * step.lr_scale
        opt.zero_grad()
        for idx in step.micro_batches:                            # this rank's samples
            loss = F.cross_entropy(model(X[idx]), y[idx], reduction="sum") / step.global_samples
            loss.backward()
        job.reduce_gradients(model)                               # sum over ranks = global mean
        opt.step()
        job.log(loss=...)                                         # optional, into the metrics
    job.close()

Guarantees (``docs/control-protocol.md``):

* **Exact data position.** Each epoch visits a seeded permutation of ``range(dataset_size)``.
  The state is ``(epoch, position)``: the next global batch is
  ``perm[position : position + global_batch]``, cut into micro-batches and then across ranks
  (``numpy.array_split``, so a short last batch is spread evenly). Changing the world size or the
  batch size changes only how the *next* samples are cut, so every sample of every epoch is
  processed exactly once whatever the resizes.
* **Resize at step boundaries.** At the start of each step rank 0 checks ``control.json`` (one
  ``stat``), and broadcasts what it found, so every rank applies a new generation at the same
  step: same world size -> new local batch size / accumulation steps / lr scale in place;
  a checkpoint-and-shrink or checkpoint-and-requeue -> a consistent checkpoint, an ``ack.json``
  saying ``checkpointed``, and :meth:`ElasticJob.steps` returns. The launcher does the rest.
* **Checkpoints** hold model, optimizer, LR scheduler, data position and RNG state (torch,
  numpy, python), written atomically by rank 0 (temporary file, fsync, rename, then the
  ``latest`` pointer).

Gradient averaging is explicit (:meth:`ElasticJob.reduce_gradients`): each rank backpropagates
``sum(loss) / global_samples`` and the gradients are summed across ranks, which gives the exact
mean over the global batch even when ranks hold different numbers of samples.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from hpcsched.protocol import files as ctl
from hpcsched.protocol.batching import BatchConfig, split_global_batch

log = logging.getLogger("hpcsched.job.elastic")

CHECKPOINT_FORMAT = "hpcsched.checkpoint/1"
_ACTION_CODE = {"continue": 0, "checkpoint-and-shrink": 1, "checkpoint-and-requeue": 2}
_CODE_ACTION = {v: k for k, v in _ACTION_CODE.items()}


def _env_int(name: str, default: int | None = None) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


def epoch_permutation(dataset_size: int, epoch: int, seed: int) -> np.ndarray:
    """The order in which ``epoch`` visits the data set (same on every rank, every launch)."""
    return np.random.default_rng([seed, epoch]).permutation(dataset_size)


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


@dataclass
class _State:
    epoch: int = 0
    position: int = 0
    step: int = 0
    samples_processed: int = 0


@dataclass
class _Registered:
    model: Any = None
    optimizer: Any = None
    scheduler: Any = None
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- gradient noise

def two_batch_estimate(small_sqr: float, big_sqr: float, small_batch: float,
                       big_batch: float) -> tuple[float, float]:
    """Unbiased single-step estimates of ``(|G|^2, tr(Sigma))`` from gradient norms at two
    batch sizes (McCandlish et al., "An Empirical Model of Large-Batch Training",
    arXiv:1812.06162, Appendix A.1; Pollux, Qiao et al., OSDI'21, §3.1).

    ``small_sqr`` estimates ``E|g_b|^2 = |G|^2 + tr(Sigma) / b`` and ``big_sqr`` estimates
    ``E|g_B|^2 = |G|^2 + tr(Sigma) / B``, with ``b = small_batch < B = big_batch`` samples and
    ``Sigma`` the covariance of a single sample's gradient. Solving the two equations::

        |G|^2     = (B |g_B|^2 - b |g_b|^2) / (B - b)
        tr(Sigma) = (|g_b|^2 - |g_B|^2) / (1/b - 1/B) = (|g_b|^2 - |g_B|^2) b B / (B - b)

    Each value alone is noisy and may be negative; smooth them (:class:`GradientNoiseEstimator`).

    Raises:
        ValueError: unless ``0 < small_batch < big_batch``.
    """
    if not 0 < small_batch < big_batch:
        raise ValueError(f"need 0 < small_batch < big_batch, got {small_batch}, {big_batch}")
    b, B = float(small_batch), float(big_batch)
    grad_sqr = (B * big_sqr - b * small_sqr) / (B - b)
    grad_var = (small_sqr - big_sqr) * (b * B / (B - b))
    return grad_sqr, grad_var


class GradientNoiseEstimator:
    """Smoothed gradient-noise statistics of one job: ``grad_sqr = |G|^2`` (squared norm of the
    true gradient) and ``grad_var = tr(Sigma)`` (trace of the covariance of one sample's
    gradient), the inputs of Pollux's statistical efficiency (Qiao et al., OSDI'21, §3.1).

    Follows AdaptDL's ``adaptdl/torch/gradient_noise_scale.py`` (``GradientNoiseScale``,
    Apache-2.0): each step's two-batch estimate (:func:`two_batch_estimate`) goes into an
    exponential moving average with bias correction (``_update_avg``)::

        theta     = smoothing ** (B / base_batch_size)      # a bigger batch counts for more
        biased   <- theta * biased   + (1 - theta) * value
        unbias   <- theta * unbias   + (1 - theta)
        average   = biased / unbias

    and the averages are clipped when read, as AdaptDL's ``sqr_avg()`` / ``var_avg()`` do:
    ``grad_sqr >= 0`` and ``grad_var >= 1e-6 * base_batch_size``. Units differ from AdaptDL's
    in one place: AdaptDL's ``var_avg`` is the variance of the gradient *at the initial batch
    size* ``M0`` (``tr(Sigma) / M0``); here ``grad_var`` is per sample, so AdaptDL's value (and
    the ``sigma^2`` of :func:`hpcsched.perf.goodput.efficiency`) is ``grad_var / M0``.
    ``base_batch_size`` plays ``M0``'s part in the smoothing (set from the first update when
    not given) and is part of the state, so the memory of the average, in samples, stays the
    same whatever the batch size or world size later.

    Estimates from the differenced single-replica estimator (consecutive steps' gradients,
    ``biased=True``) are biased because the model moved between the two gradients; as in
    AdaptDL, the first unbiased update after biased ones restarts the averages. Nothing else
    resets them: the estimator is batch-size aware, so resizes keep the statistics.
    """

    def __init__(self, smoothing: float = 0.999, base_batch_size: float | None = None):
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.smoothing = smoothing
        self.base_batch_size = base_batch_size
        self._reset()
        self.biased = False

    def _reset(self) -> None:
        self.sqr_biased = self.sqr_unbias = self.var_biased = self.var_unbias = 0.0
        self.count = 0  # updates since the averages (re)started

    def update(self, small_sqr: float, big_sqr: float, small_batch: float, big_batch: float,
               *, biased: bool = False) -> bool:
        """Fold in one step's norms (see :func:`two_batch_estimate` for the arguments).

        Returns False, changing nothing, when the two batch sizes do not allow an estimate
        (``big_batch <= small_batch``) or a value is not finite (AdaptDL skips such steps too:
        e.g. an overflow under mixed precision).
        """
        if not 0 < small_batch < big_batch:
            return False
        small_sqr, big_sqr = float(small_sqr), float(big_sqr)
        if not (math.isfinite(small_sqr) and math.isfinite(big_sqr)):
            return False
        sqr, var = two_batch_estimate(small_sqr, big_sqr, small_batch, big_batch)
        if self.base_batch_size is None:
            self.base_batch_size = float(big_batch)
        if self.biased and not biased:
            self._reset()
        self.biased = biased
        theta = self.smoothing ** (big_batch / self.base_batch_size)
        self.sqr_biased = theta * self.sqr_biased + (1.0 - theta) * sqr
        self.sqr_unbias = theta * self.sqr_unbias + (1.0 - theta)
        self.var_biased = theta * self.var_biased + (1.0 - theta) * var
        self.var_unbias = theta * self.var_unbias + (1.0 - theta)
        self.count += 1
        return True

    @property
    def raw(self) -> tuple[float, float] | None:
        """The unclipped averages ``(|G|^2, tr(Sigma))``; None before the first update."""
        if self.count == 0 or self.sqr_unbias <= 0.0:
            return None
        return self.sqr_biased / self.sqr_unbias, self.var_biased / self.var_unbias

    @property
    def estimate(self) -> tuple[float, float] | None:
        """``(grad_sqr, grad_var)``, clipped as AdaptDL does; None before the first update."""
        raw = self.raw
        if raw is None:
            return None
        floor = 1e-6 * (self.base_batch_size or 1.0)
        return max(raw[0], 0.0), max(raw[1], floor)

    @property
    def noise_scale(self) -> float | None:
        """``B_simple = tr(Sigma) / |G|^2`` (McCandlish et al. 2018, eq. 2.8), in samples;
        ``inf`` when ``|G|^2`` is 0, None before the first update."""
        est = self.estimate
        if est is None:
            return None
        return est[1] / est[0] if est[0] > 0 else math.inf

    def state_dict(self) -> dict:
        """Plain numbers only (loadable with ``torch.load(weights_only=True)``)."""
        return {"smoothing": self.smoothing, "base_batch_size": self.base_batch_size,
                "sqr_biased": self.sqr_biased, "sqr_unbias": self.sqr_unbias,
                "var_biased": self.var_biased, "var_unbias": self.var_unbias,
                "count": self.count, "biased": self.biased}

    def load_state_dict(self, state: dict) -> None:
        self.smoothing = float(state["smoothing"])
        b = state.get("base_batch_size")
        self.base_batch_size = float(b) if b is not None else None
        for k in ("sqr_biased", "sqr_unbias", "var_biased", "var_unbias"):
            setattr(self, k, float(state[k]))
        self.count = int(state["count"])
        self.biased = bool(state["biased"])


class _MicroBatchNorms:
    """Squared norm of each accumulation micro-batch's gradient on a single rank.

    AdaptDL's single-replica estimator with accumulation (``GradientNoiseScale._backward_hook``):
    a hook on each parameter sees that parameter's gradient of one ``backward`` before it is
    accumulated into ``.grad``; the k-th call for a parameter belongs to the k-th micro-batch.
    A hook keeps only a 0-d tensor (no host sync, no copy of the gradient), in a list of its own
    parameter, so hooks that autograd runs on different device threads never share state.
    Costs one norm per parameter per micro-batch; installed only while a job runs on one rank
    with gradient accumulation.
    """

    def __init__(self, torch, params: list):
        self._torch = torch
        self.params = params
        self.ids = [id(p) for p in params]
        dense = (torch.float32, torch.float64)
        self._dot = [p.dtype in dense and p.layout is torch.strided for p in params]
        self.reset()
        self.handles = [p.register_hook(functools.partial(self._hook, i))
                        for i, p in enumerate(params)]

    def reset(self) -> None:
        self.sq: list[list] = [[] for _ in self.params]

    def _hook(self, i: int, grad) -> None:
        g = grad.detach()
        if self._dot[i] and g.layout is self._torch.strided and g.is_contiguous():
            g = g.view(-1)
            self.sq[i].append(self._torch.dot(g, g))
        else:
            self.sq[i].append(
                self._torch.linalg.vector_norm(g, dtype=self._torch.float32).square())

    def per_micro_batch(self, k: int):
        """The k micro-batches' squared norms (a float32 tensor of k), or None when the
        backward calls did not match k micro-batches (every parameter seen k times, or never:
        a parameter outside this step's graph)."""
        seen = [v for v in self.sq if v]
        if not seen or any(len(v) != k for v in seen):
            return None
        torch = self._torch
        dev = seen[0][0].device
        rows = [torch.stack(v).to(dev, torch.float32) for v in seen]
        return torch.stack(rows).sum(0)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def _sqnorm(torch, tensors: list):
    """``sum |t|^2`` over ``tensors`` as a float32 0-d tensor on their device (no host sync)."""
    tensors = [t.detach() for t in tensors]
    if (hasattr(torch, "_foreach_norm") and len({t.device for t in tensors}) == 1
            and all(t.dtype in (torch.float32, torch.float64) for t in tensors)):
        norms = torch._foreach_norm(tensors)  # one call for all (as clip_grad_norm_ does)
    else:  # low precision: accumulate in float32
        norms = [torch.linalg.vector_norm(t, dtype=torch.float32) for t in tensors]
    return torch.stack([n.to(norms[0].device, torch.float32) for n in norms]).square().sum()


class ElasticJob:
    """An elastic data-parallel training job (one instance per rank).

    Args:
        dataset_size: number of samples in the training set.
        epochs: epochs to train; :meth:`steps` ends after the last one.
        batch_size: global batch size when not run by hpcsched (under ``hpcsub`` the launcher's
            configuration wins). Samples.
        seed: seeds the per-epoch permutation (not the model's initialisation).
        backend: torch.distributed backend; default ``nccl`` with CUDA, else ``gloo``.
        init_timeout: seconds to wait for all ranks to join.
        track_grad_noise: estimate the gradient noise in :meth:`reduce_gradients`
            (:attr:`grad_noise`); also switched off by ``HPCSCHED_GRAD_NOISE=0``.

    Environment (set by the launcher; see ``docs/control-protocol.md``): ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (torch.distributed), and
    ``HPCSCHED_*`` (job directory, generation, batch configuration, checkpoint settings).

    Raises:
        ValueError: ``dataset_size`` or ``epochs`` < 1.
    """

    def __init__(
        self,
        dataset_size: int,
        epochs: int,
        batch_size: int = 32,
        seed: int = 0,
        backend: str | None = None,
        init_timeout: float = 300.0,
        track_grad_noise: bool = True,
    ):
        import torch  # imported here so hpcsched's CLI never pays for it

        if dataset_size < 1 or epochs < 1:
            raise ValueError("dataset_size and epochs must be >= 1")
        self._torch = torch
        self.dataset_size = dataset_size
        self.epochs = epochs
        self.seed = seed
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.nodes = _env_int("HPCSCHED_NODES", 1)
        self.launch = _env_int("HPCSCHED_LAUNCH", 0)
        self.restart = _env_int("SLURM_RESTART_COUNT", 0)  # Slurm requeues so far
        self.generation = _env_int("HPCSCHED_GENERATION", 0)
        job_dir = os.environ.get("HPCSCHED_JOB_DIR")
        self.job_dir = Path(job_dir) if job_dir else None
        self.job_uid = self.job_dir.name if self.job_dir else ""
        local = _env_int("HPCSCHED_LOCAL_BATCH_SIZE")
        if local is not None:
            self.batch = BatchConfig(self.world_size, local, _env_int("HPCSCHED_ACCUMULATION_STEPS", 1))
            self.lr_scale = float(os.environ.get("HPCSCHED_LR_SCALE", "1"))
        else:
            self.batch = split_global_batch(max(batch_size, self.world_size), self.world_size)
            self.lr_scale = 1.0
        ckpt = os.environ.get("HPCSCHED_CHECKPOINT_DIR") or (
            str(self.job_dir / "checkpoints") if self.job_dir else ""
        )
        self.checkpoint_dir = Path(ckpt) if ckpt else None
        self.checkpoint_interval = float(os.environ.get("HPCSCHED_CHECKPOINT_INTERVAL", "0") or 0)
        self.record_samples = os.environ.get("HPCSCHED_RECORD_SAMPLES") == "1"
        self.stopped_for: str | None = None  # action that ended steps() early, if any
        self.state = _State()
        self._reg = _Registered()
        self._control_sig: tuple | None = None
        self._last_checkpoint = time.monotonic()
        self._last_progress = 0.0
        self._progress_mark = (time.monotonic(), 0)
        self._pending_log: dict[str, Any] = {}
        self._step_started = time.perf_counter()
        self._compute_time: float | None = None  # this rank's time before the gradient reduction
        self._metrics_fh = None
        self._applied_acked = False
        # gradient noise (see reduce_gradients): the smoothed statistics are checkpointed; the
        # rest is per-process scratch
        self._gns = GradientNoiseEstimator(base_batch_size=self.batch.global_batch_size)
        self._gns_on = track_grad_noise and os.environ.get("HPCSCHED_GRAD_NOISE", "1") != "0"
        self._gns_params: list | None = None   # parameters seen by register / reduce_gradients
        self._gns_micro: _MicroBatchNorms | None = None
        self._gns_prev = None                  # (flat gradient, its sqnorm, samples): 1 rank
        self._gns_pending = None               # (device tensor, fn(values) -> update args)
        self._current: Step | None = None
        self.device = self._select_device()
        self._dist = None
        if self.world_size > 1:
            import torch.distributed as dist

            self._backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
            self._timeout = timedelta(seconds=init_timeout)
            if not dist.is_initialized():
                # One TCPStore for the life of this launch (rank 0 hosts it); each process
                # group formed on it gets its own key prefix, so the survivors of an in-place
                # shrink can form a smaller group without a new port.
                self._store = dist.TCPStore(
                    os.environ.get("MASTER_ADDR", "127.0.0.1"),
                    int(os.environ.get("MASTER_PORT", "29500")),
                    is_master=self.rank == 0, timeout=self._timeout, wait_for_workers=False,
                )
                self._form_group(dist)
            self._dist = dist
        if self.job_dir is not None:
            (self.job_dir / "metrics").mkdir(exist_ok=True)
            path = self.job_dir / "metrics" / f"launch-{self.launch}-rank-{self.rank}.jsonl"
            self._metrics_fh = open(path, "a", buffering=1)
        self._device_identity = self._identify_device()

    def _form_group(self, dist) -> None:
        """Join the process group of the current generation and world size."""
        dist.init_process_group(
            self._backend, store=dist.PrefixStore(f"hpcsched/g{self.generation}/", self._store),
            rank=self.rank, world_size=self.world_size, timeout=self._timeout,
        )

    # ----------------------------------------------------------------- devices
    def _select_device(self):
        torch = self._torch
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _identify_device(self) -> dict:
        """Who am I, physically: node, local index, GPU UUID where CUDA is present."""
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        ident = {"node": node, "local_rank": self.local_rank}
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
        if visible:
            ident["gpu_index"] = visible[self.local_rank % len(visible)]
        if self.device.type == "cuda":
            props = self._torch.cuda.get_device_properties(self.device)
            ident["gpu_uuid"] = str(getattr(props, "uuid", ""))
            ident["gpu_name"] = props.name
        return ident

    # ------------------------------------------------------------ registration
    def register(self, model=None, optimizer=None, scheduler=None, **extra_state) -> bool:
        """Give the objects to checkpoint; restores them from the latest checkpoint if any.

        ``extra_state`` values must be picklable by ``torch.save`` (tensors, numbers, dicts).
        Returns True when a checkpoint was restored.
        """
        self._reg = _Registered(model, optimizer, scheduler, dict(extra_state))
        if model is not None and hasattr(model, "parameters"):
            self._gns_params = [p for p in model.parameters() if p.requires_grad]
        return self._restore()

    @property
    def extra_state(self) -> dict:
        """The ``extra_state`` passed to :meth:`register`, as restored from a checkpoint."""
        return self._reg.extra

    # ------------------------------------------------------------------- loop
    @property
    def global_batch_size(self) -> int:
        return self.batch.global_batch_size

    def steps(self) -> Iterator[Step]:
        """Yield one :class:`Step` per optimizer step until training ends or hpcsched asks
        for a checkpoint (then :attr:`stopped_for` names the action)."""
        while self.state.epoch < self.epochs:
            if not self._step_boundary():
                return
            perm = epoch_permutation(self.dataset_size, self.state.epoch, self.seed)
            micro, global_samples, consumed = rank_micro_batches(
                perm, self.state.position, self.batch, self.rank
            )
            step = Step(
                step=self.state.step, epoch=self.state.epoch, micro_batches=micro,
                global_samples=global_samples, local_batch_size=self.batch.local_batch_size,
                accumulation_steps=self.batch.accumulation_steps, world_size=self.world_size,
                lr_scale=self.lr_scale, generation=self.generation,
            )
            self._current = step
            self._gns_begin_step(step)
            t0 = self._step_started = time.perf_counter()
            self._compute_time = None
            yield step
            self._after_step(step, consumed, time.perf_counter() - t0)
        self._gns_flush()
        if self._gns_micro is not None:  # training is over: no more micro-batch hooks
            self._gns_micro.remove()
            self._gns_micro = None
        self._write_progress(finished=True)

    def log(self, **values: float) -> None:
        """Attach values (e.g. ``loss=0.3``) to this rank's metrics record of the current step."""
        self._pending_log.update({k: float(v) for k, v in values.items()})

    def reduce_gradients(self, model) -> None:
        """Sum the gradients of ``model`` (a module or an iterable of parameters) over all ranks.

        Each rank must have backpropagated ``sum(loss over its samples) / step.global_samples``;
        the sum over ranks is then the mean over the global batch. Missing gradients (a rank
        with no samples this step) count as zero.

        Also measures the gradient noise (:attr:`grad_noise`) at no extra communication: with
        ``n`` samples on this rank and ``N = step.global_samples``, the local gradient before
        the reduction is ``(n / N) g_n`` (``g_n`` = mean gradient of the rank's samples), so
        each rank with samples appends ``n |g_n|^2 = (N^2 / n) |local|^2`` and ``1`` to the
        flattened gradient, and the same all-reduce sums them. With ``k`` ranks holding samples,
        the small batch is ``b = N / k`` and ``|g_b|^2 = sum(n |g_n|^2) / N`` (unbiased for
        ``|G|^2 + tr(Sigma) / b`` even when ranks hold different numbers of samples), and the
        big one is the reduced gradient, ``B = N``. One rank: the micro-batches of gradient
        accumulation are the small batches, else two consecutive steps' gradients
        (AdaptDL's single-replica estimators; see :class:`GradientNoiseEstimator`).
        """
        self._compute_time = time.perf_counter() - self._step_started
        torch = self._torch
        params = [p for p in (model.parameters() if hasattr(model, "parameters") else model)
                  if p.requires_grad]
        step = self._current if self._gns_on else None
        if step is not None:
            self._gns_params = params
        if self._dist is None:
            if step is not None and params:
                self._gns_single_rank(step, params)
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        parts = [g.reshape(-1) for g in grads]
        side = None
        if step is not None and parts:
            dtype = parts[0].dtype
            n_local = sum(len(m) for m in step.micro_batches)
            scale = step.global_samples ** 2 / n_local if n_local else 0.0
            if dtype in (torch.float32, torch.float64) and all(t.dtype == dtype for t in parts):
                # piggyback: 2 more elements in the one all-reduce the gradients need anyway
                flat = torch.cat(parts + [parts[0].new_zeros(2)])
                size = flat.numel() - 2
                if n_local:
                    flat[size] = torch.dot(flat[:size], flat[:size]) * scale
                    flat[size + 1] = 1.0
            else:  # low-precision gradients: the statistics travel in float32, beside them
                flat = torch.cat(parts)
                size = flat.numel()
                sq = _sqnorm(torch, [flat]) * scale
                side = torch.stack([sq, torch.full_like(sq, float(n_local > 0))])
                side_work = self._dist.all_reduce(side, async_op=True)
        else:
            flat = torch.cat(parts)
            size = flat.numel()
        self._dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        if step is not None and parts:
            if side is None:
                big = torch.dot(flat[:size], flat[:size]).reshape(1)
                stats = torch.cat([big, flat[size:]])
            else:
                side_work.wait()
                stats = torch.cat([_sqnorm(torch, [flat]).reshape(1), side])
            N = step.global_samples

            def ranks(v, N=N):
                total, local_sum, k = v
                k = round(k)
                return (local_sum / N, total, N / k, N, False) if k >= 2 else None

            self._gns_set_pending(stats, ranks)

    # --------------------------------------------------------- gradient noise
    @property
    def grad_noise(self) -> tuple[float, float] | None:
        """``(grad_sqr, grad_var)``: smoothed estimates of ``|G|^2`` and of ``tr(Sigma)``, the
        trace of one sample's gradient covariance (:class:`GradientNoiseEstimator`); None
        until the first estimate (or when tracking is off). The same value on every rank."""
        self._gns_flush()
        return self._gns.estimate

    @property
    def gradient_noise_scale(self) -> float | None:
        """``grad_var / grad_sqr``: McCandlish et al.'s simple noise scale ``B_simple``
        (arXiv:1812.06162, §2.2), in samples; None until the first estimate."""
        self._gns_flush()
        return self._gns.noise_scale

    def _gns_begin_step(self, step: Step) -> None:
        """Pick this step's estimator; install or remove the micro-batch hooks."""
        micro = (self._gns_on and self._dist is None and self.batch.accumulation_steps > 1
                 and self._gns_params is not None)
        if micro and self._gns_micro is not None and \
                self._gns_micro.ids != [id(p) for p in self._gns_params]:
            self._gns_micro.remove()
            self._gns_micro = None
        if micro and self._gns_micro is None:
            self._gns_micro = _MicroBatchNorms(self._torch, self._gns_params)
        elif not micro and self._gns_micro is not None:
            self._gns_micro.remove()
            self._gns_micro = None
        if self._gns_micro is not None:
            self._gns_micro.reset()
        if not (self._gns_on and self._dist is None and self.batch.accumulation_steps == 1):
            self._gns_prev = None  # only the differenced estimator keeps a gradient

    def _gns_single_rank(self, step: Step, params: list) -> None:
        """One rank: AdaptDL's estimators without replicas (see :meth:`reduce_gradients`)."""
        torch = self._torch
        N = step.global_samples
        grads = [p.grad for p in params if p.grad is not None]
        if not grads or N <= 0:
            return
        if self.batch.accumulation_steps > 1:
            mb = self._gns_micro
            sizes = [len(m) for m in step.micro_batches if m]
            if mb is None or mb.ids != [id(p) for p in params] or len(sizes) < 2:
                return  # hooks not (yet) on these parameters, or a 1-micro-batch tail step
            per_micro = mb.per_micro_batch(len(sizes))
            if per_micro is None:
                return  # backward calls did not match the micro-batches: no estimate
            # micro-batch a: local gradient (n_a / N) g_a, so n_a |g_a|^2 = N^2 |.|^2 / n_a
            stats = torch.cat([_sqnorm(torch, grads).reshape(1), per_micro.to(grads[0].device)])

            def micro(v, N=N, sizes=sizes):
                local_sum = sum(N * N * s / n for s, n in zip(v[1:], sizes))
                return (local_sum / N, v[0], N / len(sizes), N, False)

            self._gns_set_pending(stats, micro)
            return
        # differenced estimator: this step's gradient and the previous one, two batches
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
        sq = torch.dot(flat, flat)
        prev = self._gns_prev
        self._gns_prev = (flat, sq, N)
        if prev is None or prev[0].numel() != flat.numel():
            return
        p_flat, p_sq, n1 = prev
        stats = torch.stack([p_sq, torch.dot(p_flat, flat), sq])

        def diff(v, n1=n1, n2=N):
            s1, cross, s2 = v
            big = n1 + n2
            total = (n1 * n1 * s1 + 2 * n1 * n2 * cross + n2 * n2 * s2) / (big * big)
            return ((n1 * s1 + n2 * s2) / big, total, big / 2, big, True)

        self._gns_set_pending(stats, diff)

    def _gns_set_pending(self, stats, fn) -> None:
        """Keep this step's few numbers on the device until they are ready (see _gns_flush)."""
        self._gns_flush()  # the previous step's: long finished
        event = None
        if stats.device.type == "cuda":
            event = self._torch.cuda.Event()
            event.record()
        self._gns_pending = (stats, fn, event)

    def _gns_flush(self, block: bool = True) -> None:
        """Fold the pending measurement into the averages. Non-blocking (end of each step)
        it waits for nothing: on a GPU still busy with the step, it leaves the numbers for the
        next call, so the statistics never stall the queue of kernels (the estimate in a
        metrics line may then be one step behind)."""
        if self._gns_pending is None:
            return
        stats, fn, event = self._gns_pending
        if not block and event is not None and not event.query():
            return
        self._gns_pending = None
        args = fn(stats.tolist())
        if args is None:
            return
        if not self._gns.update(*args[:4], biased=args[4]) and args[2] < args[3]:
            log.debug("gradient noise: non-finite gradient norms, step skipped")

    def close(self) -> None:
        """Flush metrics and leave the process group.

        After :meth:`steps` stopped for a resize (:attr:`stopped_for` set) the checkpoint is on
        disk and the launcher is waiting for this process to end, so ``close`` ends it at once
        with status 0 (``os._exit``): interpreter teardown with torch loaded takes seconds,
        and every second here is resize time. Do any cleanup of your own before calling it.
        """
        if self._metrics_fh is not None:
            self._metrics_fh.close()
            self._metrics_fh = None
        if self._gns_micro is not None:
            self._gns_micro.remove()
            self._gns_micro = None
        self._gns_prev = None
        if self.stopped_for is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        if self._dist is not None and self._dist.is_initialized():
            # All ranks leave together: a rank that tears gloo down while a peer is still in a
            # collective can abort that peer at exit.
            self._dist.barrier()
            self._dist.destroy_process_group()
            self._dist = None

    # --------------------------------------------------------- step boundary
    def _read_control_if_changed(self) -> ctl.Control | None:
        """Rank 0: the control file if it changed since the last look and is valid."""
        if self.job_dir is None:
            return None
        path = self.job_dir / "control.json"
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        if sig == self._control_sig:
            return None
        self._control_sig = sig
        try:
            return ctl.read_control(path, self.job_uid)
        except ctl.ProtocolError as exc:
            log.warning("ignoring control file: %s", exc)
            return None

    def _step_boundary(self) -> bool:
        """Collective: agree on any new generation and on checkpoints. False = stop."""
        torch = self._torch
        msg = [0] * 9  # gen, action, nodes, workers/node, local, accum, lr*1e9, checkpoint, world
        if self.rank == 0:
            c = self._read_control_if_changed()
            if c is not None and c.generation > self.generation:
                msg[:7] = [c.generation, _ACTION_CODE[c.action], c.nodes, c.workers_per_node,
                           c.local_batch_size, c.accumulation_steps, round(c.lr_scale * 1e9)]
                msg[8] = c.world_size
            due = self.checkpoint_interval > 0 and (
                time.monotonic() - self._last_checkpoint >= self.checkpoint_interval)
            msg[7] = int(due)
        if self._dist is not None:
            t = torch.tensor(msg, dtype=torch.int64)
            self._dist.broadcast(t, src=0)
            msg = t.tolist()
        gen, code, nodes, wpn, local, accum, lr_e9, due, world = msg
        if not self._applied_acked:
            self._ack("applied", self.generation)
            self._applied_acked = True
        if gen > self.generation:
            action = _CODE_ACTION[code]
            if action == "continue" and world == self.world_size:
                self.generation = gen
                self.batch = BatchConfig(self.world_size, local, accum)
                self.lr_scale = lr_e9 / 1e9
                log.info("generation %d: local batch %d x %d accumulation -> global %d",
                         gen, local, accum, self.batch.global_batch_size)
                self._ack("applied", gen)
            elif action == "continue":
                self.generation = gen  # never act twice on it
                self._ack("rejected", gen, message=(
                    f"'continue' asks for world size {world} but the job runs {self.world_size} "
                    "workers; a world-size change needs checkpoint-and-shrink or -requeue"))
            else:
                path = self.checkpoint()
                self._ack("checkpointed", gen, checkpoint=str(path or ""))
                if action == "checkpoint-and-shrink" and self._can_shrink_in_place(nodes, wpn):
                    return self._shrink_in_place(gen, nodes, local, accum, lr_e9 / 1e9)
                self.stopped_for = action
                self._write_progress()
                return False
        elif due:
            self.checkpoint()
        return True

    def _can_shrink_in_place(self, nodes: int, workers_per_node: int) -> bool:
        return (self._dist is not None and self.job_dir is not None
                and os.environ.get("HPCSCHED_INPLACE_SHRINK") == "1"
                and workers_per_node == _env_int("HPCSCHED_WORKERS_PER_NODE", 0)
                and 1 <= nodes < self.nodes)

    def _shrink_in_place(self, gen: int, nodes: int, local: int, accum: int, scale: float) -> bool:
        """Release nodes without restarting the workers that stay (cf. Amoeba/EDL, Wu et al.,
        arXiv:1909.11985): ranks on the released nodes exit, the others keep their state.

        Ranks are laid out block-wise (rank // workers_per_node = node index in the allocation)
        and ``scontrol update NumNodes=n`` on a running job keeps the first ``n`` nodes of the
        allocation (Slurm 22.05, measured), so ranks ``< n * workers_per_node`` stay. Leavers
        exit (status 0) before the update, since Slurm SIGKILLs tasks on released nodes; rank 0
        then runs the update from inside the job, in the job directory (where Slurm writes
        ``slurm_job_<id>_resize.sh`` for the launcher), and the survivors form a new process
        group. A checkpoint was written first, so any failure here is recoverable.
        """
        new_world = nodes * _env_int("HPCSCHED_WORKERS_PER_NODE", 1)
        left_dir = self.job_dir / "left"
        if self.rank >= new_world:
            left_dir.mkdir(exist_ok=True)
            if self._metrics_fh is not None:
                self._metrics_fh.close()
            (left_dir / f"g{gen}-rank-{self.rank}").touch()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        self._dist.destroy_process_group()
        message = f"shrunk in place to {nodes} node(s); workers not restarted"
        if self.rank == 0:
            expected = {f"g{gen}-rank-{r}" for r in range(new_world, self.world_size)}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if left_dir.is_dir() and expected <= {p.name for p in left_dir.iterdir()}:
                    break
                time.sleep(0.01)
            time.sleep(0.1)  # let the leavers' processes finish exiting
            job_id = os.environ.get("SLURM_JOB_ID", "")
            try:
                subprocess.run(["scontrol", "update", f"JobId={job_id}", f"NumNodes={nodes}"],
                               cwd=self.job_dir, check=True, capture_output=True, text=True,
                               timeout=60)
            except (subprocess.SubprocessError, OSError) as exc:
                err = getattr(exc, "stderr", "") or str(exc)
                message = f"workers shrunk to {new_world} but Slurm kept the nodes: {err.strip()}"
                log.error("%s", message)
        self.world_size, self.nodes, self.generation = new_world, nodes, gen
        self.batch = BatchConfig(new_world, local, accum)
        self.lr_scale = scale
        self._form_group(self._dist)
        log.info("generation %d: %s", gen, message)
        self._ack("applied", gen, message=message)
        return True

    def _after_step(self, step: Step, consumed: int, seconds: float) -> None:
        self._gns_flush(block=False)
        self._current = None
        st = self.state
        st.position += consumed
        st.samples_processed += consumed
        st.step += 1
        if st.position >= self.dataset_size:
            st.epoch += 1
            st.position = 0
        if self._metrics_fh is not None:
            rec = {
                "t": time.time(), "launch": self.launch, "restart": self.restart,
                "generation": step.generation,
                "step": step.step, "epoch": step.epoch, "rank": self.rank,
                "world_size": self.world_size, "nodes": self.nodes,
                "local_batch_size": step.local_batch_size,
                "accumulation_steps": step.accumulation_steps,
                "global_batch_size": self.batch.global_batch_size,
                "global_samples": step.global_samples,
                "samples": sum(len(m) for m in step.micro_batches),
                "step_time": seconds, "compute_time": self._compute_time,
                "device": self._device_identity,
                **self._gns_record(),
                **self._pending_log,
            }
            if self.record_samples:
                rec["indices"] = step.indices
            self._metrics_fh.write(ctl_json(rec) + "\n")
        self._pending_log = {}
        if self.rank == 0 and time.monotonic() - self._last_progress >= 2.0:
            self._write_progress()

    def _gns_record(self) -> dict:
        est = self._gns.estimate
        return {"grad_sqr": est[0] if est else None, "grad_var": est[1] if est else None}

    # ----------------------------------------------------------- checkpoints
    def checkpoint(self) -> Path | None:
        """Collective: write a consistent checkpoint (rank 0 writes; all ranks wait for it).

        Returns the checkpoint path (None when no checkpoint directory is configured).
        """
        path = None
        if self.checkpoint_dir is not None and self.rank == 0:
            path = self._save()
        if self._dist is not None:
            self._dist.barrier()
        self._last_checkpoint = time.monotonic()
        if path is None and self.checkpoint_dir is not None:
            path = self._latest_path()
        return path

    def _state_dict(self) -> dict:
        torch = self._torch
        self._gns_flush()
        np_state = np.random.get_state()
        reg = self._reg
        return {
            "format": CHECKPOINT_FORMAT,
            "time": time.time(),
            "generation": self.generation,
            "world_size": self.world_size,
            "batch": {"local_batch_size": self.batch.local_batch_size,
                      "accumulation_steps": self.batch.accumulation_steps,
                      "global_batch_size": self.batch.global_batch_size,
                      "lr_scale": self.lr_scale},
            "data": {"epoch": self.state.epoch, "position": self.state.position,
                     "step": self.state.step, "samples_processed": self.state.samples_processed,
                     "seed": self.seed, "dataset_size": self.dataset_size},
            "model": reg.model.state_dict() if reg.model is not None else None,
            "optimizer": reg.optimizer.state_dict() if reg.optimizer is not None else None,
            "scheduler": reg.scheduler.state_dict() if reg.scheduler is not None else None,
            "extra": reg.extra,
            "grad_noise": self._gns.state_dict(),
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                          int(np_state[2]), int(np_state[3]), float(np_state[4])],
                "python": random.getstate(),
            },
        }

    def _save(self) -> Path:
        torch = self._torch
        d = self.checkpoint_dir
        d.mkdir(parents=True, exist_ok=True)
        final = d / f"step-{self.state.step:09d}.pt"
        tmp = d / f".{final.name}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            torch.save(self._state_dict(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        ctl.write_json_atomic(d / "latest.json", {"path": final.name, "step": self.state.step,
                                                  "time": time.time()})
        for old in sorted(d.glob("step-*.pt"))[:-2]:  # keep the last two
            old.unlink(missing_ok=True)
        log.info("checkpoint %s (epoch %d, position %d)", final, self.state.epoch,
                 self.state.position)
        return final

    def _latest_path(self) -> Path | None:
        if self.checkpoint_dir is None:
            return None
        try:
            meta = ctl._load(self.checkpoint_dir / "latest.json")
        except ctl.ProtocolError as exc:
            log.warning("%s", exc)
            return None
        if not meta or "path" not in meta:
            return None
        return self.checkpoint_dir / meta["path"]

    def _restore(self) -> bool:
        path = self._latest_path()
        if path is None or not path.exists():
            return False
        torch = self._torch
        ck = torch.load(path, map_location="cpu", weights_only=True)
        if ck.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: not an hpcsched checkpoint")
        data = ck["data"]
        if data["dataset_size"] != self.dataset_size or data["seed"] != self.seed:
            raise ValueError(
                f"{path}: written for dataset_size={data['dataset_size']} seed={data['seed']}, "
                f"this run has dataset_size={self.dataset_size} seed={self.seed}")
        reg = self._reg
        if reg.model is not None and ck["model"] is not None:
            reg.model.load_state_dict(ck["model"])
        if reg.optimizer is not None and ck["optimizer"] is not None:
            reg.optimizer.load_state_dict(ck["optimizer"])
        if reg.scheduler is not None and ck["scheduler"] is not None:
            reg.scheduler.load_state_dict(ck["scheduler"])
        reg.extra.update(ck.get("extra") or {})
        if ck.get("grad_noise"):  # absent in checkpoints written before it existed
            self._gns.load_state_dict(ck["grad_noise"])
        self.state = _State(data["epoch"], data["position"], data["step"],
                            data["samples_processed"])
        rng = ck["rng"]
        torch.set_rng_state(rng["torch"])
        n = rng["numpy"]
        np.random.set_state((n[0], n[1].numpy().astype(np.uint32), n[2], n[3], n[4]))
        random.setstate(_tuples(rng["python"]))
        if self.job_dir is None:  # standalone: keep the checkpoint's batch configuration
            b = ck["batch"]
            self.batch = split_global_batch(b["global_batch_size"], self.world_size)
        log.info("restored %s: epoch %d position %d step %d", path, self.state.epoch,
                 self.state.position, self.state.step)
        return True

    # ------------------------------------------------------------- protocol
    def _ack(self, state: str, generation: int, checkpoint: str = "", message: str = "") -> None:
        if self.rank != 0 or self.job_dir is None:
            return
        ctl.write_ack(self.job_dir / "ack.json", ctl.Ack(
            job_uid=self.job_uid, generation=generation, state=state,
            world_size=self.world_size, nodes=self.nodes,
            global_batch_size=self.batch.global_batch_size,
            local_batch_size=self.batch.local_batch_size,
            accumulation_steps=self.batch.accumulation_steps, step=self.state.step,
            time=time.time(), checkpoint=checkpoint, message=message,
        ))

    def _write_progress(self, finished: bool = False) -> None:
        if self.rank != 0 or self.job_dir is None:
            return
        now = time.monotonic()
        t0, s0 = self._progress_mark
        rate = (self.state.samples_processed - s0) / (now - t0) if now > t0 else 0.0
        self._progress_mark = (now, self.state.samples_processed)
        self._last_progress = now
        est = self._gns.estimate
        ctl.write_progress(self.job_dir / "progress.json", ctl.Progress(
            job_uid=self.job_uid, generation=self.generation, step=self.state.step,
            epoch=self.state.epoch, samples_processed=self.state.samples_processed,
            epoch_position=self.state.position, throughput=rate, world_size=self.world_size,
            global_batch_size=self.batch.global_batch_size, time=time.time(), finished=finished,
            total_samples=self.epochs * self.dataset_size,
            grad_sqr=est[0] if est else None, grad_var=est[1] if est else None,
        ))


def _tuples(x):
    """torch.load gives lists back where random.getstate() had tuples."""
    if isinstance(x, list):
        return tuple(_tuples(v) for v in x)
    return x


def ctl_json(obj: dict) -> str:
    import json

    return json.dumps(obj, separators=(",", ":"))
