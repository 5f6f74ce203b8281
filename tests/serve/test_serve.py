"""`lanpo serve` through the stock `openai` client on loopback: lessons reach prompts, answers and feedback reach the
store, bad input is refused with OpenAI's error body and writes nothing."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2 as httpx
import openai
import pytest

from tests.serve.conftest import KEY, LESSON_REWARD, Served

FRACTIONS = "What is 1/2 + 1/3? Show the fractions work."


def lanpo_of(response: Any) -> dict[str, Any]:
    return response.model_extra["lanpo"]


def written(server: Served) -> tuple[int, ...]:
    return tuple(server.count(t) for t in ("attempts", "served_answers", "answer_feedback", "problems", "runs"))


def test_a_lesson_reaches_the_prompt_and_the_answer_is_stored(server: Served) -> None:
    reply = server.client().chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": FRACTIONS}], max_tokens=6, n=2
    )
    lanpo = lanpo_of(reply)
    assert lanpo["mode"] == "retrieval" and lanpo["pool"] == "alpha" and lanpo["fallback"] is None
    (lesson,) = lanpo["lessons"]
    summary = server.rows("SELECT summary FROM experience_versions WHERE id = :v", v=lesson["version_id"])[0][0]
    assert "fractions" in summary  # BM25 found the one lesson on the question's topic
    ids = lanpo["answer_ids"]
    assert len(ids) == 2 and reply.id.startswith("chatcmpl-")
    rows = server.rows(
        "SELECT a.id, a.response, g.prompt, g.mode, r.kind, r.name, p.question FROM attempts a "
        "JOIN rollout_groups g ON g.id = a.group_id JOIN runs r ON r.id = g.run_id "
        "JOIN problems p ON p.id = g.problem_id WHERE a.id = ANY(:ids) ORDER BY a.id",
        ids=ids,
    )
    assert [r.response for r in rows] == [c.message.content for c in reply.choices]
    assert {(r.mode, r.kind, r.name, r.question) for r in rows} == {("retrieval", "serve", "serve-test", FRACTIONS)}
    prompt = rows[0].prompt
    assert summary in prompt and FRACTIONS in prompt
    assert str(LESSON_REWARD) not in prompt  # a lesson's reward never reaches a prompt
    contexts = server.rows(
        "SELECT gc.experience_version_id FROM group_contexts gc JOIN attempts a ON a.group_id = gc.group_id "
        "WHERE a.id = :id",
        id=ids[0],
    )
    assert [c[0] for c in contexts] == [lesson["version_id"]]  # the reported lessons are the stored ones
    (served,) = server.rows("SELECT * FROM served_answers WHERE request_id = :r", r=reply.id)
    assert served.answer_ids == ids and served.mode == "retrieval" and not served.streamed
    assert served.sampling["max_tokens"] == 6 and served.sampling["n"] == 2 and served.key_name == "key-1"
    assert served.timings["total_ms"] >= served.timings["generate_ms"] > 0


def test_a_streamed_answer_is_stored_whole(server: Served) -> None:
    stream = server.client().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "What is 10 percent of 50? (percentages)"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    (answer_id,) = lanpo_of(last)["answer_ids"]
    assert lanpo_of(chunks[0])["lessons"], "the first chunk names the lessons"
    (stored,) = server.rows("SELECT response FROM attempts WHERE id = :id", id=answer_id)
    assert stored.response == text
    (served,) = server.rows("SELECT streamed, answer_ids FROM served_answers WHERE request_id = :r", r=last.id)
    assert served.streamed and served.answer_ids == [answer_id]
    assert last.usage is not None and last.usage.completion_tokens >= 1


def test_a_pool_in_the_path_and_zero_shot_by_request(server: Served) -> None:
    model = server.model
    beta = server.client("beta").chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Angles of a triangle (geometry)?"}], max_tokens=4
    )
    assert lanpo_of(beta)["pool"] == "beta" and len(lanpo_of(beta)["lessons"]) == 1
    runs = {r.name: r.pool_id for r in server.rows("SELECT name, pool_id FROM runs WHERE kind = 'serve'")}
    assert "serve-test@beta" in runs  # one serving run per pool
    zero = server.client().chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": FRACTIONS}],
        max_tokens=4,
        extra_body={"lanpo": {"mode": "zero-shot"}},
    )
    assert lanpo_of(zero)["mode"] == "zero_shot" and lanpo_of(zero)["lessons"] == []
    (group,) = server.rows(
        "SELECT g.mode, g.prompt FROM attempts a JOIN rollout_groups g ON g.id = a.group_id WHERE a.id = :id",
        id=lanpo_of(zero)["answer_ids"][0],
    )
    assert group.mode == "zero_shot" and "lesson" not in group.prompt.lower()


def test_the_policy_judges_relevance_when_a_request_asks(server: Served) -> None:
    reply = server.client().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": FRACTIONS}],
        max_tokens=2,
        extra_body={"lanpo": {"judge": "policy", "m": 2}},
    )
    lessons = lanpo_of(reply)["lessons"]  # BM25 finds every lesson (each shares "the"), the judge keeps m; gamma is 0
    assert len(lessons) == 2 and all(0.0 <= lesson["relevance"] <= 1.0 for lesson in lessons)
    stored = server.rows(
        "SELECT gc.experience_version_id, gc.score FROM group_contexts gc JOIN attempts a ON a.group_id = gc.group_id "
        "WHERE a.id = :id ORDER BY gc.position",
        id=lanpo_of(reply)["answer_ids"][0],
    )
    assert [(r.experience_version_id, r.score) for r in stored] == [(x["version_id"], x["relevance"]) for x in lessons]


def test_feedback_lands_and_experience_usage_reads_it(server: Served) -> None:
    model = server.model
    question = "Add the fractions 2/5 and 1/5 (fractions)."
    client = server.client()
    base = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=4,
        extra_body={"lanpo": {"mode": "zero_shot"}},
    )
    helped = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=4
    )
    (lesson,) = lanpo_of(helped)["lessons"]
    before = server.rows("SELECT times_injected FROM experience_usage WHERE version_id = :v", v=lesson["version_id"])
    r1 = server.post("/v1/feedback", json={"answer_id": lanpo_of(base)["answer_ids"][0], "verdict": "incorrect"})
    r2 = server.post("/v1/feedback", json={"answer_id": lanpo_of(helped)["answer_ids"][0], "verdict": "correct"})
    assert r1.status_code == r2.status_code == 200, (r1.text, r2.text)
    assert r2.json()["correct"] is True
    rows = server.rows(
        "SELECT correct, key_name FROM answer_feedback WHERE attempt_id = :a", a=lanpo_of(helped)["answer_ids"][0]
    )
    assert [(r.correct, r.key_name) for r in rows] == [(True, "key-1")]
    # the lift of the lesson over this question: correct (1) with it against the zero-shot baseline (0), alone in
    # its context (k = 1); the other uses of the lesson on other questions have no feedback, so no baseline
    (usage,) = server.rows(
        "SELECT times_injected, uses_with_baseline, lift FROM experience_usage WHERE version_id = :v",
        v=lesson["version_id"],
    )
    assert usage.times_injected == before[0][0] and usage.uses_with_baseline == 1 and usage.lift == 1.0
    # a gold answer grades the stored answer with lanpo's grader (the tiny model's text boxes nothing: incorrect)
    graded = server.post("/v1/feedback", json={"answer_id": lanpo_of(helped)["answer_ids"][0], "gold_answer": "3/5"})
    assert graded.status_code == 200 and graded.json()["correct"] is False
    (usage,) = server.rows("SELECT lift FROM experience_usage WHERE version_id = :v", v=lesson["version_id"])
    assert usage.lift == 0.0  # the latest verdict counts


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "code"),
    [
        ("/v1/chat/completions", {"content": b"{not json"}, 400, "invalid_json"),
        ("/v1/chat/completions", {"json": ["a list"]}, 400, "invalid_json"),
        ("/pools/nosuch/v1/chat/completions", {"json": "ok"}, 404, "pool_not_found"),
        ("/v1/chat/completions", {"json": {"max_tokens": -1}}, 422, "invalid_value"),
        ("/v1/chat/completions", {"json": {"min_tokens": -1}}, 422, "invalid_value"),
        ("/v1/chat/completions", {"json": {"min_tokens": "many"}}, 422, "invalid_value"),
        ("/v1/chat/completions", {"json": {"min_tokens": 2**70}}, 400, "invalid_min_tokens"),
        ("/v1/chat/completions", {"json": {"lanpo": {"mode": "telepathy"}}}, 422, "invalid_value"),
        ("/v1/chat/completions", {"json": {"lanpo": {"gama": 0.5}}}, 422, "invalid_value"),
        ("/v1/chat/completions", {"json": {"model": "gpt-4"}}, 404, "model_not_found"),
        ("/v1/chat/completions", {"json": {"messages": [{"role": "system", "content": "x"}]}}, 400, None),
        ("/v1/chat/completions", {"json": {"content": "2+2\u0000?", "lanpo": {"mode": "zero_shot"}}}, 400, None),
        ("/v1/chat/completions", {"json": {"content": "   "}}, 400, "invalid_question"),
        ("/v1/chat/completions", {"json": {"content": "word " * 600}}, 413, "context_length_exceeded"),
        ("/v1/chat/completions", {"json": {"pad": "x" * 70_000}}, 413, "body_too_large"),
        ("/v1/chat/completions", {"json": "ok", "key": "wrong-key-0123456789"}, 401, "invalid_api_key"),
        ("/v1/chat/completions", {"json": "ok", "key": None}, 401, "invalid_api_key"),
        ("/v1/feedback", {"json": {"answer_id": 987654321, "verdict": "correct"}}, 404, "answer_not_found"),
        ("/v1/feedback", {"json": {"answer_id": 1}}, 422, "invalid_value"),
        ("/v1/feedback", {"json": {"answer_id": 1, "reward": "NaN"}}, 422, "invalid_value"),
    ],
)
def test_bad_input_gets_its_status_and_writes_nothing(
    server: Served, path: str, kwargs: dict[str, Any], status: int, code: str | None
) -> None:
    model = server.model
    key = kwargs.pop("key", KEY)
    body = kwargs.get("json")
    if body is not None and not isinstance(body, list):
        request = {"model": model, "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 4}
        if isinstance(body, dict):
            if "content" in body:
                request["messages"] = [{"role": "user", "content": body.pop("content")}]
            request.update(body)
        kwargs["json"] = request if "feedback" not in path else body
    before = written(server)
    response = server.post(path, key=key, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and "Traceback" not in error["message"] and len(error["message"]) < 300
    if code is not None:
        assert error["code"] == code
    assert written(server) == before


def test_the_openai_client_sees_openai_errors(server: Served) -> None:
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong-key-0123456789").models.list()
    with pytest.raises(openai.NotFoundError):
        server.client("nosuch").chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.UnprocessableEntityError):
        server.client().chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=-5
        )
    assert [m.id for m in server.client().models.list()] == [server.model]


def test_concurrent_requests_are_batched_and_each_stored_once(server: Served) -> None:
    model = server.model
    client = server.client()

    def ask(i: int) -> Any:
        return client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"What is {i} times {i}? (multiplication)"}],
            max_tokens=8,
            extra_body={"lanpo": {"mode": "zero_shot"}},
        )

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, range(16)))
    ids = [lanpo_of(r)["answer_ids"][0] for r in replies]
    assert len(set(ids)) == 16
    stored = server.rows(
        "SELECT request_id, answer_ids FROM served_answers WHERE request_id = ANY(:r)", r=[r.id for r in replies]
    )
    assert sorted(s.answer_ids[0] for s in stored) == sorted(ids)
    health = httpx.get(server.url + "/health").json()
    engine = health["engine"]
    assert engine["peak_batch"] >= 2, engine  # requests that waited together were generated together
    assert 1 <= health["store"]["commits"] <= health["store"]["answers"] and health["store"]["answers"] >= 16
    log = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    assert {r.id for r in replies} <= {e["request_id"] for e in log if e["event"] == "answer"}
