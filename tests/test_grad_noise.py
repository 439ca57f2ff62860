"""Gradient-noise statistics of the elastic API (Pollux, Qiao et al., OSDI'21, §3.1).

The estimator (:func:`hpcsched.job.gradient_noise.two_batch_estimate`, McCandlish et al. 2018,
App. A.1; smoothing as AdaptDL's ``gradient_noise_scale.py``) on synthetic gradients with known
``|G|^2`` and ``tr(Sigma)``; the single-rank estimators and the checkpoint round trip in-process; the
multi-rank path with two real gloo processes training the digits example through a resize.
"""

import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpcsched.elastic import ElasticJob
from hpcsched.job.gradient_noise import GradientNoiseEstimator, two_batch_estimate
from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from tests.gloo_workers import free_port as _free_port
from tests.gloo_workers import join as _join
from tests.gloo_workers import launch as _launch
from tests.gloo_workers import wait_ack as _wait_ack
from tests.jobrecords import load_records

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "jobscripts" / "examples" / "digits_mlp.py"
DIGITS = 1797


# ----------------------------------------------------------------------- pure estimator

def test_two_batch_estimate_inverts_the_expected_norms():
    S, V = 0.7, 30.0
    for b, B in ((1, 2), (8, 16), (3, 29), (16, 1024)):
        sqr, var = two_batch_estimate(S + V / b, S + V / B, b, B)
        assert sqr == pytest.approx(S) and var == pytest.approx(V)
    with pytest.raises(ValueError):
        two_batch_estimate(1.0, 1.0, 8, 8)


class _Synthetic:
    """Per-sample gradients g_i = G + e_i, e_i ~ N(0, Sigma): |G|^2 = 1, tr(Sigma) = 40,
    a full (non-diagonal) covariance, 20 dimensions."""

    SQR, VAR, D = 1.0, 40.0, 20

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        G = self.rng.normal(size=self.D)
        self.G = G * math.sqrt(self.SQR) / np.linalg.norm(G)
        A = self.rng.normal(size=(self.D, self.D)) * np.linspace(0.2, 2.0, self.D)
        cov = A @ A.T
        cov *= self.VAR / np.trace(cov)
        self.chol = np.linalg.cholesky(cov)

    def feed(self, est, sizes, steps):
        """``steps`` steps with ``sizes[r]`` samples on rank r, reduced as ElasticJob does:
        small batch N / k over the k ranks with samples, |g_b|^2 = sum n_r |g_r|^2 / N."""
        N = sum(sizes)
        x = self.G + self.rng.normal(size=(steps, N, self.D)) @ self.chol.T
        bounds = np.cumsum([0] + list(sizes))
        for g in x:
            big = g.mean(0)
            local = [(n, g[a:z].mean(0)) for n, a, z in zip(sizes, bounds, bounds[1:]) if n]
            small_sqr = sum(n * float(m @ m) for n, m in local) / N
            assert est.update(small_sqr, float(big @ big), N / len(local), N)


@pytest.mark.parametrize("sizes", [[8, 8], [16, 16, 16, 16], [5, 4, 4, 0], [3, 29], [1] * 8])
def test_estimator_converges_to_known_statistics(sizes):
    """Equal, unequal and empty ranks: the smoothed estimates land on |G|^2 and tr(Sigma)."""
    syn = _Synthetic(seed=sum(sizes))
    est = GradientNoiseEstimator(base_batch_size=16)
    syn.feed(est, sizes, 3000)
    sqr, var = est.estimate
    assert sqr == pytest.approx(syn.SQR, rel=0.15)
    assert var == pytest.approx(syn.VAR, rel=0.08)
    assert est.noise_scale == pytest.approx(var / sqr)


def test_estimator_keeps_its_averages_across_resizes():
    """Batch and world size change mid-run (2 ranks x 8, 4 x 16, 1 rank x 32 in 4
    micro-batches): no reset, and the estimates stay on the truth."""
    syn = _Synthetic(seed=7)
    est = GradientNoiseEstimator(base_batch_size=16)
    for sizes in ([8, 8], [16] * 4, [8] * 4):
        syn.feed(est, sizes, 1500)
    assert est.count == 4500 and est.base_batch_size == 16
    sqr, var = est.estimate
    assert sqr == pytest.approx(syn.SQR, rel=0.15)
    assert var == pytest.approx(syn.VAR, rel=0.08)


