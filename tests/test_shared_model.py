"""The shared step-time model (hpcsched.perf.shared): an application's measured error of its
prior, per configuration, built from every job's measurements -- by hand, through the model
the policies use, in the simulator, and from a real SQLite store in the daemon's snapshot."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from types import MappingProxyType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcsched import slurm
from hpcsched.daemon.views import daemon_snapshot, with_step_corrections
from hpcsched.model.snapshot import JobView, ProfilePoint
from hpcsched.perf import model as m
from hpcsched.perf.pollux import PolluxModel, step_time
from hpcsched.perf.priors import prior_for
from hpcsched.perf.shared import (
    RESOLUTION,
    Measured,
    StepCorrections,
    StepLedger,
    step_corrections,
)
from hpcsched.protocol.jobdir import current_user
from hpcsched.protocol.limits import JobLimits
from hpcsched.slurm.observe import Observation
from tests.conftest import running_job_dir

PRIOR = prior_for("cifar10")


def measured(nodes, world, local, ratio, steps=10.0, accum=1):
    """A measurement ``ratio`` times the cifar10 prior's step time."""
    return Measured(nodes, world, local, accum, ratio * step_time(PRIOR, nodes, world, local, accum),
                    steps)


def view(profile=(), corrections=None, app="cifar10"):
    return JobView(job_id="J", state="RUNNING", nodes=1, node_names=(),
                   limits=JobLimits(4, 1, 4, 64, 1024, 64, 128, "sqrt"), batch_size=128,
                   submit_time=0.0, profile=tuple(profile), app_class=app,
                   step_corrections=corrections)


def point(nodes, world, local, ratio, samples=20):
    t = ratio * step_time(PRIOR, nodes, world, local, 1)
    return ProfilePoint(world, nodes, local, 1, t, world * local / t, samples)


# ------------------------------------------------------------------------------- the table

def test_the_error_is_a_steps_weighted_mean_of_logs_per_configuration_class():
    table = step_corrections("CIFAR10 ", [
        measured(1, 4, 32, 1.5, steps=30), measured(1, 4, 40, 2.0, steps=10),   # octave 5
        measured(1, 4, 128, 1.2, steps=20),                                     # octave 7
        measured(2, 8, 32, 0.8, steps=5)])
    fine = (30 * math.log(1.5) + 10 * math.log(2.0)) / 40
    coarse = (30 * math.log(1.5) + 10 * math.log(2.0) + 20 * math.log(1.2)) / 60
    assert table.application == "cifar10"
    assert table.log_factor(1, 4, 32) == pytest.approx(fine, abs=RESOLUTION)
    assert table.log_factor(1, 4, 45) == table.log_factor(1, 4, 32)        # log2 45 rounds to 5
    assert table.log_factor(1, 4, 128) == pytest.approx(math.log(1.2), abs=RESOLUTION)
    assert table.log_factor(1, 4, 512) == pytest.approx(coarse, abs=RESOLUTION)  # no octave 9
    assert table.log_factor(2, 8, 1) == pytest.approx(math.log(0.8), abs=RESOLUTION)
    assert table.log_factor(4, 16, 32) == 0.0                              # nothing like it
    assert table.factor(1, 4, 128) == pytest.approx(1.2, rel=RESOLUTION)
    # rounded to RESOLUTION in log space: a mean that moves by less keeps the table
    nudged = step_corrections("cifar10", [measured(1, 4, 128, 1.2 * (1 + 1e-5), steps=20)])
    assert nudged == step_corrections("cifar10", [measured(1, 4, 128, 1.2, steps=20)])


