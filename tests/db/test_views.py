"""SQL interface: the views equal sql/views/*.sql, answer correctly on filled data; recipes run; read-only sql."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
import sqlalchemy as sa
from lesson_helpers import MERGE_SIMILARITY, USEFULNESS, fill_lesson_life
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from store_helpers import fill_history

from lanpo.cli.sql import format_result
from lanpo.db import migrate, sqlfiles
from lanpo.db.readonly import query_readonly
from lanpo.db.repo import runs as runs_repo
from lanpo.errors import InputError
from lanpo.feedback.record import GroupRecord, RolloutRecord, rollout_metrics

VIEWS = [
    "experience_history",
    "experience_usage",
    "lesson_history",
    "meta_experience_history",
    "meta_experience_yield",
    "pool_churn",
    "pool_current",
    "replays",
    "run_attempts",
    "run_rewards",
    "use_diagnostics",
]


def test_every_view_file_has_a_view() -> None:
    assert [n.split("/")[1] for n in sqlfiles.names("views")] == VIEWS


@pytest.mark.parametrize("name", VIEWS)
def test_view_in_database_equals_file(migrated_db: Engine, name: str) -> None:
    ddl = sqlfiles.text_of(f"views/{name}")
    temp = re.sub(rf"CREATE OR REPLACE VIEW {name} AS", f"CREATE TEMP VIEW {name}_filecheck AS", ddl)
    assert temp != ddl
    with migrated_db.connect() as conn, conn.begin() as tx:
        conn.execute(sa.text(temp))
        in_db = conn.scalar(sa.text("SELECT pg_get_viewdef(CAST(:n AS regclass), true)"), {"n": name})
        from_file = conn.scalar(
            sa.text("SELECT pg_get_viewdef(CAST(:n AS regclass), true)"), {"n": f"{name}_filecheck"}
        )
        tx.rollback()
    assert in_db == from_file


def test_downgrade_drops_views_upgrade_restores(db: Engine) -> None:
    migrate.downgrade(db, "0001")
    try:
        with db.connect() as conn:
            assert not set(VIEWS) & set(sa.inspect(conn).get_view_names())
            assert sa.inspect(conn).has_table("experiences")
    finally:
        migrate.upgrade(db)
    with db.connect() as conn:
        assert set(VIEWS) <= set(sa.inspect(conn).get_view_names())


def test_views_on_filled_history(session: Session) -> None:
    ids = fill_history(session)
    pool = session.execute(sa.text("SELECT pool, problem_id, summary FROM pool_current")).all()
    assert [tuple(r) for r in pool] == [("hist", ids["b"], "lesson of b")]
    attempts = session.execute(
        sa.text("SELECT run_name, step, mode, count(*) FROM run_attempts GROUP BY 1, 2, 3 ORDER BY 2, 3")
    ).all()
    assert [tuple(r) for r in attempts] == [("hist", 0, "zero_shot", 4), ("hist", 1, "inter", 2)]
    history = session.execute(
        sa.text("SELECT summary, active, evicted_by, is_current FROM experience_history ORDER BY experience_id")
    ).all()
    assert [tuple(r) for r in history] == [
        ("old lesson of b", False, "per_problem:oldest", True),
        ("lesson of b", True, None, True),
    ]
    curve = {
        (r.step, r.mode): (r.attempts, r.mean_reward, r.accuracy)
        for r in session.execute(sa.text("SELECT * FROM run_rewards"))
    }
    assert curve[(0, "all")] == (4, 0.375, pytest.approx(0.25))
    assert curve[(1, "inter")] == (2, 1.0, 1)
    usage = session.execute(
        sa.text("SELECT * FROM experience_usage WHERE version_id = :v"), {"v": ids["version"]}
    ).one()
    # a's zero-shot attempts are of step 0, its inter attempts of step 1: no exact baseline; the training run's
    # estimate reads step 0 at weight 0.5 ** (1 / 2): a's own 0 of 2 shrunk toward all problems' 1 of 4 (prior 2)
    w = 0.5**0.5
    estimate = (2 * (1 * w) / (4 * w) + 0) / (2 + 2 * w)
    assert (usage.times_injected, usage.problems, usage.uses_with_baseline) == (2, 1, 2)
    assert (usage.accuracy_with, usage.zero_shot_accuracy) == (1.0, pytest.approx(estimate))
    assert usage.lift == pytest.approx(1.0 - estimate)


def test_experience_usage_compares_with_the_same_steps_zero_shot_correctness(session: Session) -> None:
    ids = fill_history(session, same_step_baseline=True)
    usage = session.execute(
        sa.text("SELECT * FROM experience_usage WHERE version_id = :v"), {"v": ids["version"]}
    ).one()
    assert (usage.times_injected, usage.problems, usage.uses_with_baseline) == (2, 1, 2)
    # correctness, not reward (the inter rewards of 1.0 carry no bonus here, the zero-shot 0.0 / 1.0 mean 0.5);
    # the step-0 zero-shot attempts (both wrong) are another step's and stay out of the baseline
    assert (usage.accuracy_with, usage.zero_shot_accuracy, usage.lift) == (1.0, 0.5, 0.5)


def test_use_diagnostics_splits_the_use_metrics(session: Session) -> None:
    """The step's use/<diagnostic>/<mode> metrics as rows, as a trainer records them (rollout_metrics); every other
    metric left out."""
    run_id = runs_repo.create_run(session, "use", "train", {}).id
    responses = ["## Relevance\nnone\n## Plan\nadd\n## Solution\n\\boxed{3}", "It is 1 + 2 = 3, \\boxed{3}"]
    groups = [
        GroupRecord(1, "inter", "p", 4, [], [RolloutRecord(r, 1.0, True, True, 9, False) for r in responses]),
        GroupRecord(2, "zero_shot", "p", 4, [], [RolloutRecord("\\boxed{3}", 1.0, True, False, 3, False)]),
    ]
    metrics = rollout_metrics(groups)
    runs_repo.record_metrics(session, run_id, 1, metrics)
    rows = session.execute(
        sa.text("SELECT run_name, step, mode, diagnostic, value FROM use_diagnostics ORDER BY mode, diagnostic")
    ).all()
    assert [tuple(r) for r in rows] == [
        ("use", 1, "inter", "answer_copied", 0.0),
        ("use", 1, "inter", "answer_only", 1.0),
        ("use", 1, "inter", "echo", 0.0),
        ("use", 1, "inter", "sections", 0.5),
        ("use", 1, "zero_shot", "answer_only", 1.0),
    ]
    assert {f"use/{r.diagnostic}/{r.mode}" for r in rows} == {n for n in metrics if n.startswith("use/")}


@pytest.mark.parametrize("recipe", sqlfiles.names("recipes"))
def test_recipes_run_on_filled_data(db: Engine, session: Session, recipe: str) -> None:
    fill_lesson_life(session, fill_history(session, same_step_baseline=True))
    session.commit()
    result = query_readonly(db, sqlfiles.text_of(recipe))
    assert result.rows, f"{recipe} returned nothing on filled data"
    assert format_result(result, "table").endswith(")")


def test_recipe_answers(db: Engine, session: Session) -> None:
    ids = fill_history(session, same_step_baseline=True)
    session.commit()
    never = query_readonly(db, sqlfiles.text_of("recipes/problems_never_solved"))
    assert [r[0] for r in never.rows] == [ids["a"], ids["c"]] or sorted(r[0] for r in never.rows) == [ids["c"]]
    lift = query_readonly(db, sqlfiles.text_of("recipes/best_experiences_by_lift"))
    assert lift.columns[:7] == [
        "version_id", "source_problem_id", "times_injected", "uses_with_baseline", "with_ctx", "zero_shot", "lift"
    ]  # fmt: skip
    assert lift.rows == [(ids["version"], ids["b"], 2, 2, Decimal("1.000"), Decimal("0.500"), Decimal("0.500"),
                          "lesson of b")]  # fmt: skip
    evictions = query_readonly(db, sqlfiles.text_of("recipes/evictions_by_policy"))
    assert [(r[0], r[1], r[2]) for r in evictions.rows] == [("hist", "per_problem:oldest", 1)]
    growth = query_readonly(db, sqlfiles.text_of("recipes/pool_growth_per_step"))
    assert [(r[0], r[2], r[3], r[4]) for r in growth.rows] == [("hist", 0, 1, 0), ("hist", 1, 1, 1)]


def test_readonly_refuses_writes_and_changes_nothing(db: Engine, session: Session) -> None:
    fill_history(session)
    session.commit()
    before = query_readonly(db, "SELECT count(*) FROM problems").rows
    for statement in (
        "DELETE FROM problems",
        "WITH gone AS (DELETE FROM attempts RETURNING id) SELECT count(*) FROM gone",
        "UPDATE runs SET status = 'failed'",
        "CREATE TABLE sneaky (x int)",
        "SELECT set_config('transaction_read_only', 'off', false)",
    ):
        with pytest.raises(InputError, match=r"read-only|refused|read-write mode must be set"):
            query_readonly(db, statement)
    with pytest.raises(InputError, match="one SQL statement"):
        query_readonly(db, "SELECT 1; COMMIT; DELETE FROM problems")
    with pytest.raises(InputError, match='SQL error: relation "nope" does not exist'):
        query_readonly(db, "SELECT * FROM nope")
    assert query_readonly(db, "SELECT count(*) FROM problems").rows == before == [(3,)]
    assert query_readonly(db, "SELECT count(*) FROM attempts").rows == [(6,)]


def test_lesson_history_on_a_lesson_of_three_versions(db: Engine, session: Session) -> None:
    ids = fill_history(session)
    life = fill_lesson_life(session, ids)
    session.commit()
    columns = ("experience_id", "version_id", "version", "similarity", "summary", "is_current", "active",
               "evicted_by", "uses", "helped", "hurt", "even", "unknown", "graded", "credit", "lift")  # fmt: skip
    chain = f"SELECT {', '.join(columns)}, reason, run_id, step FROM lesson_history WHERE experience_id = :e"
    rows = session.execute(sa.text(f"{chain} ORDER BY version"), {"e": life["lesson"]}).all()
    b, (u1, u3) = life["lesson"], (USEFULNESS[1], USEFULNESS[3])
    assert [tuple(r)[: len(columns)] for r in rows] == [
        (b, life["v1"], 1, None, "lesson of b", False, True, None, *u1, u1[-1] / u1[-2]),
        (b, life["v2"], 2, None, "lesson of b, rewritten", False, True, None, 0, 0, 0, 0, 0, 0, 0.0, None),
        (b, life["v3"], 3, MERGE_SIMILARITY, "lesson of b, merged", True, True, None, *u3, 0.5),
    ]
    # version 1 takes its lesson's provenance, append_version's rewrite says so, and the merge says it all
    assert rows[0].reason == "new" and (rows[0].run_id, rows[0].step) == (ids["run"], 1)
    assert rows[1].reason == "rewrite" and (rows[1].run_id, rows[1].step) == (None, None)
    assert (rows[2].reason, rows[2].run_id, rows[2].step) == ("merge:newer", ids["run"], 2)
    states = session.execute(
        sa.text("SELECT experience_id, active, evicted_by, evicted_run_id, evicted_step, evicted_note, pool, "
                "source_problem_id FROM lesson_history WHERE version = 1 ORDER BY experience_id")
    ).all()  # fmt: skip
    assert [tuple(r) for r in states] == [
        (ids["evicted"], False, "per_problem:oldest", ids["run"], 1, None, "hist", ids["b"]),
        (b, True, None, None, None, None, "hist", ids["b"]),
        (life["lesson_a"], False, "manual:retired", None, None, "misleads on a", "hist", ids["a"]),
        (life["lesson_c"], False, "expired:policy_age", ids["run"], 2, None, "hist", ids["c"]),
    ]
    # one row per version, no more: every version of the store, each once
    assert (
        session.scalar(sa.text("SELECT count(*) FROM lesson_history"))
        == session.scalar(sa.text("SELECT count(*) FROM experience_versions"))
        == 6
    )
    reader = query_readonly(db, "SELECT count(*), sum(uses) FROM lesson_history")
    assert reader.rows == [(6, 8)]


def _churn_reference(session: Session) -> dict[tuple[int | None, int | None], tuple[int, ...]]:
    """pool_churn computed row by row in Python from the raw tables."""
    out: dict[tuple[int | None, int | None], list] = {}

    def row(run: int | None, step: int | None) -> list:
        return out.setdefault((run, step), [0, 0, 0, 0, 0, 0, {}])

    for run, step, evicted_by, evicted_run, evicted_step in session.execute(
        sa.text("SELECT run_id, step, evicted_by, evicted_run_id, evicted_step FROM experiences")
    ):
        row(run, step)[0] += 1
        if evicted_by is not None:
            r = row(evicted_run, evicted_step)
            r[2] += 1
            r[3 + (2 if evicted_by.startswith("manual:") else 1 if evicted_by.startswith("expired:") else 0)] += 1
            r[6][evicted_by] = r[6].get(evicted_by, 0) + 1
    for run, step in session.execute(
        sa.text("SELECT run_id, step FROM experience_versions WHERE reason LIKE 'merge:%'")
    ):
        row(run, step)[1] += 1
    return {k: tuple(v) for k, v in out.items()}


def test_pool_churn_per_step(db: Engine, session: Session) -> None:
    ids = fill_history(session)
    fill_lesson_life(session, ids)
    session.commit()
    columns = "run_id, step, added, merged, left_pool, evicted, expired, retired, evicted_by"
    churn = session.execute(sa.text(f"SELECT {columns} FROM pool_churn WHERE pool = 'hist' ORDER BY step")).all()
    run = ids["run"]
    assert [tuple(r) for r in churn] == [
        (run, 0, 1, 0, 0, 0, 0, 0, {}),
        (run, 1, 1, 0, 1, 1, 0, 0, {"per_problem:oldest": 1}),
        (run, 2, 2, 1, 1, 0, 1, 0, {"expired:policy_age": 1}),
        (None, None, 0, 0, 1, 0, 0, 1, {"manual:retired": 1}),
    ]
    assert {(r[0], r[1]): tuple(r[2:]) for r in churn} == _churn_reference(session)
    assert query_readonly(db, "SELECT sum(added), sum(left_pool) FROM pool_churn").rows == [(4, 3)]


def test_lesson_recipes(db: Engine, session: Session) -> None:
    ids = fill_history(session)
    life = fill_lesson_life(session, ids)
    session.commit()
    hurt = query_readonly(db, sqlfiles.text_of("recipes/lessons_that_hurt"))
    # version 1 of b's lesson: 5 known uses (>= the pool's min_uses 4), lift -0.25; version 3 helped
    assert [(r[0], r[1], r[2]) for r in hurt.rows] == [(life["lesson"], 1, life["v1"])]
    merged = query_readonly(db, sqlfiles.text_of("recipes/merged_lessons"))
    assert [(r[0], r[1], r[2]) for r in merged.rows] == [
        (life["lesson"], 1, "new"), (life["lesson"], 2, "rewrite"), (life["lesson"], 3, "merge:newer")
    ]  # fmt: skip
    churn = query_readonly(db, sqlfiles.text_of("recipes/pool_churn_per_step"))
    # step, added, merged, left_pool, net_so_far: the hand retirement (no run, no step) last, a run of its own
    assert [(r[2], r[3], r[4], r[5], r[9]) for r in churn.rows] == [
        (0, 1, 0, 0, 1), (1, 1, 0, 1, 1), (2, 2, 1, 1, 2), (None, 0, 0, 1, -1)
    ]  # fmt: skip
