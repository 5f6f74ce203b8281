"""The table replay reads besides attempts (migration 0017): per attempt, its completion's token ids and the
behaviour log-probs of those tokens. Imported by `lanpo.db.models`, so that its metadata holds it."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from lanpo.db.models_base import Base, _in

# who computed the stored log-probs: the rollout engine (vLLM), or the trainer's detached forward under the policy
# that generated the tokens (hf backend); both at the rollout temperature
LOGPROBS_OF = ("engine", "trainer")


class AttemptTokens(Base):
    """One attempt's completion as token ids with their behaviour log-probs (one each), deleted with the attempt."""

    __tablename__ = "attempt_tokens"
    __table_args__ = (
        sa.CheckConstraint(_in("logprobs_of", LOGPROBS_OF), name="logprobs_of_valid"),
        sa.CheckConstraint(
            "cardinality(token_ids) > 0 AND cardinality(token_ids) = cardinality(logprobs)", name="lengths_match"
        ),
    )

    attempt_id: Mapped[int] = mapped_column(sa.ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    token_ids: Mapped[list[int]] = mapped_column(ARRAY(sa.Integer))
    logprobs: Mapped[list[float]] = mapped_column(ARRAY(sa.REAL))
    logprobs_of: Mapped[str] = mapped_column(sa.Text)
