"""The README tour's serve step, run as written: `lanpo serve` with the README's options on a pool named as the
demo's, its curl lines in bash, its Python snippet exec'd, and what they asked for found in the store.

The tiny model stands in for SmolLM2 (served under the name the README's requests send, `smollm2`), with a LoRA
adapter of its own where the README's `--adapter` points after a demo; the port is the test's."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import httpx2 as httpx
import pytest

from lanpo.db.connection import open_store
from lanpo.db.readonly import query_readonly
from tests.fresh_store import fresh_store
from tests.serve.conftest import add_pool, free_port, start_server, stop_server
from tests.test_docs import commands_in, lines_of

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
STEP = "### 5. Serve answers over HTTP"
README_PORT = "8000"


def fences(heading: str) -> list[tuple[str, str]]:
    """(language, text) of each fence of the README section under `heading`."""
    lines = lines_of(README)
    start = next(i for i, line in enumerate(lines) if line.text == heading)
    out: list[tuple[str, str]] = []
    body: list[str] | None = None
    for line in lines[start + 1 :]:
        if line.fence is None and re.match(r"#{1,3} ", line.text):
            break
        if line.text.lstrip().startswith("```"):
            if body is None:
                body = []
            else:
                out.append((line.fence or "", "\n".join(body)))
                body = None
        elif body is not None:
            body.append(line.text)
    return out


def make_adapter(base: Path, folder: Path) -> None:
    """A LoRA adapter of the tiny model (the stand-in for the demo's last checkpoint)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    peft.save_pretrained(folder)


def run_curl_lines(script: str, port: int) -> str:
    """The README's shell lines after `lanpo serve`, on the test's port: with curl, or (where none is installed)
    the same POST by httpx."""
    script = script.replace(f":{README_PORT}", f":{port}")
    if shutil.which("curl"):
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout
    tokens = shlex.split(script.splitlines()[-2].removesuffix("\\") + script.splitlines()[-1])
    url = next(t for t in tokens if t.startswith("http"))
    body = json.loads(tokens[tokens.index("-d") + 1])
    return httpx.post(url, json=body, timeout=120).text


def test_the_readme_serve_step_works_as_written(
    pg_url: str, tiny_dir: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    (shell, python, after) = fences(STEP)
    assert [shell[0], python[0], after[0]] == ["bash", "python", "bash"]
    serve_line, *curl_lines = shell[1].splitlines()
    assert serve_line.startswith("lanpo serve ") and serve_line.endswith("&"), serve_line
    serve_args = shlex.split(serve_line.removesuffix("&"))[2:]
    assert serve_args[serve_args.index("--pool") + 1] == "demo"

    home = tmp_path / "home"
    adapter = home / Path(serve_args[serve_args.index("--adapter") + 1]).relative_to("~")
    make_adapter(tiny_dir, adapter)
    serve_args[serve_args.index("--adapter") + 1] = str(adapter)

    with fresh_store(pg_url, tmp_path_factory.mktemp("lanpo-home")) as env:
        db = open_store(env["LANPO_DATABASE_URL"])
        try:
            add_pool(db, "demo", ("arithmetic",))  # the demo leaves a lesson or two
            port = free_port()
            served = start_server(
                {**env, "HOME": str(home), "PYTHONPATH": str(ROOT)},
                tiny_dir,
                tmp_path / "serve.log",
                *serve_args,
                "--served-model-name",
                "smollm2",
                port=port,
            )
            try:
                out = run_curl_lines("\n".join(curl_lines), port)
                answer = json.loads(out[out.index('{"id"') :])
                assert answer["choices"][0]["message"]["content"] is not None
                assert answer["lanpo"]["pool"] == "demo" and answer["lanpo"]["mode"] == "retrieval"

                printed = io.StringIO()
                code = python[1].replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{port}")
                with contextlib.redirect_stdout(printed):
                    exec(compile(code, "README.md (serve step)", "exec"), {})
                assert printed.getvalue().strip(), "the snippet printed nothing"
            finally:
                assert stop_server(served) == 143  # `kill %1`: SIGTERM drains, then exits 143
            log = (tmp_path / "serve.log").read_text()
            assert "Traceback" not in log, log

            rows = served.rows(
                "SELECT s.request_id, s.answer_ids, r.kind, r.status, p.dataset FROM served_answers s "
                "JOIN runs r ON r.id = s.run_id JOIN attempts a ON a.id = s.answer_ids[1] "
                "JOIN rollout_groups g ON g.id = a.group_id JOIN problems p ON p.id = g.problem_id ORDER BY s.id"
            )
            assert [r.request_id for r in rows][:1] == [answer["id"]]
            assert rows[0].answer_ids == answer["lanpo"]["answer_ids"]
            assert len(rows) == 2 and {(r.kind, r.status, r.dataset) for r in rows} == {("serve", "finished", "serve")}
            # vector search ran: the lesson the store held without an embedding got one, written by the owner
            assert served.rows("SELECT count(*) FROM experience_versions WHERE embedding IS NULL")[0][0] == 0
            feedback = served.rows("SELECT attempt_id, gold_answer, correct FROM answer_feedback")
            assert [(f.attempt_id, f.gold_answer) for f in feedback] == [(rows[1].answer_ids[0], "12")]
            assert feedback[0].correct is not None  # graded by lanpo's grader against the gold answer

            (sql,) = [c for c in commands_in(README) if c.args[:1] == ("sql",) and "served_answers" in c.args[1]]
            result = query_readonly(db, sql.args[1])  # the README's query, as the reader
            assert [row[0] for row in result.rows] == [r.request_id for r in rows]
        finally:
            db.dispose()
