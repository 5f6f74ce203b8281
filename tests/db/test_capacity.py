"""Capacity policies: per-step, per-problem and global caps per pool, the three eviction orders, concurrent writers."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from store_helpers import make_pool, make_problems, relevance

from lanpo.config import StoreConfig
from lanpo.db.connection import transaction
from lanpo.db.repo import capacity, usefulness
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.capacity import per_step_admit
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.feedback.record import GroupRecord, RolloutRecord, write_step_rows


def test_per_step_admit_keeps_best_reward_first() -> None:
    kept, dropped = per_step_admit([1, 1, 1, 2, 1], [0.1, None, 0.9, 0.0, 0.5], cap=2)
    assert kept == [2, 3, 4] and dropped == [0, 1]
    assert per_step_admit([], [], 3) == ([], [])
    kept, dropped = per_step_admit([7, 7, 7], [1.0, 1.0, 1.0], cap=2)
    assert (kept, dropped) == ([0, 1], [2])


def _active(session: Session, problem_id: int) -> list[str]:
    return list(
        session.scalars(
            sa.text(
                "SELECT v.summary FROM experiences e JOIN experience_versions v ON v.experience_id = e.id "
                "WHERE e.problem_id = :p AND e.evicted_at IS NULL ORDER BY e.id"
            ),
            {"p": problem_id},
        )
    )


def test_per_step_cap_drops_and_reports(session: Session) -> None:
    pid = make_problems(session, 1)[0]
    items = [NewExperience(pid, f"s{i}", reward=float(i % 4)) for i in range(10)]
    result = add_experiences(session, make_pool(session, "p", StoreConfig(per_step_cap=3)), items)
    assert len(result.experience_ids) == 3 and len(result.dropped) == 7
    assert sorted(_active(session, pid)) == ["s2", "s3", "s7"]  # rewards 3, 3, then 2 (s2 before s6: input order)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("oldest", ["s2", "s3", "s4"]),
        ("lowest_reward", ["s0", "s3", "s4"]),
        ("lowest_relevance", ["s0", "s1", "s4"]),  # s1 0.95, s0 0.2, then unscored (0) by recency
    ],
)
def test_eviction_policies(session: Session, policy: str, expected: list[str]) -> None:
    pid, other = make_problems(session, 2)
    pool = make_pool(session, "p", StoreConfig(per_problem_cap=3, per_step_cap=8, eviction=policy))
    rewards = [0.9, 0.1, 0.2]
    first = add_experiences(session, pool, [NewExperience(pid, f"s{i}", rewards[i]) for i in range(3)])
    assert first.evicted_ids == []
    # relevance of s1's version is high, s0's low; s2 unscored (problem-level fallback: none -> 0)
    session.execute(
        sa.text(
            "INSERT INTO relevance_scores (problem_id, candidate_version_id, scorer, score) VALUES "
            "(:o, :v0, 's', 0.2), (:o, :v1, 's', 0.95)"
        ),
        {"o": other, "v0": first.version_ids[0], "v1": first.version_ids[1]},
    )
    second = add_experiences(session, pool, [NewExperience(pid, f"s{i}", 0.5) for i in (3, 4)])
    assert len(second.evicted_ids) == 2
    assert _active(session, pid) == expected
    marks = (
        session.execute(sa.text("SELECT DISTINCT evicted_by FROM experiences WHERE evicted_at IS NOT NULL"))
        .scalars()
        .all()
    )
    assert marks == [f"per_problem:{policy}"]


def test_lowest_relevance_falls_back_to_problem_score(session: Session) -> None:
    a, b, c = make_problems(session, 3)
    pool = make_pool(session, "p", StoreConfig(per_problem_cap=2, global_cap=2, eviction="lowest_relevance"))
    add_experiences(session, pool, [NewExperience(a, "from a")])
    add_experiences(session, pool, [NewExperience(b, "from b")])
    relevance(session, c, a, 0.3)
    relevance(session, c, b, 0.8)
    result = add_experiences(session, pool, [NewExperience(c, "from c")])  # c unscored: relevance 0
    assert len(result.evicted_ids) == 1
    assert session.scalar(
        sa.text("SELECT evicted_by FROM experiences WHERE id = :i"), {"i": result.evicted_ids[0]}
    ) == ("global:lowest_relevance")
    assert _active(session, a) == ["from a"] and _active(session, b) == ["from b"] and _active(session, c) == []


def test_global_cap_evicts_oldest_across_problems(session: Session) -> None:
    pids = make_problems(session, 3)
    pool = make_pool(session, "p", StoreConfig(per_problem_cap=10, global_cap=4))
    for pid in pids:
        add_experiences(session, pool, [NewExperience(pid, f"{pid}-{i}") for i in range(2)])
    assert session.scalar(sa.text("SELECT count(*) FROM experiences WHERE evicted_at IS NULL")) == 4
    assert _active(session, pids[0]) == []
    assert session.scalar(sa.text("SELECT count(*) FROM experiences")) == 6


@pytest.mark.parametrize("global_cap", [None, 20])
def test_concurrent_writers_never_exceed_caps(db: Engine, global_cap: int | None) -> None:
    store = StoreConfig(per_problem_cap=5, per_step_cap=8, global_cap=global_cap, eviction="lowest_reward")
    with transaction(db) as session:
        pids = make_problems(session, 4)
        pool = make_pool(session, "p", store)
    writers, rounds = 8, 6
    inserted: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(writers)
    lock = threading.Lock()

    def writer(w: int) -> None:
        try:
            barrier.wait()
            for r in range(rounds):
                order = pids if (w + r) % 2 else list(reversed(pids))  # mixed orders: locks must not deadlock
                items = [
                    NewExperience(p, f"w{w} r{r} p{p} #{j}", reward=(w * 7 + r * 3 + j) % 10)
                    for p in order
                    for j in range(3)
                ]
                with transaction(db) as session:
                    result = add_experiences(session, pool, items)
                with lock:
                    inserted.extend(result.experience_ids)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(inserted) == writers * rounds * len(pids) * 3
    with db.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, problem_id, evicted_at, evicted_by FROM experiences")).all()
        versions = conn.scalar(sa.text("SELECT count(*) FROM experience_versions"))
    assert sorted(r.id for r in rows) == sorted(inserted)  # no lost inserts
    assert versions == len(inserted)
    active: dict[int, int] = {}
    for r in rows:
        assert (r.evicted_at is None) == (r.evicted_by is None)
        if r.evicted_at is None:
            active[r.problem_id] = active.get(r.problem_id, 0) + 1
    assert max(active.values()) <= store.per_problem_cap
    assert sum(active.values()) == min(store.per_problem_cap * len(pids), global_cap or 10**9)


def test_caps_are_per_pool(session: Session) -> None:
    """Two pools on the same problems: each keeps its own per-problem and global caps; eviction stays inside."""
    a, b = make_problems(session, 2)
    small = make_pool(session, "small", StoreConfig(per_problem_cap=1, global_cap=1))
    large = make_pool(session, "large", StoreConfig(per_problem_cap=3))
    for i in range(3):
        add_experiences(session, large, [NewExperience(a, f"large a{i}"), NewExperience(b, f"large b{i}")])
    result = add_experiences(session, small, [NewExperience(a, "small a"), NewExperience(b, "small b")])
    assert len(result.evicted_ids) == 1  # the global cap of 1: one of the two new ones leaves
    counts = dict(
        session.execute(
            sa.text(
                "SELECT pl.name, count(*) FILTER (WHERE e.evicted_at IS NULL) FROM experiences e "
                "JOIN pools pl ON pl.id = e.pool_id GROUP BY pl.name"
            )
        ).all()
    )
    assert counts == {"small": 1, "large": 6}  # nothing of "large" was touched by "small"'s caps


def test_a_pool_keeps_its_caps(session: Session) -> None:
    from lanpo.db.repo.pools import ensure_pool, get_pool, resolve_pool
    from lanpo.errors import InputError

    pool = ensure_pool(session, "shared", StoreConfig(per_problem_cap=4))
    assert ensure_pool(session, "shared", StoreConfig(per_problem_cap=4)) == pool  # joining with the same caps
    with pytest.raises(InputError, match=r"per_problem_cap = 4 \(config: 32\)"):
        ensure_pool(session, "shared", StoreConfig())
    with pytest.raises(InputError, match="no pool named 'nope'") as err:
        get_pool(session, "nope")
    assert "shared" in (err.value.hint or "")
    assert resolve_pool(session, None) == pool  # the only pool
    ensure_pool(session, "other", StoreConfig())
    with pytest.raises(InputError, match="holds 2 pools") as err:
        resolve_pool(session, None)
    assert "--pool" in (err.value.hint or "")


def test_oldest_fast_path_evicts_what_the_general_ranking_evicts(session: Session) -> None:
    """evict_per_problem_oldest.sql (the default policy's index-order query) against the general ranking query."""
    from lanpo.db import sqlfiles

    pids = make_problems(session, 5)
    pool = make_pool(session, "p", StoreConfig(per_problem_cap=100, per_step_cap=100))
    rng = __import__("random").Random(7)
    for step in range(4):  # several transactions: created_at differs between steps and ties within one
        items = [NewExperience(p, f"{p}-{step}-{i}", rng.random()) for p in pids for i in range(rng.randrange(6))]
        add_experiences(session, pool, items)
        session.commit()
    for cap in (0, 1, 3, 7, 50):
        chosen = {}
        for name in ("evict_per_problem", "evict_per_problem_oldest"):
            with session.begin_nested() as savepoint:
                chosen[name] = sorted(
                    session.scalars(
                        sqlfiles.load(f"queries/{name}"),
                        {
                            "pool_id": pool.id,
                            "problem_ids": pids,
                            "policy": "oldest",
                            "evicted_by": "t",
                            "cap": cap,
                            "min_uses": 1,
                            "prior_sd": 0.15,
                        },
                    )
                )
                savepoint.rollback()
        assert chosen["evict_per_problem"] == chosen["evict_per_problem_oldest"], cap
        assert cap == 50 or chosen["evict_per_problem"]


def _usefulness(session: Session, version_id: int, known: int, lift: float, unknown: int = 1) -> None:
    """A lesson_usefulness row: `known` uses with an outcome (all helped or all hurt, by lift's sign), one graded
    attempt each, credit = net_credit = lift * known (a fit that found no partner)."""
    helped, hurt = (known, 0) if lift > 0 else (0, known)
    session.execute(
        sa.text(
            "INSERT INTO lesson_usefulness (version_id, uses, helped, hurt, even, unknown, graded, credit, "
            "net_credit) VALUES (:v, :u, :h, :x, 0, :n, :g, :c, :c)"
        ),
        {"v": version_id, "u": known + unknown, "h": helped, "x": hurt, "n": unknown, "g": known, "c": lift * known},
    )


def test_lowest_utility_evicts_the_lesson_that_hurt_not_the_one_that_helped(session: Session) -> None:
    """Uses written as a run writes them: on problem q, a zero-shot baseline of 1/2; the prompt holding the older
    lesson is answered right twice (helped), the one holding the newer wrong twice (hurt). `oldest` would evict
    the one that helped."""
    p, q = make_problems(session, 2)
    pool = make_pool(
        session, "p", StoreConfig(per_problem_cap=2, per_step_cap=8, eviction="lowest_utility", min_uses=1)
    )
    helped, hurt = add_experiences(session, pool, [NewExperience(p, "helped"), NewExperience(p, "hurt")]).version_ids
    wrong, right = NewAttempt("r", 0.0, False), NewAttempt("r", 1.0, True)
    run = runs_repo.create_run(session, "u", "eval", {}).id
    uses = [ContextRef(0, experience_version_id=helped)], [ContextRef(0, experience_version_id=hurt)]
    record_groups(session, [
        NewGroup(q, "zero_shot", "q", [right, wrong], step=1, run_id=run),
        NewGroup(q, "inter", "q", [right, right], step=1, run_id=run, contexts=uses[0]),
        NewGroup(q, "inter", "q", [wrong, wrong], step=1, run_id=run, contexts=uses[1]),
    ])  # fmt: skip
    rows = usefulness.of_versions(session, [helped, hurt])
    assert (rows[helped].helped, rows[hurt].hurt) == (1, 1)
    assert (rows[helped].lift, rows[hurt].lift) == pytest.approx((0.5, -0.5), abs=1e-12)
    result = add_experiences(session, pool, [NewExperience(p, "new")])
    assert _active(session, p) == ["helped", "new"] and len(result.evicted_ids) == 1
    assert session.scalar(
        sa.text("SELECT evicted_by FROM experiences WHERE id = :i"), {"i": result.evicted_ids[0]}
    ) == ("per_problem:lowest_utility")


@pytest.mark.parametrize("scope", ["per_problem", "global"])
@pytest.mark.parametrize(("known", "evicted"), [(2, "untried"), (3, "tried"), (4, "tried")])
def test_lowest_utility_waits_for_min_uses(session: Session, scope: str, known: int, evicted: str) -> None:
    """min_uses = 3. `untried` (the oldest) has 2 known uses and the worst lift, `helper` 5 that helped, `tried`
    `known` with a lift of -0.5; a fourth lesson goes over the cap of 3. At and above min_uses `tried` leaves (its
    expected lift is below 0), though `untried`'s lift is lower; below it `tried` counts as untried too, both at the
    prior's 0 beside `new`, and the oldest of them, `untried`, leaves. `helper`, known to help, stays either way
    (the tried leaving before every untried one evicted the helpful lessons: issue 64, bench/value.py)."""
    pids = make_problems(session, 4)
    caps = {"per_problem_cap": 3} if scope == "per_problem" else {"per_problem_cap": 10, "global_cap": 3}
    pool = make_pool(
        session,
        "p",
        StoreConfig(per_step_cap=8, eviction="lowest_utility", min_uses=3, **caps),  # type: ignore[arg-type]
    )
    where = [pids[0]] * 4 if scope == "per_problem" else pids
    names = ["untried", "helper", "tried", "new"]
    versions = [add_experiences(session, pool, [NewExperience(where[i], names[i])]).version_ids[0] for i in range(3)]
    for version, (count, lift) in zip(versions, [(2, -1.0), (5, 1.0), (known, -0.5)], strict=True):
        _usefulness(session, version, count, lift)
    result = add_experiences(session, pool, [NewExperience(where[3], "new")])
    gone = session.scalars(
        sa.text("SELECT v.summary FROM experience_versions v JOIN experiences e ON e.id = v.experience_id "
                "WHERE e.id = ANY(:ids)"), {"ids": result.evicted_ids}
    ).all()  # fmt: skip
    assert gone == [evicted]
    assert session.scalar(
        sa.text("SELECT evicted_by FROM experiences WHERE id = :i"), {"i": result.evicted_ids[0]}
    ) == (f"{scope}:lowest_utility")


def test_expiry_by_policy_age(session: Session) -> None:
    """max_policy_age = 2 at step 5: lessons by the run's policies of steps 4 (age 1), 3 (age 2) stay, of step 2
    (age 3) expires; another run's, and one with no policy version, never do. write_step_rows counts it before
    adding the step's lesson, and a resume's rollback of step 5 brings it back."""
    pids = make_problems(session, 6)
    pool = make_pool(session, "p", StoreConfig(per_problem_cap=100, per_step_cap=100, max_policy_age=2))
    run = runs_repo.create_run(session, "age", "train", {}, pool_id=pool.id).id
    other = runs_repo.create_run(session, "other", "train", {}, pool_id=pool.id).id
    pv = {s: steps_repo.add_policy_version(session, run, s, f"{s:x}" * 64) for s in range(5)}
    foreign = steps_repo.add_policy_version(session, other, 0, "f" * 64)
    written = {"age 1": pv[4], "age 2": pv[3], "age 3": pv[2], "other run": foreign, "no policy": None}
    for pid, (name, version) in zip(pids, written.items(), strict=False):
        add_experiences(session, pool, [NewExperience(pid, name, policy_version_id=version)])
    assert capacity.expire(session, make_pool(session, "q"), run, 5) == []  # no max_policy_age: nothing
    summary = "## Flow\nnew\n## Principles\nrule\n## Pitfalls\nslip"
    rollout = RolloutRecord("r", 1.0, True, True, 5, False, summary)
    wrote = write_step_rows(
        session, run, pool, 5, pv[4], [GroupRecord(pids[5], "zero_shot", "q", 9, [], [rollout])], "x"
    )
    assert wrote.as_metrics()["pool/expired"] == 1.0 and wrote.added == 1
    expired = session.execute(
        sa.text("SELECT v.summary, e.evicted_by, e.evicted_run_id, e.evicted_step FROM experiences e "
                "JOIN experience_versions v ON v.experience_id = e.id WHERE e.evicted_at IS NOT NULL")
    ).all()  # fmt: skip
    assert [tuple(r) for r in expired] == [("age 3", "expired:policy_age", run, 5)]
    steps_repo.rollback_uncommitted(session, run, 4)
    assert session.scalar(sa.text("SELECT count(*) FROM experiences WHERE evicted_at IS NULL")) == 5


def test_lowest_utility_evicts_the_oldest_untried_when_none_is_tried(session: Session) -> None:
    (p,) = make_problems(session, 1)
    pool = make_pool(
        session, "p", StoreConfig(per_problem_cap=2, per_step_cap=8, eviction="lowest_utility", min_uses=2)
    )
    first = add_experiences(session, pool, [NewExperience(p, "old"), NewExperience(p, "newer")]).version_ids
    _usefulness(session, first[0], 1, 1.0)  # one use short of min_uses
    add_experiences(session, pool, [NewExperience(p, "newest")])
    assert _active(session, p) == ["newer", "newest"]
