"""A lesson's life on top of `store_helpers.fill_history`: versions (a rewrite, a merge), usefulness rows, an
expiry at a step and a retirement by hand, for the lesson_history / pool_churn views, their recipes and
`lanpo pool history` / `lanpo pool retire`."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session
from store_helpers import make_pool

from lanpo.config import StoreConfig
from lanpo.db.repo import lessons
from lanpo.db.repo.experiences import NewExperience, add_experiences, append_version

# version -> (uses, helped, hurt, even, unknown, graded, credit) of the lesson of b (the usefulness helper's code
# keeps these current in a run; here they are written by hand, net_credit = credit: a fit that found no partner)
USEFULNESS = {1: (6, 1, 3, 1, 1, 6, -1.5), 3: (2, 2, 0, 0, 0, 2, 1.0)}
MERGE_SIMILARITY = 0.93


def fill_lesson_life(session: Session, ids: dict[str, int]) -> dict[str, int]:
    """On fill_history's store (run `ids['run']`, pool 'hist', lessons of b at steps 0 and 1, the first evicted at
    step 1 by per_problem:oldest), the active lesson of b gets version 2 (a rewrite, by append_version) and version
    3 (a merge:newer at step 2, by SQL); its versions 1 and 3 get usefulness rows. Step 2 adds lessons of a and c;
    c's expires at step 2 ('expired:policy_age'), a's is retired by hand. Returns ids: lesson (of b), lesson_a,
    lesson_c, v1, v2, v3."""
    run, (b_lesson,) = ids["run"], session.scalars(sa.text("SELECT experience_id FROM pool_current")).all()
    v2 = append_version(session, b_lesson, "lesson of b, rewritten")
    v3 = session.scalar(
        sa.text(
            "INSERT INTO experience_versions (experience_id, version, summary, author, reason, similarity, run_id, "
            "step) VALUES (:e, 3, 'lesson of b, merged', 'm', 'merge:newer', :s, :r, 2) RETURNING id"
        ),
        {"e": b_lesson, "s": MERGE_SIMILARITY, "r": run},
    )
    versions = dict(session.execute(sa.text("SELECT version, id FROM experience_versions WHERE experience_id = :e"),
                                    {"e": b_lesson}).all())  # fmt: skip
    for version, counts in USEFULNESS.items():
        session.execute(
            sa.text(
                "INSERT INTO lesson_usefulness (version_id, uses, helped, hurt, even, unknown, graded, credit, "
                "net_credit) VALUES (:v, :u, :h, :x, :e, :n, :g, :c, :c) ON CONFLICT (version_id) DO UPDATE SET "
                "uses = :u, helped = :h, hurt = :x, even = :e, unknown = :n, graded = :g, credit = :c, net_credit = :c"
            ),
            dict(zip("vuhxengc", (versions[version], *counts), strict=True)),
        )
    pool = make_pool(session, "hist", StoreConfig(per_problem_cap=1, per_step_cap=8))
    added = add_experiences(
        session, pool, [NewExperience(p, f"lesson of {n}", 0.5, run_id=run, step=2) for n, p in (("a", ids["a"]),
                                                                                                  ("c", ids["c"]))]
    )  # fmt: skip
    lesson_a, lesson_c = added.experience_ids
    session.execute(
        sa.text(
            "UPDATE experiences SET evicted_at = now(), evicted_by = 'expired:policy_age', evicted_run_id = :r, "
            "evicted_step = 2 WHERE id = :e"
        ),
        {"r": run, "e": lesson_c},
    )
    lessons.retire(session, lesson_a, "misleads on a")
    return {"lesson": b_lesson, "lesson_a": lesson_a, "lesson_c": lesson_c, "v1": versions[1], "v2": v2, "v3": v3}
