"""Small builders shared by the store tests (fill a real database quickly)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db import stats
from lanpo.db.models import Base
from lanpo.db.reader import stored_reader
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.pools import PoolRow, ensure_pool
from lanpo.db.repo.problems import Question, upsert_problems

UNCAPPED = StoreConfig(per_problem_cap=10_000, per_step_cap=10_000)


def make_problems(session: Session, n: int, dataset: str = "d") -> list[int]:
    upsert_problems(session, dataset, [Question(str(i), f"question {i}?", f"answer-{i}", {"i": i}) for i in range(n)])
    return list(session.scalars(sa.text("SELECT id FROM problems WHERE dataset = :d ORDER BY id"), {"d": dataset}))


def make_pool(session: Session, name: str = "test", store: StoreConfig = UNCAPPED) -> PoolRow:
    """The pool `name` with `store`'s caps (default: effectively uncapped)."""
    return ensure_pool(session, name, store)


def group(
    problem_id: int,
    responses: list[str],
    mode: str = "zero_shot",
    prompt: str = "prompt",
    reward: float | None = None,
    contexts: list[ContextRef] | None = None,
    **kwargs: object,
) -> NewGroup:
    """One prompt and its rollouts (all with `reward`, correct when it is 1)."""
    attempts = [NewAttempt(r, reward=reward, correct=None if reward is None else reward >= 1.0) for r in responses]
    return NewGroup(problem_id, mode, prompt, attempts, contexts=contexts or [], **kwargs)  # type: ignore[arg-type]


def make_attempts(
    session: Session, problem_id: int, n: int, reward: float = 1.0, mode: str = "zero_shot"
) -> list[int]:
    """n attempts on one problem, one group each (as n separate prompts would give)."""
    groups = [group(problem_id, [f"response {i} to {problem_id}"], mode, f"prompt {i}", reward) for i in range(n)]
    return [ids[0] for ids in record_groups(session, groups)]


def make_experiences(session: Session, problem_id: int, n: int, pool: PoolRow | None = None) -> list[int]:
    pool = pool or make_pool(session)
    items = [NewExperience(problem_id, f"lesson {i} of {problem_id}", reward=float(i)) for i in range(n)]
    return add_experiences(session, pool, items).version_ids


def relevance(session: Session, problem_id: int, candidate_problem_id: int, score: float, scorer: str = "s") -> None:
    session.execute(
        sa.text(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) VALUES (:p, :c, :s, :v)"
        ),
        {"p": problem_id, "c": candidate_problem_id, "s": scorer, "v": score},
    )


def fill_history(session: Session, same_step_baseline: bool = False) -> dict[str, int]:
    """A small two-step run: zero-shot attempts, experiences (with an eviction), inter attempts using them.

    Problem a: zero-shot rewards 0 and 0.5 (mean 0.25, both wrong) at step 0; two inter attempts on a at step 1
    inject b's lesson, rewards 1, 1 (correct). Problem b: one correct zero-shot attempt. Problem c: attempted, never
    solved. `same_step_baseline`: a also gets a zero-shot group at step 1, one wrong and one correct attempt (the
    baseline experience_usage compares the step-1 inter attempts with: accuracy 0.5).
    """
    from lanpo.db.repo import runs as runs_repo

    a, b, c = make_problems(session, 3)
    pool = make_pool(session, "hist", StoreConfig(per_problem_cap=1, per_step_cap=8))
    run = runs_repo.create_run(session, "hist", "train", {}, pool_id=pool.id).id
    record_groups(
        session,
        [
            NewGroup(a, "zero_shot", "p", [NewAttempt("r", 0.0, correct=False), NewAttempt("r", 0.5, correct=False)],
                     step=0, run_id=run),
            NewGroup(b, "zero_shot", "p", [NewAttempt("r", 1.0, correct=True)], step=0, run_id=run),
            NewGroup(c, "zero_shot", "p", [NewAttempt("r", 0.0, correct=False)], step=0, run_id=run),
        ],
    )  # fmt: skip
    first = add_experiences(session, pool, [NewExperience(b, "old lesson of b", 0.9, run_id=run, step=0)])
    second = add_experiences(session, pool, [NewExperience(b, "lesson of b", 1.0, run_id=run, step=1)])
    version = second.version_ids[0]
    record_groups(
        session,
        [
            NewGroup(
                a,
                "inter",
                "p",
                [NewAttempt("r", 1.0, correct=True, format_ok=True) for _ in range(2)],
                step=1,
                run_id=run,
                contexts=[ContextRef(0, version, score=0.95)],
            )
        ],
    )
    if same_step_baseline:
        attempts = [NewAttempt("r", 0.0, correct=False), NewAttempt("r", 1.0, correct=True)]
        record_groups(session, [NewGroup(a, "zero_shot", "p", attempts, step=1, run_id=run)])
    return {
        "a": a,
        "b": b,
        "c": c,
        "run": run,
        "pool": pool.id,
        "version": version,
        "evicted": first.experience_ids[0],
    }


