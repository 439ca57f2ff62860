"""gpu_probes: each GPU's probe at a job's start (slurm-plugins/prolog-gpu-probe)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

One row per GPU and probe: ``score`` in ``unit`` (TFLOP/s of a CUDA matmul, or GFLOP/s of the
CPU stand-in on nodes without CUDA, ``kind`` telling which), keyed by ``gpu_uuid`` where the
node has one, else by ``node`` and ``gpu_index`` (docs/slurm-plugins.md). ``job_id`` is the Slurm
job whose prolog probed it, any job, so it has no foreign key to ``jobs``. A new table: nothing
earlier changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_probes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("gpu_index", sa.String(length=32), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(length=16), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=True),
        sa.CheckConstraint("score > 0", name=op.f("ck_gpu_probes_score_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_probes")),
    )
    op.create_index(op.f("ix_gpu_probes_node_gpu_index"), "gpu_probes", ["node", "gpu_index"],
                    unique=False)
    op.create_index(op.f("ix_gpu_probes_gpu_uuid"), "gpu_probes", ["gpu_uuid"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_gpu_probes_gpu_uuid"), table_name="gpu_probes")
    op.drop_index(op.f("ix_gpu_probes_node_gpu_index"), table_name="gpu_probes")
    op.drop_table("gpu_probes")
