"""``hpcsched simulate --scale``: arrivals (scale_workload) and work (SimConfig.work_scale)
scaled together, every epoch F x as long; a lone job's work time scales with F, its restart
cost does not. No Slurm."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcsched.cli import main
from hpcsched.sim import WorkloadJob
from hpcsched.sim.emulate import Emulation
from hpcsched.sim.engine import SimConfig, Simulator
from hpcsched.sim.workload import WorkloadError, load_workload, scale_workload

RESTART = 30.0  # SimConfig's default restart cost, paid once at the start, not scaled


def lone_jct(app: str, gpus: int, batch: int, scale: float) -> float:
    job = WorkloadJob("j", 0.0, app, gpus, batch, "A")
    res = Simulator([job], "static", config=SimConfig(nodes=1, gpus_per_node=4,
                                                       work_scale=scale)).run()
    return res.jobs[0].jct


def physics_seconds(app: str, gpus: int, batch: int, scale: float) -> float:
    """Seconds of work at a fixed configuration, epoch by epoch, by the emulation's physics."""
    emu = Emulation.of(app, scale)
    local, accum = batch // gpus, 1
    while local > emu.app.max_local_bsz:
        accum *= 2
        local //= 2
    st = emu.step_seconds((gpus,), batch, accum)
    t, p = 0.0, 0.0
    while p < emu.total:
        end = min(emu.total, emu.app.epoch_end(emu.epoch_at(p)) * scale)
        t += (end - p) / emu.gain(batch, p) * st
        p = end
    return t


@pytest.mark.parametrize("app, gpus", [("cifar10", 4), ("ncf", 2), ("yolov3", 4)])
@pytest.mark.parametrize("scale", [0.5, 0.05, 0.01])
def test_a_lone_jobs_work_time_scales_exactly_at_its_base_batch(app, gpus, scale):
    """At the base batch size the gain is 1 in every epoch, so the work time is F x the full
    one: JCT(F) - restart = F x (JCT(1) - restart), to float rounding (1e-9)."""
    batch = Emulation.of(app).base_batch_size
    full, scaled = lone_jct(app, gpus, batch, 1.0), lone_jct(app, gpus, batch, scale)
    assert scaled - RESTART == pytest.approx(scale * (full - RESTART), rel=1e-9)


@pytest.mark.parametrize("app, gpus, batch", [("cifar10", 4, 512), ("imagenet", 4, 800),
                                              ("deepspeech2", 2, 40)])
@pytest.mark.parametrize("scale", [0.5, 0.05, 0.01])
def test_a_scaled_job_goes_through_all_its_epochs(app, gpus, batch, scale):
    """Above the base batch the gain changes with the epoch; every epoch is F x as long, so a
    scaled job's work time is F x the whole run's at any batch size (1e-9), and it is the
    emulated application's physics epoch by epoch (1e-6)."""
    full, scaled = lone_jct(app, gpus, batch, 1.0), lone_jct(app, gpus, batch, scale)
    assert scaled - RESTART == pytest.approx(scale * (full - RESTART), rel=1e-9)
    assert scaled - RESTART == pytest.approx(physics_seconds(app, gpus, batch, scale), rel=1e-6)


def test_scale_workload_scales_submit_times_only_and_is_pure():
    _, jobs = load_workload("pollux:1")
    before = list(jobs)
    scaled = scale_workload(jobs, 0.1)
    assert jobs == before
    assert [j.submit_time for j in scaled] == pytest.approx([j.submit_time * 0.1 for j in jobs])
    assert [(j.name, j.application, j.gpus, j.batch_size) for j in scaled] == \
        [(j.name, j.application, j.gpus, j.batch_size) for j in jobs]
    assert scale_workload(jobs, 1.0) == jobs


@pytest.mark.parametrize("bad", [0.0, -1.0, 1.5, float("nan")])
def test_scale_workload_refuses_a_scale_outside_0_1(bad):
    with pytest.raises(WorkloadError, match="scale must be in \\(0, 1\\]"):
        scale_workload([], bad)


def test_simulate_scale_scales_arrivals_and_work(tmp_path):
    """Two jobs on one node, the second arriving while the first runs: at --scale F both
    arrivals and work shrink, so the run is the unscaled Simulator on the scaled workload with
    work_scale F."""
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size\n"
                    "a,0,cifar10,4,128\nb,600,ncf,2,256\n")
    out = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["simulate", "-w", str(path), "-p", "static", "--nodes", "1",
                                  "--scale", "0.1", "--json", str(out), "-q"])
    assert r.exit_code == 0, r.output
    got = json.loads(out.read_text())
    got = got[0] if isinstance(got, list) else got["runs"][0]
    _, jobs = load_workload(str(path))
    want = Simulator(scale_workload(jobs, 0.1), "static",
                     config=SimConfig(nodes=1, work_scale=0.1)).run()
    jcts = sorted(j.jct for j in want.jobs)
    assert got["avg_jct"] == pytest.approx(sum(jcts) / 2)
    assert jcts != sorted(j.jct for j in Simulator(jobs, "static", config=SimConfig(nodes=1)).run().jobs)


@pytest.mark.parametrize("bad", ["0", "1.5", "-0.2"])
def test_simulate_refuses_a_scale_outside_0_1(bad, tmp_path):
    r = CliRunner().invoke(main, ["simulate", "-w", "pollux:1", "-p", "static", "--scale", bad])
    assert r.exit_code == 2 and "--scale" in r.output
