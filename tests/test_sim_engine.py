"""hpcsched.sim.engine: the discrete-event simulator on small hand-made workloads whose timings are
worked out by hand, invariants under every policy, preemption, and reconcile's preempt/held
changes. No Slurm.

Timing rules used by hand below (engine docstring): a job starts at its arrival when it fits;
every start costs the restart cost (30 s by default) before work begins; a fixed-work job takes
``iterations x iteration_time`` seconds, times the locality penalty (1.7) when it spans nodes and
times its slowest GPU's slowdown with variability; Slurm's pass runs when a job ends; policy
rounds come every 60 s.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hpcsched.model.snapshot import ClusterSnapshot, JobTarget, JobView, NodeView, Plan
from hpcsched.policies import POLICIES
from hpcsched.policies.reconcile import Costs, reconcile
from hpcsched.protocol.limits import JobLimits
from hpcsched.sim import SimResult, WorkloadJob
from hpcsched.sim.engine import (
    CLASSES,
    SimConfig,
    SimulationError,
    Simulator,
    job_shape,
)
from hpcsched.sim.workload import load_workload
from hpcsched.slurm.observe import Backend


def fixed(name, submit, gpus, iterations, iteration_time=1.0, app_class="A", batch=None,
          application="imagenet"):
    """A fixed-work (PAL/Blox) job."""
    return WorkloadJob(name=name, submit_time=submit, application=application, gpus=gpus,
                       batch_size=batch or 32 * gpus, app_class=app_class,
                       iterations=iterations, iteration_time=iteration_time)


def pollux(name, submit, application, gpus, batch, app_class):
    """A convergence job of a Pollux application."""
    return WorkloadJob(name=name, submit_time=submit, application=application, gpus=gpus,
                       batch_size=batch, app_class=app_class)


def by_name(result: SimResult) -> dict:
    return {j.name: j for j in result.jobs}


class Checked(Simulator):
    """Checks the cluster's bookkeeping after every Slurm pass and every round."""

    checks = 0

    def _schedule(self):
        super()._schedule()
        self.check()

    def _round(self):
        super()._round()
        self.check()

    def check(self):
        self.checks += 1
        held = np.zeros(self.cluster.free.shape, dtype=int)
        for j in self.jobs:
            if j.held:
                assert j.state == "PENDING", (j.wj.name, j.state)
            if j.state == "RUNNING":
                assert len(j.gpus) == j.n_gpus, (j.wj.name, j.gpus)
                if not j.granular:
                    assert j.n_gpus == j.nodes * j.per_node, (j.wj.name, j.gpus)
                assert len(set(j.gpus)) == len(j.gpus)
                per_node = {}
                for n, g in j.gpus:
                    held[n, g] += 1
                    per_node[n] = per_node.get(n, 0) + 1
                if j.granular:
                    assert len(per_node) == j.nodes and j.layout == tuple(
                        per_node[n] for n in sorted(per_node)), (j.wj.name, j.gpus)
                else:
                    assert sorted(per_node.values()) == [j.per_node] * j.nodes, (j.wj.name, j.gpus)
                # the primary's nodes first (as the daemon's view lists them), then the others
                primary = {n for n, _ in j.primary}
                assert j.node_names == tuple(self.cluster.node_names[n] for n in sorted(
                    per_node, key=lambda n: (n not in primary, n)))
                assert set(j.primary) <= set(j.gpus) and j.primary, (j.wj.name, j.primary)
                if self.costs.by_mechanism:   # a primary Slurm job: the same GPUs per node
                    own = [n for n, _ in j.primary]
                    assert len({own.count(n) for n in own}) == 1, (j.wj.name, j.primary)
                for n, g in j.ext.gpus if j.ext else ():   # a grow by extension, starting
                    held[n, g] += 1
            else:
                assert j.gpus == () and j.node_names == () and j.ext is None, (j.wj.name, j.state)
        assert held.max(initial=0) <= 1, "a GPU held by two jobs"
        assert np.array_equal(held == 1, ~self.cluster.free), "free matrix != running jobs' GPUs"


