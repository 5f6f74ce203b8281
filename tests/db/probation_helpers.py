"""Lessons in every probation state, written the way production writes them: `record_groups` keeps `lesson_uses`
and `lesson_usefulness` current and retires a lesson by its record, so `lesson_history.probation` reads what a run
leaves. Shared by the view's tests (tests/db) and the report's lesson lift figure (tests/report), so it imports
lanpo alone, never a sibling helper by its bare name."""

from __future__ import annotations

from dataclasses import replace

import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import NewExperience, add_experiences, append_version
from lanpo.db.repo.pools import ensure_pool
from lanpo.db.repo.problems import Question, upsert_problems

OPEN = StoreConfig(per_problem_cap=10_000, per_step_cap=10_000)  # no cap, no retirement
# state -> the outcome of each use of its lesson: 1 right where zero-shot was wrong, -1 the other way, None with no
# zero-shot attempt at the use's step (no baseline: nothing graded)
USES = {"helps": (1, 1), "hurts": (-1, -1), "trying": (1, -1), "retired": (-1, -1), "untried": (None,)}


def fill_probation(session: Session, run_id: int, name: str = "probation", mode: str = "inter") -> dict[str, int]:
    """In run `run_id`, at step 0, one lesson per state of USES, each used on problems of its own (one problem per
    use, each with its own zero-shot group when the use has an outcome: an exact baseline of one attempt).

    Every lesson is in pool `name` (no `retire_below`) but the retired one, in pool `<name>-retire` (`retire_below`
    0, `min_uses` 2): a rewrite makes its version 2 current, and its two hurting uses retire it. Two hurting uses in
    the open pool leave that lesson at 'hurts'. Returns state -> the version the uses carried, and 'retired_v1' ->
    the retired lesson's first version (never used)."""
    pools = {
        "open": ensure_pool(session, name, OPEN),
        "retire": ensure_pool(session, f"{name}-retire", replace(OPEN, retire_below=0.0, min_uses=2)),
    }
    uses = sum(len(outcomes) for outcomes in USES.values())
    upsert_problems(session, name, [Question(str(i), f"question {i}?", f"{i}") for i in range(len(USES) + uses)])
    problems = list(session.scalars(sa.text("SELECT id FROM problems WHERE dataset = :d ORDER BY id"), {"d": name}))
    versions: dict[str, int] = {}
    for i, state in enumerate(USES):
        pool = pools["retire" if state == "retired" else "open"]
        added = add_experiences(session, pool, [NewExperience(problems[i], f"a lesson that {state}", 1.0)])
        versions[state] = added.version_ids[0]
        if state == "retired":
            versions["retired_v1"] = versions[state]
            versions[state] = append_version(session, added.experience_ids[0], "a lesson that retired, rewritten")
    at = len(USES)
    for state, outcomes in USES.items():
        for outcome in outcomes:
            problem, at = problems[at], at + 1
            lesson = [ContextRef(0, experience_version_id=versions[state])]
            groups = [] if outcome is None else [
                NewGroup(problem, "zero_shot", "q", [NewAttempt("z", float(outcome < 0), outcome < 0)], step=0,
                         run_id=run_id)
            ]  # fmt: skip
            groups.append(
                NewGroup(problem, mode, "q", [NewAttempt("r", float(outcome != -1), outcome != -1)], step=0,
                         run_id=run_id, contexts=lesson)
            )  # fmt: skip
            record_groups(session, groups)
    return versions
