"""Fig. 2c's random arm in the store (feedback.inter.draw = random, sample_inter_random_attempts.sql): the run's
correct attempts of OTHER problems only, drawn uniformly without replacement, in the order of the documented key;
and Fig. 2b's gold answers come from leaked_gold_answers alone."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.db.repo import runs
from lanpo.db.repo.attempts import NewAttempt, NewGroup, record_groups
from lanpo.db.repo.contexts import leaked_gold_answers, random_attempt_contexts
from lanpo.errors import InputError
from lanpo.feedback.draw import leaked_questions
from tests.db.store_helpers import make_pool, make_problems
from tests.db.test_sampling import _key


def _store(session: Session) -> tuple[list[int], int, dict[int, int], set[int]]:
    """Four problems; run A's attempts: correct and wrong ones in every ordinary mode, correct ones in val and in
    another run (never candidates). Returns problems, run A, correct candidate attempt -> its problem, the others."""
    pids = make_problems(session, 4)
    pool = make_pool(session, "fig2")
    run_a = runs.create_run(session, "a", "train", {}, "m", pool.id).id
    run_b = runs.create_run(session, "b", "train", {}, "m", pool.id).id

    def groups(run_id: int, mode: str, correct: bool) -> list[NewGroup]:
        return [
            NewGroup(p, mode, "q", [NewAttempt(f"{mode} {correct} {p} {j}", 1.0 * correct, correct) for j in range(2)],
                     step=1, run_id=run_id)
            for p in pids
        ]  # fmt: skip

    good = [g for mode in ("zero_shot", "intra", "inter") for g in groups(run_a, mode, True)]
    bad = groups(run_a, "zero_shot", False) + groups(run_a, "val", True) + groups(run_b, "zero_shot", True)
    good_ids = record_groups(session, good)
    bad_ids = record_groups(session, bad)
    candidates = {a: g.problem_id for g, ids in zip(good, good_ids, strict=True) for a in ids}
    return pids, run_a, candidates, {a for ids in bad_ids for a in ids}


def test_random_draw_shows_only_the_runs_correct_attempts_of_other_problems(session: Session) -> None:
    pids, run, candidates, never = _store(session)
    for seed in range(20):
        drawn = random_attempt_contexts(session, pids, k=4, seed=seed, run_id=run)
        for p in pids:
            items = drawn[p]
            assert len(items) == 4 and len({i.attempt_id for i in items}) == 4
            for item in items:
                assert item.attempt_id in candidates and item.attempt_id not in never
                assert candidates[item.attempt_id] == item.source_problem_id != p
                assert item.summary.startswith(("zero_shot True", "intra True", "inter True"))
    assert random_attempt_contexts(session, pids, k=0, seed=0, run_id=run) == {p: [] for p in pids}
    with pytest.raises(InputError):
        random_attempt_contexts(session, pids, k=1, seed=0, run_id=10**9)


def test_random_draw_is_the_documented_key_at_rank_zero(session: Session) -> None:
    """Exact: the draw is the k smallest lanpo_draw_key(seed, ordinal, problem, 0) over the candidates (every weight
    equal; the ordinal is the attempt's place among the run's correct attempts, oldest 0), recomputed here in
    Python."""
    pids, run, candidates, _ = _store(session)
    ordinal = {a: i + 1 for i, a in enumerate(sorted(candidates))}
    for seed in (0, 5, -(2**63)):
        drawn = random_attempt_contexts(session, pids, k=3, seed=seed, run_id=run)
        for p in pids:
            others = [a for a, q in candidates.items() if q != p]
            order = sorted(others, key=lambda a: (_key(ordinal[a], p, seed, 0), a))
            assert [i.attempt_id for i in drawn[p]] == order[:3]


def test_random_draw_is_uniform_over_k_subsets(session: Session) -> None:
    """Every 2-subset of the 4 candidates is drawn about equally often (enumerated: 6 subsets), over 1,800 problems
    asking at once (each problem's draw has keys of its own)."""
    source, *askers = make_problems(session, 1801)
    pool = make_pool(session, "fig2u")
    run = runs.create_run(session, "u", "train", {}, "m", pool.id).id
    record_groups(session, [NewGroup(source, mode, "q", [NewAttempt(f"{mode} {j}", 1.0, True) for j in range(2)],
                                     step=1, run_id=run) for mode in ("zero_shot", "inter")])  # fmt: skip
    drawn = random_attempt_contexts(session, askers, k=2, seed=11, run_id=run)
    counts = Counter(frozenset(i.attempt_id for i in drawn[p]) for p in askers)
    ids = sorted({a for subset in counts for a in subset})
    assert len(ids) == 4 and set(counts) == {frozenset(s) for s in itertools.combinations(ids, 2)}
    expected = len(askers) / 6  # uniform: 300 each, sd about 16
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 20.5, counts  # 5 degrees of freedom: P(chi2 > 20.5) < 0.001


def test_gold_answers_come_from_the_leaked_path_only(session: Session) -> None:
    pids = make_problems(session, 2)
    assert leaked_gold_answers(session, pids) == {p: (f"question {i}?", f"answer-{i}") for i, p in enumerate(pids)}
    questions = leaked_questions(session, pids)
    assert all(f"answer-{i}" in questions[p] and f"question {i}?" in questions[p] for i, p in enumerate(pids))
    session.execute(sa.text("UPDATE problems SET answer = NULL WHERE id = :p"), {"p": pids[1]})
    with pytest.raises(InputError, match="leaked-intra"):
        leaked_gold_answers(session, pids)