# --- job_shape ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("gpus", "per_node", "shape"), [
    (1, 4, (1, 1)), (3, 4, (1, 3)), (4, 4, (1, 4)), (6, 4, (2, 3)), (8, 4, (2, 4)),
    (12, 4, (3, 4)), (16, 4, (4, 4)), (10, 4, (5, 2)), (5, 4, (5, 1)), (7, 8, (1, 7)),
    (12, 8, (2, 6)), (9, 2, (9, 1)),
])
def test_job_shape(gpus, per_node, shape):
    assert job_shape(gpus, per_node) == shape


# --- the backend --------------------------------------------------------------------------------


class Observed(Simulator):
    """Records what the backend reports at each round, next to the engine's own state."""

    def _round(self):
        before = self.backend.calls
        obs = self.backend.observe()
        assert self.backend.calls == before + 1 and obs.calls == 1
        state = {j.job_id: (j.state, j.node_names, j.nodes, j.per_node) for j in self.jobs}
        self.seen.append((self.now, obs, (~self.cluster.free).sum(axis=1).tolist(), state))
        super()._round()


def test_sim_backend_is_a_backend_and_reports_the_engine_state():
    jobs = [fixed("a", 0, 3, 600), fixed("b", 10, 2, 100), fixed("c", 20, 4, 50),
            fixed("d", 30, 6, 50)]
    sim = Observed(jobs, "static", config=SimConfig(nodes=2))
    sim.seen = []
    assert isinstance(sim.backend, Backend)
    assert sim.backend.name == "simulated"
    sim.run()
    assert len(sim.seen) == sim.rounds > 5
    for now, obs, used, state in sim.seen:
        assert obs.time == now
        assert [n.name for n in obs.nodes] == ["n1", "n2"]
        assert [n.gpus_allocated for n in obs.nodes] == used
        for n, u in zip(obs.nodes, used):
            assert n.gpus == 4
            assert n.state == ("idle" if u == 0 else "allocated" if u == 4 else "mixed")
        active = {k: v for k, v in state.items() if v[0] in ("PENDING", "RUNNING")}
        assert set(obs.jobs) == set(active)
        for jid, info in obs.jobs.items():
            st, names, nodes, wpn = active[jid]
            assert (info.state, info.nodes, info.node_count, info.gpus_per_node) == (
                st, ",".join(names), nodes, wpn)
            assert info.state_reason == ("None" if st == "RUNNING" else "Resources")


def test_observation_by_hand():
    """One 4-GPU node: a (3 GPUs) starts at 0, b (2 GPUs) arrives at 10 and waits. At the round at
    t = 60 Slurm shows n1 mixed with 3 GPUs allocated, a running on n1 and b pending."""
    sim = Observed([fixed("a", 0, 3, 1000), fixed("b", 10, 2, 10)], "static",
                   config=SimConfig(nodes=1))
    sim.seen = []
    sim.run()
    obs = next(o for t, o, _, _ in sim.seen if t == 60.0)
    (n1,) = obs.nodes
    assert (n1.name, n1.gpus, n1.gpus_allocated, n1.state) == ("n1", 4, 3, "mixed")
    a, b = obs.jobs["1"], obs.jobs["2"]
    assert (a.name, a.state, a.nodes, a.node_count, a.gpus_per_node) == ("a", "RUNNING", "n1", 1, 3)
    assert (b.name, b.state, b.nodes, b.node_count, b.gpus_per_node) == ("b", "PENDING", "", 1, 2)
    assert a.priority > b.priority


# --- single jobs by hand ------------------------------------------------------------------------


@pytest.mark.parametrize(("submit", "restart", "expected_cost"), [
    (100.5, None, 30.0), (0.0, None, 30.0), (61.0, {"*": 10.0}, 10.0),
    (7.25, {"*": 10.0, "imagenet": 4.0}, 4.0), (7.25, {"bert": 99.0}, 30.0)])
def test_a_fixed_work_job_on_an_idle_cluster(submit, restart, expected_cost):
    kw = {} if restart is None else {"restart_cost": restart}
    res = Simulator([fixed("j", submit, 4, 1000, 0.5)], "static",
                    config=SimConfig(nodes=2, **kw)).run()
    (j,) = res.jobs
    assert j.start_time == submit                 # started at its arrival, not at a round
    assert j.finish_time == pytest.approx(submit + expected_cost + 1000 * 0.5, abs=1e-6)
    assert j.jct == pytest.approx(expected_cost + 500.0, abs=1e-6)
    assert j.gpu_seconds == pytest.approx(4 * (expected_cost + 500.0), abs=1e-6)
    assert (j.restarts, j.resizes, j.requested_gpus, j.max_gpus) == (0, 0, 4, 4)
    assert res.total_gpus == 8 and res.policy == "static"


