"""The isolated-JCT lower bound (hpcsched.sim.bound): its vectorized physics is the simulator's,
a hand-computable case, and no simulation of a job alone beats it."""

from __future__ import annotations

import numpy as np
import pytest

from hpcsched.sim import WorkloadJob
from hpcsched.sim import bound as B
from hpcsched.sim.engine import SimConfig, Simulator
from hpcsched.sim.physics import APPLICATIONS, application

GPU = SimConfig(granularity="gpu")


@pytest.mark.parametrize("name", APPLICATIONS)
def test_step_times_is_the_physics(name):
    """Point for point equal to Application.step_time: measured placements (spread or not),
    interpolated ones (> 4 nodes), local batches inside and outside the measured range."""
    app = application(name)
    rng = np.random.default_rng(0)
    ms = np.unique(np.concatenate([[1, app.min_local_bsz, app.max_local_bsz, 2 * app.max_local_bsz],
                                   rng.integers(1, 2 * app.max_local_bsz + 2, 12)]))
    accum = rng.integers(1, 4, len(ms))
    for w in (1, 3, 6, 13, 16, 22, 40, 64):
        lays = B.layouts(w, 16, 4)
        for lay in lays[:: max(1, len(lays) // 6)] + B.layouts(w, 16, 4, packed=True):
            got = B.step_times(app, lay, ms, accum)
            want = [app.step_time(lay, float(m), int(s)) for m, s in zip(ms, accum, strict=True)]
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"{name} {lay}")


@pytest.mark.parametrize("name", APPLICATIONS)
def test_gains_is_the_physics(name):
    app = application(name)
    batch = np.unique(np.linspace(1, 1.5 * app.max_batch_size, 37).round())
    for e in (0, app.max_epochs // 2, app.max_epochs - 1):
        want = [app.gain(float(b), e) for b in batch]
        np.testing.assert_allclose(B.gains(app, batch, e), want, rtol=1e-12)


def test_layouts():
    assert B.layouts(6, 16, 4, packed=True) == [(4, 2)]
    assert B.layouts(3, 16, 4) == [(1, 1, 1), (1, 2), (3,)]
    # > 4 nodes: one layout per node count (the physics interpolates on nodes and GPUs only)
    assert sorted(len(x) for x in B.layouts(20, 16, 4) if len(x) > 4) == list(range(5, 17))
    assert all(sum(x) == 20 and max(x) <= 4 for x in B.layouts(20, 16, 4))


def test_min_step_time_on_one_gpu_by_hand():
    """One GPU: batch B <= the per-GPU limit is one micro-batch of B samples."""
    app = application("cifar10")
    T = B.min_step_time(app, 1, 128, 512, app.max_local_bsz, 1, 1)
    assert np.isinf(T[:128]).all()
    for b in (128, 300, 512):
        assert T[b] == pytest.approx(app.step_time((1,), b, 1), rel=1e-12)


def test_isolated_jct_by_hand(monkeypatch):
    """Start cost + each epoch's length / its best rate, with made-up rates; the integration step
    does not matter (the rate is constant within an epoch)."""
    app = application("bert")            # 2 epochs
    rates = np.array([2.0, 5.0])
    monkeypatch.setattr(B, "epoch_rates", lambda *a, **k: rates)
    wj = WorkloadJob("b", 0.0, "bert", 4, 48, "B")
    p0, p1 = app.epoch_end(0), app.epoch_end(1)
    want = 30.0 + p0 / 2.0 + (p1 - p0) / 5.0
    for sub in (1, 3, 8):
        assert B.isolated_jct(wj, GPU, substeps=sub) == pytest.approx(want, rel=1e-12)
    cheap = SimConfig(granularity="gpu", restart_cost={"*": 5.0}, work_scale=0.5)
    assert B.isolated_jct(wj, cheap) == pytest.approx(5.0 + 0.5 * (want - 30.0), rel=1e-12)


@pytest.mark.parametrize("policy", ["jct", "pollux"])
def test_bound_below_a_simulation_of_the_job_alone(policy):
    """A real simulation of Pollux workload 1's cifar10-1 alone (16 GPUs, batch 4096): never
    below the bound, and not far above it (1.24x and 1.36x when written)."""
    wj = WorkloadJob("cifar10-1", 356.0, "cifar10", 16, 4096, "A")
    lb = B.isolated_jct(wj, GPU)
    r = Simulator([wj], policy, config=GPU).run().jobs[0]
    jct = r.finish_time - r.submit_time
    assert lb <= jct < 1.5 * lb
    assert B.isolated_jct(wj, GPU, packed=True) >= lb


def test_refuses_what_it_does_not_bound():
    with pytest.raises(ValueError, match="Pollux"):
        B.isolated_jct(WorkloadJob("f", 0.0, "cifar10", 1, 32, "A", iterations=10.0), GPU)
    with pytest.raises(ValueError, match="variability"):
        B.isolated_jct(WorkloadJob("c", 0.0, "cifar10", 1, 128, "A"),
                       SimConfig(granularity="gpu", variability=True))


def test_the_gap_benchmark_splits_a_policy_s_excess_by_application(capsys, monkeypatch):
    """``benchmarks/jct_bound.py --gap``'s bookkeeping: the shares of the excess summing to one,
    every job of the workload counted. The bound is stubbed at 30 s a job (the start cost, below
    any JCT; the real bound takes a minute to compute for six applications, and is checked
    against simulations above)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "jct_bound.py"
    spec = importlib.util.spec_from_file_location("jct_bound_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "isolated_jct", lambda job, cfg: 30.0)
    out = mod.gap(["jct"], ["0.5"], [5])["jct"]["0.5"]
    apps = out["applications"]
    assert sum(a["jobs"] for a in apps.values()) == 80
    assert abs(sum(a["share_of_excess"] for a in apps.values()) - 1.0) < 1e-9
    assert all(a["mean_jct_s"] >= a["mean_bound_s"] for a in apps.values())
    assert all(a["mean_wait_s"] >= 0 and a["mean_gpus_held"] >= 1 for a in apps.values())
    assert 0 < out["gpu_utilization"] <= 1
    assert "mean GPU utilization" in capsys.readouterr().out


# ------------------------------------------------------------------ the capacity bound
@pytest.mark.parametrize("releases, sizes, mean", [
    ([0.0], [5.0], 5.0),
    ([0.0, 0.0], [3.0, 1.0], (1.0 + 4.0) / 2),              # shortest first
    ([0.0, 1.0], [10.0, 2.0], (12.0 + 2.0) / 2),            # the short one preempts at 1
    ([0.0, 20.0], [5.0, 5.0], 5.0),                         # idle between
    ([2.0, 0.0, 2.0], [4.0, 3.0, 1.0], (3.0 + 2.0 + 6.0) / 3),  # 3 to its end at 3, 1, 4
])
def test_srpt_mean_flow_time_by_hand(releases, sizes, mean):
    assert B.srpt_mean_flow_time(releases, sizes) == pytest.approx(mean)


def test_srpt_is_no_worse_than_first_come_first_served():
    rng = np.random.default_rng(1)
    r, p = sorted(rng.uniform(0, 100, 40)), list(rng.exponential(10, 40))
    t, fcfs = 0.0, []
    for ri, pi in zip(r, p, strict=True):
        t = max(t, ri) + pi
        fcfs.append(t - ri)
    assert B.srpt_mean_flow_time(r, p) <= np.mean(fcfs) + 1e-9
    with pytest.raises(ValueError):
        B.srpt_mean_flow_time([0.0], [1.0, 2.0])
    assert np.isnan(B.srpt_mean_flow_time([], []))


def test_no_simulated_job_holds_fewer_gpu_seconds_than_its_least():
    """Whatever the policy, each job's GPU-seconds in a simulation (held while running or
    restarting) are at least its bound."""
    jobs = [WorkloadJob(f"{a}-{i}", 60.0 * i, a, g, b, "A") for i, (a, g, b) in enumerate(
        [("cifar10", 1, 128), ("ncf", 2, 512), ("bert", 4, 96), ("cifar10", 8, 1024)])]
    cfg = SimConfig(nodes=2, gpus_per_node=4, granularity="gpu", work_scale=0.05)
    least = {j.name: B.least_gpu_seconds(j, cfg) for j in jobs}
    for policy in ("static", "jct", "pollux"):
        res = Simulator(jobs, policy, config=cfg).run()
        for r in res.jobs:
            assert r.gpu_seconds >= least[r.name] * (1 - 1e-9), (policy, r.name)
        assert np.mean([r.jct for r in res.jobs]) >= B.capacity_bound(jobs, cfg) - 1e-9
        assert np.mean([r.jct for r in res.jobs]) >= B.lower_bound(jobs, cfg) - 1e-9


def test_least_gpu_seconds_is_at_most_one_gpu_alone():
    """One GPU at its best batch is one of the configurations: the bound is at most that."""
    j = WorkloadJob("c", 0.0, "cifar10", 1, 128, "A")
    cfg = SimConfig(nodes=1, gpus_per_node=4, granularity="gpu", work_scale=0.05)
    one = SimConfig(nodes=1, gpus_per_node=1, granularity="gpu", work_scale=0.05)
    assert B.least_gpu_seconds(j, cfg) <= B.isolated_jct(j, one) + 1e-9
