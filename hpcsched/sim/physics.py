"""Job physics for the simulator: how fast a job trains, from measured data.

Pure and deterministic given its inputs; the measured tables are read once per application and
cached. Units: seconds, samples, GPUs; *progress* is in Pollux's unit, optimizer steps at the
application's initial (base) batch size.

Pollux applications (:class:`Application`). Source: the Pollux artifact's simulator
(Qiao et al., OSDI'21; github.com/petuum/adaptdl, branch ``osdi21-artifact``, ``simulator/``),
whose measured traces ship in ``hpcsched/data/pollux/traces/<app>/`` (Apache-2.0, see
``SOURCE.md`` there). The model follows that simulator's ``applications.py`` and ``Job.step``
(the code here is our own):

* **Step time** of a placement (GPUs per node, e.g. ``(4, 2)``) at a local (per-GPU micro-)batch
  ``m``: ``placements.csv`` when it holds that placement (up to rotation), interpolated linearly
  in ``m``; otherwise interpolated linearly in ``(nodes, replicas, m)`` over every measured point
  (``placements.csv`` averaged per ``(nodes, replicas, m)`` plus ``scalability.csv``), nodes capped
  at 16 as the artifact does. It gives ``(step_time, sync_time)``; with ``s`` micro-batches per
  step the step takes ``step_time + (s - 1) * (step_time - sync_time)``. *Departures:* outside the
  measured local batch sizes the placement curve is extended along its end segment (the artifact
  asserts instead), and a point outside the convex hull of the scalability data takes the nearest
  measured point (the artifact asserts).
* **Statistical efficiency.** Each ``validation-<B>.csv`` is one training run at global batch
  ``B``: per epoch, the progress reached and the gradient statistics ``grad_sqr, grad_var`` (at
  the base batch size). At batch ``M`` the job gains ``(var + sqr) / (var / r + sqr)`` progress per
  step, ``r = M / M0`` (AdaptDL's gain; Pollux §3.1; :func:`hpcsched.perf.pollux.gain`, the
  formula the policies' statistical efficiency uses), with the statistics of the current epoch
  interpolated linearly between the two measured batch sizes around ``M`` (clamped to the
  measured range).
* **Work.** Epoch ``e`` ends at progress ``P(e)`` = the least progress any measured run reached
  at the end of epoch ``e``; the job is done after ``max_epochs`` epochs (the artifact's
  ``max_epochs`` per application and no target metric, exactly as its published runs).

Variability (PAL, Jain et al., SC'24 §3): a data-parallel job runs at the pace of its slowest
GPU, so its step time is multiplied by the largest slowdown among its GPUs for its class
(:func:`draw_gpu_slowdowns` draws them from the Longhorn measurements; :func:`pal_gpu_slowdowns`
draws them the way PAL's own simulator does).

Fixed-work jobs (:class:`FixedWork`, the PAL/Blox traces): a number of steps, each
``iteration_time`` on median GPUs of one node, times the slowest GPU's slowdown, times a constant
locality penalty when the job spans nodes (PAL §3, the ``L`` of its ``L x V`` score).
"""

from __future__ import annotations

import bisect
import csv
import json
import random
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from threadpoolctl import threadpool_limits

from hpcsched.perf import pollux

if TYPE_CHECKING:
    from scipy.interpolate import LinearNDInterpolator

DATA = Path(__file__).resolve().parent.parent / "data"
TRACES = DATA / "pollux" / "traces"
LONGHORN = DATA / "pal" / "longhorn-slowdown-quantiles.json"
LONGHORN_RUNS = DATA / "pal" / "longhorn-run-slowdowns.json"
PAL_32GPU = DATA / "pal" / "32gpu-variability.csv"
#: the order PAL's simulator draws a GPU's classes in (its ``profiles.json``)
PAL_CLASS_ORDER = ("A", "B", "C", "D")

# The artifact's per-application settings (simulator/applications.py, APPLICATIONS): epochs
# trained, and yolov3's per-GPU batch limit (8; the others: the largest measured local batch).
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80,
              "yolov3": 50}
MAX_LOCAL_BSZ = {"yolov3": 8}
APPLICATIONS = tuple(sorted(MAX_EPOCHS))


