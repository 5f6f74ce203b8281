"""Feedback contexts: intra carries only prompt-visible text; inter never comes from the same problem, nor from
another pool."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from store_helpers import make_pool, make_problems

from lanpo.db.repo import contexts, sampling
from lanpo.db.repo.attempts import NewAttempt, NewGroup, record_groups
from lanpo.db.repo.contexts import InterItem, IntraItem
from lanpo.db.repo.experiences import NewExperience, add_experiences, append_version

GOLD = "GOLD-7291"


def test_intra_item_has_only_prompt_visible_fields() -> None:
    assert [f.name for f in dataclasses.fields(IntraItem)] == ["attempt_id", "response"]
    assert not hasattr(IntraItem(1, "r"), "__dict__")  # slots: nothing can be attached later
    assert [f.name for f in dataclasses.fields(InterItem)] == [
        "experience_version_id",
        "source_problem_id",
        "summary",
        "score",
    ]


def test_intra_context_text_reveals_no_reward_or_gold(session: Session) -> None:
    session.execute(
        sa.text("INSERT INTO problems (dataset, external_id, question, answer) VALUES ('d', '1', 'What is 2+5?', :g)"),
        {"g": GOLD},
    )
    pid = session.scalar(sa.text("SELECT id FROM problems"))
    attempts = [NewAttempt(f"I think it is {n}", reward=0.987654, correct=n == 7) for n in (6, 7)]
    record_groups(session, [NewGroup(pid, "zero_shot", "prompt", attempts)])
    items = contexts.intra_contexts(session, [pid], k=4, candidates=8, seed=1)[pid]
    assert {i.response for i in items} == {"I think it is 6", "I think it is 7"}
    from lanpo.cli.pool import render

    text = render("intra", items)
    assert "I think it is 6" in text
    for secret in (GOLD, "0.987654", "True", "False", "reward", "correct"):
        assert secret not in text


def test_inter_context_carries_summary_and_score(session: Session) -> None:
    a, b = make_problems(session, 2)
    pool = make_pool(session)
    add_experiences(session, pool, [NewExperience(b, "Carry the tens digit.", 1.0)])
    session.execute(
        sa.text(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) VALUES (:a, :b, 's', 0.93)"
        ),
        {"a": a, "b": b},
    )
    (item,) = contexts.inter_contexts(
        session, [a, b], k=4, candidates=8, seed=0, gamma=0.9, scorer="s", pool_id=pool.id
    )[a]
    assert (item.source_problem_id, item.summary, item.score) == (b, "Carry the tens digit.", 0.93)
    none = contexts.inter_contexts(session, [b], k=4, candidates=8, seed=0, gamma=0.9, scorer="s", pool_id=pool.id)
    assert none == {b: []}
    assert item.ref(2).experience_version_id == item.experience_version_id and item.ref(2).position == 2


def _brute_force_pools(
    session: Session, pool_id: int, pids: list[int], gamma: float, candidates: int
) -> dict[int, dict[int, int]]:
    """Plain-Python pools: version id -> rank of the current versions of active experiences of other problems."""
    current = session.execute(
        sa.text(
            "SELECT DISTINCT ON (e.id) e.id, e.problem_id, e.created_at, v.id AS version_id FROM experiences e "
            "JOIN experience_versions v ON v.experience_id = e.id WHERE e.evicted_at IS NULL "
            "AND e.problem_id = ANY(:p) AND e.pool_id = :pool ORDER BY e.id, v.version DESC"
        ),
        {"p": pids, "pool": pool_id},
    ).all()
    scores = session.execute(
        sa.text("SELECT problem_id, candidate_problem_id, candidate_version_id, score FROM relevance_scores")
    ).all()
    pools = {}
    for pid in pids:
        by_problem = {
            r.candidate_problem_id: r.score for r in scores if r.problem_id == pid and r.candidate_problem_id
        }
        by_version = {
            r.candidate_version_id: r.score for r in scores if r.problem_id == pid and r.candidate_version_id
        }
        ranked = []
        for e in current:
            if e.problem_id == pid:
                continue
            options = [s for s in (by_problem.get(e.problem_id), by_version.get(e.version_id)) if s is not None]
            options = [s for s in options if s >= gamma]
            if options:
                ranked.append((-max(options), -e.created_at.timestamp(), -e.id, e.version_id))
        pools[pid] = {r[3]: rank for rank, r in enumerate(sorted(ranked)[:candidates])}
    return pools


pool_spec = st.fixed_dictionaries(
    {
        "experiences": st.lists(st.integers(0, 5), min_size=1, max_size=25),  # source problem index of each
        "elsewhere": st.lists(st.integers(0, 5), max_size=10),  # experiences of the same problems in another pool
        "evicted": st.lists(st.booleans(), min_size=25, max_size=25),
        "rewrites": st.lists(st.integers(0, 24), max_size=5),
        "scores": st.lists(
            st.tuples(st.integers(0, 5), st.integers(0, 5), st.floats(0, 1)), max_size=30
        ),  # (problem, candidate problem, score); same-problem pairs are skipped (CHECK forbids them)
        "version_scores": st.lists(st.tuples(st.integers(0, 5), st.integers(0, 24), st.floats(0, 1)), max_size=10),
        "gamma": st.floats(0, 1),
        "k": st.integers(1, 6),
        "seed": st.integers(-(2**40), 2**40),
    }
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=pool_spec)
def test_inter_never_from_same_problem(migrated_db: Engine, spec: dict) -> None:
    with Session(migrated_db) as session, session.begin():
        try:
            pids = make_problems(session, 6, dataset="hyp")
            pool, other = make_pool(session, "mine"), make_pool(session, "another run's")
            added = add_experiences(
                session,
                pool,
                [NewExperience(pids[i], f"lesson {n} from {i}", 0.5) for n, i in enumerate(spec["experiences"])],
            )
            add_experiences(session, other, [NewExperience(pids[i], "not mine", 1.0) for i in spec["elsewhere"]])
            eids = added.experience_ids
            current = dict(zip(eids, added.version_ids, strict=True))
            for n in spec["rewrites"]:
                if n < len(eids):
                    current[eids[n]] = append_version(session, eids[n], f"rewrite of {eids[n]}")
            for n, gone in enumerate(spec["evicted"][: len(eids)]):
                if gone:
                    session.execute(
                        sa.text("UPDATE experiences SET evicted_at = now(), evicted_by = 't' WHERE id = :i"),
                        {"i": eids[n]},
                    )
            seen = set()
            for p, c, score in spec["scores"]:
                if p != c and (p, c) not in seen:
                    seen.add((p, c))
                    session.execute(
                        sa.text(
                            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) "
                            "VALUES (:p, :c, 's', :v)"
                        ),
                        {"p": pids[p], "c": pids[c], "v": score},
                    )
            seen_v = set()
            for p, n, score in spec["version_scores"]:
                if n < len(eids) and (p, n) not in seen_v:
                    seen_v.add((p, n))
                    session.execute(
                        sa.text(
                            "INSERT INTO relevance_scores (problem_id, candidate_version_id, scorer, score) "
                            "VALUES (:p, :v, 's', :s)"
                        ),
                        {"p": pids[p], "v": added.version_ids[n], "s": score},
                    )
            out = sampling.sample_inter(
                session,
                pids,
                k=spec["k"],
                candidates=8,
                seed=spec["seed"],
                gamma=spec["gamma"],
                scorer="s",
                pool_id=pool.id,
            )
            expected = _brute_force_pools(session, pool.id, pids, spec["gamma"], candidates=8)
            for pid, draws in out.items():
                assert len(draws) == min(spec["k"], len(expected[pid]))
                assert len({d.candidate_id for d in draws}) == len(draws)
                for d in draws:
                    assert d.source_problem_id != pid and d.text != "not mine"
                    assert d.score is not None and d.score >= spec["gamma"]
                    assert expected[pid].get(d.candidate_id) == d.rank  # in the pool, at the right rank
        finally:
            session.rollback()
