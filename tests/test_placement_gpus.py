"""The GPU-granular placement stage when the snapshot knows which GPUs are free
(``NodeView.free_index``) and which a running job holds (``JobView.gpus_held``): nodes ranked by
the GPUs Slurm would hand out (the lowest free indexes), and grows trimmed to the GPUs that pay
(:func:`hpcsched.policies.placement.gpus.trim_grow`). Pure; the simulator's views are checked to
fill both fields as its cluster stands."""

from dataclasses import replace

from hpcsched.model.snapshot import ClusterSnapshot, GPUView, JobTarget, NodeView, Plan
from hpcsched.policies.placement import place
from tests.test_placement import _job

SLOW = 3.0   # an outlier GPU for class A (PAL's Longhorn tail reaches 3.4x)


def _snap(free: dict[str, tuple[int, ...]], slow: dict[tuple[str, int], float], jobs,
          cls: str = "A") -> ClusterSnapshot:
    """Nodes of 4 GPUs, ``free`` indexes free on each, every GPU 1.0x for ``cls`` but ``slow``."""
    nodes = tuple(NodeView(n, 4, 4 - len(f), "mixed" if len(f) < 4 else "idle", free_index=f)
                  for n, f in free.items())
    gpus = tuple(GPUView(n, i, ((cls, slow.get((n, i), 1.0)),)) for n in free for i in range(4))
    return ClusterSnapshot(0.0, nodes, tuple(jobs), gpus=gpus, granularity="gpu", grow="extension")


def _running(job_id: str, held: tuple[tuple[str, int], ...], cls: str = "A"):
    names = tuple(dict.fromkeys(n for n, _ in held))
    return replace(_job(job_id, len(names), wpn=4, cls=cls, state="RUNNING", names=names),
                   gpus_held=held, layout=tuple(sum(1 for m, _ in held if m == n) for n in names))


