"""MEL's tables (migration 0006): the contrastive pairs it diagnosed and the NLL terms it took, imported by
`lanpo.db.models` so that `Base.metadata` holds them."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from lanpo.db.models_base import Base, _in

STEP_SPLITS = ("lines", "sentences")  # how MEL splits a response into reasoning steps
META_VERDICTS = ("validated", "rejected")
NLL_TARGETS = ("lesson", "replay")  # what MEL's NLL term is taken on


class MetaPair(Base):
    """A contrastive pair (y+, y-) MEL diagnosed: the bifurcation, the diagnosis, and the lesson it gave (if any),
    with the replay group that validated or rejected it (migration 0006)."""

    __tablename__ = "meta_pairs"
    __table_args__ = (
        sa.CheckConstraint("step >= 0", name="step_nonnegative"),
        sa.CheckConstraint("bifurcation_step >= 1", name="bifurcation_positive"),
        sa.CheckConstraint("shared_prefix_steps >= 0", name="shared_prefix_nonnegative"),
        sa.CheckConstraint(_in("step_split", STEP_SPLITS), name="step_split_valid"),
        sa.CheckConstraint(_in("located_by", ("model", "heuristic")), name="located_by_valid"),
        sa.CheckConstraint(_in("verdict", META_VERDICTS), name="verdict_valid"),
        sa.CheckConstraint("group_success_rate >= 0 AND group_success_rate <= 1", name="group_rate_unit"),
        sa.CheckConstraint("replay_success_rate >= 0 AND replay_success_rate <= 1", name="replay_rate_unit"),
        sa.CheckConstraint("positive_attempt_id <> negative_attempt_id", name="two_attempts"),
        sa.CheckConstraint(
            "num_nulls(experience_id, replay_group_id, replay_success_rate, validation_rule, verdict) IN (0, 5)",
            name="candidate_complete",
        ),
        sa.Index("ix_meta_pairs_run_step", "run_id", "step"),
        sa.Index("ix_meta_pairs_positive_attempt_id", "positive_attempt_id"),
        sa.Index("ix_meta_pairs_negative_attempt_id", "negative_attempt_id"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(sa.Integer)
    problem_id: Mapped[int] = mapped_column(sa.ForeignKey("problems.id", ondelete="CASCADE"))
    positive_attempt_id: Mapped[int] = mapped_column(sa.ForeignKey("attempts.id", ondelete="CASCADE"))
    negative_attempt_id: Mapped[int] = mapped_column(sa.ForeignKey("attempts.id", ondelete="CASCADE"))
    step_split: Mapped[str] = mapped_column(sa.Text)
    bifurcation_step: Mapped[int] = mapped_column(sa.Integer)  # 1-based, in the negative's steps
    shared_prefix_steps: Mapped[int] = mapped_column(sa.Integer)
    located_by: Mapped[str] = mapped_column(sa.Text)  # model | heuristic
    diagnosis: Mapped[str] = mapped_column(sa.Text)
    prompt_version: Mapped[str | None] = mapped_column(sa.Text)
    group_success_rate: Mapped[float] = mapped_column(sa.Double)
    experience_id: Mapped[int | None] = mapped_column(sa.ForeignKey("experiences.id", ondelete="CASCADE"), unique=True)
    replay_group_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey("rollout_groups.id", ondelete="CASCADE"), unique=True
    )
    replay_success_rate: Mapped[float | None] = mapped_column(sa.Double)
    validation_rule: Mapped[str | None] = mapped_column(sa.Text)
    verdict: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class MetaNllUse(Base):
    """A validated lesson trained into the weights at a step: the NLL target and its token count."""

    __tablename__ = "meta_nll_uses"
    __table_args__ = (
        sa.CheckConstraint("step >= 0", name="step_nonnegative"),
        sa.CheckConstraint("tokens >= 1", name="tokens_positive"),
        sa.CheckConstraint(_in("target", NLL_TARGETS), name="target_valid"),
        sa.CheckConstraint("(target = 'replay') = (attempt_id IS NOT NULL)", name="replay_names_attempt"),
        sa.Index("ix_meta_nll_uses_run_step", "run_id", "step"),
    )

    experience_id: Mapped[int] = mapped_column(sa.ForeignKey("experiences.id", ondelete="CASCADE"), primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    target: Mapped[str] = mapped_column(sa.Text)
    attempt_id: Mapped[int | None] = mapped_column(sa.ForeignKey("attempts.id", ondelete="CASCADE"))
    tokens: Mapped[int] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
