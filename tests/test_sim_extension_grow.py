"""The simulator's grow by extension (issue 10): the job trains on at its old size while the
extension's workers start, stalls while the group re-forms, then runs at its new size; against
the same grow by requeue. The option, the recorded parameters, determinism. No Slurm.

One cifar10 job of 2 GPUs on one node of 4 (GPU-granular), started at 0 (30 s restart cost),
grown to 4 GPUs at the round at t = 60 by hand (``static`` gives running jobs no target, so
nothing else changes it).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from hpcsched.policies.reconcile import Change
from hpcsched.protocol.kinds import ChangeKind
from hpcsched.sim import WorkloadJob
from hpcsched.sim.cli import simulate_command
from hpcsched.sim.engine import SimConfig, Simulator
from hpcsched.sim.workload import load_workload

JOB = WorkloadJob(name="c", submit_time=0.0, application="cifar10", gpus=2, batch_size=256,
                  app_class="A")
STARTUP, STALL, RESTART, T_GROW = 8.0, 1.5, 30.0, 60.0


def _config(grow: str, **kw) -> SimConfig:
    return SimConfig(nodes=1, gpus_per_node=4, granularity="gpu", grow=grow,
                     extension_startup=STARTUP, extension_stall=STALL, **kw)


def _grow_change(sim: Simulator, gpus: int = 4) -> Change:
    j = sim.jobs[0]
    return Change(j.job_id, ChangeKind.GROW, j.nodes, 1, j.batch_size, j.batch_size, "test",
                  (), j.size, gpus)


class OneGrow(Simulator):
    """Applies one grow of job 1 to 4 GPUs after the round at ``T_GROW`` (whose plan,
    ``static``'s, changes nothing for a running job), then Slurm's pass."""

    def _round(self):
        super()._round()
        if self.now == T_GROW:
            self._apply(_grow_change(self))
            self._schedule()


def _started(grow: str) -> Simulator:
    """The job started at 0 and advanced to ``T_GROW``."""
    sim = Simulator([JOB], "static", config=_config(grow))
    j = sim.jobs[0]
    j.state = "PENDING"
    sim._schedule()
    sim.now = T_GROW
    sim._advance(j, T_GROW)
    return sim


def test_during_startup_the_job_trains_on_at_its_old_size_then_stalls():
    """Against a twin that is never grown: the same progress to the end of the start-up, none
    during the stall, more after it."""
    sim, twin = _started("extension"), _started("extension")
    j, t = sim.jobs[0], twin.jobs[0]
    sim._apply(_grow_change(sim))
    # the extension holds the 2 new GPUs from the decision on; the job is still on its 2
    assert j.size == 2 and len(j.gpus) == 2 and len(j.ext.gpus) == 2
    assert not sim.cluster.free.any()
    view = sim.snapshot().job(j.job_id)
    assert view.busy and view.gpus == 4          # policies leave it, counted at its new size
    # start-up: progress at the old size, step for step the twin's
    for dt in (1.0, STARTUP / 2, STARTUP):
        sim._advance(j, T_GROW + dt)
        twin._advance(t, T_GROW + dt)
        assert j.progress == pytest.approx(t.progress, rel=1e-12) and j.progress > 0
    # the workers join: the group re-forms, every rank stalls
    sim.now = T_GROW + STARTUP
    sim._join(j)
    assert (j.size, len(j.gpus), j.ext) == (4, 4, None)
    p1 = j.progress
    sim._advance(j, T_GROW + STARTUP + STALL)
    assert j.progress == p1                       # no progress during the stall
    twin._advance(t, T_GROW + STARTUP + STALL)
    ahead = t.progress - p1
    sim._advance(j, T_GROW + STARTUP + STALL + 10.0)
    twin._advance(t, T_GROW + STARTUP + STALL + 10.0)
    assert j.progress - p1 > 1.5 * (t.progress - p1 - ahead)      # then faster than at 2 GPUs
    # GPU-seconds: 2 GPUs to the grow, 4 after it (the extension's GPUs count while starting)
    assert j.gpu_seconds == pytest.approx(2 * T_GROW + 4 * (STARTUP + STALL + 10.0))


def test_by_requeue_the_job_gives_its_gpus_back_and_pays_the_restart():
    sim = _started("requeue")
    j = sim.jobs[0]
    sim._apply(_grow_change(sim))
    assert j.state == "PENDING" and j.restarts == 1 and j.ext is None
    assert sim.cluster.free.all()


def _run(grow: str):
    sim = OneGrow([JOB], "static", config=_config(grow))
    return sim, sim.run().jobs[0]


def test_a_grow_by_extension_ends_sooner_than_the_same_grow_by_requeue():
    """By requeue the job is back at 4 GPUs at 60 + 30 s having made no progress since 60; by
    extension at 60 + 8 + 1.5 s, with 8 s of progress at the old rate made meanwhile. At the
    new size progress depends on progress only, so the finish times differ by 20.5 s plus the
    time the new size takes to do those 8 s of old-size work: less than 8 s."""
    sim_e, ext = _run("extension")
    _, req = _run("requeue")
    gap = (T_GROW + RESTART) - (T_GROW + STARTUP + STALL)
    assert gap < req.finish_time - ext.finish_time < gap + STARTUP
    assert (ext.restarts, ext.resizes, ext.max_gpus) == (0, 1, 4)
    assert (req.restarts, req.resizes, req.max_gpus) == (1, 1, 4)
    assert ext.resize_log == req.resize_log and [e[::2] for e in ext.resize_log] == [(T_GROW, 2)]
    assert ext.resize_log[0][3] == 4
    assert sim_e.jobs[0].resized_at == T_GROW + STARTUP      # the engine joined it on time
    assert sim_e.cluster.free.all()


def test_a_job_that_ends_during_the_startup_gives_the_extensions_gpus_back():
    sim = _started("extension")
    j = sim.jobs[0]
    sim._apply(_grow_change(sim))
    sim._finish(j, T_GROW + 1.0)
    assert j.ext is None and sim.cluster.free.all()


def test_an_extension_that_cannot_be_placed_is_not_made():
    sim = _started("extension")
    j = sim.jobs[0]
    sim._apply(_grow_change(sim, gpus=6))       # 4 more GPUs on a 4-GPU cluster
    assert j.ext is None and j.resizes == 0 and "not applied" in sim.notes[-1]


@pytest.mark.parametrize(("grow", "startup", "stall"), [("extension", 8.0, 1.5), ("requeue", 5.0, 0.5)])
def test_params_record_the_grow_mode_and_costs(grow, startup, stall):
    res = Simulator([JOB], "static", config=SimConfig(nodes=1, grow=grow, extension_startup=startup,
                                                      extension_stall=stall)).run()
    assert {k: res.params[k] for k in ("grow", "extension_startup", "extension_stall")} == {
        "grow": grow, "extension_startup": startup, "extension_stall": stall}


def test_simconfig_refuses_bad_grow_settings():
    with pytest.raises(ValueError, match="grow must be one of"):
        SimConfig(grow="in-place")
    with pytest.raises(ValueError, match=">= 0"):
        SimConfig(extension_stall=-1.0)


def _cli(tmp_path, *extra):
    out = tmp_path / "s.json"
    res = CliRunner().invoke(simulate_command, ["-w", "pollux:1@0.5", "-p", "jct", "--nodes", "8",
                                                "--granularity", "gpu", "--max-days", "0.05", "-q",
                                                "--json", str(out), *extra])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())["runs"][0]


@pytest.mark.parametrize(("extra", "grow", "startup", "stall"), [
    ((), "extension", 2.25, 0.09),                        # the default (measured)
    (("--grow", "requeue"), "requeue", 2.25, 0.09),
    (("--grow", "extension", "--extension-startup", "5", "--extension-stall", "0.5"), "extension", 5.0, 0.5),
])
def test_the_cli_option_reaches_the_simulation(tmp_path, extra, grow, startup, stall):
    p = _cli(tmp_path, *extra)["params"]
    assert (p["grow"], p["extension_startup"], p["extension_stall"]) == (grow, startup, stall)


def test_the_cli_refuses_an_unknown_grow_mode():
    res = CliRunner().invoke(simulate_command, ["-w", "pollux:1", "-p", "jct", "--grow", "inplace"])
    assert res.exit_code == 2 and "--grow" in res.output


@pytest.mark.parametrize("grow", ["extension", "requeue"])
def test_same_seed_same_result(grow):
    _, jobs = load_workload("pollux:1@0.5", seed=0)
    jobs = jobs[:20]
    cfg = SimConfig(nodes=4, granularity="gpu", grow=grow, max_time=3 * 3600.0)
    a, b = (Simulator(jobs, "jct", config=cfg).run() for _ in range(2))
    assert [(j.finish_time, j.resize_log) for j in a.jobs] == [(j.finish_time, j.resize_log) for j in b.jobs]
    assert sum(j.resizes for j in a.jobs) > 0           # the run covers grows
    if grow == "extension":
        assert sum(j.restarts for j in a.jobs) < sum(j.resizes for j in a.jobs)
    assert np.isfinite([j.finish_time for j in a.jobs if j.finish_time is not None]).all()


def test_an_extension_takes_the_free_gpus_of_the_jobs_own_nodes_first():
    """The job holds GPUs 0-1 of n1; n2 has 3 free. Growing to 5 takes n1's other 2, then 1
    on n2 (packed by itself, all 3 would have gone to n2)."""
    from hpcsched.sim import resize

    sim = Simulator([JOB], "static", config=SimConfig(nodes=2, gpus_per_node=4, granularity="gpu"))
    j = sim.jobs[0]
    j.state = "PENDING"
    sim._schedule()
    sim.cluster.free[1, 0] = False               # someone else's GPU on n2
    names, gpus = resize.extension_gpus(sim.cluster, j, 5, 2)
    assert j.gpus == ((0, 0), (0, 1))
    assert names == ("n1", "n2") and gpus == ((0, 2), (0, 3), (1, 1))
    assert resize.extension_gpus(sim.cluster, j, 9, 2) is None    # 4 more: only 2 free
    assert sim.cluster.free.sum() == 2                             # nothing taken by the refusal
