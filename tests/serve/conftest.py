"""`lanpo serve` as users run it: the real command in a subprocess on a fresh database, called over loopback by the
stock `openai` client and by plain HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.config import StoreConfig
from lanpo.db.connection import make_db, open_store, transaction
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.pools import ensure_pool
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.models import tiny_causal_lm
from tests.fresh_store import fresh_store

KEY = "test-key-0123456789abcdef"
TOPICS = ("addition", "multiplication", "fractions", "percentages")
LESSON_REWARD = 0.8137  # distinctive: must never show up in a prompt
SCOPED_KEYS = {"alice": "alice-key-0123456789abcdef", "bob": "bob-key-0123456789abcdef", "ops": "ops-key-0123456789ab"}


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-model")
    model, tokenizer = tiny_causal_lm(seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_pool(db: Engine, name: str, topics: tuple[str, ...] = TOPICS) -> list[int]:
    """A pool with one lesson per topic, each from a problem of dataset `train-<name>`; the lesson version ids."""
    with transaction(db) as session:
        rows = [
            Question(f"{name}-{i}", f"What is {i}+{i + 1}? ({topic})", str(2 * i + 1))
            for i, topic in enumerate(topics)
        ]
        upsert_problems(session, f"train-{name}", rows)
        ids = list(
            session.scalars(sa.text("SELECT id FROM problems WHERE dataset = :d ORDER BY id"), {"d": f"train-{name}"})
        )
        items = [
            NewExperience(pid, f"A lesson on {topic}: write each step, then check the {topic} result.", LESSON_REWARD)
            for topic, pid in zip(topics, ids, strict=True)
        ]
        pool = ensure_pool(session, name, StoreConfig())
        return add_experiences(session, pool, items).version_ids


@dataclass
class Served:
    """A running `lanpo serve`: its process, URL, database (as the owner) and the log it writes."""

    process: subprocess.Popen
    url: str
    db: Engine
    log: Path
    env: dict[str, str]
    model: str

    def client(self, pool: str | None = None, key: str = KEY) -> Any:
        import openai

        base = f"{self.url}/pools/{pool}/v1" if pool else f"{self.url}/v1"
        return openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)

    def post(self, path: str, key: str | None = KEY, **kwargs: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.post(self.url + path, headers={**headers, **kwargs.pop("headers", {})}, timeout=120, **kwargs)

    def rows(self, sql: str, **params: Any) -> list[Any]:
        with self.db.connect() as conn:
            return list(conn.execute(sa.text(sql), params))

    def count(self, table: str) -> int:
        return self.rows(f"SELECT count(*) FROM {table}")[0][0]


def start_server(env: dict[str, str], model: Path, log: Path, *args: str, port: int | None = None) -> Served:
    port = port or free_port()
    command = [sys.executable, "-m", "lanpo", "serve", "--model", str(model), "--port", str(port), *args]
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"lanpo serve exited {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return Served(process, url, make_db(env["LANPO_DATABASE_URL"]), log, env, str(model))
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    process.kill()
    raise AssertionError(f"lanpo serve did not answer /health in 180 s:\n{log.read_text()}")


def stop_server(served: Served, sig: int = signal.SIGTERM) -> int:
    if served.process.poll() is None:
        served.process.send_signal(sig)
    try:
        return served.process.wait(timeout=60)
    finally:
        served.db.dispose()


def two_pools(pg_url: str, home: Path) -> Iterator[dict[str, str]]:
    """A fresh, migrated database with pools `alpha` (four lessons) and `beta` (three)."""
    with fresh_store(pg_url, home) as env:
        db = open_store(env["LANPO_DATABASE_URL"])
        add_pool(db, "alpha")
        add_pool(db, "beta", ("geometry", "algebra", "statistics"))
        db.dispose()
        yield env


@pytest.fixture(scope="module")
def store_env(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`two_pools` for one test module (its tests start servers of their own)."""
    yield from two_pools(pg_url, tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="package")
def served_store_env(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`two_pools` for the one `server` of the package."""
    yield from two_pools(pg_url, tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="package")
def server(
    served_store_env: dict[str, str], tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """`lanpo serve` on the tiny model, started once for every module of tests/serve that asks for it (a start costs
    seconds): default pool alpha, retrieval by BM25 alone (the tiny model's judge scores are noise), one lesson per
    prompt, a key for every pool. Its tests share one store: they count rows before and after, never from zero.
    Pool `notes` (empty at start) learns from its traffic (tests/serve/test_learning.py); the keys of `SCOPED_KEYS`
    are bound to scopes alice and bob, or to none (ops)."""
    home = tmp_path_factory.mktemp("serve")
    log = home / "serve.log"
    db = open_store(served_store_env["LANPO_DATABASE_URL"])
    with transaction(db) as session:
        ensure_pool(session, "notes", StoreConfig())
    db.dispose()
    keys = home / "keys.toml"
    keys.write_text(
        "".join(
            f'[keys.{name}]\nkey = "{key}"\n' + (f'scopes = ["{name}"]\n' if name != "ops" else "")
            for name, key in SCOPED_KEYS.items()
        )
    )
    args = (
        "--pool",
        "alpha",
        "--judge",
        "none",
        "--gamma",
        "0",
        "--m",
        "1",
        "--top-k",
        "4",
        "--max-new-tokens",
        "8",
        "--max-question-tokens",
        "256",
        "--max-body-bytes",
        "65536",
        "--api-key",
        KEY,
        "--keys",
        str(keys),
        "--run-name",
        "serve-test",
        *("--learn", "notes", "--learn-scaffold", "--no-learn-require-format", "--learn-max-new-tokens", "48"),
    )
    served = start_server({**served_store_env, "PYTHONPATH": os.getcwd()}, tiny_dir, log, *args)
    yield served
    stop_server(served)


Factory = Callable[..., Served]
