"""Immutable views of the cluster that policies decide on, and the plans they return.

A policy is a pure function ``(ClusterSnapshot, seed) -> Plan``: no I/O, no clock (the
snapshot carries the time), randomness only from the seed. The daemon builds snapshots from
Slurm and the job directories; the simulator builds them from its own state. Units: times in
Unix seconds, throughput in samples/s, batch sizes in samples, sizes in nodes and GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from hpcsched.protocol.kinds import Granularity, GrowMode
from hpcsched.protocol.limits import JobLimits

if TYPE_CHECKING:
    from hpcsched.perf.shared import StepCorrections

#: how a running job grows: ``"extension"``, a second Slurm job whose workers start while the
#: job trains on and join its process group at a step boundary (issue 10); ``"requeue"``, the
#: job checkpoints, gives its GPUs back and restarts every worker at the new size
GROW_MODES = (GrowMode.EXTENSION, GrowMode.REQUEUE)
#: Measured by ``benchmarks/resize_latency.py --repeats 3`` on the dev cluster (medians;
#: ``docs/extensions.md``; the run: docs/design-notes.md, "model/snapshot.py"): seconds an
#: extension's new workers take from submission to being ready to join (Slurm scheduling,
#: Python and torch imports, the model's build) while the job trains on at its old size,
#: 2.25 s; and the longest pause of the running ranks at the step boundary where the group
#: re-forms and the newcomers receive the state, 0.09 s (one 50 ms step included). On GPUs
#: the start-up is longer (CUDA, NCCL, the model on the device) and the state transfer grows
#: with the model: measure both on the cluster and set them (``hpcsched simulate
#: --extension-startup/--extension-stall``, ``daemon.extension_*``). The one definition: the
#: simulator, the daemon's configuration and reconcile's ``Costs`` take their defaults from
#: here.
#: what a plan may ask for: ``"node"``, whole nodes x the job's workers per node; ``"gpu"``, any
#: GPU count on any GPUs per node (4 + 2), which the daemon realises with extension jobs
#: (:mod:`hpcsched.policies.realise`)
GRANULARITIES = (Granularity.NODE, Granularity.GPU)
EXTENSION_STARTUP = 2.25
EXTENSION_STALL = 0.09


def held_reversal(job: JobView, now: float, hold: float) -> str | None:
    """The resize reconcile's no-thrash hold forbids ``job`` at ``now`` (Unix seconds):
    ``"shrink"`` for a job grown less than ``hold`` seconds ago, ``"grow"`` for one shrunk
    (:class:`~hpcsched.protocol.kinds.ChangeKind` values); ``None`` when it may go either way
    (``hold`` <= 0, not resized since it started, or resized longer ago). A resize in the same
    direction as the last one is never held (issue 9: a flip-flop is a resize undone within
    two rounds); nor is the first resize after a start, which the user or Slurm sized. A job
    whose latest grow failed less than ``hold`` seconds ago (:attr:`JobView.grow_failed_at`)
    is not grown (``"grow"``), unless a resize before holds it the other way."""
    if hold <= 0:
        return None
    if job.resized_at is not None and job.last_resize is not None and now - job.resized_at < hold:
        return "shrink" if job.last_resize == "grow" else "grow"
    if job.grow_failed_at is not None and now - job.grow_failed_at < hold:
        return "grow"   # not retried at once (JobView.grow_failed_at)
    return None


def grow_cost(grow: GrowMode, restart_cost: float, startup: float, stall: float, x_from: float,
              x_to: float) -> float:
    """Seconds a grow costs a running job, in seconds of its new rate: what is added to its
    remaining time ``R / x_to`` at the new size (``R``: remaining samples) by making the grow.

    * ``grow == "requeue"``: ``restart_cost`` (no progress while it restarts).
    * ``grow == "extension"``: the job trains on at ``x_from`` for the ``startup`` seconds the
      new workers take to start, then stalls ``stall`` seconds, then runs at ``x_to``; it
      finishes after ``startup + stall + (R - x_from * startup) / x_to`` seconds, that is
      ``R / x_to`` plus::

          startup * max(0, 1 - x_from / x_to) + stall

      (clamped at 0 for a grow that would not speed the job up; ``startup + stall`` when
      ``x_to`` is unknown, <= 0). The mechanism is Amoeba/EDL's (Wu et al., "Elastic Deep
      Learning in Multi-Tenant GPU Clusters", arXiv:1909.11985): new workers warm up while
      training goes on; the running ones stop only to re-form the group and hand the state over.

    Args:
        grow: one of :data:`GROW_MODES`.
        restart_cost, startup, stall: seconds.
        x_from, x_to: the job's goodput before and after the grow, samples/s.
    """
    if grow != GrowMode.EXTENSION:
        return restart_cost
    if x_to <= 0:
        return startup + stall
    return startup * max(0.0, 1.0 - x_from / x_to) + stall


@dataclass(frozen=True)
class NodeView:
    """One Slurm node.

    Attributes:
        name: Slurm node name.
        gpus: GPUs configured (gres/gpu).
        gpus_allocated: GPUs allocated to any job.
        state: Slurm base state in lower case (idle, mixed, allocated, down, drained, ...).
        partitions: partitions the node belongs to.
        free_index: the indexes of its free GPUs, lowest first (Slurm hands a job the lowest
            free ones: what a placement on this node takes); ``None``: not known.
    """

    name: str
    gpus: int
    gpus_allocated: int
    state: str
    partitions: tuple[str, ...] = ()
    free_index: tuple[int, ...] | None = None

    @cached_property
    def usable(self) -> bool:
        """Up and schedulable (not down, drained, draining, failing or not responding); computed
        once per view (a policy asks for every node's free GPUs many times a round)."""
        bad = ("down", "drain", "fail", "not_responding", "maint", "reserved", "unknown")
        return not any(b in self.state for b in bad)

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus - self.gpus_allocated) if self.usable else 0


