"""The half of :class:`hpcsched.elastic.ElasticJob` that changes who its workers are while they
run: joining as a newcomer, entering a re-formed group (:mod:`hpcsched.job.reform`, driven by
:class:`hpcsched.job.membership.Membership`), going on without lost workers, rank 0's decisions
on ``reform`` generations, and the in-place shrink of the primary's nodes.

A mixin over ``ElasticJob``'s state (``_cfg``, ``state``, ``_reg``, ``_group``, ``_members``,
``_metrics``, ``_report``, ``_launch``...), split from it along that seam so that the training
loop reads on its own.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from hpcsched.job import reform as rf
from hpcsched.job.allocation import shrink_from_inside
from hpcsched.job.boundary import Decision, InForce
from hpcsched.job.checkpoint import rng_state, training_state
from hpcsched.job.collective import leave_now, state_of_most_advanced
from hpcsched.job.membership import Refused
from hpcsched.protocol.batching import BatchConfig
from hpcsched.protocol.extensions import format_layout
from hpcsched.protocol.jobdir import LEFT_DIR
from hpcsched.protocol.kinds import AckState, ControlAction

log = logging.getLogger("hpcsched.job.elastic")


class ElasticMembership:
    """Membership changes of an elastic job (module docstring)."""

    @property
    def layout(self) -> tuple[int, ...]:
        """Workers (GPUs) per node in force, nodes in rank order: ``(4, 2)`` for 4 on the
        primary's node and 2 on an extension's (``docs/extensions.md``). Without extensions the
        workers are spread evenly over :attr:`nodes`."""
        form = self._members.form if self._members is not None else None
        if form is not None:
            return tuple(form.layout().values())
        n, w = max(1, self.nodes), self.world_size
        return tuple(w // n + (i < w % n) for i in range(n))

    @property
    def survives_lost_workers(self) -> bool:
        """The group in force has extension members, so a lost worker is survivable: the job
        goes on without it (``docs/extensions.md``); otherwise a failed collective ends the
        job."""
        form = self._members.form if self._members is not None else None
        return form is not None and form.has_extensions

    def _join(self) -> bool:
        """A newcomer from an extension job: wait to be invited into the running job's group
        at a step boundary, then take the training state from rank 0 (no checkpoint read).
        One whose grow rank 0 gave up leaves; one that got ``SIGTERM`` while joining leaves at
        the first step boundary (:meth:`_listen_for_preemption`)."""
        try:
            form = self._members.join()
        except rf.GrowCalledOff as exc:
            log.info("%s; this worker leaves", exc)
            leave_now()
        self._enter(form)
        self._sync_state(form)
        log.info("joined generation %d as rank %d of %d", form.generation, self.rank,
                 self.world_size)
        if getattr(self, "_preempted", False):
            self._members.announce_leaving()
        return True

    def _enter(self, form) -> None:
        """Form ``form``'s group and take its configuration; its ranks agree at their next
        step (the ranks entering it may not have agreed on one before)."""
        self._agree_at = 0
        timeout = self._launch.fault_timeout if form.has_extensions else self._init_timeout
        self.rank = self._members.enter(form, timeout)
        self._report.rank_changed(self.rank)
        self._metrics.set_rank(self.rank)
        self._cfg = InForce(form.generation, len(form.layout()),
                            BatchConfig(form.world_size, form.local_batch_size,
                                        form.accumulation_steps), form.lr_scale)

    def _sync_state(self, form) -> None:
        """Collective after entering a form with newcomers: rank 0's training state to all."""
        if not form.newcomers:
            return
        state = [self._shared_state() if self.rank == 0 else None]
        self._group.dist.broadcast_object_list(state, src=0)
        if self._members.me.id in form.newcomers:
            self._load(state[0], "rank 0")

    def _shared_state(self) -> dict:
        """This rank's training state as another rank takes it (:meth:`ElasticJob._load`): a
        checkpoint's entries and the random generators' states, sent instead of written."""
        return {**training_state(self._cfg, self.state, self._reg, self._noise.estimator),
                "rng": rng_state(self._torch)}

    def _reform(self, d: Decision) -> bool:
        """Every rank: leave, or enter the form rank 0 published for ``d`` (a new generation's,
        or, at the generation in force, the one without extension workers whose job Slurm is
        ending: preempted or cancelled, ``SIGTERM``)."""
        old = self._members.form
        form = self._members.read_form(d.form)
        preempted = d.generation == self.generation
        if form.rank_of(self._members.me.id) is None:
            log.info("generation %d: this worker leaves the job%s", d.generation,
                     " (Slurm is ending its extension job)" if preempted else "")
            self._metrics.close()
            leave_now()
        try:
            self._enter(form)
        except RuntimeError as exc:   # its group never formed: a newcomer did not come
            if not form.newcomers or self._members.me.id in form.newcomers:
                raise
            log.warning("generation %d: its group did not form (%s); going on without the "
                        "workers that did not come", d.generation, exc)
            self._go_on_without(form)
            return True
        self._sync_state(form)
        if self.rank == 0:
            why = ("Slurm ended it (SIGTERM: preempted or cancelled); its workers left at a step "
                   "boundary") if preempted else ""
            self._members.record(old or form, form, why=why)
            where = f"{form.world_size} worker(s) on {format_layout(form.layout())}"
            self._ack(AckState.APPLIED, d.generation, message=(
                f"extension workers left (Slurm ended their job: SIGTERM): {where}" if preempted
                else f"{where}; no worker restarted"))
        return True

    def _preempted_leave(self) -> Decision | None:
        """Rank 0: the decision that lets go the extension workers whose job Slurm is ending
        (:meth:`Membership.leaving_form`), or None."""
        m = self._members
        if m is None or m.form is None or not m.form.has_extensions:
            return None
        new = m.leaving_form(m.form, m.refit(self.global_batch_size))
        if new is None:
            return None
        return Decision(self.generation, ControlAction.REFORM, len(new.layout()), 0,
                        new.local_batch_size, new.accumulation_steps, new.lr_scale,
                        new.world_size, form=new.form)

    def _peer_lost(self, exc: Exception) -> None:
        """A collective failed. With extension members in the group, go on without the lost
        peers (:meth:`Membership.survivors_form`); otherwise the error stands."""
        if not self.survives_lost_workers:
            raise exc
        log.warning("a collective failed (%s); re-forming without the lost workers", exc)
        self._go_on_without(self._members.form)

    def _go_on_without(self, form) -> None:
        """Every member still running of ``form`` (the group in force, or one being entered
        whose newcomers never came: their extension job was lost, or its workers killed, before
        they joined) re-forms without the others (:meth:`Membership.survivors_form`), takes the
        most advanced survivor's state, and rank 0 acknowledges the smaller group."""
        refit = self._members.refit(self.global_batch_size) if self.rank == 0 else None
        new = self._members.survivors_form(form, self.rank, refit)
        if new.rank_of(self._members.me.id) is None:
            log.error("this worker was counted as lost; leaving")
            leave_now(1)
        try:
            self._enter(new)
        except RuntimeError as exc:   # another member went missing while the survivors re-formed
            log.warning("the survivors' group did not form (%s); going on without the workers "
                        "that did not come", exc)
            self._go_on_without(new)
            return
        try:
            self._resync_survivors()
        except RuntimeError as again:   # lost another worker while re-forming
            self._peer_lost(again)
            return
        if self.rank == 0:
            self._ack(AckState.APPLIED, self.generation, message=(
                f"lost workers: went on with {new.world_size} on "
                f"{format_layout(new.layout())}"))

    def _resync_survivors(self) -> None:
        """Collective, after re-forming without lost workers: every survivor takes the training
        state of the most advanced one. The loss is seen by each rank in its own collective: a
        ring all-reduce can complete on some ranks (their gradient is whole; they step and
        advance) and fail on others (they void the step), so survivors may be one step apart.
        Going on from the most advanced state, as torchft recovers from a replica at the
        quorum's highest step, counts every step exactly once and keeps the ranks in lockstep
        (ranks a step apart would reach the end of training at different collectives)."""
        got = state_of_most_advanced(self._group.dist, self.world_size, self.state.step,
                                     self._shared_state)
        if got is not None:
            src, steps, state = got
            if self.rank == 0:
                log.warning("the survivors had done %s steps: all go on from rank %d's state",
                            steps, src)
            if self.rank != src:
                self._load(state, f"rank {src} (steps of the survivors: {steps})")

    def _decide(self, c, checkpoint_due: bool) -> Decision:
        """Rank 0's decision at a step boundary, reform generations included; extension
        workers whose job Slurm is ending leave first (a new generation waits a boundary)."""
        left = self._preempted_leave()
        if left is not None:
            return replace(left, checkpoint_due=checkpoint_due)
        m = self._members
        if c is not None and c.action == ControlAction.REFORM:
            try:
                if m is None:
                    raise Refused("this job was not started with extension support")
                d = m.request(c, self._current_form())
            except Refused as exc:
                self._ack(AckState.REJECTED, c.generation, message=str(exc))
                return Decision(checkpoint_due=checkpoint_due)
            return d or Decision(checkpoint_due=checkpoint_due)
        if c is not None:
            if m is not None:
                m.abandon(f"superseded by generation {c.generation}")
            return Decision.of(c, checkpoint_due)
        if m is not None and m.pending is not None:
            generation = m.pending.control.generation
            try:
                d = m.poll(self._current_form())
            except Refused as exc:
                self._ack(AckState.REJECTED, generation, message=str(exc))
                d = None
            if d is not None:
                return d
        return Decision(checkpoint_due=checkpoint_due)

    def _current_form(self):
        return self._members.current(self.world_size, self.generation, self.batch, self.lr_scale)

    # ----------------------------------------------- in-place shrink (primary)
    def _can_shrink_in_place(self, d: Decision) -> bool:
        form = self._members.form if self._members is not None else None
        return (self._group is not None and self.job_dir is not None
                and self._launch.inplace_shrink and not (form and form.has_extensions)
                and d.workers_per_node == self._launch.workers_per_node
                and 1 <= d.nodes < self.nodes)

    def _shrink_in_place(self, d: Decision) -> bool:
        """Release nodes without restarting the workers that stay (:meth:`ProcessGroup.
        shrink_in_place`): ranks are laid out block-wise (rank // workers_per_node = node index)
        and ``scontrol update NumNodes=n`` on a running job keeps the first ``n`` nodes (Slurm
        22.05, measured), so ranks ``< n * workers_per_node`` stay. Rank 0 runs the update from
        inside the job (:func:`hpcsched.job.allocation.shrink_from_inside`). A checkpoint was
        written first, so any failure here is recoverable."""
        new_world = d.nodes * self._launch.workers_per_node
        error = self._group.shrink_in_place(
            d.generation, new_world, self.job_dir / LEFT_DIR, before_exit=self._metrics.close,
            release=lambda: shrink_from_inside(self._slurm_job_id, d.nodes, self.job_dir))
        message = (f"shrunk in place to {d.nodes} node(s); workers not restarted" if error is None
                   else f"workers shrunk to {new_world} but Slurm kept the nodes: {error}")
        self._cfg = InForce(d.generation, d.nodes,
                            BatchConfig(new_world, d.local_batch_size, d.accumulation_steps),
                            d.lr_scale)
        log.info("generation %d: %s", d.generation, message)
        self._ack(AckState.APPLIED, d.generation, message=message)
        return True
