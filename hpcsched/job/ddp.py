"""DistributedDataParallel for an elastic job: torch's own DDP, re-wrapped when the job's process
group changes, with gradient accumulation, the exact global-batch mean, and the gradient-noise
statistics measured in DDP's communication hook.

Usage, with :class:`hpcsched.job.loader.ElasticDataLoader` (which tells the model which
micro-batch of which step it is computing)::

    model = ElasticDDP(job, model.to(job.device))
    opt = torch.optim.SGD(model.parameters(), lr=base_lr)
    job.register(model=model, optimizer=opt)
    for step in job.steps():
        opt.zero_grad()
        for x, y in loader.micro_batches(step):
            F.cross_entropy(model(x), y).backward()    # the micro-batch's mean loss
        opt.step()

What it does per micro-batch ``a`` of this rank (``n_a`` samples, ``N = step.global_samples``):

* **Accumulation**: DDP's ``no_sync`` for all of the rank's micro-batches but the last, so the
  all-reduce runs once per step, overlapped with the last backward pass as DDP does.
* **Exact global mean**: micro-batch ``a``'s gradient counts ``n_a / N`` times, so the reduced
  gradient is ``(1/N) sum of per-sample gradients`` even when ranks hold different numbers of
  samples (the same as :meth:`ElasticJob.reduce_gradients`). DDP's own all-reduce (C++, its
  mean over the ``W`` ranks) does it: on a full step (``N = W x local x accumulation``, every
  step but a short last one of an epoch) every micro-batch weighs ``1 / (W A)``, so DDP's mean
  is right once the summed micro-batches are divided by ``A`` (after the step's backward, one
  pass, none without accumulation); on a short step, hooks on the parameters scale each
  micro-batch's gradient by ``W n_a / N`` before it is accumulated. The loss must be the mean
  over the micro-batch's samples (PyTorch's default ``reduction="mean"``); each micro-batch's
  backward must come before the next micro-batch's forward.
* **Where lost workers are survivable** (the job's group has extension members,
  ``job.survives_lost_workers``), a communication hook of ours runs the all-reduce instead, so
  that a failed one can be caught (below): it scales the bucket by ``n / N`` and *sums* over
  ranks. A Python hook costs a few per cent of a small model's step on a CPU (the GIL at every
  bucket), which is why it is not the default (docs/training-api.md).
* **No sample on this rank** (a short last step): the loader gives one padding micro-batch whose
  weight is 0; the rank runs it, so it takes part in DDP's all-reduce with a zero gradient.
* **Gradient noise**: the statistics that ``reduce_gradients`` sends: the local squared norm
  before the all-reduce and the reduced squared norm after, summed over parts (norms add over
  disjoint parts), so :class:`hpcsched.job.gradient_noise.GNSTracker` gets the same numbers as
  from the flat gradient (up to the order of float sums). With DDP's all-reduce the local
  norms come from hooks run as each parameter's gradient is accumulated in the step's last
  backward (before DDP's own, so before any reduction; installed on measured steps only), the
  reduced ones from the gradients after it; with our hook, per bucket before and after its
  all-reduce. The two statistics ``[n |g_n|^2, 1]`` go in one extra all-reduce of 2 numbers.
  It runs every ``noise_every``-th step (default 8; the estimator weighs each measurement as
  that many steps, so the average's memory is unchanged: about 125 measurements at the default
  smoothing): the norms are two passes over the gradient and the 2 numbers' all-reduce waits
  for every rank, a few per cent of a small model's step on a CPU when paid at every step
  (docs/training-api.md).
* **One rank**: no DDP (nothing to reduce); at the end of the step the job's single-rank
  estimators run (:meth:`ElasticJob.reduce_gradients`).
* **A new process group** (an in-place shrink, an extension join, lost workers): detected at
  the next forward (``torch.distributed.group.WORLD`` is another object) and the module is
  wrapped again; DDP's constructor broadcasts rank 0's parameters, which every rank already has.

* **A lost peer** (an extension worker gone; ``docs/extensions.md``): a failed all-reduce in
  our hook is caught; after the step's last backward the step is voided and the job goes on
  without the lost workers, as with ``reduce_gradients``. Without extension members the job
  cannot go on anyway: DDP's own all-reduce raises from ``backward()``. A collective of DDP's
  own outside the hook (the buffers' broadcast at a forward, for a module with buffers) still
  raises from the forward.
"""

