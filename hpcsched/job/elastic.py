"""The elastic training API: what a training script uses to be resized by hpcsched.

A script written against this module gets, at every optimizer step, the indices of the samples
this rank must process (one list per gradient-accumulation micro-batch), the learning-rate
factor in force, and a training loop that stops cleanly when hpcsched asks for a checkpoint.
It runs unchanged under ``hpcsub`` (elastic), ``torchrun`` or plain ``python`` (not elastic)::

    from hpcsched.elastic import ElasticJob

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
* **Growing without a restart** (``docs/extensions.md``): a ``reform`` generation adds GPUs as
  extension Slurm jobs; their workers run this same script, and in ``register`` they wait to be
  invited into the running group at a step boundary, then take model, optimizer, scheduler,
  data position and RNG state from rank 0 (so a newcomer's ``rank`` and ``world_size`` are
  final once ``register`` returns). A worker lost with its extension voids the step in flight
  (its gradients are dropped, so ``optimizer.step()`` changes nothing) and the survivors go on.
* **Checkpoints** hold model, optimizer, LR scheduler, data position and RNG state (torch,
  numpy, python), written atomically by rank 0 (temporary file, fsync, rename, then the
  ``latest`` pointer).

Gradient averaging is explicit (:meth:`ElasticJob.reduce_gradients`): each rank backpropagates
``sum(loss) / global_samples`` and the gradients are summed across ranks, which gives the exact
mean over the global batch even when ranks hold different numbers of samples.

:class:`ElasticJob` is a facade over its collaborators in :mod:`hpcsched.job`: ``data`` (data
position and cutting), ``collective`` (process group, all-reduce, in-place shrink),
``gradient_noise``, ``boundary`` (control polling, acks, progress), ``checkpoint`` and
``metrics``; what it does at step boundaries and for checkpoints is the mixin
:mod:`hpcsched.job.elastic_boundary`, how its workers change while they run the mixin
:mod:`hpcsched.job.elastic_membership`; the environment it reads is :mod:`hpcsched.protocol.env`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

from hpcsched.job.boundary import AGREE_INTERVAL, ControlWatcher, InForce, Pace, Reporter
from hpcsched.job.checkpoint import CHECKPOINT_FORMAT, Checkpointer, Registered
from hpcsched.job.collective import ProcessGroup, allreduce_flat, select_device
from hpcsched.job.data import DataPosition, Step, epoch_permutation, rank_micro_batches
from hpcsched.job.elastic_boundary import ElasticBoundary
from hpcsched.job.elastic_membership import ElasticMembership
from hpcsched.job.gradient_noise import (
    GNSTracker,
    GradientNoiseEstimator,
    two_batch_estimate,
)
from hpcsched.job.membership import Membership
from hpcsched.job.metrics import StepMetrics, identify_device
from hpcsched.job.reform import Member, extension_member, primary_member
from hpcsched.job.scaling import LRScaling
from hpcsched.protocol.env import LaunchEnv, ProcessEnv
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import ControlAction

__all__ = ["CHECKPOINT_FORMAT", "ElasticJob", "GradientNoiseEstimator", "Step",
           "epoch_permutation", "rank_micro_batches", "two_batch_estimate"]


def _in_force(name: str, doc: str) -> property:
    return property(lambda self: getattr(self._cfg, name), doc=doc)


def worker_logging(environ) -> None:
    """``HPCSCHED_LOG_LEVEL`` in the job's environment (``debug``, ``info``, ...): hpcsched's
    log lines of that level and above from this worker go to its stderr (the job's output),
    unless the script has configured the ``hpcsched`` logger itself. Unset, Python's default
    holds: warnings and errors only. The launcher reads the same variable (default ``info``)."""
    level = environ.get("HPCSCHED_LOG_LEVEL", "").upper()
    logger = logging.getLogger("hpcsched")
    if not level or logger.handlers or not isinstance(logging.getLevelName(level), int):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)


class ElasticJob(ElasticBoundary, ElasticMembership):
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
        grad_noise_smoothing: the estimate's exponential smoothing per step at the job's first
            batch size (AdaptDL's 0.999: a memory of about 1,000 such steps); in ``[0, 1)``.
        boundary_interval: seconds of training between two step boundaries, where the ranks
            agree on hpcsched's requests and on checkpoints (:class:`~hpcsched.job.boundary.
            Pace`; about 1 ms each on gloo); 0: at every step.

    Environment (set by the launcher; see :mod:`hpcsched.protocol.env` and
    ``docs/control-protocol.md``): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT`` (torch.distributed), and ``HPCSCHED_*`` (job directory, generation, batch
    configuration, checkpoint settings).

    Attributes:
        rank, local_rank, launch, restart, job_dir, job_uid, device: this process.
        state: the data position (``epoch``, ``position``, ``step``, ``samples_processed``).
        stopped_for: the control action that ended :meth:`steps` early, else None.
        generation, world_size, nodes, batch, lr_scale: the configuration in force.

    Raises:
        ValueError: ``dataset_size`` or ``epochs`` < 1, ``grad_noise_smoothing`` outside
            ``[0, 1)``, or ``boundary_interval`` < 0.
    """

    generation = _in_force("generation", "Control generation in force.")
    world_size = _in_force("world_size", "Workers in force.")
    nodes = _in_force("nodes", "Nodes in force.")
    batch = _in_force("batch", "BatchConfig in force.")
    lr_scale = _in_force("lr_scale", "Learning-rate factor in force.")

    def __init__(self, dataset_size: int, epochs: int, batch_size: int = 32, seed: int = 0,
                 backend: str | None = None, init_timeout: float = 300.0,
                 track_grad_noise: bool = True, grad_noise_smoothing: float = 0.999,
                 boundary_interval: float = AGREE_INTERVAL):
        import torch  # imported here so hpcsched's CLI never pays for it

        if dataset_size < 1 or epochs < 1:
            raise ValueError("dataset_size and epochs must be >= 1")
        if not boundary_interval >= 0:
            raise ValueError(f"boundary_interval must be >= 0 seconds, got {boundary_interval}")
        self._torch = torch
        worker_logging(os.environ)
        self.dataset_size, self.epochs, self.seed = dataset_size, epochs, seed
        self._launch = launch = LaunchEnv.from_env(os.environ)
        proc = ProcessEnv.from_env(os.environ)
        self.rank, self.local_rank, self.restart = proc.rank, proc.local_rank, proc.restart
        self.launch, self._slurm_job_id = launch.launch, proc.slurm_job_id
        jd = JobDir(launch.job_dir) if launch.job_dir else None
        self.job_dir, self.job_uid = (jd.path, jd.uid) if jd else (None, "")
        self._cfg = InForce.at_launch(launch, proc.world_size, batch_size)
        self.stopped_for: ControlAction | None = None  # action that ended steps() early
        self.state = DataPosition(dataset_size, epochs, seed)
        self._reg = Registered()
        self._ckpt = Checkpointer.for_job(launch.checkpoint_dir, self.job_dir,
                                          launch.checkpoint_interval, launch.mtbf)
        self.checkpoint_dir, self.checkpoint_interval = self._ckpt.directory, self._ckpt.interval
        self.record_samples = launch.record_samples
        self._lr = LRScaling.of_job_dir(jd)  # adaptive rules: the factor from the noise
        self._noise = GNSTracker(torch, track_grad_noise and proc.grad_noise,
                                 self.global_batch_size, grad_noise_smoothing)
        self.device = select_device(torch, self.local_rank)
        joining = bool(launch.join_generation) and jd is not None
        self._init_timeout = init_timeout
        self._group = ProcessGroup.join(torch, self.rank, proc.world_size, self.generation,
                                        launch.master_addr, launch.master_port, backend,
                                        init_timeout, self.device,
                                        always=launch.extensions and jd is not None,
                                        joining=joining)
        device = identify_device(torch, self.device, self.local_rank, os.environ)
        self._members = self._membership(launch, proc, jd, joining, device["node"])
        self._void = False  # the step in flight lost a peer: it does not count
        self._watcher = ControlWatcher(jd)
        self._pace = Pace(boundary_interval)  # rank 0: steps to the next boundary
        self._agree_at = 0   # optimizer step of the next step boundary (all ranks agree on it)
        self._report = Reporter(jd, self.rank, self.state.total_samples)
        self._applied_acked = joining
        self._listen_for_slurm_signal()
        self._metrics = StepMetrics.for_rank(
            jd.metrics_dir if jd else None, self.launch, self.restart, self.rank, device,
            self.record_samples, extension=proc.slurm_job_id if joining else "")

    def _membership(self, launch: LaunchEnv, proc: ProcessEnv, jd: JobDir | None, joining: bool,
                    node: str) -> Membership | None:
        """This rank's view of the group's members on ``node``, for a job whose workers change
        while they run (with extensions, or a rank ``joining`` one, as an extension's member;
        else as a primary's): ``None`` without a process group that has a store, or when
        neither applies."""
        if self._group is not None and self._group.store is not None and \
                (launch.extensions or joining):
            me = Member(extension_member(proc.slurm_job_id, self.rank) if joining
                        else primary_member(self.rank), node,
                        proc.slurm_job_id if joining else "")
            return Membership(self._group, launch, me, jd, self.rank, proc.slurm_job_id)
        return None

    # ------------------------------------------------------------ registration
    def register(self, model=None, optimizer=None, scheduler=None, **extra_state) -> bool:
        """Give the objects to checkpoint; restores them from the latest checkpoint if any.

        ``extra_state`` values must be picklable by ``torch.save`` (tensors, numbers, dicts).
        Returns True when a checkpoint was restored.

        Raises:
            ValueError: the latest checkpoint is not an hpcsched checkpoint, or was written for
                another ``dataset_size`` or ``seed``.
        """
        self._reg = Registered(model, optimizer, scheduler, dict(extra_state))
        if model is not None and hasattr(model, "parameters"):
            self._noise.params = [p for p in model.parameters() if p.requires_grad]
        if self._launch.join_generation and self._members is not None:
            return self._join()
        return self._restore()

    @property
    def extra_state(self) -> dict:
        """The ``extra_state`` passed to :meth:`register`, as restored from a checkpoint."""
        return self._reg.extra

    # ------------------------------------------------------------------- loop
    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks, in force."""
        return self._cfg.batch.global_batch_size

    def steps(self) -> Iterator[Step]:
        """Yield one :class:`Step` per optimizer step until training ends (the last epoch, or
        the work of :meth:`set_work`, is done) or hpcsched asks for a checkpoint (then
        :attr:`stopped_for` names the action)."""
        while not (self.state.finished or self._report.work_done):
            if self.state.step >= self._agree_at and not self._step_boundary():
                return
            cfg = self._cfg
            lr = self._lr.factor(cfg.lr_scale, cfg.batch.global_batch_size, self._noise)
            step, consumed = self.state.next_step(cfg.batch, self.rank, lr, cfg.generation)
            self._noise.begin_step(step, single_rank=self.world_size == 1)
            self._metrics.begin_step()
            yield step
            seconds = self._metrics.elapsed()
            self._noise.end_step()
            if self._void:  # a peer was lost: the step's samples are given out again
                self._void = False
                continue
            position = {"position": self.state.position, "consumed": consumed}
            self.state.advance(consumed)
            self._metrics.end_step(step, seconds, {**cfg.record(), **position},
                                   self._noise.record())
            if self._report.progress_due:
                self._progress()
        self._noise.flush()
        self._noise.remove_hooks()  # training is over: no more micro-batch hooks
        if self._members is not None and self.rank == 0:
            self._members.release_all()
        self._progress(finished=True)

    def set_work(self, done: float, total: float) -> None:
        """Optional: measure the job's work in samples, ``done`` of ``total``, instead of by its
        data position, for a job whose end is not its data's (``jobscripts/examples/
        emulated.py``). Call it on every rank with the same values (e.g. after each step).
        Progress reports then say ``samples_processed = done`` and ``total_samples = total``
        (the daemon's remaining work is their difference) and :meth:`steps` ends, as after the
        last epoch, at the first step boundary with ``done >= total``. The data position still
        cuts the batches: give ``epochs`` enough for the work.

        Raises:
            ValueError: ``done < 0`` or ``total <= 0``.
        """
        if done < 0 or total <= 0:
            raise ValueError(f"need done >= 0 and total > 0 samples, got {done}, {total}")
        self._report.work = (float(done), float(total))

    def log(self, **values: float) -> None:
        """Attach values (e.g. ``loss=0.3``) to this rank's metrics record of the current step."""
        self._metrics.log(values)

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
        self._metrics.compute_done()
        params = [p for p in (model.parameters() if hasattr(model, "parameters") else model)
                  if p.requires_grad]
        step = self._noise.measuring(params)
        if self._group is None or self.world_size == 1:
            if step is not None and params:
                self._noise.single_rank(step, params)
            return
        local = self._noise.local_stats(step) if step is not None and params else None
        try:
            flat, stats = allreduce_flat(self._torch, self._group.dist, params, local,
                                         stats_size=2 if local is not None else 0)
        except RuntimeError as exc:
            self._peer_lost(exc)
            for p in params:  # torch's optimizers skip a parameter without a gradient
                p.grad = None
            self._void = True
            return
        if local is not None:
            self._noise.after_reduce(step, flat, stats)

    # --------------------------------------------------------- gradient noise
    @property
    def grad_noise(self) -> tuple[float, float] | None:
        """``(grad_sqr, grad_var)``: smoothed estimates of ``|G|^2`` and of ``tr(Sigma)``, the
        trace of one sample's gradient covariance (:class:`GradientNoiseEstimator`); None
        until the first estimate (or when tracking is off). The same value on every rank."""
        return self._noise.estimate

    @property
    def gradient_noise_scale(self) -> float | None:
        """``grad_var / grad_sqr``: McCandlish et al.'s simple noise scale ``B_simple``
        (arXiv:1812.06162, §2.2), in samples; None until the first estimate."""
        return self._noise.noise_scale

    def close(self) -> None:
        """Flush metrics and leave the process group.

        After :meth:`steps` stopped for a resize (:attr:`stopped_for` set) the checkpoint is on
        disk and the launcher is waiting for this process to end, so ``close`` ends it at once
        with status 0 (``os._exit``): interpreter teardown with torch loaded takes seconds,
        and every second here is resize time. Do any cleanup of your own before calling it.
        """
        self._metrics.close()
        self._noise.close()
        if self.stopped_for is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        if self._group is not None:
            self._group.leave()
            self._group = None
