"""use_diagnostics: the use diagnostics of run_metrics as rows (run, step, mode, diagnostic, value)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05

A trainer records, per step and per mode with a context, whether the answers use it (`lanpo.diagnostics`, written by
`lanpo.feedback.record.rollout_metrics` as `use/<diagnostic>/<mode>`); this view splits those names into columns so
that a query can compare modes and diagnostics over steps. No table changes: the view reads run_metrics. The same
definition is in sql/views/use_diagnostics.sql (tests/db/test_views.py proves they agree); the read-only role reads
it through 0004's default privileges. Downgrade drops the view.
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

USE_DIAGNOSTICS = """
CREATE OR REPLACE VIEW use_diagnostics AS
SELECT m.run_id, r.name AS run_name, m.step,
       split_part(m.name, '/', 3) AS mode,
       split_part(m.name, '/', 2) AS diagnostic,
       m.value
FROM run_metrics m
JOIN runs r ON r.id = m.run_id
WHERE m.name LIKE 'use/%/%';
"""


def upgrade() -> None:
    op.execute(USE_DIAGNOSTICS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS use_diagnostics")
