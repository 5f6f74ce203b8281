"""lanpo_lesson_value: the optimistic value of a lesson version that value-aware draws and retrieval rank by

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06

A lesson version's lift (credit / graded, lesson_history) is noisy after a few uses and unknown before the first.
Value-aware draws (`feedback.inter.rank = "value"`) and retrieval (`--rank value`) rank candidates by an upper
confidence bound on it, under a normal prior lift ~ N(0, prior_sd^2) and the measured lift's variance
credit_var / graded^2 (docs/concepts.md, "Lessons on probation"):

    precision = 1 / prior_sd^2 + graded^2 / credit_var           (no graded use: 1 / prior_sd^2)
    mean      = (credit * graded / credit_var) / precision         (no graded use: 0)
    value     = mean + z * sqrt(1 / precision)

An untried version is worth z * prior_sd, optimistic enough to be tried; a tried one its shrunk lift plus what is
still unknown of it. `credit_var` below 1e-9 counts as 1e-9 (a use always has some variance: docs/concepts.md).

- `LANGUAGE sql`, `IMMUTABLE`, `PARALLEL SAFE`, no `STRICT`, so the planner inlines it (as 0009's lanpo_draw_key);
  NULL counts (a version with no lesson_usefulness row) read as no graded use.
- PUBLIC may execute it; the read-only role of 0004 is granted EXECUTE as 0009 grants lanpo_draw_key.
- Downgrade drops the function.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

SIGNATURE = f"lanpo_lesson_value({', '.join(['double precision'] * 5)})"

LESSON_VALUE = """
CREATE OR REPLACE FUNCTION lanpo_lesson_value(graded double precision, credit double precision,
                                              credit_var double precision, prior_sd double precision,
                                              z double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN coalesce(graded, 0) > 0
           THEN (credit * graded / greatest(credit_var, 1e-9))
                    / (1.0 / (prior_sd * prior_sd) + graded * graded / greatest(credit_var, 1e-9))
                + z / sqrt(1.0 / (prior_sd * prior_sd) + graded * graded / greatest(credit_var, 1e-9))
           ELSE z * prior_sd END
$$
"""


def upgrade() -> None:
    bind = op.get_bind()
    op.execute(LESSON_VALUE)
    op.execute(
        f"COMMENT ON FUNCTION {SIGNATURE} IS 'Upper confidence bound on a lesson version''s lift: its posterior "
        "mean under a N(0, prior_sd^2) prior plus z posterior standard deviations (migration 0020)'"
    )
    role = bind.scalar(sa.text("SELECT role_name FROM lanpo_private.reader_login"))
    if role and bind.scalar(sa.text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": role}):
        ident = bind.dialect.identifier_preparer.quote_identifier
        op.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {ident(role)}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
