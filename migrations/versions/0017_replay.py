"""replay: the modes replayed and leaked_intra, attempts.replay_of, attempt_tokens, the replays view

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05

- `rollout_groups.mode` gains `replayed` (a group of stored trajectories trained on again beside a step's fresh
  rollouts: one group per problem per step, its prompt the source group's; never generated) and `leaked_intra`
  (Fig. 2b's arm: the model's earlier responses to the same problem AND its gold answer, built to show leakage).
- `attempts.replay_of`: a replayed attempt's source attempt (NULL for every fresh attempt; SET NULL when the source
  is deleted). Indexed where set, so that deleting a source finds its replays.
- `attempt_tokens`: per attempt, its completion's token ids and the behaviour log-probs of those tokens, with who
  computed them (`engine`: the rollout engine's; `trainer`: the trainer's detached log-prob under the policy that
  generated it), both at the rollout temperature. One row per attempt, deleted with it; the arrays are of one
  length, at least 1.
- Views (definitions also in sql/views/): `run_rewards` leaves replayed attempts out (a replay is no fresh rollout:
  it must not move a reward or accuracy curve); `replays`, one row per replayed attempt with its source, the source's
  run and step and its age in steps. The reader role reads `replays` through 0004's default privileges;
  `run_rewards` is replaced in place, so its grants stay.

Downgrade deletes the replayed and leaked_intra groups (their attempts cascade), drops the view, the table and the
column, and restores run_rewards' old text and the old CHECK.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

OLD_MODES = "'zero_shot', 'intra', 'inter', 'self_correct', 'retrieval', 'val', 'replay'"
MODES = f"{OLD_MODES}, 'replayed', 'leaked_intra'"

# the views at this revision; the same definitions are in sql/views/ (tests/db/test_views.py proves it)
RUN_REWARDS = """
CREATE OR REPLACE VIEW run_rewards AS
SELECT g.run_id, r.name AS run_name, g.step,
       CASE WHEN GROUPING(g.mode) = 1 THEN 'all' ELSE g.mode END AS mode,
       count(*) AS attempts,
       avg(a.reward) AS mean_reward,
       avg(CAST(a.correct AS integer)) AS accuracy,
       avg(CAST(a.format_ok AS integer)) AS format_rate
FROM attempts a
JOIN rollout_groups g ON g.id = a.group_id
JOIN runs r ON r.id = g.run_id
WHERE g.mode <> 'replayed'
GROUP BY GROUPING SETS ((g.run_id, r.name, g.step, g.mode), (g.run_id, r.name, g.step));
"""

OLD_RUN_REWARDS = """
CREATE OR REPLACE VIEW run_rewards AS
SELECT g.run_id, r.name AS run_name, g.step,
       CASE WHEN GROUPING(g.mode) = 1 THEN 'all' ELSE g.mode END AS mode,
       count(*) AS attempts,
       avg(a.reward) AS mean_reward,
       avg(CAST(a.correct AS integer)) AS accuracy,
       avg(CAST(a.format_ok AS integer)) AS format_rate
FROM attempts a
JOIN rollout_groups g ON g.id = a.group_id
JOIN runs r ON r.id = g.run_id
GROUP BY GROUPING SETS ((g.run_id, r.name, g.step, g.mode), (g.run_id, r.name, g.step));
"""

REPLAYS = """
CREATE OR REPLACE VIEW replays AS
SELECT g.run_id, r.name AS run_name, g.step, g.problem_id, a.group_id, a.id AS attempt_id,
       a.replay_of AS source_attempt_id, sg.run_id AS source_run_id, sr.name AS source_run_name,
       sg.step AS source_step, g.step - sg.step AS age, a.reward, a.correct, a.format_ok, a.completion_tokens,
       t.logprobs_of, a.created_at
FROM attempts a
JOIN rollout_groups g ON g.id = a.group_id
LEFT JOIN runs r ON r.id = g.run_id
LEFT JOIN attempts s ON s.id = a.replay_of
LEFT JOIN rollout_groups sg ON sg.id = s.group_id
LEFT JOIN runs sr ON sr.id = sg.run_id
LEFT JOIN attempt_tokens t ON t.attempt_id = a.replay_of
WHERE g.mode = 'replayed';
"""


def _modes(modes: str) -> None:
    op.drop_constraint(op.f("ck_rollout_groups_mode_valid"), "rollout_groups", type_="check")
    op.create_check_constraint(op.f("ck_rollout_groups_mode_valid"), "rollout_groups", f"mode IN ({modes})")


def upgrade() -> None:
    _modes(MODES)
    op.add_column("attempts", sa.Column("replay_of", sa.BigInteger(), nullable=True))
    op.create_foreign_key(
        op.f("fk_attempts_replay_of_attempts"), "attempts", "attempts", ["replay_of"], ["id"], ondelete="SET NULL"
    )
    op.create_index(
        "ix_attempts_replay_of", "attempts", ["replay_of"], postgresql_where=sa.text("replay_of IS NOT NULL")
    )
    op.create_table(
        "attempt_tokens",
        sa.Column("attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("token_ids", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("logprobs", postgresql.ARRAY(sa.REAL()), nullable=False),
        sa.Column("logprobs_of", sa.Text(), nullable=False),
        sa.CheckConstraint("logprobs_of IN ('engine', 'trainer')", name=op.f("ck_attempt_tokens_logprobs_of_valid")),
        sa.CheckConstraint(
            "cardinality(token_ids) > 0 AND cardinality(token_ids) = cardinality(logprobs)",
            name=op.f("ck_attempt_tokens_lengths_match"),
        ),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_attempt_tokens_attempt_id_attempts"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("attempt_id", name=op.f("pk_attempt_tokens")),
    )
    op.execute(RUN_REWARDS)
    op.execute(REPLAYS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS replays")
    op.execute(OLD_RUN_REWARDS)
    op.execute("DELETE FROM rollout_groups WHERE mode IN ('replayed', 'leaked_intra')")  # their attempts cascade
    op.drop_table("attempt_tokens")
    op.drop_index("ix_attempts_replay_of", table_name="attempts")
    op.drop_column("attempts", "replay_of")  # drops its foreign key with it
    _modes(OLD_MODES)
