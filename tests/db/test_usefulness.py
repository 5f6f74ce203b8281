"""lesson_usefulness kept current by the writers, against a loop estimator over the raw rows and experience_usage.

The store is written the way runs write it: training steps through `write_step_rows` (consecutive ids, one
transaction per step, a new policy version per step), contexts of 1 and 2 lessons, zero-shot groups at some keys and
not others (one of another policy version, one written in a later transaction), an ungraded attempt, and an
evaluation's answers graded later by verdicts (`record_feedback`), one verdict replacing another.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from store_helpers import UNCAPPED, make_experiences, make_pool, make_problems

from lanpo.db import migrate, sqlfiles
from lanpo.db.connection import transaction
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo import usefulness
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.sampling import EFFECT_PRIOR_SD
from lanpo.db.repo.serving import record_feedback
from lanpo.feedback.record import GroupRecord, RolloutRecord, write_step_rows

LESSON = "## Flow\nlesson {i}\n## Principles\nrule\n## Pitfalls\nslip"


def _rollouts(rng: random.Random, summaries: int = 0) -> list[RolloutRecord]:
    out = []
    for j in range(2):
        correct = rng.random() < 0.5
        summary = LESSON.format(i=rng.random()) if j < summaries else None
        out.append(RolloutRecord(f"r{j}", float(correct), correct, True, 5, False, summary))
    return out


def _write_store(session: Session, seed: int = 3) -> dict[str, object]:
    """Steps 1-3 of a training run, then a late zero-shot group and an evaluation graded by verdicts."""
    rng = random.Random(seed)
    problems = make_problems(session, 4, dataset="use")
    pool = make_pool(session, "use")
    run = runs_repo.create_run(session, "use", "train", {}, pool_id=pool.id).id
    pv = steps_repo.add_policy_version(session, run, 0, "0" * 64)
    steps_repo.commit_step(session, run, 0, pv)
    first_pv, versions = pv, []
    for step in (1, 2, 3):
        if step == 1:  # the lessons: one per problem, from zero-shot rollouts
            groups = [GroupRecord(p, "zero_shot", "q", 9, [], _rollouts(rng, summaries=1)) for p in problems]
        else:
            groups = []
            for i, p in enumerate(problems):
                k = 1 + (i + step) % 2
                picked = [versions[(i + step + j) % len(versions)] for j in range(k)]
                contexts = [ContextRef(pos, experience_version_id=v, score=0.9) for pos, v in enumerate(picked)]
                groups.append(GroupRecord(p, "inter", "q+lessons", 30, contexts, _rollouts(rng)))
                if (i + step) % 3 != 0:  # a same-step zero-shot baseline at some keys only
                    groups.append(GroupRecord(p, "zero_shot", "q", 9, [], _rollouts(rng)))
        write_step_rows(session, run, pool, step, pv, groups, "policy")
        if step == 3:  # an ungraded use, and a zero-shot group of another policy version (never a baseline here)
            lesson = [ContextRef(0, experience_version_id=versions[1])]
            record_groups(session, [
                NewGroup(problems[0], "inter", "q", [NewAttempt("r"), NewAttempt("r", 1.0, True)], step=3,
                         run_id=run, policy_version_id=pv, contexts=lesson),
                NewGroup(problems[2], "zero_shot", "q", [NewAttempt("r", 1.0, True)], step=3, run_id=run,
                         policy_version_id=first_pv),
            ])  # fmt: skip
        pv = steps_repo.add_policy_version(session, run, step, f"{step:x}" * 64)
        steps_repo.commit_step(session, run, step, pv)
        session.commit()
        if step == 1:
            versions = list(session.scalars(sa.text("SELECT id FROM experience_versions ORDER BY id")))
            assert versions == list(range(versions[0], versions[0] + 4)), "one insert: consecutive ids"
    # a zero-shot group at a key of step 3 where no baseline was, in a later transaction: it changes that use
    late = [NewAttempt("r", 1.0, True), NewAttempt("r", 0.0, False), NewAttempt("r", 0.0, False)]
    policy_3 = steps_repo.policy_version_id(session, run, 2)
    record_groups(
        session, [NewGroup(problems[0], "zero_shot", "q", late, step=3, run_id=run, policy_version_id=policy_3)]
    )
    session.commit()
    # an evaluation: answers with no gold answer, graded later by verdicts, against zero-shot answers
    ev = runs_repo.create_run(session, "use-eval", "eval", {}).id
    pair = [ContextRef(0, experience_version_id=versions[3]), ContextRef(1, experience_version_id=versions[2])]
    (served, zero) = record_groups(session, [
        NewGroup(problems[1], "retrieval", "q", [NewAttempt("r"), NewAttempt("r")], step=0, run_id=ev, contexts=pair),
        NewGroup(problems[1], "zero_shot", "q", [NewAttempt("r", 1.0, True), NewAttempt("r")], step=0, run_id=ev),
    ])  # fmt: skip
    session.commit()
    before = usefulness.of_versions(session, versions)
    for attempt, correct in ((served[0], False), (served[1], True), (zero[1], True), (served[0], True)):
        record_feedback(session, attempt, reward=None, correct=correct, gold_answer=None, key_name="k")
    record_feedback(session, served[1], reward=0.5, correct=None, gold_answer=None, key_name="k")  # no verdict
    # a graded answer of the evaluation with a lesson and no zero-shot answer: unknown (no estimate outside training)
    lone = [ContextRef(0, experience_version_id=versions[0])]
    record_groups(session, [NewGroup(problems[2], "retrieval", "q", [NewAttempt("r", 1.0, True)], step=0, run_id=ev,
                                     contexts=lone)])  # fmt: skip
    # a training run whose pool keeps exact baselines only: its use at a step without one stays unknown
    exact_pool = make_pool(session, "use-exact", replace(UNCAPPED, baseline_half_life=0.0))
    exact = runs_repo.create_run(session, "use-exact", "train", {}, pool_id=exact_pool.id).id
    record_groups(session, [
        NewGroup(problems[3], "zero_shot", "q", [NewAttempt("r", 1.0, True)], step=1, run_id=exact),
        NewGroup(problems[3], "inter", "q", [NewAttempt("r", 0.0, False)], step=2, run_id=exact, contexts=lone),
    ])  # fmt: skip
    session.commit()
    return {"run": run, "versions": versions, "before_verdicts": before, "problems": problems}


def _beta_var(successes: float, failures: float) -> float:
    """The variance of a Beta(successes + 1, failures + 1)."""
    a, b = successes + 1.0, failures + 1.0
    return a * b / ((a + b) ** 2 * (a + b + 1.0))


def _reference_uses(session: Session) -> dict[tuple[int, int], tuple]:
    """The definition, as a loop over the raw rows: per use (version, group) its (m, outcome, graded, credit,
    baseline, baseline_n, baseline_source, credit_var). The baseline: exact (the same run, step, problem and policy
    version's zero-shot attempts), else in a training run whose pool has half-life h > 0 the estimate from the run's
    zero-shot attempts at steps s - 4h .. s, weighted 0.5 ** ((s - s') / h): the problem's own, with all problems'
    mean as a prior worth kappa attempts."""
    kind = dict(session.execute(sa.text("SELECT id, kind FROM runs")).all())
    pool_of = dict(session.execute(sa.text("SELECT id, pool_id FROM runs")).all())
    settings = {
        r.id: (r.baseline_half_life, r.baseline_prior)
        for r in session.execute(sa.text("SELECT id, baseline_half_life, baseline_prior FROM pools"))
    }
    groups = session.execute(
        sa.text("SELECT id, run_id, step, problem_id, policy_version_id, mode FROM rollout_groups")
    ).all()
    verdict: dict[int, bool] = {}
    for f in session.execute(sa.text("SELECT attempt_id, correct FROM answer_feedback ORDER BY created_at, id")):
        if f.correct is not None:
            verdict[f.attempt_id] = f.correct  # the latest wins
    correct: dict[int, list[int]] = defaultdict(list)  # group -> its graded attempts' correctness
    for a in session.execute(sa.text("SELECT id, group_id, correct FROM attempts")):
        c = a.correct if a.correct is not None else verdict.get(a.id)
        if c is not None:
            correct[a.group_id].append(int(c))
    items: dict[int, list[int]] = defaultdict(list)
    for c in session.execute(sa.text("SELECT group_id, experience_version_id FROM group_contexts")):
        if c.experience_version_id is not None:
            items[c.group_id].append(c.experience_version_id)
    zero_shot: dict[tuple, list[int]] = defaultdict(list)
    for g in groups:
        if g.mode == "zero_shot" and g.run_id is not None and g.step is not None:
            zero_shot[(g.run_id, g.step, g.problem_id, g.policy_version_id)] += correct[g.id]

    def estimate(g: object) -> tuple[float, float] | None:
        if kind.get(g.run_id) != "train" or pool_of[g.run_id] is None:  # type: ignore[attr-defined]
            return None
        h, kappa = settings[pool_of[g.run_id]]  # type: ignore[attr-defined]
        if h <= 0:
            return None
        all_n = all_h = own_n = own_h = 0.0
        for (run, step, problem, _), cs in zero_shot.items():
            if run == g.run_id and g.step - 4 * h <= step < g.step and cs:  # type: ignore[attr-defined]
                w = 0.5 ** ((g.step - step) / h)  # type: ignore[attr-defined]
                all_n, all_h = all_n + w * len(cs), all_h + w * sum(cs)
                if problem == g.problem_id:  # type: ignore[attr-defined]
                    own_n, own_h = own_n + w * len(cs), own_h + w * sum(cs)
        if all_n == 0 or kappa + own_n == 0:
            return None
        return (kappa * all_h / all_n + own_h) / (kappa + own_n), kappa + own_n

    out: dict[tuple[int, int], tuple] = {}
    for g in groups:
        if not items[g.id]:
            continue
        exact = zero_shot.get((g.run_id, g.step, g.problem_id, g.policy_version_id))
        own = correct[g.id]
        if exact:
            base, bn, source = sum(exact) / len(exact), float(len(exact)), "exact"
        elif (found := estimate(g)) is not None:
            (base, bn), source = found, "estimated"
        else:
            base = bn = source = None  # type: ignore[assignment]
        for v in set(items[g.id]):
            m, k = items[g.id].count(v), len(items[g.id])
            if source is None:  # no baseline: unknown, and no graded attempt counts
                out[(v, g.id)] = (m, None, 0, 0.0, None, None, None, 0.0)
                continue
            if not own:  # nothing graded: unknown
                out[(v, g.id)] = (m, None, 0, 0.0, base, bn, source, 0.0)
                continue
            if source == "exact":  # compared exactly
                gain = Fraction(sum(own), len(own)) - Fraction(sum(exact), len(exact))  # type: ignore[arg-type]
            else:
                gain = sum(own) - len(own) * base  # type: ignore[assignment]
            credit = m * sum((c - base) / k for c in own)
            spread = _beta_var(sum(own), len(own) - sum(own)) + _beta_var(base * bn, (1 - base) * bn)
            var = (m * len(own) / k) ** 2 * spread
            outcome = 1 if gain > 0 else -1 if gain < 0 else 0
            out[(v, g.id)] = (m, outcome, m * len(own), credit, base, bn, source, var)
    return out


def _reference(session: Session) -> dict[int, tuple[int, int, int, int, int, int, float, float]]:
    """Per version (uses, helped, hurt, even, unknown, graded, credit, credit_var): the sums of its uses in
    `_reference_uses`."""
    out: dict[int, list] = {}
    for (v, _), (_, outcome, graded, credit, _b, _bn, _source, var) in _reference_uses(session).items():
        row = out.setdefault(v, [0, 0, 0, 0, 0, 0, 0.0, 0.0])
        row[0] += 1
        row[{1: 1, -1: 2, 0: 3, None: 4}[outcome]] += 1
        row[5] += graded
        row[6] += credit
        row[7] += var
    return {v: tuple(r) for v, r in out.items()}  # type: ignore[misc]


def _check_uses(session: Session) -> dict[tuple[int, int], tuple]:
    """lesson_uses holds exactly the uses of `_reference_uses`, each with its outcome; the rows."""
    columns = "m, outcome, graded, credit, baseline, baseline_n, baseline_source, credit_var"
    got = {
        (r[0], r[1]): tuple(r[2:])
        for r in session.execute(sa.text(f"SELECT version_id, group_id, {columns} FROM lesson_uses"))
    }
    want = _reference_uses(session)
    assert set(got) == set(want)
    for use, row in want.items():
        assert got[use][:3] == row[:3] and got[use][6] == row[6], use  # m, outcome, graded, baseline_source
        for i in (3, 4, 5, 7):  # credit, baseline, baseline_n, credit_var
            assert got[use][i] == (None if row[i] is None else pytest.approx(row[i], abs=1e-12)), (use, i)
    return got


def _reference_fit(session: Session) -> dict[int, tuple[float, float]]:
    """Per version of a pool with graded uses, (net_credit, net_credit_var) by the book: per pool, every use row
    with graded attempts of its versions and every version its context held; the use's gain undone from the share,
    d = credit * k / graded, and its variance v = credit_var * k^2 / graded^2; the posterior of the effects with
    precision A = X' W X + I / prior_sd^2 and mean A^-1 X' W d (X of positions m, W = diag(1 / v)); each version's
    marginal with the prior divided out, times graded (and graded^2)."""
    pool_of = dict(session.execute(sa.text(
        "SELECT v.id, e.pool_id FROM experience_versions v JOIN experiences e ON e.id = v.experience_id"
    )).all())  # fmt: skip
    items = sa.text("SELECT group_id FROM group_contexts WHERE experience_version_id IS NOT NULL")
    k = Counter(session.scalars(items))  # each group's lesson items
    rows = session.execute(sa.text("SELECT version_id, group_id, m, graded, credit, credit_var FROM lesson_uses"))
    rows = rows.all()
    out: dict[int, tuple[float, float]] = {}
    tau2 = EFFECT_PRIOR_SD**2
    for pool in {pool_of[r.version_id] for r in rows if r.graded > 0}:
        groups = sorted({r.group_id for r in rows if r.graded > 0 and pool_of[r.version_id] == pool})
        used = [r for r in rows if r.group_id in groups]
        versions = sorted({r.version_id for r in used})
        design = np.zeros((len(groups), len(versions)))
        gain, var, graded = np.zeros(len(groups)), np.zeros(len(groups)), np.zeros(len(versions))
        for r in used:
            g, v = groups.index(r.group_id), versions.index(r.version_id)
            design[g, v] = r.m
            gain[g] = r.credit * k[r.group_id] / r.graded
            var[g] = r.credit_var * k[r.group_id] ** 2 / r.graded**2
            graded[v] += r.graded
        covariance = np.linalg.inv(design.T @ (design / var[:, None]) + np.eye(len(versions)) / tau2)
        mean, marginal = covariance @ (design.T @ (gain / var)), np.diag(covariance)
        lift_var = 1 / (1 / marginal - 1 / tau2)
        for i, v in enumerate(versions):
            if pool_of[v] == pool:
                out[v] = (graded[i] * lift_var[i] * mean[i] / marginal[i], graded[i] ** 2 * lift_var[i])
    return out


def _check_against_reference(session: Session) -> dict[int, usefulness.Usefulness]:
    all_versions = list(session.scalars(sa.text("SELECT id FROM experience_versions")))
    got = usefulness.of_versions(session, all_versions)
    want = _reference(session)
    fit = _reference_fit(session)
    for v in all_versions:
        row = got.get(v, usefulness.Usefulness(v))
        expected = want.get(v, (0, 0, 0, 0, 0, 0, 0.0, 0.0))
        assert (row.uses, row.helped, row.hurt, row.even, row.unknown, row.graded) == expected[:6], v
        assert row.credit == pytest.approx(expected[6], abs=1e-12), v
        assert row.credit_var == pytest.approx(expected[7], abs=1e-12), v
        net, net_var = fit.get(v, (0.0, 0.0))
        assert row.net_credit == pytest.approx(net, abs=1e-9), v
        assert row.net_credit_var == pytest.approx(net_var, rel=1e-9, abs=1e-12), v
    _check_uses(session)
    usage = {r.version_id: r for r in session.execute(sa.text("SELECT * FROM experience_usage"))}
    for v in all_versions:  # experience_usage's estimator is the share: its lift is credit / graded
        row = got.get(v, usefulness.Usefulness(v))
        assert usage[v].uses_with_baseline == row.graded
        share = None if row.graded == 0 else row.credit / row.graded
        assert share == (None if usage[v].lift is None else pytest.approx(usage[v].lift, abs=1e-12))
    return got


def test_usefulness_equals_the_loop_estimator_and_experience_usage(session: Session) -> None:
    built = _write_store(session)
    got = _check_against_reference(session)
    rows = list(got.values())
    for name in ("helped", "hurt", "even", "unknown"):  # the store holds every outcome
        assert sum(getattr(r, name) for r in rows) > 0, name
    assert any(0 < r.unknown < r.uses for r in rows) and any(r.lift is not None for r in rows)
    # contexts of 2 lessons: the fit's lift is not the share's (credit / graded), in both directions
    moved = [r.lift - r.credit / r.graded for r in rows if r.graded]
    assert min(moved) < -0.01 and max(moved) > 0.01
    sources = set(session.scalars(sa.text("SELECT DISTINCT baseline_source FROM lesson_uses")))
    assert sources == {"exact", "estimated", None}  # training's estimates beside exact baselines, and none
    # the verdicts moved the evaluation's uses from unknown to known
    versions = built["versions"]
    before, after = built["before_verdicts"], got  # type: ignore[assignment]
    assert before[versions[3]].unknown > after[versions[3]].unknown  # type: ignore[index]
    # a fresh recompute of every row changes nothing: the writers kept them current
    usefulness.refresh_versions(session, list(got))
    assert usefulness.of_versions(session, list(got)) == got


def test_a_rollback_takes_the_deleted_uses_away(session: Session) -> None:
    built = _write_store(session)
    before = usefulness.of_versions(session, built["versions"])  # type: ignore[arg-type]
    steps_repo.rollback_uncommitted(session, built["run"], 2)  # type: ignore[arg-type]
    after = _check_against_reference(session)
    assert sum(r.uses for r in after.values()) < sum(r.uses for r in before.values())


LOCKS = ["pools_lock", "insert_missing", "lock"]  # the versions' pools, then their rows
FIT = ["fit_uses", "fit_write"]  # the pool's graded uses read, its rows written


def test_what_a_write_costs(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """No lesson and no baseline: no query; a zero-shot group of a run: one look for lessons used at its key; a use
    by a group with no run (never a baseline): its own version's row, with no look, then its pool's fit."""
    (p,) = make_problems(session, 1, dataset="cheap")
    (version,) = make_experiences(session, p, 1)
    loaded: list[str] = []
    real = sqlfiles.load
    monkeypatch.setattr(sqlfiles, "load", lambda name: loaded.append(name) or real(name))

    def looked() -> list[str]:
        names = [n.removeprefix("queries/usefulness_") for n in loaded if "usefulness" in n]
        loaded.clear()
        return names

    record_groups(session, [NewGroup(p, "intra", "q", [NewAttempt("r", 1.0, True)], step=0)])
    assert looked() == []
    record_groups(session, [NewGroup(p, "zero_shot", "q", [NewAttempt("r", 1.0, True)], step=0)])
    assert looked() == []  # no run: never a baseline
    run = runs_repo.create_run(session, "cheap", "eval", {}).id
    record_groups(session, [NewGroup(p, "zero_shot", "q", [NewAttempt("r", 1.0, True)], step=0, run_id=run)])
    assert looked() == ["versions_at"]
    lesson = [ContextRef(0, experience_version_id=version)]
    record_groups(session, [NewGroup(p, "inter", "q", [NewAttempt("r", 1.0, True)], step=0, contexts=lesson)])
    assert looked() == [*LOCKS, "uses_recompute", "recompute", *FIT]
    assert usefulness.of_versions(session, [version])[version] == usefulness.Usefulness(version, uses=1, unknown=1)
    # a use at a run's key: the versions used there, locked; the uses at that key recomputed; their versions re-summed
    looked()
    record_groups(
        session, [NewGroup(p, "inter", "q", [NewAttempt("r", 0.0, False)], step=0, run_id=run, contexts=lesson)]
    )
    assert looked() == ["versions_at", *LOCKS, "uses_recompute", "recompute", *FIT]
    got = usefulness.of_versions(session, [version])[version]
    looked()
    # an ungraded use at the key (a server's answer before feedback): rows refreshed, the fit skipped, as its input
    # (graded uses, graded baselines) is as it was
    record_groups(session, [NewGroup(p, "inter", "q", [NewAttempt("r")], step=0, run_id=run, contexts=lesson)])
    assert looked() == ["versions_at", *LOCKS, "uses_recompute", "recompute"]
    assert usefulness.of_versions(session, [version])[version] == replace(got, uses=3, unknown=2)
    looked()
    assert got == usefulness.Usefulness(version, uses=2, hurt=1, unknown=1, graded=1, credit=-1.0,
                                        credit_var=got.credit_var, net_credit=got.net_credit,
                                        net_credit_var=got.net_credit_var)  # fmt: skip
    assert got.credit_var == pytest.approx(1 / 18 + 1 / 18)  # 0 of 1 and 1 of 1: each a Beta(2, 1)'s variance
    # alone in its one context: the fit's evidence is the use's own gain and variance
    assert (got.net_credit, got.net_credit_var) == pytest.approx((-1.0, got.credit_var), rel=1e-12)
    _check_uses(session)


def test_concurrent_writers_of_one_lesson_lose_no_use(db: Engine) -> None:
    """Two transactions write a use of the same version at once: the second refresher waits for the first to
    commit, and its recompute, a new statement, sees the first's use. A one-statement upsert fails here (its snapshot
    misses the first's use, then it overwrites the first's row: checked by hand). The FOR UPDATE lock also covers
    the moment between the first's lock and its recompute, when the second's insert would not yet wait; this test
    cannot time that."""
    with Session(db) as s:  # commits step by step
        built = _write_store(s, seed=5)
    version = built["versions"][0]  # type: ignore[index]
    problem = built["problems"][0]  # type: ignore[index]
    with transaction(db) as s:
        run = runs_repo.create_run(s, "use-concurrent", "eval", {}).id
        start = usefulness.of_versions(s, [version])[version]
    holding, errors = threading.Event(), []

    def write(step: int, first: bool) -> None:
        try:
            if not first:
                holding.wait(10)
            with transaction(db) as s:
                record_groups(s, [
                    NewGroup(problem, "zero_shot", "q", [NewAttempt("r", 0.0, False)], step=step, run_id=run),
                    NewGroup(problem, "retrieval", "q", [NewAttempt("r", 1.0, True)], step=step, run_id=run,
                             contexts=[ContextRef(0, experience_version_id=version)]),
                ])  # fmt: skip
                if first:
                    holding.set()
                    time.sleep(0.5)  # the other writes its use and waits on the lock meanwhile
        except Exception as exc:  # pragma: no cover - shown by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(step, step == 0)) for step in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    with transaction(db) as s:
        got = usefulness.of_versions(s, [version])[version]
        assert (got.uses, got.helped, got.graded) == (start.uses + 2, start.helped + 2, start.graded + 2)
        _check_against_reference(s)
        usefulness.refresh_versions(s, [version])
        assert usefulness.of_versions(s, [version])[version] == got


def test_lesson_uses_equal_the_loop_estimator_per_use_and_the_migration_fills_them(db: Engine) -> None:
    """Each use's row (m, outcome, graded, credit) as the writers keep it, and as migration 0015 fills it from the
    history (downgraded to 0014, the tables go; upgraded, they are rebuilt from the raw rows)."""
    with Session(db) as s:
        _write_store(s, seed=7)
        kept = _check_uses(s)
        assert {1, -1, 0, None} <= {row[1] for row in kept.values()}  # every outcome
    migrate.downgrade(db, "0014")
    with db.connect() as conn:
        assert not sa.inspect(conn).has_table("lesson_uses")
    migrate.upgrade(db)
    with Session(db) as s:
        filled = _check_against_reference(s)  # each use's row, and each version's sums
        assert set(_check_uses(s)) == set(kept) and sum(r.uses for r in filled.values()) == len(kept)


def test_a_verdict_and_a_new_baseline_at_one_key_at_once_both_reach_the_use(db: Engine) -> None:
    """One use at a key, ungraded and without a baseline. Transaction 1 writes a zero-shot group there (a baseline)
    and holds; transaction 2 grades the use meanwhile. Its refresh waits on the version's lock and recomputes the
    use's row in a new statement, seeing both: even (1 against 1), one graded attempt. A use row recomputed from a
    snapshot read before the wait would stay unknown."""
    with transaction(db) as s:
        (problem,) = make_problems(s, 1, dataset="verdict")
        (version,) = make_experiences(s, problem, 1)
        run = runs_repo.create_run(s, "use-verdict", "eval", {}).id
        lesson = [ContextRef(0, experience_version_id=version)]
        ((answer,),) = record_groups(
            s, [NewGroup(problem, "retrieval", "q", [NewAttempt("r")], step=0, run_id=run, contexts=lesson)]
        )
        assert usefulness.of_versions(s, [version])[version] == usefulness.Usefulness(version, uses=1, unknown=1)
    holding, errors = threading.Event(), []

    def baseline() -> None:
        try:
            with transaction(db) as s:
                zero = NewGroup(problem, "zero_shot", "q", [NewAttempt("z", 1.0, True)], step=0, run_id=run)
                record_groups(s, [zero])
                holding.set()
                time.sleep(0.5)  # the verdict is written and waits on the lock meanwhile
        except Exception as exc:  # pragma: no cover - shown by the assert below
            errors.append(exc)

    def verdict() -> None:
        try:
            holding.wait(10)
            with transaction(db) as s:
                record_feedback(s, answer, reward=None, correct=True, gold_answer=None, key_name="k")
        except Exception as exc:  # pragma: no cover - shown by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=baseline), threading.Thread(target=verdict)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    with transaction(db) as s:
        got = usefulness.of_versions(s, [version])[version]
        assert got == usefulness.Usefulness(
            version,
            uses=1,
            even=1,
            graded=1,
            credit=0.0,
            credit_var=got.credit_var,
            net_credit=0.0,
            net_credit_var=got.net_credit_var,
        )
        assert got.net_credit_var == pytest.approx(got.credit_var, rel=1e-12)
        assert got.credit_var == pytest.approx(2 / 18)  # 1 of 1 against 1 of 1
        _check_against_reference(s)