class ProfilePoint(NamedTuple):
    """Measured throughput of a job at one configuration (mean over recent steps). A named
    tuple: every round builds one per configuration of every job, and the throughput models
    are cached on them (hashed in C)."""

    world_size: int
    nodes: int
    local_batch_size: int
    accumulation_steps: int
    step_time: float          # seconds per optimizer step
    throughput: float         # samples/s
    samples: int = 1          # how many step records the mean is over


@dataclass(frozen=True)
class JobView:
    """One hpcsched job as a policy sees it.

    Sizes: ``nodes`` is the current (or, when pending, requested) node count. The job's resize
    limits are its :class:`~hpcsched.protocol.limits.JobLimits` (``limits``, the one type hpcsub,
    the spec, the daemon and the store use; its fields read as attributes of the view too:
    ``workers_per_node``, ``min_nodes``, ``max_batch_size``, ...): it runs ``workers_per_node``
    workers (GPUs) per node and may be resized within ``[min_gpus, max_gpus]`` GPUs
    (``[min_nodes, max_nodes]`` whole nodes). Batch sizes are global (samples per optimizer
    step) within ``[min_batch_size, max_batch_size]``; ``max_local_batch_size`` is the per-GPU
    limit (``None`` = no limit). ``busy`` is True while a resize is in flight or the job is
    starting: policies must leave such a job as it is.
    """

    job_id: str
    state: str                      # PENDING or RUNNING
    nodes: int
    node_names: tuple[str, ...]
    limits: JobLimits
    batch_size: int
    submit_time: float
    start_time: float | None = None
    restarts: int = 0
    generation: int = 0
    samples_processed: int = 0
    steps: int = 0                  # optimizer steps done, as the job reports
    throughput: float = 0.0         # samples/s, latest
    profile: tuple[ProfilePoint, ...] = ()
    app_class: str = ""
    busy: bool = False
    user: str = ""
    partition: str = ""
    attained_gpu_seconds: float = 0.0      # GPU-seconds of service so far (Tiresias' 2D-LAS)
    remaining_samples: float | None = None  # samples left to train on, if the job says
    grad_noise: tuple[float, float] | None = None  # (grad_sqr, grad_var) latest, if reported
    held: bool = False                     # pending, held by hpcsched after a preemption
    #: Slurm's priority (higher starts first: ``squeue -o %Q``); a pending job's place in
    #: Slurm's queue beside other users' jobs (:mod:`hpcsched.policies.neighbours`). 0: unknown
    slurm_priority: int = 0
    #: GPUs the job was submitted with: what Slurm alone would hold for it while it runs. Up to
    #: this many, its GPUs are its own against other users' pending jobs; beyond it, a grow
    #: yields to them (:mod:`hpcsched.policies.neighbours`). 0: unknown (nothing is its own)
    submitted_gpus: int = 0
    #: the GPUs it holds, ``(node, index)``, where known (a running job's ``gres_detail``);
    #: empty: not known or none
    gpus_held: tuple[tuple[str, int], ...] = ()
    #: GPUs on each node of its allocation, when they differ from node to node (GPU-granular
    #: plans: ``(4, 2)``); empty: ``workers_per_node`` on each of ``nodes``
    layout: tuple[int, ...] = ()
    #: GPUs its primary Slurm job (what hpcsub submitted) holds on each of its first nodes
    #: (``node_names`` lists them first); the rest of ``layout`` is extension jobs', which are
    #: released without a restart. Empty: the whole allocation is the primary's
    primary: tuple[int, ...] = ()
    #: when the job last changed size or (re)started, Unix seconds; ``None``: unknown
    resized_at: float | None = None
    #: the direction of hpcsched's last resize of the job: ``"grow"`` (a release after a
    #: preemption counts as one) or ``"shrink"`` (:class:`~hpcsched.protocol.kinds.ChangeKind`
    #: values); ``None``: not resized since it was submitted, or unknown. With ``resized_at``
    #: it tells reconcile's no-thrash hold which change would undo the last one
    last_resize: str | None = None
    #: when hpcsched's last attempt to grow the job failed (Slurm refused the extension, the
    #: job did not answer), Unix seconds, if that is the job's latest resize; ``None``: none.
    #: The grow is not tried again within reconcile's hold (:func:`held_reversal`): a refused
    #: grow retried every round is one more submission a round that Slurm refuses
    grow_failed_at: float | None = None
    #: the nodes Slurm's backfill plans this pending job onto, where it has planned its start
    #: (``squeue -o %Y``; :mod:`hpcsched.policies.neighbours` keeps their free GPUs out of grows,
    #: which Slurm would not start there); empty: none planned, or running
    scheduled_nodes: tuple[str, ...] = ()
    #: what the jobs of its application measured on this cluster against the application's
    #: prior (:mod:`hpcsched.perf.shared`); ``None``: not gathered (the job's model is then fitted
    #: to its own measurements alone)
    step_corrections: StepCorrections | None = None

    @property
    def gpus(self) -> int:
        """GPUs the job holds (running) or asks for (pending)."""
        return sum(self.layout) if self.layout else self.nodes * self.workers_per_node

    def allocation(self) -> dict[str, int]:
        """GPUs per node of its allocation (running; pending: of the nodes it asks for, if
        named), primary's nodes first."""
        per = self.layout or (self.workers_per_node,) * len(self.node_names)
        return dict(zip(self.node_names, per))

    def primary_allocation(self) -> dict[str, int]:
        """GPUs per node of its primary Slurm job (:attr:`primary`; all of :meth:`allocation`
        when it runs on no extension)."""
        if not self.primary:
            return self.allocation()
        return dict(zip(self.node_names, self.primary))

    # the limits' fields, read through the view (one definition: JobLimits)
    workers_per_node = property(lambda self: self.limits.workers_per_node)
    min_nodes = property(lambda self: self.limits.min_nodes)
    max_nodes = property(lambda self: self.limits.max_nodes)
    min_batch_size = property(lambda self: self.limits.min_batch_size)
    max_batch_size = property(lambda self: self.limits.max_batch_size)
    max_local_batch_size = property(lambda self: self.limits.max_local_batch_size)
    base_batch_size = property(lambda self: self.limits.base_batch_size)
    lr_scaling = property(lambda self: self.limits.lr_scaling)
    min_gpus = property(lambda self: self.limits.min_gpus)
    max_gpus = property(lambda self: self.limits.max_gpus)


