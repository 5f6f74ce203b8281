"""`lanpo serve` as a process: refused starts exit 2 with one clear line, a SIGKILL under load loses no answer a
client received and stores none twice, SIGTERM drains and marks the runs finished, keys scope pools."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.serve.conftest import KEY, start_server, stop_server


def env_of(store_env: dict[str, str]) -> dict[str, str]:
    return {**store_env, "PYTHONPATH": os.getcwd()}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--host", "0.0.0.0"), "no API key is set"),
        (("--pool", "nosuch"), "nosuch"),
        (("--api-key", "short"), "at least 16 characters"),
        (("--keys", "/nonexistent/keys.toml"), "does not exist"),
        (("--max-new-tokens", "9000"), "--max-tokens-limit"),
    ],
)
def test_a_refused_start_exits_2_with_one_error(
    run_cli: Callable[..., Any], tiny_dir: Path, args: tuple[str, ...], message: str
) -> None:
    """Refused before any port is bound or model loaded (in-process: `lanpo.cli.main`, the console script's entry)."""
    done = run_cli("serve", "--model", tiny_dir, "--port", "1", *args)
    assert done.code == 2, done.err
    errors = [line for line in done.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in done.err and "Traceback" not in done.err


def test_keys_scope_pools(store_env: dict[str, str], tiny_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(
        '[keys.alice]\nkey = "alice-key-0123456789abc"\npools = ["alpha"]\n'
        '[keys.ops]\nkey = "ops-key-0123456789abcdef"\npools = ["*"]\n'
    )
    served = start_server(
        env_of(store_env),
        tiny_dir,
        tmp_path / "serve.log",
        "--keys",
        str(keys),
        "--judge",
        "none",
        "--gamma",
        "0",
        "--max-new-tokens",
        "4",
    )
    try:
        ask = {"model": served.model, "messages": [{"role": "user", "content": "A geometry question?"}]}
        alice_alpha = served.post("/pools/alpha/v1/chat/completions", key="alice-key-0123456789abc", json=ask)
        alice_beta = served.post("/pools/beta/v1/chat/completions", key="alice-key-0123456789abc", json=ask)
        ops_beta = served.post("/pools/beta/v1/chat/completions", key="ops-key-0123456789abcdef", json=ask)
        assert alice_alpha.status_code == 200 and ops_beta.status_code == 200
        assert alice_beta.status_code == 404  # a pool the key may not read looks like no pool at all
        assert alice_beta.json()["error"]["message"] == served.post(
            "/pools/nosuch/v1/chat/completions", key="alice-key-0123456789abc", json=ask
        ).json()["error"]["message"].replace("nosuch", "beta")
        # feedback on an answer from a pool the key may not read is refused the same way
        beta_answer = ops_beta.json()["lanpo"]["answer_ids"][0]
        refused = served.post(
            "/v1/feedback", key="alice-key-0123456789abc", json={"answer_id": beta_answer, "verdict": "correct"}
        )
        assert refused.status_code == 404 and served.count("answer_feedback") == 0
        # and under a pool's path: a pool the key may not read, or not the answer's pool, as chat answers them
        verdict = {"answer_id": beta_answer, "verdict": "correct"}
        in_path = served.post("/pools/beta/v1/feedback", key="alice-key-0123456789abc", json=verdict)
        elsewhere = served.post("/pools/alpha/v1/feedback", key="ops-key-0123456789abcdef", json=verdict)
        assert (in_path.json()["error"]["code"], elsewhere.json()["error"]["code"]) == (
            "pool_not_found",
            "answer_not_found",
        )
        assert in_path.status_code == elsewhere.status_code == 404 and served.count("answer_feedback") == 0
        names = {r.key_name for r in served.rows("SELECT key_name FROM served_answers")}
        assert names >= {"alice", "ops"} and not any("key-0123" in str(n) for n in names)
    finally:
        stop_server(served)


def test_sigkill_under_load_loses_no_received_answer(
    store_env: dict[str, str], tiny_dir: Path, tmp_path: Path
) -> None:
    served = start_server(
        env_of(store_env),
        tiny_dir,
        tmp_path / "serve.log",
        "--api-key",
        KEY,
        "--judge",
        "none",
        "--gamma",
        "0",
        "--max-new-tokens",
        "16",
        "--run-name",
        "serve-killed",
    )
    received: list[tuple[str, int, str]] = []
    failures: list[str] = []
    stop = threading.Event()

    def client(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            body = {
                "model": served.model,
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"Client {i} asks {n}: what is {i}+{n}?"}],
            }
            try:
                r = served.post("/v1/chat/completions", json=body)
            except httpx.TransportError as exc:
                failures.append(type(exc).__name__)
                return
            if r.status_code == 200:
                data = r.json()
                received.append((data["id"], data["lanpo"]["answer_ids"][0], data["choices"][0]["message"]["content"]))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(received) < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    served.process.send_signal(signal.SIGKILL)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    served.process.wait(timeout=30)
    assert len(received) >= 12, f"only {len(received)} answers before the deadline"
    rows = served.rows(
        "SELECT s.request_id, s.answer_ids, a.response FROM served_answers s "
        "JOIN runs r ON r.id = s.run_id JOIN attempts a ON a.id = s.answer_ids[1] WHERE r.name = 'serve-killed'"
    )
    stored = {r.request_id: (r.answer_ids[0], r.response) for r in rows}
    assert len(stored) == len(rows)  # no request stored twice
    for request_id, answer_id, text in received:
        assert stored.get(request_id) == (answer_id, text), request_id  # every received answer is in the store
    assert len(rows) <= len(received) + 6  # at most one answer per client was stored and not received
    served.db.dispose()


def test_backpressure_then_sigterm_drains_and_finishes_the_runs(
    store_env: dict[str, str], tiny_dir: Path, tmp_path: Path
) -> None:
    served = start_server(
        env_of(store_env),
        tiny_dir,
        tmp_path / "serve.log",
        "--judge",
        "none",
        "--run-name",
        "serve-drained",
        "--max-pending",
        "1",
    )
    reply: dict[str, Any] = {}

    def ask() -> None:
        body = {
            "model": served.model,
            "messages": [{"role": "user", "content": "A long question?"}],
            "max_tokens": 1500,
            "n": 8,
        }
        reply["response"] = served.post("/v1/chat/completions", key=None, json=body)
        reply["at"] = time.monotonic()

    t = threading.Thread(target=ask)
    t.start()
    deadline = time.monotonic() + 30
    while httpx.get(served.url + "/health").json()["in_flight"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # until the request is in flight (its thread may start late on a busy machine)
    short = {"model": served.model, "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 2}
    busy = served.post("/v1/chat/completions", key=None, json=short)
    assert busy.status_code == 503 and busy.json()["error"]["code"] == "overloaded"  # --max-pending 1, at once
    stopped_at = time.monotonic()
    assert stop_server(served) == 143  # lanpo exits 143 on SIGTERM (lanpo.cli.main), after the drain
    t.join(timeout=60)
    assert reply["response"].status_code == 200  # the request in flight was answered before the server stopped
    (run,) = served.rows("SELECT status FROM runs WHERE name = 'serve-drained'")
    assert run.status == "finished"
    answer = reply["response"].json()["lanpo"]["answer_ids"][0]
    assert served.rows("SELECT count(*) FROM attempts WHERE id = :a", a=answer)[0][0] == 1
    stored = served.rows(
        "SELECT s.request_id FROM served_answers s JOIN runs r ON r.id = s.run_id WHERE r.name = 'serve-drained'"
    )
    assert [r.request_id for r in stored] == [reply["response"].json()["id"]]  # the refused request wrote nothing
    assert reply["at"] > stopped_at  # the answer came after SIGTERM: it was drained, not finished before
