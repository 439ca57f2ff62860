"""The daemon's side of the job views: which Slurm jobs are hpcsched's (:class:`ManagedJobs`),
their facts from the job directories and the store (:func:`daemon_job_facts`), and the
daemon's snapshot (:func:`daemon_snapshot`), built with the pure builder the simulator shares
(:mod:`hpcsched.views.build`, whose names are importable from here too).

Units: seconds, samples, samples/s, GPUs, GPU-seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpcsched import slurm
from hpcsched.daemon.actuator import current_from
from hpcsched.daemon.site_limits import SiteLimits, job_limits
from hpcsched.model.snapshot import ClusterSnapshot, GPUView, ProfilePoint
from hpcsched.perf.shared import step_corrections
from hpcsched.protocol import files as ctl
from hpcsched.protocol.extensions import parse_extension_comment
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.kinds import ChangeKind, Granularity, SlurmState
from hpcsched.slurm.observe import Observation
from hpcsched.views.build import (  # noqa: F401 - the builder's names, importable from here too
    NOT_ELIGIBLE,
    PLACEMENT_HOLD,
    PLACEMENT_TAG,
    JobFacts,
    JobReport,
    application_tables,
    attained_gpu_seconds,
    cluster_snapshot,
    eligible,
    foreign_pending,
    held_for_placement,
    held_gpus,
    job_view,
    plans_unread,
    with_step_corrections,
)

if TYPE_CHECKING:  # pragma: no cover - the simulator builds views without a store
    from hpcsched.daemon.store import Store

log = logging.getLogger("hpcsched.daemon")

def last_resize(job_id: str, store: Store) -> str | None:
    """The direction of hpcsched's last resize of the job, from the journal: its newest entry
    that did not fail and changes its size, once that entry took effect (phase ``running``):
    ``"grow"`` for a grow (by requeue, or by extension: a ``reform`` to more nodes), or for a
    ``pending`` change that released it after a preemption; ``"shrink"`` for a shrink (in
    place, or a ``reform`` that gives extension nodes back); ``None`` otherwise (no resize yet,
    a resize still in flight, a ``reform`` that moves the job on as many nodes, a pending job's
    size set before its first start). Batch-only changes leave the size as it is and are
    skipped."""
    acts = [a for a in store.actions(job_id, limit=10)
            if a.phase != "failed" and a.kind != ChangeKind.BATCH]
    if not acts or acts[0].phase != "running":
        return None
    direction = _direction(acts[0])
    if direction is not None:
        return direction
    released = (acts[0].kind == ChangeKind.PENDING and len(acts) > 1
                and acts[1].kind == ChangeKind.PREEMPT)
    return ChangeKind.GROW.value if released else None


def grow_failed_at(job_id: str, store: Store) -> float | None:
    """When hpcsched's latest resize of the job failed, if it was a grow (a ``grow``, or a
    ``reform`` to more nodes: an extension Slurm refused, a job that did not answer), Unix
    seconds; ``None`` otherwise. Batch-only changes are skipped, as in :func:`last_resize`."""
    acts = [a for a in store.actions(job_id, limit=10) if a.kind != ChangeKind.BATCH]
    if not acts or acts[0].phase != "failed":
        return None
    a = acts[0]
    return a.updated_at if _direction(a) == ChangeKind.GROW or a.mechanism == "extend" else None


def _direction(a) -> str | None:
    """``"grow"`` or ``"shrink"``: the size change journal entry ``a`` makes (a ``grow`` or
    ``shrink``, or a ``reform`` to more or fewer nodes); None for any other."""
    if a.kind in (ChangeKind.GROW, ChangeKind.SHRINK):
        return ChangeKind(a.kind).value
    if a.kind == ChangeKind.REFORM and a.to_nodes != a.from_nodes:
        return (ChangeKind.GROW if a.to_nodes > a.from_nodes else ChangeKind.SHRINK).value
    return None


def held_after_preemption(info: slurm.JobInfo, store: Store) -> bool:
    """The job pends after hpcsched's preemption: PENDING, and its newest journal entry that
    did not fail is a ``preempt`` that took effect (phase ``running``) at a lower restart count
    than Slurm's now (its requeue). Slurm's reason is not asked: it reads ``None`` for a moment
    after the begin time is set, and ``BeginTime`` after."""
    if info.state != SlurmState.PENDING:
        return False
    last = next((a for a in store.actions(info.job_id, limit=10) if a.phase != "failed"), None)
    return (last is not None and last.kind == "preempt" and last.phase == "running"
            and info.restarts > last.restarts_at_plan)


# ----------------------------------------------------------------------------- the daemon's facts
ManagedJob = tuple[JobDir, JobSpec, slurm.JobInfo]


@dataclass(frozen=True)
class Exclusions:
    """Jobs the site keeps out of hpcsched's hands (``[daemon] exclude_users``,
    ``exclude_accounts``, ``exclude_qos``): by Slurm's user, account or QOS of the job. An
    excluded hpcsub job is not managed: the daemon counts its GPUs as another user's, yields to
    it while it pends, and never resizes it."""

    users: frozenset[str] = frozenset()
    accounts: frozenset[str] = frozenset()
    qos: frozenset[str] = frozenset()

    def excludes(self, info: slurm.JobInfo) -> bool:
        return (info.user in self.users or (bool(info.account) and info.account in self.accounts)
                or (bool(info.qos) and info.qos in self.qos))


class ManagedJobs:
    """Which Slurm jobs are hpcsched's: those with a job directory (``by-id/<id>``) under the
    control directory, in a managed partition, not excluded (:class:`Exclusions`). Specs are
    read once per job and cached while Slurm lists the job (a daemon that runs for months sees
    every job ever submitted: it keeps only those Slurm still knows)."""

    def __init__(self, control_dir: Path, partitions: Sequence[str] = (),
                 exclusions: Exclusions = Exclusions()):
        self.control_dir = control_dir
        self.partitions = set(partitions)
        self.exclusions = exclusions
        self._specs: dict[str, tuple[JobDir, JobSpec]] = {}

    def find(self, obs: Observation) -> dict[str, ManagedJob]:
        """The managed jobs Slurm knows in ``obs``, by Slurm job id. A job directory that cannot
        be read or trusted is skipped with a warning naming the job (and tried again next
        round); it never stops the others."""
        out = {}
        self._specs = {j: v for j, v in self._specs.items() if j in obs.jobs}
        for job_id in JobDir.known_job_ids(self.control_dir):
            info = obs.jobs.get(job_id)
            if info is None or (self.partitions and info.partition not in self.partitions) \
                    or self.exclusions.excludes(info):
                continue
            if job_id not in self._specs:
                try:
                    self._specs[job_id] = self._read(job_id, info.user)
                except (LookupError, OSError, RuntimeError, ctl.ProtocolError) as exc:
                    log.warning("job %s: ignored: %s", job_id, exc)
                    continue
            jd, spec = self._specs[job_id]
            out[job_id] = (jd, spec, info)
        return out

    def _read(self, job_id: str, user: str) -> tuple[JobDir, JobSpec]:
        """The job's directory and spec, read with bounds (``spec.json`` as the protocol's files:
        no symbolic link, a regular file, at most 1 MiB).

        Raises:
            LookupError: no job directory, or a ``by-id`` link out of its user's subtree
                (:meth:`JobDir.for_job`). OSError, RuntimeError: ``by-id/<job_id>`` cannot be
                resolved (a loop). ProtocolError: the spec is missing, malformed or of the wrong
                types.
        """
        jd = JobDir.for_job(job_id, self.control_dir, user=user)   # Slurm's user of the job
        obj = ctl.load_json_object(jd.spec_path)
        if obj is None:
            raise ctl.ProtocolError(f"{jd.spec_path}: missing")
        spec = JobSpec.from_json(obj, jd.spec_path)
        problem = _spec_problem(spec)
        if problem:
            raise ctl.ProtocolError(f"{jd.spec_path}: {problem}")
        return jd, spec


def _spec_problem(spec: JobSpec) -> str | None:
    """Why ``spec``'s fields that the daemon stores and computes with have the wrong types or
    sizes (the limits check themselves: :class:`JobLimits`), or None."""
    for name, most in (("job_uid", 64), ("user", 128), ("script", 4096), ("python", 4096),
                       ("submit_dir", 4096), ("checkpoint_dir", 4096), ("application", 64)):
        v = getattr(spec, name)
        if not isinstance(v, str) or len(v) > most:
            return f"{name} must be a string of at most {most} characters"
    if len(Path(spec.script).stem) > 128:
        return "the script's name is longer than 128 characters"
    if not all(isinstance(a, str) for a in spec.script_args + spec.sbatch_args):
        return "script_args and sbatch_args must be strings"
    if not isinstance(spec.nodes, int) or isinstance(spec.nodes, bool) or not 0 < spec.nodes < 2**31:
        return "nodes must be a positive integer"
    for name in ("created_at", "checkpoint_interval", "mtbf"):
        v = getattr(spec, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            return f"{name} must be a finite number"
    return None


def application_of(spec: JobSpec) -> str:
    """What a daemon-managed job trains: ``hpcsub --hpcsched-application``, else its script's
    file name without extension."""
    return spec.application or Path(spec.script).stem


def daemon_job_facts(jd: JobDir, spec: JobSpec, info: slurm.JobInfo, store: Store,
                     busy: bool) -> JobFacts:
    """A managed job's facts from Slurm (``info``), its job directory and the store.

    ``busy`` (an action of the journal is open for the job) is widened: a job whose files cannot
    be read, that has not acknowledged yet, whose launcher is mid-resize or that has a control
    generation it has not acknowledged is busy too.

    Never raises for what the job's files hold: they are read with bounds
    (:func:`hpcsched.protocol.files.load_json_object`), and a file that is missing, malformed,
    too large, a symbolic link, a FIFO or an impossible claim (:func:`_credible_progress`) is a
    warning naming the job; the job is then busy for this round.
    """
    try:
        ack = ctl.read_ack(jd.ack_path, jd.uid)
        control = ctl.read_control(jd.control_path, jd.uid)
        progress = _credible_progress(ctl.read_progress(jd.progress_path, jd.uid), spec,
                                      jd.progress_path)
    except (ctl.ProtocolError, TypeError) as exc:
        log.warning("job %s: %s", info.job_id, exc)
        ack = control = progress = None
        busy = True
    cur = current_from(spec, info, control, ack)
    if info.state == SlurmState.RUNNING:
        busy = busy or ack is None or _launcher_in_transition(jd, info.job_id) or (
            control is not None and control.generation > ack.generation)
    profile = tuple(ProfilePoint(p.world_size, p.nodes, p.local_batch_size, p.accumulation_steps,
                                 p.step_time, p.throughput, p.steps)
                    for p in store.profile(info.job_id))
    return JobFacts(info=info, limits=spec.limits, nodes=cur.nodes,
                    batch_size=cur.global_batch_size, generation=cur.generation,
                    submit_time=spec.created_at, application=application_of(spec),
                    profile=profile, report=JobReport.from_progress(progress, spec.limits.base_batch_size),
                    busy=busy,
                    # the job's acknowledgement of the configuration in force is when it took
                    # effect (its start, for generation 0): reconcile's no-thrash hold counts
                    # from it
                    resized_at=ack.time if ack is not None and info.state == SlurmState.RUNNING else None,
                    last_resize=last_resize(info.job_id, store) if info.state == SlurmState.RUNNING else None,
                    grow_failed_at=grow_failed_at(info.job_id, store) if info.state == SlurmState.RUNNING else None,
                    submitted_gpus=spec.nodes * spec.limits.workers_per_node)


def _credible_progress(progress: ctl.Progress | None, spec: JobSpec,
                       path: Path) -> ctl.Progress | None:
    """``progress`` if its claims can be true: each optimizer step trains on at most the job's
    largest global batch size, so ``samples_processed`` <= ``step`` x ``max_batch_size``
    (the file's types and ranges are checked when read: :func:`hpcsched.protocol.files.read_progress`).

    Raises:
        ProtocolError: more samples claimed than the job's steps could have processed.
    """
    if progress is not None and progress.samples_processed > progress.step * spec.limits.max_batch_size:
        raise ctl.ProtocolError(
            f"{path}: {progress.samples_processed} samples processed claimed in {progress.step} "
            f"step(s) of at most {spec.limits.max_batch_size} samples; impossible, not used")
    return progress


def _launcher_in_transition(jd: JobDir, job_id: str) -> bool:
    """The job's launcher is shrinking its allocation or waiting for a requeue. A
    ``launcher.json`` that cannot be trusted (malformed, foreign, of a launcher older than the
    schema, a link or a FIFO) is read as unknown (not in transition), with a warning naming the
    job."""
    try:
        state = ctl.read_launcher_state(jd.launcher_path, jd.uid)
    except (ctl.ProtocolError, TypeError) as exc:
        log.warning("job %s: launcher state unknown: %s", job_id, exc)
        return False
    return state is not None and state.phase.in_transition


def measured_gpu_views(store: Store, applications: Iterable[str]) -> tuple[GPUView, ...]:
    """Per-GPU slowdown by application, from the relative speeds the store has measured
    (slowdown = 1 / relative speed; 1 = the median GPU of the job)."""
    slow: dict[tuple[str, int], dict[str, float]] = {}
    for app in sorted(set(applications)):
        for (node, idx), speed in store.gpu_speeds(app).items():
            if speed > 0 and str(idx).isdigit():
                slow.setdefault((node, int(idx)), {})[app] = 1.0 / speed
    return tuple(GPUView(node, idx, tuple(sorted(s.items())))
                 for (node, idx), s in sorted(slow.items()))


def extension_jobs(obs: Observation, managed: Mapping[str, ManagedJob]
                   ) -> dict[str, tuple[slurm.JobInfo, ...]]:
    """The running extension jobs of each running managed job, by its Slurm id (pure): RUNNING
    Slurm jobs whose ``--comment`` tags them as extensions of it
    (:func:`hpcsched.protocol.extensions.parse_extension_comment`) with its job directory's
    uid, run by its Slurm user. A tag naming another uid or user is not the job's."""
    out: dict[str, list[slurm.JobInfo]] = {}
    for info in obs.jobs.values():
        tag = parse_extension_comment(info.comment) if info.state == SlurmState.RUNNING else None
        primary = managed.get(tag[0]) if tag is not None else None
        if (primary is not None and primary[2].state == SlurmState.RUNNING and primary[0].uid == tag[1]
                and primary[2].user == info.user and info.job_id != tag[0]):
            out.setdefault(tag[0], []).append(info)
    return {k: tuple(sorted(v, key=lambda i: (len(i.job_id), i.job_id))) for k, v in out.items()}


def with_extensions(info: slurm.JobInfo, extensions: Sequence[slurm.JobInfo],
                    workers_per_node: int) -> slurm.JobInfo | None:
    """A running job's Slurm record widened to its extension jobs' nodes (pure): ``nodes`` and
    ``node_count`` of the whole allocation, primary's nodes first, as the simulator reports a job
    grown by extension (:meth:`hpcsched.sim.engine.Simulator.job_infos`); None when a node
    would then hold other than ``workers_per_node`` of its GPUs (4 + 2): a node-granular view
    (whole nodes x workers per node) cannot describe that allocation (a GPU-granular one does:
    :func:`allocation_of`)."""
    per, _ = allocation_of(info, extensions, workers_per_node)
    if any(g != workers_per_node for g in per.values()):
        return None
    return dataclasses.replace(info, nodes=",".join(per), node_count=len(per))


def allocation_of(info: slurm.JobInfo, extensions: Sequence[slurm.JobInfo],
                  workers_per_node: int) -> tuple[dict[str, int], dict[str, int]]:
    """``(allocation, primary)``: GPUs per node of a running job's whole allocation (its primary
    Slurm job's nodes first, then its extension jobs' nodes in their order) and of its primary
    job alone, from Slurm's records (pure). A record without a GPU count per node counts
    ``workers_per_node`` (the primary) or 0 (an extension)."""
    primary = {n: info.gpus_per_node or workers_per_node for n in slurm.expand_hostlist(info.nodes)}
    per = dict(primary)
    for e in extensions:
        for n in slurm.expand_hostlist(e.nodes):
            per[n] = per.get(n, 0) + e.gpus_per_node
    return per, primary


def gpu_granular_facts(facts: JobFacts, extensions: Sequence[slurm.JobInfo],
                       workers_per_node: int) -> JobFacts:
    """``facts`` of a running job at GPU granularity: its allocation from Slurm's records
    (:func:`allocation_of`: the primary's GPUs and every extension job's, per node) as its
    nodes, ``layout`` and ``primary``, and the GPUs they hold (``gpus_held``, where Slurm says
    which). A pending job's facts are returned as they are."""
    if facts.info.state != SlurmState.RUNNING:
        return facts
    per, primary = allocation_of(facts.info, extensions, workers_per_node)
    held = held_gpus((facts.info, *extensions))
    info = dataclasses.replace(facts.info, nodes=",".join(per), node_count=len(per), gpu_index=())
    return dataclasses.replace(facts, info=info, nodes=len(per), layout=tuple(per.values()),
                               primary=tuple(primary.values()) if extensions else (),
                               gpus_held=held)


def _own_extensions(exts: Mapping[str, Sequence[slurm.JobInfo]], managed: Mapping[str, ManagedJob],
                    granularity: Granularity) -> tuple[dict[str, slurm.JobInfo], list[str]]:
    """Which extension jobs (``exts``: job id -> its extension jobs) count as their job's own
    GPUs: ``(widened, counted)``, the jobs whose Slurm view is widened to their whole
    allocation (at ``granularity`` ``"node"``, where it is whole nodes:
    :func:`with_extensions`) and the ids of the extension jobs counted as their job's (all of
    them at ``"gpu"``); the others stay other jobs' GPUs."""
    widened: dict[str, slurm.JobInfo] = {}
    counted: list[str] = []
    for job_id, found in exts.items():
        _, spec, info = managed[job_id]
        if granularity == Granularity.GPU:
            counted.extend(e.job_id for e in found)
            continue
        whole = with_extensions(info, found, spec.limits.workers_per_node)
        if whole is None:
            log.debug("job %s: extension job(s) %s left as other jobs' GPUs: not whole nodes",
                      job_id, ", ".join(e.job_id for e in found))
            continue
        widened[job_id] = whole
        counted.extend(e.job_id for e in found)
    return widened, counted


def daemon_snapshot(obs: Observation, managed: Mapping[str, ManagedJob], store: Store,
                    busy: set[str], partitions: Sequence[str], throughput_model: str = "shared",
                    granularity: Granularity = Granularity.NODE, site: SiteLimits | None = None) -> ClusterSnapshot:
    """The daemon's snapshot: every eligible managed job's view (a job hpcsched preempted and
    holds, or one job_submit.lua holds for placement: ``held``), and the measured GPUs. With
    ``throughput_model`` ``"shared"`` each view carries what its application's jobs measured
    here (:func:`with_step_corrections`, from :meth:`Store.application_profile`).

    A running job's extension jobs (:func:`extension_jobs`) count as its own GPUs, not other
    jobs'. At ``granularity`` ``"gpu"`` its view is its whole allocation, GPUs per node, with its
    primary's part (:func:`gpu_granular_facts`), whatever the shape (4 + 2); at ``"node"`` only
    when its whole allocation is whole nodes of its workers per node (:func:`with_extensions`),
    otherwise they stay counted as GPUs other jobs hold and the job's view is its primary
    allocation. Each job's limits are its spec's capped by the site's (``site``, and the
    job_submit plugin's tag: :func:`hpcsched.daemon.site_limits.job_limits`)."""
    site = site or SiteLimits()
    held = {job_id for job_id, (_, _, info) in managed.items() if job_id not in busy
            and (held_for_placement(info) or held_after_preemption(info, store))}
    exts = extension_jobs(obs, managed)
    widened, counted = _own_extensions(exts, managed, granularity)

    def facts(job_id: str, jd: JobDir, spec: JobSpec, info: slurm.JobInfo) -> JobFacts:
        f = daemon_job_facts(jd, spec, widened.get(job_id, info), store, job_id in busy)
        if granularity == Granularity.GPU:
            f = gpu_granular_facts(f, exts.get(job_id, ()), spec.limits.workers_per_node)
        limits = job_limits(job_id, spec.limits, info.admin_comment, info.partition, site)
        return dataclasses.replace(f, held=job_id in held, limits=limits)

    views = tuple(job_view(facts(job_id, jd, spec, info))
                  for job_id, (jd, spec, info) in managed.items()
                  if eligible(info, job_id in held))
    if throughput_model == "shared":
        measured = store.application_profile({v.app_class for v in views})
        views = with_step_corrections(views, lambda app: step_corrections(
            app, measured.get(app, ())))
    snap = cluster_snapshot(obs, views, partitions,
                            measured_gpu_views(store, {j.app_class for j in views}), counted)
    return dataclasses.replace(snap, granularity=granularity)


__all__ = ["JobFacts", "JobReport", "ManagedJobs", "application_tables", "attained_gpu_seconds", "cluster_snapshot",
           "foreign_pending", "plans_unread",
           "daemon_job_facts", "daemon_snapshot", "eligible", "extension_jobs",
           "allocation_of", "gpu_granular_facts", "held_after_preemption", "held_for_placement",
           "job_view", "measured_gpu_views", "with_extensions",
           "with_step_corrections"]
