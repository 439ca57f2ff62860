"""PAL's per-class GPU variability, as PAL's simulator assigns it (hpcsched.sim.physics)."""

from __future__ import annotations

import csv
import json
import random

import numpy as np
import pytest

from hpcsched.sim import physics
from hpcsched.sim.cluster import CLASSES, SimCluster
from hpcsched.sim.physics import PhysicsError, pal_gpu_slowdowns

RUNS = json.loads(physics.LONGHORN_RUNS.read_text())["classes"]


@pytest.mark.parametrize("n, classes, profile", [
    (0, ("A",), "runs"), (1, ("A", "B", "C", "D"), "runs"), (64, ("D", "A"), "runs"),
    (64, CLASSES, "32gpu"), (100, ("classB",), "32gpu"),
])
def test_shape(n, classes, profile):
    out = pal_gpu_slowdowns(n, classes, 0, profile=profile)
    assert out.shape == (n, len(classes))
    assert np.all(out > 0)


def test_deterministic_per_seed():
    a = pal_gpu_slowdowns(64, CLASSES, 7)
    assert np.array_equal(a, pal_gpu_slowdowns(64, CLASSES, 7))
    assert not np.array_equal(a, pal_gpu_slowdowns(64, CLASSES, 8))


def test_draws_in_pals_order():
    # PAL's ClusterState: random.seed(42), then for every GPU in order, for classA..classD in
    # profiles.json order, random.choice over the class's runs
    rng = random.Random(42)
    want = np.array([[rng.choice(RUNS[c]) for c in "ABCD"] for _ in range(64)])
    assert np.array_equal(pal_gpu_slowdowns(64, CLASSES, 42), want)
    # asking for fewer classes, or another order, picks columns: the draws do not change
    assert np.array_equal(pal_gpu_slowdowns(64, ("D", "A"), 42), want[:, [3, 0]])


@pytest.mark.parametrize("cls, runs", [("A", 1404), ("B", 1096), ("C", 1096), ("D", 880)])
def test_runs_table_is_normalized_per_class(cls, runs):
    v = np.array(RUNS[cls])
    assert len(v) == runs  # every Longhorn run of the class's file (SOURCE.md)
    assert np.median(v) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("k, cls", list(enumerate(CLASSES)))
def test_runs_values_follow_the_class_distribution(k, cls):
    out = pal_gpu_slowdowns(20000, CLASSES, 3)[:, k]
    runs = np.array(RUNS[cls])
    assert set(out) <= set(runs)
    q = [0.05, 0.25, 0.5, 0.75, 0.95]
    assert np.allclose(np.quantile(out, q), np.quantile(runs, q), rtol=0.01)


def test_classes_drawn_independently():
    out = pal_gpu_slowdowns(5000, CLASSES, 1)
    ranks = out.argsort(axis=0).argsort(axis=0)
    rho = np.corrcoef(ranks[:, 0], ranks[:, 1])[0, 1]
    assert abs(rho) < 0.05
    assert not np.array_equal(out[:, 1], out[:, 2])  # B and C: same runs, separate draws
    # the Longhorn mode shares one draw per GPU: strongly rank-correlated
    shared = physics.draw_gpu_slowdowns(5000, ("A", "B"), 1)
    r2 = shared.argsort(axis=0).argsort(axis=0)
    assert np.corrcoef(r2[:, 0], r2[:, 1])[0, 1] > 0.9


def test_32gpu_profile_is_the_csv_tiled():
    with open(physics.PAL_32GPU, newline="") as fh:
        rows = sorted(csv.DictReader(fh), key=lambda r: int(r["GPU_ID"]))
    csv_vals = np.array([[float(r[f"PerfVar_class{c}"]) for c in CLASSES] for r in rows])
    out = pal_gpu_slowdowns(64, CLASSES, 0, profile="32gpu")
    assert np.array_equal(out[:32], csv_vals)
    assert np.array_equal(out[32:], csv_vals)


@pytest.mark.parametrize("n, classes, profile, match", [
    (-1, ("A",), "runs", "n_gpus"),
    (4, ("E",), "runs", "no PAL profile"),
    (4, ("A",), "uniform", "unknown PAL profile"),
])
def test_errors(n, classes, profile, match):
    with pytest.raises(PhysicsError, match=match):
        pal_gpu_slowdowns(n, classes, 0, profile=profile)


def test_sim_cluster_uses_pal_profiles():
    c = SimCluster(16, 4, variability="pal", seed=42)
    assert np.array_equal(c.slow.reshape(64, len(CLASSES)), pal_gpu_slowdowns(64, CLASSES, 42))
    # a job runs at its slowest GPU's pace for its class
    a = CLASSES.index("A")
    assert c.slowdown("A", [(0, 0), (0, 1)]) == max(c.slow[0, 0, a], c.slow[0, 1, a])
