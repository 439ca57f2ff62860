"""Gradient-noise measurement: the two-batch estimator, its smoothed average, and the per-step
tracking that feeds it from :meth:`hpcsched.elastic.ElasticJob.reduce_gradients`.

The estimator follows McCandlish et al., "An Empirical Model of Large-Batch Training"
(arXiv:1812.06162, Appendix A.1) as Pollux uses it (Qiao et al., OSDI'21, §3.1), with AdaptDL's
smoothing and single-replica estimators (``adaptdl/torch/gradient_noise_scale.py``,
Apache-2.0). Many ranks: each rank's gradient before the all-reduce is a small batch, the
reduced one the big batch (:meth:`GNSTracker.local_stats`, :meth:`GNSTracker.after_reduce`).
One rank: the micro-batches of gradient accumulation are the small batches, else two
consecutive steps' gradients (:meth:`GNSTracker.single_rank`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable

log = logging.getLogger(__name__)


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
    the ``sigma^2`` of :func:`hpcsched.perf.pollux.efficiency`) is ``grad_var / M0``.
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
               *, biased: bool = False, weight: float = 1.0) -> bool:
        """Fold in one step's norms (see :func:`two_batch_estimate` for the arguments).
        ``weight``: the steps this measurement stands for (measured every ``weight``-th step:
        ``theta ** weight``, so the memory of the average, in samples, stays the same).

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
        theta = self.smoothing ** (weight * big_batch / self.base_batch_size)
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


def _dense(torch, t) -> bool:
    return t.dtype in (torch.float32, torch.float64)


def _sq(torch, flat):
    """``|flat|^2``: a dot product in the gradients' own precision, float32 below it."""
    return torch.dot(flat, flat) if _dense(torch, flat) else _sqnorm(torch, [flat])


