"""hpcsched.sim.physics: job physics checked against the shipped Pollux traces (read here with the
csv module) and PAL's Longhorn quantiles (read here with json). No Slurm."""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

import hpcsched
from hpcsched.sim.physics import (
    Application,
    FixedWork,
    PhysicsError,
    application,
    canonical_placement,
    draw_gpu_slowdowns,
)

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover - comes with scikit-learn (dev extra)
    threadpool_limits = None

DATA = Path(hpcsched.__file__).resolve().parent / "data"
TRACES = DATA / "pollux" / "traces"
LONGHORN = DATA / "pal" / "longhorn-slowdown-quantiles.json"

# the Pollux artifact's epochs per application (simulator/applications.py, APPLICATIONS)
EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
APPS = sorted(EPOCHS)


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def placement_rows(app: str, placement: str) -> list[tuple[float, float, float]]:
    """(local_bsz, step_time, sync_time) of one placement of placements.csv, by local batch."""
    return sorted((float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"]))
                  for r in rows(TRACES / app / "placements.csv") if r["placement"] == placement)


def validation(app: str) -> dict[int, list[dict[str, float]]]:
    """{batch size: rows} of every validation-<B>.csv of ``app``."""
    out = {}
    for f in (TRACES / app).glob("validation-*.csv"):
        out[int(f.stem.split("-")[1])] = [{k: float(v) for k, v in r.items()} for r in rows(f)]
    return dict(sorted(out.items()))


def by_hand_gain(sqr: float, var: float, batch: float, init: float) -> float:
    r = batch / init
    return (var + sqr) / (var / r + sqr)


# --- placements -------------------------------------------------------------------------------


@pytest.mark.parametrize(("placement", "canonical"), [
    ((4, 2), (2, 4)),
    ((2, 4), (2, 4)),
    ((0, 4, 0, 2), (2, 4)),          # empty nodes dropped
    ((4,), (4,)),
    ((3, 1, 2), (1, 2, 3)),          # rotations of 3-1-2: 1-2-3 is the smallest
    ((2, 1, 3, 1), (1, 2, 1, 3)),    # 2131, 1312, 3121, 1213
    ((4, 4, 1), (1, 4, 4)),
])
def test_canonical_placement(placement, canonical):
    assert canonical_placement(placement) == canonical


@pytest.mark.parametrize("placement", [(), (0,), (0, 0, 0)])
def test_canonical_placement_of_nothing_is_an_error(placement):
    with pytest.raises(PhysicsError, match="empty"):
        canonical_placement(placement)


# --- step time ----------------------------------------------------------------------------------


def test_step_sync_time_is_the_first_row_of_placements_csv():
    first = rows(TRACES / "cifar10" / "placements.csv")[0]
    assert (first["placement"], first["local_bsz"]) == ("1", "32")
    assert Application("cifar10").step_sync_time((1,), 32) == (
        float(first["step_time"]), float(first["sync_time"]))


def test_a_placement_and_its_rotation_read_the_same_row():
    app = application("cifar10")
    (m, step, sync), *_ = placement_rows("cifar10", "24")
    assert m == 32
    assert app.step_sync_time((4, 2), 32) == app.step_sync_time((2, 4), 32) == (step, sync)
    assert app.step_sync_time((0, 2, 4), 32) == (step, sync)


@pytest.mark.parametrize(("app", "placement", "key"), [
    ("cifar10", (1,), "1"), ("cifar10", (2, 4), "24"), ("bert", (1, 1), "11"),
    ("imagenet", (4, 4, 4, 4), "4444")])
def test_step_time_interpolates_linearly_between_measured_local_batches(app, placement, key):
    pts = placement_rows(app, key)
    (m0, s0, y0), (m1, s1, y1) = pts[0], pts[1]
    for w in (0.25, 0.5, 0.9):
        m = m0 + w * (m1 - m0)
        step, sync = application(app).step_sync_time(placement, m)
        assert step == pytest.approx(s0 + w * (s1 - s0), rel=1e-12)
        assert sync == pytest.approx(y0 + w * (y1 - y0), rel=1e-12)
    # every measured point is returned as measured
    for m, s, y in pts:
        assert application(app).step_sync_time(placement, m) == (s, y)


def test_step_time_below_the_measured_range_extends_the_first_segment():
    (m0, s0, _), (m1, s1, _) = placement_rows("cifar10", "1")[:2]   # 32 and 45
    step, sync = application("cifar10").step_sync_time((1,), 16)
    assert step == pytest.approx(s0 + (s1 - s0) * (16 - m0) / (m1 - m0), rel=1e-12)
    assert 0 <= sync <= step


def test_micro_batches_add_compute_time_only():
    (_, step, sync), *_ = placement_rows("cifar10", "1")
    app = application("cifar10")
    assert app.step_time((1,), 32) == step
    assert app.step_time((1,), 32, accum=3) == pytest.approx(step + 2 * (step - sync), rel=1e-12)


@pytest.mark.parametrize("app", ["cifar10", "bert", "ncf"])
@pytest.mark.parametrize("placement", [(4, 4, 4, 4, 4), (2,) * 6, (1,) * 20, (4, 4, 4, 4, 3)])
def test_a_placement_not_in_placements_csv_gets_finite_positive_times(app, placement):
    """(One BLAS thread: on a loaded 2-core machine OpenBLAS's threads made the first lookup --
    scipy's Delaunay barycentric transforms, thousands of tiny LAPACK calls -- take 10-25 s.)"""
    keys = {r["placement"] for r in rows(TRACES / app / "placements.csv")}
    assert "".join(map(str, canonical_placement(placement))) not in keys
    a = application(app)
    limit = threadpool_limits(1) if threadpool_limits else contextlib.nullcontext()
    with limit:
        times = [a.step_sync_time(placement, m) for m in (a.min_local_bsz, 64, a.max_local_bsz)]
    for step, sync in times:
        assert math.isfinite(step) and math.isfinite(sync)
        assert step > 0 and 0 <= sync <= step


# --- statistical efficiency ---------------------------------------------------------------------


@pytest.mark.parametrize("app", APPS)
def test_batch_size_range_is_the_smallest_and_largest_validation_file(app):
    sizes = sorted(int(f.stem.split("-")[1]) for f in (TRACES / app).glob("validation-*.csv"))
    a = application(app)
    assert (a.init_batch_size, a.max_batch_size) == (sizes[0], sizes[-1])


def test_batch_size_ranges_by_hand():
    got = {a: (application(a).init_batch_size, application(a).max_batch_size) for a in APPS}
    assert got == {"bert": (12, 384), "cifar10": (128, 4096), "deepspeech2": (20, 640),
                   "imagenet": (200, 12800), "ncf": (256, 32768), "yolov3": (8, 512)}
    assert application("yolov3").max_local_bsz == 8     # the artifact's per-GPU limit


@pytest.mark.parametrize("app", APPS)
def test_total_progress_is_the_least_progress_at_the_last_epoch(app):
    runs = validation(app)
    last = EPOCHS[app] - 1
    assert all(len(r) > last for r in runs.values())
    a = application(app)
    assert a.max_epochs == EPOCHS[app]
    assert a.total_progress == min(r[last]["progress"] for r in runs.values())
    # and every epoch ends at the least progress any run reached by then
    for e in (0, last // 2, last):
        assert a.epoch_end(e) == min(r[e]["progress"] for r in runs.values())


def test_epoch_of_a_progress():
    a = application("cifar10")
    assert a.epoch_at(0.0) == 0
    assert a.epoch_at(a.epoch_end(0) - 1e-6) == 0
    assert a.epoch_at(a.epoch_end(0)) == 1          # the end of epoch 0 starts epoch 1
    assert a.epoch_at(a.epoch_end(41) + 1e-6) == 42
    assert a.epoch_at(a.total_progress * 10) == a.max_epochs - 1


@pytest.mark.parametrize("app", APPS)
def test_gain_at_the_initial_batch_size_is_one(app):
    a = application(app)
    for e in range(a.max_epochs):
        assert a.gain(a.init_batch_size, e) == 1.0


@pytest.mark.parametrize(("batch", "epoch"), [(512, 99), (1024, 0), (4096, 50)])
def test_gain_at_a_measured_batch_uses_that_runs_statistics(batch, epoch):
    r = validation("cifar10")[batch][epoch]
    assert application("cifar10").gain(batch, epoch) == pytest.approx(
        by_hand_gain(r["grad_sqr"], r["grad_var"], batch, 128), rel=1e-12)


def test_gain_between_measured_batches_interpolates_the_statistics():
    runs = validation("cifar10")
    e = 99
    lo, hi = runs[256][e], runs[512][e]
    sqr = 0.5 * (lo["grad_sqr"] + hi["grad_sqr"])          # 384 is halfway from 256 to 512
    var = 0.5 * (lo["grad_var"] + hi["grad_var"])
    assert application("cifar10").grad_stats(384, e) == pytest.approx((sqr, var), rel=1e-12)
    assert application("cifar10").gain(384, e) == pytest.approx(
        by_hand_gain(sqr, var, 384, 128), rel=1e-12)


@pytest.mark.parametrize("app", APPS)
def test_gain_grows_with_the_batch_and_never_beats_linear_scaling(app):
    """Bounds at every epoch; monotone over the batch range at the last epoch. (Early epochs are
    not monotone everywhere: each batch size has its own measured run, whose statistics differ,
    and the gain follows them, as in the Pollux artifact.)"""
    a = application(app)
    batches = np.linspace(a.init_batch_size, a.max_batch_size, 97)
    for e in sorted({0, a.max_epochs // 2, a.max_epochs - 1}):
        for b in batches:
            g = a.gain(b, e)
            assert 1.0 - 1e-12 <= g <= b / a.init_batch_size + 1e-9, (b, e, g)
    last = [a.gain(b, a.max_epochs - 1) for b in batches]
    assert all(y >= x for x, y in itertools.pairwise(last)), last
    assert last[-1] > last[0]


@pytest.mark.parametrize("name", ["resnet50", "CIFAR10", ""])
def test_unknown_application_is_an_error(name):
    with pytest.raises(PhysicsError, match="unknown application"):
        Application(name)
    with pytest.raises(PhysicsError):
        application(name)
    assert issubclass(PhysicsError, ValueError)


def test_missing_traces_are_an_error(tmp_path):
    with pytest.raises(PhysicsError, match="no traces"):
        Application("cifar10", traces=tmp_path)


def test_fixed_work_step_time():
    w = FixedWork(iterations=100, iteration_time=0.5)
    assert w.step_time(1, 1.0, 1.7) == 0.5
    assert w.step_time(2, 1.0, 1.7) == pytest.approx(0.85)
    assert w.step_time(3, 1.2, 2.0) == pytest.approx(1.2)


# --- variability --------------------------------------------------------------------------------


def longhorn() -> dict:
    return json.loads(LONGHORN.read_text())


def test_slowdown_draws_are_deterministic_per_seed():
    classes = ("A", "B", "C", "D")
    a = draw_gpu_slowdowns(64, classes, seed=7)
    assert a.shape == (64, 4)
    assert np.array_equal(a, draw_gpu_slowdowns(64, classes, seed=7))
    assert not np.array_equal(a, draw_gpu_slowdowns(64, classes, seed=8))
    assert draw_gpu_slowdowns(5, ("D",), seed=0).shape == (5, 1)
    # the "class" prefix names the same class
    assert np.array_equal(draw_gpu_slowdowns(8, ("classA",), 3), draw_gpu_slowdowns(8, ("A",), 3))


@pytest.mark.parametrize("stat", ["max", "median"])
def test_slowdowns_lie_within_each_class_quantile_table(stat):
    data = longhorn()
    classes = tuple(sorted(data["classes"]))
    assert classes == ("A", "B", "C", "D")
    out = draw_gpu_slowdowns(2000, classes, seed=1, stat=stat)
    for j, c in enumerate(classes):
        table = data["classes"][c][stat]
        assert min(table) <= out[:, j].min() and out[:, j].max() <= max(table), c
        assert out[:, j].std() > 0, c


def test_slowdowns_follow_the_quantiles():
    """Inverse-transform sampling: the sample median is near the table's 50 % quantile, and one
    uniform draw per GPU is shared by the classes (B and C share BERT's measurements)."""
    data = longhorn()
    probs = np.array(data["probabilities"])
    table_a = np.array(data["classes"]["A"]["max"])
    out = draw_gpu_slowdowns(20000, ("A", "B", "C"), seed=5)
    lo, hi = np.interp([0.48, 0.52], probs, table_a)
    assert lo <= np.median(out[:, 0]) <= hi
    assert data["classes"]["B"]["max"] == data["classes"]["C"]["max"]
    assert np.array_equal(out[:, 1], out[:, 2])
    # the same GPU ranks alike for every class (shared draw, non-decreasing tables)
    a, b = out[:500, 0], out[:500, 1]
    assert (np.subtract.outer(a, a) * np.subtract.outer(b, b) >= 0).all()


@pytest.mark.parametrize("cls", ["E", "classZ", "a"])
def test_unknown_slowdown_class_is_an_error(cls):
    with pytest.raises(PhysicsError, match="no Longhorn measurements"):
        draw_gpu_slowdowns(4, ("A", cls), seed=0)