class PhysicsError(ValueError):
    """Unknown application, or a configuration the physics cannot evaluate."""


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def canonical_placement(placement: tuple[int, ...]) -> tuple[int, ...]:
    """GPUs per node with empty nodes dropped, rotated to the lexicographically smallest form
    (the artifact's key: ``(2, 4)`` and ``(4, 2)`` are one placement)."""
    p = tuple(int(x) for x in placement if x)
    if not p:
        raise PhysicsError("empty placement")
    return min(p[i:] + p[:i] for i in range(len(p)))


@dataclass(frozen=True)
class _Curve:
    """Step and sync time against local batch size for one placement, sorted by batch."""

    local: np.ndarray
    step: np.ndarray
    sync: np.ndarray

    def at(self, m: float) -> tuple[float, float]:
        x = self.local
        if len(x) == 1:
            return float(self.step[0]), float(self.sync[0])
        out = []
        for y in (self.step, self.sync):
            if m < x[0]:
                v = y[0] + (y[1] - y[0]) * (m - x[0]) / (x[1] - x[0])
            elif m > x[-1]:
                v = y[-1] + (y[-1] - y[-2]) * (m - x[-1]) / (x[-1] - x[-2])
            else:
                v = np.interp(m, x, y)
            out.append(float(v))
        step, sync = out
        # extension never goes below the smallest measured time of the curve
        step = max(step, float(self.step.min()) * 0.5)
        return step, min(max(sync, 0.0), step)


def _placement_points(rows: list[dict[str, str]]) -> dict[tuple[int, ...],
                                                          list[tuple[float, float, float]]]:
    """The rows of an application's ``placements.csv`` grouped by canonical placement (GPUs
    per node): ``placement -> [(local_bsz, step_time, sync_time), ...]`` sorted by per-GPU
    batch size (samples; seconds)."""
    curves: dict[tuple[int, ...], list[tuple[float, float, float]]] = {}
    for r in rows:
        key = canonical_placement(tuple(int(c) for c in r["placement"]))
        curves.setdefault(key, []).append((float(r["local_bsz"]), float(r["step_time"]),
                                           float(r["sync_time"])))
    for pts in curves.values():
        pts.sort()
    return curves


def _scattered_points(curves: dict[tuple[int, ...], list[tuple[float, float, float]]],
                      scalability: list[dict[str, str]]) -> tuple[list, list]:
    """The scattered points the interpolators fit: ``xs`` = ``(nodes, replicas, local_bsz)``
    and ``ys`` = ``(step_time, sync_time)``; the placement curves' points averaged per
    ``(nodes, replicas, local_bsz)`` in sorted order, then the ``scalability.csv`` rows."""
    agg: dict[tuple[int, int, float], list[tuple[float, float]]] = {}
    for key, pts in curves.items():
        for m, st, sy in pts:
            agg.setdefault((len(key), sum(key), m), []).append((st, sy))
    xs, ys = [], []
    for (n, k, m), v in sorted(agg.items()):
        xs.append((n, k, m))
        ys.append(np.mean(v, axis=0))
    for r in scalability:
        xs.append((int(r["num_nodes"]), int(r["num_replicas"]), float(r["local_bsz"])))
        ys.append((float(r["step_time"]), float(r["sync_time"])))
    return xs, ys


def _validation_runs(d: Path) -> dict[int, dict[str, np.ndarray]]:
    """An application's validation runs from ``d/validation-<batch>.csv``: ``batch size ->
    {"progress", "grad_sqr", "grad_var"} -> per-epoch arrays``; empty when there are none."""
    val: dict[int, dict[str, np.ndarray]] = {}
    for f in sorted(d.glob("validation-*.csv")):
        b = int(f.stem.split("-")[-1])
        vr = _read_csv(f)
        val[b] = {c: np.array([float(r[c]) for r in vr]) for c in
                  ("progress", "grad_sqr", "grad_var")}
    return val


