"""judge_cache: the relevance judge's score of a question text against a lesson version, kept per judge

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06

Retrieval with a judge (`lanpo serve`, `lanpo infer --mode retrieval`) prefills one judgement prompt per stage-1
candidate of every question: on two cores that is most of what retrieval adds to a request's latency. A question
asked again, against the same lesson versions by the same judge, gets the same scores: `judge_cache` keeps them, so
only the pairs it lacks reach the engine. `relevance_scores` caches pairs of stored problems; a served question is
keyed by its text instead, since it reaches retrieval before (or without) becoming a problem.

- `judge_cache`: (question_sha256, scorer, version_id) -> score in [0, 1], created_at. `question_sha256` is the
  sha256 of the question's text (32 bytes); `scorer` the judge's identity as `relevance_scores.scorer` holds it
  (`lanpo.retrieval.judge.JudgePrompt.identity`: model id with the served adapter's hash, prompt version, and the
  text limit when not the default), so other weights or another prompt never read these scores. The primary key
  leads with the question and the scorer, the order a look-up reads; a row goes with its lesson version (ON DELETE
  CASCADE, indexed by `version_id`). Nothing else removes rows: a version's scores stay valid while it exists
  (versions are immutable).
- The serving role (migration 0014) may SELECT and INSERT it (a miss is written with ON CONFLICT DO NOTHING); it
  may not update or delete a score. The reader role reads it through 0004's default privileges.
- Downgrade drops the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# the serving role, when 0014 (or an administrator since) created it
SERVE_ROLE = (
    "SELECT s.role_name FROM lanpo_private.serve_login s JOIN pg_catalog.pg_roles r ON r.rolname = s.role_name"
)


def upgrade() -> None:
    op.create_table(
        "judge_cache",
        sa.Column("question_sha256", sa.LargeBinary(), nullable=False),
        sa.Column("scorer", sa.Text(), nullable=False),
        sa.Column("version_id", sa.BigInteger(), nullable=False),
        sa.Column("score", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("octet_length(question_sha256) = 32", name=op.f("ck_judge_cache_question_sha256_length")),
        sa.CheckConstraint("length(btrim(scorer)) > 0", name=op.f("ck_judge_cache_scorer_nonempty")),
        sa.CheckConstraint("score >= 0 AND score <= 1", name=op.f("ck_judge_cache_score_unit_interval")),
        sa.ForeignKeyConstraint(["version_id"], ["experience_versions.id"],
                                name=op.f("fk_judge_cache_version_id_experience_versions"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("question_sha256", "scorer", "version_id", name=op.f("pk_judge_cache")),
    )  # fmt: skip
    op.create_index("ix_judge_cache_version_id", "judge_cache", ["version_id"])  # a version's delete cascades by it
    bind = op.get_bind()
    role = bind.scalar(sa.text(SERVE_ROLE))
    if role:
        op.execute(f"GRANT SELECT, INSERT ON judge_cache TO {bind.dialect.identifier_preparer.quote(role)}")


def downgrade() -> None:
    op.drop_table("judge_cache")
