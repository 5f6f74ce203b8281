"""experience store

Revision ID: 0001
Revises:
Create Date: 2026-11-29

The data model of ARCHITECTURE.md: runs, policy versions and committed steps; problems; attempts and
what was injected into their prompts; experiences with immutable versions; relevance scores; metrics.
Embedding columns are vector(d) with d = LANPO_EMBEDDING_DIM (default 384) at upgrade time.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

from lanpo.config import default_embedding_dim

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

DIM = default_embedding_dim()

# experience_versions are immutable: a rewrite appends a version. Only a missing embedding may be filled in.
IMMUTABLE_VERSIONS = """
CREATE FUNCTION lanpo_experience_versions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.experience_id, NEW.version, NEW.summary, NEW.author, NEW.policy_version_id, NEW.prompt_version,
        NEW.created_at) IS DISTINCT FROM (OLD.experience_id, OLD.version, OLD.summary, OLD.author,
        OLD.policy_version_id, OLD.prompt_version, OLD.created_at)
       OR (OLD.embedding IS NOT NULL AND NEW.embedding IS DISTINCT FROM OLD.embedding) THEN
        RAISE EXCEPTION 'experience_versions are immutable (id %): append a new version instead', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER experience_versions_immutable BEFORE UPDATE ON experience_versions
    FOR EACH ROW EXECUTE FUNCTION lanpo_experience_versions_immutable();
