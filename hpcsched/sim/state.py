"""The simulation's settings and one job's state: what :mod:`hpcsched.sim.engine` runs on.

:class:`SimConfig` (the cluster, the costs, the policy round, how grows are made),
:func:`job_shape` (the Slurm shape a user asks for), :class:`SimJob` (a job's mutable state and
its physics, :mod:`hpcsched.sim.physics`), :class:`Extension` (a grow by extension in flight)
and :func:`job_limits` (a workload job's resize limits). Split from the engine, which keeps the
events and the round.

Units: seconds from the start of the trace, samples, GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from hpcsched.model.snapshot import EXTENSION_STALL, EXTENSION_STARTUP, GROW_MODES, ProfilePoint
from hpcsched.perf.shared import THROUGHPUT_MODELS, StepLedger
from hpcsched.policies.realise import exact_shape
from hpcsched.policies.reconcile import Costs
from hpcsched.protocol.batching import BatchConfig, BatchSizeError, fit_batch
from hpcsched.protocol.kinds import ChangeKind, Granularity, GrowMode, SlurmState
from hpcsched.protocol.limits import JobLimits
from hpcsched.sim import JobResult, WorkloadJob
from hpcsched.sim.physics import Application, FixedWork, application
from hpcsched.views.build import JobReport


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
        grow: how a running job grows (:data:`~hpcsched.model.snapshot.GROW_MODES`):
            ``"extension"`` (default; issue 10), an extension Slurm job takes the new GPUs at
            once, the job trains on at its old size for ``extension_startup`` seconds while the
            new workers start, stalls ``extension_stall`` seconds while the group re-forms and
            the newcomers receive the state, then runs at its new size; ``"requeue"``, the job
            gives its GPUs back, waits pending with its new size and pays its restart cost.
        extension_startup, extension_stall: seconds (the provisional defaults:
            :data:`~hpcsched.model.snapshot.EXTENSION_STARTUP`, ``EXTENSION_STALL``).
        work_scale: factor on every job's work, in ``(0, 1]``: a Pollux application's whole
            training run shortened, every epoch to ``work_scale`` x its progress (so the job
            still goes through all its epochs' gradient statistics, and its time to finish
            alone is about ``work_scale`` x the unscaled one), ending at ``work_scale`` x its
            total progress; a fixed-work job after ``work_scale`` x its iterations.
            ``hpcsched simulate --scale`` (with the arrivals scaled alike,
            :func:`hpcsched.sim.workload.scale_workload`); the emulated application's
            ``--scale`` counts the same work (:mod:`hpcsched.sim.emulate`).

        soft_consolidate: a fixed-work (PAL trace) job that cannot get its Slurm shape (no
            ``nodes`` nodes with its GPUs per node free) takes any free GPUs instead, packed:
            best fit, else the nodes with the most free GPUs (:meth:`SimCluster.allocate_gpus`),
            and pays the locality penalty when that spans nodes. PAL's Packed-Sticky baseline
            does this (its "soft consolidated" placement, artifact ``placement/packing_sticky.py``);
            Slurm does not (the job waits). Off by default.
        fastest_gpus: a job started on whole nodes takes each node's free GPUs that are
            fastest for its class, where Slurm hands out the lowest-numbered: PAL's simulator
            places jobs on GPUs, not nodes (a what-if; :meth:`SimCluster.allocate`). Off by
            default.
        early_reports: a job reports its remaining work and gradient noise from its submission
            (True, the default: what the evaluation ran) or, as on a real cluster, only once it
            has started: before, the daemon has no progress file to read (False: ``hpcsched
            replay --compare``, which predicts a real run).
        throughput_model: how the policies predict a job's step times (:data:`THROUGHPUT_MODELS`):
            ``"shared"`` (the default, as the daemon), the application's prior corrected by what
            all its jobs measured and scaled to the job's own (:mod:`hpcsched.perf.shared`);
            ``"fitted"``, Pollux's model fitted to the job's own measurements alone.
        event_rounds: for a policy that asks for them (its ``round_on_events``, ``jct``), a
            round also runs the moment a job ends and the moment a submitted job finds no room
            (Slurm could not start it), besides the rounds every ``interval`` seconds, as the
            daemon does (``daemon.event_rounds``). True by default; False: every ``interval``
            seconds only, for every policy.
        check_claims: each job's claims about its remaining work and throughput are checked
            against its progress before every round (:mod:`hpcsched.views.claims`), as the
            daemon does. True by default; False: a what-if that believes every job.

    Raises:
        ValueError: ``grow`` not one of ``GROW_MODES``, a negative extension cost,
            ``work_scale`` outside ``(0, 1]``, or ``throughput_model`` not one of
            :data:`THROUGHPUT_MODELS`.
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
    granularity: Granularity = Granularity.NODE
    hold_rounds: int = 3
    grow: GrowMode = GrowMode.EXTENSION
    extension_startup: float = EXTENSION_STARTUP
    extension_stall: float = EXTENSION_STALL
    work_scale: float = 1.0
    early_reports: bool = True
    soft_consolidate: bool = False
    fastest_gpus: bool = False
    throughput_model: str = "shared"
    event_rounds: bool = True
    check_claims: bool = True

    def __post_init__(self):
        if self.throughput_model not in THROUGHPUT_MODELS:
            raise ValueError(f"throughput_model must be one of {', '.join(THROUGHPUT_MODELS)}, "
                             f"not {self.throughput_model!r}")
        if self.grow not in GROW_MODES:
            raise ValueError(f"grow must be one of {', '.join(GROW_MODES)}, not {self.grow!r}")
        if self.extension_startup < 0 or self.extension_stall < 0:
            raise ValueError("extension_startup and extension_stall must be >= 0 seconds")
        if not 0.0 < self.work_scale <= 1.0:
            raise ValueError(f"work_scale must be in (0, 1], got {self.work_scale!r}")

    def restart_cost_for(self, app: str) -> float:
        return float(self.restart_cost.get(app, self.restart_cost.get("*", 30.0)))

    def recorded(self) -> dict:
        """The settings a :class:`~hpcsched.sim.SimResult` records (its ``params``)."""
        return {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "interval": self.interval, "variability": self.variability, "seed": self.seed,
                "restart_cost": dict(self.restart_cost), "shrink_cost": self.shrink_cost,
                "granularity": self.granularity, "hold_rounds": self.hold_rounds,
                "grow": self.grow, "extension_startup": self.extension_startup,
                "extension_stall": self.extension_stall,
                "soft_consolidate": self.soft_consolidate, "fastest_gpus": self.fastest_gpus,
                "throughput_model": self.throughput_model, "event_rounds": self.event_rounds,
                "keep_free_gpus": self.costs.keep_free}


def job_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """``(nodes, gpus per node)`` a user asks Slurm for to get ``gpus`` GPUs
    (:func:`hpcsched.policies.realise.exact_shape`, the daemon's rule for a requeue's shape:
    one node when they fit on one, else the largest GPUs-per-node that divides them)."""
    return exact_shape(gpus, gpus_per_node)


@dataclass(frozen=True)
class Extension:
    """A grow by extension in flight: the extension job holds ``gpus`` (``(node index, gpu
    index)``) from the decision on; at ``at`` (decision + ``extension_startup``) the group
    re-forms at ``size`` GPUs with batch configuration ``cfg``."""

    at: float
    gpus: tuple[tuple[int, int], ...]
    size: int
    cfg: BatchConfig


@dataclass
class SimJob:
    """Mutable simulation state of one job (the engine's own; policies see :class:`JobView`).

    Physics (:mod:`hpcsched.sim.physics`): a Pollux application advances in Pollux progress
    units (one unit = one step at the base batch size, times the statistical efficiency of the
    batch size in force); a fixed-work job in iterations. ``work_scale``
    (:attr:`SimConfig.work_scale`) multiplies its total work.
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
    ext: Extension | None = None     # a grow by extension whose new workers are starting
    work_scale: float = 1.0          # SimConfig.work_scale
    #: the GPUs of its primary Slurm job (running; the rest of ``gpus`` are extension jobs')
    primary: tuple[tuple[int, int], ...] = ()
    #: ``(nodes, GPUs per node)`` its primary starts with when the daemon's rules set it (a
    #: start or a requeue, :mod:`hpcsched.policies.realise`); ``None``: as submitted
    shape: tuple[int, int] | None = None

    @property
    def total(self) -> float:
        """Work to do: progress units (iterations for fixed work), scaled by ``work_scale``."""
        full = self.fixed.iterations if self.fixed is not None else self.app.total_progress
        return full * self.work_scale

    @property
    def per_node(self) -> int:
        """GPUs (workers) per node."""
        return self.limits.workers_per_node

    @property
    def n_gpus(self) -> int:
        return self.size

    @property
    def held_gpus(self) -> tuple[tuple[int, int], ...]:
        """The GPUs the job holds, its extension's (starting) included."""
        return self.gpus + self.ext.gpus if self.ext else self.gpus

    def _node_order(self, gpus: Sequence[tuple[int, int]]) -> list[int]:
        """Node indices of ``gpus``: its primary's nodes first, then the others, each in node
        order (the daemon's view lists a job's allocation so: primary job, then extensions)."""
        mine = {n for n, _ in self.primary}
        return sorted({n for n, _ in gpus}, key=lambda n: (n not in mine, n))

    def view_layout(self, gpus_per_node: int) -> tuple[int, ...]:
        """A GPU-granular job's GPUs per node as the daemon's view shows them, in
        :meth:`held_nodes` order: held (running; an extension's starting GPUs included) or,
        packed on ``gpus_per_node``-GPU nodes, asked for; ``()`` for a node-granular job."""
        if not self.granular:
            return ()
        if self.state == SlurmState.RUNNING:
            held = [n for n, _ in self.held_gpus]
            return tuple(held.count(n) for n in self._node_order(self.held_gpus))
        if self.shape is not None:
            return (self.shape[1],) * self.shape[0]
        per = gpus_per_node
        return (per,) * (self.size // per) + ((self.size % per,) if self.size % per else ())

    def view_primary(self) -> tuple[int, ...]:
        """GPUs of its primary job on each of its first nodes, as the daemon's view shows a
        running job that holds extension GPUs too; ``()`` otherwise."""
        if self.state != SlurmState.RUNNING or len(self.primary) == len(self.held_gpus):
            return ()
        held = [n for n, _ in self.primary]
        return tuple(held.count(n) for n in self._node_order(self.primary))

    def held_nodes(self, names: Sequence[str]) -> tuple[str, ...]:
        """The nodes the job holds GPUs on, its extension's included: its primary's first,
        each in node order (``names``: the cluster's node names)."""
        held = self.held_gpus
        if not held:
            return self.node_names
        return tuple(names[n] for n in self._node_order(held))

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
        gain = self.app.gain(self.cfg.global_batch_size, self.epoch_at(progress))
        return gain / st, st

    def advance(self, t: float, slowdown: float, locality_penalty: float,
                ledger: StepLedger | None = None) -> None:
        """Train from ``updated`` to ``t`` (s; no further than the end of its work, nothing
        while it is blocked restarting): its progress, GPU-seconds and measured steps per
        configuration, and, with ``ledger`` (the daemon's store of every job's steps), its
        application's. ``slowdown``: its slowest GPU's, used while its step time is not known
        (:meth:`rate`)."""
        self.gpu_seconds += (t - self.updated) * (self.n_gpus + (len(self.ext.gpus) if self.ext
                                                                 else 0))
        cur = max(self.updated, self.blocked_until)
        self.updated = t
        cfg = self.cfg
        while cur < t and self.progress < self.total:
            rate, st = self.rate(self.progress, slowdown, locality_penalty)
            end = self.segment_end(self.progress)
            dt = min(t - cur, (end - self.progress) / rate)
            key = (self.n_gpus, self.nodes, cfg.local_batch_size, cfg.accumulation_steps)
            acc = self.steps.setdefault(key, [0.0, 0.0])
            acc[0] += dt
            acc[1] += dt / st
            if ledger is not None and self.fixed is None:
                ledger.add(self.wj.application, self.nodes, self.n_gpus, cfg.local_batch_size,
                           cfg.accumulation_steps, dt, dt / st)
            self.last_step_time = st
            self.progress = end if cur + dt < t else min(end, self.progress + rate * dt)
            cur += dt

    def end_time(self, start: float, slowdown: float, locality_penalty: float) -> float:
        """When the job ends if it trains from ``start`` (s) at its configuration, from its
        progress: :meth:`rate` summed over the :meth:`segment_end` segments, one epoch at a
        time (the simulator's next-finish event asks for it after every change)."""
        total, p = self.total, self.progress
        rate, st = self.rate(p, slowdown, locality_penalty)
        if self.fixed is not None:
            return start + (total - p) / rate if p < total * (1 - 1e-12) else start
        app, scale, batch = self.app, self.work_scale, self.cfg.global_batch_size
        epoch, last = self.epoch_at(p), app.max_epochs - 1
        while p < total * (1 - 1e-12):
            end = min(total, app.epoch_end(epoch, scale))
            start += (end - p) / (app.gain(batch, epoch) / st)
            p = end
            epoch = min(epoch + 1, last)
        return start

    def epoch_at(self, progress: float) -> int:
        """The application's epoch (0-based) at ``progress``: epochs are ``work_scale`` x as
        long (:meth:`Application.epoch_at`)."""
        return self.app.epoch_at(progress, self.work_scale)

    def segment_end(self, progress: float) -> float:
        """Progress at which the rate next changes (end of its epoch, or of its work)."""
        if self.fixed is not None:
            return self.total
        return min(self.total, self.app.epoch_end(self.epoch_at(progress), self.work_scale))

    def remaining_samples(self) -> float:
        """Samples left: progress units at the base batch size (iterations at the batch size
        for fixed work)."""
        if self.fixed is not None:
            return (self.total - self.progress) * self.batch_size
        return (self.total - self.progress) * self.limits.base_batch_size

    def samples_processed(self) -> float:
        """Work done, in the unit of :meth:`remaining_samples`."""
        unit = self.batch_size if self.fixed is not None else self.limits.base_batch_size
        return self.progress * unit

    def profile(self) -> tuple[ProfilePoint, ...]:
        """What the job has measured: mean step time and throughput per configuration; a job
        that overstates its throughput (:attr:`WorkloadJob.speed_claim`) says so of every
        configuration of at least ``speed_claim_from`` GPUs."""
        wj = self.wj

        def claim(w: int) -> float:
            return wj.speed_claim if w >= wj.speed_claim_from else 1.0
        return tuple(
            ProfilePoint(world_size=w, nodes=n, local_batch_size=m, accumulation_steps=s,
                         step_time=tt / k / claim(w), throughput=w * m * s / (tt / k) * claim(w),
                         samples=max(1, int(k)))
            for (w, n, m, s), (tt, k) in sorted(self.steps.items()) if k >= 1)

    @property
    def application_name(self) -> str:
        """The application the daemon would know the job by: a Pollux application by name (its
        throughput prior; placement maps it to its PAL class), a fixed-work job by its PAL
        class."""
        return self.wj.app_class if self.fixed is not None else self.wj.application

    @property
    def last_resize(self) -> str | None:
        """The direction of the job's last resize (:attr:`JobView.last_resize`), from its
        resize log: ``"grow"`` (a release after a preemption included) or ``"shrink"`` (a
        preemption included); ``None`` before any."""
        for _, _, before, after in reversed(self.resize_log):
            if after != before:
                return ChangeKind.GROW if after > before else ChangeKind.SHRINK
        return None

    def report(self) -> JobReport:
        """What the job's progress file would say (a job that understates its work says
        :attr:`WorkloadJob.work_claim` x its true remaining work)."""
        noise = None if self.fixed is not None else self.app.grad_stats(
            self.cfg.global_batch_size, self.epoch_at(self.progress))
        return JobReport(
            samples_processed=self.samples_processed(),
            remaining_samples=self.remaining_samples() * self.wj.work_claim, grad_noise=noise,
            throughput=(self.cfg.global_batch_size / self.last_step_time)
            if self.last_step_time else 0.0,
            steps=int(sum(k for _, k in self.steps.values())))

    def result(self) -> JobResult:
        wj = self.wj
        return JobResult(name=wj.name, application=wj.application, submit_time=wj.submit_time,
                         start_time=self.start_time, finish_time=self.finish_time,
                         gpu_seconds=self.gpu_seconds, restarts=self.restarts,
                         resizes=self.resizes, requested_gpus=wj.gpus, max_gpus=self.max_gpus,
                         resize_log=tuple(self.resize_log), rigid=wj.rigid)


def make_job(job_id: str, wj: WorkloadJob, cfg: SimConfig) -> SimJob:
    """The simulator's state of workload job ``wj`` as submitted (:func:`job_limits`).

    Raises:
        SimulationError: its batch size cannot be cut over its GPUs within its limits.
    """
    app, fixed, nodes, limits, batch = job_limits(wj, cfg)
    try:
        batch_cfg = limits.fit_batch(batch, nodes)
    except BatchSizeError as exc:
        raise SimulationError(f"job {wj.name}: {exc}") from None
    return SimJob(wj=wj, job_id=job_id, app=app, fixed=fixed, limits=limits, nodes=nodes,
                  cfg=batch_cfg, size=nodes * limits.workers_per_node,
                  granular=cfg.granularity == Granularity.GPU and fixed is None and not wj.rigid,
                  work_scale=cfg.work_scale)


def job_limits(wj: WorkloadJob, cfg: SimConfig) -> tuple[Application | None, FixedWork | None,
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
    if wj.rigid:
        return app, None, nodes, *_rigid_limits(wj, app, nodes, per_node)
    base = app.init_batch_size
    lo, hi = min(base, wj.batch_size), max(app.max_batch_size, wj.batch_size)
    max_nodes = max(nodes, min(cfg.nodes, hi // max(1, app.min_local_bsz * per_node)))
    if cfg.granularity == Granularity.GPU:
        # any GPU count up to what its largest batch can feed, packed: the node limit only
        # bounds nodes x workers per node, the GPUs
        most = min(cfg.nodes * cfg.gpus_per_node, hi // max(1, app.min_local_bsz))
        max_nodes = max(nodes, most // per_node)
    # GPU-granular: any GPU count down to 1 (hpcsub --hpcsched-min-gpus 1), where the job may
    # change size at all
    fewest = 1 if cfg.granularity == Granularity.GPU and max_nodes > 1 else None
    try:
        limits = JobLimits(per_node, 1, max_nodes, lo, hi, app.max_local_bsz, base, "sqrt", fewest)
    except ValueError as exc:
        raise SimulationError(f"job {wj.name}: {exc}") from None
    return app, None, nodes, limits, wj.batch_size


def _rigid_limits(wj: WorkloadJob, app: Application, nodes: int, per_node: int
                  ) -> tuple[JobLimits, int]:
    """``(limits, batch size)`` of another user's plain job: its submitted nodes and GPUs, and
    the batch size ``static`` would run its elastic twin at (the nearest that its GPUs divide),
    from start to end.

    Raises:
        SimulationError: no batch size fits its GPUs.
    """
    lo, hi = min(app.init_batch_size, wj.batch_size), max(app.max_batch_size, wj.batch_size)
    try:
        batch = JobLimits(per_node, nodes, nodes, lo, hi, app.max_local_bsz, wj.batch_size,
                          "sqrt").fit_batch(wj.batch_size, nodes).global_batch_size
        return JobLimits(per_node, nodes, nodes, batch, batch, app.max_local_bsz, batch,
                         "sqrt"), batch
    except (ValueError, BatchSizeError) as exc:
        raise SimulationError(f"job {wj.name}: {exc}") from None
