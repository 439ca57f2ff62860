"""Learning-rate scaling rules beyond linear and square root: AdaScale (SGD) and AdaptDL's
AdamScale (Adam family) from the job's own gradient-noise estimate; Malladi et al.'s
square-root rule for Adam's betas and epsilon."""

import math

import pytest

from hpcsched.job.scaling import LRScaling, adam_square_root_rule
from hpcsched.perf.pollux import gain as pollux_gain
from hpcsched.protocol.batching import (
    ADAPTIVE_LR_RULES,
    LR_RULES,
    adaptive_lr_scale,
    adascale_gain,
    lr_scale,
)
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.limits import JobLimits


@pytest.mark.parametrize("rule, bound", [("linear", 4.0), ("sqrt", 2.0), ("none", 1.0),
                                         ("adascale", 4.0), ("adamscale", 2.0)])
def test_the_factor_hpcsched_sends_is_unchanged_for_old_rules_and_a_bound_for_adaptive(rule, bound):
    assert rule in LR_RULES
    assert lr_scale(rule, 256, 64) == pytest.approx(bound)


@pytest.mark.parametrize("sqr, var, B, B0, expect", [
    (0.0, 5.0, 256, 64, 4.0),         # pure noise: the full scale S (linear scaling)
    (1e9, 5.0, 256, 64, 1.0),         # no noise to average away: no gain
    (1.0, 64.0, 256, 64, 2.0 / 1.25),  # s0 = 1 = |G|^2: (1 + 1) / (1/4 + 1)
    (1.0, 64.0, 64, 64, 1.0),         # at the base batch: 1
    (-3.0, 64.0, 128, 64, 2.0),       # a negative |G|^2 estimate counts as 0
])
def test_adascale_gain(sqr, var, B, B0, expect):
    assert adascale_gain(sqr, var, B, B0) == pytest.approx(expect, rel=1e-6)
    if sqr >= 0:  # the same gain as the policies' model (variance at the base batch there)
        assert adascale_gain(sqr, var, B, B0) == pytest.approx(pollux_gain(sqr, var / B0, B / B0))
    assert adaptive_lr_scale("adamscale", sqr, var, B, B0) == pytest.approx(
        math.sqrt(adascale_gain(sqr, var, B, B0)))


def test_adaptive_factors_only_for_adaptive_rules():
    assert set(ADAPTIVE_LR_RULES) == {"adascale", "adamscale"}
    with pytest.raises(ValueError, match="not an adaptive rule"):
        adaptive_lr_scale("linear", 1.0, 1.0, 2, 1)
    with pytest.raises(ValueError):
        adascale_gain(1.0, 1.0, 0, 1)


class _Noise:
    def __init__(self, estimate):
        self.estimate = estimate


@pytest.mark.parametrize("rule, base, estimate, expect", [
    ("linear", 64, (1.0, 64.0), 3.0),        # static: what hpcsched sent (here 3.0)
    ("sqrt", 64, None, 3.0),
    ("adascale", None, (1.0, 64.0), 3.0),    # outside hpcsched: static
    ("adascale", 64, None, 1.0),             # no estimate yet: the base learning rate
    ("adascale", 64, (1.0, 64.0), 1.6),
    ("adamscale", 64, (1.0, 64.0), math.sqrt(1.6)),
])
def test_the_step_factor(rule, base, estimate, expect):
    assert LRScaling(rule, base).factor(3.0, 256, _Noise(estimate)) == pytest.approx(expect)


def test_the_rule_is_read_from_the_jobs_spec(tmp_path):
    jd = JobDir.create(tmp_path)
    assert not LRScaling.of_job_dir(jd).adaptive        # no spec: static
    jd.write_spec(JobSpec(job_uid=jd.uid, script="/s/t.py", script_args=(), python="python3",
                          submit_dir="/s", sbatch_args=(), nodes=1,
                          limits=JobLimits(2, 1, 2, 16, 64, 8, 32, "adascale"),
                          checkpoint_dir="/c"))
    s = LRScaling.of_job_dir(jd)
    assert (s.rule, s.base_batch_size, s.adaptive) == ("adascale", 32, True)


@pytest.mark.parametrize("kappa, betas, eps, expect", [
    (1.0, (0.9, 0.999), 1e-8, ((0.9, 0.999), 1e-8)),
    (2.0, (0.9, 0.999), 1e-8, ((0.8, 0.998), 1e-8 / math.sqrt(2))),
    (20.0, (0.9, 0.999), 1e-8, ((0.0, 0.98), 1e-8 / math.sqrt(20))),   # beta1 kept at 0
])
def test_adam_square_root_rule(kappa, betas, eps, expect):
    (b1, b2), e = adam_square_root_rule(kappa, betas, eps)
    assert (b1, b2) == pytest.approx(expect[0]) and e == pytest.approx(expect[1])
    with pytest.raises(ValueError):
        adam_square_root_rule(0.0, betas, eps)


def test_a_job_under_adascale_hands_out_the_gain_of_its_own_estimate(tmp_path, monkeypatch):
    """One rank at twice the submitted batch (2 micro-batches: the single-rank estimator):
    step.lr_scale is 1 until the first estimate, then AdaScale's gain from job.grad_noise."""
    import os

    import torch

    from hpcsched.elastic import ElasticJob
    from tests.gloo_workers import worker_env

    jd = JobDir.create(tmp_path)
    jd.write_spec(JobSpec(job_uid=jd.uid, script="/s/t.py", script_args=(), python="python3",
                          submit_dir="/s", sbatch_args=(), nodes=1,
                          limits=JobLimits(1, 1, 1, 16, 64, 16, 16, "adascale"),
                          checkpoint_dir=str(tmp_path / "c")))
    for k in list(os.environ):
        if k.startswith("HPCSCHED_"):
            monkeypatch.delenv(k)
    for k, v in worker_env(jd, 0, 1, 0, 0, 16, 2, 1).items():
        if k.startswith("HPCSCHED_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.setenv(k, v)
    torch.manual_seed(0)
    X, y = torch.randn(96, 4), torch.randn(96)
    model = torch.nn.Linear(4, 1)
    job = ElasticJob(dataset_size=96, epochs=2, batch_size=32)
    job.register(model=model)
    factors = []
    for step in job.steps():
        est = job.grad_noise
        factors.append((step.lr_scale, est))
        model.zero_grad()
        for idx in step.micro_batches:
            ((model(X[idx]).squeeze(1) - y[idx]) ** 2).sum().div(step.global_samples).backward()
        job.reduce_gradients(model)
    job.close()
    assert factors[0] == (1.0, None)
    later = [(f, e) for f, e in factors if e is not None]
    assert len(later) >= 4
    for f, (sqr, var) in later:
        assert f == pytest.approx(adascale_gain(sqr, var, 32, 16))
        assert 1.0 <= f <= 2.0
