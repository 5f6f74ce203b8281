"""The tables `lanpo serve` writes besides attempts (migration 0014): one row per answered request, and the feedback
clients post on answers. Imported by `lanpo.db.models`, so that its metadata holds them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from lanpo.db.models_base import SCOPE_VALID, Base, _finite, _nonempty


class ServedAnswer(Base):
    """One request `lanpo serve` answered (migration 0014): its OpenAI id, the turn-0 group, the final attempts (one
    per choice), the mode and fallback, sampling, timings, the API key's name and whether it was streamed."""

    __tablename__ = "served_answers"
    __table_args__ = (
        sa.CheckConstraint(_nonempty("request_id"), name="request_id_nonempty"),
        sa.CheckConstraint("cardinality(answer_ids) >= 1", name="answers_nonempty"),
        sa.CheckConstraint(
            "jsonb_typeof(sampling) = 'object' AND jsonb_typeof(timings) = 'object'", name="json_objects"
        ),
        sa.CheckConstraint(SCOPE_VALID, name="scope_valid"),
        sa.Index("ix_served_answers_run_id", "run_id"),
        sa.Index("ix_served_answers_group_id", "group_id"),
        sa.Index("ix_served_answers_answer_ids", "answer_ids", postgresql_using="gin"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    request_id: Mapped[str] = mapped_column(sa.Text, unique=True)  # the response's id: chatcmpl-<uuid hex>
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    group_id: Mapped[int] = mapped_column(sa.ForeignKey("rollout_groups.id", ondelete="CASCADE"))
    answer_ids: Mapped[list[int]] = mapped_column(ARRAY(sa.BigInteger))
    mode: Mapped[str] = mapped_column(sa.Text)
    fallback: Mapped[str | None] = mapped_column(sa.Text)  # why a retrieval request was answered zero-shot
    sampling: Mapped[dict[str, Any]] = mapped_column(JSONB)
    timings: Mapped[dict[str, Any]] = mapped_column(JSONB)
    key_name: Mapped[str | None] = mapped_column(sa.Text)  # the API key's name, never the key
    streamed: Mapped[bool] = mapped_column(sa.Boolean)
    scope: Mapped[str | None] = mapped_column(sa.Text)  # the scope the request named (migration 0022)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


class AnswerFeedback(Base):
    """A reward and/or verdict on one attempt, appended (migration 0014): the latest verdict is the attempt's."""

    __tablename__ = "answer_feedback"
    __table_args__ = (
        sa.CheckConstraint(_finite("reward"), name="reward_finite"),
        sa.CheckConstraint("reward IS NOT NULL OR correct IS NOT NULL", name="has_outcome"),
        sa.Index("ix_answer_feedback_attempt_created", "attempt_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    attempt_id: Mapped[int] = mapped_column(sa.ForeignKey("attempts.id", ondelete="CASCADE"))
    reward: Mapped[float | None] = mapped_column(sa.Double)
    correct: Mapped[bool | None] = mapped_column(sa.Boolean)
    gold_answer: Mapped[str | None] = mapped_column(sa.Text)
    key_name: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())
