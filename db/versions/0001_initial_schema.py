"""initial schema: jobs, profile_samples, gpu_measurements, rounds, actions, ingest_offsets

Revision ID: 0001
Revises:
Create Date: 2026-11-21

Times are UTC Unix seconds (floats). SQLite runs these in batch mode (render_as_batch), so
use ``with op.batch_alter_table(...)`` to alter a table. Keep this file as it is: a later schema
change is a new revision (see db/README.md), never an edit here.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ingest_offsets",
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("path", name=op.f("pk_ingest_offsets")),
    )
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("job_uid", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("script", sa.Text(), nullable=False),
        sa.Column("workers_per_node", sa.Integer(), nullable=False),
        sa.Column("min_nodes", sa.Integer(), nullable=False),
        sa.Column("max_nodes", sa.Integer(), nullable=False),
        sa.Column("min_batch_size", sa.Integer(), nullable=False),
        sa.Column("max_batch_size", sa.Integer(), nullable=False),
        sa.Column("max_local_batch_size", sa.Integer(), nullable=True),
        sa.Column("base_batch_size", sa.Integer(), nullable=False),
        sa.Column("lr_scaling", sa.String(length=16), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("submit_time", sa.Float(), nullable=True),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("app_class", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("job_uid", name=op.f("uq_jobs_job_uid")),
    )
    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("duration", sa.Float(), nullable=True),
        sa.Column("policy", sa.String(length=64), nullable=False),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("actions", sa.Integer(), nullable=False),
        sa.Column("slurm_calls", sa.Integer(), nullable=False),
        sa.Column("policy_seconds", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rounds")),
    )
    op.create_table(
        "actions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("from_nodes", sa.Integer(), nullable=False),
        sa.Column("to_nodes", sa.Integer(), nullable=False),
        sa.Column("from_batch_size", sa.Integer(), nullable=False),
        sa.Column("to_batch_size", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("restarts_at_plan", sa.Integer(), nullable=False),
        sa.CheckConstraint("kind IN ('batch', 'shrink', 'grow', 'pending')",
                           name=op.f("ck_actions_kind")),
        sa.CheckConstraint("status IN ('planned', 'applied', 'observed', 'failed')",
                           name=op.f("ck_actions_status")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"], name=op.f("fk_actions_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["round_id"], ["rounds.id"],
                                name=op.f("fk_actions_round_id_rounds"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_actions")),
    )
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_actions_job_id_status"), ["job_id", "status"],
                              unique=False)

    op.create_table(
        "gpu_measurements",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("local_rank", sa.Integer(), nullable=False),
        sa.Column("gpu_index", sa.String(length=32), nullable=True),
        sa.Column("gpu_uuid", sa.String(length=64), nullable=True),
        sa.Column("app_class", sa.String(length=128), nullable=False),
        sa.Column("relative_speed", sa.Float(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.CheckConstraint("steps >= 1", name=op.f("ck_gpu_measurements_steps_positive")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"],
                                name=op.f("fk_gpu_measurements_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_measurements")),
    )
    with op.batch_alter_table("gpu_measurements", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gpu_measurements_app_class_node"),
                              ["app_class", "node"], unique=False)

    op.create_table(
        "profile_samples",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("launch", sa.Integer(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("local_batch_size", sa.Integer(), nullable=False),
        sa.Column("accumulation_steps", sa.Integer(), nullable=False),
        sa.Column("global_batch_size", sa.Integer(), nullable=False),
        sa.Column("step_time", sa.Float(), nullable=False),
        sa.Column("throughput", sa.Float(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.CheckConstraint("steps >= 1", name=op.f("ck_profile_samples_steps_positive")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"],
                                name=op.f("fk_profile_samples_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_profile_samples")),
    )
    with op.batch_alter_table("profile_samples", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_profile_samples_job_id_world_size_local_batch_size"),
                              ["job_id", "world_size", "local_batch_size"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("profile_samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_profile_samples_job_id_world_size_local_batch_size"))
    op.drop_table("profile_samples")
    with op.batch_alter_table("gpu_measurements", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_measurements_app_class_node"))
    op.drop_table("gpu_measurements")
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_actions_job_id_status"))
    op.drop_table("actions")
    op.drop_table("rounds")
    op.drop_table("jobs")
    op.drop_table("ingest_offsets")