def _target(job_id: str, gpus: int) -> JobTarget:
    return JobTarget(job_id, -(-gpus // 4), 64, "sized", gpus=gpus)


def test_a_node_ranks_by_the_gpus_slurm_would_hand_out_not_by_its_slowest():
    # n1's outlier (GPU 3) is held by another job: its free GPUs 0-1 are fast. n2's free
    # GPUs 2-3 are 1.2x. By slowest GPU n1 ranks last; by the GPUs it would give, first.
    snap = _snap({"n1": (0, 1), "n2": (2, 3)}, {("n1", 3): SLOW, ("n2", 2): 1.2, ("n2", 3): 1.2},
                 [_job("p", 1, cls="A")])
    assert place(Plan("t", (_target("p", 2),)), snap, "pal").target("p").placement == ("n1",)
    # the same nodes, the outlier free and first in line on n1: n2 is the faster choice
    snap = _snap({"n1": (3,), "n2": (2, 3)}, {("n1", 3): SLOW, ("n2", 2): 1.2, ("n2", 3): 1.2},
                 [_job("p", 1, cls="A")])
    assert place(Plan("t", (_target("p", 1),)), snap, "pal").target("p").placement == ("n2",)


def test_a_grow_is_trimmed_to_the_gpus_that_pay():
    # r runs on n1 (4 GPUs, 1.0x); n2 is free, its GPU 2 an outlier. Growing to 8 would run
    # every rank at 3x (8 / 3 = 2.7 GPUs' worth); to 6 on GPUs 0-1 it runs at 1x (6)
    r = _running("r", tuple(("n1", i) for i in range(4)))
    snap = _snap({"n1": (), "n2": (0, 1, 2, 3)}, {("n2", 2): SLOW}, [r])
    out = place(Plan("t", (_target("r", 8),)), snap, "pal")
    t = out.target("r")
    assert t.gpus == 6 and t.placement == ("n2", "n1")
    assert "6 on GPUs no slower than 1.00x go faster" in t.reason


def test_a_grow_onto_nothing_but_slow_gpus_is_left_out_and_the_job_keeps_its_size():
    r = _running("r", tuple(("n1", i) for i in range(4)))
    snap = _snap({"n1": (), "n2": (0,)}, {("n2", 0): SLOW}, [r])
    out = place(Plan("t", (_target("r", 5),)), snap, "pal")
    t = out.target("r")
    assert (t.gpus, t.nodes, t.batch_size, t.placement) == (4, 1, 64, ())   # as it runs: no change
    assert any("job r keeps its size" in n for n in out.notes)


def test_a_grow_that_pays_despite_a_slow_gpu_is_kept_whole():
    # 1 GPU to 8; 6 fast GPUs free, then a slow one (n2's GPU 3). At 1.1x, 8 / 1.1 = 7.3 beats
    # 7 fast GPUs: kept whole; at 1.2x, 8 / 1.2 = 6.7 does not: trimmed to the 7
    r = _running("r", (("n1", 0),))
    free = {"n1": (1, 2, 3), "n2": (0, 1, 2, 3)}
    assert place(Plan("t", (_target("r", 8),)), _snap(free, {("n2", 3): 1.1}, [r]),
                 "pal").target("r").gpus == 8
    assert place(Plan("t", (_target("r", 8),)), _snap(free, {("n2", 3): 1.2}, [r]),
                 "pal").target("r").gpus == 7
    # a job that already runs at 1.2x loses nothing to the 1.2x GPU
    slow = {("n1", 0): 1.2, ("n2", 3): 1.2}
    assert place(Plan("t", (_target("r", 8),)), _snap(free, slow, [r]), "pal").target("r").gpus == 8


def test_a_class_the_gpu_is_not_slow_for_grows_whole():
    r = _running("r", tuple(("n1", i) for i in range(4)), cls="D")
    snap = _snap({"n1": (), "n2": (0, 1, 2, 3)}, {("n2", 2): SLOW}, [r], cls="A")
    assert place(Plan("t", (_target("r", 8),)), snap, "pal").target("r").gpus == 8


def test_without_free_indexes_nothing_is_trimmed():
    r = _running("r", tuple(("n1", i) for i in range(4)))
    snap = _snap({"n1": (), "n2": (0, 1, 2, 3)}, {("n2", 2): SLOW}, [r])
    snap = replace(snap, nodes=tuple(replace(n, free_index=None) for n in snap.nodes))
    assert place(Plan("t", (_target("r", 8),)), snap, "pal").target("r").gpus == 8


def test_the_simulator_reports_free_gpus_and_the_gpus_each_job_holds():
    from hpcsched.sim import WorkloadJob
    from hpcsched.sim.engine import SimConfig, Simulator

    jobs = [WorkloadJob("a", 0.0, "cifar10", 3, 1000.0, app_class="A")]
    sim = Simulator(jobs, "static", config=SimConfig(nodes=2, gpus_per_node=4, variability=True))
    sim.cluster.free[0, :3] = False
    sim.jobs[0].state, sim.jobs[0].node_names = "RUNNING", ("n1",)
    sim.jobs[0].gpus = ((0, 0), (0, 1), (0, 2))
    snap = sim.snapshot()
    assert {n.name: n.free_index for n in snap.nodes} == {"n1": (3,), "n2": (0, 1, 2, 3)}
    assert snap.jobs[0].gpus_held == (("n1", 0), ("n1", 1), ("n1", 2))


# ------------------------------------------------------------------ from Slurm's IDX lists
def test_gpu_indexes_parse_slurms_idx_lists():
    import pytest

    from hpcsched.slurm.errors import SlurmError
    from hpcsched.slurm.gres import gpu_indexes

    assert gpu_indexes("gpu:3(IDX:0-1,3)") == (0, 1, 3)
    assert gpu_indexes("gpu:0(IDX:N/A)") == () and gpu_indexes("gpu:2") is None
    with pytest.raises(SlurmError, match="bad index range"):
        gpu_indexes("gpu:2(IDX:3-1)")


def test_the_free_gpus_of_each_node_and_the_gpus_of_each_job_from_squeue_and_sinfo():
    """Recorded 22.05 output (tests/slurm_outputs.py): job 59 holds GPUs 0-1 of n1-n3, job 61
    GPUs 2-3 of n1-n2; sinfo counts 4, 4, 2 and 0 in use."""
    from hpcsched.slurm.observe import Observation
    from hpcsched.slurm.parse import parse_sinfo_json, parse_squeue_json
    from hpcsched.views.build import cluster_snapshot, held_gpus
    from tests.slurm_outputs import SINFO_RUNNING, SQUEUE_RUNNING

    jobs = parse_squeue_json(SQUEUE_RUNNING)
    assert jobs["59"].gpu_index == ((0, 1),) * 3 and jobs["60"].gpu_index == ()
    assert held_gpus((jobs["61"],)) == (("n1", 2), ("n1", 3), ("n2", 2), ("n2", 3))
    obs = Observation(time=0.0, nodes=parse_sinfo_json(SINFO_RUNNING), jobs=jobs, calls=2)
    snap = cluster_snapshot(obs, ())
    assert {n.name: n.free_index for n in snap.nodes} == {
        "n1": (), "n2": (), "n3": (2, 3), "n4": (0, 1, 2, 3)}
    # a job that does not say which GPUs it holds leaves its nodes unknown, and a count that
    # disagrees with sinfo's (a job squeue did not list) too
    vague = replace(jobs["61"], gpu_index=())
    obs = Observation(time=0.0, nodes=obs.nodes, jobs={**jobs, "61": vague}, calls=2)
    assert {n.name: n.free_index for n in cluster_snapshot(obs, ()).nodes} == {
        "n1": None, "n2": None, "n3": (2, 3), "n4": (0, 1, 2, 3)}
    obs = Observation(time=0.0, nodes=obs.nodes, jobs={"61": jobs["61"]}, calls=2)
    assert {n.name: n.free_index for n in cluster_snapshot(obs, ()).nodes} == {
        "n1": None, "n2": None, "n3": None, "n4": (0, 1, 2, 3)}


def test_reconcile_takes_on_each_node_the_gpus_the_placement_counted_and_no_more():
    """n2's GPU 3 is an outlier: the stage takes 3 of n2's 4 free GPUs and 1 of n3's. Filling
    the nodes in order with all they have free would take n2's fourth, the outlier."""
    from hpcsched.policies.changes import Candidate, Change
    from hpcsched.policies.feasible import feasible_now
    from hpcsched.policies.realise import Mechanism
    from hpcsched.protocol.kinds import ChangeKind, GrowMode

    r = _running("r", tuple(("n1", i) for i in range(4)))
    snap = _snap({"n1": (), "n2": (0, 1, 2, 3), "n3": (2, 3)}, {("n2", 3): SLOW}, [r])
    t = place(Plan("t", (_target("r", 8),)), snap, "pal").target("r")
    assert (t.gpus, t.placement, t.placement_gpus) == (8, ("n2", "n3", "n1"), (3, 1, 0))
    change = Change("r", ChangeKind.GROW, 1, 3, 64, 64, "grow", t.placement, 4, 8,
                    mechanism=Mechanism.EXTEND, placement_gpus=t.placement_gpus)
    (made,), _ = feasible_now([Candidate(change, 1.0, 2.0)], snap, GrowMode.EXTENSION)
    assert dict(made.layout) == {"n1": 4, "n2": 3, "n3": 1}
    # without the counts, the nodes in order with all they have free: n2's outlier too
    (made,), _ = feasible_now([Candidate(replace(change, placement_gpus=()), 1.0, 2.0)], snap,
                              GrowMode.EXTENSION)
    assert dict(made.layout) == {"n1": 4, "n2": 4}
