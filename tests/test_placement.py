"""Placement stages (packed-sticky, PM-First, PAL) and PAL's variability data: worked cases that
pin the mechanism, plus the capacity/determinism invariants as hypothesis properties."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hpcsched
from hpcsched.model.snapshot import (
    ClusterSnapshot,
    GPUView,
    JobTarget,
    JobView,
    NodeView,
    Plan,
)
from hpcsched.policies.placement import (
    PLACEMENTS,
    job_slowdown,
    locality_factor,
    node_sort_key,
    place,
    placement_score,
)
from hpcsched.policies.placement.binning import bin_gpus, silhouette_1d
from hpcsched.policies.variability import profiles_from_views, sensitivity
from hpcsched.protocol.limits import JobLimits
from hpcsched.sim.physics import draw_gpu_slowdowns

DATA_DIR = Path(hpcsched.__file__).resolve().parent / "data" / "pal"


def _pal_profiles():
    """PAL's 32-GPU file (read here with csv): ``{class: {(node, gpu): multiplier}}``."""
    out = {}
    with open(DATA_DIR / "32gpu-variability.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            key = (int(row["Node_ID"]), int(row["Local_GPU_ID"]))
            for col, val in row.items():
                if col.startswith("PerfVar_class"):
                    out.setdefault(col[len("PerfVar_class"):], {})[key] = float(val)
    return out


def _job(job_id, nodes=1, *, wpn=4, cls="", state="PENDING", names=(), busy=False, partition=""):
    return JobView(job_id=job_id, state=state, nodes=nodes, node_names=tuple(names),
                   limits=JobLimits(wpn, 1, 8, 64, 64, None, 64, "linear"), batch_size=64,
                   submit_time=0.0, app_class=cls, busy=busy, partition=partition)


def _gpus(speeds: dict[str, dict[str, float]], per_node=4):
    """``{node: {class: slowdown}}`` -> every GPU of the node with those slowdowns."""
    return tuple(GPUView(n, i, tuple(sorted(s.items()))) for n, s in speeds.items()
                 for i in range(per_node))


def _snap(nodes, jobs=(), gpus=(), other=(), per_node=4, states=None):
    states = states or {}
    return ClusterSnapshot(time=0.0,
                           nodes=tuple(NodeView(n, per_node, 0, states.get(n, "idle")) for n in nodes),
                           jobs=tuple(jobs), other_gpus_allocated=tuple(other), gpus=tuple(gpus))


def _plan(*targets):
    return Plan("test", tuple(JobTarget(j, n, 64, "sized") for j, n in targets))


# --------------------------------------------------------------------------- binning

def test_kmeans_picks_three_bins_for_three_separated_clusters():
    x = [1.00, 1.01, 0.99, 1.00, 1.20, 1.21, 1.19, 1.20, 1.50, 1.52, 1.49, 1.51]
    b = bin_gpus(x, seed=0)
    assert b.k == 3
    assert b.labels == (0,) * 4 + (1,) * 4 + (2,) * 4          # fastest bin first
    assert b.centres == pytest.approx([1.0, 1.2, 1.505])
    sil = b.silhouette
    assert set(sil) == {2, 3, 4, 5, 6} and max(sil, key=sil.get) == 3


def test_silhouette_argmax_is_not_stuck_at_two():
    """The artifact's get_optimal_k returns inside its loop (always k = 2); here k is the argmax."""
    x = [v + d for v in (1.0, 1.1, 1.2, 1.3) for d in (-0.002, 0.0, 0.002)]
    b = bin_gpus(x, k_max=6, seed=3)
    assert b.k == 4 and b.silhouette[4] > b.silhouette[2]
    assert bin_gpus(x, k_max=3, seed=3).k == 3       # capped by k_max


def test_binning_degenerate_cases():
    assert bin_gpus([]).k == 0 and bin_gpus([]).labels == ()
    one = bin_gpus([1.3])
    assert (one.k, one.labels, one.centres) == (1, (0,), (1.3,))
    same = bin_gpus([1.05] * 7)
    assert same.k == 1 and same.labels == (0,) * 7 and same.silhouettes == ()
    noise = bin_gpus([1.0, 1.001, 0.999, 1.0005])           # within 0.5 %: measurement noise
    assert noise.k == 1
    two = bin_gpus([1.0, 1.0, 1.0, 1.3, 1.3], k_max=6)      # fewer distinct values than k_max
    assert two.k == 2 and two.labels == (0, 0, 0, 1, 1) and set(two.silhouette) == {2}


def test_outlier_gets_its_own_bin_without_merging_the_rest():
    rng = np.random.default_rng(0)
    x = list(rng.uniform(0.95, 0.97, 20)) + list(rng.uniform(1.10, 1.12, 20)) + [3.4]
    b = bin_gpus(x, seed=0)
    assert b.outliers == (40,)
    assert b.k == 3 and b.labels[-1] == 2 and b.centres[-1] == pytest.approx(3.4)
    assert set(b.labels[:20]) == {0} and set(b.labels[20:40]) == {1}
    # without the outlier rule the 3.4x GPU takes one bin and everything else the other
    assert bin_gpus(x, seed=0, outlier_sigma=None).k == 2


def test_binning_is_deterministic_for_a_seed():
    x = np.random.default_rng(7).gamma(2.0, 0.05, 60) + 0.9
    assert bin_gpus(x, seed=5) == bin_gpus(x, seed=5)


def test_silhouette_matches_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(1.0, 0.01, 30), rng.normal(1.1, 0.02, 20), [1.1, 1.5]])
    lab = np.digitize(x, [1.05, 1.3])
    assert silhouette_1d(x, lab) == pytest.approx(metrics.silhouette_score(x[:, None], lab))


