"""What the store keeps about its lessons' use (migration 0015): per use (a lesson version in a group's context) its
outcome against the zero-shot baseline, and per lesson version the counts of its uses by outcome, kept current by
the writers (`lanpo.db.repo.usefulness`), so a query or an eviction reads them without rescanning history, and a
writer recomputes only the uses its own groups touch; and the relevance judge's scores of question texts against
lesson versions (migration 0021), which retrieval reads before it judges. Imported by `lanpo.db.models`."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from lanpo.db.models_base import Base, _finite, _nonnegative_finite


class LessonUsefulness(Base):
    """One lesson version's record: its uses (groups whose context held it) by outcome, and its credited gain.

    A use's outcome compares its group's graded correctness with the problem's zero-shot success under the same
    policy: exact (the zero-shot attempts of the same run, step, problem and policy version) or, in a training run,
    estimated from its zero-shot attempts at the few steps before (docs/concepts.md): helped (above), hurt
    (below), even, or unknown (no baseline, or nothing graded). `graded` counts the attempts with a baseline and
    `credit` their summed gain, each divided by its context's item count, so `credit / graded` is
    `experience_usage.lift`; `credit_var` sums its uses' variances. `net_credit` and `net_credit_var` (migration
    0024): what its pool's uses say of the version's own effect, the lessons drawn beside it integrated out
    (`lanpo.lesson_effects`), as graded * lift and graded^2 * lift's variance: what `lesson_history.lift`, the
    value-aware draws, eviction by utility and retirement read.
    """

    __tablename__ = "lesson_usefulness"
    __table_args__ = (
        sa.CheckConstraint("uses = helped + hurt + even + unknown", name="uses_add_up"),
        sa.CheckConstraint("least(uses, helped, hurt, even, unknown, graded) >= 0", name="counts_nonnegative"),
        sa.CheckConstraint(_finite("credit"), name="credit_finite"),
        sa.CheckConstraint(_nonnegative_finite("credit_var"), name="credit_var_valid"),
        sa.CheckConstraint(_finite("net_credit"), name="net_credit_finite"),
        sa.CheckConstraint(_nonnegative_finite("net_credit_var"), name="net_credit_var_valid"),
    )

    version_id: Mapped[int] = mapped_column(
        sa.ForeignKey("experience_versions.id", ondelete="CASCADE"), primary_key=True
    )
    uses: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    helped: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    hurt: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    even: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    unknown: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    graded: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    credit: Mapped[float] = mapped_column(sa.Double, server_default="0")
    credit_var: Mapped[float] = mapped_column(sa.Double, server_default="0")  # migration 0018
    net_credit: Mapped[float] = mapped_column(sa.Double, server_default="0")  # migration 0024
    net_credit_var: Mapped[float] = mapped_column(sa.Double, server_default="0")  # migration 0024
    updated_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class LessonUse(Base):
    """One use: a rollout group whose context holds the version, with its outcome, precomputed (what
    `lesson_usefulness` sums by version).

    `m`: the positions the version holds in that context (almost always 1). `outcome`: 1 helped, -1 hurt, 0 even,
    NULL unknown (no baseline, or nothing graded). `graded`: m * the group's graded attempts, when there is a
    baseline (else 0); `credit`: m * their summed (correct - baseline) / k, k the context's item count; `baseline`,
    worth `baseline_n` attempts, from `baseline_source` (exact | estimated); `credit_var`: credit's variance
    (sql/queries/usefulness_uses_recompute.sql). Deleted with its group or its version.
    """

    __tablename__ = "lesson_uses"
    __table_args__ = (
        sa.CheckConstraint("m >= 1", name="m_positive"),
        sa.CheckConstraint("outcome IS NULL OR outcome IN (-1, 0, 1)", name="outcome_valid"),
        sa.CheckConstraint("graded >= 0", name="graded_nonnegative"),
        sa.CheckConstraint(_finite("credit"), name="credit_finite"),
        sa.CheckConstraint(_nonnegative_finite("credit_var"), name="credit_var_valid"),
        sa.CheckConstraint(
            "(baseline_source IS NULL AND baseline IS NULL AND baseline_n IS NULL) OR (baseline_source IN ('exact', "
            "'estimated') AND baseline >= 0 AND baseline <= 1 AND baseline_n > 0)",
            name="baseline_valid",
        ),
        sa.Index("ix_lesson_uses_group_id", "group_id"),
    )

    version_id: Mapped[int] = mapped_column(
        sa.ForeignKey("experience_versions.id", ondelete="CASCADE"), primary_key=True
    )
    group_id: Mapped[int] = mapped_column(sa.ForeignKey("rollout_groups.id", ondelete="CASCADE"), primary_key=True)
    m: Mapped[int] = mapped_column(sa.Integer, server_default="1")
    outcome: Mapped[int | None] = mapped_column(sa.SmallInteger)
    graded: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    credit: Mapped[float] = mapped_column(sa.Double, server_default="0")
    # migration 0018: the baseline compared with (exact, or estimated in a training run), and credit's variance
    baseline: Mapped[float | None] = mapped_column(sa.Double)
    baseline_n: Mapped[float | None] = mapped_column(sa.Double)
    baseline_source: Mapped[str | None] = mapped_column(sa.Text)
    credit_var: Mapped[float] = mapped_column(sa.Double, server_default="0")


class JudgeCache(Base):
    """The relevance judge's score of a question text against a lesson version (migration 0021): what retrieval reads
    before it asks the judge, so a question asked again costs no judgement. `question_sha256`: sha256 of the
    question's text; `scorer`: the judge's identity (`JudgePrompt.identity`, as `relevance_scores.scorer`). Deleted
    with its version."""

    __tablename__ = "judge_cache"
    __table_args__ = (
        sa.CheckConstraint("octet_length(question_sha256) = 32", name="question_sha256_length"),
        sa.CheckConstraint("length(btrim(scorer)) > 0", name="scorer_nonempty"),
        sa.CheckConstraint("score >= 0 AND score <= 1", name="score_unit_interval"),
        sa.Index("ix_judge_cache_version_id", "version_id"),
    )

    question_sha256: Mapped[bytes] = mapped_column(sa.LargeBinary, primary_key=True)
    scorer: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    version_id: Mapped[int] = mapped_column(
        sa.ForeignKey("experience_versions.id", ondelete="CASCADE"), primary_key=True
    )
    score: Mapped[float] = mapped_column(sa.Double)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
