"""experiments: runs compared on purpose

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29

`experiments` names a set of runs (arms x seeds) that share a start, problems, steps and group size, e.g. GRPO
against LANPO; each run may name its experiment and arm (`runs.experiment_id`, `runs.arm`). `lanpo experiment`
fills them and `lanpo report EXPERIMENT` reads them back.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column(
            "config", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.Column("status", sa.Text(), server_default="running", nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("length(btrim(name)) > 0", name=op.f("ck_experiments_name_nonempty")),
        sa.CheckConstraint("status IN ('running', 'finished', 'failed')", name=op.f("ck_experiments_status_valid")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiments")),
        sa.UniqueConstraint("name", name=op.f("uq_experiments_name")),
    )
    op.add_column("runs", sa.Column("experiment_id", sa.BigInteger(), nullable=True))
    op.add_column("runs", sa.Column("arm", sa.Text(), nullable=True))
    op.create_foreign_key(
        op.f("fk_runs_experiment_id_experiments"),
        "runs",
        "experiments",
        ["experiment_id"],
        ["id"],
        ondelete="SET NULL",
    )


def downgrade() -> None:
    op.drop_column("runs", "arm")
    op.drop_column("runs", "experiment_id")  # its foreign key goes with it
    op.drop_table("experiments")
