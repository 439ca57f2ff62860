"""The half of :class:`hpcsched.elastic.ElasticJob` that runs at step boundaries: the ranks
agree on hpcsched's requests and on checkpoints (:func:`hpcsched.job.boundary.agree`), apply a
new generation (batch configuration in place, re-form, checkpoint and stop for the launcher, or
shrink in place), acknowledge it in ``ack.json`` and report progress; and the checkpoints
themselves, written at a boundary and restored at registration (``docs/control-protocol.md``).

A mixin over ``ElasticJob``'s state (``_cfg``, ``state``, ``_reg``, ``_group``, ``_members``,
``_ckpt``, ``_noise``, ``_report``, ``_watcher``, ``_pace``...), split from it along that seam
as :mod:`hpcsched.job.elastic_membership` is, so that the training loop reads on its own; the
membership changes it starts (``_reform``, ``_shrink_in_place``, ``_peer_lost``) are there.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

from hpcsched.job.boundary import Decision, agree
from hpcsched.job.checkpoint import set_rng_state, training_state
from hpcsched.job.collective import leave_now
from hpcsched.job.reform import PRIMARY
from hpcsched.protocol.batching import BatchConfig, split_global_batch
from hpcsched.protocol.kinds import AckState, ControlAction

log = logging.getLogger("hpcsched.job.elastic")


class ElasticBoundary:
    """Step boundaries and checkpoints of an elastic job (module docstring)."""

    # ----------------------------------------------------------- checkpoints
    def checkpoint(self) -> Path | None:
        """Collective: write a consistent checkpoint (rank 0 writes; all ranks wait for it).

        Returns the checkpoint path (None when no checkpoint directory is configured).
        """
        path = None
        started = time.monotonic()
        if self._ckpt.directory is not None and self.rank == 0:
            self._noise.flush()
            state = training_state(self._cfg, self.state, self._reg, self._noise.estimator)
            path = self._ckpt.save(self._torch, state, self.state.step)
        if self._group is not None:
            try:
                self._group.barrier()
            except RuntimeError as exc:
                self._peer_lost(exc)
        took = time.monotonic() - started
        self._ckpt.written(took)
        if path is not None:
            period = self._ckpt.period
            log.info("checkpoint %s (epoch %d, position %d) in %.3f s%s", path, self.state.epoch,
                     self.state.position, took, f"; next in {period:.0f} s" if period else "")
        if path is None and self._ckpt.directory is not None:
            path = self._ckpt.latest_path()
        return path

    def _restore(self) -> bool:
        found = self._ckpt.load(self._torch)
        if found is None:
            return False
        path, ck = found
        self._load(ck, path)
        return True

    def _load(self, ck: dict, path) -> None:
        """Take a checkpoint's state (from ``path``: a file, or the rank that sent it)."""
        self.state.load_state_dict(ck["data"], source=path)
        self._reg.load_state_dict(ck)
        if ck.get("grad_noise"):  # absent in checkpoints written before it existed
            self._noise.estimator.load_state_dict(ck["grad_noise"])
        set_rng_state(self._torch, ck["rng"])
        if self.job_dir is None:  # standalone: keep the checkpoint's batch configuration
            self._cfg.batch = split_global_batch(ck["batch"]["global_batch_size"], self.world_size)
        log.info("restored %s: epoch %d position %d step %d", path, self.state.epoch,
                 self.state.position, self.state.step)

    # ------------------------------------------------------ Slurm's signals
    def _listen_for_slurm_signal(self) -> None:
        """Take ``SIGUSR1`` (Slurm's signal before the time limit, ``sbatch --signal``) as a
        request to checkpoint and stop at the next step boundary. Only where the script has no
        handler of its own for it, and only in the main thread (Python runs handlers there)."""
        self._signalled = False
        if threading.current_thread() is not threading.main_thread():
            return
        self._listen_for_preemption()
        if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            log.info("SIGUSR1 has the script's own handler: hpcsched does not checkpoint on it")
            return

        def _on_signal(signum, _frame):
            self._signalled = True   # acted on at the next step boundary (rank 0's decides)

        signal.signal(signal.SIGUSR1, _on_signal)

    def _listen_for_preemption(self) -> None:
        """An extension worker takes ``SIGTERM`` as Slurm ending its extension job: a
        preemption (Slurm sends ``SIGCONT`` and ``SIGTERM`` to the job's steps at once, and
        kills them when the QOS's ``GraceTime`` has passed:
        https://slurm.schedmd.com/preempt.html) or a ``scancel`` (``SIGKILL`` after
        ``KillWait``, slurm.conf(5)). It leaves at the next step boundary, as a released worker
        does (:mod:`hpcsched.job.reform`, "Leave"). A newcomer that has not announced itself
        yet leaves at once (its grow is given up); one that has joins first, then leaves at the
        form's first step boundary (:meth:`_join`), so that the form rank 0 may have published
        with it does not wait the fault timeout for it. The primary's workers keep Python's
        default: a ``SIGTERM`` there ends the job."""
        m = self._members
        if m is None or m.me.allocation == PRIMARY:
            return

        def _on_term(_signum, _frame):
            joining = m.form is None
            if joining and not m.announced:
                log.info("SIGTERM before joining: Slurm is ending extension job %s; leaving",
                         m.me.allocation)
                leave_now()
            if self._preempted:
                return
            self._preempted = True
            if joining:        # _join announces the leave once this worker is in the form
                log.info("SIGTERM while joining: Slurm is ending extension job %s; it joins, "
                         "then leaves at the first step boundary", m.me.allocation)
                return
            log.info("SIGTERM: Slurm is ending extension job %s; leaving at the next step "
                     "boundary", m.me.allocation)
            try:
                m.announce_leaving()
            except RuntimeError as exc:   # the job's store is gone: the job is ending
                log.warning("cannot announce the leave (%s); leaving now", exc)
                leave_now()

        self._preempted = False
        signal.signal(signal.SIGTERM, _on_term)

    def _stop_at_signal(self) -> bool:
        """Collective, at a boundary that decided :attr:`~hpcsched.job.boundary.Decision.stop`:
        checkpoint, let extension workers go, acknowledge ``stopped`` for the generation in
        force (the launcher then requeues the job) and stop. Returns False."""
        path = self.checkpoint()
        if self._members is not None and self.rank == 0:
            self._members.release_all()
        self._ack(AckState.STOPPED, self.generation, checkpoint=str(path or ""),
                  message="Slurm signalled the job (SIGUSR1: time limit near)")
        log.info("stopped at step %d on Slurm's signal; checkpoint %s", self.state.step, path)
        self.stopped_for = ControlAction.CHECKPOINT_AND_REQUEUE
        self._progress()
        return False

    # --------------------------------------------------------- step boundary
    def _ack(self, state: AckState, generation: int, checkpoint: str = "", message: str = ""):
        form = self._members.form if self._members is not None else None
        layout = form.layout() if form is not None and form.has_extensions else None
        self._report.ack(state, generation, self._cfg, self.state.step, checkpoint, message,
                         layout)

    def _progress(self, finished: bool = False) -> None:
        self._report.progress(self._cfg, self.state, self._noise.estimator.estimate, finished)

    def _step_boundary(self) -> bool:
        """Collective: agree on any new generation, on checkpoints and on the step of the next
        boundary (:class:`~hpcsched.job.boundary.Pace`). False = stop."""
        try:
            d = agree(self._watcher, self._group, self._torch, self.rank, self.generation,
                      self._ckpt.due, decide=self._decide, pace=self._pace,
                      step=self.state.step, stop=self._signalled)
        except RuntimeError as exc:
            self._peer_lost(exc)
            return self._step_boundary()
        self._agree_at = self.state.step + d.next_in
        if not self._applied_acked:
            self._ack(AckState.APPLIED, self.generation)
            self._applied_acked = True
        if d.stop:
            return self._stop_at_signal()
        if d.form and d.generation == self.generation:   # SIGTERMed extension workers leave
            go_on = self._reform(d)
            if d.checkpoint_due:
                self.checkpoint()
            return go_on
        if d.generation > self.generation:
            go_on = self._apply(d)
            if go_on and d.action == ControlAction.REFORM:  # newcomers begin with a boundary
                return self._step_boundary()
            return go_on
        if d.checkpoint_due:
            self.checkpoint()
        return True

    def _apply(self, d: Decision) -> bool:
        """Carry out a new generation; False when the workers stop for the launcher."""
        cfg = self._cfg
        if d.action == ControlAction.CONTINUE and d.world_size == cfg.world_size:
            cfg.generation, cfg.lr_scale = d.generation, d.lr_scale
            cfg.batch = BatchConfig(cfg.world_size, d.local_batch_size, d.accumulation_steps)
            log.info("generation %d: local batch %d x %d accumulation -> global %d", d.generation,
                     d.local_batch_size, d.accumulation_steps, cfg.batch.global_batch_size)
            self._ack(AckState.APPLIED, d.generation)
            return True
        if d.action == ControlAction.REFORM:
            return self._reform(d)
        if d.action == ControlAction.CONTINUE:
            cfg.generation = d.generation  # never act twice on it
            self._ack(AckState.REJECTED, d.generation, message=(
                f"'continue' asks for world size {d.world_size} but the job runs "
                f"{cfg.world_size} workers; a world-size change needs checkpoint-and-shrink "
                "or -requeue"))
            return True
        path = self.checkpoint()
        if self._members is not None and self.rank == 0:
            self._members.release_all()  # extension workers stop with the others
        self._ack(AckState.CHECKPOINTED, d.generation, checkpoint=str(path or ""))
        if d.action == ControlAction.CHECKPOINT_AND_SHRINK and self._can_shrink_in_place(d):
            return self._shrink_in_place(d)
        self.stopped_for = d.action
        self._progress()
        return False
