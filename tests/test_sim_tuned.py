"""hpcsched.sim.tuned: tuned batch sizes for ``philly:COUNT`` (Pollux's "TunedJobs"), checked
against the engine's own simulated run times. No Slurm."""

from __future__ import annotations

import pytest

from hpcsched.protocol.batching import BatchSizeError
from hpcsched.sim import WorkloadJob
from hpcsched.sim.engine import SimConfig, Simulator
from hpcsched.sim.physics import PhysicsError, application
from hpcsched.sim.tuned import (
    candidate_batch_sizes,
    training_time,
    tuned_batch_size,
    validated_batch_sizes,
)
from hpcsched.sim.workload import APP_BATCH_SIZES, POLLUX_APP_CLASS, default_batch_size, load_workload


def alone(app: str, gpus: int, batch: int) -> float:
    """JCT (s) of one job alone on the default 16 x 4 cluster under ``static``."""
    job = WorkloadJob(name="j", submit_time=0.0, application=app, gpus=gpus, batch_size=batch,
                      app_class=POLLUX_APP_CLASS[app])
    return Simulator([job], "static", config=SimConfig()).run().jobs[0].jct


def test_ncf_on_one_gpu_is_tuned_far_above_the_untuned_default():
    tuned = tuned_batch_size("ncf", 1)
    assert tuned == 32768
    # the figures: about 1,444 s untuned (256), about 33 s tuned, plus the 30 s start
    assert alone("ncf", 1, default_batch_size("ncf", 1)) == pytest.approx(1444 + 30, abs=40)
    assert alone("ncf", 1, tuned) == pytest.approx(33 + 30, abs=5)
    assert alone("ncf", 1, tuned) < 0.1 * alone("ncf", 1, default_batch_size("ncf", 1))


def test_philly_jobs_get_the_tuned_batch_size():
    jobs = load_workload("philly:160", seed=0)[1]
    ncf_1 = [j for j in jobs if j.application == "ncf" and j.gpus == 1]
    assert ncf_1, "the sample should hold a 1-GPU ncf job"
    assert {j.batch_size for j in ncf_1} == {32768}     # the untuned default was 256
    for j in jobs:
        assert j.batch_size == tuned_batch_size(j.application, j.gpus)


@pytest.mark.parametrize("app, gpus", [
    ("ncf", 1), ("ncf", 3), ("cifar10", 8), ("cifar10", 48), ("bert", 4), ("bert", 6),
    ("deepspeech2", 6), ("yolov3", 3), ("yolov3", 8), ("imagenet", 2), ("imagenet", 16),
])
def test_tuned_batch_size_is_in_range_and_never_slower_than_the_default(app, gpus):
    base, top = APP_BATCH_SIZES[app]
    tuned = tuned_batch_size(app, gpus)
    assert base <= tuned <= top and tuned % gpus == 0
    assert training_time(app, gpus, tuned) <= training_time(app, gpus,
                                                            default_batch_size(app, gpus))
    # as good as every candidate whose per-GPU share is measured (fitted as the engine fits it)
    for b in candidate_batch_sizes(app, gpus):
        if b >= gpus * application(app).min_local_bsz:
            assert training_time(app, gpus, tuned) <= training_time(app, gpus, b)


@pytest.mark.parametrize("app, gpus", [("ncf", 1), ("cifar10", 8), ("bert", 4),
                                       ("deepspeech2", 6), ("yolov3", 3)])
def test_training_time_is_the_engines_run_time(app, gpus):
    batch = tuned_batch_size(app, gpus)
    assert alone(app, gpus, batch) == pytest.approx(training_time(app, gpus, batch) + 30.0,
                                                    rel=1e-9)


@pytest.mark.parametrize("app", sorted(APP_BATCH_SIZES))
def test_validated_sizes_span_the_batch_size_table(app):
    sizes = validated_batch_sizes(app)
    assert (sizes[0], sizes[-1]) == APP_BATCH_SIZES[app]
    assert set(sizes) <= set(candidate_batch_sizes(app, 3))


def test_bad_arguments():
    with pytest.raises(PhysicsError, match="unknown application"):
        tuned_batch_size("mnist", 1)
    with pytest.raises(ValueError, match="gpus must be >= 1"):
        tuned_batch_size("ncf", 0)
    with pytest.raises(BatchSizeError):
        tuned_batch_size("bert", 1000)        # 1000 GPUs cannot share at most 384 samples