@pytest.mark.parametrize(("gpus", "penalty", "factor"), [
    (8, None, 1.7), (6, None, 1.7), (8, 2.5, 2.5), (4, 2.5, 1.0), (3, None, 1.0)])
def test_locality_penalty_when_a_job_spans_nodes(gpus, penalty, factor):
    kw = {} if penalty is None else {"locality_penalty": penalty}
    res = Simulator([fixed("j", 100.5, gpus, 1000, 0.5)], "static",
                    config=SimConfig(nodes=2, **kw)).run()
    (j,) = res.jobs
    assert j.start_time == 100.5
    assert j.finish_time == pytest.approx(100.5 + 30 + 1000 * 0.5 * factor, abs=1e-6)


@pytest.mark.parametrize("soft", [False, True])
def test_soft_consolidation_spreads_a_fixed_job_no_node_has_room_for(soft):
    """Two 3-GPU jobs leave one GPU free on each of 2 nodes. A 2-GPU job arriving at 10 s waits
    for the first to end on Slurm (its shape is one node x 2); with soft consolidation (PAL's
    Packed-Sticky) it starts at once on 1 + 1 GPUs and pays the 1.7 locality penalty."""
    sim = Checked([fixed("a", 0.0, 3, 1000, 0.5), fixed("b", 0.0, 3, 2000, 0.5),
                   fixed("c", 10.0, 2, 100, 1.0)], "static",
                  config=SimConfig(nodes=2, soft_consolidate=soft))
    jobs = by_name(sim.run())
    assert jobs["a"].finish_time == pytest.approx(530.0)
    if soft:
        assert jobs["c"].start_time == 10.0
        assert jobs["c"].finish_time == pytest.approx(10.0 + 30.0 + 100 * 1.0 * 1.7)
    else:
        assert jobs["c"].start_time == pytest.approx(530.0)
        assert jobs["c"].finish_time == pytest.approx(530.0 + 30.0 + 100.0)
    assert sim.checks > 0


def test_soft_consolidation_leaves_pollux_jobs_and_jobs_that_fit_alone():
    """Only a fixed-work job that cannot get its shape is spread: the same workload of jobs that
    fit runs identically either way."""
    work = [fixed("a", 0.0, 4, 1000, 0.5), fixed("b", 5.0, 2, 300, 1.0),
            pollux("p", 7.0, "cifar10", 2, 128, "A")]
    plain = Simulator(work, "static", config=SimConfig(nodes=2)).run()
    soft = Simulator(work, "static", config=SimConfig(nodes=2, soft_consolidate=True)).run()
    assert [(j.start_time, j.finish_time) for j in plain.jobs] == \
        [(j.start_time, j.finish_time) for j in soft.jobs]


@pytest.mark.parametrize(("gpus", "app_class", "seed"), [
    (4, "A", 0), (2, "D", 3), (8, "B", 1), (1, "C", 11), (3, "A", 5)])
def test_variability_multiplies_by_the_slowest_gpu(gpus, app_class, seed):
    """On an idle cluster a job lands on the lowest-named nodes, lowest-numbered GPUs first."""
    cfg = SimConfig(nodes=2, variability=True, seed=seed)
    sim = Simulator([fixed("j", 42.0, gpus, 2000, 0.25, app_class=app_class)], "static",
                    config=cfg)
    assert sim.cluster.slow.shape == (2, 4, len(CLASSES))
    k = CLASSES.index(app_class)
    nodes, wpn = job_shape(gpus, 4)
    slowest = float(sim.cluster.slow[:nodes, :wpn, k].max())
    assert abs(slowest - 1.0) > 1e-4                   # the case can tell the difference
    penalty = 1.7 if nodes > 1 else 1.0
    (j,) = sim.run().jobs
    assert j.finish_time == pytest.approx(42.0 + 30 + 2000 * 0.25 * slowest * penalty, abs=1e-6)


