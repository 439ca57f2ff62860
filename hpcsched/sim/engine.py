"""The discrete-event simulator: a simulated Slurm cluster, driven by the daemon's own round.

Events, in time order: a job is submitted; a job finishes; a round of the policy (every
``interval`` seconds, 60 by default, as Pollux's simulator; for a policy that asks for them
(``round_on_events``: ``jct``), also at once when a job finishes and when a submitted job finds
no room, as the daemon does: :attr:`SimConfig.event_rounds`). Between events every running job
advances analytically (:mod:`hpcsched.sim.physics`); nothing is sampled per step.

What is the same as the daemon (that is the point: a simulated result says something about the
real cluster):

* the cluster is observed through the backend interface (:class:`SimBackend` implements
  :class:`hpcsched.slurm.observe.Backend`; its ``observe()`` returns the same
  :class:`~hpcsched.slurm.observe.Observation` of Slurm nodes and jobs);
* the policy is the very object the daemon runs (:func:`hpcsched.policies.make_policy`), on a
  :class:`~hpcsched.model.snapshot.ClusterSnapshot` built from the same kind of data the daemon has
  (each job's measured profile, gradient noise, remaining work, attained service), with seed
  ``seed + round``;
* the plan goes through the daemon's :func:`hpcsched.policies.reconcile.reconcile` (restart cost versus
  predicted gain, grows only where Slurm can place them now);
* changes are applied as the actuator applies them on Slurm: a batch-size change in place at no
  cost; a shrink in place, keeping the first nodes of the allocation (Slurm's rule), costing
  ``shrink_cost`` seconds (GPU-granular, by the mechanism reconcile chose,
  :mod:`hpcsched.policies.realise`: a release of extension GPUs at ``extension_stall``, whole
  primary nodes at ``shrink_cost``, a requeue onto the same GPUs on every node); a grow
  (``SimConfig.grow``) by extension (issue 10; the default) -- an extension Slurm job takes the
  new GPUs at once, the job trains on at its old size for
  ``extension_startup`` seconds while the new workers start, then every rank stalls
  ``extension_stall`` seconds while the group re-forms, then it runs at its new size -- or by
  requeue -- the job gives its GPUs back, waits as a pending job with its new size and node list,
  and pays the application's restart cost when it starts again; a pending job's size, batch size
  and node list are set before it starts. A move (same GPU count, other GPUs) is not modelled:
  reconcile makes no change for a running job whose plan keeps its count; by extension it would
  be a grow onto the new GPUs (start-up at the old placement, then the stall) followed by a
  shrink of the old ones.

The simulated Slurm (what Slurm does without hpcsched): pending jobs are considered in priority
order (submission order; a requeued job keeps its place) whenever something changes -- a job is
submitted or ends, or a round has applied its changes -- and each one that fits now starts (jobs
behind one that does not fit may start: with unlimited time limits Slurm's backfill can start
anything that fits), placed by :class:`~hpcsched.sim.cluster.SimCluster`'s rule. Other users'
plain jobs (:attr:`hpcsched.sim.WorkloadJob.rigid`) queue in the same order, are never held, and
reach the policy only as Slurm shows them: GPUs that a foreign job holds, or a foreign pending
job that hpcsched's grows yield to (:mod:`hpcsched.policies.neighbours`); a plain job that
arrives to no room is an event, as in the daemon. Every start pays the application's
restart cost (processes, framework import, data loading and checkpoint restore: Pollux's
simulator charges its 30 s at every allocation, the first included).

Units: seconds from the start of the trace, samples, GPUs.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace

from hpcsched.model.snapshot import ClusterSnapshot, JobView
from hpcsched.perf.priors import application_key
from hpcsched.perf.shared import StepLedger
from hpcsched.policies import make_policy
from hpcsched.policies.base import rounds_on_events
from hpcsched.policies.round import decide_round
from hpcsched.protocol.kinds import Granularity, GrowMode, SlurmState
from hpcsched.sim import SimResult, WorkloadJob
from hpcsched.sim.apply import ChangeApplier
from hpcsched.sim.cluster import (
    CLASSES,
    FOREIGN_USER,
    PARTITION,
    SimBackend,
    SimCluster,
    job_info,
)
from hpcsched.sim.state import SimConfig, SimJob, SimulationError, job_shape, make_job
from hpcsched.views.build import (
    JobFacts,
    JobReport,
    application_tables,
    cluster_snapshot,
    job_view,
)
from hpcsched.views.claims import ClaimBook, check_claims


class Simulator(ChangeApplier):
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
        self.jobs = [make_job(str(i + 1), wj, config) for i, wj in
                     enumerate(sorted(jobs, key=lambda j: (j.submit_time, j.name)))]
        self.backend = SimBackend(self)
        self.rounds = 0
        #: rounds also at job ends and at submissions that find no room (module docstring)
        self.event_rounds = rounds_on_events(self.policy, config.event_rounds)
        #: every job's measured steps per application (the daemon's store); ``None``: each
        #: job's model is fitted to its own measurements alone
        self.ledger = StepLedger() if config.throughput_model == "shared" else None
        self.utilization: list[tuple[float, int, int]] = []
        self.notes: list[str] = []
        #: what each job was seen to claim and do (:mod:`hpcsched.views.claims`)
        self.claims: ClaimBook = {}
        self.costs = replace(config.costs, restart_cost=config.restart_cost_for("*"),
                             shrink_cost=config.shrink_cost,
                             hold=config.hold_rounds * config.interval, grow=config.grow,
                             extension_startup=config.extension_startup,
                             extension_stall=config.extension_stall,
                             by_mechanism=config.granularity == Granularity.GPU and config.grow == GrowMode.EXTENSION)

    # ----------------------------------------------------------------------- physics
    def _slowdown(self, j: SimJob) -> float:
        """The slowdown of running job ``j``'s slowest GPU, looked up only while its step time
        is not known yet (``j.st``, which includes it, is reset at every change)."""
        return self.cluster.slowdown(j.wj.app_class, j.gpus) if j.st is None else 1.0

    def _advance(self, j: SimJob, t: float) -> None:
        """Run ``j`` from ``j.updated`` to ``t`` (:meth:`SimJob.advance`), if it runs."""
        if j.state == SlurmState.RUNNING and t > j.updated:
            # a plain job's steps are its own: the daemon's store never sees them
            j.advance(t, self._slowdown(j), self.cfg.locality_penalty,
                      None if j.wj.rigid else self.ledger)

    def _eta(self, j: SimJob) -> float:
        """When running job ``j`` finishes if nothing changes; cached until its configuration
        changes (``j.eta = None``)."""
        if j.eta is None:
            j.eta = j.end_time(max(j.updated, j.blocked_until), self._slowdown(j),
                               self.cfg.locality_penalty)
        return j.eta

    # ----------------------------------------------------------------------- Slurm
    def job_infos(self) -> dict[str, object]:
        """The active jobs as ``squeue`` reports them."""
        n, names = len(self.jobs), self.cluster.node_names
        return {j.job_id: job_info(j.job_id, j.wj.name, j.state, j.held_nodes(names),
                                   len(j.held_nodes(names)) if j.ext else j.nodes,
                                   j.per_node, j.restarts, n + 1 - int(j.job_id),
                                   user=FOREIGN_USER if j.wj.rigid else "sim")
                for j in self.jobs if j.state in (SlurmState.PENDING, SlurmState.RUNNING)}

    def _try_start(self, j: SimJob) -> bool:
        if j.granular and self.costs.by_mechanism:
            # a primary Slurm job: the same GPUs on every node (the daemon's rules)
            nodes, per = j.shape or job_shape(j.size, self.cfg.gpus_per_node)
            req = j.req_nodes if len(j.req_nodes) == nodes else ()
            got = self.cluster.allocate(nodes, per, req)
        elif j.granular:
            got = self.cluster.allocate_gpus(j.size, j.req_nodes)
        else:
            got = self.cluster.allocate(j.nodes, j.per_node, j.req_nodes,
                                        j.wj.app_class if self.cfg.fastest_gpus else None)
            if got is None and self.cfg.soft_consolidate and j.fixed is not None:
                got = self.cluster.allocate_gpus(j.size)   # PAL's soft consolidation
                j.granular = got is not None   # its layout is its own now (the view shows it)
        if got is None:
            return False
        j.node_names, j.gpus = got
        j.primary, j.shape = j.gpus, None
        j.nodes, j.size = len(j.node_names), len(j.gpus)
        j.resized_at = self.now
        j.req_nodes = ()
        j.state = SlurmState.RUNNING
        j.updated = self.now
        # a plain job's duration is its run alone: no start cost of hpcsched's model on top
        j.blocked_until = self.now + (0.0 if j.wj.rigid else
                                      self.cfg.restart_cost_for(j.wj.application))
        if j.start_time is None:
            j.start_time = self.now
        j.max_gpus = max(j.max_gpus, j.n_gpus)
        j.eta = j.st = None
        return True

    def _schedule(self) -> None:
        """Slurm's scheduling pass: pending jobs in priority order, each started if it fits."""
        if not self.cluster.free.any():
            return
        for j in self.jobs:
            if j.state == SlurmState.PENDING and not j.held:
                self._try_start(j)
                if not self.cluster.free.any():
                    return

    # ----------------------------------------------------------------------- the round
    def _view(self, j: SimJob, info, tables: dict) -> JobView:
        """The job as the daemon's view builder sees it; ``tables``: the applications'
        :class:`~hpcsched.perf.shared.StepCorrections` (:func:`application_tables`)."""
        return job_view(JobFacts(
            info=info, limits=j.limits, nodes=info.node_count, batch_size=j.batch_size,
            generation=j.resizes, submit_time=j.wj.submit_time,
            application=j.application_name,
            profile=j.profile(),
            report=j.report() if self.cfg.early_reports or j.start_time is not None
            else JobReport(),
            busy=j.state == SlurmState.RUNNING and (j.blocked_until > self.now or j.ext is not None),
            held=j.held,
            requested_nodes=j.req_nodes, start_time=j.start_time,
            layout=j.view_layout(self.cfg.gpus_per_node), primary=j.view_primary(),
            resized_at=j.resized_at if j.state == SlurmState.RUNNING else None,
            last_resize=j.last_resize, step_corrections=tables.get(application_key(j.application_name)),
            submitted_gpus=j.wj.gpus,
            gpus_held=tuple((self.cluster.node_names[n], g) for n, g in j.gpus)))

    def snapshot(self) -> ClusterSnapshot:
        """What the daemon would see now (the observation plus the jobs' own reports)."""
        obs = self.backend.observe()
        jobs = [(self.jobs[int(jid) - 1], info) for jid, info in obs.jobs.items()
                if info.user != FOREIGN_USER]   # other users' plain jobs: only Slurm's view
        tables = {} if self.ledger is None else application_tables(
            (j.application_name for j, _ in jobs), self.ledger.corrections)
        views = tuple(self._view(j, info, tables) for j, info in jobs)
        snap = cluster_snapshot(obs, views, (PARTITION,), self.cluster.gpu_views)
        return replace(snap, granularity=self.cfg.granularity)

    def _round(self) -> None:
        for j in self.jobs:
            if j.state == SlurmState.RUNNING:
                self._advance(j, self.now)
        snap = self.snapshot()
        if self.cfg.check_claims:
            snap, self.claims, notes = check_claims(snap, self.claims)
            self.notes.extend(f"t={self.now:.0f} {n}" for n in notes)
        decision = decide_round(snap, self.policy, self.costs, seed=self.cfg.seed + self.rounds)
        for c in decision.changes:
            self._apply(c)
        self.rounds += 1
        self._schedule()

    # ----------------------------------------------------------------------- main loop
    def _finish(self, j: SimJob, t: float) -> None:
        self.now = t
        self._advance(j, t)
        j.finish_time = t
        j.state = "DONE"
        j.progress = j.total
        self._release(j)
        self._schedule()
        if self.event_rounds and any(x.state in (SlurmState.RUNNING, SlurmState.PENDING) for x in self.jobs):
            self._round()    # its GPUs go where the policy wants them, not a round later

    def _arrive(self, arrivals: list[tuple[float, int]]) -> None:
        came = []
        while arrivals and arrivals[0][0] <= self.now:
            _, i = heapq.heappop(arrivals)
            self.jobs[i - 1].state = SlurmState.PENDING
            self.jobs[i - 1].held = self.cfg.hold_new_jobs and not self.jobs[i - 1].wj.rigid
            came.append(self.jobs[i - 1])
        self._schedule()
        if self.event_rounds and any(j.state == SlurmState.PENDING for j in came):
            self._round()    # no room: the policy makes some now, not up to a round later

    def run(self, progress: Callable[[float, int, int], None] | None = None) -> SimResult:
        """Run to the end of the workload (or ``max_time``) and report.

        ``progress(now, finished, total)`` is called after every round (for a progress bar).
        """
        t0 = time.perf_counter()
        with fewer_collections():
            self._events(progress)
        return self._result(time.perf_counter() - t0)

    def _events(self, progress: Callable[[float, int, int], None] | None) -> None:
        """The event loop of :meth:`run`: the next event (an arrival, a round, an extension's
        workers joining, or the first finish before them) is handled, until every job is done
        or the clock passes ``max_time``."""
        arrivals = [(j.wj.submit_time, int(j.job_id)) for j in self.jobs]
        heapq.heapify(arrivals)
        done, total = 0, len(self.jobs)
        next_round = 0.0
        while done < total and self.now <= self.cfg.max_time:
            t_arr = arrivals[0][0] if arrivals else math.inf
            running = [j for j in self.jobs if j.state == SlurmState.RUNNING]
            if not running and not any(j.state == SlurmState.PENDING for j in self.jobs):
                # idle cluster: jump to the round at or after the next arrival
                next_round = max(next_round, math.ceil(t_arr / self.cfg.interval)
                                 * self.cfg.interval)
            horizon = min(t_arr, next_round)
            t_fin, jid, t_join, xid = self._next_ends(running)
            if t_fin <= min(horizon, t_join):
                self._finish(self.jobs[jid - 1], t_fin)
                done += 1
            elif t_join <= horizon:
                self.now = t_join
                self._join(self.jobs[xid - 1])
            elif t_arr <= next_round:
                self.now = t_arr
                self._arrive(arrivals)
            else:
                self.now = next_round
                self._timed_round(progress, done, total)
                next_round += self.cfg.interval

    def _next_ends(self, running: list[SimJob]) -> tuple[float, int, float, int]:
        """``(t_fin, jid, t_join, xid)``: the earliest finish among the ``running`` jobs and its
        job id, and the earliest time an extension's workers join and its job id (``inf, 0``
        for none); ties go to the lowest job id."""
        t_fin, jid = min(((self._eta(j), int(j.job_id)) for j in running),
                         default=(math.inf, 0))
        t_join, xid = min(((j.ext.at, int(j.job_id)) for j in running if j.ext),
                          default=(math.inf, 0))
        return t_fin, jid, t_join, xid

    def _timed_round(self, progress: Callable[[float, int, int], None] | None, done: int,
                     total: int) -> None:
        """The round of the interval at ``self.now``: the policy's round, then the busy and
        total GPU counts recorded for utilisation, then ``progress(now, done, total)``."""
        self._round()
        self.utilization.append((self.now, int((~self.cluster.free).sum()),
                                 self.cluster.free.size))
        if progress is not None:
            progress(self.now, done, total)

    def _result(self, wall: float) -> SimResult:
        return SimResult(
            policy=self.policy_name, workload=self.workload_name,
            jobs=tuple(j.result() for j in self.jobs),
            utilization=tuple(self.utilization), total_gpus=int(self.cluster.free.size),
            rounds=self.rounds, wall_seconds=wall, params=self.cfg.recorded())


#: the cyclic garbage collector's first threshold during a simulation (CPython's default: 700)
GC_THRESHOLD = 10_000


@contextmanager
def fewer_collections(threshold: int = GC_THRESHOLD) -> Iterator[None]:
    """Run the cyclic garbage collector less often inside (its first generation's threshold
    raised to ``threshold`` allocations, the other thresholds kept; restored on leaving).

    A simulation allocates many short-lived objects and makes almost no reference cycles
    (reference counting frees them), so the collector's passes over the long-lived caches find
    next to nothing and cost time (measured: docs/design-notes.md, "sim/engine.py").
    """
    old = gc.get_threshold()
    gc.set_threshold(max(threshold, old[0]), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def simulate(jobs: Sequence[WorkloadJob], policy: str, **kw) -> SimResult:
    """Convenience: ``Simulator(jobs, policy, **kw).run()``."""
    return Simulator(jobs, policy, **kw).run()


__all__ = ["CLASSES", "SimBackend", "SimConfig", "SimulationError", "Simulator", "job_shape",
           "simulate"]
