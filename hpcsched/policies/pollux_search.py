"""The evolutionary search of :mod:`hpcsched.policies.pollux`: allocation matrices of replicas
(GPUs) per node, their repair into what the cluster can hold, and the generalized-mean fitness.

A *state* is a ``(J, N)`` integer matrix: ``state[j, n]`` GPUs of job ``j`` on node ``n``; a
population is ``(P, J, N)``. Jobs are in priority order (fewest attained GPU-seconds first, as
AdaptDL's simulator sorts them), which decides who keeps a node's GPUs when a state asks for
more than it has. The operators follow Pollux (Qiao et al., OSDI'21, §4.2) as its artifact
implements them (github.com/petuum/adaptdl, branch ``osdi21-artifact``, ``simulator/pollux.py``,
``Problem._mutation``, ``_crossover``, ``_repair``, ``_evaluate``); the code here is our own:

* **mutation**: per job, with probability 0.1 its row is reset to the current allocation; with
  probability 0.1 each of its entries is zeroed with probability 0.1; then entries are raised
  at random (to a value between the entry and the node's GPUs) with a probability that spreads
  one expected raise over the nodes with free GPUs and one over those the job already uses.
  *Focused* (our default, a departure): a child raises the rows of about :data:`FOCUS` jobs,
  not of every job, and only into GPUs that are free in it. With the artifact's raises, every
  job of a child reaches for the same few free GPUs, the repair hands them to the jobs first in
  priority order and cuts the rest, and a child rarely gives a job without GPUs one (measured:
  docs/design-notes.md, "policies/pollux_search.py");
* **crossover**: single point over jobs: rows before a random job from one parent, the rest
  from the other (two children);
* **repair**: at most one distributed (multi-node) job per node (interference avoidance,
  §4.2); at most ``max_gpus`` GPUs and ``max_nodes`` nodes per job (cut on the nodes in a random
  order); node capacities, in job priority order; a job below its minimum gets nothing. At
  node granularity every used node holds exactly the job's workers per node.
* **fitness** (§4.1, eq. 4): the generalized (power) mean with exponent ``p`` of the jobs'
  speedups, each scaled by ``scale`` and, for a job whose row differs from its current one, by
  its restart factor; 1e-3 is added to each before the mean, as the artifact does, so a job
  with nothing counts (``p < 0``) as a very poor speedup rather than an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

EPS = 1e-3   # added to every scaled speedup before the power mean (the artifact's constant)
FOCUS = 4.0  # focused mutation: expected rows raised per child


@dataclass(frozen=True)
class Problem:
    """One round's search space. Shapes: J jobs (priority order), N nodes.

    Attributes:
        cap: (N,) GPUs each node may give the searched jobs.
        base: (J, N) the current allocation (zeros for pending jobs).
        unit: (J,) GPUs per used node at node granularity (the job's workers per node); 1 at
            GPU granularity (any count per node).
        whole: node granularity: a used node holds exactly ``unit`` GPUs.
        lo: (J,) fewest GPUs a job may run on (fewer: it gets none).
        hi: (J,) most GPUs a job may get this round.
        max_nodes: (J,) most nodes a job may span.
        factor: (J,) restart factor: a job whose row changes has its speedup scaled by it.
        scale: every speedup is scaled by it (nodes / GPUs, as the artifact).
        p: exponent of the power mean (-1: harmonic; 0: geometric).
        focused: the focused mutation (module docstring) instead of the artifact's.
    """

    cap: np.ndarray
    base: np.ndarray
    unit: np.ndarray
    whole: bool
    lo: np.ndarray
    hi: np.ndarray
    max_nodes: np.ndarray
    factor: np.ndarray
    scale: float
    p: float
    focused: bool = True


def power_mean(x: np.ndarray, p: float) -> np.ndarray:
    """Generalized mean over the last axis of ``x + EPS`` with exponent ``p`` (0: geometric).
    Pollux §4.1, eq. 4: ``FITNESS_p(A) = (1/J * sum_j SPEEDUP_j(A_j) ** p) ** (1/p)``."""
    x = np.asarray(x, dtype=float) + EPS
    if p == 0:
        return np.exp(np.log(x).mean(axis=-1))
    return np.mean(x ** p, axis=-1) ** (1.0 / p)


def fitness(prob: Problem, states: np.ndarray, speedup: Callable[[np.ndarray], np.ndarray]
            ) -> np.ndarray:
    """(P,) fitness of ``states`` (P, J, N); ``speedup(states)`` gives the (P, J) speedups."""
    s = speedup(states) * prob.scale
    moved = np.any(states != prob.base[None], axis=2)
    s = np.where(moved, s * prob.factor[None, :], s)
    return power_mean(s, prob.p)


def mutate(prob: Problem, states: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The artifact's three mutations (module docstring); returns a new array."""
    P, J, N = states.shape
    reset = rng.random((P, J)) < 0.1
    states = np.where(reset[..., None], prob.base[None], states)
    zero = (rng.random((P, J, N)) < 0.1) & (rng.random((P, J)) < 0.1)[..., None]
    states = np.where(zero, 0, states)
    free = prob.cap[None, :] - states.sum(axis=1)                       # (P, N)
    fits = free[:, None, :] >= prob.unit[None, :, None]                 # (P, J, N)
    p1 = fits / np.maximum(fits.sum(axis=2, keepdims=True), 1)
    used = fits & (states > 0)
    p2 = used / np.maximum(used.sum(axis=2, keepdims=True), 1)
    raise_ = rng.random((P, J, N)) < p1 + p2 - p1 * p2
    if prob.focused:        # about FOCUS rows raised per child, not every row
        raise_ &= (rng.random((P, J)) < min(1.0, FOCUS / J))[..., None]
    if prob.whole:
        value = np.broadcast_to(prob.unit[None, :, None], states.shape)
    else:
        low = np.minimum(states, prob.cap[None, None, :])
        top = np.broadcast_to(prob.cap[None, None, :], states.shape)
        if prob.focused:    # only into free GPUs
            top = np.minimum(top, states + np.maximum(free, 0)[:, None, :])
        value = rng.integers(low, top + 1)
    return np.where(raise_, value, states).astype(states.dtype)


def crossover(a: np.ndarray, b: np.ndarray, rng: np.random.Generator
              ) -> tuple[np.ndarray, np.ndarray]:
    """Single-point crossover over jobs of parents ``a`` and ``b`` (M, J, N): two children."""
    M, J, _ = a.shape
    first = (np.arange(J)[None, :] < rng.integers(0, J, size=(M, 1)))[..., None]
    return np.where(first, a, b), np.where(first, b, a)


def repair(prob: Problem, states: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``states`` (P, J, N) made feasible (module docstring); returns a new array."""
    states = np.maximum(states, 0)
    # at most one distributed job per node, the first in priority order keeps it
    spread = np.count_nonzero(states, axis=2) > 1
    on = (states > 0) & spread[..., None]
    states = np.where(on & (np.cumsum(on, axis=1) > 1), 0, states)
    if prob.whole:
        states = np.where(states > 0, prob.unit[None, :, None], 0)
    # at most hi GPUs and max_nodes nodes per job, cut on the nodes in a random order; only
    # the rows over a limit are cut (the others would come out unchanged), the random order is
    # drawn for every row all the same, so the generator's stream does not depend on them
    keys = rng.random(states.shape)
    over = ((states.sum(axis=2) > prob.hi[None, :])
            | (np.count_nonzero(states, axis=2) > prob.max_nodes[None, :]))
    if over.any():
        pi, ji = np.nonzero(over)
        rows = states[pi, ji]                                           # (R, N)
        order = np.argsort(keys[pi, ji], axis=1)
        s = np.take_along_axis(rows, order, axis=1)
        s = np.diff(np.minimum(np.cumsum(s, axis=1), prob.hi[ji, None]), axis=1, prepend=0)
        keep = np.diff(np.minimum(np.cumsum(s > 0, axis=1), prob.max_nodes[ji, None]),
                       axis=1, prepend=0) > 0
        cut = np.empty_like(rows)
        np.put_along_axis(cut, order, np.where(keep, s, 0).astype(rows.dtype), axis=1)
        states[pi, ji] = cut      # ``states`` is this function's own array (np.maximum above)
    # node capacities, jobs in priority order
    states = np.diff(np.minimum(np.cumsum(states, axis=1), prob.cap[None, None, :]), axis=1,
                     prepend=0)
    if prob.whole:
        states = np.where(states == prob.unit[None, :, None], states, 0)
    total = states.sum(axis=2)
    states = np.where((total < prob.lo[None, :])[..., None], 0, states)
    return states.astype(np.int16)


def evolve(prob: Problem, start: np.ndarray, speedup: Callable[[np.ndarray], np.ndarray],
           population: int, generations: int, rng: np.random.Generator
           ) -> tuple[np.ndarray, np.ndarray]:
    """Run the search from ``start`` (S, J, N; any S >= 1): each generation makes
    ``population`` children (binary tournament, crossover, mutation, repair) and keeps the best
    ``population`` distinct states of parents and children (elitist, as NSGA-II's survival with
    duplicates eliminated). Returns ``(states, fitness)`` best first."""
    pop = _unique(repair(prob, start, rng))
    fit = fitness(prob, pop, speedup)
    for _ in range(generations):
        n = max(1, (population + 1) // 2)
        pa, pb = _tournament(fit, n, rng), _tournament(fit, n, rng)
        c1, c2 = crossover(pop[pa], pop[pb], rng)
        kids = repair(prob, mutate(prob, np.concatenate([c1, c2])[:population], rng), rng)
        pop = np.concatenate([pop, kids])
        fit = np.concatenate([fit, fitness(prob, kids, speedup)])
        pop, fit = _survive(pop, fit, population)
    order = np.argsort(-fit, kind="stable")
    return pop[order], fit[order]


def _tournament(fit: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    a, b = rng.integers(0, len(fit), size=(2, n))
    return np.where(fit[a] >= fit[b], a, b)


def _first(pop: np.ndarray) -> np.ndarray:
    """Indices of the first occurrence of each distinct state, in order."""
    flat = np.ascontiguousarray(pop.reshape(len(pop), -1))
    rows = flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).ravel()
    return np.sort(np.unique(rows, return_index=True)[1])


def _unique(pop: np.ndarray) -> np.ndarray:
    return pop[_first(pop)]


def _survive(pop: np.ndarray, fit: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    first = _first(pop)
    best = first[np.argsort(-fit[first], kind="stable")[:size]]
    return pop[best], fit[best]