@pytest.mark.parametrize(("gpus", "app_class", "seed"), [(1, "A", 0), (2, "D", 0), (3, "B", 0)])
def test_fastest_gpus_takes_the_nodes_fastest_gpus_for_the_class(gpus, app_class, seed):
    """With ``fastest_gpus`` a one-node job takes the node's ``gpus`` GPUs fastest for its class
    (lowest number first among equals), not the lowest-numbered, and runs at their slowest."""
    cfg = SimConfig(nodes=1, variability=True, seed=seed, fastest_gpus=True)
    sim = Simulator([fixed("j", 0.0, gpus, 1000, 0.5, app_class=app_class)], "static",
                    config=cfg)
    k = CLASSES.index(app_class)
    speeds = sim.cluster.slow[0, :, k]
    fastest = sorted(range(4), key=lambda g: (speeds[g], g))[:gpus]
    assert float(speeds[fastest].max()) < float(speeds[:gpus].max())   # the case can tell
    got = sim.cluster.allocate(1, gpus, fastest_for=app_class)
    assert got == (("n1",), tuple((0, g) for g in sorted(fastest)))
    sim.cluster.release(got[1])
    (j,) = sim.run().jobs
    assert j.finish_time == pytest.approx(30 + 1000 * 0.5 * float(speeds[fastest].max()),
                                          abs=1e-6)


def test_without_variability_every_gpu_is_a_median_gpu():
    sim = Simulator([fixed("j", 0, 1, 10)], "static", config=SimConfig(nodes=2, seed=9))
    assert np.array_equal(sim.cluster.slow, np.ones((2, 4, 4)))


def test_variability_depends_on_the_seed():
    jobs = [fixed("j", 0, 4, 1000, app_class="A")]
    a = Simulator(jobs, "static", config=SimConfig(nodes=1, variability=True, seed=1)).run()
    b = Simulator(jobs, "static", config=SimConfig(nodes=1, variability=True, seed=2)).run()
    assert a.jobs[0].finish_time != b.jobs[0].finish_time


# --- queueing -----------------------------------------------------------------------------------


def test_a_job_that_does_not_fit_waits_for_the_one_before_it():
    """One 4-GPU node. a (3 GPUs, 600 s) at 0 ends at 630; b (3 GPUs, 100 s) at 5 and d
    (3 GPUs, 50 s) at 6 wait, in order: b starts when a ends, d when b ends; c (1 GPU, 100 s)
    at 10 fits beside a and starts at once (backfill)."""
    jobs = [fixed("a", 0, 3, 600), fixed("b", 5, 3, 100), fixed("d", 6, 3, 50),
            fixed("c", 10, 1, 100)]
    r = by_name(Checked(jobs, "static", config=SimConfig(nodes=1)).run())
    assert r["a"].finish_time == pytest.approx(630.0, abs=1e-6)
    assert r["c"].start_time == 10 and r["c"].finish_time == pytest.approx(140.0, abs=1e-6)
    assert r["b"].start_time == r["a"].finish_time
    assert r["b"].finish_time == pytest.approx(630.0 + 30 + 100, abs=1e-6)
    assert r["d"].start_time == r["b"].finish_time
    assert r["d"].finish_time == pytest.approx(760.0 + 30 + 50, abs=1e-6)
    assert all(j.restarts == 0 for j in r.values())


def test_a_job_larger_than_the_cluster_is_an_error():
    with pytest.raises(SimulationError, match=r"job huge asks for 9 GPUs; the cluster has 8"):
        Simulator([fixed("ok", 0, 8, 10), fixed("huge", 5, 9, 10)], "static",
                  config=SimConfig(nodes=2))
    with pytest.raises(SimulationError, match="huge"):
        Simulator([pollux("huge", 0, "cifar10", 5, 640, "A")], "dp", config=SimConfig(nodes=1))


def test_a_job_whose_shape_never_fits_is_an_error():
    """5 GPUs on 4-GPU nodes is 5 nodes x 1 GPU for Slurm: never fits on 2 nodes."""
    assert job_shape(5, 4) == (5, 1)
    with pytest.raises(SimulationError, match=r"job five asks for 5 GPUs.*5 node\(s\) x 1 GPU"):
        Simulator([fixed("five", 0, 5, 100)], "static", config=SimConfig(nodes=2))


