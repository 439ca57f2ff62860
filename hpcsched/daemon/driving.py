"""A round's resize steps, side by side, their journal entries in one commit.

Every step of an action (:meth:`hpcsched.daemon.actuator.Actuator.advance`) acts on its own job
only: it writes that job's control file and may run one or two Slurm commands for it
(``scontrol update`` of a pending job's size or start time, ``scontrol requeue``). Taken one after another, a
round's steps wait for slurmctld in turn: on the 1,024-GPU dev cluster, with slurmctld's
backfill holding its locks, ten ``scontrol update`` took 1-2.6 s each and 25.7 s together
(``docs/daemon.md``, "At scale"). :class:`Steps` takes them on up to :data:`STEP_THREADS`
threads, so a round waits about as long as its slowest command, and journals every transition
they made in one transaction (one ``fsync``, not one per transition), in each action's order.

The journal stays write-ahead: a change is journaled ``requested``, and committed, before its
first step (the caller does that, for all of a round's changes in one commit), and a
transition is journaled after the effects that lead to it, as before; what changes is that
the transitions of a round's steps are committed together once the last step is done. A
daemon killed in between finds those actions in their earlier phase, which the state machine
allows for at every step: a step taken again repeats no effect that is not idempotent
(:class:`~hpcsched.daemon.actuator.Actuator`; ``tests/test_actuator.py`` kills between every
two transitions).

A round waits for its steps only so long (:class:`Steps`, ``[daemon] step_wait``): a step
still under way then -- its control file on a file system that stalls (a busy or hung NFS
server, a disk the jobs keep busy), or slurmctld slow to answer -- goes on in its thread and
is journaled by the first round or tick after it ends, its action stepped again only then.
The journal is as write-ahead as before: a carried-over step's transitions are committed
after its effects, one round later; a daemon killed meanwhile takes the step again.

Nothing here touches the store from a thread: the threads run the steps, the caller's thread
writes the journal.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from hpcsched import slurm
from hpcsched.daemon.actuator import Action, Actuator, Advance
from hpcsched.daemon.phases import History, ResizePhase
from hpcsched.daemon.store import Store
from hpcsched.protocol.jobdir import JobDir, JobSpec

log = logging.getLogger("hpcsched.daemon")

#: at most this many actions' steps (and so Slurm commands) at once; slurmctld serves RPCs on
#: many threads, and 8 from one client is well under its ``max_rpc_cnt`` defaults
STEP_THREADS = 8


@dataclass(frozen=True)
class Drive:
    """One step to take: journal entry ``action_id`` (its :class:`Action` and
    :class:`History` so far) of the job in ``jd`` / ``spec``, with Slurm's view of it."""

    action_id: int
    action: Action
    history: History
    jd: JobDir
    spec: JobSpec
    info: slurm.JobInfo | None


@dataclass
class _Driven:
    transitions: list[tuple[ResizePhase, float, str]] = field(default_factory=list)
    outcome: str = ""
    error: BaseException | None = None


#: the outcome of a step still under way when its round stopped waiting for it
IN_FLIGHT = "in flight"


