"""jobs.min_gpu_count: a job's fewest GPUs when not a whole number of nodes

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

``hpcsub --hpcsched-min-gpus`` below a node's GPUs (or between whole nodes) is kept as
``JobLimits.min_gpu_count`` (a layout may go down to it; ``docs/extensions.md``). Null for every
earlier job: its fewest GPUs are ``min_nodes * workers_per_node``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE, not batch mode: batch mode rebuilds ``jobs`` on SQLite, and dropping the
# parent table deletes every journal row by ON DELETE CASCADE. SQLite has ADD COLUMN, and
# DROP COLUMN since 3.35 (Debian 12 ships 3.40).


def upgrade() -> None:
    op.add_column("jobs", sa.Column("min_gpu_count", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "min_gpu_count")
