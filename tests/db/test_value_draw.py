"""Value-aware inter draws (`feedback.inter.rank = "value"`, docs/concepts.md "Lessons on probation"): candidates
ranked by `lanpo_lesson_value`, an upper confidence bound on lift, with those below `value_bound` never drawn; the
paper's ranking unchanged; the SQL function equal to its Python twin; and with `shows = "response"` a merged
lesson shows its current version's source rollout."""

from __future__ import annotations

import itertools

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from store_helpers import make_experiences, make_pool, make_problems, relevance

from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import usefulness
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import append_version
from lanpo.db.repo.sampling import (
    VALUE_Z,
    Ranking,
    lesson_value,
    lesson_values,
    pool_prior_mean,
    sample_inter,
    sample_inter_unfiltered,
)
from lanpo.errors import InputError

VALUE = Ranking("value", prior_sd=0.15, value_bound=0.0)


def test_the_sql_function_is_its_python_twin(session: Session) -> None:
    grid = list(itertools.product([0, 1, 4, 37], [-3.0, 0.0, 2.5], [0.0, 1e-12, 0.4, 9.0], [0.05, 0.15, 1.0]))
    for graded, credit, var, sd in grid:
        got = session.scalar(
            sa.text("SELECT lanpo_lesson_value(:g, :c, :v, :sd, :z)"),
            {"g": graded, "c": credit, "v": var, "sd": sd, "z": VALUE_Z},
        )
        assert got == pytest.approx(lesson_value(graded, credit, var, sd), rel=1e-12, abs=1e-12)
    assert session.scalar(sa.text("SELECT lanpo_lesson_value(NULL, NULL, NULL, 0.15, 1.96)")) == pytest.approx(0.294)


def test_the_six_argument_function_is_its_python_twin_and_the_five_at_mean_0(session: Session) -> None:
    """Migration 0025: the value under a N(prior_mean, prior_sd^2) prior; at prior_mean 0 it is 0020's value."""
    grid = itertools.product([0, 1, 4, 37], [-3.0, 0.0, 2.5], [0.0, 0.4, 9.0], [0.05, 0.15], [-0.3, 0.0, 0.2])
    for graded, credit, var, sd, mean in grid:
        args = {"g": graded, "c": credit, "v": var, "sd": sd, "z": VALUE_Z, "m": mean}
        got = session.scalar(sa.text("SELECT lanpo_lesson_value(:g, :c, :v, :sd, :z, :m)"), args)
        assert got == pytest.approx(lesson_value(graded, credit, var, sd, prior_mean=mean), rel=1e-12, abs=1e-12)
        if mean == 0.0:
            five = session.scalar(sa.text("SELECT lanpo_lesson_value(:g, :c, :v, :sd, :z)"), args)
            assert got == pytest.approx(five, rel=1e-12, abs=1e-12)
    untried = session.scalar(sa.text("SELECT lanpo_lesson_value(0, 0, 0, 0.1, 1.96, -0.3)"))
    assert untried == pytest.approx(-0.3 + 0.196)


def _world(session: Session, name: str) -> tuple:
    """Problem 0 asks; problems 1-4 each hold one lesson, all relevant to problem 0 (0.95, 0.9, 0.85, 0.8)."""
    pool = make_pool(session, name)
    problems = make_problems(session, 8, dataset=name)
    lessons = [make_experiences(session, p, 1, pool)[0] for p in problems[1:5]]
    for p, score in zip(problems[1:5], (0.95, 0.9, 0.85, 0.8), strict=True):
        relevance(session, problems[0], p, score)
    run = runs_repo.create_run(session, name, "eval", {}, pool_id=pool.id).id
    return pool, problems, lessons, run


