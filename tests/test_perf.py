"""hpcsched.perf: Pollux's step-time formula, its fit, statistical efficiency, the shipped priors,
the linear model, and the one objective (goodput) with its best configuration. Hand-computed
cases plus invariants."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hpcsched.model.snapshot import JobView, ProfilePoint
from hpcsched.perf import linear, priors
from hpcsched.perf.linear import ThroughputModel
from hpcsched.perf.model import (
    best_at,
    candidates,
    goodput,
    job_goodput,
    model_for,
)
from hpcsched.perf.pollux import (
    PerfParams,
    PerfSample,
    PolluxModel,
    efficiency,
    fit_perf_params,
    gain,
    step_time,
    sync_time,
    throughput,
)
from hpcsched.perf.priors import APPLICATIONS, prior_for
from hpcsched.protocol.batching import BatchConfig
from hpcsched.protocol.limits import JobLimits

TRUE = PerfParams(alpha_c=0.02, beta_c=0.001, alpha_n=0.12, beta_n=0.004, alpha_r=0.03,
                  beta_r=0.002, gamma=2.0)


def _job(*, profile=(), app="", batch=128, bmin=None, bmax=None, max_local=None, base=None,
         noise=None, nodes=1, wpn=4):
    return JobView(job_id="J", state="RUNNING", nodes=nodes, node_names=(),
                   limits=JobLimits(wpn, 1, 4, bmin or batch, bmax or batch, max_local, base or batch, "linear"),
                   batch_size=batch, submit_time=0.0, profile=tuple(profile), app_class=app,
                   grad_noise=noise)


def _point(params, nodes, world, local, accum=1, samples=20):
    t = step_time(params, nodes, world, local, accum)
    return ProfilePoint(world, nodes, local, accum, t, world * local * accum / t, samples)


def _pt(world, local, step, accum=1):
    """A linear-model profile point: ``world // 2`` nodes."""
    return ProfilePoint(world, world // 2, local, accum, step, world * local * accum / step,
                        samples=50)


# ------------------------------------------------------------------------------ step-time model

def test_step_time_formula_by_hand():
    # 2 nodes, 8 replicas, local 64, 3 micro-batches:
    # T_grad = 0.02 + 0.001 * 64 = 0.084; T_sync = 0.12 + 0.004 * (8 - 2) = 0.144
    # T_step = 2 * 0.084 + sqrt(0.084^2 + 0.144^2) = 0.168 + 0.166710... = 0.334710...
    expect = 2 * 0.084 + math.hypot(0.084, 0.144)
    assert step_time(TRUE, 2, 8, 64, 3) == pytest.approx(expect, rel=1e-12)
    assert throughput(TRUE, 2, 8, 64, 3) == pytest.approx(8 * 64 * 3 / expect, rel=1e-12)
    # one node, 4 replicas: intra-node parameters; one replica: no synchronisation at all
    assert sync_time(TRUE, 1, 4) == pytest.approx(0.03 + 0.002 * 2)
    assert sync_time(TRUE, 1, 2) == pytest.approx(0.03)
    assert sync_time(TRUE, 1, 1) == 0.0
    assert step_time(TRUE, 1, 1, 64, 1) == pytest.approx(0.084)
    # arrays broadcast
    arr = step_time(TRUE, np.array([1, 1, 2]), np.array([1, 4, 8]), 64)
    assert arr.shape == (3,) and arr[0] == pytest.approx(0.084)
    with pytest.raises(ValueError):
        step_time(TRUE, 2, 1, 64)          # more nodes than replicas
    with pytest.raises(ValueError):
        step_time(TRUE, np.array([1, 2]), np.array([1, 1]), 64)


@pytest.mark.parametrize(("nodes", "gpus", "local", "accum"),
                         [(1, 1, 64, 1), (1, 4, 32, 2), (2, 8, 64, 3), (4, 16, 8, 1), (3, 3, 1, 1)])
