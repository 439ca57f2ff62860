"""Who the job's workers are, and how that changes while they run: the driver of
:mod:`hpcsched.job.reform`'s protocol for :class:`hpcsched.elastic.ElasticJob`.

Rank 0 turns a ``reform`` control generation into extension jobs (:class:`~hpcsched.job.
extension.Extender`) and, once their workers are ready, into a form decision that every rank
applies at the same step boundary; every rank leaves or re-forms; a newcomer joins; survivors of
a lost peer re-form without it. Decisions travel as :class:`hpcsched.job.boundary.Decision`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from hpcsched import slurm
from hpcsched.job import reform as rf
from hpcsched.job.boundary import Decision
from hpcsched.job.extension import Extender, LayoutRefused, plan_layout
from hpcsched.protocol import files as ctl
from hpcsched.protocol.batching import BatchSizeError, split_global_batch
from hpcsched.protocol.env import LaunchEnv
from hpcsched.protocol.extensions import ExtensionState, format_layout
from hpcsched.protocol.jobdir import JobDir
from hpcsched.protocol.kinds import ControlAction, SlurmState

log = logging.getLogger(__name__)

#: seconds between rank 0's looks at Slurm for a pending grow's extensions
SLURM_LOOK_S = 2.0


class Refused(Exception):
    """A reform generation the job will not carry out (``str`` = why, for the ack)."""


@dataclass
class Pending:
    """Rank 0: a grow waiting for its newcomers."""

    control: ctl.Control
    release: tuple[str, ...]
    submitted: tuple[str, ...]     # extension job ids
    newcomers: int
    since: float
    looked: float = 0.0


class Membership:
    """One process's view of the job's membership (module docstring).

    Args:
        group: the launch's :class:`hpcsched.job.collective.ProcessGroup` (holds the store).
        launch: the launch environment. me: this process's member. jd: the job directory.
        rank: this process's rank at launch (a newcomer's is provisional).
        primary_job_id: ``SLURM_JOB_ID`` of the primary (for a newcomer: its own).
    """

    def __init__(self, group, launch: LaunchEnv, me: rf.Member, jd: JobDir | None, rank: int,
                 primary_job_id: str):
        self.group, self.launch, self.me, self.jd = group, launch, me, jd
        self.store = group.store
        self.form: rf.Form | None = None
        self.pending: Pending | None = None
        self.extender: Extender | None = None
        #: a newcomer that has added itself (or is adding itself) to its grow's ready list:
        #: rank 0 may count it from here on, so it joins before it may leave (:func:`join`)
        self.announced = False
        self.spec = jd.read_spec() if jd is not None and rank == 0 else None
        if launch.join_generation:
            return
        self.store.set(f"hpcsched/node/{me.id}", me.node)
        if rank == 0 and jd is not None:
            self.extender = Extender(jd, self.spec, primary_job_id, os.environ)

    # -------------------------------------------------------------- form 0
    def initial_form(self, world_size: int, generation: int, batch, lr_scale: float) -> rf.Form:
        """Form 0, the launch's group (rank 0; reads every rank's node from the store)."""
        members = tuple(rf.Member(rf.primary_member(r),
                                  self.store.get(f"hpcsched/node/{rf.primary_member(r)}").decode())
                        for r in range(world_size))
        return rf.Form(0, generation, members, (), batch.local_batch_size,
                       batch.accumulation_steps, lr_scale)

    def current(self, world_size: int, generation: int, batch, lr_scale: float) -> rf.Form:
        if self.form is None:
            self.form = self.initial_form(world_size, generation, batch, lr_scale)
        return self.form

    # ------------------------------------------------------------- rank 0
    def request(self, control: ctl.Control, form: rf.Form) -> Decision | None:
        """A new ``reform`` generation: a form decision to apply now (nothing to add), or None
        while newcomers start (:meth:`poll` says when they are ready).

        Raises:
            Refused: the layout needs a restart, the batch does not fit, or Slurm refused an
                extension (nothing is left submitted).
        """
        self.abandon("superseded by generation %d" % control.generation)
        if self.extender is None:
            raise Refused("this job cannot grow by extension allocations (no job directory)")
        active = self.extender.active
        try:
            plan = plan_layout(form.primary_layout(), active, control.layout)
        except LayoutRefused as exc:
            raise Refused(str(exc)) from None
        if not plan.add:
            return self._publish(control, form, plan.release, [])
        launch = self._newcomer_launch(control)
        submitted = []
        try:
            for node, gpus in plan.add.items():
                submitted.append(self.extender.submit(node, gpus, control.generation, launch).job_id)
        except slurm.SlurmError as exc:
            for job_id in submitted:
                self.extender.cancel(job_id, ExtensionState.REFUSED, "grow refused")
            raise Refused(f"Slurm refused the extension job: {exc}") from None
        self.pending = Pending(control, plan.release, tuple(submitted),
                               sum(plan.add.values()), time.monotonic())
        return None

    def poll(self, form: rf.Form) -> Decision | None:
        """The pending grow's form decision once every newcomer is ready, else None.

        Raises:
            Refused: an extension ended, did not start in time, or cannot start because
                other jobs hold its node's GPUs (:meth:`Extender.stalled`); the pending grow
                is abandoned.
        """
        p = self.pending
        if p is None:
            return None
        n = rf.ready(self.store, p.control.generation)
        if n >= p.newcomers:
            self.pending = None
            announced = rf.announced(self.store, p.control.generation, n)
            for job_id in p.submitted:
                self.extender.mark_ready(job_id, max(
                    (at for m, at in announced if m.allocation == job_id), default=0.0))
            return self._publish(p.control, form, p.release, [m for m, _ in announced])
        now = time.monotonic()
        if now - p.looked >= SLURM_LOOK_S:
            p.looked = now
            why = self.extender.stalled(p.submitted, now - p.since, p.control.ack_by)
            if why:
                self.abandon(why)
                raise Refused(why)
        return None

    def abandon(self, why: str) -> None:
        """Cancel a pending grow's extensions (rank 0)."""
        p, self.pending = self.pending, None
        if p is None:
            return
        log.warning("generation %d abandoned: %s", p.control.generation, why)
        rf.call_off(self.store, p.control.generation)   # newcomers waiting to join leave
        for job_id in p.submitted:
            self.extender.cancel(job_id, ExtensionState.REFUSED, why)

    def _newcomer_launch(self, control: ctl.Control) -> dict[str, str]:
        env = LaunchEnv(**{**self.launch.__dict__, "generation": control.generation,
                           "join_generation": control.generation, "extensions": True})
        return env.to_env()

    def _publish(self, control: ctl.Control, form: rf.Form, release, joiners) -> Decision:
        members = tuple(m for m in form.members if m.allocation not in release) + tuple(
            sorted(joiners, key=lambda m: (m.node, m.id)))
        new = rf.Form(rf.next_form(self.store), control.generation, members,
                      tuple(m.id for m in joiners), control.local_batch_size,
                      control.accumulation_steps, float(control.lr_scale))
        new.publish(self.store)
        if joiners:
            rf.invite(self.store, control.generation, new.form)
        log.info("generation %d: form %d, %d worker(s) on %s", control.generation, new.form,
                 new.world_size, format_layout(new.layout()))
        return Decision(control.generation, ControlAction.REFORM, len(new.layout()), 0,
                        control.local_batch_size, control.accumulation_steps,
                        float(control.lr_scale), new.world_size, form=new.form)

    def leaving_form(self, form: rf.Form, refit) -> rf.Form | None:
        """Rank 0 at a step boundary: the form without the extension workers that announced
        they leave (:func:`hpcsched.job.reform.announce_leaving`), published, at the
        generation in force with the batch refitted (``refit(world) -> (local, accumulation,
        lr_scale)``, :meth:`refit`); None when none leaves."""
        gone = rf.leaving(self.store, form)
        if not gone:
            return None
        members = tuple(m for m in form.members if m.allocation not in gone)
        local, accumulation, lr = refit(len(members))
        new = rf.Form(rf.next_form(self.store), form.generation, members, (), local,
                      accumulation, lr)
        new.publish(self.store)
        log.warning("Slurm is ending extension job(s) %s: form %d goes on with %d worker(s) "
                    "on %s", ", ".join(sorted(gone)), new.form, new.world_size,
                    format_layout(new.layout()))
        return new

    def announce_leaving(self) -> None:
        """An extension worker whose job Slurm is ending (``SIGTERM``): leave at the next step
        boundary."""
        rf.announce_leaving(self.store, self.me.allocation)

    def record(self, old: rf.Form, new: rf.Form, lost: set[str] = frozenset(),
               why: str = "") -> None:
        """Rank 0: bring ``extensions.json`` up to date after a change of form."""
        if self.extender is None:
            return
        now_in = {m.allocation for m in new.members}
        was_in = {m.allocation for m in old.members}
        for e in self.extender.active:
            if e.job_id in now_in and e.state != ExtensionState.JOINED:
                self.extender.set_state(e.job_id, ExtensionState.JOINED)
            elif e.job_id in was_in and e.job_id not in now_in:
                if e.job_id in lost:
                    self.extender.cancel(e.job_id, ExtensionState.LOST,
                                         "its workers were lost; the job went on without them")
                else:
                    self.extender.set_state(e.job_id, ExtensionState.RELEASED, why)

    def release_all(self) -> None:
        """Rank 0, before the workers stop for a checkpoint-and-requeue or -shrink: every
        extension is released (its workers stop too, and its job ends)."""
        if self.extender is None:
            return
        self.abandon("the workers stop")
        for e in self.extender.active:
            if e.state == ExtensionState.JOINED:
                self.extender.set_state(e.job_id, ExtensionState.RELEASED)
            else:  # submitted for a grow that will not happen
                self.extender.cancel(e.job_id, ExtensionState.REFUSED, "the workers stopped")

    # ------------------------------------------------------------- any rank
    def read_form(self, number: int) -> rf.Form:
        return rf.Form.read(self.store, number)

    def enter(self, form: rf.Form, timeout: float) -> int:
        """Form ``form``'s group; returns this process's rank in it (the caller has checked
        that it is a member)."""
        rank = form.rank_of(self.me.id)
        self.group.reform(form.form, rank, form.world_size, timeout)
        self.form = form
        return rank

    def join(self) -> rf.Form:
        """A newcomer: announce, wait for the invitation, return the form to enter.

        Raises:
            rf.GrowCalledOff: rank 0 gave the grow up.
        """
        self.announced = True     # before the store has it: a SIGTERM from here on joins first
        rf.announce(self.store, self.launch.join_generation, self.me)
        log.info("generation %d: ready to join; waiting for rank 0's invitation",
                 self.launch.join_generation)
        return rf.invitation(self.store, self.launch.join_generation)

    def survivors_form(self, old: rf.Form, rank: int, refit) -> rf.Form:
        """After a failed collective: the form the survivors re-form as. Rank 0 decides
        (``refit(world_size) -> (local, accumulation, lr_scale)``); the others wait for it."""
        rf.mark_alive(self.store, old.form, self.me.id)
        if rank != 0:
            return rf.recovery(self.store, old)
        alive = rf.survivors(self.store, old, self._gone(), 2 * self.launch.fault_timeout)
        local, accumulation, lr = refit(len(alive))
        new = rf.Form(rf.next_form(self.store), old.generation, tuple(alive), (), local,
                      accumulation, lr)
        rf.publish_recovery(self.store, old, new)
        lost = {m.allocation for m in old.members} - {m.allocation for m in alive}
        log.warning("lost %s; form %d goes on with %d worker(s)",
                    ", ".join(sorted(lost)) or "no allocation", new.form, new.world_size)
        self.record(old, new, lost)
        return new

    def _gone(self):
        """``gone(member)``: its extension job no longer runs (Slurm asked at most every
        :data:`SLURM_LOOK_S` seconds)."""
        cache = {"at": 0.0, "running": None}

        def gone(m: rf.Member) -> bool:
            if m.allocation == rf.PRIMARY or self.extender is None:
                return False
            if time.monotonic() - cache["at"] >= SLURM_LOOK_S:
                cache["at"] = time.monotonic()
                try:
                    cache["running"] = {j for j, i in self.extender.slurm_states().items()
                                        if i.state == SlurmState.RUNNING}
                except slurm.SlurmError:
                    cache["running"] = None
            return cache["running"] is not None and m.allocation not in cache["running"]
        return gone

    def refit(self, global_batch_size: int):
        """``refit(world)`` for :meth:`survivors_form`: the job's limits' batch configuration
        nearest ``global_batch_size`` at ``world`` workers (rank 0)."""
        limits = self.spec.limits

        def fit(world: int):
            try:
                b = limits.fit_batch_gpus(global_batch_size, world)
            except BatchSizeError:  # the limits do not fit this world: nearest sane batch
                b = split_global_batch(max(global_batch_size, world), world,
                                       limits.max_local_batch_size)
            return b.local_batch_size, b.accumulation_steps, limits.lr_scale(b.global_batch_size)
        return fit

