"""hpcsched.sim.cli: BLAS thread pools pinned to one thread for a whole ``simulate`` run and in
``--jobs N``'s workers, and the options that reach the simulation's SimConfig (--restart-cost,
--shrink-cost, --granularity). No Slurm."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import pytest
from click.testing import CliRunner
from threadpoolctl import threadpool_info

from hpcsched.cli import main
from hpcsched.sim import cli
from hpcsched.sim import engine as sim_engine

HEADER = "name,time,application,num_replicas,batch_size\n"


def blas_threads() -> list[int]:
    """Threads of every BLAS/OpenMP pool loaded in this process."""
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] in ("blas", "openmp")]


def worker_blas_threads() -> list[int]:
    import hpcsched.sim.engine  # noqa: F401 -- as a simulation would, load every BLAS

    return blas_threads()


def test_single_threaded_blas_limits_every_pool_and_restores():
    before = blas_threads()
    with cli.single_threaded_blas():
        inside = blas_threads()
    assert inside and set(inside) == {1}
    assert blas_threads() == before


def test_worker_processes_use_one_blas_thread():
    with ProcessPoolExecutor(max_workers=1, initializer=cli._init_worker) as pool:
        threads = pool.submit(worker_blas_threads).result()
    assert threads and set(threads) == {1}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_simulate_runs_with_one_blas_thread(tmp_path, monkeypatch, jobs):
    seen = []
    real = cli._run_all

    def spy(runs, n_procs, quiet):
        seen.append(blas_threads())
        return real(runs, n_procs, quiet)

    monkeypatch.setattr(cli, "_run_all", spy)
    wl = tmp_path / "w.csv"
    wl.write_text(HEADER + "a,0,cifar10,1,128\n")
    res = CliRunner().invoke(main, ["simulate", "-w", str(wl), "-p", "dp", "-p", "static",
                                    "-q", "--nodes", "1", "-j", jobs])
    assert res.exit_code == 0, res.output
    assert seen and set(seen[0]) == {1}


@pytest.mark.parametrize("args, expected", [
    ([], {"restart_cost": {"*": 30.0}, "shrink_cost": 2.0, "granularity": "node",
          "variability": False}),
    (["--restart-cost", "12", "--restart-cost", "bert=40", "--shrink-cost", "5",
      "--granularity", "gpu", "--variability"],
     {"restart_cost": {"*": 12.0, "bert": 40.0}, "shrink_cost": 5.0, "granularity": "gpu",
      "variability": True}),
    (["--variability", "--variability-draws", "pal"],
     {"restart_cost": {"*": 30.0}, "shrink_cost": 2.0, "granularity": "node",
      "variability": "pal"}),
    (["--variability-draws", "pal"],        # without --variability: no variability
     {"restart_cost": {"*": 30.0}, "shrink_cost": 2.0, "granularity": "node",
      "variability": False}),
])
def test_options_reach_the_simulators_config(tmp_path, monkeypatch, args, expected):
    configs = []

    class Spy(sim_engine.Simulator):
        def __init__(self, *a, config, **kw):
            configs.append(config)
            super().__init__(*a, config=config, **kw)

    monkeypatch.setattr(sim_engine, "Simulator", Spy)
    wl = tmp_path / "w.csv"
    wl.write_text(HEADER + "a,0,cifar10,1,128\n")
    res = CliRunner().invoke(main, ["simulate", "-w", str(wl), "-p", "dp", "-q", "--nodes", "1",
                                    *args])
    assert res.exit_code == 0, res.output
    (cfg,) = configs
    assert dict(cfg.restart_cost) == expected["restart_cost"]
    assert cfg.shrink_cost == expected["shrink_cost"]
    assert cfg.granularity == expected["granularity"]
    assert cfg.variability == expected["variability"]


def test_granularity_choices():
    res = CliRunner().invoke(main, ["simulate", "-w", "pollux:1", "-p", "dp", "--granularity",
                                    "rack"])
    assert res.exit_code == 2 and "rack" in res.output