def _use(
    session: Session, run: int, problem: int, version: int, zero_shot: bool, with_lesson: bool, step: int = 0
) -> None:
    """One use with an exact baseline: a zero-shot answer and an answer with the lesson, each right or wrong, at
    `step` (uses of one problem at one step share their zero-shot baseline)."""
    lesson = [ContextRef(0, experience_version_id=version)]
    record_groups(session, [
        NewGroup(problem, "zero_shot", "q", [NewAttempt("r", float(zero_shot), zero_shot)], step=step, run_id=run),
        NewGroup(problem, "retrieval", "q", [NewAttempt("r", float(with_lesson), with_lesson)], step=step,
                 run_id=run, contexts=lesson),
    ], retire=False)  # fmt: skip


def _value(session: Session, version: int, ranking: Ranking = VALUE) -> float:
    u = usefulness.of_versions(session, [version]).get(version)
    if u is None:
        return lesson_value(0, 0.0, 0.0, ranking.prior_sd)
    return lesson_value(u.graded, u.credit, u.credit_var, ranking.prior_sd)


def _drawn(session: Session, pool_id: int, problem: int, ranking: Ranking, k: int = 4, gamma: float = 0.5) -> list:
    got = sample_inter(session, [problem], k, 8, 0, gamma, "s", pool_id, ranking=ranking)[problem]
    return sorted(got, key=lambda d: d.rank)


def test_value_ranks_helped_then_untried_then_even_and_never_draws_what_hurts(session: Session) -> None:
    pool, problems, (helped, even, hurt, untried), run = _world(session, "ranks")
    for p in problems[5:8]:
        _use(session, run, p, helped, zero_shot=False, with_lesson=True, step=0)
        _use(session, run, p, even, zero_shot=True, with_lesson=True, step=1)
        _use(session, run, p, hurt, zero_shot=True, with_lesson=False, step=2)
    values = {v: _value(session, v) for v in (helped, even, hurt, untried)}
    assert values[helped] > values[untried] > values[even] > 0 > values[hurt]
    by_value = _drawn(session, pool.id, problems[0], VALUE)
    assert [d.candidate_id for d in by_value] == [helped, untried, even]  # ranked by value; hurt is left out
    by_relevance = _drawn(session, pool.id, problems[0], Ranking())
    assert [d.candidate_id for d in by_relevance] == [helped, even, hurt, untried]  # the paper's: relevance
    unfiltered = sample_inter_unfiltered(session, [problems[0]], 4, 8, 0, pool.id, ranking=VALUE)[problems[0]]
    assert sorted(d.candidate_id for d in unfiltered) == sorted([helped, untried, even])


def test_nothing_passes_the_bound_so_nothing_is_drawn(session: Session) -> None:
    pool, problems, lessons, run = _world(session, "fallback")
    for (step, version), p in itertools.product(enumerate(lessons), problems[5:8]):
        _use(session, run, p, version, zero_shot=True, with_lesson=False, step=step)
    assert all(_value(session, v) < 0 for v in lessons)
    assert _drawn(session, pool.id, problems[0], VALUE) == []  # the prompt goes zero-shot
    assert sample_inter_unfiltered(session, [problems[0]], 2, 8, 0, pool.id, ranking=VALUE)[problems[0]] == []
    assert len(_drawn(session, pool.id, problems[0], Ranking())) == 4  # the paper's ranking draws them all


@pytest.mark.parametrize(("offset", "drawn"), [(-1e-9, True), (0.0, True), (1e-9, False)])
def test_the_value_bound_at_below_and_above(session: Session, offset: float, drawn: bool) -> None:
    """A lesson is drawn when its value is at or above value_bound, not below it."""
    pool, problems, lessons, run = _world(session, f"bound{offset}")
    _use(session, run, problems[5], lessons[0], zero_shot=True, with_lesson=True)
    bound = _value(session, lessons[0]) + offset
    ranking = Ranking("value", prior_sd=0.15, value_bound=bound)
    assert (lessons[0] in [d.candidate_id for d in _drawn(session, pool.id, problems[0], ranking)]) is drawn


