"""actions.mechanism: how a GPU-granular change is carried out on Slurm

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27

The daemon's GPU-granular plans are made real by one of the mechanisms of
``hpcsched.policies.realise.Mechanism`` (start, extend, release, shrink-primary, requeue), which
reconcile priced the change by. It was journaled as a ``[by <mechanism>]`` suffix of ``reason``;
it is a column now, so ``hpcsched status`` and the store's readers need not parse text. Null for
a change planned at node granularity, and for every earlier row (their reasons keep the suffix).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE, not batch mode (as 0004): batch mode would rebuild ``actions`` on SQLite.


def upgrade() -> None:
    op.add_column("actions", sa.Column("mechanism", sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.drop_column("actions", "mechanism")
