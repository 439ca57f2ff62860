"""benchmarks/pal_artifact.py: PAL's simulator rules, rebuilt, on hand-made clusters and one trace."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "pal_artifact.py"
_spec = importlib.util.spec_from_file_location("pal_artifact", _PATH)
pa = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("pal_artifact", pa)   # its dataclasses look their module up
_spec.loader.exec_module(pa)


def test_packed_takes_an_exact_node_then_the_tightest_then_spreads_over_the_fullest():
    # node 0: GPUs 0-3 free; node 1: 5, 6 free; node 2: 9 free
    free = [0, 1, 2, 3, 5, 6, 9]
    assert pa.packed_gpus(2, free) == (5, 6)            # node 1 has exactly 2
    assert pa.packed_gpus(3, free) == (0, 1, 2)         # only node 0 has room: the tightest
    assert pa.packed_gpus(1, free) == (9,)              # node 2 has exactly 1
    assert pa.packed_gpus(6, free) == (0, 1, 2, 3, 5, 6)   # soft: the fullest nodes first
    assert pa.packed_gpus(8, free) is None


def test_pm_first_takes_the_fastest_bins_and_breaks_ties_by_the_best_matching_node():
    sf = np.ones(12)
    sf[[4, 9]] = 0.9                                    # two fast GPUs on nodes 1 and 2
    free = list(range(12))
    assert pa.pmfirst_gpus(2, free, sf) == (4, 9)       # fast GPUs, even across nodes
    free = [0, 1, 2, 3, 5, 6]                           # node 0 all free, node 1: 5, 6
    assert pa.pmfirst_gpus(2, free, np.ones(12)) == (5, 6)   # node with exactly 2 free first
    assert pa.pmfirst_gpus(7, free, sf) is None


def test_pal_keeps_a_small_job_on_one_node_unless_spreading_wins_by_more_than_the_penalty():
    sf = np.full(12, 1.2)
    sf[[0, 4]] = 1.0                                    # one fast GPU each on nodes 0 and 1
    free = list(range(12))
    # across nodes at 1.7 x 1.0 costs more than within one node at 1.2: one node
    got = pa.pal_gpus(2, free, sf)
    assert len({g // 4 for g in got}) == 1
    sf[:] = 3.0
    sf[[0, 4]] = 1.0                                    # now within costs 3.0 > 1.7 across
    assert sorted(pa.pal_gpus(2, free, sf)) == [0, 4]
    assert pa.pal_gpus(1, free, sf) in ((0,), (4,))     # one GPU: PM-First
    assert pa.pal_gpus(5, free, sf)[:2] == (0, 4)       # more than a node: PM-First


def _cluster(n_gpus=8):
    raw = np.ones((n_gpus, 4))
    return pa.Cluster(raw, raw.copy())


def _job(i, gpus, cls=0, submit=0.0):
    return pa.Job(i, submit, gpus, cls, 10.0, 1.0)


def test_strict_fifo_stops_at_the_first_job_that_cannot_be_placed_and_backfill_does_not():
    for kind in pa.PLACEMENTS:
        q = [_job(0, 6), _job(1, 4), _job(2, 2)]
        c = _cluster()
        pa.place_round(kind, q, c)
        assert [bool(j.held) for j in q] == [True, False, False], kind
        q = [_job(0, 6), _job(1, 4), _job(2, 2)]
        c = _cluster()
        pa.place_round(kind, q, c, pa.Rules(backfill=True))
        assert [bool(j.held) for j in q] == [True, False, True], kind


def test_pm_first_re_places_class_a_first_and_packed_keeps_running_jobs_put():
    c = _cluster()
    c.sf[:, 0] = [2, 2, 2, 2, 1, 1, 1, 1]               # class A (column 0) fast on node 1
    late_a, early_d = _job(1, 4, cls=0), _job(0, 4, cls=3)
    c.take(early_d, (4, 5, 6, 7))                       # the class-D job holds node 1
    pa.place_round("pm-first", [early_d, late_a], c)
    assert late_a.held == (4, 5, 6, 7) and early_d.held == (0, 1, 2, 3)
    c = _cluster()
    c.sf[:, 0] = [2, 2, 2, 2, 1, 1, 1, 1]
    late_a, early_d = _job(1, 4, cls=0), _job(0, 4, cls=3)
    c.take(early_d, (4, 5, 6, 7))
    pa.place_round("packed", [early_d, late_a], c)
    assert early_d.held == (4, 5, 6, 7) and late_a.held == (0, 1, 2, 3)


def test_packed_preempts_later_jobs_for_the_head_of_the_queue():
    c = _cluster()
    head, later = _job(0, 8), _job(1, 2)
    c.take(later, (0, 1))
    pa.place_round("packed", [head, later], c)
    assert head.held == tuple(range(8)) and later.held == ()
    c = _cluster()
    head, later = _job(0, 8), _job(1, 2)
    c.take(later, (0, 1))
    pa.place_round("packed", [head, later], c, pa.Rules(preempt=False))
    assert head.held == () and later.held == (0, 1)


@pytest.mark.parametrize("kind", pa.PLACEMENTS)
def test_a_trace_runs_to_the_end_and_no_job_beats_its_work_on_the_fastest_gpu(kind):
    from hpcsched.sim.workload import load_workload

    _, wjs = load_workload("pal:1")
    res = pa.run_trace(1, kind)
    assert res["jobs"] == len(wjs) == 160
    fastest = 0.0   # a lower bound on the mean JCT: every job alone on GPUs at least as fast
    raw = pa.pal_gpu_slowdowns(64, ("A", "B", "C", "D"), 42)
    for w in wjs:
        c = "ABCD".index(w.app_class.removeprefix("class"))
        fastest += w.iterations * w.iteration_time * raw[:, c].min()
    assert res["avg_jct"] >= fastest / len(wjs)


def test_binning_gives_two_bins_plus_outliers_relative_to_the_median_centre():
    raw = np.ones((64, 1))
    raw[:32, 0] = 0.95
    raw[32:, 0] = 1.05
    raw[0, 0] = 3.0                                     # an outlier gets a bin of its own
    sf = pa.binned(raw)[:, 0]
    assert len(set(sf.round(9))) == 3
    assert sf[0] > sf[40] > sf[10]