def test_no_prior_no_table_and_bad_measurements_are_skipped():
    assert step_corrections("my-own-model", [measured(1, 4, 32, 2.0)]) is None
    bad = [Measured(1, 4, 32, 1, float("nan"), 10), Measured(1, 4, 32, 1, -1.0, 10),
           Measured(1, 4, 32, 1, 0.5, 0), Measured(1, 4, 32, 1, 0.5, float("inf")),
           Measured(3, 2, 32, 1, 0.5, 10), Measured(1, 4, 0, 1, 0.5, 10),
           Measured(1, 4, 32, 0, 0.5, 10)]
    assert step_corrections("cifar10", bad) == StepCorrections("cifar10")
    assert step_corrections("cifar10", bad + [measured(1, 4, 32, 2.0)]) == \
        step_corrections("cifar10", [measured(1, 4, 32, 2.0)])


def test_equal_tables_are_equal_and_hash_alike():
    a = step_corrections("cifar10", [measured(1, 4, 32, 1.5), measured(2, 8, 64, 0.9)])
    b = step_corrections("cifar10", [measured(2, 8, 64, 0.9), measured(1, 4, 32, 1.5)])
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != step_corrections("cifar10", [measured(1, 4, 32, 1.6)])


def test_the_ledger_is_the_table_of_its_totals():
    ledger = StepLedger()
    t = step_time(PRIOR, 1, 4, 32, 1)
    ledger.add("cifar10", 1, 4, 32, 1, 3 * t * 1.5, 3.0)
    ledger.add("Cifar10", 1, 4, 32, 1, 7 * t * 1.5, 7.0)
    ledger.add("cifar10", 2, 8, 64, 1, 5 * step_time(PRIOR, 2, 8, 64, 1) * 0.9, 5.0)
    assert ledger.corrections("cifar10") == step_corrections(
        "cifar10", [measured(1, 4, 32, 1.5, steps=10), measured(2, 8, 64, 0.9, steps=5)])
    assert ledger.corrections("bert") == StepCorrections("bert")
    assert ledger.corrections("no-prior") is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([(1, 1), (1, 4), (2, 8), (1, 3)]),
                          st.sampled_from([16, 24, 32, 45, 64]), st.integers(1, 2),
                          st.floats(0.5, 2.0), st.floats(0.0, 50.0), st.booleans()),
                max_size=25))
def test_the_incremental_ledger_gives_the_table_of_its_totals_to_the_bit(adds):
    """Measurements added in any order, the table asked for after any of them: always equal
    to :func:`step_corrections` of the totals so far, and the very same object while no
    rounded mean has moved (the models cached on it stay)."""
    ledger, totals, last = StepLedger(), {}, None
    for (nodes, world), local, accum, ratio, steps, ask in adds:
        secs = steps * ratio * step_time(PRIOR, nodes, world, local, accum)
        ledger.add("cifar10", nodes, world, local, accum, secs, steps)
        row = totals.setdefault((nodes, world, local, accum), [0.0, 0.0])
        row[0] += secs
        row[1] += steps
        if ask:
            table = ledger.corrections("cifar10")
            assert table == step_corrections("cifar10", [
                Measured(n, w, m, a, t / k, k) for (n, w, m, a), (t, k) in totals.items() if k > 0])
            assert (table is last) == (table == last)
            last = table


def test_the_vectorised_factors_are_factor_at_at_every_configuration():
    table = step_corrections("cifar10", [measured(1, 4, 32, 1.5), measured(1, 4, 128, 1.2),
                                         measured(2, 8, 64, 0.8), measured(4, 16, 16, 3.0)])
    nodes, world, local = np.meshgrid([1, 2, 3, 4], [4, 8, 16, 5], [1, 2, 3, 12, 16, 23, 45, 64,
                                                                    100, 128, 200, 256],
                                      indexing="ij")
    got = table.factors(nodes, world, local)
    assert got.shape == nodes.shape
    want = [table.factor(int(n), int(w), int(m))
            for n, w, m in zip(nodes.ravel(), world.ravel(), local.ravel())]
    assert got.ravel().tolist() == want                       # the same floats, not close ones
    assert {round(f, 6) for f in want} > {1.0}                # fine, coarse and no class all met
    assert StepCorrections("cifar10").factors(nodes, world, local).tolist() == \
        np.ones(nodes.shape).tolist()


