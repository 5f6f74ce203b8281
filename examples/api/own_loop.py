"""Your own RL loop on a lanpo store (docs/api.md): open the store, draw contexts for a batch of problems, generate
with your own model, record the group with your rewards, read it back with SQL.

    python examples/api/own_loop.py                      # the tiny random model, 2 steps, seconds on a CPU
    python examples/api/own_loop.py --model smollm2 --steps 3
    python examples/api/own_loop.py --steps 4 --out ckpt  # a checkpoint a step; kill it, then rerun with --resume
    python examples/api/own_loop.py --steps 4 --out ckpt --resume

It runs on the store of $LANPO_HOME (the embedded Postgres, created and migrated on first use) or
$LANPO_DATABASE_URL. Only the lines that call `client` are lanpo's; the model, its sampling, the reward and the
update (left out here: put your optimiser step where the comment says) are yours.

With `--out`, each step saves the weights before the store commits the step, and the commit names the file; a
rerun with `--resume` after a kill (SIGKILL, a lost machine) reopens the run through the store API, which rolls
back whatever the killed step had written and says where to continue (`run.next_step`) and what to load
(`run.opened.checkpoint`): no step is recorded twice, and none is skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import torch

from lanpo.errors import LanpoError
from lanpo.feedback import DataConfig, FeedbackConfig, InterConfig, StoreClient, StoreRunConfig, SummarizerConfig
from lanpo.models import load_causal_lm
from lanpo.models.hashing import state_sha256
from lanpo.rollout import Completion, make_backend

SHOWN = """SELECT g.step, g.mode, count(DISTINCT g.id) AS groups, count(c.*) AS context_rows
FROM rollout_groups g JOIN runs r ON r.id = g.run_id LEFT JOIN group_contexts c ON c.group_id = g.id
WHERE r.name = :run GROUP BY 1, 2 ORDER BY 1, 2"""


def generate(model: Any, tokenizer: Any, texts: list[str], n: int, max_new_tokens: int) -> list[list[Completion]]:
    """Your own sampler: n completions per prompt text, as `Completion`s (text and token ids)."""
    pad = tokenizer.pad_token_id or tokenizer.eos_token_id
    groups = []
    for text in texts:
        prompt = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        prompt_ids = tuple(prompt["input_ids"][0].tolist())
        with torch.no_grad():
            out = model.generate(
                **prompt, do_sample=True, max_new_tokens=max_new_tokens, num_return_sequences=n, pad_token_id=pad
            )
        completions = []
        for row in out:
            ids = row[len(prompt_ids) :].tolist()
            finish = "stop" if tokenizer.eos_token_id in ids else "length"
            completions.append(
                Completion(tokenizer.decode(ids, skip_special_tokens=True), tuple(ids), prompt_ids, finish)
            )
        groups.append(completions)
    return groups


def save(model: Any, out: Path, step: int) -> str:
    """Your checkpoint: the weights after `step`, written whole (a temporary file renamed) or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    path, partial = out / f"step-{step}.pt", out / f"step-{step}.pt.tmp"
    torch.save(model.state_dict(), partial)
    partial.replace(path)
    return str(path)


def my_reward(completion: Completion, answer: str | None) -> float:
    """Your reward: here, 1 for a completion that states the answer, else 0.5 for one that stopped by itself."""
    if answer is not None and answer in completion.text:
        return 1.0
    return 0.5 if completion.finish_reason == "stop" else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-random", help="tiny-random, smollm2, a local HF folder or hub id")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--run-name", default="own-loop")
    parser.add_argument("--out", type=Path, help="save the weights there each step, named by the step's commit")
    parser.add_argument("--resume", action="store_true", help="continue the run after its last checkpointed step")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    config = StoreRunConfig(
        run_name=args.run_name,
        data=DataConfig(dataset="own-loop", task="chain_sum", n=8),  # generated from reasoning-gym on first use
        # both kinds of context on every prompt; gamma 0: inter lessons by recency, no relevance scores needed
        feedback=FeedbackConfig(mode="both", p_t=1.0, k=2, candidates=4, inter=InterConfig(gamma=0.0)),
        # a lesson of every rollout at reward >= 0.5; a random model writes no headers, so admit any text
        summarizer=SummarizerConfig(min_reward=0.5, max_new_tokens=24, max_new_per_step=1, require_format=False),
    )
    try:
        client = StoreClient(config)  # the store (a fresh one is migrated), the problems, checked before any model
        model, tokenizer = load_causal_lm(args.model, dtype="float32", device="cpu")
        run = client.open(args.model, resume=args.resume)  # one transaction: created, or resumed and rolled back
        if run.opened.checkpoint is not None:  # the weights of the last checkpointed step
            model.load_state_dict(torch.load(run.opened.checkpoint))
            print(f"resuming after step {run.opened.last_step} from {run.opened.checkpoint}")
        for step in range(run.next_step, args.steps + 1):
            batch = client.problem_ids[:4]  # your sampler of problems: here the same four each step
            prompts = client.prompts(run, step, batch, tokenizer, policy_sha256=state_sha256(model.state_dict()))
            groups = generate(model, tokenizer, prompts.texts, n=2, max_new_tokens=16)
            rewards = [my_reward(c, a) for group, a in zip(groups, prompts.answers, strict=True) for c in group]
            graded = client.grade(prompts, groups, rewards)
            lessons = client.lessons(step, prompts, groups, graded, make_backend("hf", model, tokenizer), tokenizer)
            # ... your update of `model` on (prompts.texts, groups, rewards) goes here ...
            saved = None if args.out is None else save(model, args.out, step)  # before the commit names it
            written = client.record(run, step, prompts, groups, graded, lessons, checkpoint=saved)
            print(f"step {step}: asked {prompts.asked}, got {prompts.modes}; {written.added} lessons admitted")
        client.finish(run)
    except LanpoError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        return 2
    with client.db.connect() as conn:  # read it back: the store is plain SQL
        for row in conn.execute(sa.text(SHOWN), {"run": args.run_name}):
            print(f"step {row.step} {row.mode}: {row.groups} groups, {row.context_rows} context rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