def test_a_fixed_work_job_runs_whatever_its_batch_size(tmp_path):
    trace = tmp_path / "pal.csv"
    trace.write_text("job_id,num_gpus,submit_time,duration,model\n0,48,0,100,DCGAN\n")
    _, jobs = load_workload(str(trace))
    assert jobs[0].batch_size == 4096 and jobs[0].iterations == 100
    res = Simulator(jobs, "static", config=SimConfig(nodes=12)).run()
    # 12 nodes x 4 GPUs: spans nodes, penalty 1.7
    assert res.jobs[0].finish_time == pytest.approx(30 + 100 * jobs[0].iteration_time * 1.7)


# --- determinism and invariants -----------------------------------------------------------------

SMALL_POLLUX = [
    pollux("cifar-1", 0, "cifar10", 2, 256, "A"),
    pollux("ncf-1", 20, "ncf", 1, 256, "D"),
    pollux("bert-1", 40, "bert", 4, 48, "B"),
    pollux("cifar-2", 100, "cifar10", 4, 512, "A"),
    pollux("bert-2", 200, "bert", 2, 24, "B"),
    pollux("ncf-2", 300, "ncf", 2, 512, "D"),
]


def test_same_seed_same_result():
    cfg = SimConfig(nodes=2, gpus_per_node=4, seed=3)
    a = Simulator(SMALL_POLLUX, "ones", config=cfg).run()
    b = Simulator(SMALL_POLLUX, "ones", config=cfg).run()
    assert a.jobs == b.jobs
    assert a.utilization == b.utilization and a.rounds == b.rounds
    assert all(j.finish_time is not None for j in a.jobs)
    assert [j.name for j in a.jobs] == [j.name for j in SMALL_POLLUX]   # in submit order


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_the_small_pollux_workload(policy):
    res = Simulator(SMALL_POLLUX, policy, config=SimConfig(nodes=2)).run()
    assert res.policy == policy and len(res.jobs) == len(SMALL_POLLUX)
    assert all(j.finish_time is not None and j.jct > 30 for j in res.jobs)
    assert res.rounds > 0 and all(0 <= busy <= total == 8 for _, busy, total in res.utilization)


# 13 GPUs asked on 8: elastic convergence jobs and fixed-work jobs (one spans both nodes)
CROWDED = [
    pollux("c1", 0, "cifar10", 2, 256, "A"),
    pollux("b1", 10, "bert", 4, 48, "B"),
    pollux("n1", 20, "ncf", 1, 256, "D"),
    fixed("f1", 30, 4, 2000, 0.5, app_class="A"),
    pollux("c2", 40, "cifar10", 4, 512, "A"),
    fixed("f2", 50, 8, 1000, 0.3, app_class="B", application="bert"),
    pollux("b2", 60, "bert", 2, 24, "B"),
]
TIRESIAS_FAST = {"queue_thresholds": [600.0]}


def params_for(policy):
    return TIRESIAS_FAST if policy == "tiresias" else None


@pytest.mark.parametrize("grow", ["requeue", "extension"])
@pytest.mark.parametrize(("policy", "variability", "granularity"),
                         [(p, False, "node") for p in POLICIES]
                         + [("ones-pal", True, "node"), ("tiresias", True, "node")]
                         + [(p, False, "gpu") for p in ("dp", "jct", "pollux")])
def test_invariants_on_a_crowded_cluster(policy, variability, granularity, grow):
    cfg = SimConfig(nodes=2, variability=variability, seed=4, granularity=granularity, grow=grow)
    sim = Checked(CROWDED, policy, policy_params=params_for(policy), config=cfg)
    res = sim.run()
    assert sim.checks > sim.rounds > 0
    if not variability:     # the run covers what the policy does: requeues, preemptions
        # (by extension a grow restarts nothing: it is a resize)
        moved = sum(j.restarts + (j.resizes if grow == "extension" else 0) for j in res.jobs)
        assert moved == 0 if policy == "static" else moved > 0, res.jobs
    assert sim.cluster.free.all()                              # every GPU free again at the end
    periodic = replace(cfg, event_rounds=False)
    crowded = by_name(res if not sim.event_rounds else Simulator(
        CROWDED, policy, policy_params=params_for(policy), config=periodic).run())
    for j, wj in zip(res.jobs, sorted(CROWDED, key=lambda w: w.submit_time)):
        assert j.name == wj.name
        assert j.finish_time is not None, j
        assert j.start_time >= j.submit_time
        if variability:
            continue
        if wj.iterations is not None:
            lone = 30 + wj.iterations * wj.iteration_time * (1.7 if wj.gpus > 4 else 1.0)
            assert j.jct >= lone - 1e-6, (j, lone)
        if (policy, granularity, grow) == ("jct", "gpu", "extension"):
            # not an invariant here: alone, n1 (ncf) is planned a cheap grow by extension that
            # the no-thrash hold defers for three rounds, and the batch-size change of that
            # plan is deferred with it; on the crowded cluster it gets the batch change at once
            continue
        # alone on the cluster under the same policy it would not have done worse; with
        # periodic rounds only: a policy that rounds on events (jct) gets more rounds, sooner,
        # on the crowded cluster (every arrival and end is one), so n1's batch change comes
        # before the periodic round it waits for alone
        alone = Simulator([wj], policy, policy_params=params_for(policy), config=periodic).run()
        assert crowded[j.name].jct >= alone.jobs[0].jct - 1e-6, (j, alone.jobs[0])


