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
anything that fits), placed by :class:`~hpcsched.sim.cluster.SimCluster`'s rule. Every start pays the application's
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

from hpcsched.daemon.views import JobFacts, JobReport, cluster_snapshot, job_view
from hpcsched.policies import make_policy
from hpcsched.policies.reconcile import Change, Costs
from hpcsched.policies.round import decide_round
from hpcsched.policies.snapshot import ClusterSnapshot, JobView, ProfilePoint
from hpcsched.protocol.batching import BatchConfig, BatchSizeError, fit_batch
from hpcsched.protocol.kinds import ChangeKind
from hpcsched.protocol.limits import JobLimits
from hpcsched.sim import JobResult, SimResult, WorkloadJob
from hpcsched.sim.cluster import CLASSES, PARTITION, SimBackend, SimCluster, job_info
from hpcsched.sim.physics import Application, FixedWork, application


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
        variability: per-GPU slowdowns (PAL, Jain et al., SC'24): ``False``, every GPU is a
            median GPU; ``True`` or ``"longhorn"``, one draw per GPU from the Longhorn
            measurements, shared by all classes; ``"pal"``, PAL's own simulator's per-class
            profiles (``32gpu-variability.csv``, :func:`hpcsched.sim.physics.pal_gpu_slowdowns`).
        granularity: ``"node"``, jobs are whole nodes x the GPUs per node they were submitted
            with (what the actuator does on Slurm today); ``"gpu"``, plans speak GPUs and a job
            may hold any count per node (4 + 2).
        locality_penalty: slowdown of a fixed-work job that spans nodes (PAL's ``L``; Pollux
            applications have measured cross-node step times instead).
        seed: seeds the GPU draws and (``seed + round``) the policy.
        costs: the reconcile parameters: the daemon's defaults, plus preemption (a running job a
            plan gives 0 nodes is checkpointed, requeued and held until a plan gives it GPUs).
            Its restart and shrink costs and its no-thrash hold are replaced by this
            configuration's (``restart_cost["*"]``, ``shrink_cost``, ``hold_rounds`` x
            ``interval``): reconcile weighs a resize with the costs the simulation charges.
        hold_rounds: rounds a resized job is held at its size (reconcile's no-thrash hold).
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
    variability: bool | str = False
    locality_penalty: float = 1.7
    seed: int = 0
    costs: Costs = Costs(preemption=True, place_pending=True)
    max_time: float = 60 * 86400.0
    hold_new_jobs: bool = False
    granularity: str = "node"
    hold_rounds: int = 3

    def restart_cost_for(self, app: str) -> float:
        return float(self.restart_cost.get(app, self.restart_cost.get("*", 30.0)))


def job_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """``(nodes, gpus per node)`` a user asks Slurm for to get ``gpus`` GPUs: one node when they
    fit on one, else whole nodes when ``gpus`` divides evenly, else the largest GPUs-per-node
    that divides it (6 GPUs on 4-GPU nodes: 2 nodes x 3)."""
    if gpus <= gpus_per_node:
        return 1, gpus
    for per_node in range(gpus_per_node, 0, -1):
        if gpus % per_node == 0:
            return gpus // per_node, per_node
    return gpus, 1  # pragma: no cover - 1 always divides


@dataclass
class _Job:
    """Mutable simulation state of one job (the engine's own; policies see :class:`JobView`).

    Physics (:mod:`hpcsched.sim.physics`): a Pollux application advances in Pollux progress
    units (one unit = one step at the base batch size, times the statistical efficiency of the
    batch size in force); a fixed-work job in iterations.
    """

    wj: WorkloadJob
    job_id: str
    app: Application | None
    fixed: FixedWork | None
    limits: JobLimits
    nodes: int
    cfg: BatchConfig
    size: int = 0                    # GPUs held (running) or asked for (pending)
    granular: bool = False           # GPU-granular: any count per node, packed
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
    resize_log: list = field(default_factory=list)   # (time, round, GPUs before, after)
    resized_at: float | None = None
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
    def per_node(self) -> int:
        """GPUs (workers) per node."""
        return self.limits.workers_per_node

    @property
    def n_gpus(self) -> int:
        return self.size

    @property
    def layout(self) -> tuple[int, ...]:
        """GPUs on each node of the allocation, in node order (running)."""
        counts: dict[int, int] = {}
        for n, _ in self.gpus:
            counts[n] = counts.get(n, 0) + 1
        return tuple(counts[n] for n in sorted(counts))

    def fit(self, batch_size: int, gpus: int) -> BatchConfig:
        """The batch configuration nearest ``batch_size`` on ``gpus`` GPUs within the job's
        limits.

        Raises:
            BatchSizeError: none fits.
        """
        lim = self.limits
        return fit_batch(batch_size, gpus, min_global=lim.min_batch_size,
                         max_global=lim.max_batch_size, max_local_batch_size=lim.max_local_batch_size)

    @property
    def batch_size(self) -> int:
        return self.cfg.global_batch_size

    def rate(self, progress: float, slowdown: float, locality_penalty: float) -> tuple[float, float]:
        """``(progress per second, seconds per step)`` while running at ``progress`` on GPUs
        whose slowest is ``slowdown``."""
        st = self.st
        if st is None:
            if self.fixed is not None:
                st = self.fixed.step_time(len(self.node_names), slowdown, locality_penalty)
            else:
                st = self.app.step_time(self.layout, self.cfg.local_batch_size,
                                        self.cfg.accumulation_steps) * slowdown
            self.st = st
        if self.fixed is not None:
            return 1.0 / st, st
        gain = self.app.gain(self.cfg.global_batch_size, self.app.epoch_at(progress))
        return gain / st, st

    def segment_end(self, progress: float) -> float:
        """Progress at which the rate next changes (end of its epoch, or of its work)."""
        if self.fixed is not None:
            return self.total
        return min(self.total, self.app.epoch_end(self.app.epoch_at(progress)))

    def remaining_samples(self) -> float:
        """Samples left: progress units at the base batch size (iterations at the batch size
        for fixed work)."""
        if self.fixed is not None:
            return (self.total - self.progress) * self.batch_size
        return (self.total - self.progress) * self.limits.base_batch_size

    def profile(self) -> tuple[ProfilePoint, ...]:
        """What the job has measured: mean step time and throughput per configuration."""
        return tuple(
            ProfilePoint(world_size=w, nodes=n, local_batch_size=m, accumulation_steps=s,
                         step_time=tt / k, throughput=w * m * s / (tt / k), samples=max(1, int(k)))
            for (w, n, m, s), (tt, k) in sorted(self.steps.items()) if k >= 1)

    def report(self) -> JobReport:
        """What the job's progress file would say."""
        noise = None if self.fixed is not None else self.app.grad_stats(
            self.cfg.global_batch_size, self.app.epoch_at(self.progress))
        return JobReport(
            remaining_samples=self.remaining_samples(), grad_noise=noise,
            throughput=(self.cfg.global_batch_size / self.last_step_time)
            if self.last_step_time else 0.0)

    def result(self) -> JobResult:
        wj = self.wj
        return JobResult(name=wj.name, application=wj.application, submit_time=wj.submit_time,
                         start_time=self.start_time, finish_time=self.finish_time,
                         gpu_seconds=self.gpu_seconds, restarts=self.restarts,
                         resizes=self.resizes, requested_gpus=wj.gpus, max_gpus=self.max_gpus,
                         resize_log=tuple(self.resize_log))


def _limits(wj: WorkloadJob, cfg: SimConfig) -> tuple[Application | None, FixedWork | None,
                                                        int, JobLimits, int]:
    """``(application, fixed work, nodes, limits, requested batch size)`` of a workload job.

    Raises:
        SimulationError: the job can never fit the cluster, or its limits are inconsistent.
    """
    if wj.gpus > cfg.nodes * cfg.gpus_per_node:
        raise SimulationError(f"job {wj.name} asks for {wj.gpus} GPUs; the cluster has "
                              f"{cfg.nodes * cfg.gpus_per_node}")
    nodes, per_node = job_shape(wj.gpus, cfg.gpus_per_node)
    if nodes > cfg.nodes:
        raise SimulationError(f"job {wj.name} asks for {wj.gpus} GPUs, which Slurm gives as "
                              f"{nodes} node(s) x {per_node} GPU(s); the cluster has {cfg.nodes} "
                              "node(s)")
    if wj.iterations is not None:
        # a fixed-work job's batch size does not change its run time: keep it as close as the
        # GPUs allow (a whole number of samples per GPU), and never resize it
        fixed = FixedWork(float(wj.iterations), float(wj.iteration_time or 1.0))
        per_gpu = max(1, -(-wj.batch_size // (nodes * per_node)))
        gbs = nodes * per_node * per_gpu
        limits = JobLimits(per_node, nodes, nodes, gbs, gbs, None, gbs, "sqrt")
        return None, fixed, nodes, limits, gbs
    app = application(wj.application)
    base = app.init_batch_size
    lo, hi = min(base, wj.batch_size), max(app.max_batch_size, wj.batch_size)
    max_nodes = max(nodes, min(cfg.nodes, hi // max(1, app.min_local_bsz * per_node)))
    if cfg.granularity == "gpu":
        # any GPU count up to what its largest batch can feed, packed: the node limit only
        # bounds nodes x workers per node, the GPUs
        most = min(cfg.nodes * cfg.gpus_per_node, hi // max(1, app.min_local_bsz))
        max_nodes = max(nodes, most // per_node)
    try:
        limits = JobLimits(per_node, 1, max_nodes, lo, hi, app.max_local_bsz, base, "sqrt")
    except ValueError as exc:
        raise SimulationError(f"job {wj.name}: {exc}") from None
    return app, None, nodes, limits, wj.batch_size


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
        self.cluster = SimCluster(config.nodes, config.gpus_per_node, config.variability,
                                  config.seed)
        self.jobs = [self._make_job(i, wj) for i, wj in
                     enumerate(sorted(jobs, key=lambda j: (j.submit_time, j.name)))]
        self.backend = SimBackend(self)
        self.rounds = 0
        self.utilization: list[tuple[float, int, int]] = []
        self.notes: list[str] = []
        self.costs = replace(config.costs, restart_cost=config.restart_cost_for("*"),
                             shrink_cost=config.shrink_cost,
                             hold=config.hold_rounds * config.interval)

    def _make_job(self, i: int, wj: WorkloadJob) -> _Job:
        app, fixed, nodes, limits, batch = _limits(wj, self.cfg)
        try:
            cfg = limits.fit_batch(batch, nodes)
        except BatchSizeError as exc:
            raise SimulationError(f"job {wj.name}: {exc}") from None
        return _Job(wj=wj, job_id=str(i + 1), app=app, fixed=fixed, limits=limits, nodes=nodes,
                    cfg=cfg, size=nodes * limits.workers_per_node,
                    granular=self.cfg.granularity == "gpu" and fixed is None)

    # ----------------------------------------------------------------------- physics
    def _rate(self, j: _Job, progress: float) -> tuple[float, float]:
        """``(progress per second, seconds per step)`` of running job ``j`` at ``progress``."""
        return j.rate(progress, self.cluster.slowdown(j.wj.app_class, j.gpus) if j.st is None
                      else 1.0, self.cfg.locality_penalty)

    def _advance(self, j: _Job, t: float) -> None:
        """Run ``j`` from ``j.updated`` to ``t`` (no further than the end of its work)."""
        if j.state != "RUNNING" or t <= j.updated:
            return
        j.gpu_seconds += (t - j.updated) * j.n_gpus
        cur = max(j.updated, j.blocked_until)
        j.updated = t
        while cur < t and j.progress < j.total:
            rate, st = self._rate(j, j.progress)
            end = j.segment_end(j.progress)
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
                end = j.segment_end(p)
                cur += (end - p) / rate
                p = end
            j.eta = cur
        return j.eta

    # ----------------------------------------------------------------------- Slurm
    def job_infos(self) -> dict[str, object]:
        """The active jobs as ``squeue`` reports them."""
        n = len(self.jobs)
        return {j.job_id: job_info(j.job_id, j.wj.name, j.state, j.node_names, j.nodes,
                                   j.per_node, j.restarts, n - int(j.job_id))
                for j in self.jobs if j.state in ("PENDING", "RUNNING")}

    def _try_start(self, j: _Job) -> bool:
        if j.granular:
            got = self.cluster.allocate_gpus(j.size, j.req_nodes)
        else:
            got = self.cluster.allocate(j.nodes, j.per_node, j.req_nodes)
        if got is None:
            return False
        j.node_names, j.gpus = got
        j.nodes = len(j.node_names)
        j.resized_at = self.now
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
        self.cluster.release(j.gpus)
        j.gpus, j.node_names = (), ()

    def _schedule(self) -> None:
        """Slurm's scheduling pass: pending jobs in priority order, each started if it fits."""
        if not self.cluster.free.any():
            return
        for j in self.jobs:
            if j.state == "PENDING" and not j.held:
                self._try_start(j)
                if not self.cluster.free.any():
                    return

    # ----------------------------------------------------------------------- the round
    def _view(self, j: _Job, info) -> JobView:
        """The job as the daemon's view builder sees it."""
        return job_view(JobFacts(
            info=info, limits=j.limits, nodes=j.nodes, batch_size=j.batch_size,
            generation=j.resizes, submit_time=j.wj.submit_time,
            # a Pollux application by name (its throughput prior; placement maps it to its PAL
            # class), a fixed-work job by its PAL class
            application=j.wj.app_class if j.fixed is not None else j.wj.application,
            profile=j.profile(), report=j.report(),
            busy=j.state == "RUNNING" and j.blocked_until > self.now, held=j.held,
            requested_nodes=j.req_nodes, start_time=j.start_time,
            layout=self._layout(j),
            resized_at=j.resized_at if j.state == "RUNNING" else None))

    def _layout(self, j: _Job) -> tuple[int, ...]:
        """A GPU-granular job's GPUs per node: held (running) or, packed, asked for."""
        if not j.granular:
            return ()
        if j.state == "RUNNING":
            return j.layout
        per = self.cfg.gpus_per_node
        return (per,) * (j.size // per) + ((j.size % per,) if j.size % per else ())

    def snapshot(self) -> ClusterSnapshot:
        """What the daemon would see now (the observation plus the jobs' own reports)."""
        obs = self.backend.observe()
        views = tuple(self._view(self.jobs[int(jid) - 1], info) for jid, info in obs.jobs.items())
        snap = cluster_snapshot(obs, views, (PARTITION,), self.cluster.gpu_views)
        return replace(snap, granularity=self.cfg.granularity)

    def _apply(self, c: Change) -> None:
        j = self.jobs[int(c.job_id) - 1]
        if c.kind == ChangeKind.PREEMPT:
            want = j.size            # keeps its size for when it comes back
        else:
            want = c.to_gpus if j.granular and c.to_gpus else c.to_nodes * j.per_node
        try:
            cfg = j.fit(c.to_batch_size, want)
        except BatchSizeError as exc:
            self.notes.append(f"t={self.now:.0f} job {j.wj.name}: {c.kind} not applied: {exc}")
            return
        j.eta = j.st = None
        if c.kind == ChangeKind.PENDING and j.state == "PENDING":
            if j.held and j.start_time is not None:   # a preempted job released
                self._log(j, 0, want)
            j.size, j.nodes, j.cfg = want, c.to_nodes, cfg
            j.req_nodes = tuple(c.placement)
            j.held = False
        elif j.state != "RUNNING":
            return
        elif c.kind == ChangeKind.PREEMPT:
            self._log(j, j.size, 0)
            self._release(j)
            j.state, j.held = "PENDING", True
            j.restarts += 1
        elif c.kind == ChangeKind.BATCH:
            j.cfg = cfg
        elif c.kind == ChangeKind.SHRINK:
            self._shrink(j, want, cfg)
        elif c.kind == ChangeKind.GROW:
            self._log(j, j.size, want)
            self._release(j)
            j.state = "PENDING"
            j.size, j.nodes, j.cfg = want, c.to_nodes, cfg
            j.req_nodes = tuple(c.placement)
            j.restarts += 1
            j.resizes += 1

    def _log(self, j: _Job, before: int, after: int) -> None:
        j.resize_log.append((self.now, self.rounds, before, after))

    def _shrink(self, j: _Job, gpus: int, cfg: BatchConfig) -> None:
        """Shrink in place to ``gpus`` GPUs: whole nodes keep the first nodes of the allocation
        (Slurm's rule); GPU-granular, the GPUs on the nodes where the job holds fewest go first
        (the rest stay packed)."""
        self._log(j, j.size, gpus)
        names = self.cluster.node_names
        if j.granular:
            order = sorted(j.gpus, key=lambda ng: (-j.layout[j.node_names.index(names[ng[0]])],
                                                   ng[0], ng[1]))
            keep_gpus, drop = tuple(sorted(order[:gpus])), order[gpus:]
            self.cluster.release(drop)
            j.gpus = keep_gpus
            j.node_names = tuple(dict.fromkeys(names[n] for n, _ in keep_gpus))
        else:
            keep = j.node_names[:gpus // j.per_node]
            self.cluster.release((n, g) for n, g in j.gpus if names[n] not in keep)
            j.gpus = tuple((n, g) for n, g in j.gpus if names[n] in keep)
            j.node_names = keep
        j.nodes, j.size, j.cfg = len(j.node_names), gpus, cfg
        j.blocked_until = max(j.blocked_until, self.now) + self.cfg.shrink_cost
        j.resized_at = self.now
        j.resizes += 1

    def _round(self) -> None:
        for j in self.jobs:
            if j.state == "RUNNING":
                self._advance(j, self.now)
        decision = decide_round(self.snapshot(), self.policy, self.costs,
                                seed=self.cfg.seed + self.rounds)
        for c in decision.changes:
            self._apply(c)
        self.rounds += 1
        self._schedule()

    # ----------------------------------------------------------------------- main loop
    def _finish(self, j: _Job, t: float) -> None:
        self.now = t
        self._advance(j, t)
        j.finish_time = t
        j.state = "DONE"
        j.progress = j.total
        self._release(j)
        self._schedule()

    def _arrive(self, arrivals: list[tuple[float, int]]) -> None:
        while arrivals and arrivals[0][0] <= self.now:
            _, i = heapq.heappop(arrivals)
            self.jobs[i - 1].state = "PENDING"
            self.jobs[i - 1].held = self.cfg.hold_new_jobs
        self._schedule()

    def run(self, progress: Callable[[float, int, int], None] | None = None) -> SimResult:
        """Run to the end of the workload (or ``max_time``) and report.

        ``progress(now, finished, total)`` is called after every round (for a progress bar).
        """
        t0 = time.perf_counter()
        arrivals = [(j.wj.submit_time, int(j.job_id)) for j in self.jobs]
        heapq.heapify(arrivals)
        done, total = 0, len(self.jobs)
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
            t_fin, jid = min(((self._eta(j), int(j.job_id)) for j in running),
                             default=(math.inf, 0))
            if t_fin <= horizon:
                self._finish(self.jobs[jid - 1], t_fin)
                done += 1
            elif t_arr <= next_round:
                self.now = t_arr
                self._arrive(arrivals)
            else:
                self.now = next_round
                self._round()
                self.utilization.append((self.now, int((~self.cluster.free).sum()),
                                         self.cluster.free.size))
                next_round += self.cfg.interval
                if progress is not None:
                    progress(self.now, done, total)
        return self._result(time.perf_counter() - t0)

    def _result(self, wall: float) -> SimResult:
        c = self.cfg
        return SimResult(
            policy=self.policy_name, workload=self.workload_name,
            jobs=tuple(j.result() for j in self.jobs),
            utilization=tuple(self.utilization), total_gpus=int(self.cluster.free.size),
            rounds=self.rounds, wall_seconds=wall,
            params={"nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "interval": c.interval,
                    "variability": c.variability, "seed": c.seed,
                    "restart_cost": dict(c.restart_cost), "shrink_cost": c.shrink_cost,
                    "granularity": c.granularity, "hold_rounds": c.hold_rounds})


def simulate(jobs: Sequence[WorkloadJob], policy: str, **kw) -> SimResult:
    """Convenience: ``Simulator(jobs, policy, **kw).run()``."""
    return Simulator(jobs, policy, **kw).run()


__all__ = ["CLASSES", "SimBackend", "SimConfig", "SimulationError", "Simulator", "job_shape",
           "simulate"]
