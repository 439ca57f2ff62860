"""Pollux-style goodput model: step-time formula, fit, shipped priors, statistical efficiency,
best batch size. Hand-computed cases plus invariants."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcsched.perf import goodput as gp
from hpcsched.perf.goodput import (
    APPLICATIONS,
    GoodputModel,
    PerfParams,
    PerfSample,
    efficiency,
    fit_perf_params,
    predict_step_time,
    predict_sync_time,
    predict_throughput,
    prior_for,
)
from hpcsched.policies.snapshot import JobView, ProfilePoint

TRUE = PerfParams(alpha_c=0.02, beta_c=0.001, alpha_n=0.12, beta_n=0.004, alpha_r=0.03,
                  beta_r=0.002, gamma=2.0)
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux"


def _job(*, profile=(), app="", batch=128, bmin=None, bmax=None, max_local=None, base=None,
         noise=None, nodes=1, wpn=4):
    return JobView(job_id="J", state="RUNNING", nodes=nodes, node_names=(), workers_per_node=wpn,
                   min_nodes=1, max_nodes=4, batch_size=batch, min_batch_size=bmin or batch,
                   max_batch_size=bmax or batch, max_local_batch_size=max_local,
                   base_batch_size=base or batch, lr_scaling="linear", submit_time=0.0,
                   profile=tuple(profile), app_class=app, grad_noise=noise)


def _point(params, nodes, world, local, accum=1, samples=20):
    t = predict_step_time(params, nodes, world, local, accum)
    return ProfilePoint(world, nodes, local, accum, t, world * local * accum / t, samples)


# ------------------------------------------------------------------------------ step-time model

def test_step_time_formula_by_hand():
    # 2 nodes, 8 replicas, local 64, 3 micro-batches:
    # T_grad = 0.02 + 0.001 * 64 = 0.084; T_sync = 0.12 + 0.004 * (8 - 2) = 0.144
    # T_step = 2 * 0.084 + sqrt(0.084^2 + 0.144^2) = 0.168 + 0.166710... = 0.334710...
    expect = 2 * 0.084 + math.hypot(0.084, 0.144)
    assert predict_step_time(TRUE, 2, 8, 64, 3) == pytest.approx(expect, rel=1e-12)
    assert predict_throughput(TRUE, 2, 8, 64, 3) == pytest.approx(8 * 64 * 3 / expect, rel=1e-12)
    # one node, 4 replicas: intra-node parameters; one replica: no synchronisation at all
    assert predict_sync_time(TRUE, 1, 4) == pytest.approx(0.03 + 0.002 * 2)
    assert predict_sync_time(TRUE, 1, 2) == pytest.approx(0.03)
    assert predict_sync_time(TRUE, 1, 1) == 0.0
    assert predict_step_time(TRUE, 1, 1, 64, 1) == pytest.approx(0.084)
    # arrays broadcast
    arr = predict_step_time(TRUE, np.array([1, 1, 2]), np.array([1, 4, 8]), 64)
    assert arr.shape == (3,) and arr[0] == pytest.approx(0.084)
    with pytest.raises(ValueError):
        predict_step_time(TRUE, 2, 1, 64)          # more nodes than replicas


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(1, 8), k=st.integers(1, 64), local=st.integers(1, 512),
       accum=st.integers(1, 4), ac=st.floats(1e-4, 1.0), bc=st.floats(1e-7, 1e-2),
       gamma=st.floats(1.0, 10.0))
def test_more_replicas_never_lower_throughput_without_sync_cost(nodes, k, local, accum, ac, bc,
                                                               gamma):
    p = PerfParams(ac, bc, 0.0, 0.0, 0.0, 0.0, gamma)
    k = max(k, nodes)
    a = predict_throughput(p, nodes, k, local, accum)
    b = predict_throughput(p, nodes, k + 1, local, accum)
    assert b >= a * (1 - 1e-12)
    # and a single node, growing: same
    assert predict_throughput(p, 1, k + 1, local, accum) >= predict_throughput(p, 1, k, local,
                                                                               accum) * (1 - 1e-12)


# ------------------------------------------------------------------------------------- fitting

def _grid_samples(params, with_compute=True):
    out = []
    for nodes, k in [(1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (2, 8), (4, 16), (8, 32)]:
        for local in (16, 32, 64, 128, 256):
            comp = params.alpha_c + params.beta_c * local if with_compute else None
            out.append(PerfSample(nodes, k, local, 1, predict_step_time(params, nodes, k, local),
                                  comp))
    return out


def test_fit_recovers_known_parameters():
    fitted = fit_perf_params(_grid_samples(TRUE))
    for name, true in TRUE.as_dict().items():
        assert getattr(fitted, name) == pytest.approx(true, rel=0.05), name
    for nodes, k, local in [(4, 12, 48), (1, 3, 200), (16, 64, 8)]:
        assert (predict_step_time(fitted, nodes, k, local)
                == pytest.approx(predict_step_time(TRUE, nodes, k, local), rel=0.01))


def test_fit_from_a_jobs_own_profile_points():
    """ProfilePoints carry no compute time except on one GPU (= step time / accumulation)."""
    pts = [_point(TRUE, n, k, b, s) for n, k, b, s in
           [(1, 1, 64, 1), (1, 1, 128, 2), (1, 4, 64, 1), (1, 2, 32, 1), (2, 8, 64, 1),
            (2, 4, 128, 1), (4, 16, 32, 2), (1, 4, 256, 1)]]
    fitted = fit_perf_params(pts)
    for n, k, b, s in [(2, 8, 100, 1), (3, 12, 64, 1), (1, 4, 64, 3)]:
        assert (predict_step_time(fitted, n, k, b, s)
                == pytest.approx(predict_step_time(TRUE, n, k, b, s), rel=0.03))
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
        assert predict_step_time(p, 1, k, 64) == pytest.approx(predict_step_time(TRUE, 1, k, 64),
                                                               rel=0.02)
    # with a prior, what cannot be told comes from the prior scaled to the job (here 2x slower)
    slow = [_point(TRUE.scaled(2.0), 1, k, b) for k, b in [(1, 32), (1, 64), (2, 64), (4, 64)]]
    q = fit_perf_params(slow, prior=TRUE)
    assert q.alpha_n == pytest.approx(2 * TRUE.alpha_n, rel=0.02)
    assert predict_step_time(q, 4, 16, 64) == pytest.approx(
        2 * predict_step_time(TRUE, 4, 16, 64), rel=0.05)


# -------------------------------------------------------------------------------------- priors

def test_prior_for_every_shipped_application():
    assert set(gp.prior_apps()) == set(APPLICATIONS)
    shipped = gp.read_shipped_profiles()
    for app in APPLICATIONS:
        p = prior_for(app)
        assert p is not None, app
        assert all(v > 0 for v in p.as_dict().values()) and 1.0 <= p.gamma <= 10.0
        samples = gp.samples_from_rows(shipped[app])
        assert len(samples) >= 200
        rep = gp.fit_report(p, samples)
        assert rep["median_abs_rel_error"] < 0.15, (app, rep)
        # sanity: scaling out still helps somewhere (throughput at 16 GPUs > at 1 GPU)
        b = samples[len(samples) // 2].local_bsz
        assert predict_throughput(p, 4, 16, b) > predict_throughput(p, 1, 1, b)
    assert prior_for(" CIFAR10 ") == prior_for("cifar10")
    assert prior_for("A") is None and prior_for("") is None


def test_shipped_priors_are_the_fit_of_the_shipped_profiles():
    doc = json.loads(gp.PRIORS_FILE.read_text())
    shipped = gp.read_shipped_profiles()
    for app in ("cifar10", "bert"):
        refit = fit_perf_params(gp.samples_from_rows(shipped[app]))
        stored = PerfParams.from_dict(doc["applications"][app]["params"])
        for n, k, b in [(1, 1, 32), (1, 4, 8), (4, 16, 12), (16, 64, 64)]:
            assert predict_step_time(refit, n, k, b) == pytest.approx(
                predict_step_time(stored, n, k, b), rel=1e-3)


def test_shipped_data_is_small_licensed_and_sourced():
    files = {p.name: p for p in gp.DATA_DIR.iterdir()}
    assert {"LICENSE.apache2", "SOURCE.md", "priors.json", "profiles.csv"} <= set(files)
    assert files["priors.json"].stat().st_size + files["profiles.csv"].stat().st_size < 300_000
    # everything shipped under data/pollux (the simulator's traces and workloads too) stays small
    assert sum(p.stat().st_size for p in gp.DATA_DIR.rglob("*") if p.is_file()) < 3_000_000
    assert "Apache License" in files["LICENSE.apache2"].read_text()
    if (SHARED / "LICENSE.apache2").exists():
        assert files["LICENSE.apache2"].read_bytes() == (SHARED / "LICENSE.apache2").read_bytes()
    src = files["SOURCE.md"].read_text()
    assert "petuum/adaptdl" in src and "c793c7089bd307462686339d29707925c461f9a9" in src


@pytest.mark.skipif(not (SHARED / "traces").exists(), reason="reference traces not present")
def test_shipped_profiles_match_the_original_traces():
    rows = gp.read_pollux_traces(SHARED / "traces", "yolov3")
    shipped = gp.read_shipped_profiles()["yolov3"]
    assert len(rows) == len(shipped)
    for a, b in zip(rows, shipped, strict=True):
        assert (a["num_nodes"], a["num_replicas"], a["local_bsz"]) == (
            int(b["num_nodes"]), int(b["num_replicas"]), int(b["local_bsz"]))
        assert a["step_time"] == pytest.approx(float(b["step_time"]), rel=1e-5)


def test_job_parameters_prior_scaled_to_a_single_measurement():
    prior = prior_for("cifar10")
    measured = 1.7 * predict_step_time(prior, 1, 4, 64)
    pt = ProfilePoint(4, 1, 64, 1, measured, 4 * 64 / measured, 30)
    m = GoodputModel(_job(profile=[pt, pt], app="cifar10"))     # same configuration twice
    assert "prior" in m.source and "1 configuration" in m.source
    assert m.step_time(1, 4, 64) == pytest.approx(measured, rel=1e-9)
    assert m.step_time(4, 16, 32) == pytest.approx(1.7 * predict_step_time(prior, 4, 16, 32),
                                                   rel=1e-9)
    # not measured: the prior as is; no prior and no measurement: no throughput model
    assert GoodputModel(_job(app="cifar10")).params == prior
    blank = GoodputModel(_job(app="mystery"))
    assert blank.params is None and blank.efficiency(128) == 1.0
    with pytest.raises(ValueError):
        blank.throughput(1, 4, 32)
    # two configurations: its own fit
    pts = [_point(TRUE, 1, 4, 32), _point(TRUE, 2, 8, 32), _point(TRUE, 1, 1, 32)]
    own = GoodputModel(_job(profile=pts, app="cifar10"))
    assert own.source.startswith("fitted to 3")
    assert own.step_time(2, 8, 32) == pytest.approx(predict_step_time(TRUE, 2, 8, 32), rel=0.02)


# ---------------------------------------------------------------------------------- efficiency

def test_efficiency_worked_example():
    # grad_sqr 1, grad_var 4, M0 = 32, M = 128: r = 4, denominator 4/4 + 1 = 2,
    # gain (4 + 1) / 2 = 2.5, E = 2.5 / 4 = 0.625.
    # Same through the noise scale: phi = 32 * 4 / 1 = 128, (128 + 32) / (128 + 128) = 0.625
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
def test_efficiency_is_in_unit_interval_and_never_rises_with_batch(sqr, var, m0, m, dm):
    e = efficiency(sqr, var, m0, m)
    assert 0.0 < e <= 1.0
    assert efficiency(sqr, var, m0, m + dm) <= e + 1e-12


# ---------------------------------------------------------------------------------- best batch

def test_best_batch_respects_the_jobs_limits():
    job = _job(profile=[_point(TRUE, 1, 4, 32), _point(TRUE, 2, 8, 32), _point(TRUE, 1, 1, 32)],
               batch=256, bmin=64, bmax=3000, max_local=100, noise=(1.0, 50.0))
    m = GoodputModel(job)
    for nodes, k in [(1, 1), (1, 4), (2, 8), (4, 16)]:
        cfgs = m.batch_configs(k)
        assert cfgs
        for c in cfgs:
            assert 64 <= c.global_batch_size <= 3000 and c.local_batch_size <= 100
        g, local, accum, good = m.best_batch(nodes, k)
        assert g == k * local * accum and 64 <= g <= 3000 and 1 <= local <= 100
        assert good == pytest.approx(m.goodput(nodes, k, local, accum))
        assert good >= max(m.goodput(nodes, k, c.local_batch_size, c.accumulation_steps)
                           for c in cfgs) - 1e-9
    # no batch size fits 64 GPUs under max 32 samples: none
    assert _job(batch=32, bmin=16, bmax=32).max_batch_size == 32
    assert GoodputModel(_job(batch=32, bmin=16, bmax=32), params=TRUE).best_batch(16, 64) is None


def test_best_batch_follows_the_gradient_noise():
    base = {"profile": [_point(TRUE, 1, 4, 32), _point(TRUE, 1, 1, 32), _point(TRUE, 2, 8, 64)],
            "batch": 128, "bmin": 128, "bmax": 4096, "base": 128}
    # no gradient noise: E = M0 / M, goodput = M0 / T_step, so the smallest batch wins
    quiet = GoodputModel(_job(noise=(1.0, 0.0), **base)).best_batch(1, 4)
    assert quiet[0] == 128
    # very noisy gradients: E ~ 1, throughput grows with the batch, so the largest wins
    noisy = GoodputModel(_job(noise=(1e-6, 1e3), **base)).best_batch(1, 4)
    assert noisy[0] == 4096
    # in between: an interior optimum, and goodput there beats both ends
    mid = GoodputModel(_job(noise=(1.0, 8.0), **base))
    g, _, _, good = mid.best_batch(1, 4)
    assert 128 < g < 4096
    assert good > mid.goodput(1, 4, 32, 1) and good > mid.goodput(1, 4, 1024, 1)


def test_goodput_model_is_deterministic():
    job = _job(profile=[_point(TRUE, 1, 4, 32), _point(TRUE, 2, 8, 32)], app="bert",
               batch=64, bmin=32, bmax=512, noise=(1.0, 10.0))
    a, b = GoodputModel(job), GoodputModel(job)
    assert a.params == b.params
    assert a.best_batch(2, 8) == b.best_batch(2, 8)
