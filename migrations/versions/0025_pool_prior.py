"""the pool's prior: value-aware draws may centre an untried lesson's worth on what the pool's lessons did

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07

`lanpo_lesson_value` (0020) values a lesson under a N(0, s^2) prior on its lift, so an untried lesson is worth
1.96 s (0.196 at the default s = 0.1) whatever the lessons of its pool turned out to do. In the reuse experiment's
value arm every graded lesson of the pool hurt (its inter groups 0-10 % right against 43-61 % zero-shot), and 14 of
the 26 lessons its inter groups read were untried when drawn: the prior's optimism, re-earned by every new lesson
(docs/results.md, five seeds). Empirical Bayes instead: lessons' lifts scatter around a pool mean mu,
lift_l ~ N(mu, s^2), with mu ~ N(0, s^2); a graded lesson's measured lift m_l (net_credit / graded) has variance
v_l (net_credit_var / graded^2), so m_l ~ N(mu, s^2 + v_l) and mu's posterior mean is

    mu = sum_l w_l m_l / (1 / s^2 + sum_l w_l),     w_l = 1 / (s^2 + v_l)

over the current versions of the pool's shared lessons with a graded use (retired and evicted ones included: their
evidence is the pool's). No graded lesson: mu = 0, the fixed prior. A lesson is then valued under N(mu, s^2):

    precision = 1 / s^2 + graded^2 / credit_var
    value     = (mu / s^2 + credit * graded / credit_var) / precision + z / sqrt(precision)

so an untried one is worth mu + z s: below 0 once the pool's graded lessons say lessons here hurt by more than
z s on the whole, and value-aware draws (`value_bound` 0) then go zero-shot rather than try each new lesson.

- `lanpo_pool_prior_mean(pool_id, prior_sd)`: `LANGUAGE sql STABLE`, reads the pool's rows as its caller may.
- `lanpo_lesson_value(graded, credit, credit_var, prior_sd, z, prior_mean)`: the six-argument form, IMMUTABLE and
  inlined as 0020's; at prior_mean 0 it equals the five-argument one, which stays (eviction reads it).
- The read-only role of 0004 is granted EXECUTE on both, as 0020 grants the five-argument form.
- Downgrade drops both.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

VALUE_SIGNATURE = f"lanpo_lesson_value({', '.join(['double precision'] * 6)})"
PRIOR_SIGNATURE = "lanpo_pool_prior_mean(bigint, double precision)"

LESSON_VALUE = """
CREATE OR REPLACE FUNCTION lanpo_lesson_value(graded double precision, credit double precision,
                                              credit_var double precision, prior_sd double precision,
                                              z double precision, prior_mean double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN coalesce(graded, 0) > 0
           THEN (prior_mean / (prior_sd * prior_sd) + credit * graded / greatest(credit_var, 1e-9))
                    / (1.0 / (prior_sd * prior_sd) + graded * graded / greatest(credit_var, 1e-9))
                + z / sqrt(1.0 / (prior_sd * prior_sd) + graded * graded / greatest(credit_var, 1e-9))
           ELSE prior_mean + z * prior_sd END
$$
"""

POOL_PRIOR_MEAN = """
CREATE OR REPLACE FUNCTION lanpo_pool_prior_mean(pool bigint, prior_sd double precision)
RETURNS double precision
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT coalesce(sum(g.w * g.lift) / (1.0 / (prior_sd * prior_sd) + sum(g.w)), 0)
    FROM (
        SELECT u.net_credit / u.graded AS lift,
               1.0 / (prior_sd * prior_sd + greatest(u.net_credit_var, 1e-9) / (u.graded * u.graded)) AS w
        FROM experiences e
        CROSS JOIN LATERAL (
            SELECT ev.id FROM experience_versions ev WHERE ev.experience_id = e.id ORDER BY ev.version DESC LIMIT 1
        ) cur
        JOIN lesson_usefulness u ON u.version_id = cur.id AND u.graded > 0
        WHERE e.pool_id = pool AND e.scope IS NULL
    ) g
$$
"""


def upgrade() -> None:
    bind = op.get_bind()
    op.execute(LESSON_VALUE)
    op.execute(POOL_PRIOR_MEAN)
    op.execute(
        f"COMMENT ON FUNCTION {VALUE_SIGNATURE} IS 'Upper confidence bound on a lesson version''s lift: its "
        "posterior mean under a N(prior_mean, prior_sd^2) prior plus z posterior standard deviations (migration 0025)'"
    )
    op.execute(
        f"COMMENT ON FUNCTION {PRIOR_SIGNATURE} IS 'The pool''s lessons'' mean lift, estimated from its graded "
        "lessons and shrunk toward 0 under N(0, prior_sd^2): the value rule''s pool prior (migration 0025)'"
    )
    role = bind.scalar(sa.text("SELECT role_name FROM lanpo_private.reader_login"))
    if role and bind.scalar(sa.text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": role}):
        ident = bind.dialect.identifier_preparer.quote_identifier
        op.execute(f"GRANT EXECUTE ON FUNCTION {VALUE_SIGNATURE}, {PRIOR_SIGNATURE} TO {ident(role)}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {PRIOR_SIGNATURE}")
    op.execute(f"DROP FUNCTION IF EXISTS {VALUE_SIGNATURE}")
