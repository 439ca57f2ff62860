"""resize phases: actions.status -> actions.phase, its history and placement; kind 'preempt'

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

The journal's statuses named two things "applied" (docs/control-protocol.md: the ack state
means the job runs at the generation). They become the resize's phases
(``hpcsched/daemon/phases.py``): requested, checkpointed, requeued, released, rescheduled,
running, failed. Old rows map ``planned`` and ``applied`` to ``requested`` (the actuator writes
the control generation again only if the job's file does not hold it), ``observed`` to
``running`` and ``failed`` to ``failed``; their ``history`` is rebuilt from ``created_at`` and,
for finished rows, ``updated_at``. ``placement`` keeps a grow's nodes between rounds.
``kind`` admits ``preempt``.

Downgrade maps ``running`` to ``observed``, ``failed`` to ``failed`` and every other phase to
``applied``, and deletes ``preempt`` rows (revision 0001 cannot hold them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KINDS = ("batch", "shrink", "grow", "pending")
NEW_KINDS = ("batch", "shrink", "grow", "pending", "preempt")
OLD_STATUSES = ("planned", "applied", "observed", "failed")
PHASES = ("requested", "checkpointed", "requeued", "released", "rescheduled", "running", "failed")
UP = {"planned": "requested", "applied": "requested", "observed": "running", "failed": "failed"}
DOWN = {"running": "observed", "failed": "failed"}   # any other phase: 'applied'


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index(op.f("ix_actions_job_id_status"))
        batch_op.drop_constraint(op.f("ck_actions_kind"), type_="check")
        batch_op.drop_constraint(op.f("ck_actions_status"), type_="check")
        batch_op.alter_column("status", new_column_name="phase", existing_type=sa.String(16),
                              existing_nullable=False)
        batch_op.add_column(sa.Column("history", sa.Text(), nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("placement", sa.Text(), nullable=False,
                                      server_default=""))

    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, phase, created_at, updated_at FROM actions")).all()
    for id_, status, created, updated in rows:
        phase = UP[status]
        history = [["requested", created]] + ([[phase, updated]] if phase != "requested" else [])
        conn.execute(sa.text("UPDATE actions SET phase = :p, history = :h WHERE id = :i"),
                     {"p": phase, "h": json.dumps(history), "i": id_})

    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.create_check_constraint(op.f("ck_actions_kind"), _in("kind", NEW_KINDS))
        batch_op.create_check_constraint(op.f("ck_actions_phase"), _in("phase", PHASES))
        batch_op.create_index(batch_op.f("ix_actions_job_id_phase"), ["job_id", "phase"],
                              unique=False)


def downgrade() -> None:
    conn = op.get_bind()
    conn.execute(sa.text("DELETE FROM actions WHERE kind = 'preempt'"))
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index(op.f("ix_actions_job_id_phase"))
        batch_op.drop_constraint(op.f("ck_actions_kind"), type_="check")
        batch_op.drop_constraint(op.f("ck_actions_phase"), type_="check")
        batch_op.drop_column("placement")
        batch_op.drop_column("history")
        batch_op.alter_column("phase", new_column_name="status", existing_type=sa.String(16),
                              existing_nullable=False)
    for id_, phase in conn.execute(sa.text("SELECT id, status FROM actions")).all():
        conn.execute(sa.text("UPDATE actions SET status = :s WHERE id = :i"),
                     {"s": DOWN.get(phase, "applied"), "i": id_})
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.create_check_constraint(op.f("ck_actions_kind"), _in("kind", OLD_KINDS))
        batch_op.create_check_constraint(op.f("ck_actions_status"), _in("status", OLD_STATUSES))
        batch_op.create_index(batch_op.f("ix_actions_job_id_status"), ["job_id", "status"],
                              unique=False)