@dataclass(frozen=True)
class GPUView:
    """One GPU and how much slower it runs each application class than a median GPU.

    ``slowdown`` maps an application class (e.g. PAL's ``A``..``D``) to a multiplier >= 0
    (1 = median, > 1 = slower), from per-GPU measurements (Jain et al., SC'24, §3).
    """

    node: str
    index: int
    slowdown: tuple[tuple[str, float], ...] = ()

    def slowdown_for(self, app_class: str) -> float:
        return dict(self.slowdown).get(app_class, 1.0)


class ForeignJob(NamedTuple):
    """A pending job hpcsched does not manage (another user's plain ``sbatch`` job) that Slurm
    could start: what it asks for and where it stands in Slurm's queue
    (:mod:`hpcsched.policies.neighbours`).

    Attributes:
        job_id, user, partition: Slurm's.
        nodes: nodes it asks for; gpus_per_node: GPUs on each (``TresPerNode``).
        priority: Slurm's priority (higher starts first: ``squeue -o %Q``).
        submit_time: Unix seconds. start_time: Slurm's planned start (backfill's estimate,
            ``squeue --start``), Unix seconds; ``None``: none planned.
        scheduled_nodes: the nodes backfill plans to start it on (``squeue -o %Y``); empty:
            none planned.
    """

    job_id: str
    user: str
    nodes: int
    gpus_per_node: int
    priority: int
    submit_time: float = 0.0
    start_time: float | None = None
    partition: str = ""
    scheduled_nodes: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def may_use(self, node: NodeView) -> bool:
        """``node`` is in its partition (a node that lists no partitions, or a job that names
        none: any)."""
        return not self.partition or not node.partitions or self.partition in node.partitions


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a policy may look at, at one instant.

    ``other_gpus_allocated`` counts GPUs held by jobs hpcsched does not manage, per node name;
    ``foreign_pending``, the pending jobs hpcsched does not manage that Slurm could start, whose
    GPUs hpcsched's grows yield to (:mod:`hpcsched.policies.neighbours`).
    """

    time: float
    nodes: tuple[NodeView, ...]
    jobs: tuple[JobView, ...]
    other_gpus_allocated: tuple[tuple[str, int], ...] = ()
    partitions: tuple[str, ...] = ()
    gpus: tuple[GPUView, ...] = ()    # per-GPU variability, where measured
    foreign_pending: tuple[ForeignJob, ...] = ()
    #: what a plan may ask for: ``"node"``, whole nodes x the job's ``workers_per_node`` (what
    #: the actuator does on Slurm today); ``"gpu"``, any GPU count, packed onto as few nodes as
    #: it fits (4 + 2): the simulator's ``--granularity gpu``
    granularity: Granularity = Granularity.NODE
    #: what a start or grow (requeue) and an in-place shrink cost a job on this cluster,
    #: seconds: the daemon's and the simulator's configured costs, the ones reconcile weighs
    #: a resize with (policies that price changes use them too)
    restart_cost: float = 30.0
    shrink_cost: float = 2.0
    #: how running jobs grow here (:data:`GROW_MODES`) and, by extension, the seconds the new
    #: workers take to start and the stall when the group re-forms (:func:`grow_cost`)
    grow: GrowMode = GrowMode.REQUEUE
    extension_startup: float = EXTENSION_STARTUP
    extension_stall: float = EXTENSION_STALL
    #: reconcile's no-thrash hold here, seconds (``Costs.hold``, after the policy's
    #: ``reconcile_gate``): a job resized less than this ago is not resized back the other way
    #: (:func:`held_reversal`); a policy that plans around it leaves such a job where the hold
    #: lets it be, so its other jobs are not planned onto GPUs that will not free. 0: no hold
    hold: float = 0.0

    def job(self, job_id: str) -> JobView | None:
        return next((j for j in self.jobs if j.job_id == job_id), None)

    def grow_cost(self, x_from: float, x_to: float) -> float:
        """Seconds a running job's grow from goodput ``x_from`` to ``x_to`` (samples/s) costs
        it here (:func:`grow_cost`); a start or a restart costs ``restart_cost``."""
        return grow_cost(self.grow, self.restart_cost, self.extension_startup,
                         self.extension_stall, x_from, x_to)

    @cached_property
    def free_gpus(self) -> Mapping[str, int]:
        """Free GPUs per usable node, read-only (copy it to claim GPUs from it); computed once
        per snapshot (reconcile, the placement of grows and the good-neighbour rule all ask)."""
        return MappingProxyType({n.name: n.gpus_free for n in self.nodes if n.usable})

    @cached_property
    def node_size(self) -> int:
        """GPUs on the largest usable node (at least 1): how many GPUs a packed job puts on
        one. Computed once per snapshot (policies ask for it per job and size)."""
        return max((n.gpus for n in self.nodes if n.usable), default=1) or 1


@dataclass(frozen=True)
class JobTarget:
    """What a policy wants for one job: node count, global batch size, and why.

    ``placement`` optionally names the nodes to use (empty = let Slurm choose). ``gpus`` is the
    GPU count when the plan speaks GPUs (a GPU-granular snapshot; ``nodes`` is then the nodes
    they span, packed); ``None``: ``nodes`` x the job's workers per node.
    """

    job_id: str
    nodes: int
    batch_size: int
    reason: str
    placement: tuple[str, ...] = ()
    # goodput at the target (samples/s x statistical efficiency), if the policy knows
    predicted_goodput: float | None = None
    gpus: int | None = None
    #: what one sample/s of this job's goodput is worth in the policy's objective (reconcile
    #: weighs gains and restart losses by it, so it judges a plan by what the policy maximised):
    #: 1 for total goodput (``dp``); ``1 / remaining samples`` for ``jct``; ``1 / goodput at
    #: the fair share`` (a speedup) for ``pollux``
    weight: float = 1.0
    #: GPUs to take on each node of ``placement`` (a GPU-granular placement stage's choice, the
    #: GPUs it ranked: :mod:`hpcsched.policies.placement.gpus`); empty: as many as each has free
    placement_gpus: tuple[int, ...] = ()

    def gpus_for(self, job: JobView) -> int:
        """GPUs this target gives ``job``."""
        return self.gpus if self.gpus is not None else self.nodes * job.workers_per_node


@dataclass(frozen=True)
class Plan:
    """A policy's decision for one round: one target per job it has an opinion on."""

    policy: str
    targets: tuple[JobTarget, ...]
    objective: float | None = None    # the policy's own figure of merit (documented per policy)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def target(self, job_id: str) -> JobTarget | None:
        return next((t for t in self.targets if t.job_id == job_id), None)
