"""rollout_work and rollout_results: the store as the rollout queue of asynchronous GRPO (`lanpo worker`)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

The trainer writes one `rollout_work` row per step it wants generated: the step's prompts with their feedback
contexts, drawn from the pool when the work is created (`prompts`), and the newest policy step it had committed
then (`min_policy_step`: a worker serves at least that version). A worker claims the oldest open row with
`FOR UPDATE SKIP LOCKED` (so two workers never take the same one) under a lease it renews while it works
(`lease_until`); a claim whose lease ran out is open again and redone by the next worker (`claims` counts the
takes, so `claims - 1` are redone claims). Every claim draws a fresh `claim_token`, and only the holder of the
current token can finish the row: a worker that lost its lease cannot overwrite the redone claim's result.

`rollout_results` holds a finished row's groups, written once: its key is the work row's, so a redone claim can
never add a second result. The trainer marks the work `used` in the transaction that commits the step it trained
(an uncommitted step leaves it `done`, and `--resume` takes it again, or drops it as too stale), or `dropped` when it
was more than `workers.max_staleness` updates behind (then the same prompts are queued again as the next attempt).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

STATUSES = ("queued", "claimed", "done", "used", "dropped")


def upgrade() -> None:
    op.create_table(
        "rollout_work",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("status", sa.Text(), server_default="queued", nullable=False),
        sa.Column("prompts", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("min_policy_step", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("claimed_by", sa.Text(), nullable=True),
        sa.Column("claim_token", postgresql.UUID(as_uuid=False), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claims", sa.Integer(), server_default="0", nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")", name=op.f("ck_rollout_work_status_valid")
        ),
        sa.CheckConstraint("step >= 1 AND attempt >= 0 AND claims >= 0", name=op.f("ck_rollout_work_counts_valid")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_rollout_work_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_work")),
        sa.UniqueConstraint("run_id", "step", "attempt", name=op.f("uq_rollout_work_run_id_step_attempt")),
    )
    # what a worker's claim scans: the open rows of a run, oldest step first
    op.create_index(
        "ix_rollout_work_open", "rollout_work", ["run_id", "step", "attempt"],
        postgresql_where=sa.text("status IN ('queued', 'claimed')"),
    )  # fmt: skip
    op.create_table(
        "rollout_results",
        sa.Column("work_id", sa.BigInteger(), nullable=False),
        sa.Column("policy_step", sa.Integer(), nullable=False),
        sa.Column("served_sha256", sa.Text(), nullable=True),
        sa.Column("worker", sa.Text(), nullable=False),
        sa.Column("groups", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("seconds", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["work_id"], ["rollout_work.id"], name=op.f("fk_rollout_results_work_id_rollout_work"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("work_id", name=op.f("pk_rollout_results")),
    )


def downgrade() -> None:
    op.drop_table("rollout_results")
    op.drop_index("ix_rollout_work_open", table_name="rollout_work")
    op.drop_table("rollout_work")