# --------------------------------------------------------------------------- data

def test_shipped_pal_data_and_licence():
    files = {p.name: p.stat().st_size for p in Path(DATA_DIR).iterdir()}
    assert {"32gpu-variability.csv", "longhorn-slowdown-quantiles.json", "LICENSE.mit",
            "SOURCE.md"} <= set(files)
    assert sum(files.values()) < 200_000
    assert "MIT License" in (Path(DATA_DIR) / "LICENSE.mit").read_text()
    assert "8a590708a0cd82d14162178890bebbbd1f6ec858" in (Path(DATA_DIR) / "SOURCE.md").read_text()


def test_pal_profiles_sensitivity_order_and_bins():
    prof = _pal_profiles()
    assert sorted(prof) == ["A", "B", "C", "D"] and all(len(v) == 32 for v in prof.values())
    assert prof["A"][(7, 3)] == pytest.approx(1.1172026881210448)
    s = {c: sensitivity(c, prof) for c in prof}
    assert s["A"] > s["B"] == s["C"] > s["D"]                  # PAL's class order
    assert sensitivity("classA", prof) == s["A"] and sensitivity("nope", prof) == 0.0
    # class A on the 32 GPUs: three bins, node 7 alone slowest, node 4 in the middle
    keys = sorted(prof["A"])
    b = bin_gpus([prof["A"][k] for k in keys])
    by_node = {}
    for k, lab in zip(keys, b.labels):
        by_node.setdefault(k[0], set()).add(lab)
    assert b.k == 3 and by_node[7] == {2} and by_node[4] == {1}
    assert all(by_node[n] == {0} for n in (0, 1, 2, 3, 5, 6))
    assert bin_gpus(list(prof["D"].values())).k == 1           # insensitive: one bin


