"""The emulated application with real torch.distributed (gloo on CPU) workers, no Slurm: its
progress, end and reports follow the simulator's physics across a checkpoint-and-shrink, and
the gradient noise the API measures is the application's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsched.protocol import files as ctl
from hpcsched.protocol.jobdir import JobDir
from hpcsched.sim.emulate import Emulation
from tests.gloo_workers import free_port, join, wait_ack, worker_env, write_control

SCRIPT = Path(__file__).resolve().parent.parent / "jobscripts" / "examples" / "emulated.py"


def launch(jd: JobDir, world: int, generation: int, local: int, launch: int, app: str,
           scale: float) -> list[subprocess.Popen]:
    """``world`` workers of the emulated application as launch ``launch`` of job ``jd``, with
    the environment the launcher gives them."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = worker_env(jd, rank, world, port, generation, local, 1, launch)
        procs.append(subprocess.Popen(
            [sys.executable, str(SCRIPT), "--application", app, "--scale", str(scale)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def physics_run(emu: Emulation, batch: int) -> tuple[int, float]:
    """``(steps, final progress)`` at a constant global ``batch``."""
    steps, progress = 0, 0.0
    while progress < emu.total:
        progress += emu.gain(batch, progress)
        steps += 1
    return steps, progress


@pytest.mark.slow
def test_progress_survives_a_shrink_and_the_job_ends_on_the_physics_work(tmp_path):
    """ncf at 0.5% of its work, global batch 256 throughout: 2 workers, then (checkpoint and
    shrink) 1 worker from the checkpoint. Progress per step depends only on the batch and the
    progress so far, so the run must take exactly the steps the physics says, whoever runs
    them, and report the simulator's work in samples.

    0.5% (971 steps; 1% took 1,942, twice the time): none of this depends on the run's
    length; the physics' step times (at least 7 ms each) still make the run last over 7 s, so
    it is still under way 3 s in, and its 1.9 epochs end far from the data's last (the 3rd)."""
    app, scale = "ncf", 0.005
    emu = Emulation.of(app, scale)
    jd = JobDir.create(tmp_path)
    procs = launch(jd, world=2, generation=0, local=128, launch=1, app=app, scale=scale)
    wait_ack(jd, 0, "applied", procs)
    time.sleep(3.0)
    mid = ctl.read_progress(jd.progress_path, jd.uid)
    assert mid is not None and 0 < mid.samples_processed < mid.total_samples
    assert mid.total_samples == round(emu.samples(emu.total))
    write_control(jd, 1, "checkpoint-and-shrink", world=1, local=256, accum=1)
    a1 = wait_ack(jd, 1, "checkpointed", procs)
    assert Path(a1.checkpoint).is_file()
    join(procs)
    stopped = ctl.read_progress(jd.progress_path, jd.uid)
    assert 0 < stopped.step and not stopped.finished

    procs = launch(jd, world=1, generation=1, local=256, launch=2, app=app, scale=scale)
    out = join(procs)[0]
    res = json.loads(out.strip().splitlines()[-1])
    steps, progress = physics_run(emu, 256)
    assert res["steps"] == steps
    assert res["progress"] == pytest.approx(progress, rel=1e-9)
    end = ctl.read_progress(jd.progress_path, jd.uid)
    assert end.finished and end.step == steps
    assert end.samples_processed == round(emu.samples(progress))
    assert end.total_samples == round(emu.samples(emu.total))
    # the work ended training, not the data: every step took a full batch (256 divides the
    # data set), and the data position is far from its last epoch
    size = emu.dataset_size(256)
    assert end.epoch * size + end.epoch_position == steps * 256
    assert end.epoch < emu.data_epochs(size, 256) - 1


@pytest.mark.slow
def test_the_measured_gradient_noise_is_the_applications(tmp_path):
    """cifar10 on 2 workers at its base batch (128), scale 0.004 (every epoch a step or two,
    the estimator's smoothing 1 - 0.001 / 0.004 = 0.75): at the end the job's smoothed
    estimate (progress.json, the daemon's input) is the same exponential average, with bias
    correction, of the application's statistics at each step it made (``grad_var`` x M0 per
    sample): ``tr(Sigma)`` within 10% (per-step errors of about 2%); ``|G|^2`` within 30% at
    the steps (metrics records) whose noise scale is under 5x the batch (its per-step error grows
    with the noise scale, 100x the batch by the last epochs)."""
    app, scale = "cifar10", 0.004
    emu = Emulation.of(app, scale)
    jd = JobDir.create(tmp_path)
    procs = launch(jd, world=2, generation=0, local=64, launch=1, app=app, scale=scale)
    join(procs, timeout=180)
    end = ctl.read_progress(jd.progress_path, jd.uid)
    assert end.finished
    theta = emu.grad_noise_smoothing()   # ** (128 / 128): the batch is the estimator's base
    num, den, expected = [0.0, 0.0], 0.0, []
    for k in range(end.step):              # gain 1 at M0: progress k before step k
        x = emu.grad_stats(128, float(k))
        num = [theta * n + (1 - theta) * v for n, v in zip(num, x)]
        den = theta * den + (1 - theta)
        expected.append((num[0] / den, num[1] / den, x[1] / x[0]))
    sqr, var, _ = expected[-1]
    assert end.grad_var == pytest.approx(var, rel=0.10)
    # |G|^2 where it can be measured: the steps whose noise scale is under 5x the batch
    records = [json.loads(line) for line in
               (jd.metrics_dir / "launch-1-rank-0.jsonl").read_text().splitlines()]
    early = [(r["grad_sqr"], expected[r["step"]][0]) for r in records
             if r.get("grad_sqr") is not None and 4 <= r["step"] and expected[r["step"]][2] < 600]
    assert len(early) >= 3, early
    for measured, want in early:
        assert measured == pytest.approx(want, rel=0.30)
    # the whole run's plain average is far from it: the estimate follows the epochs
    mean_var = sum(emu.grad_stats(128, float(k))[1] for k in range(end.step)) / end.step
    assert abs(mean_var / var - 1) > 0.10
