"""A good neighbour: hpcsched's jobs never hold GPUs that other users' pending jobs need.

Most jobs on a shared cluster are other users' plain ``sbatch`` jobs, ordered by Slurm's
priority and fairshare. Before a policy plans, :func:`yield_to_foreign` takes the snapshot's
pending foreign jobs (:attr:`~hpcsched.model.snapshot.ClusterSnapshot.foreign_pending`, the
jobs hpcsched does not manage that Slurm could start: not held, not waiting for a dependency or
a begin time), highest Slurm priority first, and gives each the GPUs Slurm would start it on:

1. **free GPUs** first, on the nodes of its partition with the fewest free GPUs that hold its
   GPUs per node (Slurm's best fit): these are *claimed*, counted as held by other users' jobs in the
   snapshot the policy plans on, so no plan grows into them (neither by extension nor by a
   requeue), however long the foreign job has waited;
2. where free GPUs are not enough, **extension GPUs** of running hpcsched jobs (GPUs they hold
   beyond their primary Slurm job, :mod:`hpcsched.policies.realise`; all of a job's on a node at
   a time, so perhaps more than the foreign job needs) that the job holds **beyond what it was
   submitted with** (:attr:`~hpcsched.model.snapshot.JobView.submitted_gpus`): each such job
   is made to **release** them this round (a ``release``: the ranks on them leave at the next
   step boundary, no checkpoint, no restart; 0.15 s on the dev cluster), before anything else,
   without the gain test or the no-thrash hold. The job is busy for the policy this round.

Slurm starts pending jobs in its own order, hpcsched's included: one of hpcsched's pending jobs
that Slurm ranks ahead of the foreign job (:attr:`~hpcsched.model.snapshot.JobView.
slurm_priority`; not held) takes the free and released GPUs that fit it first, and the foreign
job is given what is left, with more released where needed; if that is not enough it waits and
nothing is released for it (:class:`_SlurmQueue`).

What a job was submitted with is its own: Slurm alone would hold that much for it from its
start to its end, whatever else pends, so no foreign job waits longer for it than without
hpcsched (a job the daemon started smaller, its primary at its fewest GPUs, keeps extension GPUs
up to its submitted size). What hpcsched grows it by beyond that is lent, and goes back as soon
as a foreign job can start on it.

A foreign job that does not fit even then (it needs GPUs of primary Slurm jobs, GPUs of
hpcsched jobs within their submitted size, or GPUs of other users' running jobs) claims nothing
yet: grows may use the free GPUs meanwhile, by extension, and give them back when the job fits.
Except where Slurm's backfill has planned its start (:attr:`~hpcsched.model.snapshot.ForeignJob.
start_time`) onto nodes (``scheduled_nodes``, ``squeue -o %Y``): the free GPUs there, up to its
GPUs per node, are claimed too. Backfill starts a lower-priority job on them only if it ends
before that planned start (sbatch(1) ``--time``; slurm.conf(5) ``SchedulerType=sched/backfill``),
and an extension job runs for its primary's remaining time limit, with the lowest priority: a
grow there would pend until the extension's timeout and fail, never paying for itself
(``docs/daemon.md``, "Sharing the cluster").
Why (measured, ``docs/daemon.md``, "Sharing the cluster"): claiming the free part of such a
job, and yielding GPUs within jobs' submitted sizes, cost the elastic jobs a quarter of their
gain for waits shorter than other users' jobs get without hpcsched.
GPUs of a primary job are never taken back for a foreign job: that would be preemption, which
Slurm's own QOS and partition rules decide.

**hpcsched's own pending jobs** are Slurm's pending jobs too: backfill plans their starts
(:attr:`~hpcsched.model.snapshot.JobView.scheduled_nodes`) and keeps those nodes' free GPUs for
them just as for other users' jobs, and an extension job, which comes after every other job
(``sbatch --nice``), pends there for ``Priority`` until the daemon gives the grow up: 40% of
the changes at 1,024 GPUs were such grows (``docs/daemon.md``, "At scale"). So after other
users' jobs are served, each own pending job this pass does not start keeps the free GPUs on
its planned nodes, up to its GPUs per node, in Slurm's order. They are counted as other jobs'
in the snapshot the policy plans on, so the policy does not plan the job's own start onto
them either: it may start the job elsewhere (a ``pending`` change), or leave its request as it
is, and Slurm starts it there as planned. The simulator's Slurm plans no starts (a pending job
starts whenever it fits), so this changes nothing there.

**GPUs kept free** (``keep_free``, ``daemon.keep_free_gpus``; off by default): lent GPUs go back
at the lender's next step boundary, so a foreign job that needs them waits a step of the lender
and the lender's exit on top of Slurm's own reaction (up to 5.6 s on the dev cluster,
``docs/replay.md``). A site that wants the next foreign jobs to start as they would without
hpcsched keeps some GPUs out of every grow: after the pending jobs are served, a job of
``keep_free`` GPUs on as few nodes as hold them is served at the lowest priority, claiming free
GPUs and releasing lent ones where free ones are not enough (so the GPUs a foreign job took are
kept free again by the next round), or, where even those are not enough, claiming the free GPUs
of the nodes with the most free, up to its shape.

Pure: ``(ClusterSnapshot) -> (ClusterSnapshot, changes, notes)``. Units: GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hpcsched.model.snapshot import ClusterSnapshot, ForeignJob, JobView
from hpcsched.policies.changes import Change
from hpcsched.policies.realise import Mechanism, batch_on
from hpcsched.protocol.kinds import ChangeKind, SlurmState


def yield_to_foreign(snapshot: ClusterSnapshot, keep_free: int = 0
                     ) -> tuple[ClusterSnapshot, list[Change], list[str]]:
    """The snapshot to plan on, the releases to make first, and notes (module docstring).

    Args:
        snapshot: the round's snapshot (its ``foreign_pending``).
        keep_free: GPUs no grow takes, kept free for other users' jobs that have not been
            submitted yet (``daemon.keep_free_gpus``; 0: none): served after the pending ones,
            as a job of the lowest priority (:meth:`_SlurmQueue.keep_free`).

    Returns:
        ``(snapshot, releases, notes)``: ``snapshot`` with the claimed free GPUs counted as
        other users' (``NodeView.gpus_allocated`` and ``other_gpus_allocated``) and the jobs that
        release marked busy; ``releases``, one ``shrink`` by ``release`` per such job, its
        layout without the claimed GPUs; ``notes``: one on other users' pending jobs (where
        there are any, or ``keep_free``), and one on the GPUs kept for hpcsched's own waiting
        jobs (where any are).
    """
    own_plans = any(j.scheduled_nodes for j in snapshot.jobs if j.state == SlurmState.PENDING)
    if not snapshot.foreign_pending and keep_free <= 0 and not own_plans:
        return snapshot, [], []
    q = _SlurmQueue(snapshot)
    for f in sorted(snapshot.foreign_pending, key=_queue_key):
        q.serve(f)
    yielded = set(q.taken)
    q.keep_own_planned()
    if keep_free > 0:
        q.keep_free(keep_free)
    releases = []
    for job_id, per in q.taken.items():
        job = snapshot.job(job_id)
        assert job is not None, job_id      # taken from snapshot.jobs (_extension_gpus)
        releases.append(_release(job, per, KEEP_FREE_REASON if job_id not in yielded else None))
    notes = [q.note()] if snapshot.foreign_pending or keep_free > 0 else []
    if q.own_planned:
        notes.append(_own_note(q.own_planned))
    return _planned_on(snapshot, q.claimed, set(q.taken)), releases, notes


#: the reason of a release for other users' pending jobs
YIELD_REASON = "yields GPU(s) to other users' pending jobs"
#: the reason of a release made only to keep ``keep_free`` GPUs free
KEEP_FREE_REASON = "keeps GPU(s) free for other users' next jobs (daemon.keep_free_gpus)"


def _queue_key(job: ForeignJob) -> tuple[int, float, str]:
    """Slurm's order of pending jobs: higher priority first, then the earlier submitted."""
    return (-job.priority, job.submit_time, job.job_id)


