"""lanpo_draw_key: the one weighted-sampling key that sql/queries/sample_*.sql call

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

The three draw queries (sample_intra, sample_inter, sample_inter_unfiltered) each carried a copy of the
Efraimidis-Spirakis key, held together by a test that compared their text. The key is now one function:

    lanpo_draw_key(seed, candidate_id, problem_id, rank) = -ln(u) * (rank + 1)

with u the top 52 bits of sha256('<candidate id>/<problem id>/<seed>'), plus one half, over 2^52 (exact in float8
and strictly inside (0, 1)); the weight of rank i is 1/(i+1), and multiplying by rank + 1 (not dividing by the
weight) keeps every key bit for bit what the copies computed.

- `LANGUAGE sql`, `IMMUTABLE`, `PARALLEL SAFE`, no `STRICT` and no `SET`, and a body built only of immutable
  functions, so that the planner inlines it into the calling query: the copies used `concat_ws` and `convert_to`,
  which are STABLE and would block inlining of an IMMUTABLE function. `CAST(bigint AS text)` joined with `||` and
  cast to bytea gives the same bytes as `convert_to(concat_ws('/', ...), 'UTF8')` for integers (digits, '-' and
  '/' only, no backslash for bytea's input to read as an escape).
- PUBLIC may execute a new function by default (migration 0007 revoked EXECUTE only on named pg_catalog
  functions); the read-only role of migration 0004 is granted EXECUTE as well, so that default privileges an
  administrator set on functions do not take the key from `lanpo sql` users.
- `CREATE OR REPLACE`: running the DDL twice changes nothing. Downgrade drops the function (its grants go with it).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

SIGNATURE = "lanpo_draw_key(bigint, bigint, bigint, bigint)"

DRAW_KEY = """
CREATE OR REPLACE FUNCTION lanpo_draw_key(seed bigint, candidate_id bigint, problem_id bigint, rank bigint)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT -ln((CAST(CAST(CAST('x' || left(encode(
               sha256(CAST(CAST(candidate_id AS text) || '/' || CAST(problem_id AS text) || '/' || CAST(seed AS text)
                           AS bytea)),
           'hex'), 13) AS bit(52)) AS bigint) AS double precision) + 0.5) / 4503599627370496.0) * (rank + 1)
$$
"""


def upgrade() -> None:
    bind = op.get_bind()
    op.execute(DRAW_KEY)
    op.execute(
        f"COMMENT ON FUNCTION {SIGNATURE} IS 'Efraimidis-Spirakis key of a weighted draw without replacement: "
        "-ln(u) * (rank + 1), u from sha256(''<candidate id>/<problem id>/<seed>''); the k smallest win'"
    )
    role = bind.scalar(sa.text("SELECT role_name FROM lanpo_private.reader_login"))
    if role and bind.scalar(sa.text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": role}):
        ident = bind.dialect.identifier_preparer.quote_identifier
        op.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {ident(role)}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