def write_training_steps(
    session: Session,
    batches: list[list[int]],
    n: int,
    lessons: int = 0,
    pool: PoolRow | None = None,
) -> list[tuple[list[int], list[int]]]:
    """Write one training step per batch of problem ids, laid out as lanpo.feedback.record.write_step_rows does.

    Per step, in its own committed transaction (so all its rows share one created_at = now(), and steps differ):
    one rollout group per problem of the batch, in batch order, holding its `n` rollouts (consecutive attempt ids),
    then `lessons` (<= n) experiences per problem summarised from its first rollouts, also problem by problem.
    Recency ties within a step are therefore broken by id, exactly as in a real run.
    Returns per step (attempt ids, experience version ids), both in write order.
    """
    pool = pool or make_pool(session)
    written = []
    for step, batch in enumerate(batches):
        groups = [
            NewGroup(p, "zero_shot", "prompt", [NewAttempt(f"rollout {j} of {p} at step {step}", 1.0, True)
                                                for j in range(n)], step=step)
            for p in batch
        ]  # fmt: skip
        attempt_ids = [i for ids in record_groups(session, groups) for i in ids]
        added = add_experiences(
            session,
            pool,
            [
                NewExperience(p, f"lesson {j} of {p} at step {step}", 1.0, attempt_ids[i * n + j], step=step)
                for i, p in enumerate(batch)
                for j in range(lessons)
            ],
        )
        session.commit()
        written.append((attempt_ids, added.version_ids))
    return written


def snapshot(db: Engine) -> dict[str, object]:
    """What a write could change: row counts, sequences, large objects, extensions, relations, functions, and the
    reader's attributes, settings (in any database), memberships and grants."""
    role = stored_reader(db).role
    with db.connect() as conn:
        counts = {t.name: conn.scalar(sa.text(f"SELECT count(*) FROM {t.name}")) for t in Base.metadata.sorted_tables}
        return {
            "rows": counts,
            "sequences": conn.execute(sa.text("SELECT sequencename, last_value FROM pg_sequences ORDER BY 1")).all(),
            "large_objects": conn.scalar(sa.text("SELECT count(*) FROM pg_largeobject_metadata")),
            "extensions": conn.execute(sa.text("SELECT extname, extversion FROM pg_extension ORDER BY 1")).all(),
            "relations": conn.execute(
                sa.text(
                    "SELECT n.nspname, c.relname, c.relacl::text FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE n.nspname IN ('public', 'lanpo_private') ORDER BY 1, 2"
                )
            ).all(),
            "reader": conn.execute(
                sa.text(
                    "SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication, r.rolbypassrls, "
                    "r.rolinherit, r.rolcanlogin, r.rolconfig, ARRAY(SELECT m.roleid::regrole::text "
                    "FROM pg_auth_members m WHERE m.member = r.oid), ARRAY(SELECT s.setdatabase || ':' || "
                    "array_to_string(s.setconfig, ',') FROM pg_db_role_setting s WHERE s.setrole = r.oid ORDER BY 1) "
                    "FROM pg_roles r WHERE r.rolname = :r"
                ),
                {"r": role},
            ).one(),
            "functions": conn.scalar(
                sa.text("SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace")
            ),
        }


def planned_and_true(db: Engine, table: str) -> tuple[float, int]:
    """(reltuples: the planner's row count, -1 before any ANALYZE; the true count)."""
    with db.connect() as conn:
        planned = conn.scalar(sa.text("SELECT reltuples FROM pg_class WHERE oid = to_regclass(:t)"), {"t": table})
        return float(planned), int(conn.scalar(sa.text(f"SELECT count(*) FROM {table}")))


def assert_planned_within_growth(db: Engine, *tables: str) -> None:
    """Each of `tables` holds rows, and the planner counts them within stats.GROWTH x (lanpo.db.stats)."""
    for table in tables:
        planned, true = planned_and_true(db, table)
        assert true > 0 and true / stats.GROWTH <= planned <= true * stats.GROWTH, (table, planned, true)
