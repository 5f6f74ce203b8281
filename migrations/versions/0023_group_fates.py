"""group fates: which step trained a group, which dropped it and why, and the weights each rollout came from

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06

verl's asynchronous trainers (docs/verl.md, "Asynchronous training") train a group at a later step than the one
that dispatched it, drop some (too stale, no reward spread, a failed session), and under partial rollout generate
one response with several policy versions, a segment each. The store keeps all of it:

- `rollout_groups.trainer_uid`: the trainer's own name for the group (verl's `uid`), unique within a run: a group
  re-issued after a resume replaces the row the killed run wrote for it.
- `rollout_groups.consumed_step`: the trainer step that took the group off the trainer's buffer (NULL: not yet, or
  a trainer that trains every group in the step that generated it: lanpo's own, TRL, verl's sync mode).
- `rollout_groups.dropped`: why the trainer dropped it at `consumed_step` (stale | filtered | failed); NULL with a
  `consumed_step`: trained at that step.
- `attempts.first_policy_version_id`, `attempts.last_policy_version_id`: the weights that generated the response's
  first and last segments (partial rollout resumes an aborted response under newer weights; verl reports the two
  ends, every version between served a segment). NULL: the group's `policy_version_id`, one version.

Downgrade drops the columns and the index.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

DROP_REASONS = ("stale", "filtered", "failed")  # lanpo.db.models.DROP_REASONS, frozen here


def upgrade() -> None:
    op.add_column("rollout_groups", sa.Column("trainer_uid", sa.Text(), nullable=True))
    op.add_column("rollout_groups", sa.Column("consumed_step", sa.Integer(), nullable=True))
    op.add_column("rollout_groups", sa.Column("dropped", sa.Text(), nullable=True))
    reasons = ", ".join(f"'{r}'" for r in DROP_REASONS)
    op.create_check_constraint(
        op.f("ck_rollout_groups_dropped_valid"), "rollout_groups", f"dropped IS NULL OR dropped IN ({reasons})"
    )
    op.create_check_constraint(
        op.f("ck_rollout_groups_dropped_when_consumed"),
        "rollout_groups",
        "dropped IS NULL OR consumed_step IS NOT NULL",
    )
    op.create_check_constraint(
        op.f("ck_rollout_groups_consumed_step_nonnegative"),
        "rollout_groups",
        "consumed_step IS NULL OR consumed_step >= 0",
    )
    op.create_index(
        "ix_rollout_groups_trainer_uid",
        "rollout_groups",
        ["run_id", "trainer_uid"],
        unique=True,
        postgresql_where=sa.text("trainer_uid IS NOT NULL"),
    )
    for end in ("first", "last"):
        op.add_column(
            "attempts",
            sa.Column(
                f"{end}_policy_version_id",
                sa.BigInteger(),
                sa.ForeignKey("policy_versions.id", name=op.f(f"fk_attempts_{end}_policy_version_id_policy_versions")),
                nullable=True,
            ),
        )


def downgrade() -> None:
    for end in ("first", "last"):
        op.drop_column("attempts", f"{end}_policy_version_id")
    op.drop_index("ix_rollout_groups_trainer_uid", table_name="rollout_groups")
    for name in ("consumed_step_nonnegative", "dropped_when_consumed", "dropped_valid"):
        op.drop_constraint(op.f(f"ck_rollout_groups_{name}"), "rollout_groups", type_="check")
    for column in ("dropped", "consumed_step", "trainer_uid"):
        op.drop_column("rollout_groups", column)
