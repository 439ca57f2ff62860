"""What an application's jobs measured on this cluster: the prior's error, per configuration.

Pollux fits each job's step-time model to that job's own measurements (OSDI'21 §3.2, §4.1): a
job knows the few configurations it has run, and its model guesses the rest. On one cluster
every job of an application runs the same code on the same hardware, so each configuration one
of them measured says how far the application's shipped prior (:mod:`hpcsched.perf.priors`,
fitted to the Pollux traces' T4 GPUs) is off there for all of them. This module keeps that
error, and :func:`hpcsched.perf.model.model_for` predicts a job's step time at configuration
``c`` as::

    t(c) = s_j * prior(c) * exp(e_app(c))

``prior(c)``: the prior's step time (:func:`hpcsched.perf.pollux.step_time`); ``e_app(c)``: the
steps-weighted mean of ``log(measured / prior)`` over every measurement of the application at
``c``'s nodes x GPUs and local batch size to the nearest power of 2, else at its nodes x GPUs,
else 0 (:meth:`StepCorrections.log_factor`); ``s_j``: the job's own scale, the geometric mean
of its measured / corrected-prior step times (1 before it has measured: the application's
measurements, then the prior, predict it).

Against the per-job fit (``fitted``: Pollux's seven-parameter model fitted to a job's few
points, far off at GPU counts it has not run, ``docs/evaluation.md`` section 6) this gives
``jct`` a lower average JCT in the simulator (measured: docs/design-notes.md, "perf/shared.py").

The error is rounded to :data:`RESOLUTION` in log space, so a table (and the cached models built
on it) changes only when a mean moves by more than about 0.1%.

Where it is built: the daemon from every job's profile in its store
(:meth:`hpcsched.daemon.store.Store.application_profile`), the simulator from every job's
measured steps; both with :func:`step_corrections`. Units: seconds, GPUs, samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from hpcsched.perf import pollux, priors

RESOLUTION = 1e-3     # log-space rounding of a mean error (about 0.1%)
#: how the policies predict step times: ``"shared"``, the prior corrected by what every job of
#: the application measured here and scaled to the job's own (this module; the default);
#: ``"fitted"``, Pollux's model fitted to the job's own measurements alone (OSDI'21 §3.2)
THROUGHPUT_MODELS = ("shared", "fitted")


@dataclass(frozen=True)
class Measured:
    """One configuration measured by jobs of an application: mean seconds per optimizer step
    over ``steps`` steps (all jobs together)."""

    nodes: int
    world_size: int
    local_batch_size: int
    accumulation_steps: int
    step_time: float
    steps: float


@dataclass(frozen=True)
class StepCorrections:
    """An application's measured error of its prior, per configuration class (module
    docstring). ``fine``: ``((nodes, GPUs, round(log2 local batch)), mean log error)``;
    ``coarse``: ``((nodes, GPUs), mean log error)``; both sorted. Hashable (its hash is computed
    once: policies key their caches on the models built on it)."""

    application: str
    fine: tuple[tuple[tuple[int, int, int], float], ...] = ()
    coarse: tuple[tuple[tuple[int, int], float], ...] = ()
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.application, self.fine, self.coarse)))

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _fine(self) -> dict[tuple[int, int, int], float]:
        return dict(self.fine)

    @cached_property
    def _coarse(self) -> dict[tuple[int, int], float]:
        return dict(self.coarse)

    def log_factor(self, nodes: int, world_size: int, local_batch_size: float) -> float:
        """``e_app(c)``: the mean ``log(measured / prior)`` step time at this configuration
        class, 0 where the application has measured nothing like it."""
        return self._log_at(int(nodes), int(world_size), _octave(local_batch_size))

    def _log_at(self, nodes: int, world_size: int, octave: int) -> float:
        """The fine class's error, else the coarse one's, else 0."""
        e = self._fine.get((nodes, world_size, octave))
        return self._coarse.get((nodes, world_size), 0.0) if e is None else e

    def factor(self, nodes: int, world_size: int, local_batch_size: float) -> float:
        """``exp(e_app(c))``: measured / prior step time expected at this configuration."""
        return self.factor_at(int(nodes), int(world_size), _octave(local_batch_size))

    @cached_property
    def _memo(self) -> dict[tuple[int, int, int], float]:
        return {}

    def factor_at(self, nodes: int, world_size: int, octave: int) -> float:
        """:meth:`factor` with the local batch size given as its octave
        (``round(log2(local))``), remembered: a policy asks for the same classes for every
        candidate configuration of every job each round."""
        key = (nodes, world_size, octave)
        f = self._memo.get(key)
        if f is None:
            f = self._memo[key] = math.exp(self._log_at(nodes, world_size, octave))
        return f

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(fine keys, their factors, coarse keys, their factors)``, keys packed by
        :func:`_packed` and sorted; the factors are ``math.exp`` of the means, as
        :meth:`factor_at` gives them."""
        out = []
        for table, width in ((self.fine, 3), (self.coarse, 2)):
            cls = np.array([k for k, _ in table], dtype=np.int64).reshape(len(table), width)
            keys = _packed(cls[:, 0], cls[:, 1], cls[:, 2] if width == 3 else 0)
            vals = np.array([math.exp(e) for _, e in table], dtype=float)
            order = np.argsort(keys)
            out += [keys[order], vals[order]]
        return tuple(out)

    def factors(self, nodes: np.ndarray, world_size: np.ndarray, local_batch_size: np.ndarray
                ) -> np.ndarray:
        """:meth:`factor` over arrays of one shape, the same values (the fine class, else the
        coarse one, else 1): a policy asks for every candidate of every job."""
        nodes = np.asarray(nodes, dtype=np.int64)
        world_size = np.asarray(world_size, dtype=np.int64)
        octave = _octaves(local_batch_size)
        fine_k, fine_v, coarse_k, coarse_v = self._arrays
        out = np.ones(np.shape(nodes))
        for keys, vals, packed in (
                (coarse_k, coarse_v, _packed(nodes, world_size, 0)),
                (fine_k, fine_v, _packed(nodes, world_size, octave))):    # fine overrides
            if keys.size:
                i = np.minimum(np.searchsorted(keys, packed), keys.size - 1)
                hit = keys[i] == packed
                out = np.where(hit, vals[i], out)
        return out