from __future__ import annotations

import contextlib

import torch

from hpcsched.job.loader import cursor_of


class _BucketNorms:
    """One step's gradient-noise measurement from DDP's buckets."""

    def __init__(self, step, local_stats):
        self.step, self.local_stats = step, local_stats
        self.local: dict[int, torch.Tensor] = {}
        self.reduced: dict[int, torch.Tensor] = {}
        self.futures: list = []
        self.stats = self.work = None


class _AccumulatedNorms:
    """One step's gradient-noise measurement with DDP's own all-reduce: the local norms,
    taken by post-accumulate hooks in the step's last backward."""

    def __init__(self, step, local_stats, hooks):
        self.step, self.local_stats, self.hooks = step, local_stats, hooks
        self.local: list[torch.Tensor] = []

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []


def _full(step) -> bool:
    """Every rank has ``accumulation_steps`` micro-batches of ``local_batch_size`` samples."""
    return step.global_samples == (step.world_size * step.local_batch_size
                                   * step.accumulation_steps)


def _norm(t):
    return torch.linalg.vector_norm(t, dtype=torch.float32 if t.dtype not in
                                    (torch.float32, torch.float64) else None)


class ElasticDDP(torch.nn.Module):
    """The user's module under torch's :class:`~torch.nn.parallel.DistributedDataParallel`,
    for the micro-batches of an :class:`hpcsched.job.loader.ElasticDataLoader` (module docstring).

    Args:
        job: the :class:`hpcsched.elastic.ElasticJob`.
        module: the model (already on ``job.device``).
        noise_every: with several ranks, measure the gradient noise every ``noise_every``-th
            step (the estimator weighs each measurement as that many steps, so its memory is
            unchanged; :attr:`GNSTracker.every`): the two passes over the gradient it costs
            are paid one step in 8 by default. 1: every step, as the explicit
            ``reduce_gradients`` does.
        **ddp_args: passed to DistributedDataParallel on every wrap (e.g.
            ``find_unused_parameters``, ``bucket_cap_mb``, ``gradient_as_bucket_view``);
            ``device_ids`` defaults to the job's GPU for a module on CUDA.

    Attributes:
        module: the user's module (its ``state_dict`` is this module's: checkpoints are the
            same as without the wrapper).
        wraps: times the module was wrapped in DDP (once per process group).

    Raises:
        ValueError: ``noise_every < 1``.
        RuntimeError: (at forward) a training forward outside ``loader.micro_batches(step)``.
    """

    def __init__(self, job, module: torch.nn.Module, noise_every: int = 8, **ddp_args):
        super().__init__()
        if noise_every < 1:
            raise ValueError(f"noise_every must be >= 1, got {noise_every}")
        self.module = module
        self._job = job
        job._noise.every = noise_every
        self._ddp_args = ddp_args
        self._ddp = [None]          # a list: not a submodule (no second copy in state_dict)
        self._params: list = []
        self._measure: _BucketNorms | _AccumulatedNorms | None = None
        self._hooked = False               # our communication hook runs the all-reduce
        self._scale = 1.0                  # the comm hook's factor for this step
        self._param_weight: float | None = None   # the parameter hooks' factor (None: off)
        self._param_hooks: list = []
        self._failure: Exception | None = None    # a failed all-reduce of this step
        self.wraps = 0
        self._cursor = cursor_of(job)
        self._cursor.finishers.append(self._finish)

    # -------------------------------------------------------------- nn.Module
    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, *args, **kwargs):
        cur = self._cursor
        if not (torch.is_grad_enabled() and self.training):
            return self.module(*args, **kwargs)
        if cur.step is None:
            raise RuntimeError("ElasticDDP: a training forward outside "
                               "loader.micro_batches(step) (the model needs to know the "
                               "micro-batch); use torch.no_grad() or model.eval() for others")
        ddp = self._wrapped()
        if ddp is None:   # one rank: the weights on the parameters' gradients
            self._weigh(1.0, None if cur.weight == 1.0 else cur.weight)
            return self.module(*args, **kwargs)
        if self._hooked:  # once in the hook when uniform, else on the parameters' gradients
            in_hook = cur.uniform
            self._weigh(cur.weight if in_hook else 1.0,
                        None if in_hook or cur.weight == 1.0 else cur.weight)
        else:             # DDP's mean: a full step's 1 / A comes after the backward
            full = _full(cur.step)
            self._weigh(1.0, None if full else cur.step.world_size * cur.weight)
            if cur.index == 0:
                self._begin_measure(cur.step)
        with contextlib.nullcontext() if cur.last else ddp.no_sync():
            return ddp(*args, **kwargs)

    def _weigh(self, scale: float, param_weight: float | None) -> None:
        """Where this micro-batch's weight is applied: ``scale`` in the communication hook,
        ``param_weight`` on each micro-batch's gradient by hooks on the parameters (installed
        only while needed; None: none)."""
        self._scale = scale
        self._param_weight = param_weight
        if self._param_weight is not None and not self._param_hooks:
            self._param_hooks = [p.register_hook(self._param_hook)
                                 for p in self.module.parameters() if p.requires_grad]
        elif self._param_weight is None and self._param_hooks:
            for h in self._param_hooks:
                h.remove()
            self._param_hooks = []

    def _param_hook(self, grad):
        w = self._param_weight
        return None if w is None else grad * w

    # --------------------------------------------------------------- wrapping
    def _wrapped(self):
        """The DDP wrapper for the current process group (None: one rank)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            self._ddp[0] = None
            return None
        ddp = self._ddp[0]
        if ddp is None or ddp.process_group is not dist.group.WORLD:
            self._ddp[0] = None  # the old reducer's hooks are inert (its forward never runs)
            args = dict(self._ddp_args)
            if "device_ids" not in args and next(self.module.parameters()).is_cuda:
                args["device_ids"] = [self._job.device]
            ddp = torch.nn.parallel.DistributedDataParallel(self.module, **args)
            self._drop_unfinished()
            self._hooked = bool(self._job.survives_lost_workers)
            if self._hooked:
                ddp.register_comm_hook(self, _sum_hook)
            self._params = [p for p in self.module.parameters() if p.requires_grad]
            self._ddp[0] = ddp
            self.wraps += 1
        return ddp

    # ---------------------------------------------------------- noise, per step
    def _start_measure(self):
        """The step's measurement, begun by the first bucket of the step's all-reduce (None
        when the job does not measure)."""
        noise = self._job._noise
        step = noise.measuring(self._params)
        if step is None:
            return None
        m = self._measure
        if not isinstance(m, _BucketNorms) or m.step is not step:  # (a loop that left a step
            # early never finished it)
            m = self._measure = _BucketNorms(step, noise.local_stats(step))
        return m

    def _drop_unfinished(self) -> None:
        """Forget a measurement a loop left unfinished (it left a step early), hooks and all."""
        if isinstance(self._measure, _AccumulatedNorms):
            self._measure.remove()
            self._measure = None

    def _begin_measure(self, step) -> None:
        """DDP's all-reduce, first micro-batch of a step: on a step the job measures, hooks
        that take each parameter's local norm once its gradient is accumulated in the step's
        last backward."""
        self._drop_unfinished()
        self._measure = None
        step = self._job._noise.measuring(self._params)
        if step is None:
            return
        m = _AccumulatedNorms(step, self._job._noise.local_stats(step), [])

        def local_norm(p, m=m):
            if self._cursor.last:
                m.local.append(_norm(p.grad))

        m.hooks = [p.register_post_accumulate_grad_hook(local_norm) for p in self._params]
        self._measure = m

    def _finish_builtin(self, step) -> None:
        """After the step's last backward with DDP's all-reduce: a full step's ``1 / A``, and
        the gradient-noise statistics of a measured step."""
        grads = [p.grad for p in self._params if p.grad is not None]
        full = _full(step)
        if full and step.accumulation_steps > 1 and grads:
            torch._foreach_mul_(grads, 1.0 / step.accumulation_steps)
        m, self._measure = self._measure, None
        if not isinstance(m, _AccumulatedNorms):
            return
        m.remove()
        if not m.local or not grads:
            return
        import torch.distributed as dist

        # the local gradients as our hook's weights would have made them (n / N, summed)
        share = 1.0 / (step.world_size * (step.accumulation_steps if full else 1))
        local = torch.stack(m.local) * share
        stats = m.local_stats(local).to(local.dtype)
        try:
            dist.all_reduce(stats)
        except RuntimeError as exc:
            self._lost(exc)
            return
        self._job._noise.after_reduce(m.step, torch.stack([_norm(g) for g in grads]), stats)

    def _finish(self, step) -> None:
        """After the step's last backward (the loader's cursor calls it)."""
        job = self._job
        if self._ddp[0] is None:  # one rank: the job's own single-rank estimators
            job.reduce_gradients(self.module)
            return
        if not self._hooked:
            self._finish_builtin(step)
            return
        m, self._measure = self._measure, None
        failure, self._failure = self._failure, None
        if failure is None and m is not None and m.work is not None:
            try:
                for f in m.futures:
                    f.wait()
                m.work.wait()
            except RuntimeError as exc:
                failure = exc
            else:
                reduced = torch.stack([m.reduced[i] for i in sorted(m.reduced)])
                job._noise.after_reduce(m.step, reduced, m.stats)
        if failure is not None:
            self._lost(failure)

    def _lost(self, exc: Exception) -> None:
        """The step's all-reduce failed (a peer was lost): as ``reduce_gradients`` does, go on
        without the lost workers (the job re-forms its group, or raises ``exc`` when it cannot)
        and void the step: no gradient, so ``optimizer.step()`` changes nothing, and the job
        gives the step's samples out again. The next forward wraps the module on the new
        group."""
        self._ddp[0] = None
        self._job._peer_lost(exc)
        for p in self.module.parameters():  # torch's optimizers skip a parameter without one
            p.grad = None
        self._job._void = True


def _sum_hook(owner: ElasticDDP, bucket):
    """DDP communication hook: weigh the bucket (``n / N``), sum it over ranks (the weights
    make the sum the global mean) and measure its squared norm before and after. A failed
    all-reduce (a lost peer) is noted for :meth:`ElasticDDP._finish` and the bucket handed back
    as it is, so that DDP's backward ends normally."""
    import torch.distributed as dist

    buf = bucket.buffer()
    if owner._scale != 1.0:
        buf.mul_(owner._scale)  # in place of DDP's division by the world size
    m = owner._start_measure()
    index = bucket.index()
    if m is not None:
        m.local[index] = _norm(buf)  # before the all-reduce, which works in place
    try:
        fut = dist.all_reduce(buf, async_op=True).get_future()
        if m is not None and bucket.is_last():
            local = torch.stack([m.local[i] for i in sorted(m.local)])
            m.stats = m.local_stats(local).to(local.dtype)  # [0, 0] comes as float32
            m.work = dist.all_reduce(m.stats, async_op=True)
    except RuntimeError as exc:
        owner._failure = owner._failure or exc
        done = torch.futures.Future()
        done.set_result(buf)
        return done

    def reduced(f, m=m, index=index):
        try:
            t = f.value()[0]
        except RuntimeError as exc:
            owner._failure = owner._failure or exc
            return buf
        if m is not None:
            m.reduced[index] = _norm(t)
        return t

    fut = fut.then(reduced)
    if m is not None:
        m.futures.append(fut)
    return fut
