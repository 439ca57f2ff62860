"""PAL's binning of GPUs by speed (Jain et al., "PAL: A Variability-Aware Policy for Scheduling
ML Workloads in GPU Clusters", SC'24, §III): per application class, K-Means over the per-GPU
slowdowns, ``k`` chosen by the best mean silhouette, so GPUs in one bin count as equally fast.

Pure and deterministic: randomness (k-means++ seeding) only from a seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


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


def silhouette_1d(x: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray) -> float:
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


def _bin_inliers(inl: np.ndarray, k_max: int, seed: int, tolerance: float, n_init: int
                 ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, float]]]:
    """K-Means of the slowdowns ``inl`` (outliers left out) for ``k`` in ``2 .. min(k_max,
    distinct values)``, the best mean silhouette kept (ties to the smaller ``k``; a ``k``
    whose centres come within ``tolerance`` of the median apart skipped): ``(labels,
    centres, silhouettes)``, centres ascending, ``silhouettes`` the ``(k, score)`` of each
    ``k`` tried. One bin when the values are alike within ``tolerance`` or no ``k`` is left."""
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
    return lab_in, cent_in, sil


def bin_gpus(slowdowns: Sequence[float] | np.ndarray, k_max: int = 6, seed: int = 0, *,
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

    lab_in, cent_in, sil = _bin_inliers(inl, k_max, seed, tolerance, n_init)

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


@lru_cache(maxsize=64)
def bin_gpus_cached(slowdowns: tuple[float, ...], seed: int = 0) -> Binning:
    """:func:`bin_gpus` with its defaults, remembered per ``(slowdowns, seed)``: the GPUs'
    measurements change rarely, and a placement stage bins them every round for every class
    (uncached, K-Means dominated a simulation's time: docs/design-notes.md,
    "policies/placement/binning.py"). ``slowdowns`` is a tuple (hashable); the
    :class:`Binning` returned is frozen and shared."""
    return bin_gpus(slowdowns, seed=seed)