def _packed(nodes, world_size, octave):
    """One integer per configuration class, ordered as the ``(nodes, GPUs, octave)`` tuples
    (octave in ``[0, 64)``, GPUs below 65,536); works on ints and on integer arrays."""
    return (np.asarray(nodes, dtype=np.int64) * 65536 + world_size) * 64 + octave


def _octave(local_batch_size: float) -> int:
    """The local batch size to the nearest power of 2, as its exponent."""
    return int(round(math.log2(max(float(local_batch_size), 1.0))))


def _octaves(local_batch_size: np.ndarray) -> np.ndarray:
    """:func:`_octave` over an array (``np.rint`` rounds half to even, as ``round`` does)."""
    return np.rint(np.log2(np.maximum(np.asarray(local_batch_size, dtype=float), 1.0))
                   ).astype(np.int64)


def step_corrections(application: str, measured: Iterable[Measured]) -> StepCorrections | None:
    """The table of ``application`` from its jobs' measurements; ``None`` when it has no
    shipped prior (its jobs use the linear model, :mod:`hpcsched.perf.linear`). Measurements
    with a non-positive or non-finite step time or weight, or an impossible size, are skipped.
    """
    prior = priors.prior_for(application)
    if prior is None:
        return None
    fine: dict[tuple[int, int, int], list[float]] = {}
    coarse: dict[tuple[int, int], list[float]] = {}
    for m in measured:
        err = _error(prior, m)
        if err is None:
            continue
        for acc in (fine.setdefault(_fine_key(m.nodes, m.world_size, m.local_batch_size), [0.0, 0.0]),
                    coarse.setdefault((m.nodes, m.world_size), [0.0, 0.0])):
            acc[0] += err * m.steps
            acc[1] += m.steps
    return StepCorrections(priors.application_key(application), _means(fine), _means(coarse))


def _fine_key(nodes: int, world_size: int, local_batch_size: float) -> tuple[int, int, int]:
    return nodes, world_size, _octave(local_batch_size)


def _error(prior: pollux.PerfParams, m: Measured) -> float | None:
    """``log(measured / prior)`` step time of one measurement; ``None`` when it is skipped
    (:func:`step_corrections`)."""
    if not (m.steps > 0 and math.isfinite(m.steps) and m.step_time > 0
            and math.isfinite(m.step_time) and 1 <= m.nodes <= m.world_size
            and m.local_batch_size >= 1 and m.accumulation_steps >= 1):
        return None
    log_prior = _log_prior(prior, m.nodes, m.world_size, m.local_batch_size,
                           m.accumulation_steps)
    return None if log_prior is None else math.log(m.step_time) - log_prior


@lru_cache(maxsize=65536)
def _log_prior(prior: pollux.PerfParams, nodes: int, world_size: int, local_batch_size: int,
               accumulation_steps: int) -> float | None:
    t = pollux.step_time(prior, nodes, world_size, local_batch_size, accumulation_steps)
    return math.log(t) if t > 0 and math.isfinite(t) else None


