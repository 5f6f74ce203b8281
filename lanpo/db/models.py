"""SQLAlchemy 2.0 models of the experience store (ARCHITECTURE.md, "Data model").

The migrations in `migrations/versions/` carry the DDL; a test proves these models and the
migrations do not drift. Embedding columns are `vector(d)` with d from `LANPO_EMBEDDING_DIM`
(default 384) when the schema is created.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from lanpo.config import EVICTION_POLICIES, MERGE_KEEPS, default_embedding_dim
from lanpo.db.models_base import SCOPE_VALID, Base, _finite, _in, _nonempty, _nonnegative_finite, _unset_or

EMBEDDING_DIM = default_embedding_dim()

ATTEMPT_MODES = (
    "zero_shot", "intra", "inter", "leaked_intra", "self_correct", "retrieval", "val", "replay", "replayed"
)  # fmt: skip
EXPERIENCE_KINDS = ("summary", "reflection", "meta")
# experience_versions.reason: a lesson's first version, a rewrite, or a near-duplicate merged in (store.merge_keeps)
VERSION_REASONS = ("new", "rewrite", "merge:newer", "merge:higher_reward")
RUN_KINDS = ("train", "sft", "eval", "infer", "import", "bench", "serve")
RUN_STATUSES = ("running", "finished", "failed")
# rollout_groups.dropped: why a trainer dropped a group it never trained (verl's async sampler: too many policy
# versions behind, no reward spread, a failed session)
DROP_REASONS = ("stale", "filtered", "failed")


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        sa.CheckConstraint(_nonempty("name"), name="name_nonempty"),
        sa.CheckConstraint(_in("kind", RUN_KINDS), name="kind_valid"),
        sa.CheckConstraint(_in("status", RUN_STATUSES), name="status_valid"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(sa.Text, unique=True)
    kind: Mapped[str] = mapped_column(sa.Text)
    config: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=sa.text("'{}'::jsonb"))
    model: Mapped[str | None] = mapped_column(sa.Text)
    status: Mapped[str] = mapped_column(sa.Text, server_default="running")
    pool_id: Mapped[int | None] = mapped_column(sa.ForeignKey("pools.id"))  # the pool it reads and writes
    experiment_id: Mapped[int | None] = mapped_column(sa.ForeignKey("experiments.id", ondelete="SET NULL"))
    arm: Mapped[str | None] = mapped_column(sa.Text)  # the experiment arm it runs (e.g. grpo, lanpo-both)
    started_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    # the process that holds the run ("<host>:<pid>") and its last sign of life (lanpo.db.heartbeat)
    owner: Mapped[str | None] = mapped_column(sa.Text)
    heartbeat_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


class Experiment(Base):
    """Runs compared on purpose: arms x seeds on the same start, problems, steps and group size."""

    __tablename__ = "experiments"
    __table_args__ = (
        sa.CheckConstraint(_nonempty("name"), name="name_nonempty"),
        sa.CheckConstraint(_in("status", RUN_STATUSES), name="status_valid"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(sa.Text, unique=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=sa.text("'{}'::jsonb"))
    status: Mapped[str] = mapped_column(sa.Text, server_default="running")
    started_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


class Pool(Base):
    """A named experience pool with its capacity settings; runs read and write their own (shared on purpose)."""

    __tablename__ = "pools"
    __table_args__ = (
        sa.CheckConstraint(_nonempty("name"), name="name_nonempty"),
        sa.CheckConstraint("per_problem_cap >= 1", name="per_problem_cap_positive"),
        sa.CheckConstraint("per_step_cap >= 1", name="per_step_cap_positive"),
        sa.CheckConstraint("global_cap IS NULL OR global_cap >= 1", name="global_cap_positive"),
        sa.CheckConstraint(_in("eviction", EVICTION_POLICIES), name="eviction_valid"),
        sa.CheckConstraint("min_uses >= 1", name="min_uses_positive"),
        sa.CheckConstraint(_unset_or("merge_threshold", "> 0", "<= 1"), name="merge_threshold_range"),
        sa.CheckConstraint(_in("merge_keeps", MERGE_KEEPS), name="merge_keeps_valid"),
        sa.CheckConstraint("max_policy_age IS NULL OR max_policy_age >= 1", name="max_policy_age_positive"),
        sa.CheckConstraint(_nonnegative_finite("baseline_half_life"), name="baseline_half_life_range"),
        sa.CheckConstraint(_nonnegative_finite("baseline_prior"), name="baseline_prior_range"),
        sa.CheckConstraint(_unset_or("retire_below", "> -1", "<= 1"), name="retire_below_range"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(sa.Text, unique=True)
    per_problem_cap: Mapped[int] = mapped_column(sa.Integer)
    per_step_cap: Mapped[int] = mapped_column(sa.Integer)
    global_cap: Mapped[int | None] = mapped_column(sa.Integer)
    eviction: Mapped[str] = mapped_column(sa.Text)
    # lessons that live (migrations 0015, 0018; lanpo.config.StoreConfig says what each does)
    min_uses: Mapped[int] = mapped_column(sa.Integer, server_default="4")
    merge_threshold: Mapped[float | None] = mapped_column(sa.Double)
    merge_keeps: Mapped[str] = mapped_column(sa.Text, server_default="newer")
    max_policy_age: Mapped[int | None] = mapped_column(sa.Integer)
    baseline_half_life: Mapped[float] = mapped_column(sa.Double, server_default="2")
    baseline_prior: Mapped[float] = mapped_column(sa.Double, server_default="2")
    retire_below: Mapped[float | None] = mapped_column(sa.Double)  # retired:harmful below this lift bound
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class PolicyVersion(Base):
    """Which weights produced a row: (run, step) -> adapter sha256 (and the merged weights served for it)."""

    __tablename__ = "policy_versions"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "step"),
        sa.CheckConstraint("step >= 0", name="step_nonnegative"),
        sa.CheckConstraint("adapter_sha256 ~ '^[0-9a-f]{64}$'", name="sha256_hex"),
        sa.CheckConstraint("served_sha256 IS NULL OR served_sha256 ~ '^[0-9a-f]{64}$'", name="served_sha256_hex"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(sa.Integer)
    adapter_sha256: Mapped[str] = mapped_column(sa.Text)
    # the vLLM engine's weights when not the version's own (LoRA merged into the base); NULL: its own (migration 0010)
    served_sha256: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class RunStep(Base):
    """A committed training step: written last in the step's transaction, it ties a checkpoint to the rows."""

    __tablename__ = "run_steps"
    __table_args__ = (sa.CheckConstraint("step >= 0", name="step_nonnegative"),)

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    policy_version_id: Mapped[int | None] = mapped_column(sa.ForeignKey("policy_versions.id"))
    checkpoint: Mapped[str | None] = mapped_column(sa.Text)
    committed_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class Problem(Base):
    __tablename__ = "problems"
    __table_args__ = (
        sa.UniqueConstraint("dataset", "external_id"),
        sa.Index("ix_problems_dataset", "dataset"),
        sa.CheckConstraint(_nonempty("dataset"), name="dataset_nonempty"),
        sa.CheckConstraint(_nonempty("external_id"), name="external_id_nonempty"),
        sa.CheckConstraint(_nonempty("question"), name="question_nonempty"),
        sa.Index(
            "ix_problems_embedding_hnsw",
            "embedding",
            postgresql_using="hnsw",
            postgresql_ops={"embedding": "vector_cosine_ops"},
        ),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    dataset: Mapped[str] = mapped_column(sa.Text)
    external_id: Mapped[str] = mapped_column(sa.Text)
    question: Mapped[str] = mapped_column(sa.Text)
    answer: Mapped[str | None] = mapped_column(sa.Text)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, server_default=sa.text("'{}'::jsonb"))
    embedding: Mapped[Any | None] = mapped_column(Vector(EMBEDDING_DIM))
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class RolloutGroup(Base):
    """One prompt and the n rollouts (attempts) generated from it: the context it carried is stored once, here."""

    __tablename__ = "rollout_groups"
    __table_args__ = (
        sa.CheckConstraint(_in("mode", ATTEMPT_MODES), name="mode_valid"),
        sa.CheckConstraint("step IS NULL OR step >= 0", name="step_nonnegative"),
        sa.CheckConstraint("prompt_tokens IS NULL OR prompt_tokens >= 0", name="prompt_tokens_nonnegative"),
        sa.Index("ix_rollout_groups_problem_recent", "problem_id", sa.text("created_at DESC"), sa.text("id DESC")),
        sa.Index("ix_rollout_groups_run_step", "run_id", "step"),
        # migration 0023: a trainer's own name for the group, once a run; why a trainer dropped it
        sa.Index(
            "ix_rollout_groups_trainer_uid",
            "run_id",
            "trainer_uid",
            unique=True,
            postgresql_where=sa.text("trainer_uid IS NOT NULL"),
        ),
        sa.CheckConstraint(f"dropped IS NULL OR {_in('dropped', DROP_REASONS)}", name="dropped_valid"),
        sa.CheckConstraint("dropped IS NULL OR consumed_step IS NOT NULL", name="dropped_when_consumed"),
        sa.CheckConstraint("consumed_step IS NULL OR consumed_step >= 0", name="consumed_step_nonnegative"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    run_id: Mapped[int | None] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    problem_id: Mapped[int] = mapped_column(sa.ForeignKey("problems.id", ondelete="CASCADE"))
    step: Mapped[int | None] = mapped_column(sa.Integer)
    policy_version_id: Mapped[int | None] = mapped_column(sa.ForeignKey("policy_versions.id"))
    mode: Mapped[str] = mapped_column(sa.Text)
    prompt: Mapped[str] = mapped_column(sa.Text)
    prompt_version: Mapped[str | None] = mapped_column(sa.Text)
    prompt_tokens: Mapped[int | None] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
    trainer_uid: Mapped[str | None] = mapped_column(sa.Text)  # the trainer's name for it (verl's uid)
    consumed_step: Mapped[int | None] = mapped_column(sa.Integer)  # the step that trained or dropped it
    dropped: Mapped[str | None] = mapped_column(sa.Text)  # why (DROP_REASONS); NULL: trained, or not consumed yet


class Attempt(Base):
    """One rollout of a group: the response and its grade; run, problem, step and mode are its group's."""

    __tablename__ = "attempts"
    __table_args__ = (
        sa.CheckConstraint(_finite("reward"), name="reward_finite"),
        sa.CheckConstraint("completion_tokens IS NULL OR completion_tokens >= 0", name="completion_tokens_nonneg"),
        sa.CheckConstraint(
            "served_adapter_sha256 IS NULL OR served_adapter_sha256 ~ '^[0-9a-f]{64}$'", name="served_sha256_hex"
        ),
        sa.Index("ix_attempts_group_id", "group_id", "id"),
        sa.Index("ix_attempts_replay_of", "replay_of", postgresql_where=sa.text("replay_of IS NOT NULL")),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    group_id: Mapped[int] = mapped_column(sa.ForeignKey("rollout_groups.id", ondelete="CASCADE"))
    response: Mapped[str] = mapped_column(sa.Text)
    reward: Mapped[float | None] = mapped_column(sa.Double)
    correct: Mapped[bool | None] = mapped_column(sa.Boolean)
    format_ok: Mapped[bool | None] = mapped_column(sa.Boolean)
    completion_tokens: Mapped[int | None] = mapped_column(sa.Integer)
    served_adapter_sha256: Mapped[str | None] = mapped_column(sa.Text)  # the adapter the backend served it with
    replay_of: Mapped[int | None] = mapped_column(sa.ForeignKey("attempts.id", ondelete="SET NULL"))  # its source
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
    # migration 0023: the weights of its first and last segments under partial rollout (NULL: its group's version)
    first_policy_version_id: Mapped[int | None] = mapped_column(sa.ForeignKey("policy_versions.id"))
    last_policy_version_id: Mapped[int | None] = mapped_column(sa.ForeignKey("policy_versions.id"))


class Experience(Base):
    __tablename__ = "experiences"
    __table_args__ = (
        sa.CheckConstraint(_in("kind", EXPERIENCE_KINDS), name="kind_valid"),
        sa.CheckConstraint(_finite("reward"), name="reward_finite"),
        sa.CheckConstraint("(evicted_at IS NULL) = (evicted_by IS NULL)", name="eviction_complete"),
        sa.Index(
            "ix_experiences_active",
            "pool_id",
            "problem_id",
            sa.text("created_at DESC"),
            sa.text("id DESC"),
            postgresql_where=sa.text("evicted_at IS NULL"),
        ),
        sa.Index(
            "ix_experiences_active_created",
            "pool_id",
            "created_at",
            "id",
            postgresql_where=sa.text("evicted_at IS NULL"),
        ),
        sa.CheckConstraint(SCOPE_VALID, name="scope_valid"),
        sa.Index(  # one served lesson per feedback row (migration 0022)
            "ix_experiences_feedback_id",
            "feedback_id",
            unique=True,
            postgresql_where=sa.text("feedback_id IS NOT NULL"),
        ),
        sa.Index(  # a resume's rollback: the evictions of the steps it undoes (migration 0013)
            "ix_experiences_evicted_step",
            "evicted_run_id",
            "evicted_step",
            postgresql_where=sa.text("evicted_run_id IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    pool_id: Mapped[int] = mapped_column(sa.ForeignKey("pools.id"))
    problem_id: Mapped[int] = mapped_column(sa.ForeignKey("problems.id", ondelete="CASCADE"))
    source_attempt_id: Mapped[int | None] = mapped_column(sa.ForeignKey("attempts.id", ondelete="SET NULL"))
    kind: Mapped[str] = mapped_column(sa.Text, server_default="summary")
    reward: Mapped[float | None] = mapped_column(sa.Double)
    run_id: Mapped[int | None] = mapped_column(sa.ForeignKey("runs.id", ondelete="SET NULL"))
    step: Mapped[int | None] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
    evicted_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    evicted_by: Mapped[str | None] = mapped_column(sa.Text)  # the capacity policy, e.g. "per_problem:oldest"
    # the run and step whose transaction evicted it (NULL: no training step did; `steps.rollback_uncommitted`)
    evicted_run_id: Mapped[int | None] = mapped_column(sa.ForeignKey("runs.id", ondelete="SET NULL"))
    evicted_step: Mapped[int | None] = mapped_column(sa.Integer)
    evicted_note: Mapped[str | None] = mapped_column(sa.Text)  # why, in a person's words (`lanpo pool retire`)
    # migration 0022: the scope a served lesson belongs to (NULL: shared), and the feedback it was learned from
    scope: Mapped[str | None] = mapped_column(sa.Text)
    feedback_id: Mapped[int | None] = mapped_column(sa.ForeignKey("answer_feedback.id", ondelete="SET NULL"))


class ExperienceVersion(Base):
    """Immutable text of an experience: a rewrite appends a version (a trigger refuses edits)."""

    __tablename__ = "experience_versions"
    __table_args__ = (
        sa.UniqueConstraint("experience_id", "version"),
        sa.CheckConstraint("version >= 1", name="version_positive"),
        sa.CheckConstraint(_nonempty("summary"), name="summary_nonempty"),
        sa.CheckConstraint(_in("reason", VERSION_REASONS), name="reason_valid"),
        sa.CheckConstraint(_finite("reward"), name="reward_finite"),
        sa.CheckConstraint("(reason LIKE 'merge:%') = (similarity IS NOT NULL)", name="merge_similarity"),
        sa.Index(  # a resume's rollback: the versions the steps it undoes appended (migration 0015)
            "ix_experience_versions_run_step",
            "run_id",
            "step",
            postgresql_where=sa.text("run_id IS NOT NULL"),
        ),
        sa.Index(
            "ix_experience_versions_embedding_hnsw",
            "embedding",
            postgresql_using="hnsw",
            postgresql_ops={"embedding": "vector_cosine_ops"},
        ),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    experience_id: Mapped[int] = mapped_column(sa.ForeignKey("experiences.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(sa.Integer)
    summary: Mapped[str] = mapped_column(sa.Text)
    embedding: Mapped[Any | None] = mapped_column(Vector(EMBEDDING_DIM))
    author: Mapped[str | None] = mapped_column(sa.Text)  # model id or "policy"
    policy_version_id: Mapped[int | None] = mapped_column(sa.ForeignKey("policy_versions.id"))
    prompt_version: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
    # why this version exists (migration 0015): new (a lesson's first), rewrite, or merge:<store.merge_keeps> (a
    # near-duplicate admitted as this version, `similarity` its cosine to the version it supersedes)
    reason: Mapped[str] = mapped_column(sa.Text, server_default="new")
    similarity: Mapped[float | None] = mapped_column(sa.Double)
    # the rollout this text was distilled from, its reward, and the run's step that wrote it
    source_attempt_id: Mapped[int | None] = mapped_column(sa.ForeignKey("attempts.id", ondelete="SET NULL"))
    reward: Mapped[float | None] = mapped_column(sa.Double)
    run_id: Mapped[int | None] = mapped_column(sa.ForeignKey("runs.id", ondelete="SET NULL"))
    step: Mapped[int | None] = mapped_column(sa.Integer)


class GroupContext(Base):
    """What was injected into a group's prompt: an experience version (inter) or an earlier attempt (intra)."""

    __tablename__ = "group_contexts"
    __table_args__ = (
        sa.CheckConstraint("position >= 0", name="position_nonnegative"),
        sa.CheckConstraint("num_nonnulls(experience_version_id, context_attempt_id) = 1", name="one_source"),
        sa.Index("ix_group_contexts_experience_version_id", "experience_version_id"),
        sa.Index("ix_group_contexts_context_attempt_id", "context_attempt_id"),
    )

    group_id: Mapped[int] = mapped_column(sa.ForeignKey("rollout_groups.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    experience_version_id: Mapped[int | None] = mapped_column(sa.ForeignKey("experience_versions.id"))
    context_attempt_id: Mapped[int | None] = mapped_column(sa.ForeignKey("attempts.id"))
    score: Mapped[float | None] = mapped_column(sa.Double)


class RelevanceScore(Base):
    """r(problem, candidate) from a scorer (model id + prompt version), in [0, 1]."""

    __tablename__ = "relevance_scores"
    __table_args__ = (
        sa.CheckConstraint("score >= 0 AND score <= 1", name="score_unit_interval"),
        sa.CheckConstraint("num_nonnulls(candidate_problem_id, candidate_version_id) = 1", name="one_candidate"),
        sa.CheckConstraint("candidate_problem_id IS DISTINCT FROM problem_id", name="not_self"),
        sa.CheckConstraint(_nonempty("scorer"), name="scorer_nonempty"),
        sa.Index(
            "uq_relevance_scores_problem_pair",
            "problem_id",
            "candidate_problem_id",
            "scorer",
            unique=True,
            postgresql_where=sa.text("candidate_problem_id IS NOT NULL"),
        ),
        sa.Index(
            "uq_relevance_scores_version_pair",
            "problem_id",
            "candidate_version_id",
            "scorer",
            unique=True,
            postgresql_where=sa.text("candidate_version_id IS NOT NULL"),
        ),
        sa.Index("ix_relevance_scores_lookup", "problem_id", "scorer", sa.text("score DESC")),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    problem_id: Mapped[int] = mapped_column(sa.ForeignKey("problems.id", ondelete="CASCADE"))
    candidate_problem_id: Mapped[int | None] = mapped_column(sa.ForeignKey("problems.id", ondelete="CASCADE"))
    candidate_version_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey("experience_versions.id", ondelete="CASCADE")
    )
    scorer: Mapped[str] = mapped_column(sa.Text)
    score: Mapped[float] = mapped_column(sa.Double)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class RunMetric(Base):
    __tablename__ = "run_metrics"
    __table_args__ = (sa.CheckConstraint(_nonempty("name"), name="name_nonempty"),)

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    name: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    value: Mapped[float | None] = mapped_column(sa.Double)


ROLLOUT_WORK_STATUSES = ("queued", "claimed", "done", "used", "dropped")


class RolloutWork(Base):
    """A step a trainer queued for rollout workers (migration 0012, `lanpo.db.repo.queue`)."""

    __tablename__ = "rollout_work"
    __table_args__ = (
        sa.CheckConstraint(_in("status", ROLLOUT_WORK_STATUSES), name="status_valid"),
        sa.CheckConstraint("step >= 1 AND attempt >= 0 AND claims >= 0", name="counts_valid"),
        sa.UniqueConstraint("run_id", "step", "attempt"),
        sa.Index(
            "ix_rollout_work_open",
            "run_id",
            "step",
            "attempt",
            postgresql_where=sa.text("status IN ('queued', 'claimed')"),
        ),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(sa.Integer)
    attempt: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    status: Mapped[str] = mapped_column(sa.Text, server_default="queued")
    prompts: Mapped[dict[str, Any]] = mapped_column(JSONB)  # the step's prompts and contexts, drawn when queued
    min_policy_step: Mapped[int] = mapped_column(sa.Integer)  # a worker serves at least this committed step
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
    claimed_by: Mapped[str | None] = mapped_column(sa.Text)
    claim_token: Mapped[str | None] = mapped_column(UUID(as_uuid=False))
    claimed_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    lease_until: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    claims: Mapped[int] = mapped_column(sa.Integer, server_default="0")  # takes; above 1 the claim was redone
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


class RolloutResult(Base):
    """A finished step's groups, written once per work row (its key is the row's)."""

    __tablename__ = "rollout_results"

    work_id: Mapped[int] = mapped_column(sa.ForeignKey("rollout_work.id", ondelete="CASCADE"), primary_key=True)
    policy_step: Mapped[int] = mapped_column(sa.Integer)  # the committed step whose weights generated it
    served_sha256: Mapped[str | None] = mapped_column(sa.Text)
    worker: Mapped[str] = mapped_column(sa.Text)
    groups: Mapped[list[Any]] = mapped_column(JSONB)
    seconds: Mapped[dict[str, float]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


# The tables of lessons' records, MEL, replay and `lanpo serve` live in modules of their own, imported here so that
# `Base.metadata` holds them.
from lanpo.db import models_lessons, models_mel, models_replay, models_serving  # noqa: E402, F401
