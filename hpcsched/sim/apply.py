"""How the simulator applies a round's changes: as the actuator applies them on Slurm (the
module docstring of :mod:`hpcsched.sim.engine` says what each change costs). A mixin of
:class:`hpcsched.sim.engine.Simulator`, which owns the state it reads and changes.

Units: seconds from the start of the trace, GPUs, nodes.
"""

from __future__ import annotations

from hpcsched.policies.realise import Mechanism, primary_shape
from hpcsched.policies.reconcile import Change
from hpcsched.protocol.batching import BatchConfig, BatchSizeError
from hpcsched.protocol.kinds import ChangeKind, GrowMode, SlurmState
from hpcsched.sim import resize
from hpcsched.sim.cluster import SimCluster
from hpcsched.sim.state import Extension, SimConfig, SimJob


class ChangeApplier:
    """Applies reconciled changes to the simulated jobs and cluster (the simulator's
    actuator); :class:`~hpcsched.sim.engine.Simulator` provides the attributes below and
    ``_advance``/``_release``."""

    jobs: list[SimJob]
    cfg: SimConfig
    cluster: SimCluster
    notes: list[str]
    now: float
    rounds: int

    def _advance(self, j: SimJob, t: float) -> None:
        """Run ``j`` up to time ``t`` (the simulator's physics)."""
        raise NotImplementedError

    def _release(self, j: SimJob) -> None:
        """Give running ``j``'s GPUs (its extension's too) back to the cluster; it holds none
        after."""
        self.cluster.release(j.held_gpus)
        j.gpus, j.node_names, j.ext, j.primary = (), (), None, ()

    def _apply(self, c: Change) -> None:
        """Apply one change of the round's reconciled plan to its job, as the actuator would
        on Slurm: the job's batch configuration is fitted to the GPUs the change asks for
        (a change that does not fit is noted and skipped), then a pending job is set up to
        start (:meth:`_set_pending`) and a running one resized (:meth:`_change_running`); a
        change for a job in any other state does nothing."""
        j = self.jobs[int(c.job_id) - 1]
        if c.kind == ChangeKind.PREEMPT:
            want = j.size            # keeps its size for when it comes back
        else:
            want = c.to_gpus if j.granular and c.to_gpus else c.to_nodes * j.per_node
        try:
            cfg = j.fit(c.to_batch_size, want)
        except BatchSizeError as exc:
            self.notes.append(f"t={self.now:.0f} job {j.wj.name}: {c.kind} not applied: {exc}")
            return
        j.eta = j.st = None
        if c.kind == ChangeKind.PENDING and j.state == SlurmState.PENDING:
            self._set_pending(j, c, want, cfg)
        elif j.state == SlurmState.RUNNING:
            self._change_running(j, c, want, cfg)

    def _set_pending(self, j: SimJob, c: Change, want: int, cfg: BatchConfig) -> None:
        """Set pending ``j``'s size (``want`` GPUs), node count, batch configuration and node
        list before it starts, and release it if it was held. A start into its primary
        (:data:`~hpcsched.policies.realise.Mechanism.START`) takes the change's layout, or its
        fewest GPUs in the primary's shape, refitting the batch to that; not applied, with a
        note, when the batch does not fit there."""
        if c.mechanism == Mechanism.START:   # its primary at its fewest GPUs
            nodes, per = (len(c.layout), c.layout[0][1]) if c.layout else \
                primary_shape(j.limits.min_gpus, self.cfg.gpus_per_node)
            want, placement = nodes * per, tuple(n for n, _ in c.layout)
            j.shape = (nodes, per)
            try:
                cfg = j.fit(c.to_batch_size, want)
            except BatchSizeError as exc:
                self.notes.append(f"t={self.now:.0f} job {j.wj.name}: start not applied: {exc}")
                return
        else:
            nodes, placement = c.to_nodes, tuple(c.placement)
        if j.held and j.start_time is not None:   # a preempted job released
            self._log(j, 0, want)
        j.size, j.nodes, j.cfg = want, nodes, cfg
        j.req_nodes = placement
        j.held = False

    def _change_running(self, j: SimJob, c: Change, want: int, cfg: BatchConfig) -> None:
        """Apply change ``c`` to running ``j`` (``want`` GPUs at batch configuration ``cfg``):
        a preemption releases its GPUs and holds it; a batch-size change is in place; a shrink
        goes by the mechanism reconcile chose (requeue into its primary, a release or an
        in-place shrink to its layout) or, without one, in place keeping the first nodes; a
        grow by extension or by requeue (``SimConfig.grow``)."""
        if c.kind == ChangeKind.PREEMPT:
            self._log(j, j.size, 0)
            self._release(j)
            j.state, j.held = SlurmState.PENDING, True
            j.restarts += 1
        elif c.kind == ChangeKind.BATCH:
            j.cfg = cfg
        elif c.kind == ChangeKind.SHRINK and c.mechanism == Mechanism.REQUEUE:
            nodes, per = len(c.layout), c.layout[0][1]    # the same GPUs on every node
            self._requeue(j, nodes * per, nodes, cfg, tuple(n for n, _ in c.layout), (nodes, per))
        elif c.kind == ChangeKind.SHRINK and c.mechanism is not None:
            self._log(j, j.size, want)
            cost = self.cfg.extension_stall if c.mechanism == Mechanism.RELEASE \
                else self.cfg.shrink_cost
            resize.reach_layout(self.cluster, j, c.layout, cfg, self.now, cost)
        elif c.kind == ChangeKind.SHRINK:
            self._shrink(j, want, cfg)
        elif c.kind == ChangeKind.GROW and self.cfg.grow == GrowMode.EXTENSION:
            self._extend(j, c, want, cfg)
        elif c.kind == ChangeKind.GROW:
            self._requeue(j, want, c.to_nodes, cfg, tuple(c.placement))

    def _extend(self, j: SimJob, c: Change, gpus: int, cfg: BatchConfig) -> None:
        """Grow ``j`` to ``gpus`` GPUs by extension: the extension job takes the new GPUs now
        (:func:`hpcsched.sim.resize.extension_gpus`); the job trains on at its size until
        :meth:`_join`. Not made, with a note, when Slurm cannot place the extension now."""
        got = (resize.extension_on(self.cluster, j, c.layout) if c.layout
               else resize.extension_gpus(self.cluster, j, gpus, c.to_nodes, c.placement))
        if got is None:
            self.notes.append(f"t={self.now:.0f} job {j.wj.name}: grow to {gpus} GPU(s) by "
                              "extension not applied: its GPUs are not free")
            return
        self._log(j, j.size, gpus)
        j.ext = Extension(self.now + self.cfg.extension_startup, got[1], gpus, cfg)
        j.resizes += 1

    def _requeue(self, j: SimJob, gpus: int, nodes: int, cfg: BatchConfig,
                 req_nodes: tuple[str, ...], shape: tuple[int, int] | None = None) -> None:
        """Requeue running ``j`` onto ``gpus`` GPUs over ``nodes`` nodes (a grow by requeue, or
        a shrink into its primary: :data:`~hpcsched.policies.realise.Mechanism.REQUEUE`, with
        its ``shape``): it gives its GPUs back, pends at that size on ``req_nodes``, and pays the
        restart cost when it starts again."""
        self._log(j, j.size, gpus)
        self._release(j)
        j.state = SlurmState.PENDING
        j.size, j.nodes, j.cfg, j.shape = gpus, nodes, cfg, shape
        j.req_nodes = req_nodes
        j.restarts += 1
        j.resizes += 1

    def _join(self, j: SimJob) -> None:
        """At ``j.ext.at`` (``self.now``): the group re-forms at the new size after the stall
        (:func:`hpcsched.sim.resize.join`)."""
        self._advance(j, self.now)
        resize.join(j, self.cluster.node_names, self.now, self.cfg.extension_stall)

    def _log(self, j: SimJob, before: int, after: int) -> None:
        j.resize_log.append((self.now, self.rounds, before, after))

    def _shrink(self, j: SimJob, gpus: int, cfg: BatchConfig) -> None:
        """Shrink in place to ``gpus`` GPUs (:func:`hpcsched.sim.resize.shrink_in_place`)."""
        self._log(j, j.size, gpus)
        resize.shrink_in_place(self.cluster, j, gpus, cfg, self.now, self.cfg.shrink_cost)