def test_value_reads_beyond_the_relevance_top_candidates(session: Session) -> None:
    """The paper's pool is the top `candidates` by relevance; value ranks every relevant lesson, so a helpful
    lesson of the least relevant problem is still found."""
    pool, problems, lessons, run = _world(session, "deep")
    for p in problems[5:8]:
        _use(session, run, p, lessons[3], zero_shot=False, with_lesson=True)
    got = sample_inter(session, [problems[0]], 1, 1, 0, 0.5, "s", pool.id, ranking=VALUE)[problems[0]]
    assert [d.candidate_id for d in got] == [lessons[3]]
    paper = sample_inter(session, [problems[0]], 1, 1, 0, 0.5, "s", pool.id)[problems[0]]
    assert [d.candidate_id for d in paper] == [lessons[0]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": "recency"}, "rank"),
        ({"prior_sd": 0.0}, "prior_sd"),
        ({"value_bound": 1.5}, "value_bound"),
        ({"prior": "ridge"}, "prior"),
    ],
)
def test_a_ranking_out_of_range_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(InputError, match=match):
        Ranking(**kwargs)


def test_shows_response_shows_the_current_versions_source(session: Session) -> None:
    """A lesson merged with a higher-reward rollout's summary shows that rollout's response, not version 1's."""
    pool, problems, (first, *_), run = _world(session, "merged")
    old, new = (
        record_groups(session, [NewGroup(problems[1], "zero_shot", "q", [NewAttempt(text, 1.0, True)], run_id=run)])[
            0
        ][0]
        for text in ("the first rollout", "the better rollout")
    )
    experience = session.scalar(sa.text("SELECT experience_id FROM experience_versions WHERE id = :v"), {"v": first})
    session.execute(
        sa.text("UPDATE experience_versions SET source_attempt_id = :a WHERE id = :v"), {"a": old, "v": first}
    )
    merged = append_version(session, experience, "merged lesson")
    session.execute(
        sa.text("UPDATE experience_versions SET source_attempt_id = :a WHERE id = :v"), {"a": new, "v": merged}
    )
    for ranking in (Ranking(), VALUE):
        got = sample_inter(session, [problems[0]], 4, 8, 0, 0.5, "s", pool.id, shows_response=True, ranking=ranking)
        texts = {d.text for d in got[problems[0]]}
        assert "the better rollout" in texts and "the first rollout" not in texts


def test_retrieval_by_value_leaves_out_what_hurts_and_keeps_the_paper_order_otherwise(session: Session) -> None:
    """`rank_by_value`, what `retrieve` applies to its relevance-ranked hits (retrieval.rank = value)."""
    from lanpo.db.repo.sampling import rank_by_value
    from lanpo.retrieval.testtime import Retrieved

    _, problems, (helped, even, hurt, untried), run = _world(session, "retrieval")
    for p in problems[5:8]:
        _use(session, run, p, helped, zero_shot=False, with_lesson=True, step=0)
        _use(session, run, p, hurt, zero_shot=True, with_lesson=False, step=2)
    hits = [Retrieved(v, 0, "s", 1.0, r) for v, r in ((hurt, 0.99), (untried, 0.98), (even, 0.97), (helped, 0.96))]
    by_value = rank_by_value(session, hits, lambda h: h.experience_version_id, VALUE)
    assert [h.experience_version_id for h in by_value] == [helped, untried, even]  # untried ones tie: relevance order
    assert rank_by_value(session, hits, lambda h: h.experience_version_id, Ranking()) == hits


def _graded(session: Session, pool_id: int) -> list[tuple[float, float, float]]:
    """(graded, net_credit, net_credit_var) of the current version of each of the pool's graded lessons, read
    directly: the reference the pool prior's SQL is checked against."""
    rows = session.execute(
        sa.text(
            "SELECT u.graded, u.net_credit, u.net_credit_var FROM experiences e"
            " JOIN experience_versions v ON v.experience_id = e.id"
            " JOIN lesson_usefulness u ON u.version_id = v.id"
            " WHERE e.pool_id = :p AND u.graded > 0"
            " AND v.version = (SELECT max(version) FROM experience_versions WHERE experience_id = e.id)"
        ),
        {"p": pool_id},
    )
    return [tuple(map(float, r)) for r in rows]


