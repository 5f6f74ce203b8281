"""runs.heartbeat_at and runs.owner: a run whose process died is visible as stale, not `running` for ever

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

The process that holds a run (a trainer's rank 0, an SFT run) writes `owner` ("<host>:<pid>") when it starts and
`heartbeat_at = now()` every few seconds while it works (`lanpo.db.heartbeat`). A `running` run whose heartbeat is
older than the stale bound (by the database's clock, so machines with skewed clocks agree), or whose owner's pid is
gone on the owner's own machine, lost its process: `lanpo runs` shows it as stale and `lanpo runs fail` marks it
failed; `--resume` takes it over, and refuses a run whose owner is alive. Both nullable, no default: adding them
rewrites no row, and a run from before this revision reads as one with no heartbeat.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("runs", sa.Column("owner", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "owner")
    op.drop_column("runs", "heartbeat_at")
