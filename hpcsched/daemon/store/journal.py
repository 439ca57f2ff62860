"""The journal of resizes: one row per action, its phase and the history of its phases.

An action is journaled ``requested`` and committed before the daemon touches anything
(:meth:`JournalMixin.plan_action`), then moved along
:data:`~hpcsched.daemon.phases.TRANSITIONS` one committed transition at a time
(:meth:`JournalMixin.set_action_phase`), each appended with its time to ``history``. A daemon
killed at any point resumes every action that is not ``running`` or ``failed`` from its
journaled phase (:meth:`JournalMixin.open_actions`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select

from hpcsched.daemon.phases import IllegalTransition, ResizePhase, check_transition
from hpcsched.daemon.store.lists import among
from hpcsched.daemon.store.rows import (
    ActionRow,
    action_row,
    check_keys,
    columns,
    require,
)
from hpcsched.daemon.store.schema import ACTION_KINDS, OPEN_ACTION_PHASES, Action

_ACTION_REQUIRED = ("job_id", "kind", "generation", "from_nodes", "to_nodes",
                    "from_batch_size", "to_batch_size")


class JournalMixin:
    """The journal's methods of :class:`~hpcsched.daemon.store.Store` (which provides
    ``_read`` and ``_write`` sessions)."""

    def plan_action(self, **fields: Any) -> int:
        """Journal an action as ``requested`` and commit it; returns its id.

        Fields: ``job_id``, ``kind`` (batch|shrink|grow|pending|preempt), ``generation`` (the
        control generation the action writes), ``from_nodes``, ``to_nodes``,
        ``from_batch_size``, ``to_batch_size`` (samples); optional ``round_id``, ``reason``,
        ``restarts_at_plan`` (the job's Slurm restart count now, default 0), ``placement``
        (node names to start on, or a layout's ``node:gpus``), ``mechanism`` (a GPU-granular
        change's, :class:`hpcsched.policies.realise.Mechanism`), ``created_at`` (Unix s,
        default now).
        The row is committed when this returns: act only after that.

        Raises:
            TypeError: an unknown field (``phase``, ``history``: a new action is requested).
            ValueError: a missing field, or an unknown kind.
        """
        check_keys("plan_action", fields,
                   columns(Action) - {"id", "phase", "error", "updated_at", "history"})
        require("plan_action", fields, _ACTION_REQUIRED)
        if fields["kind"] not in ACTION_KINDS:
            raise ValueError(f"plan_action: kind must be one of {'|'.join(ACTION_KINDS)}, "
                             f"got {fields['kind']!r}")
        fields = {"reason": "", "restarts_at_plan": 0, "created_at": time.time(), **fields}
        fields["kind"] = str(fields["kind"])
        if fields.get("mechanism") is not None:
            fields["mechanism"] = str(fields["mechanism"])
        fields["placement"] = ",".join(fields.get("placement") or ())
        fields["updated_at"] = fields["created_at"]
        history = [[ResizePhase.REQUESTED.value, fields["created_at"]]]
        with self._write() as s:
            a = Action(phase=ResizePhase.REQUESTED.value, history=json.dumps(history), **fields)
            s.add(a)
            s.flush()
            return a.id

    def set_action_phase(self, action_id: int, phase: str, error: str | None = None,
                         *, at: float | None = None) -> None:
        """Move an action to ``phase`` (a legal transition of
        :data:`~hpcsched.daemon.phases.TRANSITIONS`) and append it to the history.

        ``error`` is recorded (for ``failed``); ``at`` (Unix s, default now) is the time of the
        transition and ``updated_at``.

        Raises:
            ValueError: an unknown phase or an illegal transition (nothing changes).
            KeyError: no action ``action_id``.
        """
        now = time.time() if at is None else at
        with self._write() as s:
            a = s.get(Action, action_id)
            if a is None:
                raise KeyError(f"no action {action_id}")
            try:
                check_transition(a.phase, phase)
            except IllegalTransition as exc:
                raise ValueError(f"action {action_id}: {exc}") from None
            a.phase = ResizePhase(phase).value
            a.history = json.dumps(json.loads(a.history or "[]") + [[a.phase, now]])
            if error is not None:
                a.error = error
            a.updated_at = now

    def open_actions(self, job_id: str | None = None) -> list[ActionRow]:
        """Actions neither ``running`` nor ``failed`` (of one job, or all), oldest first: what
        a restarted daemon must carry on."""
        q = select(Action).where(Action.phase.in_(OPEN_ACTION_PHASES)).order_by(Action.id)
        if job_id is not None:
            q = q.where(Action.job_id == job_id)
        with self._read() as s:
            return [action_row(a) for a in s.scalars(q)]

    def recent_actions(self, job_ids: Iterable[str], limit: int = 10) -> dict[str, list[ActionRow]]:
        """The latest ``limit`` actions of each job of ``job_ids``, newest first (as
        :meth:`actions` per job), in one query; a job without any is absent."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        rank = func.row_number().over(partition_by=Action.job_id, order_by=Action.id.desc()).label("rank")
        inner = select(Action.id, rank).where(among(Action.job_id, ids)).subquery()
        q = (select(Action).join(inner, inner.c.id == Action.id).where(inner.c.rank <= limit)
             .order_by(Action.job_id, Action.id.desc()))
        out: dict[str, list[ActionRow]] = {}
        with self._read() as s:
            for a in s.scalars(q):
                out.setdefault(a.job_id, []).append(action_row(a))
        return out

    def actions(self, job_id: str | None = None, limit: int = 50) -> list[ActionRow]:
        """The latest ``limit`` actions (of one job, or all), newest first."""
        q = select(Action).order_by(Action.id.desc()).limit(limit)
        if job_id is not None:
            q = q.where(Action.job_id == job_id)
        with self._read() as s:
            return [action_row(a) for a in s.scalars(q)]
