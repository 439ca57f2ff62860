"""Job views and the cluster snapshot: what a policy sees, built one way for the daemon and the
simulator.

A round gathers what each managed job is known to be (:class:`JobFacts`: Slurm's record, the
job's limits, the configuration in force, its measured profile and its own progress report),
turns each into a :class:`~hpcsched.model.snapshot.JobView` with :func:`job_view` and puts them
into a :class:`~hpcsched.model.snapshot.ClusterSnapshot` with :func:`cluster_snapshot`. The
daemon gathers the facts from Slurm, the job directories and the store
(:func:`hpcsched.daemon.views.daemon_job_facts`); the simulator from its simulated Slurm and job
physics (:mod:`hpcsched.sim.engine`). Everything derived -- attained service, remaining work,
the current size and its nodes, GPUs held by jobs hpcsched does not manage, other users' pending
jobs -- is defined here once. Pure: no I/O.

Units: seconds, samples, samples/s, GPUs, GPU-seconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from hpcsched import slurm
from hpcsched.model.snapshot import ClusterSnapshot, ForeignJob, GPUView, JobView, NodeView, ProfilePoint
from hpcsched.perf.priors import application_key
from hpcsched.perf.shared import StepCorrections
from hpcsched.protocol import files as ctl
from hpcsched.protocol.extensions import parse_extension_comment
from hpcsched.protocol.kinds import SlurmState
from hpcsched.protocol.limits import JobLimits
from hpcsched.slurm.observe import Observation

# pending reasons (squeue %r) of jobs that cannot start now whatever the scheduler does
NOT_ELIGIBLE = ("JobHeld", "BeginTime", "Dependency", "DependencyNeverSatisfied",
                "PartitionDown", "PartitionInactive", "Reservation")


@dataclass(frozen=True)
class JobReport:
    """What a job says about its own training (``progress.json``), in the policies' units.

    Attributes:
        samples_processed: samples trained on since the job began (all epochs, all ranks; or
            the job's own work units, :meth:`hpcsched.elastic.ElasticJob.set_work`).
        remaining_samples: samples left to train on, or ``None`` if the job does not say.
        steps: optimizer steps done since the job began.
        throughput: samples/s, latest.
        grad_noise: ``(grad_sqr, grad_var)`` as Pollux's statistical efficiency takes them
            (|G|^2, and tr(Sigma) at the base batch size), or ``None`` until measured.
    """

    samples_processed: float = 0.0
    remaining_samples: float | None = None
    throughput: float = 0.0
    steps: int = 0
    grad_noise: tuple[float, float] | None = None

    @classmethod
    def from_progress(cls, progress: ctl.Progress | None, base_batch_size: int) -> JobReport:
        """The report in a job's :class:`~hpcsched.protocol.files.Progress` (``None``: nothing
        reported yet).

        The job reports tr(Sigma) per sample (:mod:`hpcsched.job.gradient_noise`); Pollux's
        efficiency (Qiao et al., OSDI'21, §3.1; AdaptDL's ``goodput.py``) takes the variance at
        the base batch size M0 (the submitted global batch size): tr(Sigma) / M0.
        """
        if progress is None:
            return cls()
        noise = None
        if progress.grad_sqr is not None and progress.grad_var is not None:
            noise = (float(progress.grad_sqr), float(progress.grad_var) / max(1, base_batch_size))
        remaining = None
        if progress.total_samples:
            # the work left is what the job says it trains on in all, less what it has done
            remaining = max(0.0, progress.total_samples - progress.samples_processed)
        return cls(samples_processed=progress.samples_processed, remaining_samples=remaining,
                   throughput=progress.throughput, grad_noise=noise, steps=progress.step)


@dataclass(frozen=True)
class JobFacts:
    """Everything known about one managed job at one instant.

    Attributes:
        info: Slurm's record of the job (state, nodes allocated, restarts, partition, user).
        limits: the job's resize limits.
        nodes: node count in force (running) or asked for (pending).
        batch_size: global batch size in force (samples).
        generation: the control generation in force or requested.
        submit_time: when the job was submitted (seconds).
        application: what the job trains (selects the throughput prior and the variability
            class; the daemon uses the script's file name).
        profile: measured step times and throughput per configuration.
        report: the job's own progress report.
        busy: a resize is in flight or the job is starting: policies must leave it as it is.
        held: pending because hpcsched holds it after a preemption.
        requested_nodes: a pending job's required node list (``ReqNodeList``), where known.
        start_time: when the job (last) started, where known (seconds).
        layout: GPUs on each of its nodes when they differ (GPU-granular; empty: uniform).
        primary: GPUs its primary Slurm job holds on each of its first nodes, when it runs on
            extension jobs too (GPU-granular; empty: the whole allocation is the primary's).
        resized_at: when it last changed size or (re)started (seconds); ``None``: its
            ``start_time`` (on Slurm a grow requeues the job, so its start time is when it
            last grew; a shrink in place is not seen there).
        last_resize: ``"grow"`` or ``"shrink"``: the direction of hpcsched's last resize of
            the job (:func:`last_resize`); ``None``: none since it was submitted, or unknown.
        grow_failed_at: when its latest resize, a grow, failed (seconds); ``None``: none.
        step_corrections: what its application's jobs measured here
            (:func:`application_tables`); ``None``: not gathered.
        submitted_gpus: GPUs it was submitted with (hpcsub's nodes x GPUs per node); 0:
            unknown.
        gpus_held: the GPUs it holds, ``(node, index)``; empty: not known.
    """

    info: slurm.JobInfo
    limits: JobLimits
    nodes: int
    batch_size: int
    generation: int
    submit_time: float
    application: str
    profile: tuple[ProfilePoint, ...] = ()
    report: JobReport = JobReport()
    busy: bool = False
    held: bool = False
    requested_nodes: tuple[str, ...] = ()
    start_time: float | None = None
    layout: tuple[int, ...] = ()
    primary: tuple[int, ...] = ()
    resized_at: float | None = None
    last_resize: str | None = None
    grow_failed_at: float | None = None
    step_corrections: StepCorrections | None = None
    submitted_gpus: int = 0
    gpus_held: tuple[tuple[str, int], ...] = ()


def attained_gpu_seconds(profile: Iterable[ProfilePoint]) -> float:
    """GPU-seconds of training a job has received: sum over its measured configurations of
    steps x seconds per step x GPUs (Tiresias' attained service, Gu et al., NSDI'19 §3.1: GPUs x
    executed time). Time spent starting, checkpointing or restarting is not service."""
    return sum(p.samples * p.step_time * p.world_size for p in profile)


def job_view(f: JobFacts) -> JobView:
    """The policy's view of one job (see :class:`JobFacts`)."""
    running = f.info.state == SlurmState.RUNNING
    return JobView(
        job_id=f.info.job_id, state=f.info.state, nodes=f.nodes,
        node_names=tuple(slurm.expand_hostlist(f.info.nodes)) if running else f.requested_nodes,
        limits=f.limits, batch_size=f.batch_size, submit_time=f.submit_time,
        start_time=f.start_time, restarts=f.info.restarts,
        generation=f.generation, samples_processed=int(f.report.samples_processed),
        steps=f.report.steps,
        throughput=f.report.throughput, profile=f.profile, app_class=f.application,
        busy=f.busy, user=f.info.user, partition=f.info.partition,
        attained_gpu_seconds=attained_gpu_seconds(f.profile),
        remaining_samples=f.report.remaining_samples, grad_noise=f.report.grad_noise,
        held=f.held, slurm_priority=f.info.priority, submitted_gpus=f.submitted_gpus,
        layout=f.layout, primary=f.primary,
        resized_at=f.resized_at if f.resized_at is not None else (f.start_time if running else None),
        last_resize=f.last_resize, grow_failed_at=f.grow_failed_at,
        step_corrections=f.step_corrections,
        gpus_held=(f.gpus_held or held_gpus((f.info,))) if running else (),
        scheduled_nodes=_planned_nodes(f.info) if f.info.state == SlurmState.PENDING else ())


def _indexed(info: slurm.JobInfo) -> tuple[list[str], tuple[tuple[int, ...], ...] | None]:
    """A Slurm job's nodes and the GPU indexes it holds on each (``gpu_index``), or ``None``
    for the indexes when it does not say which (one list per node, or none)."""
    names = slurm.expand_hostlist(info.nodes)
    return names, (info.gpu_index if names and len(info.gpu_index) == len(names) else None)


def held_gpus(infos: Iterable[slurm.JobInfo]) -> tuple[tuple[str, int], ...]:
    """The GPUs the Slurm jobs ``infos`` hold, ``(node, index)`` (their ``gpu_index``), or
    ``()`` when one of them does not say which (unknown, never a guess). Pure."""
    out: list[tuple[str, int]] = []
    for info in infos:
        names, index = _indexed(info)
        if index is None:
            return ()
        out.extend((n, i) for n, idx in zip(names, index) for i in idx)
    return tuple(out)


def free_indexes(nodes: Sequence[NodeView], infos: Iterable[slurm.JobInfo]) -> tuple[NodeView, ...]:
    """``nodes`` with :attr:`~hpcsched.model.snapshot.NodeView.free_index` filled from the GPUs
    the jobs ``infos`` (every job Slurm lists) hold: a node's indexes ``0..gpus-1`` less theirs.
    Left ``None`` where a job on the node does not say which GPUs it holds, or where the count
    disagrees with the node's allocated GPUs (a job ``infos`` lacks); nodes that have their
    indexes already (the simulator's) keep them, and then the jobs are not read. Pure."""
    if all(n.free_index is not None for n in nodes):
        return tuple(nodes)
    used: dict[str, set[int]] = {}
    unknown: set[str] = set()
    for info in infos:
        if info.state not in (SlurmState.RUNNING, SlurmState.COMPLETING) or not info.gpus_per_node:
            continue
        names, index = _indexed(info)
        if index is None:
            unknown.update(names)
            continue
        for n, idx in zip(names, index):
            used.setdefault(n, set()).update(idx)
    out = []
    for node in nodes:
        if node.free_index is None and node.name not in unknown:
            free = tuple(i for i in range(node.gpus) if i not in used.get(node.name, ()))
            if len(free) == node.gpus - node.gpus_allocated:
                node = dataclasses.replace(node, free_index=free)
        out.append(node)
    return tuple(out)


def application_tables(applications: Iterable[str],
                       corrections: Callable[[str], StepCorrections | None]
                       ) -> dict[str, StepCorrections | None]:
    """``corrections(application)`` (what its jobs measured here, :mod:`hpcsched.perf.shared`)
    once per application, keyed by :func:`~hpcsched.perf.priors.application_key`; no entry for
    an empty name (a job without an application has no table)."""
    tables: dict[str, StepCorrections | None] = {}
    for a in applications:
        app = application_key(a)
        if app and app not in tables:
            tables[app] = corrections(app)
    return tables


def with_step_corrections(views: Sequence[JobView],
                          corrections: Callable[[str], StepCorrections | None]
                          ) -> tuple[JobView, ...]:
    """``views`` with each job's :attr:`~JobView.step_corrections`: its application's table
    (:func:`application_tables`). A job without an application, or whose application has no
    table, keeps ``None``."""
    tables = application_tables((v.app_class for v in views), corrections)
    return tuple(dataclasses.replace(v, step_corrections=t)
                 if (t := tables.get(application_key(v.app_class))) is not None else v
                 for v in views)


def cluster_snapshot(obs: Observation, jobs: Sequence[JobView], partitions: Sequence[str] = (),
                     gpus: Sequence[GPUView] = (), counted: Iterable[str] = ()) -> ClusterSnapshot:
    """The snapshot of ``obs`` with the managed ``jobs``; GPUs that running jobs hpcsched does
    not manage hold on each node are counted from Slurm's records (their GPUs per node).
    ``counted``: other Slurm jobs whose GPUs ``jobs`` already count (extension jobs, see
    :func:`extension_jobs`), not counted again."""
    mine = {j.job_id for j in jobs} | set(counted)
    other: dict[str, int] = {}
    for info in obs.jobs.values():
        if info.job_id not in mine and info.state == SlurmState.RUNNING and info.gpus_per_node:
            for n in slurm.expand_hostlist(info.nodes):
                other[n] = other.get(n, 0) + info.gpus_per_node
    return ClusterSnapshot(time=obs.time, nodes=free_indexes(obs.nodes, obs.jobs.values()), jobs=tuple(jobs),
                           other_gpus_allocated=tuple(sorted(other.items())),
                           partitions=tuple(partitions), gpus=tuple(gpus),
                           foreign_pending=foreign_pending(obs, mine, partitions))


def foreign_pending(obs: Observation, mine: Iterable[str], partitions: Sequence[str] = ()
                    ) -> tuple[ForeignJob, ...]:
    """The pending GPU jobs of ``obs`` that hpcsched does not manage (not in ``mine``, not an
    extension job) and Slurm could start (:func:`eligible`), in ``partitions`` (all when empty):
    other users' plain jobs, whose GPUs hpcsched's grows yield to
    (:mod:`hpcsched.policies.neighbours`). Pure."""
    return tuple(ForeignJob(i.job_id, i.user, max(1, i.node_count), i.gpus_per_node, i.priority,
                            i.submit_time or 0.0, i.start_time, i.partition, _planned_nodes(i))
                 for i in _pending_gpu_jobs(obs, partitions, mine))


def plans_unread(obs: Observation, partitions: Sequence[str] = ()) -> bool:
    """Whether a pending GPU job Slurm could start (:func:`eligible`; not an extension job), in
    ``partitions`` (all when empty), has a planned start (backfill's) whose nodes ``obs`` does
    not give (:attr:`~hpcsched.slurm.JobInfo.scheduled_nodes` None: Slurm 22.05's JSON): then
    the daemon asks Slurm for them (:meth:`~hpcsched.slurm.observe.Backend.with_planned_nodes`).
    Other users' jobs (:func:`foreign_pending`) and hpcsched's own alike: the free GPUs on
    either's planned nodes are kept out of grows (:mod:`hpcsched.policies.neighbours`). Pure."""
    return any(i.start_time and i.scheduled_nodes is None for i in _pending_gpu_jobs(obs, partitions))


def _pending_gpu_jobs(obs: Observation, partitions: Sequence[str], mine: Iterable[str] = ()
                      ) -> Iterator[slurm.JobInfo]:
    """The pending GPU jobs of ``obs`` Slurm could start (:func:`eligible`; no extension job),
    in ``partitions`` (all when empty), but those in ``mine``, one by one (so that
    :func:`plans_unread` stops at the first): with hpcsched's jobs as ``mine``, the jobs
    :func:`foreign_pending` lists."""
    mine, parts = set(mine), set(partitions)
    return (i for i in obs.jobs.values()
            if i.state == SlurmState.PENDING and i.gpus_per_node > 0 and i.job_id not in mine
            and (not parts or i.partition in parts) and eligible(i)
            and parse_extension_comment(i.comment) is None)


def _planned_nodes(info: slurm.JobInfo) -> tuple[str, ...]:
    """The nodes Slurm's backfill plans ``info`` onto (:attr:`~hpcsched.slurm.JobInfo.
    scheduled_nodes`), with its planned start only; none for a hostlist that does not parse
    (the job is then yielded to as one without a plan, not the round lost)."""
    if not info.scheduled_nodes or not info.start_time:
        return ()
    try:
        return tuple(slurm.expand_hostlist(info.scheduled_nodes))
    except slurm.SlurmError:
        return ()


def eligible(info: slurm.JobInfo, held: bool = False) -> bool:
    """A job the policy may plan for: running, or pending and free to start (not held, not
    waiting for a begin time, a dependency or a reservation: those are someone else's
    decision), or ``held`` by hpcsched's own preemption (:func:`held_after_preemption`)."""
    if info.state == SlurmState.RUNNING:
        return True
    return info.state == SlurmState.PENDING and (held or not info.state_reason.startswith(NOT_ELIGIBLE))


#: slurm-plugins/job_submit.lua's AdminComment on an hpcsub job it holds for placement
PLACEMENT_TAG, PLACEMENT_HOLD = "hpcsched:elastic ", " hold="


def held_for_placement(info: slurm.JobInfo) -> bool:
    """The job pends until the begin time ``slurm-plugins/job_submit.lua`` gave it, for the
    daemon to place it (its AdminComment says ``hpcsched:elastic ... hold=<s>``): the daemon
    plans for it as for a job it holds, and releases it (``StartTime=now``) when the plan gives
    it GPUs; Slurm starts it anyway when the begin time passes."""
    return (info.state == SlurmState.PENDING and info.state_reason.startswith("BeginTime")
            and info.admin_comment.startswith(PLACEMENT_TAG)
            and PLACEMENT_HOLD in info.admin_comment)