def test_estimator_smoothing_bias_correction_and_clipping():
    est = GradientNoiseEstimator(smoothing=0.9)
    assert est.estimate is None and est.noise_scale is None
    assert not est.update(1.0, 1.0, 8, 8)          # one batch size: nothing to estimate
    assert not est.update(math.nan, 1.0, 8, 16)    # non-finite: skipped
    assert est.count == 0
    # first update: the bias-corrected average is the value itself; base = first big batch
    assert est.update(1.0 + 40 / 8, 1.0 + 40 / 16, 8, 16)
    assert est.base_batch_size == 16 and est.raw == pytest.approx((1.0, 40.0))
    # a batch twice the base counts twice: theta = 0.9 ** 2
    est.update(3.0 + 10 / 16, 3.0 + 10 / 32, 16, 32)
    t = 0.9 ** 2
    want_sqr = (t * 0.1 * 1.0 + (1 - t) * 3.0) / (t * 0.1 + (1 - t))
    want_var = (t * 0.1 * 40.0 + (1 - t) * 10.0) / (t * 0.1 + (1 - t))
    assert est.raw == pytest.approx((want_sqr, want_var))
    # negative raw estimates are clipped when read, as AdaptDL's sqr_avg()/var_avg() do
    neg = GradientNoiseEstimator()
    neg.update(1.0, 2.0, 8, 16)                    # |g_b| < |g_B|: var < 0, sqr > 0
    assert neg.raw[1] < 0 and neg.estimate[1] == pytest.approx(1e-6 * 16)
    neg2 = GradientNoiseEstimator()
    neg2.update(10.0, 0.1, 8, 16)                  # sqr < 0
    assert neg2.raw[0] < 0 and neg2.estimate[0] == 0.0 and neg2.noise_scale == math.inf


def test_unbiased_estimates_replace_biased_ones():
    """AdaptDL: the differenced (biased) estimator's averages are dropped once a two-batch
    (unbiased) estimate is available, and only then."""
    est = GradientNoiseEstimator()
    for _ in range(5):
        est.update(5.0, 3.0, 16, 32, biased=True)
    assert est.biased and est.count == 5
    est.update(1.0 + 40 / 8, 1.0 + 40 / 16, 8, 16)
    assert not est.biased and est.count == 1 and est.raw == pytest.approx((1.0, 40.0))
    est.update(1.0 + 40 / 8, 1.0 + 40 / 16, 8, 16, biased=True)  # unbiased -> biased: kept
    assert est.count == 2


def test_state_dict_round_trip():
    syn = _Synthetic(seed=3)
    est = GradientNoiseEstimator(smoothing=0.99, base_batch_size=32)
    syn.feed(est, [16, 16], 50)
    est2 = GradientNoiseEstimator()
    est2.load_state_dict(json.loads(json.dumps(est.state_dict())))
    assert est2.state_dict() == est.state_dict() and est2.estimate == est.estimate


# ---------------------------------------------------------- single rank, in process

@pytest.fixture
def solo(monkeypatch):
    """A clean single-process environment (no launcher, no job directory)."""
    for k in list(os.environ):
        if k.startswith(("HPCSCHED_", "SLURM_")) or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(k)
    return monkeypatch


def _problem(n=60, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=g)
    y = X @ torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0]) + 0.5 * torch.randn(n, generator=g)
    torch.manual_seed(seed)
    model = torch.nn.Linear(5, 1)
    return X, y, model


def _train(job, X, y, model, opt, on_step=None):
    import torch

    for step in job.steps():
        opt.zero_grad()
        for idx in step.micro_batches:
            if not idx:
                continue
            if on_step is not None:
                on_step("micro", idx, step)
            loss = ((model(X[idx]).squeeze(1) - y[idx]) ** 2).sum()
            (loss / step.global_samples).backward()
        job.reduce_gradients(model)
        if on_step is not None:
            on_step("reduced", None, step)
        opt.step()
    assert job.stopped_for is None
    return torch


def _sq(tensors):
    return sum(float((t.double() ** 2).sum()) for t in tensors)


