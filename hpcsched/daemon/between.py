"""What the daemon does between two rounds (:class:`~hpcsched.daemon.round.Daemon` inherits
it): actuation ticks that advance the resizes in flight, asking Slurm only when one needs it,
and the check for job ends and submissions that starts a round early
(``hpcsched.daemon.service`` calls both; ``docs/daemon.md``)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from hpcsched import slurm
from hpcsched.daemon import views
from hpcsched.daemon.events import foreign_event, round_event
from hpcsched.daemon.phases import ResizePhase

log = logging.getLogger("hpcsched.daemon")


def mtime_ns(path: Path) -> int | None:
    """``path``'s modification time (ns), None when it cannot be read."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


class SubmitStamp:
    """The job_submit plugin's submission stamp (``[daemon] submit_stamp``): a file Slurm's
    controller rewrites at every submission that is not hpcsched's. :meth:`changed` says
    whether it changed since the last look, one ``stat`` and no Slurm call; a missing or
    unreadable file never has."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self.seen = mtime_ns(self.path) if self.path is not None else None

    def changed(self) -> bool:
        if self.path is None:
            return False
        now = mtime_ns(self.path)
        if now is None or now == self.seen:
            return False
        self.seen = now
        return True


class BetweenRounds:
    """The daemon's between-rounds work; the attributes it uses (``store``, ``backend``,
    ``managed``, ``settings``, ``metrics``, ``steps``, ``_resume``, the last round's states and the jobs'
    ``ack.json`` stamps) are :class:`~hpcsched.daemon.round.Daemon`'s."""

    def actuate(self) -> dict[str, str]:
        """Between rounds: advance every open resize one step, deciding nothing.

        A resize moves one phase per step, and its next step is often due within a second (the
        job checkpointed, the requeue hold is over): waiting a whole round for it would leave
        the job idle. Costs one observation, and nothing at all while no resize is open.
        Returns the outcome per job (as :attr:`RoundReport.outcomes`); never raises for Slurm
        trouble (the next round or tick tries again). While every open resize waits for its
        job's answer, a tick costs one ``stat`` per job and no Slurm call
        (:meth:`_tick_needs_slurm`).
        """
        from hpcsched.daemon.round import RoundReport  # the module that inherits this one

        rep = RoundReport(0, time.time())
        # the steps a round or tick stopped waiting for that have ended: journaled, no Slurm call
        rep.outcomes.update(self.steps.land(self.store))
        open_actions = self.store.open_actions()
        if open_actions and self._tick_needs_slurm(open_actions):
            try:
                managed = self.managed.find(self.backend.observe())
                self._resume(managed, rep)
            except slurm.SlurmError as exc:
                log.warning("resizes in flight not advanced: Slurm: %s; next round or tick "
                            "retries", exc)
        elif not rep.outcomes:
            return {}
        if self.metrics is not None:
            self.metrics.record_actions(rep)
        return rep.outcomes

    def _tick_needs_slurm(self, actions) -> bool:
        """Whether a tick must observe Slurm to advance ``actions`` (the open resizes): one is
        past ``requested`` (its next step waits on Slurm's state or acts through it) or due to
        time out, or a job has answered since its last step (its ``ack.json`` changed). A resize
        waiting for its job's answer needs nothing from Slurm, nor does one whose step is still
        under way (``steps``); a job that ends meanwhile is seen by the next round (an early
        one: ``event_rounds``)."""
        now, flying = time.time(), self.steps.in_flight()
        for a in (a for a in actions if a.id not in flying):
            if a.phase != ResizePhase.REQUESTED or now - a.updated_at >= self.settings.daemon.ack_timeout:
                return True
            seen = self._acks.get(a.job_id)
            if seen is None or mtime_ns(seen[0]) != seen[1]:
                return True
        return False

    def event_since_round(self) -> str | None:
        """Between rounds: did a managed job end, or a new one pend, or another user's GPU job
        pend, since the last round?

        Observes Slurm's jobs once (``squeue``: 1 RPC; the nodes are not needed) and compares them with the last good
        round's (:func:`round_event`, :func:`foreign_event`). Returns the reason for a round now, or None: also
        before any round has observed Slurm, and when Slurm does not answer (logged; never
        raises for Slurm trouble, the next check or round tries again).
        """
        if self._round_states is None:
            return None
        try:
            obs = self.backend.observe(jobs_only=True)
            managed = self.managed.find(obs)
        except slurm.SlurmError as exc:
            log.warning("job ends and submissions not checked: Slurm: %s; next check retries", exc)
            return None
        states = {job_id: info.state for job_id, (_, _, info) in managed.items()}
        foreign = views.foreign_pending(obs, managed, self.settings.daemon.partitions)
        reasons = [r for r in (round_event(self._round_states, states),
                               foreign_event(self._round_foreign, foreign, states)) if r]
        return ", ".join(reasons) or None