# --- preemption ---------------------------------------------------------------------------------


def test_tiresias_preempts_a_long_big_job_for_small_ones():
    """One 4-GPU node, tiresias with one threshold at 600 GPU-s.

    big (4 GPUs, 10000 x 1 s) starts at 0 (work from 30). s1, s2 (2 GPUs, 100 x 1 s) arrive at
    1000 and 1010: at the round at 1020 big (4080 GPU-s, queue 1) is preempted with 990 steps
    done; s1 and s2 run 1020 -> 1150. big is held until the round at 1200, works from 1230.
    s3 (2 GPUs) at 5000 preempts it again at the round at 5040 (990 + 3810 = 4800 steps done)
    and runs 5040 -> 5170; big comes back at the round at 5220 and ends at
    5220 + 30 + 5200 = 10450, having held 4 GPUs for 1020 + 3840 + 5230 s."""
    jobs = [fixed("big", 0, 4, 10000), fixed("s1", 1000, 2, 100), fixed("s2", 1010, 2, 100),
            fixed("s3", 5000, 2, 100)]
    sim = Checked(jobs, "tiresias", policy_params=TIRESIAS_FAST, config=SimConfig(nodes=1))
    assert sim.cfg.costs.preemption
    r = by_name(sim.run())
    assert r["big"].restarts == 2
    assert r["big"].finish_time == pytest.approx(10450.0, abs=1e-6)
    assert r["big"].gpu_seconds == pytest.approx(4 * (1020 + 3840 + 5230), abs=1e-6)
    for name, start in (("s1", 1020.0), ("s2", 1020.0), ("s3", 5040.0)):
        assert r[name].start_time == start
        assert r[name].finish_time == pytest.approx(start + 130, abs=1e-6)
        assert r[name].restarts == 0
    assert not any(j.held for j in sim.jobs)


def test_without_preemption_tiresias_lets_the_big_job_run():
    jobs = [fixed("big", 0, 4, 10000), fixed("s1", 1000, 2, 100)]
    cfg = SimConfig(nodes=1, costs=Costs())
    r = by_name(Checked(jobs, "tiresias", policy_params=TIRESIAS_FAST, config=cfg).run())
    assert r["big"].restarts == 0
    assert r["big"].finish_time == pytest.approx(10030.0, abs=1e-6)
    assert r["s1"].start_time == r["big"].finish_time


# --- reconcile: preempt and held ----------------------------------------------------------------


def view(job_id, state, nodes, *, held=False, batch=64, busy=False):
    return JobView(job_id=job_id, state=state, nodes=nodes,
                   node_names=("n1", "n2")[:nodes] if state == "RUNNING" else (),
                   limits=JobLimits(2, 1, 2, batch, batch, None, batch, "sqrt"), batch_size=batch,
                   submit_time=0.0, held=held, busy=busy)


def snapshot(*jobs):
    nodes = (NodeView("n1", 2, 2, "allocated"), NodeView("n2", 2, 2, "allocated"))
    return ClusterSnapshot(time=0.0, nodes=nodes, jobs=tuple(jobs))


def plan(*targets):
    return Plan("test", tuple(JobTarget(j, n, b, f"why {j}") for j, n, b in targets))