class StepLedger:
    """Running totals of measured steps per application and configuration: what the simulator
    keeps where the daemon has its store (every job's measurements, finished jobs' included).
    Not thread-safe.

    :meth:`corrections` is :func:`step_corrections` of the totals, the same table to the bit,
    kept up to date incrementally: a call recomputes only the classes whose configurations
    were added to since the last one, and gives back the very table it gave before while no
    rounded mean has moved (so the models cached on it and its remembered factors stay). A
    simulation asks for every running application's table every round, and building them
    afresh took a large share of its time (measured: docs/design-notes.md, "perf/shared.py")."""

    def __init__(self) -> None:
        self._apps: dict[str, _AppTotals] = {}

    def add(self, application: str, nodes: int, world_size: int, local_batch_size: int,
            accumulation_steps: int, seconds: float, steps: float) -> None:
        """``steps`` optimizer steps that took ``seconds`` in all at this configuration."""
        app = priors.application_key(application)
        totals = self._apps.get(app)
        if totals is None:
            totals = self._apps[app] = _AppTotals(priors.prior_for(app))
        totals.add((nodes, world_size, local_batch_size, accumulation_steps), seconds, steps)

    def corrections(self, application: str) -> StepCorrections | None:
        """:func:`step_corrections` of everything recorded for ``application``."""
        name = priors.application_key(application)
        totals = self._apps.get(name)
        if totals is None:
            return step_corrections(application, ())
        return totals.table(name)


class _AppTotals:
    """One application's rows (``(nodes, GPUs, local batch, accumulation) -> [seconds,
    steps]``) and the rounded mean error of each class, recomputed for the classes of rows
    added to."""

    def __init__(self, prior: pollux.PerfParams | None) -> None:
        self.prior = prior
        self.rows: dict[tuple[int, int, int, int], list[float]] = {}
        self.errors: dict[tuple[int, int, int, int], float | None] = {}
        self.members: dict[tuple, list[tuple[int, int, int, int]]] = {}   # class -> its rows
        self.means: dict[tuple, float] = {}           # class -> its rounded mean error
        self.dirty: set[tuple[int, int, int, int]] = set()
        self.last: StepCorrections | None = None

    def add(self, row: tuple[int, int, int, int], seconds: float, steps: float) -> None:
        acc = self.rows.get(row)
        if acc is None:
            acc = self.rows[row] = [0.0, 0.0]
            for cls in _classes(row):
                self.members.setdefault(cls, []).append(row)
        acc[0] += seconds
        acc[1] += steps
        self.dirty.add(row)

    def table(self, name: str) -> StepCorrections | None:
        """The application's :class:`StepCorrections` (named ``name``): the rounded mean error
        of every fine and coarse class with a measured row, recomputed only for the classes
        of rows added to since the last call (the last table again when none changed);
        ``None`` without a prior."""
        if self.prior is None:
            return None
        if not self.dirty and self.last is not None:
            return self.last
        changed = self._update_means(self._refresh_errors(self.prior))
        if changed or self.last is None:
            self.last = StepCorrections(
                name, tuple(sorted((c, e) for c, e in self.means.items() if len(c) == 3)),
                tuple(sorted((c, e) for c, e in self.means.items() if len(c) == 2)))
        return self.last

    def _refresh_errors(self, prior: pollux.PerfParams) -> set[tuple[int, ...]]:
        """Recompute the error against ``prior`` of every row added to since the last table
        (``None`` for a row of no steps), mark none dirty, and return those rows' classes."""
        classes: set[tuple[int, ...]] = set()
        for row in self.dirty:
            secs, k = self.rows[row]
            self.errors[row] = _error(prior, Measured(*row, secs / k, k)) if k > 0 else None
            classes.update(_classes(row))
        self.dirty.clear()
        return classes

    def _update_means(self, classes: set[tuple[int, ...]]) -> bool:
        """Recompute the rounded mean error of each class in ``classes`` (weighted by steps,
        summed in the rows' order, as :func:`step_corrections` does; a class with no measured
        row has none); whether any changed."""
        changed = False
        for cls in classes:
            s = w = 0.0
            for row in self.members[cls]:
                if (err := self.errors[row]) is not None:
                    k = self.rows[row][1]
                    s += err * k
                    w += k
            mean = _rounded(s, w) if w else None
            if mean != self.means.get(cls):
                changed = True
                if mean is None:
                    del self.means[cls]
                else:
                    self.means[cls] = mean
        return changed


def _classes(row: tuple[int, int, int, int]) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """The fine and the coarse class of a ledger row ``(nodes, GPUs, local batch, accum)``."""
    return _fine_key(row[0], row[1], row[2]), row[:2]


def _rounded(total: float, weight: float) -> float:
    """A weighted mean, rounded to :data:`RESOLUTION`."""
    return round(total / weight / RESOLUTION) * RESOLUTION


def _means(table: dict) -> tuple:
    """``((class, mean rounded to RESOLUTION), ...)`` sorted, of ``{class: (sum, weight)}``."""
    return tuple((k, _rounded(s, w)) for k, (s, w) in sorted(table.items()))