class GNSTracker:
    """One rank's per-step gradient-noise measurement, folded into a
    :class:`GradientNoiseEstimator` (:attr:`estimator`, the only part that is checkpointed).

    The measurement of a step stays on the device until it is ready (:meth:`flush`), so the
    statistics never make the training loop wait for the GPU.

    Args:
        torch: the ``torch`` module.
        enabled: measure at all (``ElasticJob(track_grad_noise=...)``, ``HPCSCHED_GRAD_NOISE``).
        base_batch_size: the estimator's ``base_batch_size`` (samples), the job's first global
            batch size.
        smoothing: the estimator's ``smoothing`` (:class:`GradientNoiseEstimator`).
    """

    def __init__(self, torch, enabled: bool, base_batch_size: float, smoothing: float = 0.999):
        self._torch = torch
        self.enabled = enabled
        self.estimator = GradientNoiseEstimator(smoothing, base_batch_size=base_batch_size)
        self.params: list | None = None        # parameters seen by register / reduce_gradients
        self.micro: _MicroBatchNorms | None = None
        self._step = None                       # the step being measured, None between steps
        self._prev = None                       # (flat gradient, its sqnorm, samples): 1 rank
        self._pending = None                    # (device tensor, fn(values) -> update args, event)
        #: with several ranks, measure every ``every``-th step only (:meth:`measuring`)
        self.every = 1

    # ------------------------------------------------------------ step life
    def begin_step(self, step, single_rank: bool) -> None:
        """Pick this step's estimator; install or remove the micro-batch hooks."""
        self._step = step
        accumulation = step.accumulation_steps
        hooks = self.enabled and single_rank and accumulation > 1 and self.params is not None
        if self.micro is not None and not (hooks and self.micro.ids == [id(p) for p in self.params]):
            self.remove_hooks()
        if hooks and self.micro is None:
            self.micro = _MicroBatchNorms(self._torch, self.params)
        if self.micro is not None:
            self.micro.reset()
        if not (self.enabled and single_rank and accumulation == 1):
            self._prev = None  # only the differenced estimator keeps a gradient

    def end_step(self) -> None:
        """The step is done: fold its measurement in if it is ready (no wait)."""
        self.flush(block=False)
        self._step = None

    def measuring(self, params: list):
        """The step to measure in this gradient reduction (None when tracking is off, outside
        a step, or, with several ranks, on a step that is not a multiple of :attr:`every`: the
        step number is the same on every rank, so they agree without a word); remembers
        ``params`` for the micro-batch hooks. One rank measures every step (its differenced
        estimator needs consecutive steps)."""
        step = self._step if self.enabled else None
        if step is not None and self.every > 1 and step.world_size > 1 \
                and step.step % self.every:
            return None
        if step is not None:
            self.params = params
        return step

    def remove_hooks(self) -> None:
        if self.micro is not None:
            self.micro.remove()
            self.micro = None

    def close(self) -> None:
        """Training is over: no more hooks, no gradient kept."""
        self.remove_hooks()
        self._prev = None

    # ----------------------------------------------------------- many ranks
    def local_stats(self, step) -> Callable:
        """For the all-reduce (:func:`hpcsched.job.collective.allreduce_flat`): this rank's 2
        statistics from its flat local gradient, ``[n |g_n|^2, 1]`` (``[0, 0]`` without
        samples).

        With ``n`` samples on this rank and ``N = step.global_samples``, the local gradient is
        ``(n / N) g_n``, so ``n |g_n|^2 = (N^2 / n) |local|^2``.
        """
        torch = self._torch
        n_local = step.samples
        scale = step.global_samples ** 2 / n_local if n_local else 0.0

        def stats(flat):
            if not n_local:
                return torch.zeros(2, dtype=torch.float32, device=flat.device)
            sq = _sq(torch, flat) * scale
            return torch.stack([sq, torch.ones_like(sq)])

        return stats

    def after_reduce(self, step, flat, stats) -> None:
        """Queue the two-batch estimate from the reduced gradient ``flat`` (the big batch,
        ``B = N``) and the summed :meth:`local_stats` (``k`` ranks with samples: small batch
        ``b = N / k``, ``|g_b|^2 = sum(n |g_n|^2) / N``); none with fewer than 2 such ranks."""
        torch = self._torch
        values = torch.cat([_sq(torch, flat).reshape(1), stats.to(flat.device)])
        N = step.global_samples

        def ranks(v, N=N):
            total, local_sum, k = v
            k = round(k)
            return (local_sum / N, total, N / k, N, False) if k >= 2 else None

        self._set_pending(values, ranks, weight=self.every)

    # ------------------------------------------------------------- one rank
    def single_rank(self, step, params: list) -> None:
        """One rank: AdaptDL's estimators without replicas (micro-batches, else consecutive
        steps)."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads or step.global_samples <= 0:
            return
        if step.accumulation_steps > 1:
            self._micro_batches(step, params, grads)
        else:
            self._differenced(step, grads)

    def _micro_batches(self, step, params: list, grads: list) -> None:
        torch = self._torch
        N = step.global_samples
        mb = self.micro
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

        self._set_pending(stats, micro)

    def _differenced(self, step, grads: list) -> None:
        """This step's gradient and the previous one: two batches (biased: the model moved)."""
        torch = self._torch
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
        sq = torch.dot(flat, flat)
        prev = self._prev
        self._prev = (flat, sq, step.global_samples)
        if prev is None or prev[0].numel() != flat.numel():
            return
        p_flat, p_sq, n1 = prev
        stats = torch.stack([p_sq, torch.dot(p_flat, flat), sq])

        def diff(v, n1=n1, n2=step.global_samples):
            s1, cross, s2 = v
            big = n1 + n2
            total = (n1 * n1 * s1 + 2 * n1 * n2 * cross + n2 * n2 * s2) / (big * big)
            return ((n1 * s1 + n2 * s2) / big, total, big / 2, big, True)

        self._set_pending(stats, diff)

    # -------------------------------------------------------------- results
    def _set_pending(self, stats, fn, weight: float = 1.0) -> None:
        """Keep this step's few numbers on the device until they are ready (see flush);
        ``weight``: the steps the measurement stands for."""
        self.flush()  # the previous step's: long finished
        event = None
        if stats.device.type == "cuda":
            event = self._torch.cuda.Event()
            event.record()
        self._pending = (stats, fn, event, weight)

    def flush(self, block: bool = True) -> None:
        """Fold the pending measurement into the averages. Non-blocking (end of each step)
        it waits for nothing: on a GPU still busy with the step, it leaves the numbers for the
        next call, so the statistics never stall the queue of kernels (the estimate in a
        metrics line may then be one step behind)."""
        if self._pending is None:
            return
        stats, fn, event, weight = self._pending
        if not block and event is not None and not event.query():
            return
        self._pending = None
        args = fn(stats.tolist())
        if args is None:
            return
        if not self.estimator.update(*args[:4], biased=args[4], weight=weight) \
                and args[2] < args[3]:
            log.debug("gradient noise: non-finite gradient norms, step skipped")

    @property
    def estimate(self) -> tuple[float, float] | None:
        """``(grad_sqr, grad_var)`` with every measurement folded in (see
        :attr:`GradientNoiseEstimator.estimate`)."""
        self.flush()
        return self.estimator.estimate

    @property
    def noise_scale(self) -> float | None:
        self.flush()
        return self.estimator.noise_scale

    def record(self) -> dict:
        """The metrics record's fields (what is folded in so far; no wait)."""
        est = self.estimator.estimate
        return {"grad_sqr": est[0] if est else None, "grad_var": est[1] if est else None}