class _SlurmQueue:
    """Slurm's next scheduling pass over one round's snapshot, as far as other users' pending
    jobs go: each, highest priority first, starts on free GPUs and on extension GPUs released
    for it (:func:`yield_to_foreign`). hpcsched's own pending jobs that Slurm ranks ahead of it
    (:attr:`~hpcsched.model.snapshot.JobView.slurm_priority`) take what fits them first,
    released GPUs included, as Slurm would start them: what a foreign job is given must be
    enough after them, or it would wait another round (seen in a replay: a 4-GPU job whose
    released GPUs Slurm gave to hpcsched's own pending job ahead of it waited 21 s).

    Attributes (node -> GPUs unless said): ``free``, free GPUs not yet taken in the pass;
    ``opened``, released GPUs not yet taken; ``spare``, extension GPUs that may be released
    (:func:`_extension_gpus`); ``claimed``, free GPUs other users' jobs take, or Slurm keeps
    for hpcsched's own pending jobs (counted as other jobs' in the snapshot the policy plans
    on); ``taken``, job id -> node -> GPUs it releases; ``own_planned``, own pending job id ->
    GPUs kept for it (:meth:`keep_own_planned`).
    """

    def __init__(self, snapshot: ClusterSnapshot):
        self.nodes = snapshot.nodes
        self.free = dict(snapshot.free_gpus)
        self.opened: dict[str, int] = {}
        self.spare = _extension_gpus(snapshot)
        self.claimed: dict[str, int] = {}
        self.taken: dict[str, dict[str, int]] = {}
        self.own = _own_pending(snapshot)
        self.own_first: list[str] = []      # own jobs Slurm starts ahead of a served one
        self.served: list[str] = []
        self.own_planned: dict[str, int] = {}
        self.waiting = self.planned = self.kept_free = self.kept_lent = 0

    def serve(self, f: ForeignJob) -> None:
        """Give ``f`` the GPUs it starts on, releasing extension GPUs where free ones are not
        enough; or count it waiting (and keep the free GPUs Slurm plans it onto)."""
        nodes = self._serve(f)
        if nodes is None:
            self.waiting += 1
            usable = {n.name for n in self.nodes if n.name in self.free and f.may_use(n)}
            if f.start_time:       # nodes without a planned start are not a plan
                self.planned += _keep_planned(f, usable, self.free, self.claimed)
        else:
            self.served.append(f"{f.job_id} ({f.user}, priority {f.priority}) on {','.join(nodes)}")

    def keep_own_planned(self) -> None:
        """Keep for each of hpcsched's own pending jobs that this pass does not start, in
        Slurm's order, the free GPUs on the nodes Slurm's backfill plans it onto, up to its
        GPUs per node (module docstring): an extension job or a later start there would not
        run before it."""
        by_name = {n.name: n for n in self.nodes}
        for job, allowed in self.own:
            if job.job_id in self.own_first or not job.scheduled_nodes:
                continue
            # self.free holds the snapshot's usable nodes only, so each is in by_name
            usable = {n for n in job.scheduled_nodes if n in self.free
                      and job.may_use(by_name[n]) and (allowed is None or n in allowed)}
            if kept := _keep_planned(job, usable, self.free, self.claimed):
                self.own_planned[job.job_id] = kept

    def keep_free(self, gpus: int) -> None:
        """Keep ``gpus`` GPUs free for jobs not yet submitted, on as few nodes as hold them:
        served as a job of that shape behind every pending one (hpcsched's too), from free GPUs
        and, where they are not enough, from extension GPUs released for it (so that a job that
        took the kept GPUs gets them back by the next round); if even those are not enough, the
        free GPUs on the nodes with the most free are kept, up to that shape."""
        per_node = max((n.gpus for n in self.nodes if n.name in self.free), default=0)
        if per_node <= 0:
            return
        count = -(-gpus // per_node)
        f = ForeignJob("(kept free)", "", count, -(-gpus // count), priority=0,
                       submit_time=float("inf"))
        before, lent = sum(self.claimed.values()), _released(self.taken)
        if self._serve(f) is None:
            for n in sorted(self.free, key=lambda n: (-self.free[n], n))[:count]:
                _claim(n, f.gpus_per_node, self.free, self.claimed)
        self.kept_free = sum(self.claimed.values()) - before
        self.kept_lent = _released(self.taken) - lent

    def _serve(self, f: ForeignJob) -> list[str] | None:
        """The nodes ``f`` starts on, its free GPUs there claimed and the extension GPUs it
        needs taken; ``None`` (nothing claimed or taken) when even those are not enough."""
        usable = {n.name for n in self.nodes if n.name in self.free and f.may_use(n)}
        while self._start_own_ahead(f):          # they fit without a release: Slurm's first
            pass
        saved = self._state()
        while True:
            avail = self._avail(usable)
            nodes = _place(f, avail, self.spare)
            if nodes is None:
                self._restore(saved)
                return None
            for n in nodes:
                for job_id, g in _take(self.spare, n, f.gpus_per_node - avail[n]):
                    per = self.taken.setdefault(job_id, {})
                    per[n] = per.get(n, 0) + g
                    self.opened[n] = self.opened.get(n, 0) + g
            if not self._start_own_ahead(f):
                break
        for n, use in self._start(f, nodes).items():
            self.claimed[n] = self.claimed.get(n, 0) + use
        return nodes

    def _start_own_ahead(self, f: ForeignJob) -> bool:
        """Start (in this model of Slurm's pass) the first of hpcsched's pending jobs ahead of
        ``f`` in Slurm's queue that fits on the free and released GPUs; whether one did."""
        for job, allowed in self.own:
            if job.job_id in self.own_first or _queue_key(job) >= _queue_key(f):
                continue
            usable = {n.name for n in self.nodes if n.name in self.free and job.may_use(n)
                      and (allowed is None or n.name in allowed)}
            nodes = _place(job, self._avail(usable), {})
            if nodes is None:
                continue
            self._start(job, nodes)
            self.own_first.append(job.job_id)
            return True
        return False

    def _start(self, job: ForeignJob, nodes: list[str]) -> dict[str, int]:
        """``job`` takes its GPUs on ``nodes``: free ones first, then released ones; returns the
        free GPUs it took per node."""
        took = {}
        for n in nodes:
            took[n] = use = min(self.free[n], job.gpus_per_node)
            self.free[n] -= use
            self.opened[n] = self.opened.get(n, 0) - (job.gpus_per_node - use)
        return took

    def _avail(self, usable: set[str]) -> dict[str, int]:
        return {n: self.free[n] + self.opened.get(n, 0) for n in usable}

    def _state(self) -> tuple:
        return (dict(self.free), dict(self.opened), {n: list(v) for n, v in self.spare.items()},
                {j: dict(p) for j, p in self.taken.items()}, list(self.own_first))

    def _restore(self, saved: tuple) -> None:
        free, opened, spare, taken, own_first = saved
        self.free, self.opened, self.spare, self.taken, self.own_first = (
            dict(free), dict(opened), {n: list(v) for n, v in spare.items()},
            {j: dict(p) for j, p in taken.items()}, list(own_first))

    def note(self) -> str:
        return _note(self.claimed, self.taken, self.served, self.waiting, self.planned,
                     self.own_first, self.kept_free, self.kept_lent)


def _own_pending(snapshot: ClusterSnapshot) -> list[tuple[ForeignJob, frozenset[str] | None]]:
    """hpcsched's pending jobs Slurm may start, as Slurm's queue sees them (what they ask for,
    their priority, the nodes backfill plans them onto), each with the nodes it asks for by
    name (``None``: any), in Slurm's order; a held job, or one whose priority is unknown (0),
    is left out."""
    out = []
    for j in snapshot.jobs:
        if j.state != SlurmState.PENDING or j.held or j.slurm_priority <= 0 or j.gpus <= 0:
            continue
        nodes = max(1, j.nodes)
        ask = ForeignJob(j.job_id, j.user, nodes, -(-j.gpus // nodes), j.slurm_priority,
                         j.submit_time, partition=j.partition, scheduled_nodes=j.scheduled_nodes)
        out.append((ask, frozenset(j.node_names) if j.node_names else None))
    return sorted(out, key=lambda a: _queue_key(a[0]))


def _keep_planned(f: ForeignJob, usable: set[str], free: dict[str, int],
                  claimed: dict[str, int]) -> int:
    """Claim for waiting job ``f`` the free GPUs, up to its GPUs per node, on the ``usable``
    nodes Slurm's backfill plans it onto (``scheduled_nodes``: another user's job's count only
    with a planned start; hpcsched's own carry them only then), taken from ``free`` into
    ``claimed`` (node -> GPUs); returns how many (module docstring)."""
    return sum(_claim(n, f.gpus_per_node, free, claimed)
               for n in f.scheduled_nodes if n in usable)


def _claim(node: str, up_to: int, free: dict[str, int], claimed: dict[str, int]) -> int:
    """Move up to ``up_to`` of ``node``'s free GPUs from ``free`` into ``claimed`` (node ->
    GPUs); returns how many."""
    if use := min(free.get(node, 0), up_to):
        free[node] -= use
        claimed[node] = claimed.get(node, 0) + use
    return use


def _own_note(kept: dict[str, int]) -> str:
    """The round's note on the free GPUs kept for hpcsched's own pending jobs (``kept``: job
    id -> GPUs) on the nodes Slurm plans them onto."""
    ids = sorted(kept, key=lambda j: (-kept[j], j))
    return (f"hpcsched's pending jobs: {sum(kept.values())} free GPU(s) kept on the nodes Slurm "
            "plans them onto, where no grow's extension job would start: "
            + ", ".join(f"{j} ({kept[j]})" for j in ids[:5]) + (" ..." if len(ids) > 5 else ""))


def _released(taken: dict[str, dict[str, int]]) -> int:
    """The extension GPUs of ``taken`` (job id -> node -> GPUs) in all."""
    return sum(sum(per.values()) for per in taken.values())


def _note(claimed: dict[str, int], taken: dict[str, dict[str, int]], served: list[str],
          waiting: int, planned: int = 0, own_first: Sequence[str] = (), kept_free: int = 0,
          kept_lent: int = 0) -> str:
    """The round's note on other users' pending jobs: the free GPUs kept for them
    (``claimed``: node -> GPUs; ``planned`` of them on the nodes Slurm plans to start waiting
    jobs on, ``kept_free`` for jobs not yet submitted), the extension GPUs released (``taken``:
    job id -> node -> GPUs; ``kept_lent`` of them to keep GPUs free), the first five of those
    that can start now (``served``), hpcsched's pending jobs Slurm starts ahead of them
    (``own_first``), and how many wait for running jobs to end."""
    return (f"other users' pending jobs: {sum(claimed.values())} free GPU(s) kept for them"
            + (f" ({planned} on nodes Slurm plans them onto)" if planned else "")
            + (f" ({kept_free} for jobs not yet submitted: keep_free_gpus)" if kept_free else "")
            + (f", {_released(taken)} extension GPU(s) released"
               + (f" ({kept_lent} to keep GPUs free: keep_free_gpus)" if kept_lent else "")
               if taken else "")
            + (f"; can start now: {'; '.join(served[:5])}" + (" ..." if len(served) > 5 else "")
               if served else "")
            + (f" (after hpcsched's {', '.join(own_first)}, ahead of them in Slurm's queue)"
               if served and own_first else "")
            + (f"; {waiting} wait for running jobs to end" if waiting else ""))


def _extension_gpus(snapshot: ClusterSnapshot) -> dict[str, list[tuple[str, int]]]:
    """Per node, the running managed jobs (not busy) with GPUs there beyond their primary's
    that they may give back, and how many: a job keeps what it was submitted with
    (:attr:`~hpcsched.model.snapshot.JobView.submitted_gpus`, what Slurm alone would hold for
    it), so only the node blocks its growth beyond that fill, the last-added nodes first."""
    out: dict[str, list[tuple[str, int]]] = {}
    for j in snapshot.jobs:
        if j.state != SlurmState.RUNNING or j.busy or not j.primary:
            continue
        primary = j.primary_allocation()
        room = j.gpus - j.submitted_gpus if j.submitted_gpus else j.gpus
        for n, g in reversed(list(j.allocation().items())):
            extra = g - primary.get(n, 0)
            if 0 < extra <= room:
                out.setdefault(n, []).append((j.job_id, extra))
                room -= extra
    return out


def _place(f: ForeignJob, free: dict[str, int], spare: dict[str, list[tuple[str, int]]]
           ) -> list[str] | None:
    """The nodes foreign job ``f`` starts on when free GPUs and released extension GPUs are
    counted: ``f.nodes`` nodes with ``f.gpus_per_node`` of them, those that need the fewest
    releases first, then the fewest free GPUs (best fit); ``None`` when they are not enough."""
    room = {n: free[n] + sum(g for _, g in spare.get(n, ())) for n in free}
    fits = [n for n in free if room[n] >= f.gpus_per_node]
    if len(fits) < f.nodes:
        return None
    fits.sort(key=lambda n: (max(0, f.gpus_per_node - free[n]), free[n], n))
    return fits[:f.nodes]


def _take(spare: dict[str, list[tuple[str, int]]], node: str, need: int) -> list[tuple[str, int]]:
    """At least ``need`` extension GPUs of ``node``: every one a job holds there, the job
    whose GPUs there come closest above ``need`` first, else the most first (a node's
    extensions go back whole: :func:`hpcsched.policies.realise.release_nodes`); removed from
    ``spare``."""
    jobs = dict(spare.get(node, ()))
    out = []
    while need > 0 and jobs:
        enough = [j for j, g in jobs.items() if g >= need]
        job_id = (min(enough, key=lambda j: (jobs[j], j)) if enough
                  else max(jobs, key=lambda j: (jobs[j], j)))
        out.append((job_id, jobs.pop(job_id)))
        need -= out[-1][1]
    spare[node] = list(jobs.items())
    return out


def _release(job: JobView, per_node: dict[str, int], reason: str | None = None) -> Change:
    """``job``'s release of ``per_node`` extension GPUs (a ``shrink`` by ``release``), for
    other users' pending jobs unless ``reason`` says why."""
    after = {n: g - per_node.get(n, 0) for n, g in job.allocation().items()}
    layout = tuple((n, g) for n, g in after.items() if g > 0)
    gpus = sum(g for _, g in layout)
    gone = ", ".join(f"{g} on {n}" for n, g in per_node.items())
    return Change(job.job_id, ChangeKind.SHRINK, job.nodes, len(layout), job.batch_size,
                  batch_on(job, job.batch_size, gpus),
                  f"{reason or YIELD_REASON}: {gone}", (), job.gpus, gpus,
                  Mechanism.RELEASE, layout)


def _planned_on(snapshot: ClusterSnapshot, claimed: dict[str, int], releasing: set[str]
                ) -> ClusterSnapshot:
    """``snapshot`` with ``claimed`` GPUs counted as other users' and ``releasing`` jobs busy."""
    nodes = tuple(replace(n, gpus_allocated=n.gpus_allocated + claimed[n.name])
                  if claimed.get(n.name) else n for n in snapshot.nodes)
    other = dict(snapshot.other_gpus_allocated)
    for n, g in claimed.items():
        other[n] = other.get(n, 0) + g
    jobs = tuple(replace(j, busy=True) if j.job_id in releasing else j for j in snapshot.jobs)
    return replace(snapshot, nodes=nodes, jobs=jobs, other_gpus_allocated=tuple(sorted(other.items())))


__all__ = ["yield_to_foreign"]
