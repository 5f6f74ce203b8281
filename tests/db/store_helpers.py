"""Small builders shared by the store tests (fill a real database quickly)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db.repo.attempts import NewAttempt, record_attempts
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.problems import ProblemIn, upsert_problems


def make_problems(session: Session, n: int, dataset: str = "d") -> list[int]:
    upsert_problems(session, dataset, [ProblemIn(str(i), f"question {i}?", f"answer-{i}", {"i": i}) for i in range(n)])
    return list(session.scalars(sa.text("SELECT id FROM problems WHERE dataset = :d ORDER BY id"), {"d": dataset}))


def make_attempts(
    session: Session, problem_id: int, n: int, reward: float = 1.0, mode: str = "zero_shot"
) -> list[int]:
    return record_attempts(
        session,
        [
            NewAttempt(problem_id, mode, f"prompt {i}", f"response {i} to {problem_id}", reward=reward, correct=True)
            for i in range(n)
        ],
    )


def make_experiences(session: Session, problem_id: int, n: int, store: StoreConfig | None = None) -> list[int]:
    store = store or StoreConfig(per_problem_cap=10_000, per_step_cap=10_000)
    items = [NewExperience(problem_id, f"lesson {i} of {problem_id}", reward=float(i)) for i in range(n)]
    return add_experiences(session, items, store).version_ids


def relevance(session: Session, problem_id: int, candidate_problem_id: int, score: float, scorer: str = "s") -> None:
    session.execute(
        sa.text(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) VALUES (:p, :c, :s, :v)"
        ),
        {"p": problem_id, "c": candidate_problem_id, "s": scorer, "v": score},
    )


def fill_history(session: Session) -> dict[str, int]:
    """A small two-step run: zero-shot attempts, experiences (with an eviction), inter attempts using them.

    Problem a: zero-shot rewards 0 and 0.5 (mean 0.25); two inter attempts on a inject b's lesson, rewards 1, 1.
    Problem b: one correct zero-shot attempt. Problem c: attempted, never solved.
    """
    from lanpo.db.repo import runs as runs_repo
    from lanpo.db.repo.attempts import ContextRef

    a, b, c = make_problems(session, 3)
    run = runs_repo.create_run(session, "hist", "train", {}).id
    store = StoreConfig(per_problem_cap=1, per_step_cap=8)
    record_attempts(
        session,
        [
            NewAttempt(a, "zero_shot", "p", "r", 0.0, correct=False, step=0, run_id=run),
            NewAttempt(a, "zero_shot", "p", "r", 0.5, correct=False, step=0, run_id=run),
            NewAttempt(b, "zero_shot", "p", "r", 1.0, correct=True, step=0, run_id=run),
            NewAttempt(c, "zero_shot", "p", "r", 0.0, correct=False, step=0, run_id=run),
        ],
    )
    first = add_experiences(session, [NewExperience(b, "old lesson of b", 0.9, run_id=run, step=0)], store)
    second = add_experiences(session, [NewExperience(b, "lesson of b", 1.0, run_id=run, step=1)], store)
    version = second.version_ids[0]
    record_attempts(
        session,
        [
            NewAttempt(
                a,
                "inter",
                "p",
                "r",
                1.0,
                correct=True,
                format_ok=True,
                step=1,
                run_id=run,
                contexts=[ContextRef(0, version, score=0.95)],
            )
            for _ in range(2)
        ],
    )
    return {"a": a, "b": b, "c": c, "run": run, "version": version, "evicted": first.experience_ids[0]}


def write_training_steps(
    session: Session,
    batches: list[list[int]],
    n: int,
    lessons: int = 0,
    store: StoreConfig | None = None,
) -> list[tuple[list[int], list[int]]]:
    """Write one training step per batch of problem ids, laid out as lanpo.train.record.write_step_rows does.

    Per step, in its own committed transaction (so all its rows share one created_at = now(), and steps differ):
    the attempts group by group (the `n` rollouts of each problem of the batch, in batch order, consecutive
    ids), then `lessons` (<= n) experiences per problem summarised from its first rollouts, also problem by problem.
    Recency ties within a step are therefore broken by id, exactly as in a real run.
    Returns per step (attempt ids, experience version ids), both in write order.
    """
    store = store or StoreConfig(per_problem_cap=10_000, per_step_cap=10_000)
    written = []
    for step, batch in enumerate(batches):
        attempt_ids = record_attempts(
            session,
            [
                NewAttempt(p, "zero_shot", "prompt", f"rollout {j} of {p} at step {step}", 1.0, True, step=step)
                for p in batch
                for j in range(n)
            ],
        )
        added = add_experiences(
            session,
            [
                NewExperience(p, f"lesson {j} of {p} at step {step}", 1.0, attempt_ids[i * n + j], step=step)
                for i, p in enumerate(batch)
                for j in range(lessons)
            ],
            store,
        )
        session.commit()
        written.append((attempt_ids, added.version_ids))
    return written
