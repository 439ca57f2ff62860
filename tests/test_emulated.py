"""The emulated application's physics (hpcsched/sim/emulate.py) against the simulator's job
(SimJob) and the gradient-noise estimator, and the script itself run as one process. No Slurm."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcsched.job.gradient_noise import GradientNoiseEstimator, two_batch_estimate
from hpcsched.sim import WorkloadJob
from hpcsched.sim.emulate import Emulation
from hpcsched.sim.physics import APPLICATIONS
from hpcsched.sim.state import SimConfig, SimJob, job_limits

SCRIPT = Path(__file__).resolve().parent.parent / "jobscripts" / "examples" / "emulated.py"


def sim_job(app: str, placement: tuple[int, ...], batch: int, scale: float) -> SimJob:
    """A running SimJob of ``app`` on ``placement`` (GPUs per node) at global ``batch``."""
    gpus = sum(placement)
    wj = WorkloadJob("j", 0.0, app, gpus, batch, "A")
    cfg = SimConfig(nodes=4, gpus_per_node=4, granularity="gpu", work_scale=scale)
    application, fixed, nodes, limits, _ = job_limits(wj, cfg)
    j = SimJob(wj=wj, job_id="1", app=application, fixed=fixed, limits=limits, nodes=nodes,
               cfg=limits.fit_batch(limits.base_batch_size, nodes), size=gpus, granular=True,
               work_scale=scale, state="RUNNING")
    j.cfg = j.fit(batch, gpus)
    j.gpus = tuple((n, g) for n, k in enumerate(placement) for g in range(k))
    return j


CASES = [(app, placement) for app in APPLICATIONS
         for placement in ((1,), (4,), (4, 2), (2, 2, 2), (4, 4))]


@pytest.mark.parametrize("app, placement", CASES)
@pytest.mark.parametrize("at", [0.0, 0.4, 0.97])  # fraction of the scaled work done
def test_step_time_progress_and_work_are_the_simulators(app, placement, at):
    scale = 0.3
    emu = Emulation.of(app, scale)
    batch = max(emu.base_batch_size, sum(placement) * emu.app.min_local_bsz) * 2
    j = sim_job(app, placement, batch, scale)
    j.progress = at * j.total
    rate, st = j.rate(j.progress, 1.0, 1.7)
    b = j.cfg
    assert j.layout == placement
    assert emu.total == pytest.approx(j.total, rel=1e-12)
    assert emu.step_seconds(placement, b.global_batch_size, b.accumulation_steps) == \
        pytest.approx(st, rel=1e-9)
    assert emu.gain(b.global_batch_size, j.progress) == pytest.approx(rate * st, rel=1e-9)
    assert emu.samples(emu.total - j.progress) == pytest.approx(j.remaining_samples(), rel=1e-9)
    sqr, var = j.report().grad_noise
    assert emu.grad_stats(b.global_batch_size, j.progress) == \
        pytest.approx((sqr, var * emu.base_batch_size), rel=1e-12)


def test_work_scale_multiplies_a_fixed_work_jobs_iterations():
    wj = WorkloadJob("f", 0.0, "imagenet", 4, 128, "A", iterations=1000.0, iteration_time=1.0)
    cfg = SimConfig(nodes=1, gpus_per_node=4, work_scale=0.25)
    app, fixed, nodes, limits, batch = job_limits(wj, cfg)
    j = SimJob(wj=wj, job_id="1", app=app, fixed=fixed, limits=limits, nodes=nodes,
               cfg=limits.fit_batch(batch, nodes), work_scale=cfg.work_scale)
    assert j.total == 250.0


def _end_by_segments(j: SimJob, start: float, slowdown: float) -> float:
    """The end of ``j``'s work from ``start``, summed segment by segment with :meth:`SimJob.rate`
    and :meth:`SimJob.segment_end` (what the simulator's next-finish event did before
    :meth:`SimJob.end_time`)."""
    p = j.progress
    while p < j.total * (1 - 1e-12):
        rate, _ = j.rate(p, slowdown, 1.0)
        end = j.segment_end(p)
        start += (end - p) / rate
        p = end
    return start


@pytest.mark.parametrize("app", APPLICATIONS)
@pytest.mark.parametrize("at", [0.0, 0.33, 0.999, 1.0])   # fraction of the work done
@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_end_time_is_the_rate_summed_over_the_epochs(app, at, scale):
    j = sim_job(app, (4, 2), Emulation.of(app, scale).base_batch_size * 4, scale)
    j.progress = at * j.total
    # the same floating-point sums, so the same event times to the last bit
    assert j.end_time(100.0, 1.3, 1.0) == _end_by_segments(j, 100.0, 1.3)
    assert j.end_time(100.0, 1.3, 1.0) > 100.0 or at == 1.0


def test_end_time_of_a_fixed_work_job():
    wj = WorkloadJob("f", 0.0, "imagenet", 4, 128, "A", iterations=1000.0, iteration_time=1.0)
    cfg = SimConfig(nodes=1, gpus_per_node=4)
    app, fixed, nodes, limits, batch = job_limits(wj, cfg)
    j = SimJob(wj=wj, job_id="1", app=app, fixed=fixed, limits=limits, nodes=nodes,
               cfg=limits.fit_batch(batch, nodes), size=4, state="RUNNING")
    j.node_names, j.progress = ("n0",), 400.0
    _, st = j.rate(j.progress, 1.0, 1.0)
    assert j.end_time(10.0, 1.0, 1.0) == _end_by_segments(j, 10.0, 1.0) == 10.0 + 600.0 * st


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.01, float("nan")])
def test_a_scale_outside_0_1_is_refused(bad):
    with pytest.raises(ValueError, match="work_scale must be in"):
        SimConfig(work_scale=bad)
    with pytest.raises(ValueError, match="scale must be in"):
        Emulation.of("ncf", bad)


# ------------------------------------------------------------------------ gradient noise
@pytest.mark.parametrize("app", APPLICATIONS)
@pytest.mark.parametrize("ranks", [2, 4])
def test_the_two_batch_estimates_of_the_synthetic_gradients_are_the_applications(app, ranks):
    """What the elastic API computes with ``ranks`` ranks (small batch: a rank's samples; big
    batch: the all-reduced gradient; :meth:`GNSTracker.after_reduce`) from the synthetic
    gradients. Each single-step estimate is unbiased (McCandlish et al., App. A.1), so the mean
    over steps must be within 4 standard errors of the application's statistics (a fair test
    fails 1 time in 16,000). ``grad_var`` is also held to 3%: a step's estimate has relative
    standard deviation ``sqrt(2 / (dim (k - 1)))`` (2.2% at 2 ranks in 4096 dimensions,
    measured), so 400 steps average to about 0.1%. (``grad_sqr``'s per-step error is the real
    estimator's: ``~ sqrt(2 / dim) x noise scale / b``, from 0.6% for yolov3 to 50 x for ncf,
    whose noise scale is 70 x its batch; hence no relative bound on it.)"""
    emu = Emulation.of(app, 1.0)
    N = emu.base_batch_size * 2
    n = N // ranks
    truth = emu.grad_stats(N, 0.0)
    est = []
    for step in range(400):
        sums = [emu.gradient_sum(truth, first=step * N + r * n, n=n, epoch=0) for r in range(ranks)]
        small = sum(n * float(np.dot(s / n, s / n)) for s in sums) / (n * ranks)
        total = sum(sums) / (n * ranks)
        est.append(two_batch_estimate(small, float(np.dot(total, total)), n, n * ranks))
    est = np.array(est)
    mean, se = est.mean(axis=0), est.std(axis=0, ddof=1) / np.sqrt(len(est))
    assert abs(mean[0] - truth[0]) <= 4 * se[0]
    assert abs(mean[1] - truth[1]) <= 4 * se[1]
    assert mean[1] == pytest.approx(truth[1], rel=0.03)


def test_the_smoothed_estimator_reaches_the_applications_variance():
    """The daemon reads the smoothed estimator (AdaptDL's average): cifar10 at its base batch
    on 2 ranks, 300 steps, noise scale ~72 samples, so both statistics are within 5%."""
    emu = Emulation.of("cifar10", 1.0)
    N, n = 128, 64
    truth = emu.grad_stats(N, 0.0)
    g = GradientNoiseEstimator(base_batch_size=N)
    for step in range(300):
        a, b = (emu.gradient_sum(truth, step * N + r * n, n, 0) for r in (0, 1))
        small = (float(np.dot(a, a)) + float(np.dot(b, b))) / n / N
        big = float(np.dot(a + b, a + b)) / N / N
        g.update(small, big, n, N)
    assert g.estimate == pytest.approx(truth, rel=0.05)


def test_gradient_sums_are_deterministic_in_their_samples():
    emu = Emulation.of("ncf", 0.1)
    s = (1.0, 4.0)
    np.testing.assert_array_equal(emu.gradient_sum(s, 7, 3, 1), emu.gradient_sum(s, 7, 3, 1))
    assert not np.array_equal(emu.gradient_sum(s, 7, 3, 1), emu.gradient_sum(s, 7, 3, 2))


# ---------------------------------------------------------------------------- data set
@pytest.mark.parametrize("app", APPLICATIONS)
def test_the_data_outlasts_the_work_at_any_batch(app):
    """At the largest batch (or the smallest, 1 sample) the work ends before the data."""
    emu = Emulation.of(app, 1.0)
    size = emu.dataset_size(emu.base_batch_size)
    assert size >= 4 * emu.app.max_batch_size and size & (size - 1) == 0
    for batch in (1, emu.base_batch_size, emu.app.max_batch_size):
        epochs = emu.data_epochs(size, batch)
        steps = emu.total / min(emu.gain(batch, p) for p in np.linspace(0, emu.total, 50))
        assert steps * batch < epochs * size


# ------------------------------------------------------------------------------ script
def expected_run(app: str, scale: float, batch: int, placement: tuple[int, ...]):
    """``(steps, progress, compute seconds)`` of a run at a fixed configuration, by the physics."""
    emu = Emulation.of(app, scale)
    steps, progress = 0, 0.0
    while progress < emu.total:
        progress += emu.gain(batch, progress)
        steps += 1
    return steps, progress, steps * emu.step_seconds(placement, batch)


def test_the_script_alone_ends_on_the_physics_work():
    out = subprocess.run([sys.executable, str(SCRIPT), "--application", "ncf", "--scale", "0.001"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    steps, progress, seconds = expected_run("ncf", 0.001, 256, (1,))
    assert res["steps"] == steps and res["progress"] == pytest.approx(progress, rel=1e-12)
    assert res["total"] == pytest.approx(0.001 * Emulation.of("ncf").app.total_progress)
    # every step sleeps up to its physics time; what the protocol adds (about 1.5 ms a step
    # here) comes on top, bounded loosely for a busy machine
    assert seconds * 0.99 <= res["seconds"] <= 3 * seconds + 5


@pytest.mark.parametrize("args, message", [
    (["--application", "resnet", "--scale", "0.1"], "invalid choice: 'resnet'"),
    (["--application", "ncf", "--scale", "0"], "must be in (0, 1], got 0"),
    (["--application", "ncf", "--scale", "2"], "must be in (0, 1], got 2"),
    (["--scale", "0.1"], "the following arguments are required: --application"),
])
def test_the_script_refuses_bad_arguments(args, message, monkeypatch, capsys):
    """The script run as ``__main__`` (runpy) in this process, as ``python SCRIPT ARGS`` runs it
    (its exit status is SystemExit's code): a process of its own spent 2 s importing torch
    before the arguments were read, 4 times over; torch is loaded here anyway (below)."""
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert exc.value.code == 2 and message in capsys.readouterr().err


# ------------------------------------------------------- the elastic API's work hook
@pytest.mark.parametrize("work, want", [
    (None, (20, 1000)),                 # the data position's samples and epochs x data set
    ((30.4, 99.6), (30, 100)),          # the job's own work, in whole samples
])
def test_progress_reports_the_work_set_by_the_job(tmp_path, work, want):
    from hpcsched.job.boundary import InForce, Reporter
    from hpcsched.job.data import DataPosition
    from hpcsched.protocol import files as ctl
    from hpcsched.protocol.batching import BatchConfig
    from hpcsched.protocol.jobdir import JobDir

    jd = JobDir.create(tmp_path)
    r = Reporter(jd, 0, total_samples=1000)
    r.work = work
    data = DataPosition(100, 10, 0)
    data.advance(20)
    r.progress(InForce(0, 1, BatchConfig(1, 20, 1), 1.0), data, None)
    p = ctl.read_progress(jd.progress_path, jd.uid)
    assert (p.samples_processed, p.total_samples) == want
    assert p.step == 1 and p.epoch_position == 20   # the data position itself is unchanged


@pytest.mark.parametrize("work, done", [(None, False), ((5.0, 10.0), False), ((10.0, 10.0), True),
                                        ((11.0, 10.0), True)])
def test_the_work_is_done_when_done_reaches_total(work, done):
    from hpcsched.job.boundary import Reporter

    r = Reporter(None, 0, 100)
    r.work = work
    assert r.work_done is done


def test_steps_end_when_the_work_is_done_and_set_work_checks_its_arguments(monkeypatch):
    from hpcsched.elastic import ElasticJob

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HPCSCHED_JOB_DIR", "HPCSCHED_NODES",
                "HPCSCHED_LOCAL_BATCH_SIZE"):
        monkeypatch.delenv(var, raising=False)
    job = ElasticJob(dataset_size=100, epochs=5, batch_size=10, track_grad_noise=False)
    assert job.layout == (1,)
    job.set_work(0, 35)
    for step in job.steps():
        job.set_work((step.step + 1) * 10, 35)
    assert job.state.step == 4 and not job.state.finished   # 40 >= 35 after 4 steps of 10
    for bad in ((-1, 10), (0, 0)):
        with pytest.raises(ValueError, match="need done >= 0 and total > 0"):
            job.set_work(*bad)
    job.close()


@pytest.mark.parametrize("nodes, world, members, want", [
    (1, 1, None, (1,)),
    (2, 8, None, (4, 4)),                                   # a primary of 2 nodes x 4
    (3, 7, None, (3, 2, 2)),                                # spread evenly, first nodes first
    (2, 6, [("n1", ""), ("n1", ""), ("n1", ""), ("n1", ""), ("n2", "9"), ("n2", "9")], (4, 2)),
    (1, 4, [("n1", ""), ("n1", ""), ("n1", "9"), ("n1", "9")], (4,)),   # extension on n1
])
def test_the_layout_in_force_counts_extension_workers_per_node(monkeypatch, nodes, world, members,
                                                              want):
    """ElasticJob.layout, the placement the emulated application sleeps for: from the form in
    force (extensions) or from the nodes and workers in force. The job is a standalone one whose
    configuration in force and membership are set by hand (the protocol that sets them is tested
    against Slurm in tests/test_extensions_slurm.py)."""
    from types import SimpleNamespace

    from hpcsched.elastic import ElasticJob
    from hpcsched.job.boundary import InForce
    from hpcsched.job.reform import Form, Member
    from hpcsched.protocol.batching import BatchConfig

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HPCSCHED_JOB_DIR"):
        monkeypatch.delenv(var, raising=False)
    job = ElasticJob(dataset_size=10, epochs=1, track_grad_noise=False)
    job._cfg = InForce(0, nodes, BatchConfig(world, 1, 1), 1.0)
    if members is not None:
        form = Form(1, 0, tuple(Member(f"m{i}", node, alloc) for i, (node, alloc) in enumerate(members)))
        job._members = SimpleNamespace(form=form)
    assert job.layout == want
    job._members = None
    job.close()


@pytest.mark.parametrize("scale, smoothing", [(1.0, 0.999), (0.1, 0.99), (0.06, 1 - 0.001 / 0.06),
                                              (0.0005, 0.0)])
def test_the_estimators_memory_shrinks_with_the_epochs(scale, smoothing):
    """A scaled job's gradient-noise estimate remembers as many epochs as an unscaled job's:
    its smoothing's memory, 1 / (1 - s) steps, is scale x AdaptDL's 1,000 (never negative)."""
    assert Emulation.of("cifar10", scale).grad_noise_smoothing() == pytest.approx(smoothing)


def test_the_job_passes_its_smoothing_to_the_estimator():
    import torch

    from hpcsched.job.gradient_noise import GNSTracker

    assert GNSTracker(torch, True, 128.0).estimator.smoothing == 0.999
    assert GNSTracker(torch, True, 128.0, 0.9).estimator.smoothing == 0.9
    with pytest.raises(ValueError, match="smoothing"):
        GNSTracker(torch, True, 128.0, 1.0)