# ------------------------------------------------------------------------------- the model

def test_a_job_that_has_not_run_is_predicted_by_its_applications_measurements():
    table = step_corrections("cifar10", [measured(2, 8, 32, 2.0)])
    model = m.model_for(view(corrections=table))
    assert isinstance(model, PolluxModel) and model.corrections == table
    cfg = m.candidates(view(), 8)[0]
    want = 2.0 * step_time(PRIOR, 2, 8, cfg.local_batch_size, cfg.accumulation_steps)
    assert model.step_time(cfg, 2) == pytest.approx(want, rel=2 * RESOLUTION)


def test_a_job_is_scaled_to_its_own_measurements_after_the_applications_error():
    """Other jobs measured the prior 1.5x slow on one node of 4 GPUs and 2x on two nodes of 8;
    this job measured itself 1.5 x 1.1 on one node: it is taken as 10% slower than the others
    everywhere, so on two nodes it is predicted at 2 x 1.1 the prior."""
    table = step_corrections("cifar10", [measured(1, 4, 32, 1.5, steps=100),
                                         measured(2, 8, 32, 2.0, steps=100)])
    model = m.model_for(view([point(1, 4, 32, 1.5 * 1.1)], table))
    cfg = next(c for c in m.candidates(view(), 8) if c.accumulation_steps == 1)
    want = 2.0 * 1.1 * step_time(PRIOR, 2, 8, cfg.local_batch_size, 1)
    assert model.step_time(cfg, 2) == pytest.approx(want, rel=3 * RESOLUTION)
    # without a table the job's own measurement scales the prior (the per-job model)
    plain = m.model_for(view([point(1, 4, 32, 1.5 * 1.1)]))
    assert plain.corrections is None
    assert plain.step_time(cfg, 2) == pytest.approx(1.65 * step_time(PRIOR, 2, 8, cfg.local_batch_size, 1),
                                                    rel=1e-2)


@pytest.mark.parametrize(("gpus", "nodes"), [(1, 1), (4, 1), (6, 2), (8, 2), (16, 4)])
def test_the_vectorised_goodputs_apply_the_table_as_the_plain_step_time(gpus, nodes):
    table = step_corrections("cifar10", [measured(1, 4, 32, 1.7), measured(2, 8, 16, 0.6),
                                         measured(2, 6, 64, 1.3), measured(1, 1, 64, 1.1)])
    job = replace(view(corrections=table), grad_noise=(1.0, 10.0))
    model = m.model_for(job)
    x, cfg = m.best_at(job, model, gpus, nodes)
    loop = max(m.candidates(job, gpus), key=lambda c: (m.goodput(model, c, nodes, (1.0, 10.0), 128),
                                                      -abs(c.global_batch_size - 128)))
    assert cfg == loop
    assert x == pytest.approx(m.goodput(model, loop, nodes, (1.0, 10.0), 128), rel=1e-12)


def test_with_step_corrections_asks_once_per_application():
    asked = []

    def lookup(app):
        asked.append(app)
        return StepCorrections(app) if app == "cifar10" else None

    views = (view(), replace(view(), job_id="K", app_class="CIFAR10"), view(app="mine"),
             view(app=""))
    out = with_step_corrections(views, lookup)
    assert sorted(asked) == ["cifar10", "mine"]
    assert [v.step_corrections for v in out] == [StepCorrections("cifar10")] * 2 + [None, None]


# ------------------------------------------------------------------------------- simulator

