"""Leakage, end to end through the real store: reflection prompts built from `intra_contexts` never carry the
gold answer, rewards or correctness of the attempts behind them; `inter_contexts` never come from the same problem.
"""

from __future__ import annotations

import itertools
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from lanpo import prompts
from lanpo.config import StoreConfig
from lanpo.db.connection import transaction
from lanpo.db.repo import contexts
from lanpo.db.repo.attempts import NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.pools import ensure_pool
from lanpo.db.repo.problems import Question, problem_ids, upsert_problems

SAFE = st.text(alphabet="abcdefhkmnpqsuvxyz +-*=()", min_size=1, max_size=40).filter(lambda s: s.strip() != "")
_datasets = itertools.count()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    history=st.lists(
        st.tuples(st.integers(0, 2), SAFE, st.floats(-3, 3, allow_nan=False), st.booleans()), min_size=1, max_size=10
    ),
    lessons=st.lists(st.tuples(st.integers(0, 2), SAFE), max_size=6),
    seed=st.integers(0, 2**31),
)
def test_contexts_from_the_store_never_leak(db: Engine, history, lessons, seed: int) -> None:
    dataset = f"leak{next(_datasets)}"
    golds = [f"{7_000_000 + 1000 * i + seed % 997}" for i in range(3)]
    with transaction(db) as session:
        upsert_problems(session, dataset, [Question(str(i), f"question number {i}", golds[i]) for i in range(3)])
        pids = problem_ids(session, dataset)
        record_groups(
            session,
            [
                NewGroup(pids[p], "zero_shot", "q", [NewAttempt(response=text, reward=r, correct=c)])
                for p, text, r, c in history
            ],
        )
        pool = ensure_pool(session, dataset, StoreConfig())
        if lessons:
            add_experiences(
                session, pool, [NewExperience(problem_id=pids[p], summary=text, reward=1.0) for p, text in lessons]
            )
        session.connection().exec_driver_sql(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) "
            f"SELECT a.id, b.id, 'leak', 1.0 FROM problems a JOIN problems b ON a.id <> b.id "
            f"WHERE a.dataset = '{dataset}' AND b.dataset = '{dataset}'"
        )
        intra = contexts.intra_contexts(session, pids, k=4, candidates=8, seed=seed)
        inter = contexts.inter_contexts(
            session, pids, k=4, candidates=8, seed=seed, gamma=0.5, scorer="leak", pool_id=pool.id
        )

    for i, pid in enumerate(pids):
        text = "\n".join(m["content"] for m in prompts.intra_messages(f"question number {i}", intra[pid]))
        for gold in golds:
            assert gold not in text
        for _, _, reward, _ in history:
            if reward not in (0.0, 1.0, 2.0, 3.0):  # small integers occur in "Attempt 1"; others are distinctive
                assert repr(reward) not in text
        for word in prompts.JUDGEMENT_WORDS:
            assert not re.search(rf"\b{re.escape(word)}", text, re.IGNORECASE), word
        own = {t for p, t, _, _ in history if pids[p] == pid}
        assert all(item.response in own for item in intra[pid]), "intra context from another problem"
        assert all(item.source_problem_id != pid for item in inter[pid]), "inter context from the same problem"


def test_an_inter_prompt_shows_a_merged_lessons_current_text_and_nothing_of_its_record(db: Engine) -> None:
    """A lesson merged into version 2 with a usefulness record: the prompt carries version 2's words, never version
    1's, never either reward, and none of the counts (lesson_usefulness is read by no prompt builder)."""
    first = "## Flow\nAdd the tens first.\n## Principles\nCarry into the next column.\n## Pitfalls\nKeep signs."
    second = "## Flow\nFirst sum up the tens.\n## Principles\nCarry into the column after.\n## Pitfalls\nMind signs."
    near = [1.0, 0.1] + [0.0] * 382
    with transaction(db) as session:
        upsert_problems(session, "merged", [Question(str(i), f"question {i}", f"answer {i}") for i in range(2)])
        a, b = problem_ids(session, "merged")
        pool = ensure_pool(session, "merged", StoreConfig(merge_threshold=0.9))
        embedding = [1.0] + [0.0] * 383
        add_experiences(session, pool, [NewExperience(b, first, reward=0.8137, embedding=embedding)])
        merged = add_experiences(session, pool, [NewExperience(b, second, reward=0.9173, embedding=near)])
        assert merged.merged == [0]
        session.connection().exec_driver_sql(
            "INSERT INTO lesson_usefulness (version_id, uses, helped, hurt, even, unknown, graded, credit) "
            f"VALUES ({merged.version_ids[0]}, 9431, 7331, 2100, 0, 0, 8642, 51.37)"
        )
        session.connection().exec_driver_sql(
            f"INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) VALUES ({a}, {b}, 'm', 1)"
        )
        inter = contexts.inter_contexts(
            session, [a], k=2, candidates=8, seed=3, gamma=0.5, scorer="m", pool_id=pool.id
        )
    text = "\n".join(m["content"] for m in prompts.inter_messages("question 0", inter[a]))
    assert "First sum up the tens." in text and "Add the tens first." not in text
    for number in ("0.8137", "0.9173", "9431", "7331", "2100", "8642", "51.37"):
        assert number not in text
