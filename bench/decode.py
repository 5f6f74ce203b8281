"""Benchmark: lanpo's decode loop against transformers' `generate`, on the learning recipe's real shapes.

`HFBackend` decodes with its own loop (`lanpo.rollout.hf`): n samples of a prompt share its prefill, and a row
that has finished leaves the batch. Three rows, each timed on the same prompts at the same seed, interleaved (the
order rotates every round; round 1 is warm-up and not counted), medians:

  generate              transformers' `generate`, `num_return_sequences = n`: every prompt token n times over,
                        every row decoded until the last one ends (`HFBackend(reference=True)`)
  generate, shared      `generate` from a cache holding each distinct prompt once, repeated n times (what the
                        trainer ran before the loop: the shared prefill, finished rows still decoded as padding)
  lanpo loop            `HFBackend`: the shared prefill, and finished rows leave

Two shapes, the learning recipe's (train/configs/learn-cpu.toml): a training step (8 chain-sum prompts x 8
samples, temperature 1, 64 new tokens) and a validation pass (48 held-out problems x 4, temperature 0.6, top-p
0.9). The policy is SmolLM2 with the SFT start merged (`--start`, so answers end where the runs' answers end:
without it the base model rambles to the limit and no row leaves early) and a fresh LoRA r16 on q/k/v/o, fp32.

    python bench/decode.py --start $LANPO_HOME/experiments/grpo-vs-lanpo/sft/adapter --threads 1
    python bench/decode.py --model tiny-random --rounds 2      # the same code paths in seconds
    python bench/decode.py --model tiny-random --rounds 1 --shapes step   # the smoke test's size
"""

from __future__ import annotations

import argparse
import os
import statistics
from functools import partial
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness import Rounds

from lanpo.models import cache_kwarg  # after the offline switch
from lanpo.rollout.hf import HFBackend, prompt_cache

ROWS = ("generate", "generate, shared", "lanpo loop")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny-random, an HF folder or hub id")
    parser.add_argument("--start", default=None, help="an SFT adapter folder to merge first (the runs' start)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the first is warm-up")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: every core)")
    parser.add_argument("--shapes", default="step,validation", help="which shapes to time: step, validation")
    args = parser.parse_args()

    import torch

    from lanpo.data.generate import generate_problems
    from lanpo.models import LoraSpec, apply_chat, attach_lora, load_causal_lm, merge_adapter
    from lanpo.prompts import actor_messages
    from lanpo.rollout import SamplingParams

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    model, tokenizer = load_causal_lm(args.model, dtype=torch.float32, device="cpu")
    if args.start:
        model, _ = merge_adapter(model, args.start)
    model = attach_lora(model, LoraSpec(rank=16, alpha=32))
    options = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
    train = generate_problems("chain_sum", 8, seed=0, options=options)
    held_out = generate_problems("chain_sum", 48, seed=0, split="test", options=options)
    shapes = {
        "step 8x8x64": ([p["question"] for p in train], 8, SamplingParams(max_new_tokens=64, seed=1)),
        "validation 48x4x64": (
            [p["question"] for p in held_out],
            4,
            SamplingParams(max_new_tokens=64, temperature=0.6, top_p=0.9, seed=2),
        ),
    }
    backends = {"generate": HFBackend(model, tokenizer, reference=True), "lanpo loop": HFBackend(model, tokenizer)}
    backends["generate, shared"] = SharedPrefillGenerate(model, tokenizer, reference=True)
    print(f"{args.model}{' + ' + args.start if args.start else ''}, LoRA r16, fp32, {args.threads} thread(s)")

    wanted = set(args.shapes.split(","))
    if not wanted <= {"step", "validation"}:
        parser.error(f"--shapes takes step and/or validation, got {args.shapes!r}")
    shapes = {name: shape for name, shape in shapes.items() if name.split()[0] in wanted}
    for shape, (questions, n, params) in shapes.items():
        prompts = [apply_chat(tokenizer, actor_messages(q)) for q in questions]
        rounds = Rounds(ROWS, args.rounds)
        tokens: dict[str, float] = {}
        for round_, order in rounds:
            for row in order:
                groups, took = rounds.time(round_, row, partial(backends[row].generate, prompts, n, params))
                tokens[row] = statistics.mean(len(c.token_ids) for g in groups for c in g)
                print(f"{shape} round {round_ + 1} {row}: {took:.1f}s, {tokens[row]:.1f} tokens a completion",
                      flush=True)  # fmt: skip
        print(f"\n{shape}: {len(prompts)} prompts x {n}, medians of {rounds.measured} round(s)")
        print("| row | s | vs generate | tokens a completion |\n| --- | ---: | ---: | ---: |")
        for row, s, speedup in rounds.against("generate"):
            print(f"| {row} | {s:.1f} | {speedup:.2f}x | {tokens[row]:.1f} |")
        print()
    return 0


class SharedPrefillGenerate(HFBackend):
    """`generate` from a cache computed once per distinct prompt: the trainer's rollout path before the loop."""

    def _reference(self, batch: Any, copies: int, params: Any, greedy: bool) -> list[list[int]]:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        cache, _ = prompt_cache(self.model, ids, mask, copies)
        out = self.model.generate(
            input_ids=ids.repeat_interleave(copies, 0),
            attention_mask=mask.repeat_interleave(copies, 0),
            **{cache_kwarg(self.model): cache},
            **self.generate_kwargs(params, greedy),
        )
        return self.trimmed(out, ids.shape[1])


if __name__ == "__main__":
    raise SystemExit(main())