def test_reconcile_preempts_only_with_preemption_on():
    snap = snapshot(view("R", "RUNNING", 2))
    p = plan(("R", 0, 64))
    changes, _ = reconcile(p, snap, Costs(preemption=True))
    assert [(c.job_id, c.kind, c.from_nodes, c.to_nodes, c.from_batch_size, c.to_batch_size,
             c.reason) for c in changes] == [("R", "preempt", 2, 0, 64, 64, "why R")]
    changes, notes = reconcile(p, snap)
    assert changes == []
    assert len(notes) == 1 and notes[0].startswith("job R: why R") and "preemption" in notes[0]


def test_reconcile_leaves_a_busy_job_alone_even_with_preemption():
    changes, _ = reconcile(plan(("R", 0, 64)), snapshot(view("R", "RUNNING", 2, busy=True)),
                           Costs(preemption=True))
    assert changes == []


def test_reconcile_releases_a_held_job_the_plan_gives_gpus():
    held = view("H", "PENDING", 2, held=True)
    changes, _ = reconcile(plan(("H", 1, 64)), snapshot(held))
    assert [(c.job_id, c.kind, c.from_nodes, c.to_nodes) for c in changes] == [
        ("H", "pending", 2, 1)]
    # same size as it has: still a change (it must be released), unlike a job that is not held
    changes, _ = reconcile(plan(("H", 2, 64)), snapshot(held))
    assert [(c.kind, c.to_nodes) for c in changes] == [("pending", 2)]
    changes, _ = reconcile(plan(("P", 2, 64)), snapshot(view("P", "PENDING", 2)))
    assert changes == []
    # given nothing, it stays held
    changes, notes = reconcile(plan(("H", 0, 64)), snapshot(held))
    assert changes == [] and notes == ["job H: why H"]


def test_reconcile_orders_a_preemption_before_the_release_it_makes_room_for():
    snap = snapshot(view("R", "RUNNING", 2), view("H", "PENDING", 2, held=True))
    changes, _ = reconcile(plan(("H", 2, 64), ("R", 0, 64)), snap, Costs(preemption=True))
    assert [(c.job_id, c.kind) for c in changes] == [("R", "preempt"), ("H", "pending")]


@pytest.mark.parametrize(("free", "count", "required", "nodes", "per_node"), [
    ([4, 4, 4], 6, (), ("n1", "n2"), (4, 2)),          # packed: a whole node, then the rest
    ([4, 2, 4], 2, (), ("n2",), (2,)),                 # best fit: the node with 2 free
    ([1, 1, 1], 3, (), ("n1", "n2", "n3"), (1, 1, 1)),
    ([4, 4, 4], 5, ("n2", "n3"), ("n2", "n3"), (4, 1)),
    ([1, 1, 1], 4, (), None, None),                    # does not fit: nothing taken
])
def test_allocate_gpus_packs(free, count, required, nodes, per_node):
    from hpcsched.sim.cluster import SimCluster
    c = SimCluster(len(free), 4)
    for i, f in enumerate(free):
        c.free[i, f:] = False
    before = c.free.copy()
    got = c.allocate_gpus(count, required)
    if nodes is None:
        assert got is None and (c.free == before).all()
        return
    names, gpus = got
    assert names == nodes and len(gpus) == count
    assert tuple(sum(1 for n, _ in gpus if n == c.node_index[x]) for x in names) == per_node
    assert all(before[n, g] for n, g in gpus) and not any(c.free[n, g] for n, g in gpus)


def test_a_gpu_granular_run_keeps_its_bookkeeping_and_logs_its_resizes():
    sim = Checked(SMALL_POLLUX, "jct", config=SimConfig(nodes=2, granularity="gpu"))
    res = sim.run()
    assert all(j.finish_time is not None for j in res.jobs)
    logs = [e for j in res.jobs for e in j.resize_log]
    assert logs and all(before != after for _, _, before, after in logs)
    assert sum(j.resizes for j in res.jobs) == sum(1 for _, _, b, a in logs if b and a)


class Snapshots(Simulator):
    """Keeps every round's snapshot."""

    def _round(self):
        self.snaps.append(self.snapshot())
        super()._round()


