"""hpcsched replay's plan (pure): what hpcsub is asked, checked against the simulator's
job_shape/job_limits through hpcsub's own parser."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcsched.job.submit import build_spec
from hpcsched.replay import ReplayError
from hpcsched.replay.plan import (
    TIME_MARGIN,
    ClusterShape,
    check_emulatable,
    make_plan,
    run_seconds,
    slurm_job_name,
)
from hpcsched.sim import WorkloadJob
from hpcsched.sim.state import SimConfig, job_limits


def _job(name, app, gpus, batch, t=0.0, **kw) -> WorkloadJob:
    return WorkloadJob(name, t, app, gpus, batch, "A", **kw)


JOBS = [
    _job("cifar10-0", "cifar10", 1, 128, 0.0),
    _job("ncf 1", "ncf", 2, 1024, 100.0),
    _job("bert-2", "bert", 4, 96, 250.0),
    _job("deepspeech2-3", "deepspeech2", 6, 320, 400.0),
    _job("imagenet-4", "imagenet", 8, 1600, 900.0),
    _job("yolov3-5", "yolov3", 3, 24, 1000.0),
]


@pytest.mark.parametrize("shape", [ClusterShape(4, 4, "gpu"), ClusterShape(2, 8, None),
                                   ClusterShape(16, 4, "batch")])
def test_hpcsub_reads_the_simulators_shape_and_limits(shape, tmp_path, monkeypatch):
    """hpcsub's own parser, on the planned command line, gives the nodes, GPUs per node and
    resize limits the simulator gives the job (the base batch is the starting batch: hpcsub
    has no separate option for it)."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "emulated.py"
    script.write_text("print('hi')\n")
    cfg = SimConfig(nodes=shape.nodes, gpus_per_node=shape.gpus_per_node)
    plan = make_plan(JOBS, shape, 0.1, script=str(script), seed=7)
    assert [p.name for p in plan] == [j.name for j in JOBS]
    for p, wj in zip(plan, JOBS):
        _, _, nodes, limits, batch = job_limits(wj, cfg)
        spec, sbatch, extra = build_spec(list(p.argv), "uid", tmp_path / "job")
        assert spec.nodes == nodes == p.nodes
        assert extra["geometry"].gpus_per_node == limits.workers_per_node == p.gpus_per_node
        assert spec.limits == replace(limits, base_batch_size=batch)
        assert (p.batch_size, p.gpus) == (batch, wj.gpus)
        assert spec.script_args == ("--application", wj.application, "--scale", "0.1",
                                    "--seed", str(7 + p.index))
        assert spec.application == wj.application   # the daemon's key, as the simulator's
        assert f"--job-name={slurm_job_name(wj.name)}" in sbatch
        assert (f"--partition={shape.partition}" in sbatch) == bool(shape.partition)
        assert p.submit_at == pytest.approx(wj.submit_time * 0.1)


def test_time_limit_covers_the_job_alone_at_its_slowest_size():
    (p,) = make_plan([_job("c", "cifar10", 4, 512)], ClusterShape(4, 4), 0.05, script="x.py")
    times = [run_seconds("cifar10", p.limits, 512, n) for n in range(1, 5)]
    alone = max(times)
    assert alone == times[1] > times[0] > 0   # at 512 samples, 2 nodes sync more than they gain
    assert p.time_limit * 60 >= 2 * alone * 0.05 + TIME_MARGIN
    assert p.time_limit * 60 < 2 * alone * 0.05 + TIME_MARGIN + 60
    assert f"--time={p.time_limit}" in p.argv


def test_output_dir_and_job_names():
    (p,) = make_plan([_job("a b/c", "ncf", 1, 256)], ClusterShape(1, 4), 1.0, script="e.py",
                     output_dir="/runs/x")
    assert p.job_name == "replay-a_b_c"
    assert "--output=/runs/x/slurm-%j.out" in p.argv


@pytest.mark.parametrize("jobs, scale, message", [
    ([_job("vgg19-0", "cifar10", 1, 32, iterations=100.0, iteration_time=0.1)], 0.5,
     "fixed-work job"),
    ([], 0.5, "no jobs"),
    ([_job("big", "imagenet", 32, 3200)], 0.5, "the cluster has 16"),
    ([_job("a", "cifar10", 1, 128)], 0.0, "must be in (0, 1]"),
    ([_job("a", "cifar10", 1, 128)], 1.5, "must be in (0, 1]"),
    ([_job("a", "resnet", 1, 128)], 0.5, "no emulated application"),
])
def test_jobs_that_cannot_be_replayed(jobs, scale, message):
    with pytest.raises(ReplayError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_plan(jobs, ClusterShape(4, 4), scale, script="e.py")


def test_check_emulatable_accepts_pollux_jobs():
    check_emulatable(JOBS)


@pytest.mark.parametrize("shape", [ClusterShape(4, 4, "gpu"), ClusterShape(16, 4, "batch")])
def test_a_gpu_granular_plan_gives_the_simulators_gpu_limits(shape, tmp_path, monkeypatch):
    """At the daemon's GPU granularity each resizable job may go down to 1 GPU, as the simulator
    lets it: ``--hpcsched-min-gpus 1`` on its command line, which hpcsub's own parser takes."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "emulated.py"
    script.write_text("print('hi')\n")
    cfg = SimConfig(nodes=shape.nodes, gpus_per_node=shape.gpus_per_node, granularity="gpu")
    plan = make_plan(JOBS, shape, 0.1, script=str(script), seed=7, granularity="gpu")
    for p, wj in zip(plan, JOBS):
        _, _, _, limits, batch = job_limits(wj, cfg)
        assert p.limits == limits
        spec, _, _ = build_spec(list(p.argv), "uid", tmp_path / "job")
        # hpcsub keeps a fewest-GPU count only where it is not whole nodes (1 GPU of 1 per node
        # is 1 node): the same fewest GPUs either way
        assert spec.limits.min_gpus == limits.min_gpus
        assert replace(spec.limits, min_gpu_count=None) == replace(
            limits, base_batch_size=batch, min_gpu_count=None)
    assert any(p.limits.min_gpu_count == 1 for p in plan)


def test_another_users_plain_job_is_a_sleep_of_its_run_alone(tmp_path):
    """A rigid job goes to sbatch itself: its submitted nodes x GPUs, held for its scaled run
    time alone at that size and batch, which the simulator gives its rigid twin."""
    plain = _job("ncf-3", "ncf", 8, 1024, 40.0, rigid=True)
    (p,) = make_plan([plain], ClusterShape(4, 4), 0.05, script="e.py", output_dir="/runs/x",
                     granularity="gpu")
    assert p.rigid and p.program == "sbatch" and (p.nodes, p.gpus_per_node) == (2, 4)
    assert p.limits.min_nodes == p.limits.max_nodes == 2
    assert p.limits.min_batch_size == p.limits.max_batch_size == p.batch_size
    alone = run_seconds("ncf", p.limits, p.batch_size, 2) * 0.05
    assert p.argv[-1] == f"--wrap=sleep {alone:.1f}"
    assert {"-N", "2", "--gres=gpu:4", "--parsable", "--output=/runs/x/slurm-%j.out",
            f"--time={p.time_limit}"} <= set(p.argv)
    assert not any(a.startswith("--hpcsched") for a in p.argv)
    (q,) = make_plan([replace(plain, rigid=False)], ClusterShape(4, 4), 0.05, script="e.py")
    assert q.program == "hpcsub" and "e.py" in q.argv