"""


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table(
        "problems",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("dataset", sa.Text(), nullable=False),
        sa.Column("external_id", sa.Text(), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column(
            "metadata", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.Column("embedding", Vector(DIM), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("length(btrim(dataset)) > 0", name=op.f("ck_problems_dataset_nonempty")),
        sa.CheckConstraint("length(btrim(external_id)) > 0", name=op.f("ck_problems_external_id_nonempty")),
        sa.CheckConstraint("length(btrim(question)) > 0", name=op.f("ck_problems_question_nonempty")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_problems")),
        sa.UniqueConstraint("dataset", "external_id", name=op.f("uq_problems_dataset_external_id")),
    )
    op.create_index(
        "ix_problems_embedding_hnsw",
        "problems",
        ["embedding"],
        unique=False,
        postgresql_using="hnsw",
        postgresql_ops={"embedding": "vector_cosine_ops"},
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column(
            "config", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), server_default="running", nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "kind IN ('train', 'sft', 'eval', 'infer', 'import', 'bench')", name=op.f("ck_runs_kind_valid")
        ),
        sa.CheckConstraint("status IN ('running', 'finished', 'failed')", name=op.f("ck_runs_status_valid")),
        sa.CheckConstraint("length(btrim(name)) > 0", name=op.f("ck_runs_name_nonempty")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("name", name=op.f("uq_runs_name")),
    )
    op.create_table(
        "policy_versions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("adapter_sha256", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("adapter_sha256 ~ '^[0-9a-f]{64}$'", name=op.f("ck_policy_versions_sha256_hex")),
        sa.CheckConstraint("step >= 0", name=op.f("ck_policy_versions_step_nonnegative")),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_policy_versions_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_versions")),
        sa.UniqueConstraint("run_id", "step", name=op.f("uq_policy_versions_run_id_step")),
    )
    op.create_table(
        "run_metrics",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.CheckConstraint("length(btrim(name)) > 0", name=op.f("ck_run_metrics_name_nonempty")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_metrics_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "step", "name", name=op.f("pk_run_metrics")),
    )
    op.create_table(
        "attempts",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=True),
        sa.Column("problem_id", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("policy_version_id", sa.BigInteger(), nullable=True),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("prompt_version", sa.Text(), nullable=True),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("correct", sa.Boolean(), nullable=True),
        sa.Column("format_ok", sa.Boolean(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "mode IN ('zero_shot', 'intra', 'inter', 'self_correct', 'retrieval')", name=op.f("ck_attempts_mode_valid")
        ),
        sa.CheckConstraint(
            "reward IS NULL OR reward NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)",
            name=op.f("ck_attempts_reward_finite"),
        ),
        sa.CheckConstraint(
            "completion_tokens IS NULL OR completion_tokens >= 0", name=op.f("ck_attempts_completion_tokens_nonneg")
        ),
        sa.CheckConstraint(
            "prompt_tokens IS NULL OR prompt_tokens >= 0", name=op.f("ck_attempts_prompt_tokens_nonnegative")
        ),
        sa.ForeignKeyConstraint(
            ["policy_version_id"], ["policy_versions.id"], name=op.f("fk_attempts_policy_version_id_policy_versions")
        ),
        sa.ForeignKeyConstraint(
            ["problem_id"], ["problems.id"], name=op.f("fk_attempts_problem_id_problems"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_attempts_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
    )
    op.create_index(
        "ix_attempts_problem_recent",
        "attempts",
        ["problem_id", sa.literal_column("created_at DESC"), sa.literal_column("id DESC")],
        unique=False,
    )
    op.create_index("ix_attempts_run_step", "attempts", ["run_id", "step"], unique=False)
    op.create_table(
        "run_steps",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("policy_version_id", sa.BigInteger(), nullable=True),
        sa.Column("checkpoint", sa.Text(), nullable=True),
        sa.Column("committed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("step >= 0", name=op.f("ck_run_steps_step_nonnegative")),
        sa.ForeignKeyConstraint(
            ["policy_version_id"], ["policy_versions.id"], name=op.f("fk_run_steps_policy_version_id_policy_versions")
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_steps_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "step", name=op.f("pk_run_steps")),
    )
    op.create_table(
        "experiences",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("problem_id", sa.BigInteger(), nullable=False),
        sa.Column("source_attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.Text(), server_default="summary", nullable=False),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("run_id", sa.BigInteger(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("evicted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("evicted_by", sa.Text(), nullable=True),
        sa.CheckConstraint("kind IN ('summary', 'reflection', 'meta')", name=op.f("ck_experiences_kind_valid")),
        sa.CheckConstraint(
            "reward IS NULL OR reward NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)",
            name=op.f("ck_experiences_reward_finite"),
        ),
        sa.CheckConstraint(
            "(evicted_at IS NULL) = (evicted_by IS NULL)", name=op.f("ck_experiences_eviction_complete")
        ),
        sa.ForeignKeyConstraint(
            ["problem_id"], ["problems.id"], name=op.f("fk_experiences_problem_id_problems"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_experiences_run_id_runs"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(
            ["source_attempt_id"],
            ["attempts.id"],
            name=op.f("fk_experiences_source_attempt_id_attempts"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiences")),
    )
    op.create_index(
        "ix_experiences_active_created",
        "experiences",
        ["created_at", "id"],
        unique=False,
        postgresql_where=sa.text("evicted_at IS NULL"),
    )
    op.create_index(
        "ix_experiences_pool",
        "experiences",
        ["problem_id", sa.literal_column("created_at DESC"), sa.literal_column("id DESC")],
        unique=False,
        postgresql_where=sa.text("evicted_at IS NULL"),
    )
    op.create_table(
        "experience_versions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("experience_id", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("embedding", Vector(DIM), nullable=True),
        sa.Column("author", sa.Text(), nullable=True),
        sa.Column("policy_version_id", sa.BigInteger(), nullable=True),
        sa.Column("prompt_version", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("length(btrim(summary)) > 0", name=op.f("ck_experience_versions_summary_nonempty")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_experience_versions_version_positive")),
        sa.ForeignKeyConstraint(
            ["experience_id"],
            ["experiences.id"],
            name=op.f("fk_experience_versions_experience_id_experiences"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["policy_version_id"],
            ["policy_versions.id"],
            name=op.f("fk_experience_versions_policy_version_id_policy_versions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experience_versions")),
        sa.UniqueConstraint("experience_id", "version", name=op.f("uq_experience_versions_experience_id_version")),
    )
    op.create_index(
        "ix_experience_versions_embedding_hnsw",
        "experience_versions",
        ["embedding"],
        unique=False,
        postgresql_using="hnsw",
        postgresql_ops={"embedding": "vector_cosine_ops"},
    )
    op.create_table(
        "attempt_contexts",
        sa.Column("attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("experience_version_id", sa.BigInteger(), nullable=True),
        sa.Column("context_attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("score", sa.Double(), nullable=True),
        sa.CheckConstraint(
            "num_nonnulls(experience_version_id, context_attempt_id) = 1", name=op.f("ck_attempt_contexts_one_source")
        ),
        sa.CheckConstraint("position >= 0", name=op.f("ck_attempt_contexts_position_nonnegative")),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_attempt_contexts_attempt_id_attempts"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["context_attempt_id"], ["attempts.id"], name=op.f("fk_attempt_contexts_context_attempt_id_attempts")
        ),
        sa.ForeignKeyConstraint(
            ["experience_version_id"],
            ["experience_versions.id"],
            name=op.f("fk_attempt_contexts_experience_version_id_experience_versions"),
        ),
        sa.PrimaryKeyConstraint("attempt_id", "position", name=op.f("pk_attempt_contexts")),
    )
    op.create_index(
        "ix_attempt_contexts_experience_version_id", "attempt_contexts", ["experience_version_id"], unique=False
    )
    op.create_table(
        "relevance_scores",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("problem_id", sa.BigInteger(), nullable=False),
        sa.Column("candidate_problem_id", sa.BigInteger(), nullable=True),
        sa.Column("candidate_version_id", sa.BigInteger(), nullable=True),
        sa.Column("scorer", sa.Text(), nullable=False),
        sa.Column("score", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "candidate_problem_id IS DISTINCT FROM problem_id", name=op.f("ck_relevance_scores_not_self")
        ),
        sa.CheckConstraint("length(btrim(scorer)) > 0", name=op.f("ck_relevance_scores_scorer_nonempty")),
        sa.CheckConstraint(
            "num_nonnulls(candidate_problem_id, candidate_version_id) = 1",
            name=op.f("ck_relevance_scores_one_candidate"),
        ),
        sa.CheckConstraint("score >= 0 AND score <= 1", name=op.f("ck_relevance_scores_score_unit_interval")),
        sa.ForeignKeyConstraint(
            ["candidate_problem_id"],
            ["problems.id"],
            name=op.f("fk_relevance_scores_candidate_problem_id_problems"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["candidate_version_id"],
            ["experience_versions.id"],
            name=op.f("fk_relevance_scores_candidate_version_id_experience_versions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["problem_id"], ["problems.id"], name=op.f("fk_relevance_scores_problem_id_problems"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_relevance_scores")),
    )
    op.create_index(
        "ix_relevance_scores_lookup",
        "relevance_scores",
        ["problem_id", "scorer", sa.literal_column("score DESC")],
        unique=False,
    )
    op.create_index(
        "uq_relevance_scores_problem_pair",
        "relevance_scores",
        ["problem_id", "candidate_problem_id", "scorer"],
        unique=True,
        postgresql_where=sa.text("candidate_problem_id IS NOT NULL"),
    )
    op.create_index(
        "uq_relevance_scores_version_pair",
        "relevance_scores",
        ["problem_id", "candidate_version_id", "scorer"],
        unique=True,
        postgresql_where=sa.text("candidate_version_id IS NOT NULL"),
    )
    op.create_index("ix_problems_dataset", "problems", ["dataset"], unique=False)
    op.execute(IMMUTABLE_VERSIONS)


def downgrade() -> None:
    # Dropping a table drops its indexes and triggers; the vector extension stays (other schemas may use it).
    for table in (
        "relevance_scores",
        "attempt_contexts",
        "experience_versions",
        "experiences",
        "run_steps",
        "attempts",
        "run_metrics",
        "policy_versions",
        "runs",
        "problems",
    ):
        op.drop_table(table)
    op.execute("DROP FUNCTION lanpo_experience_versions_immutable()")