def test_longhorn_quantiles_and_the_class_order_of_their_draws():
    doc = json.loads((DATA_DIR / "longhorn-slowdown-quantiles.json").read_text())
    q = {c: e["max"] for c, e in doc["classes"].items()}
    assert sorted(q) == ["A", "B", "C", "D"] and all(len(v) == 101 for v in q.values())
    assert q["A"][50] == pytest.approx(1.0) and q["A"][-1] > 3.0 and q["D"][-1] < 1.01
    assert all(np.all(np.diff(v) >= 0) for v in q.values())
    # GPUs drawn by the simulator's Longhorn sampler, as the snapshot shows them to placement
    classes = ("A", "B", "C", "D")
    slow = draw_gpu_slowdowns(64, classes, seed=1)
    views = tuple(GPUView(f"c{i // 4:02d}", i % 4, tuple(zip(classes, map(float, row))))
                  for i, row in enumerate(slow))
    prof = profiles_from_views(views)
    assert prof["B"] == prof["C"]                               # one BERT measurement set
    assert sensitivity("A", prof) > sensitivity("B", prof) > sensitivity("D", prof)


# --------------------------------------------------------------------------- worked placements

FAST_SLOW = {"n1": {"A": 1.25, "D": 1.0}, "n2": {"A": 1.0, "D": 1.0}}


def test_pal_gives_the_fast_bin_to_the_sensitive_job_first():
    """D comes first in the plan; PAL still lets class A choose first and take the fast node."""
    jobs = [_job("d", cls="D"), _job("a", cls="A")]
    snap = _snap(["n1", "n2"], jobs, _gpus(FAST_SLOW))
    plan = place(_plan(("d", 1), ("a", 1)), snap, "pal")
    assert plan.target("a").placement == ("n2",) and plan.target("d").placement == ("n1",)
    assert "bin 1/2" in plan.target("a").reason
    # the packed baseline ignores variability: plan order, lowest name first
    packed = place(_plan(("d", 1), ("a", 1)), snap, "packed")
    assert packed.target("d").placement == ("n1",) and packed.target("a").placement == ("n2",)


def test_packed_sticky_keeps_a_running_jobs_nodes():
    jobs = [_job("r", 2, wpn=2, state="RUNNING", names=("n3", "n4"), cls="A"), _job("p", 1, wpn=4)]
    snap = _snap(["n1", "n2", "n3", "n4"], jobs, _gpus({"n3": {"A": 1.5}, "n4": {"A": 1.5}}))
    plan = place(_plan(("r", 2), ("p", 1)), snap, "packed")
    assert plan.target("r").placement == ("n3", "n4") and "kept" in plan.target("r").reason
    assert plan.target("p").placement == ("n1",)
    # grown to 3 nodes: re-packed, keeping its nodes and adding the lowest free one
    grown = place(_plan(("r", 3)), snap, "packed")
    assert grown.target("r").placement == ("n1", "n3", "n4")
    # shrunk to 1 node: a subset of its nodes
    assert place(_plan(("r", 1)), snap, "packed").target("r").placement == ("n3",)


def test_packed_is_best_fit():
    """Exact fit first, then the fullest node that fits, so whole nodes stay free."""
    jobs = [_job("x", 1, wpn=2)]
    snap = _snap(["n1", "n2", "n3"], jobs, other=(("n2", 2), ("n3", 1)))
    assert place(_plan(("x", 1)), snap, "packed").target("x").placement == ("n2",)
    snap = _snap(["n1", "n2"], jobs, other=(("n2", 1),))
    assert place(_plan(("x", 1)), snap, "packed").target("x").placement == ("n2",)


def test_pm_first_orders_jobs_by_class_sensitivity():
    speeds = {"n1": {"A": 1.00, "B": 1.00, "D": 1.000},
              "n2": {"A": 1.10, "B": 1.02, "D": 1.001},
              "n3": {"A": 1.30, "B": 1.05, "D": 1.002}}
    jobs = [_job("d", cls="D"), _job("b", cls="B"), _job("a", cls="A")]
    snap = _snap(["n1", "n2", "n3"], jobs, _gpus(speeds))
    plan = place(_plan(("d", 1), ("b", 1), ("a", 1)), snap, "pm-first")
    got = {t.job_id: t.placement for t in plan.targets}
    assert got == {"a": ("n1",), "b": ("n2",), "d": ("n3",)}
    assert [t.job_id for t in plan.targets] == ["d", "b", "a"]   # plan order kept


