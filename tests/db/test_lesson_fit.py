"""The pool's fit of its lessons' effects (migration 0024, `usefulness.fit_pools`), read where the store reports a
lesson's worth: `lesson_history` (lift, interval, probation), eviction by utility, retirement and the value-aware
draw. Lessons drawn
together, written through `record_groups` as an evaluation writes them (exact baselines), in the cases the share
per item (`credit / graded`, the estimator before 0024) gets wrong: a lesson that does nothing beside one that
helps, and one that undoes its partner's help."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from store_helpers import make_pool, make_problems, relevance

from lanpo.config import StoreConfig
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import usefulness
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.sampling import Ranking, sample_inter

OPEN = StoreConfig(per_problem_cap=10_000, per_step_cap=10_000)
RIGHT, WRONG = NewAttempt("r", 1.0, True), NewAttempt("r", 0.0, False)
HISTORY = sa.text("SELECT version_id, lift, lift_low, lift_high, probation, credit, graded FROM lesson_history")


def _lessons(session: Session, name: str, names: list[str], store: StoreConfig = OPEN) -> tuple:
    """Pool `name`; problems 0..19 of dataset `name`; one lesson per name, each of its own problem (1, 2, ...), all
    relevant to problem 0 (scores falling in name order). Returns the problems, the lessons' versions and the pool."""
    problems = make_problems(session, 20, dataset=name)
    pool = make_pool(session, name, store)
    versions = []
    for i, lesson in enumerate(names, start=1):
        versions += add_experiences(session, pool, [NewExperience(problems[i], lesson)]).version_ids
        relevance(session, problems[0], problems[i], 0.9 - 0.01 * i)
    return problems, versions, pool


def _use(session: Session, run: int, problem: int, step: int, lessons: list[int], zero_shot: list, answers: list):
    """One use at (run, step, problem): a zero-shot group (the exact baseline) and a group whose context holds
    `lessons`."""
    context = [ContextRef(i, experience_version_id=v) for i, v in enumerate(lessons)]
    record_groups(session, [
        NewGroup(problem, "zero_shot", "q", zero_shot, step=step, run_id=run),
        NewGroup(problem, "retrieval", "q", answers, step=step, run_id=run, contexts=context),
    ])  # fmt: skip


def _answers(right: int, of: int = 10) -> list[NewAttempt]:
    return [RIGHT] * right + [WRONG] * (of - right)


def test_a_lesson_that_does_nothing_beside_one_that_helps(session: Session) -> None:
    """Zero-shot 5 of 10 right. `helps` lifts it to 8 of 10, alone (4 uses) and beside `idle` (4 uses: `idle` is
    never drawn without it); `slight` lifts it to 6 of 10, alone (4 uses). The share credits `idle` half of every
    gain, 0.15 a use, more than `slight` earns, so eviction by utility keeps `idle` and evicts `slight`; the fit
    credits `helps` with the gains and `idle` with what is left, near 0 (its interval spanning 0), and `idle` leaves
    first."""
    store = StoreConfig(per_problem_cap=10_000, per_step_cap=10_000, eviction="lowest_utility", min_uses=2)
    problems, (helps, idle, slight), pool = _lessons(session, "idle", ["helps", "idle", "slight"], store)
    run = runs_repo.create_run(session, "idle", "eval", {}).id
    for step in range(12):
        lessons, right = ([helps], 8) if step < 4 else ([helps, idle], 8) if step < 8 else ([slight], 6)
        _use(session, run, problems[5 + step], step, lessons, _answers(5), _answers(right))
    rows = {r.version_id: r for r in session.execute(HISTORY)}
    share = {v: rows[v].credit / rows[v].graded for v in (helps, idle, slight)}
    assert share == pytest.approx({helps: 0.225, idle: 0.15, slight: 0.1})  # the estimator before 0024
    assert rows[helps].lift == pytest.approx(0.3) and rows[helps].probation == "helps"  # its gain alone and beside
    assert rows[idle].lift < rows[slight].lift < share[idle] and rows[idle].lift_low < 0 < rows[idle].lift_high
    assert rows[idle].probation == "trying"
    assert rows[slight].lift == pytest.approx(0.1)
    pool = replace(pool, global_cap=2)  # a fourth lesson, untried, goes over a cap of 2
    gone = add_experiences(session, pool, [NewExperience(problems[4], "new")]).evicted_ids
    names = session.scalars(sa.text("SELECT v.summary FROM experience_versions v WHERE v.experience_id = ANY(:e)"),
                            {"e": gone})  # fmt: skip
    assert sorted(names) == ["idle", "new"]  # the untried one at the prior's 0, and `idle`, the lowest tried