def test_the_policies_model_is_the_one_step_time(nodes, gpus, local, accum):
    """PolluxModel (the policies' inner loop), the scalar and the array form agree: one formula."""
    m = PolluxModel(TRUE, "given")
    cfg = BatchConfig(gpus, local, accum)
    assert m.step_time(cfg, nodes) == step_time(TRUE, nodes, gpus, local, accum)
    assert m.throughput(cfg, nodes) == pytest.approx(throughput(TRUE, nodes, gpus, local, accum),
                                                     rel=1e-15)
    arr = step_time(TRUE, np.array([nodes]), np.array([gpus]), np.array([local]), np.array([accum]))
    assert arr[0] == pytest.approx(m.step_time(cfg, nodes), rel=1e-14)


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(1, 8), k=st.integers(1, 64), local=st.integers(1, 512),
       accum=st.integers(1, 4), ac=st.floats(1e-4, 1.0), bc=st.floats(1e-7, 1e-2),
       gamma=st.floats(1.0, 10.0))
def test_more_replicas_never_lower_throughput_without_sync_cost(nodes, k, local, accum, ac, bc,
                                                               gamma):
    p = PerfParams(ac, bc, 0.0, 0.0, 0.0, 0.0, gamma)
    k = max(k, nodes)
    a = throughput(p, nodes, k, local, accum)
    b = throughput(p, nodes, k + 1, local, accum)
    assert b >= a * (1 - 1e-12)
    # and a single node, growing: same
    assert throughput(p, 1, k + 1, local, accum) >= throughput(p, 1, k, local, accum) * (1 - 1e-12)


# ------------------------------------------------------------------------------------- fitting