def test_single_rank_accumulation_uses_micro_batches(solo):
    """One rank, 2 micro-batches of 8: each micro-batch is a small batch (AdaptDL's
    single-replica estimator), checked against gradients computed independently; the last
    step of the epoch has micro-batches of 8 and 4."""
    import torch

    solo.setenv("HPCSCHED_LOCAL_BATCH_SIZE", "8")
    solo.setenv("HPCSCHED_ACCUMULATION_STEPS", "2")
    X, y, model = _problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    job = ElasticJob(dataset_size=60, epochs=1, seed=1)
    job.register(model=model, optimizer=opt)
    ref = GradientNoiseEstimator(base_batch_size=16)
    seen = {}

    def on_step(what, idx, step):
        if what == "micro":      # mean gradient of this micro-batch, computed on its own
            leaves = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
            out = torch.func.functional_call(model, leaves, (X[idx],))
            loss = ((out.squeeze(1) - y[idx]) ** 2).mean()
            seen.setdefault(step.step, []).append(
                (len(idx), _sq(torch.autograd.grad(loss, list(leaves.values())))))
        else:
            N = step.global_samples
            small = sum(n * s for n, s in seen[step.step]) / N
            k = len(seen[step.step])
            ref.update(small, _sq([p.grad for p in model.parameters()]), N / k, N)

    _train(job, X, y, model, opt, on_step)
    assert [len(v) for v in seen.values()] == [2, 2, 2, 2]
    assert seen[3][1][0] == 4                      # 60 = 3 x 16 + 12: micro-batches 8 + 4
    assert job._noise.estimator.count == ref.count == 4
    assert job._noise.estimator.raw == pytest.approx(ref.raw, rel=1e-4)
    sqr, var = job.grad_noise
    assert sqr > 0 and var > 0 and job.gradient_noise_scale == pytest.approx(var / sqr)
    job.close()


def test_single_rank_without_accumulation_differences_consecutive_steps(solo):
    """One rank, no accumulation: consecutive steps' gradients (16 and 16, ..., 16 and 12
    samples) are the two small batches (AdaptDL's differenced estimator, marked biased)."""
    import torch

    solo.setenv("HPCSCHED_LOCAL_BATCH_SIZE", "16")
    X, y, model = _problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    job = ElasticJob(dataset_size=60, epochs=1, seed=1)
    job.register(model=model, optimizer=opt)
    grads = []

    def on_step(what, idx, step):
        if what == "reduced":
            grads.append((step.global_samples, [p.grad.clone() for p in model.parameters()]))

    _train(job, X, y, model, opt, on_step)
    ref = GradientNoiseEstimator(base_batch_size=16)
    for (n1, g1), (n2, g2) in itertools.pairwise(grads):
        big = [(n1 * a + n2 * b) / (n1 + n2) for a, b in zip(g1, g2)]
        ref.update((n1 * _sq(g1) + n2 * _sq(g2)) / (n1 + n2), _sq(big), (n1 + n2) / 2,
                   n1 + n2, biased=True)
    assert [n for n, _ in grads] == [16, 16, 16, 12]
    assert job._noise.estimator.count == 3 and job._noise.estimator.biased
    assert job._noise.estimator.raw == pytest.approx(ref.raw, rel=1e-4)
    job.close()


def test_tracking_can_be_switched_off(solo):
    import torch

    solo.setenv("HPCSCHED_LOCAL_BATCH_SIZE", "8")
    solo.setenv("HPCSCHED_ACCUMULATION_STEPS", "2")
    X, y, model = _problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    job = ElasticJob(dataset_size=60, epochs=1, track_grad_noise=False)
    job.register(model=model, optimizer=opt)
    _train(job, X, y, model, opt)
    assert job.grad_noise is None and job.gradient_noise_scale is None
    assert job._noise.micro is None              # no hooks were installed
    solo.setenv("HPCSCHED_GRAD_NOISE", "0")
    assert not ElasticJob(dataset_size=60, epochs=1)._noise.enabled


def test_checkpoint_round_trip_keeps_the_averages_across_a_resize(solo, tmp_path):
    """The EMA state is in the checkpoint, is restored by a job with another batch
    configuration, and keeps accumulating there (no reset)."""
    import torch

    jd = JobDir.create(tmp_path)   # under hpcsched the launcher's batch configuration wins
    solo.setenv("HPCSCHED_JOB_DIR", str(jd.path))
    solo.setenv("HPCSCHED_LOCAL_BATCH_SIZE", "8")
    solo.setenv("HPCSCHED_ACCUMULATION_STEPS", "2")
    X, y, model = _problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    job = ElasticJob(dataset_size=60, epochs=1, seed=1)
    job.register(model=model, optimizer=opt)
    _train(job, X, y, model, opt)
    path = job.checkpoint()
    saved = job._noise.estimator.state_dict()
    assert saved["count"] == 4 and saved["base_batch_size"] == 16
    ck = torch.load(path, map_location="cpu", weights_only=True)
    assert ck["grad_noise"] == saved
    job.close()

    # "resized": global batch 4 x 3 = 12 instead of 16, one more epoch
    solo.setenv("HPCSCHED_LOCAL_BATCH_SIZE", "4")
    solo.setenv("HPCSCHED_ACCUMULATION_STEPS", "3")
    X, y, model2 = _problem()
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.01)
    job2 = ElasticJob(dataset_size=60, epochs=2, seed=1)
    assert job2.register(model=model2, optimizer=opt2)
    assert job2._noise.estimator.state_dict() == saved
    assert job2.grad_noise == job._noise.estimator.estimate
    _train(job2, X, y, model2, opt2)
    assert job2._noise.estimator.count == 4 + 5          # 60 / 12 steps more, nothing reset
    assert job2._noise.estimator.base_batch_size == 16   # the smoothing keeps the job's base
    job2.close()
    prog = ctl.read_progress(jd.progress_path, jd.uid)
    assert prog.finished and prog.total_samples == 120 and prog.samples_processed == 120
    assert (prog.grad_sqr, prog.grad_var) == job2.grad_noise


