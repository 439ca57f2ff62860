"""The discrete-event simulator: a simulated Slurm cluster, driven by the daemon's own round.

Events, in time order: a job is submitted; a job finishes; a round of the policy (every
``interval`` seconds, 60 by default, as Pollux's simulator). Between events every running job
advances analytically (:mod:`hpcsched.sim.physics`); nothing is sampled per step.

What is the same as the daemon (that is the point: a simulated result says something about the
real cluster):

* the cluster is observed through the backend interface (:class:`SimBackend` implements
  :class:`hpcsched.slurm.observe.Backend`; its ``observe()`` returns the same
  :class:`~hpcsched.slurm.observe.Observation` of Slurm nodes and jobs);
* the policy is the very object the daemon runs (:func:`hpcsched.policies.make_policy`), on a
  :class:`~hpcsched.policies.snapshot.ClusterSnapshot` built from the same kind of data the daemon has
  (each job's measured profile, gradient noise, remaining work, attained service), with seed
  ``seed + round``;
* the plan goes through the daemon's :func:`hpcsched.policies.reconcile.reconcile` (restart cost versus
  predicted gain, grows only where Slurm can place them now);
* changes are applied as the actuator applies them on Slurm: a batch-size change in place at no
  cost; a shrink in place, keeping the first nodes of the allocation (Slurm's rule), costing
  ``shrink_cost`` seconds; a grow by requeue -- the job gives its GPUs back, waits as a pending job
  with its new size and node list, and pays the application's restart cost when it starts again;
  a pending job's size, batch size and node list are set before it starts.

The simulated Slurm (what Slurm does without hpcsched): pending jobs are considered in priority
order (submission order; a requeued job keeps its place) whenever something changes -- a job is
submitted or ends, or a round has applied its changes -- and each one that fits now starts (jobs
behind one that does not fit may start: with unlimited time limits Slurm's backfill can start
anything that fits). A job with a node list (``ReqNodeList``) starts only on those nodes;
otherwise on the nodes with the fewest free GPUs that still hold its GPUs per node, lowest name
first; on a node it takes the lowest-numbered free GPUs. Every start pays the application's
restart cost (processes, framework import, data loading and checkpoint restore: Pollux's
simulator charges its 30 s at every allocation, the first included).

Units: seconds from the start of the trace, samples, GPUs.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from hpcsched.slurm.observe import Observation
from hpcsched.protocol.batching import BatchConfig, BatchSizeError, fit_batch
from hpcsched.policies import make_policy
from hpcsched.policies.reconcile import Change, Costs, reconcile
from hpcsched.slurm import JobInfo
from hpcsched.policies.snapshot import ClusterSnapshot, GPUView, JobView, NodeView, ProfilePoint
from hpcsched.sim import JobResult, SimResult, WorkloadJob
from hpcsched.sim.physics import Application, FixedWork, application, draw_gpu_slowdowns

CLASSES = ("A", "B", "C", "D")


class SimulationError(ValueError):
    """A workload or setting the simulator cannot run (e.g. a job larger than the cluster)."""


@dataclass(frozen=True)
class SimConfig:
    """Simulation settings.

    Attributes:
        nodes, gpus_per_node: the cluster (default 16 x 4, Pollux's and PAL's 64 GPUs).
        interval: seconds between policy rounds.
        restart_cost: seconds a start or restart costs, per application (``"*"``: default for
            the others).
        shrink_cost: seconds an in-place shrink costs (checkpoint and re-forming the group).
        variability: draw per-GPU slowdowns from the Longhorn measurements (PAL); off: every
            GPU is a median GPU.
        locality_penalty: slowdown of a fixed-work job that spans nodes (PAL's ``L``; Pollux
            applications have measured cross-node step times instead).
        seed: seeds the GPU draws and (``seed + round``) the policy.
        costs: the reconcile parameters: the daemon's defaults, plus preemption (a running job a
            plan gives 0 nodes is checkpointed, requeued and held until a plan gives it GPUs).
        max_time: stop after this many simulated seconds (jobs still running are reported
            unfinished).
        hold_new_jobs: jobs arrive held and start only when a plan gives them GPUs (a what-if:
            ``hpcsub --hold`` with the daemon releasing each job onto the nodes its placement
            chose). Off (default), Slurm starts a job that fits the moment it arrives, as it does
            today, and a placement stage only places the jobs that had to wait.
    """

    nodes: int = 16
    gpus_per_node: int = 4
    interval: float = 60.0
    restart_cost: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({"*": 30.0}))
    shrink_cost: float = 2.0
    variability: bool = False
    locality_penalty: float = 1.7
    seed: int = 0
    costs: Costs = Costs(preemption=True, place_pending=True)
    max_time: float = 60 * 86400.0
    hold_new_jobs: bool = False

    def restart_cost_for(self, app: str) -> float:
        return float(self.restart_cost.get(app, self.restart_cost.get("*", 30.0)))


def job_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """``(nodes, gpus per node)`` a user asks Slurm for to get ``gpus`` GPUs: one node when they
    fit on one, else whole nodes when ``gpus`` divides evenly, else the largest GPUs-per-node
    that divides it (6 GPUs on 4-GPU nodes: 2 nodes x 3)."""
    if gpus <= gpus_per_node:
        return 1, gpus
    for wpn in range(gpus_per_node, 0, -1):
        if gpus % wpn == 0:
            return gpus // wpn, wpn
    return gpus, 1  # pragma: no cover - wpn = 1 always divides


@dataclass
class _Job:
    """Mutable simulation state of one job (the engine's own; policies see :class:`JobView`)."""

    wj: WorkloadJob
    job_id: str
    app: Application | None
    fixed: FixedWork | None
    wpn: int
    nodes: int
    min_nodes: int
    max_nodes: int
    batch_size: int
    min_batch: int
    max_batch: int
    max_local: int | None
    base_batch: int
    cfg: BatchConfig
    state: str = "FUTURE"            # FUTURE, PENDING, RUNNING, DONE
    node_names: tuple[str, ...] = ()
    gpus: tuple[tuple[int, int], ...] = ()   # (node index, gpu index)
    req_nodes: tuple[str, ...] = ()
    held: bool = False
    progress: float = 0.0            # Pollux progress units, or iterations for fixed work
    blocked_until: float = 0.0
    updated: float = 0.0
    start_time: float | None = None
    finish_time: float | None = None
    restarts: int = 0
    resizes: int = 0
    gpu_seconds: float = 0.0
    max_gpus: int = 0
    steps: dict = field(default_factory=dict)   # (world, nodes, local, accum) -> [time, steps]
    last_step_time: float = 0.0
    eta: float | None = None         # cached finish time (None: recompute)
    st: float | None = None          # cached seconds per step at the current configuration

    @property
    def total(self) -> float:
        return self.fixed.iterations if self.fixed is not None else self.app.total_progress

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.wpn


class SimBackend:
    """The simulated cluster behind :class:`hpcsched.slurm.observe.Backend`: ``observe()`` reports
    its nodes and jobs as Slurm would (``squeue``/``sinfo``), one call per observation."""

    name = "simulated"

    def __init__(self, sim: Simulator):
        self._sim = sim
        self.calls = 0

    def observe(self) -> Observation:
        self.calls += 1
        return Observation(time=self._sim.now, nodes=self._sim.node_views(),
                           jobs=MappingProxyType(self._sim.job_infos()), calls=1)


class Simulator:
    """One policy on one workload (see the module docstring).

    Raises:
        SimulationError: a job that could never fit on the cluster.
        hpcsched.policies.PolicyError: unknown policy or parameters.
    """

    def __init__(self, jobs: Sequence[WorkloadJob], policy: str, *,
                 policy_params: Mapping | None = None, config: SimConfig = SimConfig(),
                 workload_name: str = ""):
        self.cfg = config
        self.policy_name = policy
        self.policy = make_policy(policy, dict(policy_params or {}))
        self.workload_name = workload_name
        self.now = 0.0
        self.node_names = tuple(f"n{i + 1}" for i in range(config.nodes))
        self._node_index = {n: i for i, n in enumerate(self.node_names)}
        self.free = np.ones((config.nodes, config.gpus_per_node), dtype=bool)
        if config.variability:
            self.slow = draw_gpu_slowdowns(config.nodes * config.gpus_per_node, CLASSES,
                                           config.seed).reshape(config.nodes, config.gpus_per_node,
                                                                len(CLASSES))
        else:
            self.slow = np.ones((config.nodes, config.gpus_per_node, len(CLASSES)))
        self.jobs = [self._make_job(i, wj) for i, wj in
                     enumerate(sorted(jobs, key=lambda j: (j.submit_time, j.name)))]
        self._gpu_views = self._make_gpu_views() if config.variability else ()
        self.backend = SimBackend(self)
        self.rounds = 0
        self.utilization: list[tuple[float, int, int]] = []
        self.notes: list[str] = []

    # ----------------------------------------------------------------------- set-up
    def _make_job(self, i: int, wj: WorkloadJob) -> _Job:
        c = self.cfg
        if wj.gpus > c.nodes * c.gpus_per_node:
            raise SimulationError(f"job {wj.name} asks for {wj.gpus} GPUs; the cluster has "
                                  f"{c.nodes * c.gpus_per_node}")
        nodes, wpn = job_shape(wj.gpus, c.gpus_per_node)
        if nodes > c.nodes:
            raise SimulationError(f"job {wj.name} asks for {wj.gpus} GPUs, which Slurm gives as "
                                  f"{nodes} node(s) x {wpn} GPU(s); the cluster has {c.nodes} "
                                  "node(s)")
        if wj.iterations is not None:
            fixed = FixedWork(float(wj.iterations), float(wj.iteration_time or 1.0))
            app = None
            lo = hi = base = wj.batch_size
            max_local = None
            min_nodes = max_nodes = nodes
        else:
            fixed = None
            app = application(wj.application)
            base = app.init_batch_size
            lo, hi = min(base, wj.batch_size), max(app.max_batch_size, wj.batch_size)
            max_local = app.max_local_bsz
            min_nodes = 1
            max_nodes = max(nodes, min(c.nodes, hi // max(1, app.min_local_bsz * wpn)))
        if fixed is not None:
            # a fixed-work job's batch size does not change its run time: keep it as close as
            # the GPUs allow (a whole number of samples per GPU), and never resize it
            per_gpu = max(1, -(-wj.batch_size // (nodes * wpn)))
            cfg = BatchConfig(nodes * wpn, per_gpu, 1)
            lo = hi = base = cfg.global_batch_size
        else:
            try:
                cfg = fit_batch(wj.batch_size, nodes * wpn, min_global=lo, max_global=hi,
                                max_local_batch_size=max_local)
            except BatchSizeError as exc:
                raise SimulationError(f"job {wj.name}: {exc}") from None
        return _Job(wj=wj, job_id=str(i + 1), app=app, fixed=fixed, wpn=wpn, nodes=nodes,
                    min_nodes=min_nodes, max_nodes=max_nodes, batch_size=cfg.global_batch_size,
                    min_batch=lo, max_batch=hi, max_local=max_local, base_batch=base, cfg=cfg)

    def _make_gpu_views(self) -> tuple[GPUView, ...]:
        return tuple(GPUView(node=self.node_names[n], index=g,
                             slowdown=tuple((c, float(self.slow[n, g, k]))
                                            for k, c in enumerate(CLASSES)))
                     for n in range(self.cfg.nodes) for g in range(self.cfg.gpus_per_node))

    # ----------------------------------------------------------------------- physics
    def _rate(self, j: _Job, progress: float) -> tuple[float, float]:
        """``(progress per second, seconds per step)`` of running job ``j`` at ``progress``."""
        st = j.st
        if st is None:
            if j.fixed is not None:
                st = j.fixed.step_time(len(j.node_names), self._slowdown(j),
                                       self.cfg.locality_penalty)
            else:
                st = j.app.step_time(tuple(j.wpn for _ in j.node_names), j.cfg.local_batch_size,
                                     j.cfg.accumulation_steps) * self._slowdown(j)
            j.st = st
        if j.fixed is not None:
            return 1.0 / st, st
        gain = j.app.gain(j.cfg.global_batch_size, j.app.epoch_at(progress))
        return gain / st, st

    def _slowdown(self, j: _Job) -> float:
        """The slowest of the job's GPUs for its class: the pace it runs at (PAL §3)."""
        if j.wj.app_class not in CLASSES or not j.gpus:
            return 1.0
        k = CLASSES.index(j.wj.app_class)
        return float(max(self.slow[n, g, k] for n, g in j.gpus))

    def _segment_end(self, j: _Job, progress: float) -> float:
        """Progress at which the job's rate next changes (end of its epoch, or of its work)."""
        if j.fixed is not None:
            return j.total
        return min(j.total, j.app.epoch_end(j.app.epoch_at(progress)))

    def _advance(self, j: _Job, t: float) -> None:
        """Run ``j`` from ``j.updated`` to ``t`` (no further than the end of its work)."""
        if j.state != "RUNNING" or t <= j.updated:
            return
        j.gpu_seconds += (t - j.updated) * j.n_gpus
        cur = max(j.updated, j.blocked_until)
        j.updated = t
        while cur < t and j.progress < j.total:
            rate, st = self._rate(j, j.progress)
            end = self._segment_end(j, j.progress)
            dt = min(t - cur, (end - j.progress) / rate)
            key = (j.n_gpus, j.nodes, j.cfg.local_batch_size, j.cfg.accumulation_steps)
            acc = j.steps.setdefault(key, [0.0, 0.0])
            acc[0] += dt
            acc[1] += dt / st
            j.last_step_time = st
            j.progress = end if cur + dt < t else min(end, j.progress + rate * dt)
            cur += dt

    def _eta(self, j: _Job) -> float:
        """When running job ``j`` finishes if nothing changes; cached until its configuration
        changes (``j.eta = None``)."""
        if j.eta is None:
            cur, p = max(j.updated, j.blocked_until), j.progress
            while p < j.total * (1 - 1e-12):
                rate, _ = self._rate(j, p)
                end = self._segment_end(j, p)
                cur += (end - p) / rate
                p = end
            j.eta = cur
        return j.eta

    # ----------------------------------------------------------------------- Slurm
    def node_views(self) -> tuple[NodeView, ...]:
        used = (~self.free).sum(axis=1)
        return tuple(NodeView(name=n, gpus=self.cfg.gpus_per_node, gpus_allocated=int(used[i]),
                              state="mixed" if 0 < used[i] < self.cfg.gpus_per_node else
                              ("allocated" if used[i] else "idle"), partitions=("sim",))
                     for i, n in enumerate(self.node_names))

    def job_infos(self) -> dict[str, JobInfo]:
        out = {}
        for j in self.jobs:
            if j.state in ("PENDING", "RUNNING"):
                out[j.job_id] = JobInfo(
                    job_id=j.job_id, name=j.wj.name, user="sim", state=j.state,
                    state_reason="None" if j.state == "RUNNING" else "Resources",
                    partition="sim", nodes=",".join(j.node_names), node_count=j.nodes,
                    gpus_per_node=j.wpn, restarts=j.restarts, batch_host=(j.node_names or ("",))[0],
                    priority=len(self.jobs) - int(j.job_id))
        return out

    def _try_start(self, j: _Job) -> bool:
        free = self.free.sum(axis=1)
        if j.req_nodes:
            idx = [self._node_index[n] for n in j.req_nodes]
            if len(idx) != j.nodes or any(free[i] < j.wpn for i in idx):
                return False
        else:
            fits = [i for i in range(self.cfg.nodes) if free[i] >= j.wpn]
            if len(fits) < j.nodes:
                return False
            idx = sorted(sorted(fits, key=lambda i: (free[i], i))[:j.nodes])
        gpus = []
        for i in idx:
            g = np.flatnonzero(self.free[i])[:j.wpn]
            self.free[i, g] = False
            gpus.extend((i, int(x)) for x in g)
        j.gpus = tuple(gpus)
        j.node_names = tuple(self.node_names[i] for i in idx)
        j.req_nodes = ()
        j.state = "RUNNING"
        j.updated = self.now
        j.blocked_until = self.now + self.cfg.restart_cost_for(j.wj.application)
        if j.start_time is None:
            j.start_time = self.now
        j.max_gpus = max(j.max_gpus, j.n_gpus)
        j.eta = j.st = None
        return True

    def _release(self, j: _Job) -> None:
        for n, g in j.gpus:
            self.free[n, g] = True
        j.gpus, j.node_names = (), ()

    def _schedule(self) -> None:
        """Slurm's scheduling pass: pending jobs in priority order, each started if it fits."""
        if not self.free.any():
            return
        for j in self.jobs:
            if j.state == "PENDING" and not j.held:
                self._try_start(j)
                if not self.free.any():
                    return

    # ----------------------------------------------------------------------- the round
    def _view(self, j: _Job) -> JobView:
        profile = tuple(
            ProfilePoint(world_size=w, nodes=n, local_batch_size=m, accumulation_steps=s,
                         step_time=tt / k, throughput=w * m * s / (tt / k), samples=max(1, int(k)))
            for (w, n, m, s), (tt, k) in sorted(j.steps.items()) if k >= 1)
        if j.fixed is not None:
            remaining = (j.total - j.progress) * j.batch_size
            noise = None
        else:
            remaining = (j.total - j.progress) * j.base_batch
            noise = j.app.grad_stats(j.cfg.global_batch_size, j.app.epoch_at(j.progress))
        return JobView(
            job_id=j.job_id, state=j.state, nodes=j.nodes,
            node_names=j.node_names if j.state == "RUNNING" else j.req_nodes,
            workers_per_node=j.wpn, min_nodes=j.min_nodes, max_nodes=j.max_nodes,
            batch_size=j.batch_size, min_batch_size=j.min_batch, max_batch_size=j.max_batch,
            max_local_batch_size=j.max_local, base_batch_size=j.base_batch, lr_scaling="sqrt",
            submit_time=j.wj.submit_time, start_time=j.start_time, restarts=j.restarts,
            generation=j.resizes, samples_processed=0,
            throughput=(j.cfg.global_batch_size / j.last_step_time) if j.last_step_time else 0.0,
            # a Pollux application by name (its throughput prior; placement maps it to its PAL
            # class), a fixed-work job by its PAL class
            profile=profile, app_class=j.wj.app_class if j.fixed is not None else j.wj.application,
            busy=j.state == "RUNNING" and j.blocked_until > self.now, user="sim", partition="sim",
            attained_gpu_seconds=j.gpu_seconds, remaining_samples=remaining, grad_noise=noise,
            held=j.held)

    def snapshot(self) -> ClusterSnapshot:
        """What the daemon would see now (the observation plus the jobs' own reports)."""
        obs = self.backend.observe()
        active = {j.job_id: j for j in self.jobs if j.state in ("PENDING", "RUNNING")}
        views = tuple(self._view(active[jid]) for jid in obs.jobs if jid in active)
        return ClusterSnapshot(time=obs.time, nodes=obs.nodes, jobs=views, partitions=("sim",),
                               gpus=self._gpu_views)

    def _apply(self, c: Change) -> None:
        j = self.jobs[int(c.job_id) - 1]
        if c.kind == "preempt":
            c = replace(c, to_nodes=j.nodes)   # keeps its size for when it comes back
        try:
            cfg = fit_batch(c.to_batch_size, c.to_nodes * j.wpn, min_global=j.min_batch,
                            max_global=j.max_batch, max_local_batch_size=j.max_local)
        except BatchSizeError as exc:
            self.notes.append(f"t={self.now:.0f} job {j.wj.name}: {c.kind} not applied: {exc}")
            return
        j.eta = j.st = None
        if c.kind == "pending" and j.state == "PENDING":
            j.nodes, j.cfg, j.batch_size = c.to_nodes, cfg, cfg.global_batch_size
            j.req_nodes = tuple(c.placement)
            j.held = False
        elif c.kind == "preempt" and j.state == "RUNNING":
            self._release(j)
            j.state, j.held = "PENDING", True
            j.restarts += 1
        elif c.kind == "batch" and j.state == "RUNNING":
            j.cfg, j.batch_size = cfg, cfg.global_batch_size
        elif c.kind == "shrink" and j.state == "RUNNING":
            keep = j.node_names[:c.to_nodes]
            for n, g in j.gpus:
                if self.node_names[n] not in keep:
                    self.free[n, g] = True
            j.gpus = tuple((n, g) for n, g in j.gpus if self.node_names[n] in keep)
            j.node_names, j.nodes = keep, c.to_nodes
            j.cfg, j.batch_size = cfg, cfg.global_batch_size
            j.blocked_until = max(j.blocked_until, self.now) + self.cfg.shrink_cost
            j.resizes += 1
        elif c.kind == "grow" and j.state == "RUNNING":
            self._release(j)
            j.state = "PENDING"
            j.nodes, j.cfg, j.batch_size = c.to_nodes, cfg, cfg.global_batch_size
            j.req_nodes = tuple(c.placement)
            j.restarts += 1
            j.resizes += 1

    def _round(self) -> None:
        for j in self.jobs:
            if j.state == "RUNNING":
                self._advance(j, self.now)
        snap = self.snapshot()
        if snap.jobs:
            plan = self.policy.decide(snap, seed=self.cfg.seed + self.rounds)
            changes, _ = reconcile(plan, snap, self.cfg.costs)
            for c in changes:
                self._apply(c)
        self.rounds += 1
        self._schedule()

    # ----------------------------------------------------------------------- main loop
    def run(self, progress: Callable[[float, int, int], None] | None = None) -> SimResult:
        """Run to the end of the workload (or ``max_time``) and report.

        ``progress(now, finished, total)`` is called after every round (for a progress bar).
        """
        t0 = time.perf_counter()
        arrivals = [(j.wj.submit_time, int(j.job_id)) for j in self.jobs]
        heapq.heapify(arrivals)
        done = 0
        total = len(self.jobs)
        next_round = 0.0
        while done < total and self.now <= self.cfg.max_time:
            # the next event: an arrival, a round, or the first finish before them
            t_arr = arrivals[0][0] if arrivals else math.inf
            running = [j for j in self.jobs if j.state == "RUNNING"]
            if not running and not any(j.state == "PENDING" for j in self.jobs):
                # idle cluster: jump to the round at or after the next arrival
                next_round = max(next_round, math.ceil(t_arr / self.cfg.interval)
                                 * self.cfg.interval)
            horizon = min(t_arr, next_round)
            etas = [(self._eta(j), int(j.job_id)) for j in running]
            t_fin, jid = min(etas, default=(math.inf, 0))
            if t_fin <= horizon:
                j = self.jobs[jid - 1]
                self.now = t_fin
                self._advance(j, t_fin)
                j.finish_time = t_fin
                j.state = "DONE"
                j.progress = j.total
                self._release(j)
                done += 1
                self._schedule()
                continue
            if t_arr <= next_round:
                self.now = t_arr
                while arrivals and arrivals[0][0] <= self.now:
                    _, i = heapq.heappop(arrivals)
                    self.jobs[i - 1].state = "PENDING"
                    self.jobs[i - 1].held = self.cfg.hold_new_jobs
                self._schedule()
                continue
            self.now = next_round
            self._round()
            busy = int((~self.free).sum())
            self.utilization.append((self.now, busy, self.free.size))
            next_round += self.cfg.interval
            if progress is not None:
                progress(self.now, done, total)
        return SimResult(
            policy=self.policy_name, workload=self.workload_name,
            jobs=tuple(JobResult(
                name=j.wj.name, application=j.wj.application, submit_time=j.wj.submit_time,
                start_time=j.start_time, finish_time=j.finish_time, gpu_seconds=j.gpu_seconds,
                restarts=j.restarts, resizes=j.resizes, requested_gpus=j.wj.gpus,
                max_gpus=j.max_gpus) for j in self.jobs),
            utilization=tuple(self.utilization), total_gpus=int(self.free.size),
            rounds=self.rounds, wall_seconds=time.perf_counter() - t0,
            params={"nodes": self.cfg.nodes, "gpus_per_node": self.cfg.gpus_per_node,
                    "interval": self.cfg.interval, "variability": self.cfg.variability,
                    "seed": self.cfg.seed, "restart_cost": dict(self.cfg.restart_cost)})


def simulate(jobs: Sequence[WorkloadJob], policy: str, **kw) -> SimResult:
    """Convenience: ``Simulator(jobs, policy, **kw).run()``."""
    return Simulator(jobs, policy, **kw).run()


__all__ = ["SimBackend", "SimConfig", "SimulationError", "Simulator", "job_shape", "simulate",
]