class Steps:
    """Resize steps on up to :data:`STEP_THREADS` threads of their own, which a round waits for
    only so long (module docstring): a step still under way is carried over, and its
    transitions are journaled by the first :meth:`take` or :meth:`land` after it ends.

    The daemon keeps one for its life (a ``SIGHUP`` reload hands it to the new
    :class:`~hpcsched.daemon.round.Daemon`), so that a step is never taken twice at once: the
    caller leaves the actions of :meth:`in_flight` alone until they have landed.
    """

    def __init__(self, threads: int = STEP_THREADS):
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._flying: dict[int, tuple[Drive, _Driven, Future]] = {}

    def in_flight(self) -> frozenset[int]:
        """Journal ids of the actions whose step has not landed (under way or not journaled)."""
        return frozenset(self._flying)

    def take(self, actuator: Actuator, store: Store, drives: list[Drive],
             wait_s: float | None) -> list[str]:
        """Take one step of each of ``drives`` (different jobs, none in flight) side by side,
        wait up to ``wait_s`` seconds (None: until all are done) and journal the steps that are
        done, with any earlier one that has ended meanwhile, in one transaction.

        Returns each drive's outcome, in order: the phase its action reached, ``failed:
        <why>``, ``interrupted`` (Slurm did not answer an effect: the transitions observed before
        it are journaled, the step itself is not, and the next round takes it again), or
        :data:`IN_FLIGHT`.

        Raises:
            Exception: what a step raised that is not Slurm's (a bug), once every step that is
                done is journaled.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="hpcsched-step")
        for d in drives:
            out = _Driven()
            self._flying[d.action_id] = (d, out, self._pool.submit(_step, actuator, d, out))
        wait([self._flying[d.action_id][2] for d in drives], timeout=wait_s)
        landed = {d.action_id: outcome for d, outcome in self._land(store)}
        return [landed.get(d.action_id, IN_FLIGHT) for d in drives]

    def land(self, store: Store) -> dict[str, str]:
        """Journal the carried-over steps that have ended (one transaction); their outcomes by
        job id.

        Raises:
            Exception: as :meth:`take`.
        """
        return {d.action.job_id: outcome for d, outcome in self._land(store)}

    def close(self, store: Store, wait_s: float) -> None:
        """At the daemon's stop: wait up to ``wait_s`` seconds for the steps under way,
        journal those that ended, and let the threads go (a step still under way ends in its
        thread unjournaled: the next daemon takes it again)."""
        if self._flying:
            log.info("waiting up to %.0f s for %d resize step(s) under way", wait_s,
                     len(self._flying))
            wait([f for _, _, f in self._flying.values()], timeout=wait_s)
            try:
                self._land(store)
            except Exception:  # noqa: BLE001 - a bug in a step, at the stop: logged, not raised
                log.exception("a resize step failed")
            if self._flying:
                log.warning("%d resize step(s) still under way at the stop, not journaled: "
                            "the next daemon takes them again", len(self._flying))
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _land(self, store: Store) -> list[tuple[Drive, str]]:
        """Journal every ended step's transitions in one transaction, in the order the steps
        were taken; each ended step, with its outcome, is no longer in flight."""
        done = [self._flying.pop(aid)[:2] for aid in
                [aid for aid, (_, _, f) in self._flying.items() if f.done()]]
        if any(out.transitions for _, out in done):   # no write transaction (its lock) for none
            with store.batch():
                for d, out in done:
                    _journal(store, d, out)
        for _, out in done:
            if out.error is not None:
                raise out.error
        return [(d, out.outcome) for d, out in done]


def _step(actuator: Actuator, d: Drive, out: _Driven) -> None:
    """One step of ``d`` into ``out`` (never raises: an error is kept for :class:`Steps`)."""
    def journal(phase: ResizePhase, at: float, why: str) -> None:
        out.transitions.append((phase, at, why))

    try:
        out.outcome = _outcome(d.action, d.history,
                               actuator.advance(d.action, d.history, d.jd, d.spec, d.info, journal))
    except slurm.SlurmUnavailable as exc:
        # not a failure of the resize: it stays open and the next round takes the step again
        log.warning("job %s: %s interrupted, Slurm did not answer (%s); resumes next round",
                    d.action.job_id, d.action.kind, exc)
        out.outcome = "interrupted"
    except Exception as exc:  # noqa: BLE001 - raised by Steps once the others are journaled
        out.error = exc


def _outcome(action: Action, history: History, adv: Advance) -> str:
    for note in adv.notes:
        log.warning("job %s: %s", action.job_id, note)
    if adv.phase == ResizePhase.FAILED:
        return f"failed: {adv.why}"
    if adv.phase == ResizePhase.RUNNING:
        log.info("job %s: %s to %d node(s), batch %d running after %.1f s", action.job_id,
                 action.kind, action.nodes, action.batch_size,
                 adv.history.entries[-1][1] - history.started)
    return str(adv.phase)


def _journal(store: Store, d: Drive, out: _Driven) -> None:
    """``out``'s transitions of journal entry ``d.action_id``, in order; one the journal
    refuses (an illegal transition: a bug) is logged with the rest of that action's, which
    then stays in its last journaled phase for the next round."""
    for phase, at, why in out.transitions:
        try:
            store.set_action_phase(d.action_id, phase, error=why or None, at=at)
        except (ValueError, KeyError) as exc:
            log.error("job %s: action %d: %s not journaled (%s)", d.action.job_id,
                      d.action_id, phase, exc)
            return