def test_progress_fields_are_optional(tmp_path):
    """progress.json written before total_samples / grad_sqr / grad_var existed still reads."""
    p = ctl.Progress(job_uid="u", generation=0, step=3, epoch=0, samples_processed=96,
                     epoch_position=96, throughput=1.0, world_size=1, global_batch_size=32,
                     time=0.0)
    old = {k: v for k, v in dataclasses.asdict(p).items()
           if k not in ("total_samples", "grad_sqr", "grad_var")}
    ctl.write_json_atomic(tmp_path / "progress.json", old)
    got = ctl.read_progress(tmp_path / "progress.json", "u")
    assert got == p and got.grad_sqr is None and got.total_samples is None


# ---------------------------------------------------------------- two gloo processes

_WORKER = r"""
import json, sys, torch
from hpcsched.elastic import ElasticJob
X = torch.arange(8 * 3, dtype=torch.float64).reshape(8, 3).remainder(5) - 2.0
for name in ("float32", "float64", "bfloat16"):
    dtype = getattr(torch, name)
    w = torch.nn.Parameter(torch.zeros(3, dtype=dtype))
    job = ElasticJob(dataset_size=8, epochs=1, seed=5)
    raw = []
    for step in job.steps():
        w.grad = None
        for idx in step.micro_batches:
            if idx:   # d/dw of sum(w . x_i) / N: the mean of this rank's x_i, times n / N
                ((X[idx].to(dtype) @ w).sum() / step.global_samples).backward()
        job.reduce_gradients([w])
        job.grad_noise  # folds this step in (otherwise done at the end of the step)
        raw.append(job._noise.estimator.raw)
    if job.rank == 0:
        print(json.dumps({name: raw}), flush=True)
job._group.barrier()
job.close()
"""


def test_multi_rank_reduction_matches_a_direct_computation(tmp_path):
    """Three gloo ranks, 6 samples then 2 (one rank empty): the piggybacked statistics
    (float32, float64) and the separate float32 all-reduce (bfloat16 gradients) give the
    two-batch estimate computed directly from the per-rank sample means."""
    import torch

    from hpcsched.job.data import epoch_permutation, rank_micro_batches
    from hpcsched.protocol.batching import BatchConfig

    port = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-c", _WORKER], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env=dict({k: v for k, v in os.environ.items() if not k.startswith("HPCSCHED_")},
                 RANK=str(r), WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 GLOO_SOCKET_IFNAME="lo", HPCSCHED_LOCAL_BATCH_SIZE="2"))
        for r in range(3)]
    out = _join(procs)[0]
    got = {}
    for line in out.splitlines():
        if line.startswith("{"):
            got.update(json.loads(line))

    X = torch.arange(8 * 3, dtype=torch.float64).reshape(8, 3).remainder(5) - 2.0
    perm, cfg, pos = epoch_permutation(8, 0, 5), BatchConfig(3, 2, 1), 0
    ref = GradientNoiseEstimator(base_batch_size=6)
    want = []
    for _ in range(2):
        parts = [rank_micro_batches(perm, pos, cfg, r)[0][0] for r in range(3)]
        N = sum(len(p) for p in parts)
        pos += N
        means = [(len(p), X[p].mean(0)) for p in parts if p]
        big = X[[i for p in parts for i in p]].mean(0)
        small = sum(n * float(m @ m) for n, m in means) / N
        ref.update(small, float(big @ big), N / len(means), N)
        want.append(ref.raw)
    assert [len(p) for p in parts] == [1, 1, 0]    # the second step: rank 2 has no sample
    for name, rel in (("float32", 1e-5), ("float64", 1e-12), ("bfloat16", 3e-2)):
        assert len(got[name]) == 2, out[-2000:]
        for g, w in zip(got[name], want):
            assert g == pytest.approx(w, rel=rel, abs=1e-9), name