class Application:
    """One Pollux application's measured physics (module docstring).

    Attributes:
        name: application name (``cifar10``, ...).
        init_batch_size: base global batch size M0 (the smallest validated batch), samples.
        max_batch_size: largest validated global batch size, samples.
        min_local_bsz, max_local_bsz: per-GPU micro-batch range measured (samples).
        max_epochs: epochs the job trains.

    Raises:
        PhysicsError: unknown application or missing trace files.
    """

    def __init__(self, name: str, traces: Path = TRACES):
        if name not in MAX_EPOCHS:
            raise PhysicsError(f"unknown application {name!r} (known: {', '.join(APPLICATIONS)})")
        d = traces / name
        if not (d / "placements.csv").exists():
            raise PhysicsError(f"no traces for {name!r} in {d}")
        self.name = name
        self.max_epochs = MAX_EPOCHS[name]
        rows = _read_csv(d / "placements.csv")
        curves = _placement_points(rows)
        self._curves = {}
        for key, pts in curves.items():
            a = np.array(pts)
            self._curves[key] = _Curve(a[:, 0], a[:, 1], a[:, 2])
        xs, ys = _scattered_points(curves, _read_csv(d / "scalability.csv"))
        self._xs, self._ys = np.array(xs, dtype=float), np.array(ys, dtype=float)
        self.min_local_bsz = int(min(float(r["local_bsz"]) for r in rows))
        self.max_local_bsz = int(MAX_LOCAL_BSZ.get(name, max(float(r["local_bsz"]) for r in rows)))
        val = _validation_runs(d)
        if not val:
            raise PhysicsError(f"no validation-*.csv for {name!r} in {d}")
        self._val = dict(sorted(val.items()))
        self._bszs = np.array(list(self._val), dtype=float)
        self.init_batch_size = int(self._bszs[0])
        self.max_batch_size = int(self._bszs[-1])
        epochs = min(len(v["progress"]) for v in self._val.values())
        self.max_epochs = min(self.max_epochs, epochs)
        # P(e): end of epoch e (e = 1..max_epochs), the least progress over the measured runs
        self._epoch_end = np.array([min(v["progress"][e] for v in self._val.values())
                                    for e in range(self.max_epochs)])

    # --------------------------------------------------------------------- throughput
    @cached_property
    def _linear(self) -> LinearNDInterpolator:
        # imported here: most placements are measured curves, and scipy.interpolate costs a
        # worker of the emulated application 0.35 s of CPU at every start (each resize)
        from scipy.interpolate import LinearNDInterpolator

        interp = LinearNDInterpolator(self._xs, self._ys)
        # the triangulation's transform is computed on first use, through BLAS; one thread,
        # since BLAS's threads competing for a busy machine's cores made it far slower
        # (measured: docs/design-notes.md, "sim/physics.py")
        with threadpool_limits(limits=1):
            _ = interp.tri.transform
        return interp

    @cached_property
    def _nearest(self) -> _ScaledNearest:
        scale = self._xs.max(axis=0)
        return _ScaledNearest(self._xs, self._ys, scale)

    def step_sync_time(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """``(step_time, sync_time)`` in seconds of one micro-batch step at ``placement``
        (GPUs per node) and per-GPU batch ``local_bsz`` on the traces' GPUs."""
        return self._step_sync(canonical_placement(placement), float(local_bsz))

    @cache  # noqa: B019 -- one Application per name lives for the process
    def _step_sync(self, p: tuple[int, ...], m: float) -> tuple[float, float]:
        curve = self._curves.get(p)
        if curve is not None:
            return curve.at(m)
        q = np.array([[min(len(p), 16), sum(p), m]], dtype=float)
        v = self._linear(q)[0]
        if not np.all(np.isfinite(v)):
            v = self._nearest(q)[0]
        step, sync = float(v[0]), float(v[1])
        return step, min(max(sync, 0.0), step)

    def step_time(self, placement: tuple[int, ...], local_bsz: float, accum: int = 1) -> float:
        """Seconds per optimizer step with ``accum`` micro-batches per step."""
        step, sync = self.step_sync_time(placement, local_bsz)
        return step + (max(1, accum) - 1) * (step - sync)

    # --------------------------------------------------------------------- efficiency
    def epoch_at(self, progress: float, scale: float = 1.0) -> int:
        """The epoch (0-based) that ``progress`` falls in, capped at ``max_epochs - 1``, with
        every epoch ``scale`` x as long (``SimConfig.work_scale``, the emulation's ``--scale``);
        the end of epoch ``e`` belongs to ``e + 1``."""
        e = bisect.bisect_right(self._scaled_ends(scale), progress)   # np.searchsorted "right"
        return min(e, self.max_epochs - 1)

    def epoch_end(self, epoch: int, scale: float = 1.0) -> float:
        """Progress at the end of ``epoch`` (0-based), epochs ``scale`` x as long."""
        return self._scaled_ends(scale)[epoch]

    @cache  # noqa: B019 -- one Application per name lives for the process
    def _scaled_ends(self, scale: float) -> tuple[float, ...]:
        # one tuple per scale, so that epoch_at and epoch_end agree to the last bit (a segment
        # that ends at an epoch's end always moves into the next epoch); plain floats, as the
        # simulator asks for them in its inner loop
        return tuple((self._epoch_end * scale).tolist())

    @property
    def total_progress(self) -> float:
        """Progress at which the job is done."""
        return float(self._epoch_end[-1])

    @cache  # noqa: B019
    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """``(grad_sqr, grad_var)`` during ``epoch`` at global ``batch_size`` (interpolated
        between the measured batch sizes around it, clamped to their range)."""
        b = float(min(max(batch_size, self._bszs[0]), self._bszs[-1]))
        i = int(np.searchsorted(self._bszs, b))
        hi = int(self._bszs[min(i, len(self._bszs) - 1)])
        lo = int(self._bszs[max(0, i - 1)]) if self._bszs[min(i, len(self._bszs) - 1)] != b else hi
        e = min(epoch, self.max_epochs - 1)
        vlo, vhi = self._val[lo], self._val[hi]
        if lo == hi:
            return float(vlo["grad_sqr"][e]), float(vlo["grad_var"][e])
        w = (b - lo) / (hi - lo)
        return (float((1 - w) * vlo["grad_sqr"][e] + w * vhi["grad_sqr"][e]),
                float((1 - w) * vlo["grad_var"][e] + w * vhi["grad_var"][e]))

    def gain(self, batch_size: float, epoch: int) -> float:
        """Progress per optimizer step at global ``batch_size`` in ``epoch`` (1 at M0):
        :func:`hpcsched.perf.pollux.gain` of the measured statistics."""
        sqr, var = self.grad_stats(batch_size, epoch)
        return pollux.gain(sqr, var, batch_size / self.init_batch_size)


class _ScaledNearest:
    """Nearest measured point with every axis scaled to [0, 1] (nodes, replicas and local batch
    have very different ranges)."""

    def __init__(self, xs: np.ndarray, ys: np.ndarray, scale: np.ndarray):
        from scipy.interpolate import NearestNDInterpolator  # as in Application._linear

        self._scale = np.where(scale > 0, scale, 1.0)
        self._nn = NearestNDInterpolator(xs / self._scale, ys)

    def __call__(self, q: np.ndarray) -> np.ndarray:
        return self._nn(q / self._scale)


@cache
def application(name: str) -> Application:
    """The shared, cached :class:`Application` for ``name``.

    Raises:
        PhysicsError: unknown application.
    """
    return Application(name)


@dataclass(frozen=True)
class FixedWork:
    """A job with a fixed amount of work (PAL/Blox traces): ``iterations`` steps of
    ``iteration_time`` seconds each on median GPUs of one node."""

    iterations: float
    iteration_time: float

    def step_time(self, n_nodes: int, slowdown: float, locality_penalty: float) -> float:
        """Seconds per step on ``n_nodes`` nodes whose slowest GPU is ``slowdown`` x median."""
        return self.iteration_time * slowdown * (locality_penalty if n_nodes > 1 else 1.0)


def draw_gpu_slowdowns(n_gpus: int, classes: tuple[str, ...], seed: int,
                       source: Path = LONGHORN, stat: str = "max") -> np.ndarray:
    """Per-GPU slowdown multipliers (>= 0, 1 = median GPU, > 1 slower), shape
    ``(n_gpus, len(classes))``, drawn from the TACC Longhorn measurements of PAL (Jain et al.,
    SC'24; ``hpcsched/data/pal/SOURCE.md``) by inverse-transform sampling of each class's
    quantiles. One uniform draw per GPU is shared by all classes (a GPU that is slow for one
    class tends to be slow for the others, as in PAL's 32-GPU measurements); the classes are
    PAL's ``A``..``D`` (``B`` and ``C`` share BERT's measurements).

    Raises:
        PhysicsError: a class not in the measurements.
    """
    data = json.loads(source.read_text())
    probs = np.array(data["probabilities"], dtype=float)
    rng = np.random.default_rng(seed)
    u = rng.random(n_gpus)
    out = np.ones((n_gpus, len(classes)))
    for j, c in enumerate(classes):
        key = c.removeprefix("class")
        table = data["classes"].get(key)
        if table is None:
            raise PhysicsError(f"no Longhorn measurements for class {c!r} "
                               f"(known: {', '.join(sorted(data['classes']))})")
        out[:, j] = np.interp(u, probs, np.array(table[stat], dtype=float))
    return out


def pal_gpu_slowdowns(n_gpus: int, classes: tuple[str, ...], seed: int,
                      profile: str = "runs") -> np.ndarray:
    """Per-GPU, per-class slowdown multipliers (1 = median, > 1 slower), shape
    ``(n_gpus, len(classes))``, assigned as PAL's simulator assigns them (Jain et al., SC'24;
    ``github.com/hal-uw/blox-pal``, branch ``artifact``, ``blox/cluster_state.py``).

    ``profile="runs"`` (PAL's simulator): the simulated GPUs' UUIDs (``"0"``..``"3"`` per node, or
    the GPU number) are not Longhorn UUIDs, so ``ClusterState._get_machine_slowdowns`` falls back,
    for every GPU in order and every class in ``profiles.json`` order (A, B, C, D), to
    ``random.choice`` over all Longhorn runs of the class's file, each run's ``perf`` divided by
    the median ``perf`` of the file (``longhorn-run-slowdowns.json``; B and C both sample BERT,
    independently). Classes are independent of each other, unlike :func:`draw_gpu_slowdowns`.
    The draws use Python's :class:`random.Random` seeded with ``seed`` in PAL's order, so
    ``seed=42`` (what PAL's ``ClusterState`` seeds) gives the cluster PAL simulated, GPU for GPU.

    ``profile="32gpu"``: ``32gpu-variability.csv`` (PAL's measured 8-node x 4-GPU cluster) row
    ``i mod 32`` for GPU ``i`` (nodes repeat every 8). PAL's ``_get_sim_slowdowns`` reads this file
    by GPU number but is never called, and would fail past GPU 31; tiling is our extension.
    ``seed`` is unused there.

    Departure (both): none in the values; the classes asked for are picked out afterwards, so the
    draws do not depend on ``classes``.

    Raises:
        PhysicsError: negative ``n_gpus``, a class other than ``A``..``D`` (``classA`` accepted),
            or an unknown ``profile``.
    """
    if n_gpus < 0:
        raise PhysicsError(f"n_gpus must be >= 0, got {n_gpus}")
    cols = []
    for c in classes:
        key = str(c).removeprefix("class")
        if key not in PAL_CLASS_ORDER:
            raise PhysicsError(f"no PAL profile for class {c!r} (known: {', '.join(PAL_CLASS_ORDER)})")
        cols.append(PAL_CLASS_ORDER.index(key))
    if profile == "runs":
        runs = _pal_runs()
        rng = random.Random(seed)
        full = np.array([[rng.choice(runs[c]) for c in PAL_CLASS_ORDER] for _ in range(n_gpus)],
                        dtype=float).reshape(n_gpus, len(PAL_CLASS_ORDER))
    elif profile == "32gpu":
        table = _pal_32gpu()
        full = table[np.arange(n_gpus) % len(table)]
    else:
        raise PhysicsError(f"unknown PAL profile {profile!r} (known: runs, 32gpu)")
    return full[:, cols]


@cache
def _pal_runs() -> dict[str, tuple[float, ...]]:
    data = json.loads(LONGHORN_RUNS.read_text())
    return {c: tuple(float(x) for x in data["classes"][c]) for c in PAL_CLASS_ORDER}


@cache
def _pal_32gpu() -> np.ndarray:
    rows = sorted(_read_csv(PAL_32GPU), key=lambda r: int(r["GPU_ID"]))
    return np.array([[float(r[f"PerfVar_class{c}"]) for c in PAL_CLASS_ORDER] for r in rows])