def test_pal_treats_a_bin_as_equal_and_keeps_locality_where_pm_first_moves():
    """n1 and n2 are one bin for class A (slowest GPU 1.004 vs 1.003, far from n3's 1.3): PAL
    keeps the running job where it is; PM-First chases the 0.1 % and moves it."""
    per_gpu = {"n1": (1.000, 1.004, 0.998, 1.002), "n2": (0.999, 1.001, 1.003, 0.997),
               "n3": (1.30, 1.31, 1.29, 1.30)}
    gpus = tuple(GPUView(n, i, (("A", v),)) for n, vs in per_gpu.items() for i, v in enumerate(vs))
    speeds = gpus
    jobs = [_job("a", 1, cls="A", state="RUNNING", names=("n1",))]
    snap = _snap(["n1", "n2", "n3"], jobs, gpus)
    assert place(_plan(("a", 1)), snap, "pal").target("a").placement == ("n1",)
    assert place(_plan(("a", 1)), snap, "pm-first").target("a").placement == ("n2",)
    # a job on the slow bin is moved to the fast bin by PAL
    slow = _snap(["n1", "n2", "n3"], [_job("a", 1, cls="A", state="RUNNING", names=("n3",))],
                 speeds)
    assert place(_plan(("a", 1)), slow, "pal").target("a").placement == ("n2",)


def test_locality_penalty_makes_spanning_nodes_lose_at_equal_speed():
    assert locality_factor(1, 1.5) == 1.0 and locality_factor(2, 1.5) == 1.5
    assert placement_score(1.0, 1, 1.5) < placement_score(1.0, 2, 1.5)
    assert placement_score(1.0, 1, 1.0) == placement_score(1.0, 2, 1.0)
    # a slower single node still beats two faster nodes while the gap is under the penalty
    assert placement_score(1.2, 1, 1.5) < placement_score(1.0, 2, 1.5)
    gpus = _gpus({"n1": {"A": 1.0}, "n2": {"A": 1.0}, "n3": {"A": 1.2}})
    assert job_slowdown(gpus, "A", ["n1"], 1.5) == 1.0
    assert job_slowdown(gpus, "A", ["n1", "n2"], 1.5) == 1.5
    assert job_slowdown(gpus, "classA", ["n3", "n1"], 1.5) == pytest.approx(1.8)
    assert job_slowdown(gpus, "A", ["unmeasured"], 1.5) == 1.0
    # and the score of the chosen layout is what PAL reports
    snap = _snap(["n1", "n2"], [_job("a", 2, wpn=2, cls="A")], gpus)
    assert "x locality 1.5 = 1.500" in place(_plan(("a", 2)), snap, "pal").target("a").reason


def test_capacity_counts_unmanaged_jobs_and_jobs_that_stay():
    jobs = [_job("stay", 1, wpn=2, state="RUNNING", names=("n1",)),   # no target: keeps n1
            _job("new", 1, wpn=4), _job("half", 1, wpn=2)]
    snap = _snap(["n1", "n2"], jobs, other=(("n2", 1),))
    for s in PLACEMENTS:
        plan = place(_plan(("new", 1), ("half", 1)), snap, s)
        assert plan.target("new").placement == ()                    # no node has 4 free
        assert plan.target("half").placement == ("n1",)               # n2 has 3 free, n1 has 2
        assert any("job new needs 1 node(s) with >= 4 free GPUs" in n for n in plan.notes)
        assert "does not fit" in plan.target("new").reason


def test_down_nodes_partitions_busy_and_unknown_jobs():
    jobs = [_job("p", 1, wpn=1, partition="gpu"), _job("b", 1, wpn=1, busy=True),
            _job("z", 1, wpn=1)]
    snap = ClusterSnapshot(0.0, (NodeView("n1", 4, 0, "down"), NodeView("n2", 4, 0, "idle", ("cpu",)),
                                 NodeView("n3", 4, 0, "mixed", ("gpu",))), tuple(jobs))
    plan = Plan("t", (JobTarget("p", 1, 64, "r"), JobTarget("b", 1, 64, "r", ("n9",)),
                      JobTarget("z", 0, 64, "r"), JobTarget("ghost", 1, 64, "r")))
    for s in PLACEMENTS:
        out = place(plan, snap, s)
        assert out.target("p").placement == ("n3",)
        assert out.target("b") == plan.target("b")                    # busy: left as it is
        assert out.target("z") == plan.target("z")                    # not running: nothing to place
        assert out.target("ghost") == plan.target("ghost")
        assert any("ghost" in n for n in out.notes)


