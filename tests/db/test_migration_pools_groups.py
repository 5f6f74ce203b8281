"""Migration 0003 on a filled database: pools per run, prompts grouped, contexts per group; and back down again."""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from lanpo.db import migrate

REVISION = "0003"
SHA = "ab" * 32


def _below(revision: str) -> str:
    return ScriptDirectory.from_config(migrate.alembic_config()).get_revision(revision).down_revision  # type: ignore[return-value]


def _fill_old_schema(conn: Connection) -> None:
    """Rows as the pre-0003 trainer and `lanpo infer` wrote them: a prompt and its contexts on every attempt."""
    x = conn.execute
    x(sa.text("INSERT INTO problems (id, dataset, external_id, question, answer) VALUES (1, 'd', '1', 'q1', '1'), "
              "(2, 'd', '2', 'q2', '2'), (3, 'd', '3', 'q3', '3')"))  # fmt: skip
    x(
        sa.text("INSERT INTO runs (id, name, kind, config) VALUES (1, 'r1', 'train', :c1), (2, 'r2', 'train', '{}'), "
                "(3, 'inf', 'infer', '{}')"),
        {"c1": json.dumps({"store": {"per_problem_cap": 4, "per_step_cap": 2, "eviction": "lowest_reward"}})},
    )  # fmt: skip
    x(sa.text("INSERT INTO policy_versions (id, run_id, step, adapter_sha256) VALUES (1, 1, 0, :s)"), {"s": SHA})
    x(sa.text("INSERT INTO experiences (id, problem_id, reward, run_id, step) VALUES (1, 2, 1.0, 1, 0), "
              "(2, 2, 0.5, 1, 1), (3, 3, 1.0, 2, 1), (4, 3, 1.0, NULL, NULL)"))  # fmt: skip
    x(sa.text("INSERT INTO experience_versions (id, experience_id, version, summary) "
              "SELECT id, id, 1, 'lesson ' || id FROM experiences"))  # fmt: skip
    attempts = [
        # id, run, problem, step, pv, mode, prompt, reward
        (1, 1, 1, 1, 1, "zero_shot", "plain q1", 0.0),
        (2, 1, 1, 1, 1, "zero_shot", "plain q1", 1.0),  # same prompt, same step: one group with 1
        (3, 1, 1, 1, 1, "inter", "q1 with lesson", 1.1),
        (4, 1, 1, 1, 1, "inter", "q1 with lesson", 0.1),  # same prompt and context: one group with 3
        (5, 1, 1, 1, 1, "inter", "q1 with lesson", 0.0),  # same prompt, other context: a group of its own
        (6, 2, 1, 1, None, "zero_shot", "plain q1", 1.0),  # another run: another group
        (7, 3, 2, 0, None, "self_correct", "first turn", 0.0),
        (8, 3, 2, 1, None, "self_correct", "reflect on turn 1", 1.0),
    ]
    for a in attempts:
        x(
            sa.text("INSERT INTO attempts (id, run_id, problem_id, step, policy_version_id, mode, prompt, response, "
                    "prompt_version, reward, correct, prompt_tokens, completion_tokens) "
                    "VALUES (:i, :r, :p, :s, :pv, :m, :pr, 'answer ' || :i, 'v1', :rw, :rw >= 1, 11, 7)"),
            dict(zip(("i", "r", "p", "s", "pv", "m", "pr", "rw"), a, strict=True)),
        )  # fmt: skip
    contexts = [(3, 0, 1, None, 0.9), (4, 0, 1, None, 0.9), (5, 0, 2, None, 0.8), (8, 0, None, 7, None)]
    for c in contexts:
        x(
            sa.text("INSERT INTO attempt_contexts (attempt_id, position, experience_version_id, context_attempt_id, "
                    "score) VALUES (:a, :p, :v, :c, :s)"),
            dict(zip("apvcs", c, strict=True)),
        )  # fmt: skip
    for table in ("problems", "runs", "policy_versions", "experiences", "experience_versions", "attempts"):
        x(sa.text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"))


OLD_ATTEMPTS = (
    "SELECT a.id, a.run_id, a.problem_id, a.step, a.policy_version_id, a.mode, a.prompt, a.prompt_version, "
    "a.prompt_tokens, a.response, a.reward, a.correct, a.completion_tokens FROM attempts a ORDER BY a.id"
)
OLD_CONTEXTS = "SELECT * FROM attempt_contexts ORDER BY attempt_id, position"


def _rows(conn: Connection, sql: str) -> list[tuple]:
    return [tuple(r) for r in conn.execute(sa.text(sql))]


def test_upgrade_groups_and_pools_then_downgrade_restores(db: Engine) -> None:
    before = _below(REVISION)
    migrate.downgrade(db, before)
    try:
        with db.begin() as conn:
            _fill_old_schema(conn)
        with db.connect() as conn:
            old_attempts, old_contexts = _rows(conn, OLD_ATTEMPTS), _rows(conn, OLD_CONTEXTS)
            old_rewards = _rows(conn, "SELECT * FROM run_rewards ORDER BY 1, 3, 4")
            old_usage = _rows(
                conn, "SELECT version_id, times_injected, problems, lift FROM experience_usage ORDER BY 1"
            )

        migrate.upgrade(db, REVISION)
        with db.connect() as conn:
            pools = _rows(
                conn, "SELECT name, per_problem_cap, per_step_cap, global_cap, eviction FROM pools ORDER BY id"
            )
            assert pools == [("r1", 4, 2, None, "lowest_reward"), ("r2", 32, 8, None, "oldest"),
                             ("default", 32, 8, None, "oldest")]  # fmt: skip
            members = _rows(
                conn, "SELECT e.id, pl.name FROM experiences e JOIN pools pl ON pl.id = e.pool_id ORDER BY 1"
            )
            assert members == [(1, "r1"), (2, "r1"), (3, "r2"), (4, "default")]
            run_pools = _rows(
                conn, "SELECT r.name, pl.name FROM runs r LEFT JOIN pools pl ON pl.id = r.pool_id ORDER BY r.id"
            )
            assert run_pools == [("r1", "r1"), ("r2", "r2"), ("inf", None)]
            groups = _rows(
                conn,
                "SELECT g.id, g.mode, g.prompt, array_agg(a.id ORDER BY a.id), g.prompt_tokens FROM rollout_groups g "
                "JOIN attempts a ON a.group_id = g.id GROUP BY g.id ORDER BY g.id",
            )
            assert [(g[1], g[2], g[3]) for g in groups] == [
                ("zero_shot", "plain q1", [1, 2]),
                ("inter", "q1 with lesson", [3, 4]),
                ("inter", "q1 with lesson", [5]),
                ("zero_shot", "plain q1", [6]),
                ("self_correct", "first turn", [7]),
                ("self_correct", "reflect on turn 1", [8]),
            ]
            assert all(g[4] == 11 for g in groups)
            contexts = _rows(conn, "SELECT group_id, position, experience_version_id, context_attempt_id, score "
                                   "FROM group_contexts ORDER BY group_id")  # fmt: skip
            assert contexts == [(3, 0, 1, None, 0.9), (5, 0, 2, None, 0.8), (8, 0, None, 7, None)]
            # the views tell the same story as before
            assert _rows(conn, "SELECT * FROM run_rewards ORDER BY 1, 3, 4") == old_rewards
            usage = _rows(conn, "SELECT version_id, times_injected, problems, lift FROM experience_usage ORDER BY 1")
            assert usage == old_usage
            next_group = conn.scalar(sa.text("SELECT nextval(pg_get_serial_sequence('rollout_groups', 'id'))"))
            assert next_group > 8  # new groups never collide with migrated ones

        migrate.downgrade(db, before)
        with db.connect() as conn:
            assert _rows(conn, OLD_ATTEMPTS) == old_attempts
            assert _rows(conn, OLD_CONTEXTS) == old_contexts
            assert _rows(conn, "SELECT * FROM run_rewards ORDER BY 1, 3, 4") == old_rewards
            assert not sa.inspect(conn).has_table("pools")
    finally:
        migrate.upgrade(db)
