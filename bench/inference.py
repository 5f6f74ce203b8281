"""Inference benchmark on SmolLM2-135M-Instruct (CPU): batching, and what retrieval and self-correction add.

  batching      `Answerer.solve` zero-shot with the hf backend, `--batch` questions per `generate` (left padding)
                against one question at a time: problems/s and generated tokens/s, side by side.
  retrieval     a private embedded Postgres with a pool of `--pool` experiences (templated lessons on
                reasoning-gym train questions of several tasks); per question: stage 1 alone (BM25), stage 1 +
                the LLM rerank of `--top-k` candidates by the policy itself, and the whole retrieval-mode answer
                against the zero-shot answer (longer prompts included).
  self-correct  the two-turn answer against the zero-shot answer, per question.

Greedy decoding, the same `--n` held-out (test split) questions everywhere. Figures depend on how busy the
machine is: run it alone.

Run:  python bench/inference.py                     (n=8, 64 new tokens, batch 8, pool 2000: a few minutes)
      python bench/inference.py --n 16 --max-new-tokens 128 --only batching
      python bench/inference.py --threads 1        (when other processes share the cores: 2 spinning threads
                                                    on 2 busy cores run several times slower than 1)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import LESSONS, TASKS

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PITFALLS = ["Dropping a minus sign.", "Answering an intermediate quantity.", "Forgetting to carry.", "Rounding early."]


def questions(n: int, split: str, seed: int) -> list[dict[str, Any]]:
    from lanpo.data.generate import generate_problems

    per_task = -(-n // len(TASKS))
    rows = [r for t in TASKS for r in generate_problems(t, per_task, seed=seed, split=split)]
    random.Random(seed).shuffle(rows)
    return rows[:n]


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def generated_tokens(solutions: list[Any]) -> int:
    return sum(t.completion_tokens for s in solutions for x in s.samples for t in x.turns)


def fill_pool(db: Any, n: int, seed: int) -> None:
    from lanpo.config import StoreConfig
    from lanpo.db.connection import transaction
    from lanpo.db.repo.experiences import NewExperience, add_experiences
    from lanpo.db.repo.pools import ensure_pool
    from lanpo.db.repo.problems import Question, upsert_problems
    from lanpo.inference.store import attach_problem_ids

    rng = random.Random(seed)
    rows = questions(n, "train", seed)
    with transaction(db) as session:
        upsert_problems(session, "bench-train", [Question(r["id"], r["question"], r["answer"]) for r in rows])
        qs = attach_problem_ids(session, "bench-train", [Question(r["id"], r["question"]) for r in rows])
        items = []
        for q, r in zip(qs, rows, strict=True):
            words = " ".join(w for w in q.question.split()[:12] if w.isalpha())
            summary = (
                f"## Flow\nFor a {r.get('task', 'math')} problem about {words}: {rng.choice(LESSONS)}\n"
                f"## Principles\n{rng.choice(LESSONS)}\n## Pitfalls\n{rng.choice(PITFALLS)}"
            )
            items.append(NewExperience(q.problem_id, summary, reward=1.0))  # type: ignore[arg-type]
        pool = ensure_pool(session, "bench", StoreConfig(per_problem_cap=1000, per_step_cap=1000))
        add_experiences(session, pool, items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8, help="questions (test split)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="questions per generate call when batched")
    parser.add_argument("--pool", type=int, default=2000, help="experiences in the retrieval pool")
    parser.add_argument("--top-k", type=int, default=8, help="stage-1 candidates the LLM reranks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="batching,retrieval,self-correct")
    parser.add_argument("--repeats", type=int, default=3, help="round-robin repeats; the best time is kept")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core; 1 on a busy machine)")
    parser.add_argument(
        "--model", default="smollm2", help="smollm2, tiny-random (the code paths in seconds), a folder"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))

    import torch

    from lanpo.db.repo.problems import Question
    from lanpo.inference.answerer import Answerer
    from lanpo.inference.config import RetrievalSettings, SamplingSettings
    from lanpo.models import load_causal_lm

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    model, tokenizer = load_causal_lm(args.model, device="cpu", dtype="float32")
    qs = [Question(r["id"], r["question"], r["answer"]) for r in questions(args.n, "test", args.seed)]
    greedy = SamplingSettings(max_new_tokens=args.max_new_tokens, temperature=0.0, seed=args.seed)

    def answerer(batch: int, **kw: Any) -> Answerer:
        return Answerer(
            model,
            tokenizer=tokenizer,
            model_id=args.model,
            sampling=greedy,
            batch_size=batch,
            notify=lambda _: None,
            **kw,
        )

    table: list[tuple[str, str, str, str]] = []
    n = len(qs)
    answerer(args.batch).solve(qs[:1], "zero_shot")  # warm-up (first-call allocations)
    runs: dict[str, Callable[[], Any]] = {"zero": lambda: answerer(args.batch).solve(qs, "zero_shot")}
    if "batching" in only:
        runs["one"] = lambda: answerer(1).solve(qs, "zero_shot")
    if "self-correct" in only:
        runs["self_correct"] = lambda: answerer(args.batch).solve(qs, "self_correct")
    home: Path | None = None
    db: Any = None
    if "retrieval" in only:
        from lanpo.db import migrate, server
        from lanpo.db.connection import make_db

        home = Path(tempfile.mkdtemp(prefix="lanpo-bench-inference-"))
        home.chmod(0o755)  # the embedded server may run as another user
        db = make_db(server.start(home))
        migrate.upgrade(db)
        _, t_fill = timed(lambda: fill_pool(db, args.pool, args.seed))
        print(f"(pool of {args.pool} filled in {t_fill:.1f}s)")
        settings = {"stage1": "bm25", "top_k": args.top_k, "gamma": 0.0, "m": 3}
        stage1 = answerer(args.batch, db=db, retrieval=RetrievalSettings(judge="none", **settings))
        rerank = answerer(args.batch, db=db, retrieval=RetrievalSettings(judge="policy", **settings))
        stage1.retrieve(qs[:1])  # builds the BM25 index over the pool once (cached by pool state)
        runs["retrieval"] = lambda: rerank.solve(qs, "retrieval")
    # Round-robin repeats, best time kept: other processes on the cores only ever add time.
    best: dict[str, float] = {}
    out: dict[str, Any] = {}
    stage1_s: list[float] = []
    rerank_s: list[float] = []
    try:
        for _ in range(args.repeats):
            for name, fn in runs.items():
                out[name], seconds = timed(fn)
                best[name] = min(best.get(name, float("inf")), seconds)
            if db is not None:
                stage1_s += [timed(lambda q=q: stage1.retrieve([q]))[1] for q in qs]
                rerank_s += [timed(lambda q=q: rerank.retrieve([q]))[1] for q in qs]
    finally:
        if db is not None and home is not None:
            from lanpo.db import server

            db.dispose()
            server.stop(home)
            shutil.rmtree(home, ignore_errors=True)
    t_zero = best["zero"]
    if "one" in best:
        t_one = best["one"]
        tok_one, tok_zero = generated_tokens(out["one"]) / t_one, generated_tokens(out["zero"]) / t_zero
        table.append(
            (
                "problems/s, hf backend",
                f"{n / t_one:.2f} (1 at a time)",
                f"{n / t_zero:.2f} (batch {args.batch})",
                f"{t_one / t_zero:.2f}x",
            )
        )
        table.append(("generated tokens/s", f"{tok_one:.1f}", f"{tok_zero:.1f}", f"{tok_zero / tok_one:.2f}x"))
    if "retrieval" in best:
        t_ret = best["retrieval"]
        used = sum(len(s.experiences) for s in out["retrieval"]) / n
        table.append(
            (
                "retrieval: stage 1 (BM25) per question",
                "-",
                f"{1000 * statistics.median(stage1_s):.1f} ms",
                f"pool {args.pool}",
            )
        )
        table.append(
            (
                "retrieval: stage 1 + rerank per question",
                "-",
                f"{1000 * statistics.median(rerank_s):.0f} ms",
                f"top_k {args.top_k}",
            )
        )
        table.append(
            (
                "retrieval mode vs zero-shot, s/question",
                f"{t_zero / n:.2f}",
                f"{t_ret / n:.2f}",
                f"{(t_ret - t_zero) / n:+.2f} s ({used:.1f} experiences/prompt)",
            )
        )
    if "self_correct" in best:
        t_sc = best["self_correct"]
        table.append(
            (
                "self-correct vs zero-shot, s/question",
                f"{t_zero / n:.2f}",
                f"{t_sc / n:.2f}",
                f"{(t_sc - t_zero) / n:+.2f} s ({t_sc / t_zero:.2f}x)",
            )
        )

    model_name = "SmolLM2-135M-Instruct" if args.model == "smollm2" else args.model
    print(
        f"\n{model_name}, CPU ({torch.get_num_threads()} threads), {n} questions, greedy, "
        f"max {args.max_new_tokens} new tokens, best of {args.repeats} round-robin repeats\n"
    )
    header = ("measure", "reference", "lanpo", "ratio / added")
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(4)]
    for row in [header, tuple("-" * w for w in widths), *table]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
