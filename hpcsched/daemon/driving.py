"""A round's resize steps, side by side, their journal entries in one commit.

Every step of an action (:meth:`hpcsched.daemon.actuator.Actuator.advance`) acts on its own job
only: it writes that job's control file and may run one or two Slurm commands for it
(``scontrol update`` of a pending job's size or start time, ``scontrol requeue``). Taken one after another, a
round's steps wait for slurmctld in turn: on the 1,024-GPU dev cluster, with slurmctld's
backfill holding its locks, ten ``scontrol update`` took 1-2.6 s each and 25.7 s together
(``docs/daemon.md``, "At scale"). :func:`drive_all` takes them on up to :data:`STEP_THREADS`
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

Nothing here touches the store from a thread: the threads run the steps, the caller's thread
writes the journal.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
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


def drive_all(actuator: Actuator, store: Store, drives: list[Drive]) -> list[str]:
    """Take one step of each of ``drives`` (different jobs), up to :data:`STEP_THREADS` at
    once, then journal their transitions in one transaction.

    Returns each drive's outcome, in order: the phase its action reached, ``failed: <why>``, or
    ``interrupted`` (Slurm did not answer an effect: the transitions observed before it are
    journaled, the step itself is not, and the next round takes it again).

    Raises:
        Exception: what a step raised that is not Slurm's (a bug), once every other step is
            done and every transition journaled.
    """
    done = [_Driven() for _ in drives]
    if len(drives) > 1:
        with ThreadPoolExecutor(min(STEP_THREADS, len(drives)),
                                thread_name_prefix="hpcsched-step") as pool:
            list(pool.map(lambda i: _step(actuator, drives[i], done[i]), range(len(drives))))
    else:
        for d, out in zip(drives, done):
            _step(actuator, d, out)
    if any(out.transitions for out in done):   # no write transaction (its lock) for none
        with store.batch():
            for d, out in zip(drives, done):
                _journal(store, d, out)
    for out in done:
        if out.error is not None:
            raise out.error
    return [out.outcome for out in done]


def _step(actuator: Actuator, d: Drive, out: _Driven) -> None:
    """One step of ``d`` into ``out`` (never raises: an error is kept for :func:`drive_all`)."""
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
    except Exception as exc:  # noqa: BLE001 - raised by drive_all once the others are journaled
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