@pytest.mark.parametrize("early", [True, False])
def test_a_job_reports_its_work_before_it_starts_only_with_early_reports(early):
    """One 4-GPU node: a (4 GPUs) runs; b (4 GPUs) arrives and waits. With early reports (the
    default) b's view has its remaining work from the start; without (as on Slurm: no progress
    file before the first step, ``replay --compare``) only once it has started."""
    jobs = [WorkloadJob("a", 0.0, "cifar10", 4, 512, "A"), WorkloadJob("b", 1.0, "cifar10", 4, 512, "A")]
    sim = Snapshots(jobs, "static", config=SimConfig(nodes=1, interval=5.0, early_reports=early,
                                                     work_scale=0.01))
    sim.snaps = []
    sim.run()
    views = [(v.state, v.remaining_samples, v.grad_noise) for s in sim.snaps for v in s.jobs
             if v.job_id == "2"]
    pending = [v for v in views if v[0] == "PENDING"]
    running = [v for v in views if v[0] == "RUNNING"]
    assert pending and running
    assert all((r is not None and n is not None) == early for _, r, n in pending), pending
    assert all(r is not None and n is not None for _, r, n in running), running


def test_the_hold_stops_reversals_only():
    """Reconcile's no-thrash hold (``hold_rounds`` 3 x 60 s) in a whole run: no job is resized
    back the other way within the hold, while jobs grow again, or are resized just after they
    started, within it (the hold before 2026-11-26 held those too)."""
    name, jobs = load_workload("pollux:1@0.5")
    res = Simulator(jobs, "jct", workload_name=name, config=SimConfig(granularity="gpu")).run()
    hold = 180.0
    same_way = after_start = 0
    for j in res.jobs:
        moves = [(t, 1 if b > a else -1) for t, _, a, b in j.resize_log if a != b]
        for (t0, d0), (t1, d1) in zip(moves, moves[1:]):
            if t1 - t0 < hold:
                assert d0 == d1, (j.name, j.resize_log)
                same_way += 1
        if moves and j.start_time is not None and moves[0][0] - j.start_time < hold:
            after_start += 1
    assert same_way > 0 and after_start > 0


class _RoundTimes(Simulator):
    """Records when each round ran."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.times = []

    def _round(self):
        self.times.append(self.now)
        super()._round()


@pytest.mark.parametrize(("policy", "event_rounds", "extra"), [
    ("jct", True, True),        # jct asks for rounds at events
    ("jct", False, False),      # ... the configuration can turn them off
    ("dp", True, False),        # a policy that does not ask keeps the periodic rounds only
])
def test_rounds_at_job_ends_and_at_submissions_that_find_no_room(policy, event_rounds, extra):
    """For a policy with ``round_on_events``, a round runs the moment a job ends (while others
    remain) and the moment a submitted job cannot start; otherwise only every ``interval``."""
    jobs = [pollux("a", 0.0, "ncf", 64, 512, "A"), pollux("b", 10.0, "ncf", 4, 512, "A"),
            pollux("c", 15.0, "ncf", 4, 512, "A")]
    cfg = SimConfig(granularity="gpu", event_rounds=event_rounds)
    sim = _RoundTimes(jobs, policy, config=cfg)
    res = sim.run()
    off_grid = [t for t in sim.times if t % cfg.interval]
    assert bool(off_grid) == extra, sim.times
    if extra:
        ends = sorted(j.finish_time for j in res.jobs)[:-1]    # the last end leaves no one
        assert set(ends) <= set(sim.times), (ends, sim.times)
        assert 10.0 in sim.times                # b arrived with the cluster full: a round
    assert res.params["event_rounds"] is event_rounds


def test_a_simulation_runs_the_garbage_collector_less_often_and_restores_it(monkeypatch):
    """Inside a run the collector's first threshold is raised to GC_THRESHOLD (the others
    kept); after it, and after an error inside, the thresholds are what they were."""
    import gc

    from hpcsched.sim import engine

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        seen = []
        real = engine.Simulator._round
        monkeypatch.setattr(engine.Simulator, "_round",
                            lambda self: seen.append(gc.get_threshold()) or real(self))
        engine.simulate([fixed("j0", 0.0, 2, 50)], "dp")
        assert seen and set(seen) == {(engine.GC_THRESHOLD, 11, 12)}
        assert gc.get_threshold() == (700, 11, 12)
        with pytest.raises(RuntimeError), engine.fewer_collections(5000):
            assert gc.get_threshold() == (5000, 11, 12)
            raise RuntimeError
        assert gc.get_threshold() == (700, 11, 12)
    finally:
        gc.set_threshold(*before)
