"""`lanpo serve` learning from its traffic, in scopes: a scripted session through the stock `openai` client on
loopback (question, answer, good feedback, then a related question that reads the lesson written from the first;
the same question from another scope's key reads none), and the rules of scopes, keys and `--learn` alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lanpo.errors import ConfigError
from lanpo.feedback.config import SummarizerConfig
from lanpo.serve.http import ApiError
from lanpo.serve.keys import Caller, KeyRing
from lanpo.serve.learn import LearnPolicy
from lanpo.serve.scopes import request_scope
from tests.serve.conftest import SCOPED_KEYS, Served

NOTES = "/pools/notes"
QUESTION = "Tom has 3 apples and buys 4 more apples. How many apples does Tom have?"
RELATED = "Ann has 5 apples and buys 2 more apples. How many apples does Ann have?"
# stage 1 by vector search, so that the tiny model's lessons (random characters under the scaffold's headers, no
# word of any question) are still found; three lessons a prompt at most
VECTOR = {"stage1": "vector", "m": 3, "top_k": 3}


def lanpo_of(response: Any) -> dict[str, Any]:
    return response.model_extra["lanpo"]


def ask(server: Served, key: str, question: str, path: str = NOTES) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}{path}/v1", api_key=SCOPED_KEYS[key], max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": question}],
        max_tokens=6,
        extra_body={"lanpo": VECTOR},
    )
    return lanpo_of(reply)


def feedback(server: Served, key: str, answer_id: int, **body: Any) -> Any:
    return server.post("/v1/feedback", key=SCOPED_KEYS[key], json={"answer_id": answer_id, **body})


def test_a_good_answer_becomes_a_lesson_its_scope_alone_reads(server: Served) -> None:
    first = ask(server, "alice", QUESTION)
    assert first["lessons"] == [] and first["fallback"]  # the pool is empty: zero-shot
    (answer_id,) = first["answer_ids"]
    assert feedback(server, "bob", answer_id, verdict="correct").status_code == 404  # another scope's answer
    reply = feedback(server, "alice", answer_id, verdict="correct")
    assert reply.status_code == 200, reply.text
    lesson = reply.json()["lesson"]
    assert lesson["status"] == "admitted", lesson
    (row,) = server.rows(
        "SELECT e.scope, e.source_attempt_id, e.pool_id, p.name AS pool, f.key_name, f.correct, v.id AS version_id "
        "FROM experiences e JOIN pools p ON p.id = e.pool_id JOIN answer_feedback f ON f.id = e.feedback_id "
        "JOIN experience_versions v ON v.experience_id = e.id WHERE e.id = :id",
        id=lesson["id"],
    )
    assert (row.scope, row.source_attempt_id, row.pool, row.key_name, row.correct) == (
        "alice",
        answer_id,
        "notes",
        "alice",
        True,
    )
    # the next request, right after the feedback's commit, reads it; the lesson is on probation (untried)
    related = ask(server, "alice", RELATED)
    assert [x["version_id"] for x in related["lessons"]] == [row.version_id]
    (prompt,) = server.rows(
        "SELECT g.prompt FROM attempts a JOIN rollout_groups g ON g.id = a.group_id WHERE a.id = :a",
        a=related["answer_ids"][0],
    )[0]
    summary = server.rows("SELECT summary FROM experience_versions WHERE id = :v", v=row.version_id)[0][0]
    assert summary in prompt and RELATED in prompt
    (probation,) = server.rows("SELECT probation FROM lesson_history WHERE version_id = :v", v=row.version_id)[0]
    assert probation == "untried"
    # another scope, and no scope at all, read none of alice's lessons
    for key, path in (("bob", NOTES), ("ops", NOTES), ("ops", f"{NOTES}/scopes/bob")):
        other = ask(server, key, RELATED, path)
        assert other["lessons"] == [], (key, path, other)
    assert ask(server, "ops", RELATED, f"{NOTES}/scopes/alice")["lessons"], "an unbound key may name alice's scope"
    scopes = server.rows(
        "SELECT DISTINCT scope FROM served_answers s JOIN runs r ON r.id = s.run_id "
        "WHERE r.name = 'serve-test@notes' ORDER BY scope"
    )
    assert [s[0] for s in scopes] == ["alice", "bob", None]


def test_what_feedback_does_not_teach(server: Served) -> None:
    answer = ask(server, "alice", "What is 6 times 7 in apples?")["answer_ids"][0]
    assert feedback(server, "alice", answer, verdict="incorrect").json()["lesson"]["status"] == "not_good"
    assert feedback(server, "alice", answer, reward=0.5).json()["lesson"]["status"] == "not_good"
    first = feedback(server, "alice", answer, reward=1.0).json()["lesson"]
    assert first["status"] == "admitted", first
    again = feedback(server, "alice", answer, verdict="correct").json()["lesson"]
    assert again == {"status": "exists", "id": first["id"], "reason": None}  # one lesson per answer
    other = ask(server, "ops", QUESTION, "/pools/alpha")["answer_ids"][0]
    assert feedback(server, "ops", other, verdict="correct").json()["lesson"]["status"] == "off"  # alpha learns not
    n = server.rows("SELECT count(*) FROM experiences WHERE feedback_id IS NOT NULL")[0][0]
    assert n == 2


@pytest.mark.parametrize(
    ("scopes", "in_path", "in_body", "expected"),
    [
        (None, None, None, None),
        (None, "u1", None, "u1"),
        (None, None, "u1", "u1"),
        (None, "u1", "u1", "u1"),
        (frozenset({"u1"}), None, None, "u1"),
        (frozenset({"u1"}), None, "u1", "u1"),
        (frozenset({"u1"}), "u2", None, 404),
        (frozenset({"u1", "u2"}), None, None, 400),
        (frozenset({"u1", "u2"}), "u2", None, "u2"),
        (None, "u1", "u2", 400),
        (None, "bad scope", None, 400),
        (None, None, "x" * 129, 400),
        (None, None, "\ud83d", 400),
    ],
)
def test_the_scope_a_request_is_in(scopes: Any, in_path: Any, in_body: Any, expected: Any) -> None:
    caller = Caller("k", frozenset({"*"}), scopes)
    if isinstance(expected, int):
        with pytest.raises(ApiError) as raised:
            request_scope(caller, in_path, in_body)
        assert raised.value.status == expected
    else:
        assert request_scope(caller, in_path, in_body) == expected


def test_keys_bound_to_scopes(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text('[keys.a]\nkey = "a-key-0123456789abcdef"\nscopes = ["alice", "team:1"]\n')
    assert KeyRing.build((), path).caller("a-key-0123456789abcdef").scopes == frozenset({"alice", "team:1"})
    for bad in ("scopes = []", 'scopes = "alice"', 'scopes = ["a b"]', "scopes = [1]"):
        path.write_text(f'[keys.a]\nkey = "a-key-0123456789abcdef"\n{bad}\n')
        with pytest.raises(ConfigError):
            KeyRing.build((), path)


def test_the_learn_policy() -> None:
    assert not LearnPolicy.parse("off").enabled and not LearnPolicy.parse("off").learns("a")
    assert LearnPolicy.parse("on").learns("anything") and not LearnPolicy.parse("on").learns(None)
    some = LearnPolicy.parse("a, b")
    assert some.learns("a") and some.learns("b") and not some.learns("c")
    with pytest.raises(ConfigError):
        LearnPolicy.parse("a,,b")
    policy = LearnPolicy.parse("on", SummarizerConfig(min_reward=0.5))
    # a verdict decides; a reward decides only without one, at or over min_reward
    assert [policy.good(c, r) for c, r in [(True, 0.0), (False, 1.0), (None, 0.5), (None, 0.49), (None, None)]] == [
        True,
        False,
        True,
        False,
        False,
    ]
