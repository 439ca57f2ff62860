"""kind 'reform': a new layout through extension allocations, no worker restarted

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

``actions.kind`` admits ``reform`` (:class:`hpcsched.protocol.kinds.ChangeKind`); its
``placement`` holds the target layout as ``node:GPUs`` pairs (``n1:4,n2:2``). Downgrade deletes
``reform`` rows (revision 0002 cannot hold them).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KINDS = ("batch", "shrink", "grow", "pending", "preempt")
NEW_KINDS = (*OLD_KINDS, "reform")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_actions_kind"), type_="check")
        batch_op.create_check_constraint(op.f("ck_actions_kind"), _in("kind", NEW_KINDS))


def downgrade() -> None:
    op.get_bind().execute(sa.text("DELETE FROM actions WHERE kind = 'reform'"))
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_actions_kind"), type_="check")
        batch_op.create_check_constraint(op.f("ck_actions_kind"), _in("kind", OLD_KINDS))
