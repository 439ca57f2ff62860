"""daemon_lease: one daemon per cluster, across login nodes

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28

A daemon held a lock file on its own host, so two login nodes could each run a daemon on the
same jobs. The lease lives in the store both would share: the daemon that holds it (until
``expires_at``, renewed every round) runs rounds; any other waits as a standby and takes the
lease over once it lapses (``hpcsched/daemon/store/lease.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "daemon_lease",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("holder", sa.String(length=256), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
        sa.Column("renewed_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_daemon_lease")),
    )


def downgrade() -> None:
    op.drop_table("daemon_lease")