def test_running_jobs_keep_nodes_when_re_placing_would_leave_one_out():
    """Re-placing in class order would put the pending class-A job first and squeeze out a
    running job; PAL then falls back to running jobs keeping their nodes."""
    jobs = [_job("d1", 1, wpn=2, cls="D", state="RUNNING", names=("n1",)),
            _job("d2", 1, wpn=2, cls="D", state="RUNNING", names=("n1",)),
            _job("d3", 1, wpn=1, cls="D", state="RUNNING", names=("n2",)),
            _job("a", 2, wpn=2, cls="A")]
    gpus = _gpus({"n1": {"A": 1.0, "D": 1.0}, "n2": {"A": 1.2, "D": 1.0}})
    snap = _snap(["n1", "n2"], jobs, gpus)
    plan = place(_plan(("d1", 1), ("d2", 1), ("d3", 1), ("a", 2)), snap, "pal")
    got = {t.job_id: t.placement for t in plan.targets}
    assert got == {"d1": ("n1",), "d2": ("n1",), "d3": ("n2",), "a": ()}
    assert any("kept their nodes" in n for n in plan.notes)


def test_lowest_name_is_natural_order():
    assert sorted(["n10", "n2", "gpu-1", "n1"], key=node_sort_key) == ["gpu-1", "n1", "n2", "n10"]
    snap = _snap(["n10", "n9"], [_job("x", 1)])
    assert place(_plan(("x", 1)), snap, "packed").target("x").placement == ("n9",)


def test_edge_cases_no_jobs_one_gpu_more_jobs_than_gpus():
    empty = Plan("t", ())
    for s in PLACEMENTS:
        assert place(empty, _snap(["n1"]), s) == empty
    one = _snap(["n1"], [_job("j", 1, wpn=1, cls="A")], _gpus({"n1": {"A": 1.0}}, 1), per_node=1)
    for s in PLACEMENTS:
        assert place(_plan(("j", 1)), one, s).target("j").placement == ("n1",)
    many = [_job(f"j{i}", 1, wpn=1, cls="ABCD"[i % 4]) for i in range(10)]
    snap = _snap(["n1", "n2"], many, _gpus({"n1": {"A": 1.0}, "n2": {"A": 1.1}}, 2), per_node=2)
    for s in PLACEMENTS:
        out = place(_plan(*[(j.job_id, 1) for j in many]), snap, s)
        assert sum(1 for t in out.targets if t.placement) == 4
    with pytest.raises(ValueError):
        place(_plan(("j", 1)), one, "random")
    with pytest.raises(ValueError):
        place(_plan(("j", 1)), one, "pal", locality_penalty=0)


# --------------------------------------------------------------------------- properties