def _undone(session: Session, name: str, store: StoreConfig) -> tuple:
    """`helps` turns wrong answers right alone (6 uses); beside `undoes` (6 uses) the answers stay wrong. Returns
    the problems, the two versions, the pool and their lesson_history rows."""
    problems, (helps, undoes), pool = _lessons(session, name, ["helps", "undoes"], store)
    run = runs_repo.create_run(session, name, "eval", {}).id
    for step in range(12):
        lessons, answers = ([helps], [RIGHT, RIGHT]) if step % 2 == 0 else ([helps, undoes], [WRONG, WRONG])
        _use(session, run, problems[5 + step], step, lessons, [WRONG, WRONG], answers)
    rows = {r.version_id: r for r in session.execute(HISTORY)}
    assert rows[undoes].credit == 0.0  # the share: nothing gained, nothing lost, as a lesson that does nothing
    assert rows[undoes].lift < -0.5 and rows[helps].lift > 0.5
    return problems, helps, undoes, pool, rows


def test_a_lesson_that_undoes_its_partners_help_is_retired(session: Session) -> None:
    """The share credits `undoes` 0 a use, so no bound of its could fall below 0; the fit puts it near -1, and the
    pool's `retire_below` = 0 retires it, `helps` staying."""
    store = StoreConfig(per_problem_cap=10_000, per_step_cap=10_000, retire_below=0.0, min_uses=2)
    _, helps, undoes, pool, rows = _undone(session, "undo", store)
    assert (rows[undoes].probation, rows[helps].probation) == ("retired", "helps")
    evicted = dict(session.execute(sa.text("SELECT id, evicted_by FROM experiences WHERE pool_id = :p"),
                                   {"p": pool.id}).all())  # fmt: skip
    assert sorted(evicted.values(), key=str) == [None, "retired:harmful"]


def test_a_lesson_that_undoes_its_partners_help_is_never_drawn_by_value(session: Session) -> None:
    """In a pool that retires nothing, `undoes` stays, `hurts`: its value, the upper bound on its effect, lies below
    the draws' `value_bound` of 0, so a value-aware draw leaves it out (the share's value, 0 plus what is unknown,
    would draw it) and the paper's ranking still draws it."""
    problems, helps, undoes, pool, rows = _undone(session, "undo-open", OPEN)
    assert rows[undoes].probation == "hurts"
    by_value = sample_inter(session, [problems[0]], 2, 8, 0, 0.5, "s", pool.id, ranking=Ranking("value"))
    assert [d.candidate_id for d in by_value[problems[0]]] == [helps]
    by_relevance = sample_inter(session, [problems[0]], 2, 8, 0, 0.5, "s", pool.id)
    assert sorted(d.candidate_id for d in by_relevance[problems[0]]) == [helps, undoes]


def test_the_fit_is_the_pools_and_a_refit_changes_nothing(session: Session) -> None:
    """A use of `b` beside `a` moves `a`'s evidence too: the fit covers every version of the pool, not only those
    a write touched. Another pool's lessons are fitted on their own. Fitting again from the same uses writes the
    same rows."""
    problems, (a, b), _ = _lessons(session, "moves", ["a", "b"])
    other_problems, (c,), _ = _lessons(session, "moves-other", ["c"])
    run = runs_repo.create_run(session, "moves", "eval", {}).id
    _use(session, run, problems[10], 0, [a], [WRONG, WRONG], [RIGHT, WRONG])
    _use(session, run, other_problems[10], 0, [c], [WRONG, WRONG], [RIGHT, RIGHT])
    before = usefulness.of_versions(session, [a, c])
    _use(session, run, problems[11], 1, [a, b], [WRONG, WRONG], [RIGHT, RIGHT])
    after = usefulness.of_versions(session, [a, b, c])
    assert after[a].uses == before[a].uses + 1 and after[b].uses == 1
    assert after[c] == before[c]  # another pool's lessons are fitted on their own: this use leaves them alone
    usefulness.refit(session)
    assert usefulness.of_versions(session, [a, b, c]) == after
