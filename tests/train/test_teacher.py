"""`lanpo sft data`: teacher pairs for the three skills, verified, with provenance; a local model or an
OpenAI-compatible endpoint (a real HTTP server on localhost here, answering like a teacher that can add)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from lanpo import prompts
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.train.sft.teacher import SKILLS
from lanpo.train.sft.warm_start import read_pairs

UNSOLVABLE_GOLD = "QZX-GOLD-5521"  # no teacher writes it: it must never be sent to one either


def teacher_reply(messages: list[dict[str, str]]) -> str:
    """A teacher that adds: right on even first operands, one off on odd ones at first; forgets the plan header
    when the question's second operand is 7."""
    user = messages[-1]["content"]
    a, b = (int(x) for x in re.search(r"What is (\d+) \+ (\d+)\?", user).groups())  # type: ignore[union-attr]
    if "Distil this into a lesson" in user:
        return (
            "## Flow\nAdd the parts in order.\n## Principles\n- Write each step.\n## Pitfalls\n- Forgetting a carry."
        )
    if "earlier attempts" in user:
        return f"## Review\nI redo the sum.\n## Solution\n{a} + {b} = {a + b}, so \\boxed{{{a + b}}}."
    if "lessons learned" in user:
        plan = "" if b == 7 else "## Plan\nAdd.\n"
        return f"## Relevance\nLesson 1 applies.\n{plan}## Solution\n\\boxed{{{a + b}}}"
    return f"The sum is \\boxed{{{a + b + a % 2}}}."


@pytest.fixture
def endpoint() -> Iterator[dict[str, Any]]:
    seen: dict[str, Any] = {"bodies": [], "auth": set()}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen["bodies"].append(body)
            seen["auth"].add(self.headers.get("Authorization"))
            if self.path != "/v1/chat/completions":
                self.send_error(404)
                return
            reply = {"choices": [{"message": {"role": "assistant", "content": teacher_reply(body["messages"])}}]}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    seen["url"] = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def sums(session: Session) -> None:
    rows = [Question(f"s{i}", f"What is {i} + {i + 5}?", str(2 * i + 5)) for i in range(8)]
    rows.append(Question("hard", "What is 40 + 2? Answer in the secret code.", UNSOLVABLE_GOLD))
    upsert_problems(session, "sums", rows)
    session.commit()


def test_endpoint_teacher_pairs_are_verified_with_provenance(
    endpoint: dict[str, Any], sums: None, run_cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEACHER_KEY", "sk-test")
    out = tmp_path / "pairs.jsonl"
    args = ["sft", "data", "--teacher", "served-model", "--dataset", "sums", "--n", "9", "--out", out]
    result = run_cli(*args, "--url", endpoint["url"], "--api-key-env", "TEACHER_KEY", "--batch-size", "4")
    assert result.code == 0, result.err
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    assert read_pairs(out)  # what `lanpo sft --data` and sft.data read
    by_skill = {s: [p for p in pairs if p["provenance"]["skill"] == s] for s in SKILLS}
    assert all(by_skill[s] for s in SKILLS) and len(pairs) <= 9
    headers = {
        "summary": prompts.SUMMARY_HEADERS,
        "reflection": prompts.INTRA_HEADERS,
        "feedback": prompts.INTER_HEADERS,
    }
    for skill, items in by_skill.items():
        for pair in items:
            prov = pair["provenance"]
            assert prov["teacher"] == "served-model" and prov["problem"].startswith("sums:s")
            assert prov["template_version"]["pairs"] and prov["created_at"]
            assert prov["verdicts"]["headers"] and prompts.has_headers(pair["messages"][-1]["content"], headers[skill])
            if skill != "summary":
                assert prov["verdicts"]["correct"] is True
    # summaries only of verified solutions: odd first operands were answered wrong at first
    assert all(int(re.search(r"What is (\d+)", p["messages"][-2]["content"]).group(1)) % 2 == 0  # type: ignore[union-attr]
               for p in by_skill["summary"])  # fmt: skip
    assert "feedback: " in result.err and "rejected: headers" in result.err  # b = 7 forgot its plan
    # the gold answer reached no request; the key went as a bearer token
    for body in endpoint["bodies"]:
        assert UNSOLVABLE_GOLD not in json.dumps(body)
    assert endpoint["auth"] == {"Bearer sk-test"}


def test_local_teacher_whose_pairs_all_fail_writes_nothing(
    sums: None, run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    out = tmp_path / "pairs.jsonl"
    result = run_cli(
        "sft", "data", "--teacher", "tiny-random", "--dataset", "sums", "--n", "3", "--out", out,
        "--max-new-tokens", "8", "--batch-size", "9",
    )  # fmt: skip
    assert result.code == 2 and "no pair passed the filters" in result.err
    assert "reflection: 0 kept of 9" in result.err and not out.exists()


def test_an_endpoint_that_is_not_there_is_a_clean_error(
    sums: None, run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    result = run_cli(
        "sft", "data", "--teacher", "m", "--dataset", "sums", "--out", tmp_path / "p.jsonl", "--url", "http://127.0.0.1:9/v1"
    )  # fmt: skip
    assert result.code == 2 and "cannot reach http://127.0.0.1:9/v1/chat/completions" in result.err


# The full lane (bash .ci/run --full; 17 s of a main-lane worker, moved when a fresh clone's CI ran past its budget).
# Twins here: the endpoint and local teachers above (the same `lanpo sft data` path: replies verified, provenance
# written, nothing written when none passes), and SmolLM2's generation in tests/inference/test_cli.py.
@pytest.mark.slow
@pytest.mark.full
def test_smollm2_as_teacher(session: Session, run_cli: Callable[..., Any], tmp_path: Path) -> None:
    """The real small model writes replies for every skill; whatever passes the filters is written, else nothing."""
    upsert_problems(session, "few", [Question(f"f{i}", f"What is {i} + {i + 1}?", str(2 * i + 1)) for i in range(3)])
    session.commit()
    out = tmp_path / "pairs.jsonl"
    result = run_cli(
        "sft", "data", "--teacher", "smollm2", "--dataset", "few", "--n", "3", "--out", out, "--max-new-tokens", "48"
    )
    assert result.code in (0, 2), result.err
    assert "summary: " in result.err and "reflection: " in result.err
    assert out.exists() == (result.code == 0)