def _grid_samples(params, with_compute=True):
    out = []
    for nodes, k in [(1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (2, 8), (4, 16), (8, 32)]:
        for local in (16, 32, 64, 128, 256):
            comp = params.alpha_c + params.beta_c * local if with_compute else None
            out.append(PerfSample(nodes, k, local, 1, step_time(params, nodes, k, local), comp))
    return out


def test_fit_recovers_known_parameters():
    fitted = fit_perf_params(_grid_samples(TRUE))
    for name, true in TRUE.as_dict().items():
        assert getattr(fitted, name) == pytest.approx(true, rel=0.05), name
    for nodes, k, local in [(4, 12, 48), (1, 3, 200), (16, 64, 8)]:
        assert (step_time(fitted, nodes, k, local)
                == pytest.approx(step_time(TRUE, nodes, k, local), rel=0.01))


def test_fit_from_a_jobs_own_profile_points():
    """ProfilePoints carry no compute time except on one GPU (= step time / accumulation)."""
    pts = [_point(TRUE, n, k, b, s) for n, k, b, s in
           [(1, 1, 64, 1), (1, 1, 128, 2), (1, 4, 64, 1), (1, 2, 32, 1), (2, 8, 64, 1),
            (2, 4, 128, 1), (4, 16, 32, 2), (1, 4, 256, 1)]]
    fitted = fit_perf_params(pts)
    for n, k, b, s in [(2, 8, 100, 1), (3, 12, 64, 1), (1, 4, 64, 3)]:
        assert (step_time(fitted, n, k, b, s)
                == pytest.approx(step_time(TRUE, n, k, b, s), rel=0.03))
    assert fit_perf_params(list(reversed(pts))) == fitted          # order does not matter
    with pytest.raises(ValueError):
        fit_perf_params([ProfilePoint(1, 1, 32, 1, 0.0, 0.0)])      # nothing usable


def test_fit_fixes_what_the_points_cannot_tell_as_adaptdl():
    # one node only, one local batch size: alpha_c = half the compute time, inter-node at least
    # 1.1 x intra-node (AdaptDL's optimistic defaults)
    pts = [_point(TRUE, 1, k, 64) for k in (1, 2, 4)]
    p = fit_perf_params(pts)
    assert p.alpha_c == pytest.approx((0.02 + 0.001 * 64) / 2)
    assert p.alpha_n >= 1.1 * p.alpha_r and p.beta_n >= 1.1 * p.beta_r
    for k in (1, 2, 4):
        assert step_time(p, 1, k, 64) == pytest.approx(step_time(TRUE, 1, k, 64), rel=0.02)
    # with a prior, what cannot be told comes from the prior scaled to the job (here 2x slower)
    slow = [_point(TRUE.scaled(2.0), 1, k, b) for k, b in [(1, 32), (1, 64), (2, 64), (4, 64)]]
    q = fit_perf_params(slow, prior=TRUE)
    assert q.alpha_n == pytest.approx(2 * TRUE.alpha_n, rel=0.02)
    assert step_time(q, 4, 16, 64) == pytest.approx(2 * step_time(TRUE, 4, 16, 64), rel=0.05)


def test_linear_fit_recovers_linear_step_time():
    # step time 0.01 + 0.001 * local, measured at two local batch sizes
    m = linear.fit((_pt(2, 32, 0.042), _pt(4, 16, 0.026)))
    assert m.fitted and m.alpha == pytest.approx(0.01, rel=1e-6)
    assert m.beta == pytest.approx(0.001, rel=1e-6)
    assert linear.fit(()) is None


# -------------------------------------------------------------------------------------- priors

def test_prior_for_every_shipped_application():
    assert set(priors.prior_apps()) == set(APPLICATIONS)
    for app in APPLICATIONS:
        p = prior_for(app)
        assert p is not None, app
        assert all(v > 0 for v in p.as_dict().values()) and 1.0 <= p.gamma <= 10.0
        # sanity: scaling out still helps somewhere (throughput at 16 GPUs > at 1 GPU)
        assert throughput(p, 4, 16, 32) > throughput(p, 1, 1, 32)
    assert prior_for(" CIFAR10 ") == prior_for("cifar10")
    assert prior_for("A") is None and prior_for("") is None


def test_model_parameters_prior_scaled_to_a_single_measurement():
    prior = prior_for("cifar10")
    measured = 0.5      # 3 significant digits: model_for's cache key keeps it exactly
    pt = ProfilePoint(4, 1, 64, 1, measured, 4 * 64 / measured, 30)
    m = model_for(_job(profile=[pt, pt], app="cifar10"))     # same configuration twice
    assert "prior" in m.source and "1 configuration" in m.source
    assert m.step_time(BatchConfig(4, 64, 1), 1) == pytest.approx(measured, rel=1e-9)
    ratio = measured / step_time(prior, 1, 4, 64)
    assert m.step_time(BatchConfig(16, 32, 1), 4) == pytest.approx(
        ratio * step_time(prior, 4, 16, 32), rel=1e-9)
    # not measured: the prior as is; no prior and no measurement: no throughput model
    assert model_for(_job(app="cifar10")).params == prior
    assert model_for(_job(app="mystery")) is None
    assert job_goodput(_job(app="mystery"), 1, 128) is None
    # two configurations: its own fit
    pts = [_point(TRUE, 1, 4, 32), _point(TRUE, 2, 8, 32), _point(TRUE, 1, 1, 32)]
    own = model_for(_job(profile=pts, app="cifar10"))
    assert own.source.startswith("fitted to 3")
    assert own.step_time(BatchConfig(8, 32, 1), 2) == pytest.approx(step_time(TRUE, 2, 8, 32),
                                                                    rel=0.02)


def test_model_for_uses_the_pollux_model_and_its_prior_for_known_applications():
    job = _job(batch=256, bmax=1024, app="cifar10", nodes=2)
    m = model_for(job)   # not measured yet: the application's prior as is
    assert isinstance(m, PolluxModel) and m.params == prior_for("cifar10")
    cfg = BatchConfig(8, 32, 1)
    # Pollux's model: the same 8 GPUs synchronise slower across nodes than within one
    assert m.throughput(cfg, nodes=2) < m.throughput(BatchConfig(4, 64, 1), nodes=1) * 2
    assert m.step_time(cfg, 2) == pytest.approx(step_time(m.params, 2, 8, 32, 1), rel=1e-12)
    # one measured configuration: the prior scaled to reproduce it exactly
    t = 1.7 * step_time(prior_for("cifar10"), 2, 8, 32, 1)
    one = model_for(replace(job, profile=(ProfilePoint(8, 2, 32, 1, t, 256 / t, 50),)))
    assert isinstance(one, PolluxModel) and "1 configuration" in one.source
    assert one.step_time(cfg, 2) == pytest.approx(t, rel=2e-3)   # key: 3 digits
    # no known application: the linear model, fitted to the profile (None without one)
    assert model_for(replace(job, app_class="")) is None
    lin = model_for(replace(job, app_class="", profile=(_pt(8, 32, 0.2),)))
    assert isinstance(lin, ThroughputModel)


# ---------------------------------------------------------------------------------- efficiency

def test_efficiency_worked_example():
    # grad_sqr 1, grad_var 4, M0 = 32, M = 128: r = 4, denominator 4/4 + 1 = 2,
    # gain (4 + 1) / 2 = 2.5, E = 2.5 / 4 = 0.625.
    # Same through the noise scale: phi = 32 * 4 / 1 = 128, (128 + 32) / (128 + 128) = 0.625
    assert gain(1.0, 4.0, 4.0) == pytest.approx(2.5)
    assert efficiency(1.0, 4.0, 32, 128) == pytest.approx(0.625)
    assert efficiency(1.0, 4.0, 32, 32) == pytest.approx(1.0)
    phi = 32 * 4.0 / 1.0
    for m in (48, 64, 256, 4096):
        assert efficiency(1.0, 4.0, 32, m) == pytest.approx((phi + 32) / (phi + m))


def test_efficiency_limits_follow_the_formula():
    assert efficiency(2.0, 0.0, 32, 128) == pytest.approx(32 / 128)  # no noise: E = M0 / M
    assert efficiency(0.0, 3.0, 32, 4096) == pytest.approx(1.0)      # pure noise: E = 1
    assert efficiency(0.0, 0.0, 32, 64) == pytest.approx(0.5)        # both 0: AdaptDL's M0 / M
    assert efficiency(None, None, 32, 4096) == 1.0                   # no statistics
    assert efficiency(float("nan"), 1.0, 32, 4096) == 1.0
    assert efficiency(-1.0, 4.0, 32, 128) == pytest.approx(1.0)      # negative estimate -> 0
    assert efficiency(1.0, 0.0, 32, 8) == 1.0                        # below M0: capped at 1
    with pytest.raises(ValueError):
        efficiency(1.0, 1.0, 32, 0)


@settings(max_examples=80, deadline=None)
@given(sqr=st.floats(0, 1e6), var=st.floats(0, 1e6), m0=st.integers(1, 4096),
       m=st.integers(1, 100_000), dm=st.integers(0, 10_000))
@example(sqr=5e-324, var=5e-324, m0=2, m=3, dm=1)   # subnormal statistics (found by hypothesis)
def test_efficiency_is_in_unit_interval_and_never_rises_with_batch(sqr, var, m0, m, dm):
    e = efficiency(sqr, var, m0, m)
    assert 0.0 < e <= 1.0
    assert efficiency(sqr, var, m0, m + dm) <= e + 1e-12
    assert e == min(1.0, gain(sqr, var, m / m0) / (m / m0))      # efficiency is gain / r


# ----------------------------------------------------------------- goodput: the one objective

@pytest.mark.parametrize("app", ["cifar10", ""])
def test_best_at_respects_the_jobs_limits(app):
    job = _job(profile=[_point(TRUE, 1, 4, 32), _point(TRUE, 2, 8, 32), _point(TRUE, 1, 1, 32)],
               batch=256, bmin=64, bmax=3000, max_local=100, noise=(1.0, 50.0), app=app)
    m = model_for(job)
    for nodes, k in [(1, 1), (1, 4), (2, 8), (4, 16)]:
        cfgs = candidates(job, k)
        assert cfgs
        for c in cfgs:
            assert 64 <= c.global_batch_size <= 3000 and c.local_batch_size <= 100
        good, cfg = best_at(job, m, k)
        g, local, accum = cfg.global_batch_size, cfg.local_batch_size, cfg.accumulation_steps
        assert g == k * local * accum and 64 <= g <= 3000 and 1 <= local <= 100
        assert good == goodput(m, cfg, nodes, job.grad_noise, job.base_batch_size)
        if k == nodes * job.workers_per_node:      # job_goodput: whole nodes
            assert good == job_goodput(job, nodes, g)
        assert good >= max(goodput(m, c, nodes, job.grad_noise, job.base_batch_size)
                           for c in cfgs) - 1e-9
    # no batch size fits 64 GPUs under max 32 samples: none
    small = _job(batch=32, bmin=16, bmax=32, app=app, profile=job.profile)
    assert best_at(small, model_for(small), 64) == (0.0, None)


def test_best_at_follows_the_gradient_noise():
    base = {"profile": [_point(TRUE, 1, 4, 32), _point(TRUE, 1, 1, 32), _point(TRUE, 2, 8, 64)],
            "batch": 128, "bmin": 128, "bmax": 4096, "base": 128, "app": "cifar10"}

    def best(noise):
        job = _job(noise=noise, **base)
        return best_at(job, model_for(job), 4)

    # no gradient noise: E = M0 / M, goodput = M0 / T_step, so the smallest batch wins
    assert best((1.0, 0.0))[1].global_batch_size == 128
    # very noisy gradients: E ~ 1, throughput grows with the batch, so the largest wins
    assert best((1e-6, 1e3))[1].global_batch_size == 4096
    # in between: an interior optimum, and goodput there beats both ends
    good, cfg = best((1.0, 8.0))
    assert 128 < cfg.global_batch_size < 4096
    job = _job(noise=(1.0, 8.0), **base)
    m = model_for(job)
    for end in (BatchConfig(4, 32, 1), BatchConfig(4, 1024, 1)):
        assert good > goodput(m, end, 1, job.grad_noise, 128)


def test_goodput_is_throughput_times_efficiency():
    m = PolluxModel(TRUE, "given")
    cfg = BatchConfig(8, 64, 2)     # global 1024
    x = m.throughput(cfg, 2)
    assert goodput(m, cfg, 2, None, 128) == x
    assert goodput(m, cfg, 2, (1.0, 4.0), 128) == pytest.approx(x * efficiency(1.0, 4.0, 128, 1024))
    assert goodput(m, cfg, 2, (float("nan"), 4.0), 128) == x


def test_best_at_is_deterministic():
    job = _job(profile=[_point(TRUE, 1, 4, 32), _point(TRUE, 2, 8, 32)], app="bert",
               batch=64, bmin=32, bmax=512, noise=(1.0, 10.0))
    assert model_for(job) == model_for(replace(job))
    assert best_at(job, model_for(job), 8) == best_at(replace(job), model_for(replace(job)), 8)


@pytest.mark.parametrize("app", ["cifar10", "imagenet", "bert", "yolov3"])
@pytest.mark.parametrize("noise", [None, (1.0, 10.0), (5.0, 0.5), (0.0, 0.0)])
@pytest.mark.parametrize(("gpus", "nodes"), [(1, 1), (3, 1), (6, 2), (16, 4)])
def test_the_vectorised_best_configuration_is_the_loops(app, noise, gpus, nodes):
    """``best_at`` evaluates Pollux's model over all candidates at once; the answer is the one
    the plain loop over :func:`goodput` gives (value to 1e-9, and the same configuration)."""
    from hpcsched.perf import model as m
    from hpcsched.perf.pollux import PolluxModel
    from hpcsched.perf.priors import prior_for
    pm = PolluxModel(prior_for(app), "prior")
    cfgs = m._candidates(gpus, 64, 8192, 512, 32)
    x, cfg = m._best_vectorised(pm, cfgs, 512, 128, noise, nodes)
    loop = max(cfgs, key=lambda c: (m.goodput(pm, c, nodes, noise, 128), -abs(c.global_batch_size - 512)))
    assert cfg == loop and x == pytest.approx(m.goodput(pm, loop, nodes, noise, 128), rel=1e-9)


def _coarsened(monkeypatch):
    """Goodputs rounded to thousands, so that several candidates of a size tie."""
    from hpcsched.perf import model as m
    real, real_of = m._goodputs, m._goodputs_of
    monkeypatch.setattr(m, "_goodputs", lambda *a, **k: np.round(real(*a, **k), -3))
    monkeypatch.setattr(m, "_goodputs_of", lambda *a, **k: np.round(real_of(*a, **k), -3))
    m.clear_caches()


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("noise", [None, (1.0, 10.0)])
def test_best_at_each_is_best_at_at_each_size(noise, ties, monkeypatch):
    """The same answer as :func:`best_at` size by size; with ``ties``, goodputs coarsened so
    that several candidates of a size tie (both then go to the batch nearest the current one,
    then the first)."""
    from hpcsched.perf import model as m
    from hpcsched.perf.pollux import PolluxModel
    job = replace(_cifar_job(), grad_noise=noise)
    pm = PolluxModel(prior_for("cifar10"), "prior")
    if ties:
        _coarsened(monkeypatch)
    sizes = [(0, 0), (1, 1), (3, 1), (0, 0), (4, 1), (6, 2), (13, 4), (16, 4), (0, 0)]
    got = m.best_at_each(job, pm, sizes)
    want = [m.best_at(job, pm, g, n) if g else (0.0, None) for g, n in sizes]
    assert [c for _, c in got] == [c for _, c in want]
    assert [x for x, _ in got] == pytest.approx([x for x, _ in want], rel=1e-12)


def _cifar_job() -> JobView:
    return JobView(job_id="1", state="RUNNING", nodes=1, node_names=(),
                   limits=JobLimits(4, 1, 4, 64, 8192, 32, 128, "sqrt"), batch_size=512,
                   submit_time=0.0, app_class="cifar10")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from([None, (1.0, 10.0), (0.5, 200.0), (float("nan"), 1.0), (3.0, 0.0)]),
    st.integers(32, 2048), st.sampled_from([16, 32, None]), st.integers(32, 256),
    st.lists(st.tuples(st.integers(0, 16), st.integers(1, 4)), max_size=6),
    st.sampled_from(["prior", "scaled", "linear", "none"])), max_size=6),
    st.booleans())