@pytest.mark.slow
def test_two_gloo_ranks_measure_noise_and_keep_it_through_a_shrink(tmp_path):
    """Two workers (16 + 16 per step: the two-batch estimate through the piggybacked
    all-reduce), checkpoint-and-shrink to one worker, relaunch from the checkpoint: the
    statistics are reported in the metrics (same on both ranks) and in progress.json, survive
    the resize, and the run completes."""
    jd = JobDir.create(tmp_path)
    epochs = 2
    procs = _launch(jd, world=2, generation=0, local=16, accum=1, launch=1, epochs=epochs,
                    step_time="0.02")
    _wait_ack(jd, 0, "applied", procs)
    metrics = jd.path / "metrics" / "launch-1-rank-0.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:   # let it take some steps first
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 20:
            break
        time.sleep(0.02)
    ctl.write_control(jd.control_path, ctl.Control(
        job_uid=jd.uid, generation=1, action="checkpoint-and-shrink", nodes=1,
        workers_per_node=1, global_batch_size=32, local_batch_size=32, accumulation_steps=1,
        lr_scale=1.0, issued_at=time.time(), reason="test"))
    a = _wait_ack(jd, 1, "checkpointed", procs)
    _join(procs)

    import torch

    saved = torch.load(a.checkpoint, map_location="cpu", weights_only=True)["grad_noise"]
    assert saved["count"] >= 19 and not saved["biased"] and saved["base_batch_size"] == 32

    procs = _launch(jd, world=1, generation=1, local=32, accum=1, launch=2, epochs=epochs)
    out = _join(procs)[0]
    assert '"final_loss"' in out

    recs = load_records(jd.path)
    first = [r for r in recs if r["launch"] == 1]
    by_step = {}
    for r in first:
        by_step.setdefault(r["step"], []).append((r["grad_sqr"], r["grad_var"]))
    assert all(len(v) == 2 and v[0] == v[1] for v in by_step.values())  # same on both ranks
    assert by_step[0][0] != (None, None)   # 16 + 16 samples: an estimate from the first step
    second = sorted((r for r in recs if r["launch"] == 2), key=lambda r: r["step"])
    assert second[0]["grad_sqr"] is not None   # restored, not restarted
    prog = ctl.read_progress(jd.progress_path, jd.uid)
    assert prog.finished and prog.total_samples == epochs * DIGITS
    assert prog.samples_processed == epochs * DIGITS
    for v in (prog.grad_sqr, prog.grad_var):
        assert v is not None and math.isfinite(v) and v > 0


def test_a_measurement_every_k_steps_weighs_as_k_steps():
    """Measured every k-th step, one update with ``weight=k`` moves the average as k updates of
    the same value would (``theta ** k``): the estimator's memory, in samples, is unchanged."""
    every, one = GradientNoiseEstimator(0.9), GradientNoiseEstimator(0.9)
    for value in (4.0, 9.0, 2.5):
        every.update(value + 1.0, value, 8, 32, weight=3)
        for _ in range(3):
            one.update(value + 1.0, value, 8, 32)
    assert every.raw == pytest.approx(one.raw, rel=1e-12)
    assert every.count == 3 and one.count == 9


@pytest.mark.parametrize("world, every, measured", [
    (2, 1, [0, 1, 2, 3, 4, 5, 6, 7, 8]),
    (2, 4, [0, 4, 8]),
    (1, 4, [0, 1, 2, 3, 4, 5, 6, 7, 8]),    # one rank: consecutive steps, every step
])
def test_with_several_ranks_the_tracker_measures_every_kth_step(world, every, measured):
    import torch

    from hpcsched.job.data import Step
    from hpcsched.job.gradient_noise import GNSTracker

    t = GNSTracker(torch, True, 32)
    t.every = every
    got = []
    for k in range(9):
        t.begin_step(Step(step=k, epoch=0, micro_batches=[[0, 1]], global_samples=2 * world,
                          local_batch_size=2, accumulation_steps=1, world_size=world,
                          lr_scale=1.0, generation=0), single_rank=world == 1)
        if t.measuring([]) is not None:
            got.append(k)
        t.end_step()
    assert got == measured
