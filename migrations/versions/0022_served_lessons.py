"""served lessons: scopes, and the feedback a lesson was learned from

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06

`lanpo serve` learns from its traffic (docs/serving.md, "Learning from traffic"): an answer a client marks good
becomes a candidate lesson, summarised by the served model and admitted by the rules and caps training uses. Such a
lesson may belong to a scope (a user, an agent: what the request named), which retrieval honours: a request reads
its scope's lessons and the pool's shared ones, never another scope's.

- `served_answers.scope`: the scope the request named (NULL: none, the pool's shared lessons only).
- `experiences.scope`: the scope a lesson belongs to (NULL: shared by everyone who reads the pool; every lesson a
  trainer writes). A name of 1..128 characters of letters, digits and `._:@-` (the API checks the same).
- `experiences.feedback_id`: the feedback a served lesson was learned from (NULL: not learned from feedback); with
  `source_attempt_id` (the served answer) and the feedback's `key_name`, its provenance. ON DELETE SET NULL, as
  `source_attempt_id`: the lesson outlives its evidence. A partial unique index keeps one lesson per feedback row.
- The serving role's grants do not change: it inserts `served_answers` (every column) and reads `experiences`;
  the lesson itself is written by the server's owner connection (as the embeddings are), since admission may evict.
- Downgrade drops the columns and the index.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

SCOPE_VALID = "scope IS NULL OR scope ~ '^[A-Za-z0-9._:@-]{1,128}$'"


def upgrade() -> None:
    for table in ("served_answers", "experiences"):
        op.add_column(table, sa.Column("scope", sa.Text(), nullable=True))
        op.create_check_constraint(op.f(f"ck_{table}_scope_valid"), table, SCOPE_VALID)
    op.add_column(
        "experiences",
        sa.Column(
            "feedback_id",
            sa.BigInteger(),
            sa.ForeignKey(
                "answer_feedback.id", name=op.f("fk_experiences_feedback_id_answer_feedback"), ondelete="SET NULL"
            ),
            nullable=True,
        ),
    )
    op.create_index(
        "ix_experiences_feedback_id",
        "experiences",
        ["feedback_id"],
        unique=True,
        postgresql_where=sa.text("feedback_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_experiences_feedback_id", table_name="experiences")
    op.drop_column("experiences", "feedback_id")
    for table in ("served_answers", "experiences"):
        op.drop_constraint(op.f(f"ck_{table}_scope_valid"), table, type_="check")
        op.drop_column(table, "scope")
