"""experiences.evicted_run_id and experiences.evicted_step: which run's step evicted an experience

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04

A pool's caps evict inside the transaction of the step that inserted (`lanpo.db.repo.capacity`); these columns
name that step, so a resume from a checkpoint older than the last committed step (`checkpoint.every` > 1) can undo
exactly the evictions of the steps it rolls back (`lanpo.db.repo.steps.rollback_uncommitted`) and the step after
the checkpoint draws from the pool as it stood after it. `evicted_at` / `evicted_by` keep saying when and why.
Both nullable, no default: adding them rewrites no row; an eviction from before this revision, or one no training
step made (an import, `add_evicted`), names no step. The partial index serves the rollback's lookup by run and step.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("experiences", sa.Column("evicted_run_id", sa.BigInteger(), nullable=True))
    op.add_column("experiences", sa.Column("evicted_step", sa.Integer(), nullable=True))
    op.create_foreign_key(
        op.f("fk_experiences_evicted_run_id_runs"), "experiences", "runs", ["evicted_run_id"], ["id"],
        ondelete="SET NULL",
    )  # fmt: skip
    op.create_index(
        "ix_experiences_evicted_step", "experiences", ["evicted_run_id", "evicted_step"],
        postgresql_where=sa.text("evicted_run_id IS NOT NULL"),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_experiences_evicted_step", table_name="experiences")
    op.drop_constraint(op.f("fk_experiences_evicted_run_id_runs"), "experiences", type_="foreignkey")
    op.drop_column("experiences", "evicted_step")
    op.drop_column("experiences", "evicted_run_id")