def test_the_simulator_gives_every_job_its_applications_measurements():
    from hpcsched.sim.engine import SimConfig, Simulator
    from hpcsched.sim.workload import load_workload

    _, jobs = load_workload("pollux:1@0.5")
    first = jobs[:12]
    sim = Simulator(first, "jct", config=SimConfig(granularity="gpu", max_time=3600.0))
    sim.run()
    trained = {j.wj.application for j in sim.jobs if j.steps}
    assert trained, "some job trained within the hour"
    for app in trained:
        table = sim.ledger.corrections(app)
        assert table is not None and table.fine     # what the jobs measured is in it
        # every configuration any job of the application measured, steps-weighted
        want = step_corrections(app, [Measured(n, w, loc, a, secs / k, k)
                                      for j in sim.jobs if j.wj.application == app
                                      for (w, n, loc, a), (secs, k) in j.steps.items() if k > 0])
        assert table == want
    fitted = Simulator(first, "jct", config=SimConfig(granularity="gpu", max_time=3600.0,
                                                      throughput_model="fitted"))
    assert fitted.ledger is None
    assert all(v.step_corrections is None for v in fitted.snapshot().jobs)


def test_an_unknown_throughput_model_is_refused():
    from hpcsched.sim.engine import SimConfig

    with pytest.raises(ValueError, match="throughput_model must be one of shared, fitted"):
        SimConfig(throughput_model="oracle")


# ------------------------------------------------------------------------------- daemon

JOB = dict(workers_per_node=4, min_nodes=1, max_nodes=4, min_batch_size=64, max_batch_size=1024,
           base_batch_size=128, lr_scaling="linear", state="COMPLETED", last_seen=100.0)


def _profile(store, job_id, app, rows):
    store.upsert_job(job_id=job_id, job_uid=f"u-{job_id}", app_class=app, **JOB)
    store.add_profile_samples([dict(job_id=job_id, time=1.0 + i, world_size=w, nodes=n,
                                    local_batch_size=loc, global_batch_size=w * loc,
                                    step_time=t, throughput=w * loc / t, steps=k)
                               for i, (n, w, loc, t, k) in enumerate(rows)])


def test_the_store_gathers_every_jobs_measurements_per_application(store):
    _profile(store, "1", "cifar10", [(1, 4, 32, 0.5, 10), (1, 4, 32, 0.3, 30), (2, 8, 32, 0.9, 5)])
    _profile(store, "2", " CIFAR10", [(1, 4, 32, 0.7, 60)])          # finished or not, any case
    _profile(store, "3", "bert", [(1, 4, 32, 9.0, 100)])
    got = store.application_profile(["Cifar10", "imagenet", ""])
    assert list(got) == ["cifar10"]
    (a, b) = got["cifar10"]
    assert (a.nodes, a.world_size, a.local_batch_size, a.accumulation_steps) == (1, 4, 32, 1)
    assert a.step_time == pytest.approx((0.5 * 10 + 0.3 * 30 + 0.7 * 60) / 100) and a.steps == 100
    assert (b.nodes, b.world_size, b.step_time, b.steps) == (2, 8, pytest.approx(0.9), 5)
    assert store.application_profile([]) == {}


def test_the_daemon_snapshot_carries_the_applications_measurements(control_dir, store):
    me = current_user()
    d = running_job_dir(control_dir, script="/s/cifar10.py",
                        limits=JobLimits(4, 1, 4, 64, 1024, None, 128, "linear"),
                        global_batch_size=128, local_batch_size=32)
    slow = 1.5 * step_time(PRIOR, 2, 8, 32, 1)
    _profile(store, "7", "cifar10", [(2, 8, 32, slow, 40)])          # an earlier job, finished
    info = slurm.JobInfo(job_id="10", name="", user=me, state="RUNNING", state_reason="None",
                         partition="gpu", nodes="n1", node_count=1, gpus_per_node=4, restarts=0,
                         batch_host="n1", priority=1)
    obs = Observation(time.time(), (), MappingProxyType({"10": info}), 2)
    managed = {"10": (d, d.read_spec(), info)}
    (j,) = daemon_snapshot(obs, managed, store, set(), ()).jobs
    assert j.app_class == "cifar10"
    assert j.step_corrections.log_factor(2, 8, 32) == pytest.approx(math.log(1.5), abs=RESOLUTION)
    assert m.model_for(j).corrections == j.step_corrections
    (plain,) = daemon_snapshot(obs, managed, store, set(), (), "fitted").jobs
    assert plain.step_corrections is None