def test_best_at_each_of_is_best_at_for_every_job(asks, ties):
    """Several jobs in one pass (:func:`best_at_each_of`) give each job's :func:`best_at` at
    each size: jobs with and without (finite) gradient noise side by side, different batch
    limits and base batches, Pollux's model scaled or not, the linear model, no model, no
    sizes or one; with ``ties``, goodputs coarsened so that candidates tie."""
    from hpcsched.perf import model as m
    from hpcsched.perf.pollux import PolluxModel
    with pytest.MonkeyPatch.context() as mp:
        if ties:
            _coarsened(mp)
        requests = []
        for i, (noise, batch, max_local, base, sizes, kind) in enumerate(asks):
            job = _cifar_job()
            job = replace(job, job_id=str(i), grad_noise=noise, batch_size=batch,
                          limits=replace(job.limits, min_batch_size=32, max_local_batch_size=max_local,
                                         base_batch_size=base))
            model = {"prior": PolluxModel(prior_for("cifar10"), "prior"),
                     "scaled": PolluxModel(prior_for("cifar10").scaled(1.7), "x1.7"),
                     "linear": ThroughputModel(0.01, 0.002, ((1, 1.0), (4, 0.9)), True),
                     "none": None}[kind]
            requests.append((job, model, [(g, n) for g, n in sizes]))
        got = m.best_at_each_of(requests)
        for (job, model, sizes), rates in zip(requests, got):
            want = [m.best_at(job, model, g, n) for g, n in sizes]
            assert [c for _, c in rates] == [c for _, c in want]
            assert [x for x, _ in rates] == pytest.approx([x for x, _ in want], rel=1e-12)
        m.clear_caches()


