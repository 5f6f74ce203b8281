"""Hostile input against every route of a running `lanpo serve`: each request is refused with a 4xx and OpenAI's
error body, writes no row, and leaves one log line; none reaches a 500.

One table, sent over loopback to the package's one server (`tests/serve/conftest.py`): bodies nested 30,000 deep,
lone surrogates and NUL in every string field, numbers beyond a double, NaN and Infinity, keys given twice, bodies
that are not JSON, not UTF-8, not an object or sent as something else, a body over the limit sent chunked, pool
names in the path no store holds, keys that are no key, and feedback under a pool its answer is not from."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx
import pytest

from tests.serve.conftest import KEY, Served

LIMIT = 65536  # the server's --max-body-bytes
CHAT, FEEDBACK, MODELS = "/v1/chat/completions", "/v1/feedback", "/v1/models"
WRITES = ("attempts", "served_answers", "answer_feedback", "runs", "problems")


@dataclass(frozen=True)
class Hostile:
    """One hostile request: its route, its body as raw bytes (`{model}` and `{answer}` filled in), or a stream of
    chunks; the status and error code it must get."""

    path: str
    body: bytes | None = None
    status: int = 400
    code: str | None = "invalid_json"
    method: str = "POST"
    headers: dict[str, Any] = field(default_factory=dict)
    chunks: Callable[[], Iterator[bytes]] | None = None


def chat(fields: str = "") -> bytes:
    """A chat request that would be served but for `fields`, spliced in raw (JSON text, so escapes stay escapes)."""
    extra = ", " + fields if fields else ""
    return b'{"model": "{model}", "messages": [{"role": "user", "content": "What is 2+2?"}]' + extra.encode() + b"}"


def chat_with_question(content: str) -> bytes:
    return (
        b'{"model": "{model}", "max_tokens": 2, "messages": [{"role": "user", "content": "'
        + content.encode()
        + b'"}]}'
    )


def feedback(fields: str) -> bytes:
    return b'{"answer_id": {answer}, ' + fields.encode() + b"}"


def deep(opening: bytes, closing: bytes, depth: int, inner: bytes = b"") -> bytes:
    """Nested `depth` deep: far past Python's recursion limit (1,000), and inside the server's body limit."""
    return opening * depth + inner + closing * depth


def chunked(size: int) -> Callable[[], Iterator[bytes]]:
    def chunks() -> Iterator[bytes]:  # no Content-Length: httpx sends a generator chunked
        yield b'{"pad": "'
        for _ in range(size // 8192):
            yield b"x" * 8192
        yield b'"}'

    return chunks


HOSTILE: dict[str, Hostile] = {
    # nesting: counted on the bytes before any parser recurses
    "chat, array 30k deep": Hostile(CHAT, b'{"messages": ' + deep(b"[", b"]", 30_000) + b"}"),
    "chat, object 10k deep": Hostile(CHAT, deep(b'{"a":', b"}", 10_000, inner=b"1")),
    "chat, 65 deep in lanpo": Hostile(CHAT, chat('"lanpo": ' + "[" * 65 + "]" * 65)),
    "feedback, array 30k deep": Hostile(FEEDBACK, deep(b"[", b"]", 30_000)),
    "feedback under a pool, deep": Hostile("/pools/alpha" + FEEDBACK, feedback('"reward": ' + "[" * 100 + "]" * 100)),
    # lone surrogates and NUL, as the JSON escapes a client sends
    "question, lone surrogate": Hostile(CHAT, chat_with_question("\\ud83d"), code="invalid_text"),
    "question, low surrogate first": Hostile(CHAT, chat_with_question("\\ude00\\ud83d"), code="invalid_text"),
    "question, streamed, surrogate": Hostile(CHAT, chat('"stream": true, "stop": "\\udfff"'), code="invalid_text"),
    "model, lone surrogate": Hostile(CHAT, chat().replace(b"{model}", b"\\ud83d"), code="invalid_text"),
    "a key, lone surrogate": Hostile(CHAT, chat('"\\ud83d": 1'), code="invalid_text"),
    "stop, NUL": Hostile(CHAT, chat('"stop": ["ok", "a\\u0000b"]'), code="invalid_text"),
    "lanpo.mode, surrogate": Hostile(CHAT, chat('"lanpo": {"mode": "\\ud800"}'), code="invalid_text"),
    "gold_answer, surrogate": Hostile(FEEDBACK, feedback('"gold_answer": "4\\udc00"'), code="invalid_text"),
    "gold_answer, NUL": Hostile(FEEDBACK, feedback('"gold_answer": "4\\u0000"'), code="invalid_text"),
    "answer_id as a surrogate": Hostile(FEEDBACK, b'{"answer_id": "\\ud83d", "reward": 1}', code="invalid_text"),
    "answer_id as text": Hostile(FEEDBACK, b'{"answer_id": "one", "reward": 1}', status=422, code="invalid_value"),
    # numbers
    "max_tokens 1e400": Hostile(CHAT, chat('"max_tokens": 1e400')),
    "max_tokens 5000 digits": Hostile(CHAT, chat('"max_tokens": ' + "9" * 5000)),
    "max_tokens 10^30": Hostile(CHAT, chat('"max_tokens": ' + "1" + "0" * 30), code="max_tokens_too_large"),
    "temperature 1e308": Hostile(CHAT, chat('"temperature": 1e308'), status=422, code="invalid_value"),
    "seed 2^70": Hostile(CHAT, chat(f'"seed": {2**70}'), status=422, code="invalid_value"),
    "n 10^20": Hostile(CHAT, chat('"n": 100000000000000000000'), status=422, code="invalid_value"),
    "temperature NaN": Hostile(CHAT, chat('"temperature": NaN')),
    "top_p Infinity": Hostile(CHAT, chat('"top_p": Infinity')),
    "seed -Infinity": Hostile(CHAT, chat('"seed": -Infinity')),
    "reward NaN": Hostile(FEEDBACK, feedback('"reward": NaN')),
    "reward 1e309": Hostile(FEEDBACK, feedback('"reward": 1e309')),
    "answer_id 10^30": Hostile(
        FEEDBACK, b'{"answer_id": 1000000000000000000000000000000, "reward": 1}', status=422, code="invalid_value"
    ),
    "answer_id 1e400": Hostile(FEEDBACK, b'{"answer_id": 1e400, "reward": 1}'),
    # keys given twice
    "model twice": Hostile(CHAT, chat('"model": "{model}"')),
    "answer_id twice": Hostile(FEEDBACK, feedback('"answer_id": {answer}, "reward": 1')),
    # not JSON, not UTF-8, not an object
    "empty body": Hostile(CHAT, b""),
    "empty feedback": Hostile(FEEDBACK, b""),
    "trailing garbage": Hostile(CHAT, chat() + b" x"),
    "a JSON array": Hostile(FEEDBACK, b"[1, 2]"),
    "JSON null": Hostile(CHAT, b"null"),
    "not UTF-8": Hostile(CHAT, chat_with_question("caf\xe9").replace("caf\xe9".encode(), b"caf\xe9")),
    "UTF-8 of a surrogate": Hostile(CHAT, chat_with_question("x").replace(b'"x"', b'"\xed\xa0\xbd"')),
    "UTF-16": Hostile(CHAT, json.dumps({"model": "m", "messages": []}).encode("utf-16")),
    "a BOM": Hostile(CHAT, b"\xef\xbb\xbf" + chat()),
    # sent as something else than JSON
    "text/plain": Hostile(
        CHAT, chat_with_question("2+2"), 415, "unsupported_media_type", headers={"content-type": "text/plain"}
    ),
    "a form": Hostile(
        FEEDBACK,
        b"answer_id=1&reward=1",
        415,
        "unsupported_media_type",
        headers={"content-type": "application/x-www-form-urlencoded"},
    ),
    "multipart": Hostile(
        CHAT,
        b"--x\r\n\r\n--x--",
        415,
        "unsupported_media_type",
        headers={"content-type": "multipart/form-data; boundary=x"},
    ),
    # over the limit, with and without Content-Length
    "chunked, 1.2 MB": Hostile(CHAT, status=413, code="body_too_large", chunks=chunked(1_200_000)),
    "chunked, just over": Hostile(FEEDBACK, status=413, code="body_too_large", chunks=chunked(LIMIT + 8192)),
    "chunked, to /health": Hostile("/health", status=413, code="body_too_large", chunks=chunked(LIMIT + 8192)),
    "Content-Length, over": Hostile(CHAT, b" " * (LIMIT + 1), status=413, code="body_too_large"),
    # pools in the path no store holds
    "pool %00, models": Hostile("/pools/%00" + MODELS, method="GET", status=404, code="pool_not_found"),
    "pool %00, chat": Hostile("/pools/a%00b" + CHAT, chat_with_question("2+2"), 404, "pool_not_found"),
    "pool %00, feedback": Hostile("/pools/%00" + FEEDBACK, feedback('"reward": 1'), 404, "pool_not_found"),
    "pool, encoded surrogate": Hostile("/pools/%ED%A0%BD" + MODELS, method="GET", status=404, code="pool_not_found"),
    "pool, bad escape": Hostile("/pools/%ZZ%" + MODELS, method="GET", status=404, code="pool_not_found"),
    "pool, emoji": Hostile("/pools/%F0%9F%98%80" + CHAT, chat_with_question("2+2"), 404, "pool_not_found"),
    "pool, 4000 characters": Hostile("/pools/" + "p" * 4000 + MODELS, method="GET", status=404, code="pool_not_found"),
    "pool, a slash": Hostile("/pools/al%2Fpha" + MODELS, method="GET", status=404, code="not_found"),
    "pool, dot dot": Hostile("/pools/%2E%2E%2F%2E%2E" + CHAT, chat_with_question("2+2"), 404, "not_found"),
    # feedback honours the pool of its path
    "feedback, unknown pool": Hostile(
        "/pools/nosuch" + FEEDBACK, feedback('"verdict": "correct"'), 404, "pool_not_found"
    ),
    "feedback, another pool's answer": Hostile(
        "/pools/beta" + FEEDBACK, feedback('"verdict": "correct"'), 404, "answer_not_found"
    ),
    # keys that are no key
    "key, latin-1 byte": Hostile(
        MODELS,
        method="GET",
        status=401,
        code="invalid_api_key",
        headers={"authorization": b"Bearer test-key-\xff0123456789abcdef"},
    ),
    "key, UTF-8 of a surrogate": Hostile(
        CHAT,
        chat_with_question("2+2"),
        401,
        "invalid_api_key",
        headers={"authorization": b"Bearer \xed\xa0\xbd" + KEY.encode()},
    ),
    "key, 8 KB": Hostile(
        FEEDBACK, feedback('"reward": 1'), 401, "invalid_api_key", headers={"authorization": "Bearer " + "k" * 8192}
    ),
    # routes and methods that are not there
    "POST /health": Hostile("/health", b"{}", status=405, code=None),
    "GET chat": Hostile(CHAT, method="GET", status=405, code=None),
    "unknown route": Hostile("/v1/completions", chat_with_question("2+2"), 404, "not_found"),
}


@pytest.fixture(scope="module")
def answer_id(server: Served) -> int:
    """An answer served from pool alpha (the default): feedback on it under /pools/beta must not land."""
    reply = server.post(
        CHAT,
        json={
            "model": server.model,
            "messages": [{"role": "user", "content": "2+2?"}],
            "max_tokens": 1,
            "lanpo": {"mode": "zero_shot"},
        },
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["lanpo"]["answer_ids"][0]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as c:
        yield c


def written(server: Served) -> tuple[int, ...]:
    """The rows of every table a request may write, counted in one query."""
    return tuple(server.rows("SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in WRITES))[0])


def refusals(server: Served) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{"))
    return [line for line in lines if line.get("event") == "refused"]


@pytest.mark.parametrize("case", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_input_gets_a_4xx_writes_nothing_and_logs_one_line(
    server: Served, client: httpx.Client, answer_id: int, case: Hostile
) -> None:
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json", **case.headers}
    content: Any = case.chunks() if case.chunks else None
    if case.body is not None:
        content = case.body.replace(b"{model}", server.model.encode()).replace(b"{answer}", str(answer_id).encode())
    before, logged = written(server), len(refusals(server))
    response = client.request(case.method, server.url + case.path, content=content, headers=headers)
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == case.code
    assert error["type"] == ("authentication_error" if case.status == 401 else "invalid_request_error")
    assert 0 < len(error["message"]) < 300 and "Traceback" not in error["message"]
    assert written(server) == before
    (line,) = refusals(server)[logged:]
    assert (line["status"], line["code"]) == (case.status, case.code)


def test_a_chunked_body_under_the_limit_is_still_served(server: Served) -> None:
    body = {"model": server.model, "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 1}
    raw = json.dumps({**body, "lanpo": {"mode": "zero_shot"}}).encode()
    response = httpx.post(
        server.url + CHAT,
        content=iter([raw[:10], raw[10:]]),
        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    (answer,) = response.json()["lanpo"]["answer_ids"]
    under_alpha = server.post("/pools/alpha" + FEEDBACK, json={"answer_id": answer, "reward": 1.0})
    assert under_alpha.status_code == 200, under_alpha.text  # its own pool's path takes the feedback
