"""Per-GPU performance variability, after PAL (Jain et al., "PAL: A Variability-Aware Policy for
Scheduling ML Workloads in GPU Clusters", SC'24; arXiv:2408.11919).

PAL's observation (§II-§III of the paper): identical GPUs run the same kernel at different speeds,
the spread depends on the application (ResNet-50-like compute-bound training suffers most,
PageRank-like memory-bound work hardly at all), and a data-parallel job runs at the pace of its
slowest GPU. PAL therefore keeps, per *application class*, a slowdown multiplier per GPU
(1 = median GPU, > 1 = slower), bins the GPUs of each class with K-Means, and lets the classes
that are most sensitive to variability choose GPUs first (§III, design). This module holds the
data side of that:

* :func:`load_pal_profiles` -- the 32-GPU per-class multipliers PAL's artifact simulates with
  (``32gpu-variability.csv``, 8 nodes x 4 V100, classes ``A``..``D``), shipped in
  ``hpcsched/data/pal`` with its MIT licence;
* :func:`load_slowdown_quantiles` / :func:`draw_gpu_views` -- per-class distributions of per-GPU
  slowdown measured on TACC Longhorn (336 / 136 / 172 GPUs), for simulated clusters of any size;
* :func:`bin_gpus` -- PAL's K-Means binning, with ``k`` chosen by the best mean silhouette;
* :func:`sensitivity` -- how much a class suffers from variability, which orders the classes;
* :func:`gpu_views` / :func:`profiles_from_views` -- to and from the snapshot's
  :class:`~hpcsched.policies.snapshot.GPUView`.

Everything here is pure and deterministic: file reads only in the ``load_*`` functions (called by
the daemon or simulator, never by a policy), randomness only from a seed.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcsched.policies.snapshot import GPUView

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "pal"
PROFILES_CSV = DATA_DIR / "32gpu-variability.csv"
QUANTILES_JSON = DATA_DIR / "longhorn-slowdown-quantiles.json"

#: PAL's application classes, most variability-sensitive first (A = ResNet-50-like,
#: B/C = BERT-like, D = insensitive, PageRank-like).
PAL_CLASSES = ("A", "B", "C", "D")

GPUKey = tuple[int, int]          # (measured node id, local GPU index) in the 32-GPU data
Profiles = Mapping[str, Mapping]  # app class -> {gpu key -> slowdown multiplier}


# PAL's variability class of each Pollux application (PAL: A = ResNet-50-like convolutional
# nets, the most sensitive; B/C = BERT-like; D = insensitive), so a job named by its application
# (which also selects its throughput prior) is placed by its class.
APP_CLASSES = {"imagenet": "A", "cifar10": "A", "yolov3": "A", "bert": "B", "deepspeech2": "B",
               "ncf": "D"}


def class_key(app_class: str) -> str:
    """PAL's ``classA`` and our ``A`` name the same class: strip a leading ``class``; a Pollux
    application name (``cifar10``) stands for its class (:data:`APP_CLASSES`)."""
    mapped = APP_CLASSES.get(app_class.strip().lower())
    if mapped is not None:
        return mapped
    return app_class[5:] if app_class.startswith("class") and len(app_class) > 5 else app_class


# --------------------------------------------------------------------------- data

def load_pal_profiles(path: str | Path | None = None) -> dict[str, dict[GPUKey, float]]:
    """Per-class, per-GPU slowdown multipliers of PAL's 32-GPU cluster.

    Reads ``32gpu-variability.csv`` (blox-pal artifact; columns ``Node_ID``, ``Local_GPU_ID``,
    ``PerfVar_classA`` .. ``PerfVar_classD``). Returns ``{"A": {(node, gpu): multiplier, ...},
    ...}``, multiplier > 1 = slower than the median GPU. Any ``PerfVar_<class>`` column is read,
    so a file with other classes works too.
    """
    p = Path(path) if path is not None else PROFILES_CSV
    out: dict[str, dict[GPUKey, float]] = {}
    with p.open(newline="") as fh:
        for row in csv.DictReader(fh):
            key = (int(row["Node_ID"]), int(row["Local_GPU_ID"]))
            for col, val in row.items():
                if col and col.startswith("PerfVar_") and val not in (None, ""):
                    out.setdefault(class_key(col[len("PerfVar_"):]), {})[key] = float(val)
    return {c: dict(sorted(v.items())) for c, v in sorted(out.items())}


def load_slowdown_quantiles(path: str | Path | None = None, statistic: str = "max"
                            ) -> dict[str, tuple[float, ...]]:
    """Per-class quantiles (0, 1, ..., 100 %) of per-GPU slowdown measured on TACC Longhorn.

    ``statistic`` says how a GPU's repeated runs were reduced to one value before dividing by
    the median GPU: ``"max"`` (its slowest run -- what PAL's artifact uses for its simulated
    GPUs, ``blox/cluster_state.py``) or ``"median"`` (its typical run; a lighter tail).
    """
    p = Path(path) if path is not None else QUANTILES_JSON
    doc = json.loads(p.read_text())
    return {c: tuple(float(q) for q in e[statistic]) for c, e in sorted(doc["classes"].items())}


def draw_gpu_views(nodes: Sequence[str], gpus_per_node: int, seed: int = 0,
                   quantiles: Mapping[str, Sequence[float]] | None = None) -> tuple[GPUView, ...]:
    """A simulated cluster's GPUs with slowdowns drawn from measured per-class distributions.

    Each GPU draws, per class, ``u ~ U(0, 1)`` and takes the inverse of the empirical CDF given
    by ``quantiles`` (default: :func:`load_slowdown_quantiles`), linearly interpolated. Classes
    with identical quantiles (PAL's B and C share the BERT measurements) share the draw; other
    classes draw independently, since the 32-GPU data shows a GPU slow for one class need not
    be slow for another. Deterministic for a seed.
    """
    q = dict(quantiles) if quantiles is not None else load_slowdown_quantiles()
    rng = np.random.default_rng(seed)
    classes = sorted(q)
    n = len(nodes) * max(0, gpus_per_node)
    draws: dict[tuple[float, ...], np.ndarray] = {}
    values: dict[str, np.ndarray] = {}
    for c in classes:
        qs = tuple(float(v) for v in q[c])
        if qs not in draws:
            u = rng.random(n)
            draws[qs] = np.interp(u, np.linspace(0.0, 1.0, len(qs)), qs)
        values[c] = draws[qs]
    out = []
    for i, name in enumerate(nodes):
        for j in range(max(0, gpus_per_node)):
            g = i * gpus_per_node + j
            out.append(GPUView(name, j, tuple((c, float(values[c][g])) for c in classes)))
    return tuple(out)


def gpu_views(profiles: Profiles, nodes: Sequence[str], gpus_per_node: int) -> tuple[GPUView, ...]:
    """Map measured GPUs onto a cluster's node names, deterministically.

    Cluster node ``i`` (in the order given) takes measured node ``i mod M`` (measured nodes in
    ascending id order, ``M`` of them) and its GPU ``j`` takes that node's ``j mod m``-th
    measured GPU (ascending local index). A cluster larger than the measurements therefore
    repeats their pattern; use :func:`draw_gpu_views` for a fresh draw instead. Classes missing
    for a GPU are left out of its ``slowdown`` (``GPUView.slowdown_for`` then gives 1.0).
    """
    keys = sorted({k for per in profiles.values() for k in per})
    by_node: dict[object, list] = {}
    for k in keys:
        by_node.setdefault(k[0], []).append(k)
    measured = sorted(by_node)
    classes = sorted(profiles)
    out = []
    if not measured:
        return tuple(GPUView(name, j) for name in nodes for j in range(max(0, gpus_per_node)))
    for i, name in enumerate(nodes):
        local = by_node[measured[i % len(measured)]]
        for j in range(max(0, gpus_per_node)):
            key = local[j % len(local)]
            out.append(GPUView(name, j, tuple((c, float(profiles[c][key]))
                                              for c in classes if key in profiles[c])))
    return tuple(out)


def profiles_from_views(gpus: Sequence[GPUView]) -> dict[str, dict[tuple[str, int], float]]:
    """The snapshot's GPUs as profiles: ``{class: {(node, index): slowdown}}``."""
    out: dict[str, dict[tuple[str, int], float]] = {}
    for g in gpus:
        for c, v in g.slowdown:
            out.setdefault(c, {})[(g.node, g.index)] = float(v)
    return out


# --------------------------------------------------------------------------- sensitivity

def sensitivity(app_class: str, profiles: Profiles) -> float:
    """How much ``app_class`` suffers from GPU variability: ``p95 / p50 - 1`` of its per-GPU
    slowdowns, i.e. how much slower than the median GPU the slowest 5 % of GPUs run it
    (0 when unmeasured or fewer than two GPUs).

    PAL (§III) lets the most sensitive classes choose GPUs first. A data-parallel job runs at
    its slowest GPU's pace, so the upper tail is what placement protects a job from; a
    quantile rather than the maximum or the coefficient of variation keeps one broken GPU
    (Longhorn has ResNet runs at 3.4x) from deciding the order alone, and the upper tail rather
    than the p5..p95 spread keeps a few *fast* GPUs (Longhorn's PageRank GPUs have a 0.97 group)
    from ranking an insensitive class above a sensitive one. Shipped data: 32-GPU file
    A 0.11 > B = C 0.057 > D 0.001; Longhorn A 0.21 > B = C 0.013 > D 0.003 -- PAL's order.
    """
    per = profiles.get(app_class)
    if per is None:
        per = profiles.get(class_key(app_class)) or profiles.get("class" + app_class)
    if not per or len(per) < 2:
        return 0.0
    x = np.fromiter(per.values(), dtype=float)
    p50, p95 = np.quantile(x, [0.5, 0.95])
    return max(0.0, float(p95 / p50 - 1.0)) if p50 > 0 else 0.0


# --------------------------------------------------------------------------- binning

@dataclass(frozen=True)
class Binning:
    """GPUs of one class binned by slowdown (PAL §III: K-Means over per-GPU variability).

    Attributes:
        labels: bin of each input GPU, in input order; bin 0 is the fastest.
        centres: mean slowdown of each bin, ascending (fastest first).
        k: number of bins (``len(centres)``).
        silhouettes: ``(k, mean silhouette)`` for every ``k`` considered on the inliers.
        outliers: input positions of GPUs treated as outliers (binned apart, see :func:`bin_gpus`).
    """

    labels: tuple[int, ...]
    centres: tuple[float, ...]
    k: int
    silhouettes: tuple[tuple[int, float], ...] = ()
    outliers: tuple[int, ...] = ()

    @property
    def silhouette(self) -> dict[int, float]:
        return dict(self.silhouettes)

    def bin_of(self, slowdown: float) -> int:
        """The bin whose centre is nearest to ``slowdown`` (ties: the faster bin)."""
        if not self.centres:
            return 0
        c = np.asarray(self.centres)
        return int(np.argmin(np.abs(c - slowdown)))


def silhouette_1d(x: Sequence[float], labels: Sequence[int]) -> float:
    """Mean silhouette coefficient of a 1-D clustering (Rousseeuw 1987), absolute distance.

    ``s(i) = (b - a) / max(a, b)`` with ``a`` the mean distance to the other members of ``i``'s
    cluster and ``b`` the least mean distance to another cluster's members; ``s = 0`` for a
    point alone in its cluster (as scikit-learn does). O(k n log n) via sorted prefix sums,
    so it stays cheap for thousands of GPUs. Needs at least two clusters.
    """
    xv = np.asarray(x, dtype=float)
    lab = np.asarray(labels)
    ks = np.unique(lab)
    if len(ks) < 2:
        raise ValueError("silhouette needs at least two clusters")
    sums = np.empty((len(ks), len(xv)))
    sizes = np.empty(len(ks))
    for r, c in enumerate(ks):
        s = np.sort(xv[lab == c])
        pre = np.concatenate(([0.0], np.cumsum(s)))
        m = np.searchsorted(s, xv, side="right")
        sums[r] = xv * m - pre[m] + (pre[-1] - pre[m]) - xv * (len(s) - m)
        sizes[r] = len(s)
    own = np.searchsorted(ks, lab)
    idx = np.arange(len(xv))
    own_size = sizes[own]
    a = np.where(own_size > 1, sums[own, idx] / np.maximum(own_size - 1, 1), 0.0)
    mean_other = sums / sizes[:, None]
    mean_other[own, idx] = np.inf
    b = mean_other.min(axis=0)
    den = np.maximum(a, b)
    s = np.where((own_size > 1) & (den > 0), (b - a) / np.where(den > 0, den, 1.0), 0.0)
    return float(s.mean())


def _kmeans_1d(x: np.ndarray, k: int, rng: np.random.Generator, n_init: int = 8,
               max_iter: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means on 1-D data with k-means++ seeding, best of ``n_init`` by inertia.

    Returns ``(labels, centres)`` with centres ascending and labels indexing them. Assignment
    is by the midpoints between sorted centres, so equal values always share a label. An
    emptied cluster is re-seeded at the point farthest from its centre.
    """
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for _ in range(n_init):
        c = np.empty(k)
        c[0] = x[rng.integers(len(x))]
        for i in range(1, k):
            d2 = np.min((x[:, None] - c[None, :i]) ** 2, axis=1)
            tot = d2.sum()
            c[i] = x[rng.choice(len(x), p=d2 / tot)] if tot > 0 else x[rng.integers(len(x))]
        lab = np.zeros(len(x), dtype=int)
        for _it in range(max_iter):
            c = np.sort(c)
            lab = np.searchsorted((c[:-1] + c[1:]) / 2.0, x, side="left")
            cnt = np.bincount(lab, minlength=k)
            new = np.bincount(lab, weights=x, minlength=k) / np.maximum(cnt, 1)
            new = np.where(cnt > 0, new, c)
            if (cnt == 0).any():
                far = np.argsort(-(x - c[lab]) ** 2, kind="stable")
                for e, p in zip(np.flatnonzero(cnt == 0), far):
                    new[e] = x[p]
            if np.array_equal(np.sort(new), c):
                break
            c = new
        c = np.sort(c)
        lab = np.searchsorted((c[:-1] + c[1:]) / 2.0, x, side="left")
        used = np.unique(lab)                      # drop clusters left empty at the end
        cent = np.array([x[lab == u].mean() for u in used])
        lab = np.searchsorted(used, lab)
        inertia = float(((x - cent[lab]) ** 2).sum())
        if best is None or inertia < best[0] - 1e-15:
            best = (inertia, lab, cent)
    assert best is not None
    return best[1], best[2]


def bin_gpus(slowdowns: Sequence[float], k_max: int = 6, seed: int = 0, *,
             outlier_sigma: float | None = 3.0, tolerance: float = 0.005,
             n_init: int = 8) -> Binning:
    """Bin one class's per-GPU slowdowns with K-Means; ``k`` by the best mean silhouette.

    PAL §III clusters each class's per-GPU variability with K-Means and picks ``k`` by the
    silhouette score. Here:

    * ``k`` ranges over ``2 .. min(k_max, distinct values)`` and the one with the highest mean
      silhouette (:func:`silhouette_1d`) wins, ties to the smaller ``k``. (The artifact's
      ``get_optimal_k`` returns from inside its loop after ``k = 2``, so it always picks 2.)
    * ``tolerance`` is measurement noise, relative to the median: all values within it -> one
      bin (PAL's insensitive class D spans 0.2 % on the 32 GPUs); a ``k`` whose bin centres
      come closer than it is not considered (0.1 % apart is not two speeds, though a
      silhouette on exactly repeated values would call it perfect).
    * Degenerate inputs: no GPUs -> no bins; one distinct value -> one bin; ``k`` never
      exceeds the number of distinct values.
    * Outliers, as in the artifact: GPUs slower than ``mean + outlier_sigma * std`` are left
      out when choosing ``k`` for the rest, then binned apart among themselves (one bin if they
      are alike), so a 3x-slow GPU gets its own bin instead of forcing every other GPU into
      one. ``outlier_sigma=None`` turns this off.

    Deterministic for a seed (k-means++ seeding, ``n_init`` restarts per ``k``, the lowest
    inertia kept). Bins are numbered fastest first.
    """
    x = np.asarray(slowdowns, dtype=float)
    n = len(x)
    if n == 0:
        return Binning((), (), 0)
    if not np.all(np.isfinite(x)):
        raise ValueError("slowdowns must be finite")
    med = float(np.median(x))
    if np.ptp(x) == 0 or (med > 0 and np.ptp(x) / med <= tolerance):
        return Binning(tuple([0] * n), (float(x.mean()),), 1)

    out_mask = np.zeros(n, dtype=bool)
    if outlier_sigma is not None and n >= 3:
        out_mask = x > x.mean() + outlier_sigma * x.std(ddof=1)
    inl = x[~out_mask]

    sil: list[tuple[int, float]] = []
    distinct = len(np.unique(inl))
    if distinct < 2 or (np.ptp(inl) / max(float(np.median(inl)), 1e-300) <= tolerance):
        lab_in, cent_in = np.zeros(len(inl), dtype=int), np.array([inl.mean()])
    else:
        best: tuple[float, np.ndarray, np.ndarray] | None = None
        for k in range(2, min(k_max, distinct) + 1):
            lab, cent = _kmeans_1d(inl, k, np.random.default_rng([seed, k]), n_init=n_init)
            if len(cent) < 2 or np.min(np.diff(cent)) <= tolerance * float(np.median(inl)):
                continue   # two bins closer than the noise tolerance are not two speeds
            score = silhouette_1d(inl, lab)
            sil.append((k, round(score, 12)))
            if best is None or score > best[0] + 1e-12:
                best = (score, lab, cent)
        if best is None:   # k_max < 2: a single bin
            lab_in, cent_in = np.zeros(len(inl), dtype=int), np.array([inl.mean()])
        else:
            lab_in, cent_in = best[1], best[2]

    centres = list(cent_in)
    labels = np.zeros(n, dtype=int)
    labels[~out_mask] = lab_in
    if out_mask.any():
        sub = bin_gpus(x[out_mask], k_max, seed, outlier_sigma=None, tolerance=tolerance,
                       n_init=n_init)
        labels[out_mask] = np.asarray(sub.labels) + len(centres)
        centres.extend(sub.centres)
    order = np.argsort(centres, kind="stable")
    rank = np.empty(len(order), dtype=int)
    rank[order] = np.arange(len(order))
    return Binning(labels=tuple(int(v) for v in rank[labels]),
                   centres=tuple(float(centres[i]) for i in order),
                   k=len(centres), silhouettes=tuple(sil),
                   outliers=tuple(int(i) for i in np.flatnonzero(out_mask)))