@pytest.mark.parametrize("with_prior", [False, True])
def test_the_fit_objective_gradient_matches_finite_differences(with_prior):
    """The fit's analytic gradient (what L-BFGS-B follows) against central differences, at
    random points of the free parameters: multi-node, one-node and one-GPU samples (T_sync 0),
    accumulation, compute times known for some."""
    from scipy.optimize import approx_fprime

    from hpcsched.perf.pollux import _Objective, _Points, fixed_parameters

    samples = (PerfSample(1, 1, 32, 1, 0.05, 0.05), PerfSample(1, 4, 32, 2, 0.16),
               PerfSample(2, 8, 64, 1, 0.3, 0.09), PerfSample(4, 16, 16, 1, 0.4),
               PerfSample(1, 2, 48, 1, 0.11, 0.07))
    pts = _Points.of(samples)
    fixed, ref = fixed_parameters(pts, prior_for("cifar10") if with_prior else None)
    objective = _Objective(pts, fixed, ref)
    assert len(objective.free) == 7
    rng = np.random.default_rng(9)
    for _ in range(20):
        x = np.array([rng.uniform(1.0, 4.0) if nm == "gamma" else math.log(rng.uniform(1e-4, 0.3))
                      for nm in objective.free])
        value, grad = objective(x)
        numeric = approx_fprime(x, lambda z: objective(z)[0], 1e-7)
        assert value > 0
        assert grad == pytest.approx(numeric, rel=1e-4, abs=1e-5)
        params = objective.unpack(x)
        for nm, v in zip(objective.free, x, strict=True):
            assert getattr(params, nm) == pytest.approx(v if nm == "gamma" else math.exp(v))
