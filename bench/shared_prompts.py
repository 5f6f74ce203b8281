"""Benchmark: shared prompts against whole rows, on a real LANPO step: generate, reference pass and update.

A GRPO group is n completions of one prompt, and a LANPO feedback prompt carries its context. Run whole, every
row of a group pushes that prompt through the model again: n prefills in `generate` (transformers'
`num_return_sequences`), n prompt forwards in the reference pass and in the update. lanpo runs each distinct
prompt once and its completions on its key/value cache (`lanpo.rollout.hf`, `lanpo.train.forward.logprobs`). This
script takes the prompts one step of a training run really served (`rollout_groups`, as stored: zero-shot, intra and
inter prompts mixed) and times the trainer's own phases both ways, interleaved (the order alternates every round;
round 1 is warm-up and not counted), medians:

  generate     n samples of each prompt: `HFBackend(reference=True)`, transformers' `num_return_sequences`
               (whole), against lanpo's decode loop (the shared prefill, and finished rows leave the batch);
               the same seed, so the same tokens until a call's first row finishes, another draw after it
  reference    `LoraPolicy.reference_logprobs` (adapter off, no gradient), `grpo.share_prompts` false / true
  update       `micro_batch_loss` + backward over the step's micro-batches, `grpo.share_prompts` false / true

It also prints the largest |log p| difference between the two ways and how many sampled completions agree.
The policy is SmolLM2 + LoRA r16 on q/k/v/o (B drawn from N(0, 0.01), so the adapter is live), fp32.

    cd $LANPO_HOME && python /path/to/lanpo/bench/shared_prompts.py --run grpo-vs-lanpo-lanpo-both-s0 --step 12
    python bench/shared_prompts.py --model tiny-random --run ... # the same code paths in seconds
    python bench/shared_prompts.py --model tiny-random --synthetic 2 --n 2 --max-new-tokens 4 --rounds 2
                                   # no store at all: 2 zero-shot chain-sum prompts (the smoke test's size)
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from harness import Rounds

PHASES = ("generate", "reference", "update")
STEP_PROMPTS = (
    "SELECT g.prompt, g.mode FROM rollout_groups g JOIN runs r ON r.id = g.run_id "
    "WHERE r.name = :run AND g.step = :step ORDER BY g.id"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="grpo-vs-lanpo-lanpo-both-s0", help="a training run in the store")
    parser.add_argument("--step", type=int, default=12, help="the step whose prompts are replayed")
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny-random, or a HF folder")
    parser.add_argument("--n", type=int, default=8, help="completions per prompt (the recipe's rollout.n)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per completion (at most)")
    parser.add_argument("--micro-batch-size", type=int, default=16, help="sequences per forward (grpo.micro_...)")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (round 1: warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--synthetic", type=int, default=0, help="replay N zero-shot chain-sum prompts instead of a stored step"
    )
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (round 1 is warm-up)")

    import sqlalchemy as sa
    import torch

    from lanpo.db.connection import connect
    from lanpo.models import LoraSpec, attach_lora, load_causal_lm
    from lanpo.rollout import SamplingParams
    from lanpo.rollout.hf import HFBackend
    from lanpo.train.config import GRPOConfig
    from lanpo.train.consumer.update import micro_batch_loss
    from lanpo.train.forward.batch import build_batch
    from lanpo.train.forward.logprob_settings import LogprobSettings
    from lanpo.train.policy import LoraPolicy

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    model, tokenizer = load_causal_lm(args.model, dtype=torch.float32)
    if args.synthetic:
        from lanpo.data.generate import generate_problems
        from lanpo.models import apply_chat
        from lanpo.prompts import actor_messages

        problems = generate_problems("chain_sum", args.synthetic, seed=0)
        prompts = [apply_chat(tokenizer, actor_messages(p["question"])) for p in problems]
        modes = ["zero_shot"] * len(prompts)
        args.run, args.step = "synthetic", 0
    else:
        db = connect()
        with db.connect() as conn:
            rows = conn.execute(sa.text(STEP_PROMPTS), {"run": args.run, "step": args.step}).all()
        db.dispose()
        if not rows:
            parser.error(f"run {args.run!r} stored no prompts at step {args.step} (run it from its $LANPO_HOME)")
        prompts = [r.prompt for r in rows]
        modes = [r.mode for r in rows]

    model = attach_lora(model, LoraSpec(rank=16, alpha=32))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.01, generator=torch.Generator().manual_seed(len(name)))
    backend = HFBackend(model, tokenizer)
    policy = LoraPolicy(model)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    prompt_tokens = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    print(f"{args.run} step {args.step}: {len(prompts)} prompts ({', '.join(modes)}), "
          f"{min(prompt_tokens)}-{max(prompt_tokens)} prompt tokens, n {args.n}, {args.max_new_tokens} new tokens, "
          f"micro-batch {args.micro_batch_size}, {args.threads} thread(s)")  # fmt: skip

    whole_backend = HFBackend(model, tokenizer, reference=True)

    def generate_whole() -> list[list[int]]:
        return [list(c.token_ids) for group in whole_backend.generate(prompts, args.n, params) for c in group]

    def generate_shared() -> list[list[int]]:
        return [list(c.token_ids) for group in backend.generate(prompts, args.n, params) for c in group]

    # The step's rollouts (sampled once, shared way), advantages centred per group as GRPO's are.
    completions = generate_shared()
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(args.n)]
    batch = build_batch(prompt_ids, completions, tokenizer.pad_token_id, torch.device("cpu"))
    advantages = torch.randn(len(prompts), args.n, generator=torch.Generator().manual_seed(0))
    advantages = (advantages - advantages.mean(dim=1, keepdim=True)).flatten()
    micro = args.micro_batch_size

    def reference(share: bool) -> torch.Tensor:
        return policy.reference_logprobs(batch, LogprobSettings(micro_batch_size=micro, share_prompts=share))

    def update(share: bool, ref: torch.Tensor) -> torch.Tensor:
        cfg = GRPOConfig(share_prompts=share)
        model.train()
        model.zero_grad(set_to_none=True)
        for start in range(0, batch.size, micro):
            idx = torch.arange(start, min(start + micro, batch.size))
            loss, _, _ = micro_batch_loss(model, batch.select(idx), advantages[idx], None, ref[idx], None, cfg)
            loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    rounds = Rounds(("whole", "shared"), args.rounds)
    agree, logp_diff, grad_cos = 0.0, 0.0, 1.0
    for round_, ways in rounds:
        got: dict[str, Any] = {}
        for way in ways:
            share = way == "shared"
            tokens, t_gen = rounds.time(round_, ("generate", way), generate_shared if share else generate_whole)
            ref, t_ref = rounds.time(round_, ("reference", way), lambda share=share: reference(share))
            grad, t_upd = rounds.time(round_, ("update", way), lambda share=share, ref=ref: update(share, ref))
            got[way] = (tokens, ref, grad)
            print(f"round {round_ + 1} {way}: generate {t_gen:.1f}s reference {t_ref:.1f}s update {t_upd:.1f}s",
                  flush=True)  # fmt: skip
        (tok_w, ref_w, grad_w), (tok_s, ref_s, grad_s) = got["whole"], got["shared"]
        agree = sum(list(a) == list(b) for a, b in zip(tok_w, tok_s, strict=True)) / len(tok_w)
        mask = batch.completion_mask.bool()
        logp_diff = max(logp_diff, float((ref_w - ref_s)[mask].abs().max()))
        grad_cos = min(grad_cos, float(torch.nn.functional.cosine_similarity(grad_w, grad_s, dim=0)))

    print("\n| phase | whole rows s | shared prompts s | speed-up |\n| --- | ---: | ---: | ---: |")
    total = {"whole": 0.0, "shared": 0.0}
    for phase in PHASES:
        w, s = (rounds.median((phase, way)) for way in ("whole", "shared"))
        total["whole"] += w
        total["shared"] += s
        print(f"| {phase} | {w:.1f} | {s:.1f} | {w / s:.2f}x |")
    print(f"| all three | {total['whole']:.1f} | {total['shared']:.1f} | {total['whole'] / total['shared']:.2f}x |")
    print(f"\nsampled completions identical: {agree:.1%}; max |reference log p difference| {logp_diff:.1e}; "
          f"update gradient cosine (whole vs shared) >= {grad_cos:.6f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