@st.composite
def _scenarios(draw):
    n_nodes = draw(st.integers(1, 5))
    names = [f"n{i}" for i in range(n_nodes)]
    per = {n: draw(st.integers(1, 4)) for n in names}
    states = {n: draw(st.sampled_from(["idle", "mixed", "idle", "down", "drained"])) for n in names}
    other = {n: draw(st.integers(0, per[n])) for n in names}
    used = dict(other)
    jobs, targets = [], []
    for i in range(draw(st.integers(0, 7))):
        wpn = draw(st.integers(1, 4))
        nodes = draw(st.integers(1, 3))
        cls = draw(st.sampled_from(["A", "B", "D", "", "classA"]))
        running = draw(st.booleans())
        cur: list[str] = []
        if running:                         # a feasible current allocation, first fit
            for n in names:
                if len(cur) < nodes and per[n] - used[n] >= wpn:
                    cur.append(n)
            running = len(cur) == nodes
            if running:
                for n in cur:
                    used[n] += wpn
        jid = f"j{i}"
        jobs.append(_job(jid, nodes, wpn=wpn, cls=cls, state="RUNNING" if running else "PENDING",
                         names=cur if running else (), busy=draw(st.booleans()) and draw(st.booleans())))
        if draw(st.integers(0, 4)) > 0:
            targets.append(JobTarget(jid, draw(st.integers(0, 3)), 64, "sized"))
    alloc = {n: draw(st.integers(0, per[n])) for n in names}
    gpus = tuple(GPUView(n, k, tuple((c, draw(st.floats(0.9, 1.6))) for c in ("A", "B", "D")
                                     if draw(st.booleans())))
                 for n in names if draw(st.booleans()) for k in range(per[n]))
    snap = ClusterSnapshot(0.0, tuple(NodeView(n, per[n], alloc[n], states[n]) for n in names),
                           tuple(jobs), tuple(other.items()), gpus=gpus)
    return snap, Plan("prop", tuple(targets))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios(), st.sampled_from(PLACEMENTS), st.sampled_from([1.0, 1.5, 3.0]),
       st.integers(0, 3))
def test_placement_invariants(scenario, strategy, lp, seed):
    snap, plan = scenario
    out = place(plan, snap, strategy, lp, seed)
    assert out == place(plan, snap, strategy, lp, seed)                  # deterministic
    assert [(t.job_id, t.nodes, t.batch_size) for t in out.targets] == \
           [(t.job_id, t.nodes, t.batch_size) for t in plan.targets]     # sizes untouched
    jobs = {j.job_id: j for j in snap.jobs}
    nodes = {n.name: n for n in snap.nodes}
    other = dict(snap.other_gpus_allocated)
    replaced = {t.job_id for t in plan.targets if t.job_id in jobs and not jobs[t.job_id].busy}
    load: dict[str, int] = {}
    managed: dict[str, int] = {}
    for j in snap.jobs:                                                  # jobs that stay put
        if j.state == "RUNNING":
            for n in j.node_names:
                managed[n] = managed.get(n, 0) + j.workers_per_node
                if j.job_id not in replaced:
                    load[n] = load.get(n, 0) + j.workers_per_node
    placed_on: dict[str, int] = {}
    for t, t0 in zip(out.targets, plan.targets):
        j = jobs.get(t.job_id)
        if j is None or j.busy or t.nodes <= 0:
            assert t == t0
            continue
        if not t.placement:
            assert any(f"job {t.job_id} " in n for n in out.notes)
            continue
        assert len(t.placement) == len(set(t.placement)) == t.nodes
        assert list(t.placement) == sorted(t.placement, key=node_sort_key)
        for n in t.placement:
            assert nodes[n].usable
            placed_on[n] = placed_on.get(n, 0) + j.workers_per_node
    for n, k in placed_on.items():
        unmanaged = max(other.get(n, 0), nodes[n].gpus_allocated - managed.get(n, 0), 0)
        assert unmanaged + load.get(n, 0) + k <= nodes[n].gpus


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.5, 4.0), min_size=0, max_size=40), st.integers(0, 5))
def test_binning_invariants(values, seed):
    b = bin_gpus(values, seed=seed)
    assert b == bin_gpus(values, seed=seed)
    assert len(b.labels) == len(values) and b.k == len(b.centres)
    assert list(b.centres) == sorted(b.centres)
    assert b.k <= len(set(values))
    if values:
        assert set(b.labels) == set(range(b.k))                          # no empty bin
        order = np.argsort(values, kind="stable")                       # bins are monotone
        assert list(np.array(b.labels)[order]) == sorted(b.labels)
        sil = b.silhouette
        if sil and not b.outliers and b.k > 1:
            assert b.k == max(sil, key=lambda k: (sil[k], -k))