def test_the_pool_prior_is_the_graded_lessons_shrunk_mean_and_0_without_any(session: Session) -> None:
    pool, problems, (helped, even, hurt, _untried), run = _world(session, "prior")
    mean = sa.text("SELECT lanpo_pool_prior_mean(:p, :sd)")
    assert session.scalar(mean, {"p": pool.id, "sd": 0.1}) == 0.0  # nothing graded: the fixed prior
    for p in problems[5:8]:
        _use(session, run, p, helped, zero_shot=False, with_lesson=True, step=0)
        _use(session, run, p, hurt, zero_shot=True, with_lesson=False, step=2)
        _use(session, run, p, even, zero_shot=True, with_lesson=False, step=3)
    graded = _graded(session, pool.id)
    assert len(graded) == 3  # the untried lesson adds nothing
    for sd in (0.05, 0.1, 0.3):
        got = session.scalar(mean, {"p": pool.id, "sd": sd})
        assert got == pytest.approx(pool_prior_mean(graded, sd), rel=1e-12)
    assert pool_prior_mean(graded, 0.1) < 0  # two of three lessons hurt
    assert pool_prior_mean([], 0.1) == 0.0


def _hurting_pool(session: Session, name: str) -> tuple:
    """Three lessons that hurt on every use, and one untried: the pool the reuse experiment's value arm met."""
    pool, problems, lessons, run = _world(session, name)
    for (step, version), p in itertools.product(enumerate(lessons[:3]), problems[5:8]):
        _use(session, run, p, version, zero_shot=True, with_lesson=False, step=step)
    return pool, problems, lessons, run


def test_where_the_pool_s_lessons_hurt_an_untried_one_is_not_drawn_under_the_pool_prior(session: Session) -> None:
    pool, problems, lessons, _ = _hurting_pool(session, "hurting")
    untried = lessons[3]
    zero = Ranking("value", prior_sd=0.1)
    eb = Ranking("value", prior_sd=0.1, prior="pool")
    assert [d.candidate_id for d in _drawn(session, pool.id, problems[0], zero)] == [untried]  # worth +0.196
    mu = pool_prior_mean(_graded(session, pool.id), 0.1)
    assert mu + VALUE_Z * 0.1 < 0  # worth less than nothing
    assert _drawn(session, pool.id, problems[0], eb) == []  # the prompt goes zero-shot
    assert sample_inter_unfiltered(session, [problems[0]], 2, 8, 0, pool.id, ranking=eb)[problems[0]] == []
    values = lesson_values(session, [untried], eb)
    assert values[untried] == pytest.approx(mu + VALUE_Z * 0.1)
    assert lesson_values(session, [untried], zero)[untried] == pytest.approx(VALUE_Z * 0.1)


@pytest.mark.parametrize(("offset", "drawn"), [(-1e-9, True), (0.0, True), (1e-9, False)])
def test_the_untried_lesson_under_the_pool_prior_at_below_and_above_the_bound(
    session: Session, offset: float, drawn: bool
) -> None:
    """Under `prior = pool` an untried lesson is worth mu + z s: drawn at or above value_bound, not below."""
    pool, problems, lessons, _ = _hurting_pool(session, f"eb-bound{offset}")
    mu = pool_prior_mean(_graded(session, pool.id), 0.1)
    ranking = Ranking("value", prior_sd=0.1, value_bound=mu + VALUE_Z * 0.1 + offset, prior="pool")
    assert (lessons[3] in [d.candidate_id for d in _drawn(session, pool.id, problems[0], ranking)]) is drawn
