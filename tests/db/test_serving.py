"""Migration 0014 and the store side of `lanpo serve`: every call the server makes runs as the serving role, the
role may do nothing else, feedback counts in experience_usage, a request is stored once, and the migration goes
down and up."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from lanpo.db import migrate
from lanpo.db.connection import current_revision, transaction
from lanpo.db.heartbeat import Heartbeat
from lanpo.db.reader import stored_reader
from lanpo.db.readonly import query_readonly
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.judge_cache import cached_judge_scores, question_sha256, store_judge_scores
from lanpo.db.repo.pools import active_size, resolve_pool
from lanpo.db.repo.problems import Question
from lanpo.db.repo.runs import create_run
from lanpo.db.repo.serving import ServedAnswer, record_feedback, record_served, served_answer
from lanpo.db.serve_role import (
    ENV_SERVE_URL,
    LOCK_FUNCTION,
    SEQUENCES,
    TABLE_GRANTS,
    USE_COLUMNS,
    USEFULNESS_COLUMNS,
    renew,
    serve_engine,
    serve_login,
)
from lanpo.errors import InputError, ServingRoleUnavailable
from lanpo.inference.io import question_id
from lanpo.inference.results import Sample, Solution, Turn, UsedExperience
from lanpo.inference.run import InferenceRun
from lanpo.retrieval.corpus import BM25Cache
from lanpo.retrieval.testtime import retrieve
from tests.db.store_helpers import make_pool, make_problems

ROOT = Path(__file__).resolve().parents[2]
LESSONS = [  # BM25 scores a word in half the corpus 0: a few lessons besides the one retrieved
    "factor the quadratic before solving for x",
    "check the units of every speed and distance",
    "draw the triangle and label each side",
    "count the cases one by one before adding",
    "simplify each fraction first",
]


def _migration():
    spec = importlib.util.spec_from_file_location("m0014", ROOT / "migrations/versions/0014_serving.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture
def role(db: Engine) -> Iterator[Engine]:
    """An engine logged in as the serving role."""
    engine = serve_engine(db)
    yield engine
    engine.dispose()


@pytest.fixture
def pool(db: Engine) -> dict[str, int]:
    """A pool with five lessons (made by the owner, as a trainer would)."""
    with transaction(db) as s:
        (source,) = make_problems(s, 1, dataset="train")
        row = make_pool(s, "deploy")
        versions = add_experiences(s, row, [NewExperience(source, text, reward=1.0) for text in LESSONS]).version_ids
    return {"pool": row.id, "source": source, "v0": versions[0], "v1": versions[1]}


def _turn(response: str, prompt: str = "prompt") -> Turn:
    return Turn(prompt, response, "v1", 10, 5, "stop", None, None, None, True)


def _solution(text: str, mode: str, experiences: list[UsedExperience] = (), k: int = 1) -> Solution:  # type: ignore[assignment]
    question = Question(question_id(text), text)
    samples = [Sample([_turn(f"answer {i} to {text}")]) for i in range(k)]
    return Solution(question, mode, samples, list(experiences), None if experiences or mode == "zero_shot" else "no")


def _served(request_id: str, run_id: int, answer_ids: list[int], mode: str = "retrieval") -> ServedAnswer:
    return ServedAnswer(
        request_id, run_id, None, answer_ids, mode, None, {"temperature": 0.0, "n": len(answer_ids)},
        {"queue_ms": 1.0, "retrieval_ms": 2.0, "generate_ms": 30.0, "total_ms": 33.0}, "alice", False,
    )  # fmt: skip


def test_the_role_is_made_as_0014_says(db: Engine) -> None:
    login = serve_login(db)
    with db.connect() as conn:
        assert login.role == _migration().role_name(conn.scalar(sa.text("SELECT current_database()")))
        attributes = conn.execute(
            sa.text(
                "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolinherit, rolreplication, rolbypassrls, "
                "rolconfig FROM pg_roles WHERE rolname = :r"
            ),
            {"r": login.role},
        ).one()
        memberships = conn.scalar(
            sa.text("SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = :r"),
            {"r": login.role},
        )
        tables = conn.execute(
            sa.text(
                "SELECT table_name, string_agg(privilege_type, ', ' ORDER BY privilege_type) FROM "
                "information_schema.role_table_grants WHERE grantee = :r GROUP BY 1 ORDER BY 1"
            ),
            {"r": login.role},
        ).all()
        columns = conn.execute(
            sa.text(
                "SELECT table_name, privilege_type, string_agg(column_name, ', ' ORDER BY column_name) "
                "FROM information_schema.column_privileges WHERE grantee = :r AND privilege_type = 'UPDATE' "
                "GROUP BY 1, 2 ORDER BY 1"
            ),
            {"r": login.role},
        ).all()
    assert tuple(attributes)[:7] == (True, False, False, False, False, False, False)
    assert attributes.rolconfig == ["statement_timeout=30s"] and memberships == 0
    assert dict(tables) == {
        "answer_feedback": "INSERT, SELECT",
        "attempts": "INSERT, SELECT",
        "experience_versions": "SELECT",
        "experiences": "SELECT",
        "group_contexts": "INSERT, SELECT",
        "judge_cache": "INSERT, SELECT",
        "lesson_usefulness": "INSERT, SELECT",
        "lesson_uses": "INSERT, SELECT",
        "policy_versions": "INSERT, SELECT",
        "pools": "SELECT",
        "problems": "INSERT, SELECT",
        "rollout_groups": "INSERT, SELECT",
        "run_metrics": "INSERT, SELECT",
        "runs": "INSERT, SELECT",
        "served_answers": "INSERT, SELECT",
    }
    assert [tuple(c) for c in columns] == [
        (
            "lesson_usefulness",
            "UPDATE",
            "credit, credit_var, even, graded, helped, hurt, net_credit, net_credit_var, unknown, updated_at, uses",
        ),
        ("lesson_uses", "UPDATE", "baseline, baseline_n, baseline_source, credit, credit_var, graded, m, outcome"),
        ("run_metrics", "UPDATE", "value"),
        ("runs", "UPDATE", "finished_at, heartbeat_at, owner, status"),
    ]
    role_name = _migration().role_name
    assert len(role_name("x" * 70).encode()) <= 63 and role_name("x" * 70 + "a") != role_name("x" * 70 + "b")


def test_the_servers_calls_run_as_the_role(db: Engine, role: Engine, pool: dict[str, int]) -> None:
    with transaction(role) as s:
        assert s.scalar(sa.text("SELECT current_user")) == serve_login(db).role
        row = resolve_pool(s, "deploy")
        assert row.id == pool["pool"] and active_size(s, row.id) == len(LESSONS)
        found = retrieve(
            s, "how do I solve a quadratic for x?", pool_id=row.id, stage1="bm25", rater=None, cache=BM25Cache()
        )  # a fresh cache: one an earlier test filled would skip reading the lessons
        key = question_sha256("how do I solve a quadratic for x?")  # what retrieval with a judge reads and adds
        store_judge_scores(s, key, "judge|v", {pool["v0"]: 0.5})
        store_judge_scores(s, key, "judge|v", {pool["v0"]: 0.9, pool["v1"]: 0.25})  # a stored score stays
        assert cached_judge_scores(s, key, "judge|v", [pool["v0"], pool["v1"]]) == {pool["v0"]: 0.5, pool["v1"]: 0.25}
    assert found and found[0].experience_version_id == pool["v0"]

    run = InferenceRun.check(role, "serve-1", "serve", "tiny-model", pool_id=pool["pool"], dataset="serve")
    run.open({"mode": "retrieval"}, None)
    used = [
        UsedExperience(r.experience_version_id, r.source_problem_id, r.summary, r.stage1_score, None) for r in found
    ]
    zero_shot = _solution("what is 2 + 2?", "zero_shot", k=2)
    retrieval = _solution("how do I solve a quadratic for x?", "retrieval", used)
    with run.running():
        ids = run.record([zero_shot, retrieval])
        Heartbeat(role, run.run_id).beat()  # type: ignore[arg-type]
        with transaction(role) as s:
            first = record_served(s, _served("chatcmpl-" + "a" * 32, run.run_id, ids[:2], "zero_shot"))  # type: ignore[arg-type]
            second = record_served(s, _served("chatcmpl-" + "b" * 32, run.run_id, ids[2:]))  # type: ignore[arg-type]
        run.record_metrics({"requests": 2.0})
        run.record_metrics({"requests": 3.0})  # an upsert: the value column is updated
        with transaction(role) as s:
            target = served_answer(s, ids[2])
            assert target is not None and served_answer(s, ids[1]).served_id == first  # type: ignore[union-attr]
            feedback = record_feedback(s, ids[2], reward=1.0, correct=True, gold_answer="x = 2", key_name="alice")
    assert len(ids) == 3 and target.served_id == second and target.request_id == "chatcmpl-" + "b" * 32
    assert (target.run_id, target.pool_id, target.question) == (run.run_id, pool["pool"], retrieval.question.question)
    assert target.response == "answer 0 to how do I solve a quadratic for x?" and target.mode == "retrieval"

    with db.connect() as conn:  # as the owner: everything landed
        state = conn.execute(
            sa.text("SELECT kind, status, owner IS NOT NULL AS beat FROM runs WHERE id = :r"), {"r": run.run_id}
        ).one()
        assert tuple(state) == ("serve", "finished", True)
        contexts = conn.execute(
            sa.text(
                "SELECT gc.experience_version_id FROM served_answers s JOIN group_contexts gc ON gc.group_id = "
                "s.group_id WHERE s.id = :s ORDER BY gc.position"
            ),
            {"s": second},
        ).scalars()
        assert list(contexts) == [r.experience_version_id for r in found]
        assert conn.scalar(sa.text("SELECT value FROM run_metrics WHERE run_id = :r"), {"r": run.run_id}) == 3.0
        assert conn.scalar(sa.text("SELECT count(*) FROM problems WHERE dataset = 'serve'")) == 2
        fb = conn.execute(sa.text("SELECT * FROM answer_feedback WHERE id = :i"), {"i": feedback}).one()
        assert (fb.attempt_id, fb.reward, fb.correct, fb.gold_answer, fb.key_name) == (
            ids[2],
            1.0,
            True,
            "x = 2",
            "alice",
        )

    adapter = InferenceRun.check(role, "serve-2", "serve", "tiny-model", pool_id=pool["pool"], dataset="serve")
    adapter.open({}, "ab" * 32)  # a served adapter: its policy version is recorded by the role too
    assert adapter.version_id is not None
    with transaction(role) as s:  # an attempt no server answered, and one that does not exist
        assert served_answer(s, pool["v0"] * 0 + 10**12) is None
    with transaction(db) as s:
        (other,) = record_groups(s, [NewGroup(pool["source"], "zero_shot", "p", [NewAttempt("r")])])
    with transaction(role) as s:
        assert served_answer(s, other[0]) is None


REFUSED = [
    "UPDATE experiences SET reward = 0",
    "DELETE FROM experiences",
    "INSERT INTO experiences (pool_id, problem_id) SELECT pool_id, problem_id FROM experiences LIMIT 1",
    "UPDATE experience_versions SET summary = 'x'",
    "DELETE FROM experience_versions",
    "UPDATE attempts SET correct = true",
    "DELETE FROM attempts",
    "UPDATE problems SET question = 'x'",
    "DELETE FROM problems",
    "DELETE FROM served_answers",
    "UPDATE served_answers SET mode = 'x'",
    "UPDATE answer_feedback SET correct = false",
    "DELETE FROM answer_feedback",
    "DELETE FROM lesson_usefulness",
    "UPDATE lesson_usefulness SET version_id = version_id + 1",
    "DELETE FROM lesson_uses",
    "UPDATE lesson_uses SET group_id = group_id + 1",
    "UPDATE runs SET name = 'x', kind = 'train'",
    "DELETE FROM runs",
    "UPDATE policy_versions SET adapter_sha256 = repeat('0', 64)",
    "INSERT INTO pools (name, per_problem_cap, per_step_cap, eviction) VALUES ('p2', 1, 1, 'oldest')",
    "TRUNCATE attempts",
    "SELECT * FROM lanpo_private.serve_login",
    "SELECT * FROM lanpo_private.reader_login",
    "SELECT * FROM relevance_scores",
    "UPDATE judge_cache SET score = 0",
    "DELETE FROM judge_cache",
    "CREATE TABLE public.mine (x int)",
    "CREATE SCHEMA mine",
    "CREATE VIEW public.mine AS SELECT 1",
    "DROP TABLE attempts",
    "DROP VIEW experience_usage",
    "ALTER TABLE attempts ADD COLUMN x int",
]


@pytest.mark.parametrize("statement", REFUSED)
def test_the_role_may_do_nothing_else(role: Engine, pool: dict[str, int], statement: str) -> None:
    with role.connect() as conn, pytest.raises(sa.exc.DBAPIError) as refused:
        conn.exec_driver_sql(statement)
    assert isinstance(refused.value.orig, psycopg.errors.InsufficientPrivilege), refused.value


def test_it_cannot_become_the_owner(db: Engine, role: Engine) -> None:
    owner = db.url.username or ""
    with db.connect() as conn:
        owner = conn.scalar(sa.text("SELECT current_user"))
    with role.connect() as conn, pytest.raises(sa.exc.DBAPIError) as refused:
        conn.exec_driver_sql(f'SET ROLE "{owner}"')
    assert isinstance(refused.value.orig, psycopg.errors.InsufficientPrivilege)


def test_a_request_is_stored_once(db: Engine, role: Engine, pool: dict[str, int]) -> None:
    run = InferenceRun.check(role, "serve-once", "serve", "m", pool_id=pool["pool"], dataset="serve")
    run.open({}, None)
    ids = run.record([_solution("what is 3 + 4?", "zero_shot")])
    answer = _served("chatcmpl-" + "c" * 32, run.run_id, ids, "zero_shot")  # type: ignore[arg-type]
    with transaction(role) as s:
        record_served(s, answer)
    with pytest.raises(InputError, match="is stored already"), transaction(role) as s:
        record_served(s, answer)
    with pytest.raises(sa.exc.IntegrityError, match="uq_served_answers_request_id"), db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO served_answers (request_id, run_id, group_id, answer_ids, mode, sampling, timings, "
                "streamed) SELECT request_id, run_id, group_id, answer_ids, mode, sampling, timings, streamed "
                "FROM served_answers"
            )
        )
    with db.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM served_answers")) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reward": None, "correct": None}, "a reward or a verdict"),
        ({"reward": float("nan"), "correct": None}, "must be finite"),
        ({"reward": None, "correct": "yes"}, "verdict must be"),
        ({"reward": 1.0, "correct": None, "gold_answer": "a\x00b"}, "NUL"),
    ],
)
def test_bad_feedback_writes_nothing(role: Engine, db: Engine, kwargs: dict, message: str) -> None:
    with transaction(db) as s:
        (problem,) = make_problems(s, 1)
        ((attempt,),) = record_groups(s, [NewGroup(problem, "zero_shot", "p", [NewAttempt("r")])])
    full = {"gold_answer": None, "key_name": None, **kwargs}
    with pytest.raises(InputError, match=message), transaction(role) as s:
        record_feedback(s, attempt, **full)
    with db.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM answer_feedback")) == 0


def test_experience_usage_reads_the_latest_verdict(db: Engine, role: Engine, pool: dict[str, int]) -> None:
    """Zero-shot z1, z2 and retrieval r1, r2, r3 (lesson v0) on one problem, same run and step, all ungraded but r3
    (correct). Feedback, each in its own transaction: z1 correct then incorrect (latest: 0), z2 correct (1); r1
    incorrect then correct (1); r2 a reward only (ungraded); r3 incorrect (the grader's `correct` stands: 1).
    By hand: baseline = (0 + 1) / 2 = 0.5; graded uses r1 = 1, r3 = 1, so accuracy_with = 1, lift = 0.5;
    times_injected 3 (r2 too), uses_with_baseline 2."""
    with transaction(db) as s:
        (problem,) = make_problems(s, 1, dataset="asked")
        run = create_run(s, "served", "serve", pool_id=pool["pool"]).id
        zs, rt = record_groups(
            s,
            [
                NewGroup(problem, "zero_shot", "p", [NewAttempt("z1"), NewAttempt("z2")], step=0, run_id=run),
                NewGroup(
                    problem, "retrieval", "p+",
                    [NewAttempt("r1"), NewAttempt("r2"), NewAttempt("r3", correct=True)], step=0, run_id=run,
                    contexts=[ContextRef(position=0, experience_version_id=pool["v0"], score=0.9)],
                ),
            ],
        )  # fmt: skip
    verdicts = [(zs[0], True), (zs[1], True), (rt[0], False), (zs[0], False), (rt[0], True), (rt[2], False)]
    for attempt, correct in verdicts:
        with transaction(role) as s:
            record_feedback(s, attempt, reward=None, correct=correct, gold_answer=None, key_name=None)
    with transaction(role) as s:
        record_feedback(s, rt[1], reward=0.3, correct=None, gold_answer=None, key_name="bob")
    usage = query_readonly(
        db,
        "SELECT times_injected, uses_with_baseline, accuracy_with, zero_shot_accuracy, lift FROM experience_usage "
        f"WHERE version_id = {pool['v0']}",
    ).rows
    assert usage == [(3, 2, 1.0, 0.5, 0.5)]


def test_a_privileged_login_is_refused(db: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SERVE_URL, db.url.render_as_string(hide_password=False))
    with pytest.raises(ServingRoleUnavailable, match=r"refused: the role .* \(LANPO_SERVE_URL\) that would serve"):
        serve_engine(db)
    monkeypatch.setenv(ENV_SERVE_URL, make_url(db.url).set(username="nobody_here").render_as_string(False))
    with pytest.raises(ServingRoleUnavailable, match="cannot log in as the serving role nobody_here"):
        serve_engine(db)


def test_cli_checks_and_renews_the_role(db: Engine, run_cli: Callable) -> None:
    role = serve_login(db).role
    with db.begin() as conn:
        conn.execute(sa.text(f'ALTER ROLE "{role}" SET statement_timeout = 0'))
    status = run_cli("db", "status")
    assert status.code == 0 and f"serving:  {role} (lanpo_private.serve_login; lanpo serve)" in status.out
    assert "changed its own session defaults (statement_timeout=0)" in status.err
    password = serve_login(db).url.password
    renewed = run_cli("db", "serve-role", "--renew")
    assert renewed.code == 0 and f"serving:  {role} (lanpo_private.serve_login): logs in" in renewed.out, renewed.err
    assert renewed.err == "" and serve_login(db).url.password != password
    with db.begin() as conn:
        conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
        conn.execute(sa.text(f'DROP ROLE "{role}"'))
    dropped = run_cli("db", "serve-role")
    assert dropped.code == 2 and f"{role}, which was dropped" in dropped.err
    assert run_cli("db", "serve-role", "--renew").code == 0
    assert test_the_role_is_made_as_0014_says(db) is None  # the same role, the same grants


def test_downgrade_drops_it_and_upgrade_brings_it_back(db: Engine, pool: dict[str, int]) -> None:
    role = serve_login(db).role
    with transaction(db) as s:
        (problem,) = make_problems(s, 1, dataset="serve")
        run = create_run(s, "served", "serve", pool_id=pool["pool"]).id
        (ids,) = record_groups(s, [NewGroup(problem, "zero_shot", "p", [NewAttempt("a")], step=0, run_id=run)])
        record_served(s, _served("chatcmpl-" + "d" * 32, run, ids, "zero_shot"))
    migrate.downgrade(db, "0013")
    try:
        assert current_revision(db) == "0013"
        with db.connect() as conn:
            assert not sa.inspect(conn).has_table("served_answers") and not sa.inspect(conn).has_table(
                "answer_feedback"
            )
            assert not sa.inspect(conn).has_table("serve_login", schema="lanpo_private")
            assert conn.scalar(sa.text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": role}) == 0
            assert conn.scalar(sa.text("SELECT count(*) FROM runs")) == 0  # the serve run went with its kind
            view = conn.scalar(sa.text("SELECT pg_get_viewdef('experience_usage')"))
            assert "answer_feedback" not in view and "zero_shot" in view
        with pytest.raises(sa.exc.IntegrityError), db.begin() as conn:
            conn.execute(sa.text("INSERT INTO runs (name, kind) VALUES ('s', 'serve')"))
    finally:
        migrate.upgrade(db)
    assert serve_login(db).role == role
    assert query_readonly(db, "SELECT count(*) FROM served_answers").rows == [(0,)]  # the reader reads the new tables
    assert query_readonly(db, "SELECT count(*) FROM experience_usage").rows == [(len(LESSONS),)]
    assert stored_reader(db).role != role


def _grants() -> list[str]:
    """Each privilege migration 0014 grants, as the statement that takes it back."""
    revokes = [
        f"REVOKE {p} ON {table} FROM {{r}}"
        for table, what in TABLE_GRANTS.items()
        for p in ("SELECT", "INSERT")
        if p in what
    ]
    revokes += [f"REVOKE UPDATE ({c}) ON runs FROM {{r}}" for c in ("status", "finished_at", "heartbeat_at", "owner")]
    revokes += ["REVOKE UPDATE (value) ON run_metrics FROM {r}"]
    revokes += [f"REVOKE UPDATE ({c}) ON lesson_usefulness FROM {{r}}" for c in USEFULNESS_COLUMNS]
    revokes += [f"REVOKE UPDATE ({c}) ON lesson_uses FROM {{r}}" for c in USE_COLUMNS]
    revokes += [f"REVOKE USAGE ON SEQUENCE {s} FROM {{r}}" for s in SEQUENCES]
    return [*revokes, f"REVOKE EXECUTE ON FUNCTION {LOCK_FUNCTION} FROM {{r}}"]


@pytest.mark.parametrize("revoke", _grants())
def test_every_grant_is_needed(db: Engine, pool: dict[str, int], revoke: str) -> None:
    """Least privilege, found by trying: without any one of its grants, a call the server makes is refused."""
    with db.connect() as conn:
        if "pg_advisory" in revoke and conn.scalar(
            sa.text("SELECT has_function_privilege('public', :f, 'EXECUTE')"), {"f": LOCK_FUNCTION}
        ):
            pytest.skip("PUBLIC may take advisory locks here (migration 0004 ran as a plain owner)")
    with db.begin() as conn:
        conn.exec_driver_sql(revoke.format(r='"' + serve_login(db).role + '"'))
    role = serve_engine(db)
    try:
        with pytest.raises((sa.exc.DBAPIError, psycopg.Error)) as refused:  # a COPY raises psycopg's own
            test_the_servers_calls_run_as_the_role(db, role, pool)
            test_a_request_is_stored_once(db, role, pool)
        error = getattr(refused.value, "orig", refused.value)
        assert isinstance(error, psycopg.errors.InsufficientPrivilege), refused.value
    finally:
        role.dispose()
        renew(db)
