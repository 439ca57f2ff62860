"""``hpcsched daemon``: every round, observe -> ingest -> decide -> reconcile -> apply -> record.

* **observe**: one :meth:`Backend.observe` (``squeue --json`` + ``sinfo --json``: 2 Slurm calls
  whatever the number of jobs). A controller that does not answer ends the round with the
  error recorded and nothing decided: the daemon never acts on stale state.
* **ingest**: each managed job's new metrics lines into profile samples and per-GPU
  measurements (:mod:`hpcsched.daemon.ingest`).
* **reap**: extension jobs whose primary job has ended are cancelled
  (:mod:`hpcsched.daemon.reaper`).
* **advance**: every open action of the journal (not ``running`` or ``failed``; also those an
  earlier daemon left) takes one step of its state machine (:mod:`hpcsched.daemon.phases`,
  executed by :class:`hpcsched.daemon.actuator.Actuator`) on this round's observation; each
  transition is journaled. Nothing waits for a job: a resize spans as many rounds as it needs,
  many at once, and its job is ``busy`` for the policy meanwhile. A daemon killed at any point
  resumes from the journaled phase and does nothing twice.
* **decide**: the configured policy, a pure function of an immutable
  :class:`~hpcsched.model.snapshot.ClusterSnapshot` (the same code the simulator runs).
* **reconcile**: :func:`hpcsched.policies.reconcile.reconcile` (gain vs restart cost, placement, order).
* **apply**: every change is journaled ``requested`` (one commit) before anything is touched,
  then takes its first step (the control generation is written), the changes of different jobs
  side by side, so their Slurm commands wait for slurmctld together
  (:mod:`hpcsched.daemon.driving`). Later rounds move it on to
  ``running`` when the job runs at the new size, or ``failed`` with the reason. Resizes go
  through the state machine ``hpcsched resize`` steps too.
* **record**: the round (time, duration, policy, objective, Slurm calls, policy time).

Rounds run every ``daemon.round_interval`` seconds. For a policy that asks for them
(``round_on_events``: ``jct``) and with ``daemon.event_rounds`` on, a round also runs as soon as
a managed job ends or a newly submitted one pends, or another user's GPU job pends while a
managed job runs (:func:`foreign_event`: the round yields extension GPUs to it), checked every
``daemon.event_poll`` seconds between rounds (:func:`round_event`), as the simulator does
(``SimConfig.event_rounds``); the periodic rounds keep their times.

Jobs are hpcsched's when their Slurm id has a job directory (``by-id/<id>``) under the
control directory, and they are in a managed partition. A pending job that cannot start now
(held, waiting for its begin time or a dependency) is left alone: whoever set that decides
when it may run, and at what size. The exception is a job hpcsched preempted itself: it pends
until the begin time the preemption gave it (``daemon.preemption_deadline``, the guard that
starts it even with no daemon), and the policy may release it earlier
(:func:`hpcsched.daemon.views.eligible`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hpcsched import slurm
from hpcsched.daemon import views
from hpcsched.daemon.actuator import (
    Action,
    Actuator,
    current_of,
    journaled,
    read_or_none,
    realised_action,
)
from hpcsched.daemon.between import BetweenRounds, mtime_ns
from hpcsched.daemon.config import Settings
from hpcsched.daemon.costs import measured_costs
from hpcsched.daemon.driving import IN_FLIGHT, Drive, Steps
from hpcsched.daemon.gpu_status import gpu_rows
from hpcsched.daemon.ingest import Budgets, Pending, ingest_jobs
from hpcsched.daemon.layouts import batch_layout, layout_in_force, reform_layout
from hpcsched.daemon.metrics import DaemonMetrics
from hpcsched.daemon.phases import REQUEUES, History, ResizePhase, Timeouts
from hpcsched.daemon.probes import ProbeWatch
from hpcsched.daemon.reaper import Reaper
from hpcsched.daemon.requeued import release_requeued
from hpcsched.daemon.retention import Retention
from hpcsched.daemon.site_limits import read_site_limits
from hpcsched.daemon.store import Store
from hpcsched.daemon.store.checkpoint import BackgroundCheckpoint
from hpcsched.daemon.store.prefetch import Prefetched
from hpcsched.daemon.views import application_of
from hpcsched.model.snapshot import ClusterSnapshot
from hpcsched.perf.model import clear_caches
from hpcsched.policies import make_policy
from hpcsched.policies.reconcile import Change, Costs
from hpcsched.policies.round import (
    PartitionOverlap,
    RoundDecision,
    decide_by_partition,
    decide_round,
)
from hpcsched.protocol import files as ctl
from hpcsched.protocol.extensions import layout_pairs
from hpcsched.protocol.jobdir import JobDir, JobSpec
from hpcsched.protocol.kinds import ChangeKind, GrowMode, SlurmState
from hpcsched.slurm.control import CLISlurmControl
from hpcsched.slurm.observe import Backend, make_backend
from hpcsched.views.claims import ClaimBook, check_claims

log = logging.getLogger("hpcsched.daemon")


@dataclass
class RoundReport:
    """What one round did (also recorded in the store)."""

    round_id: int
    started: float
    duration: float = 0.0
    slurm_calls: int = 0
    policy_seconds: float = 0.0
    jobs: int = 0
    changes: list[Change] = field(default_factory=list)
    # job_id -> the phase its action reached this round, "failed: <why>", "interrupted"
    # (Slurm did not answer an effect: the step is taken again next round) or "in flight" (its
    # step still under way when the round stopped waiting: hpcsched.daemon.driving)
    outcomes: dict[str, str] = field(default_factory=dict)
    step_waited: float = 0.0   # seconds the round has waited for resize steps (daemon.step_wait)
    kinds: dict[str, str] = field(default_factory=dict)   # job_id -> journal kind of its outcome
    notes: list[str] = field(default_factory=list)
    # orphaned extension jobs whose scancel ended since the last round (it runs in a thread)
    reaped: list[str] = field(default_factory=list)
    objective: float | None = None   # the plan's own figure of merit (unit per policy)
    error: str | None = None
    slurm_states: dict[str, str] = field(default_factory=dict)   # managed job_id -> Slurm state
    snapshot: ClusterSnapshot | None = None   # what the policy decided on (None: no decision)
    gpus: list = field(default_factory=list)   # GpuStatus rows (probes), when metrics are on
    #: seconds per part of the round (:data:`PHASES`), for the scale benchmark and the logs
    phases: dict[str, float] = field(default_factory=dict)


#: the parts of a round :attr:`RoundReport.phases` times: Slurm's observation; the jobs'
#: records kept in the store; their metrics ingested; GPU probes and orphaned extensions; open
#: resizes advanced; the snapshot built and its claims checked; the policy's plan; reconcile;
#: each change's first step taken; and the store's commits (``journal``: the round's record,
#: the bookkeeping, the resize journal), which no other phase counts
PHASES = ("observe", "record", "ingest", "probes", "resume", "snapshot", "policy", "reconcile",
          "actuation", "journal")


@contextlib.contextmanager
def _timed(rep: RoundReport, phase: str, store: Store) -> Iterator[None]:
    """Add the block's wall time (seconds) to ``rep.phases[phase]``, less ``store``'s commits
    inside it (they are the round's ``journal``)."""
    t, commits = time.perf_counter(), store.commit_seconds
    try:
        yield
    finally:
        spent = time.perf_counter() - t - (store.commit_seconds - commits)
        rep.phases[phase] = rep.phases.get(phase, 0.0) + spent


def _stepping(managed) -> tuple[list[tuple[str, Path, str]], set[str]]:
    """The managed jobs whose metrics a round reads, ``(job id, job directory, application)``:
    those running, and those that ended (their last steps); and the ids of those that ended."""
    stepping = [(job_id, jd.path, application_of(spec)) for job_id, (jd, spec, info) in managed.items()
                if info.state in (SlurmState.RUNNING, SlurmState.COMPLETING) or not info.active]
    return stepping, {job_id for job_id, _, _ in stepping if not managed[job_id][2].active}


def _log_change(round_id: int, c: Change, dry_run: bool) -> None:
    """Log change ``c`` of round ``round_id``: what the daemon will (would, in a dry run) do
    to which job, nodes and batch before and after, GPUs, layout and mechanism for a
    GPU-granular change, and why."""
    verb = "would" if dry_run else "will"
    gpus = (f" ({c.from_gpus} -> {c.to_gpus} GPU(s)"
            + (f" on {','.join(f'{n}:{g}' for n, g in c.layout)}" if c.layout else "")
            + f", by {c.mechanism})") if c.mechanism is not None else ""
    log.info("round %d: job %s %s %s: %d -> %d node(s)%s, batch %d -> %d: %s",
             round_id, c.job_id, verb, "start" if c.kind == "pending" else c.kind,
             c.from_nodes, c.to_nodes, gpus, c.from_batch_size, c.to_batch_size, c.reason)


def _with_planned_nodes(backend: Backend, obs, round_id: int):
    """``obs`` with backfill's planned nodes (Slurm 22.05: one more ``squeue``), or as it is
    when Slurm does not give them: the round goes on, and waiting jobs (other users' and
    hpcsched's own) then claim no GPUs for their plans (:mod:`hpcsched.policies.neighbours`),
    as before plans were read."""
    try:
        return backend.with_planned_nodes(obs)
    except slurm.SlurmError as exc:
        log.warning("round %d: pending jobs' planned starts not read (%s); their nodes are not "
                    "kept this round", round_id, exc)
        return obs


def _job_row(jd: JobDir, spec: JobSpec, info: slurm.JobInfo, now: float) -> dict:
    """The job's row for the store (:meth:`Store.upsert_jobs`): spec, limits, Slurm state."""
    # the store's job columns are JobLimits' fields, by name
    fields = dict(job_id=info.job_id, job_uid=jd.uid, user=info.user, script=spec.script,
                  **dataclasses.asdict(spec.limits),
                  spec_json=json.dumps(spec.to_json()), state=info.state,
                  submit_time=spec.created_at or None, last_seen=now,
                  app_class=application_of(spec))
    if not info.active:
        fields["finished_at"] = now
    return fields


class Daemon(BetweenRounds):
    """The round loop (see module docstring). Collaborators can be injected for tests."""

    def __init__(self, settings: Settings, *, backend: Backend | None = None,
                 store: Store | None = None, metrics: DaemonMetrics | None = None,
                 steps: Steps | None = None):
        self.settings = settings
        self.metrics = metrics   # Prometheus recorder (hpcsched.daemon.metrics); None: off
        d = settings.daemon
        self.backend = backend or make_backend("auto", timeout=d.slurm_timeout,
                                               partitions=d.partitions)
        self.store = store or Store(d.database_url)
        self.policy = make_policy(settings.policy.name, settings.policy.params)
        self.partition_policies = {p: make_policy(n, params) for p, (n, params)
                                   in settings.policy.for_partitions().items()}
        self.actuator = Actuator(CLISlurmControl(timeout=d.slurm_timeout),
                                 Timeouts(ack=d.ack_timeout, start=max(300.0, d.ack_timeout),
                                          hold=d.preemption_deadline))
        # resize steps on threads of their own, carried over rounds; a reloaded daemon keeps them
        self.steps = steps or Steps()
        self._stepped: set[int] = set()   # journal ids this process has advanced
        self._acks: dict[str, tuple[Path, int | None]] = {}   # job -> its ack.json, mtime at its last step
        self._recorded: dict[str, tuple[str, str, str]] = {}   # job -> (uid, user, state) last written
        # each job's metrics read in proportion to the time since its last pass
        self.budgets = Budgets(d.round_interval)
        self.control_dir = settings.control_dir_path()
        # a plan's 0 GPUs for a running job is applied (checkpoint, requeue, hold with a deadline)
        self.costs = Costs(restart_cost=d.restart_cost, shrink_cost=d.shrink_cost,
                           min_gain=d.min_gain, horizon=d.horizon, preemption=True,
                           hold=max(0, d.hold_rounds) * d.round_interval, grow=d.grow,
                           extension_startup=d.extension_startup,
                           extension_stall=d.extension_stall, by_mechanism=True,
                           keep_free=d.keep_free_gpus)
        self.managed = views.ManagedJobs(self.control_dir, d.partitions, views.Exclusions(
            frozenset(d.exclude_users), frozenset(d.exclude_accounts), frozenset(d.exclude_qos)))
        self.reaper = Reaper(self.control_dir, d.partitions, dry_run=d.dry_run, background=True)
        self.retention = Retention(settings.retention, self.store, self.control_dir)
        # the WAL copied into the database file after each round, not in one of its commits
        self.checkpoint = BackgroundCheckpoint(self.store)
        # the GPU probe prolog's measurements (slurm-plugins/prolog-gpu-probe): ingested each round
        self.probes = ProbeWatch(settings.probe, self.store, dry_run=d.dry_run,
                                 timeout=d.slurm_timeout)
        self._costs_said = ""      # the last resize-cost line logged (logged when it changes)
        self.claims: ClaimBook = {}   # what each job claimed and did (hpcsched.views.claims)
        # the last round's managed jobs (job id -> Slurm state) that event checks compare with;
        # None until a round has observed Slurm
        self._round_states: dict[str, str] | None = None
        # other users' pending GPU jobs at the last round (job ids): a new one is an event
        self._round_foreign: frozenset[str] = frozenset()

    # ----------------------------------------------------------------- jobs
    def _record_jobs(self, managed, now: float) -> None:
        """Every managed job's row written, all in one write (:meth:`Store.upsert_jobs`); one
        this process last wrote with the same job directory, user and state only has its
        ``last_seen`` renewed, in one statement (:meth:`Store.touch_jobs`)."""
        rows, unchanged = {}, []
        for job_id, (jd, spec, info) in managed.items():
            seen = (jd.uid, info.user, str(info.state))
            if self._recorded.get(job_id) == seen:
                unchanged.append(job_id)
            else:
                rows[job_id] = (_job_row(jd, spec, info, now), seen)
        self.store.upsert_jobs(row for row, _ in rows.values())
        self._recorded.update((job_id, seen) for job_id, (_, seen) in rows.items())
        self.store.touch_jobs(unchanged, now)

    # ---------------------------------------------------------------- round
    def round(self) -> RoundReport:
        """One round. Never raises for Slurm or job trouble: it is recorded and logged."""
        d = self.settings.daemon
        started = time.time()
        calls0, commits0 = slurm.calls(), self.store.commit_seconds
        rid = self.store.begin_round(self.policy.name, started, d.dry_run)
        rep = RoundReport(rid, started)
        try:
            self._round(rep)
        except slurm.SlurmError as exc:
            rep.error = f"Slurm: {exc}"
            log.warning("round %d: %s; no decision on stale state", rid, rep.error)
        if rep.error is None:
            self._round_states = dict(rep.slurm_states)
            if rep.snapshot is not None:
                self._round_foreign = frozenset(f.job_id for f in rep.snapshot.foreign_pending)
        rep.duration = time.time() - started
        rep.phases["journal"] = self.store.commit_seconds - commits0
        rep.slurm_calls = slurm.calls() - calls0  # observe, actuator, everything
        self.store.end_round(rid, duration=rep.duration, jobs=rep.jobs, actions=len(rep.changes),
                             slurm_calls=rep.slurm_calls, policy_seconds=rep.policy_seconds,
                             objective=rep.objective, error=rep.error)
        self.checkpoint.start()
        log.info("round %d: %d job(s), %d change(s), %d Slurm call(s), %.2f s (policy %.3f s)%s",
                 rid, rep.jobs, len(rep.changes), rep.slurm_calls, rep.duration,
                 rep.policy_seconds, f", error: {rep.error}" if rep.error else "")
        if self.metrics is not None:
            if rep.error is None:
                rep.gpus = gpu_rows(self.store, self.settings.probe)
            self.metrics.record_round(rep, dry_run=d.dry_run)
        return rep

    def _round(self, rep: RoundReport) -> None:
        """One round into ``rep``: observe Slurm and keep the store up to date
        (:meth:`_keep_up`), take every open action a step (:meth:`_resume`), build the snapshot
        and check the jobs' claims, decide (:meth:`_decide`), log the changes and, unless
        ``daemon.dry_run``, journal them all and take each one's first step (:meth:`_plan`,
        :meth:`_drive_all`)."""
        with _timed(rep, "observe", self.store):
            obs = self.backend.observe()
            if views.plans_unread(obs, self.settings.daemon.partitions):
                obs = _with_planned_nodes(self.backend, obs, rep.round_id)
            managed = self.managed.find(obs)     # its pending jobs' planned nodes read too
        rep.slurm_states = {job_id: info.state for job_id, (_, _, info) in managed.items()}
        self._keep_up(obs, managed, rep)
        with _timed(rep, "resume", self.store):
            busy = self._resume(managed, rep)
            # only an open requeue of the daemon's sets the job's start time itself: a job that
            # requeued itself during any other resize (a reform, say) is released here
            requeuing = {j for j in busy if rep.kinds.get(j) in REQUEUES}
            release_requeued(managed, requeuing, self.actuator.slurm, obs.time,
                             self.settings.daemon.dry_run)
        with _timed(rep, "snapshot", self.store):
            snapshot = views.daemon_snapshot(obs, managed, Prefetched(self.store, managed), busy,
                                             self.settings.daemon.partitions,
                                             self.settings.daemon.throughput_model,
                                             self.settings.daemon.plan_granularity,
                                             read_site_limits(self.settings.daemon.site_limits))
            snapshot, self.claims, found = check_claims(snapshot, self.claims)   # as the simulator
        for n in found:
            log.warning("round %d: %s", rep.round_id, n)
        rep.jobs, rep.snapshot = len(snapshot.jobs), snapshot
        decision = self._decide(snapshot, rep)
        rep.objective = decision.plan.objective if decision.plan is not None else None
        rep.notes = list(decision.notes)
        for n in rep.notes:
            log.info("round %d: %s", rep.round_id, n)
        for c in decision.changes:
            _log_change(rep.round_id, c, self.settings.daemon.dry_run)
        rep.changes = list(decision.changes)
        if self.settings.daemon.dry_run or not decision.changes:
            return
        with _timed(rep, "actuation", self.store):
            with self.store.batch():   # every change journaled `requested`, one commit, first
                drives = [self._plan(c, *managed[c.job_id], rep) for c in decision.changes]
            self._drive_all(drives, rep)

    def _keep_up(self, obs, managed, rep: RoundReport) -> None:
        """The round's bookkeeping on observation ``obs``: each managed job recorded and, while
        it runs or once it ended, its new step records ingested; the GPU probes read;
        orphaned extension jobs reaped (their ``scancel`` in a thread of its own, so a slow
        controller holds up no round; the ids it cancelled into the next ``rep.reaped``); and,
        about once an hour unless ``daemon.dry_run``, old job directories swept."""
        # what this process remembers of jobs: those Slurm still lists
        self._recorded = {j: v for j, v in self._recorded.items() if j in managed}
        self._acks = {j: v for j, v in self._acks.items() if j in managed}
        self.budgets.keep(managed)
        # one commit for every job's record and metrics, not synced: a host crash may lose the
        # last rounds' of them, which the next rounds write again from Slurm and from the
        # metrics files (their offsets are lost with them)
        with self.store.batch(durable=False):
            found = Pending()
            with _timed(rep, "record", self.store):
                self._record_jobs(managed, obs.time)
            with _timed(rep, "ingest", self.store):
                stepping, ended = _stepping(managed)
                ingest_jobs(self.store, stepping, found,
                            self.budgets.take((j for j, _, _ in stepping), ended))
                found.flush(self.store)
        with _timed(rep, "probes", self.store):
            self.probes.round()
            rep.reaped = self.reaper.reap(obs, self.actuator.slurm)   # orphaned extension jobs
        if not self.settings.daemon.dry_run and self.retention.due():   # about once an hour
            self.retention.sweep({j for j, i in obs.jobs.items() if i.active}, obs.time)

    def _decide(self, snapshot: ClusterSnapshot, rep: RoundReport) -> RoundDecision:
        """The round's decision on ``snapshot``, with the restart and shrink costs measured
        from the journal (logged when what they say changes): by the partitions' own
        policies where ``[policy.partitions.*]`` gives some (one policy for all when they
        overlap), else by ``[policy]``; its seconds go into ``rep.policy_seconds``."""
        t = time.perf_counter()
        costs, said = measured_costs(self.store.actions(limit=200), self.costs)
        if said != self._costs_said:
            log.info("round %d: %s", rep.round_id, said)
            self._costs_said = said
        seed, decision = self.settings.policy.seed + rep.round_id, None
        try:
            if self.partition_policies:
                decision = decide_by_partition(snapshot, self.policy, self.partition_policies,
                                               costs, seed)
        except PartitionOverlap as exc:   # hpcsched check says so too: one policy plans all
            log.error("round %d: %s; [policy] plans every partition", rep.round_id, exc)
        decision = decision or decide_round(snapshot, self.policy, costs, seed)
        # the performance model's caches serve the simulator's many decisions on one fit; the
        # daemon refits every round, so a round's entries are seldom asked for again, and kept
        # they grew its memory with the jobs and configurations it had seen (docs/daemon.md,
        # "At scale"); a decision from cold costs about 0.2 s at 4,096 GPUs / 1,000 jobs
        clear_caches()
        rep.policy_seconds = time.perf_counter() - t
        rep.phases["reconcile"] = decision.reconcile_seconds
        rep.phases["policy"] = rep.policy_seconds - decision.reconcile_seconds
        return decision

    def _plan(self, c: Change, jd: JobDir, spec: JobSpec, info: slurm.JobInfo,
              rep: RoundReport) -> Drive:
        """Journal ``c`` as ``requested`` (committed when the caller's batch ends, before any
        step: :mod:`hpcsched.daemon.driving`); returns its first step. A preemption's action
        asks for the job's size now, which it resumes at (:class:`Action`)."""
        cur = current_of(jd, spec, info)
        kind = ChangeKind(c.kind)
        nodes = c.from_nodes if kind == ChangeKind.PREEMPT else c.to_nodes
        placement = tuple(c.placement)
        if c.mechanism is not None:   # GPU-granular: the mechanism reconcile priced it by
            kind, nodes, placement = realised_action(c, spec.limits.workers_per_node)
        elif (layout := self._by_extension(c, jd, spec, info)) is not None:
            kind, placement = ChangeKind.REFORM, layout_pairs(layout)
        elif kind == ChangeKind.BATCH and info.state == SlurmState.RUNNING:
            # the world size it runs: a re-form onto its layout on extensions, the primary's
            # GPUs per node when it was started smaller than submitted (batch_layout)
            kind, placement = batch_layout(info, read_or_none(ctl.read_ack, jd.ack_path, jd.uid),
                                           spec.limits.workers_per_node)
            nodes = len(placement) or nodes
        rid = rep.round_id
        rep.kinds[c.job_id] = str(kind)   # the journal's kind (a grow by extension: reform)
        action = Action(c.job_id, kind, cur.generation + 1, nodes,
                        c.to_batch_size, info.restarts, c.reason, f"hpcsched daemon (round {rid})",
                        placement)
        created = time.time()
        aid = self.store.plan_action(
            round_id=rid, job_id=c.job_id, kind=action.kind, generation=action.generation,
            from_nodes=c.from_nodes, to_nodes=c.to_nodes, from_batch_size=c.from_batch_size,
            to_batch_size=c.to_batch_size, reason=c.reason, restarts_at_plan=info.restarts,
            placement=action.placement, created_at=created,
            mechanism=str(c.mechanism) if c.mechanism is not None else None)
        self._stepped.add(aid)
        return Drive(aid, action, History.begin(created), jd, spec, info)

    def _by_extension(self, c: Change, jd: JobDir, spec: JobSpec, info: slurm.JobInfo
                      ) -> dict[str, int] | None:
        """The layout to reach by extension allocations for ``c`` (None: today's path): a
        grow of a running job when ``daemon.grow`` is ``extension``; a shrink of a job that runs
        on extensions, always (:func:`~hpcsched.daemon.layouts.reform_layout`)."""
        if info.state != SlurmState.RUNNING or c.kind not in (ChangeKind.GROW, ChangeKind.SHRINK):
            return None
        if c.kind == ChangeKind.GROW and self.costs.grow != GrowMode.EXTENSION:
            return None
        ack = read_or_none(ctl.read_ack, jd.ack_path, jd.uid)
        layout, primary = layout_in_force(info, ack, info.gpus_per_node or spec.limits.workers_per_node)
        return reform_layout(ChangeKind(c.kind), c.to_nodes, tuple(c.placement), layout, primary,
                             spec.limits.workers_per_node)

    def _drive_all(self, drives: list[Drive], rep: RoundReport) -> None:
        """One step of each of ``drives`` (:class:`~hpcsched.daemon.driving.Steps`: side by side,
        journaled in one commit, waited for up to what is left of ``daemon.step_wait``); each
        job's outcome into ``rep.outcomes``."""
        for d in drives:   # answered as of this step
            self._acks[d.action.job_id] = (d.jd.ack_path, mtime_ns(d.jd.ack_path))
        t, wait_s = time.monotonic(), max(0.0, self.settings.daemon.step_wait - rep.step_waited)
        try:
            rep.outcomes.update(zip((d.action.job_id for d in drives),
                                    self.steps.take(self.actuator, self.store, drives, wait_s)))
        finally:
            rep.step_waited += time.monotonic() - t

    def _resume(self, managed, rep: RoundReport) -> set[str]:
        """Advance every open action one step (one whose last step is still under way is left
        to it); returns their jobs (busy for the policy)."""
        touched, drives = set(), []
        rep.outcomes.update(self.steps.land(self.store))   # the steps that ended since
        flying = self.steps.in_flight()
        open_actions = self.store.open_actions()
        self._stepped &= {a.id for a in open_actions}   # an ended action is never resumed
        for a in open_actions:
            touched.add(a.job_id)
            rep.kinds[a.job_id] = a.kind
            if a.id in flying:
                rep.outcomes[a.job_id] = IN_FLIGHT
                continue
            if a.job_id not in managed:
                why = "job no longer known to Slurm"
                self.store.set_action_phase(a.id, ResizePhase.FAILED, error=why)
                rep.outcomes[a.job_id] = f"failed: {why}"
                continue
            jd, spec, info = managed[a.job_id]
            if a.id not in self._stepped:
                log.info("job %s: resuming %s action %d (generation %d, %s)", a.job_id, a.kind,
                         a.id, a.generation, a.phase)
                self._stepped.add(a.id)
            action, history = journaled(a)
            drives.append(Drive(a.id, action, history, jd, spec, info))
        self._drive_all(drives, rep)
        return touched
