"""Benchmark: bf16 against fp32 for the GRPO update on CPU, on one batch: loss, gradient and seconds.

The CPU has AVX512-BF16 (no AMX flag in /proc/cpuinfo), so bf16 matmuls might pay. This script answers whether
they do for lanpo's update, and whether the update stays the same update. One batch of real rollouts (SmolLM2 +
LoRA r16 on q/k/v/o, `--prompts` chain sums x `--n` completions of up to `--max-new-tokens`, sampled once in fp32)
goes through the trainer's own code — the reference pass (`LoraPolicy.reference_logprobs`, adapter disabled) and
`micro_batch_loss` + backward (clip 0.2 / 0.28, beta 5e-4, token-mean) — in three precisions:

  fp32              fp32 weights (lanpo's CPU default, `model.dtype = "auto"`)
  autocast bf16     fp32 weights and LoRA, the trainer's `grpo.autocast = "bf16"`: its forwards under
                    torch.autocast("cpu", bfloat16), the log-softmax in fp32, backward outside autocast
  bf16 weights      the base in bf16 (`model.dtype = "bfloat16"`), the LoRA adapter kept in fp32 (PEFT's default)

Every variant starts from the same adapter: A as PEFT initialises it, B drawn from N(0, 0.01) so that both
factors get a gradient. The table gives, against fp32: the loss difference, the ratio of gradient norms, the cosine
between the flattened LoRA gradients, and the median seconds of (reference pass + forward/backward), over
`--rounds` interleaved rounds (the variant order rotates every round; round 1 is warm-up and not counted).

    python bench/update_dtype.py                        # 4 prompts x 4 x 64 tokens, 5 rounds, 1 thread
    python bench/update_dtype.py --threads 2 --rounds 7
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from typing import Any

from harness import Rounds

VARIANTS = ("fp32", "autocast bf16", "bf16 weights")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4, help="chain-sum problems in the batch")
    parser.add_argument("--n", type=int, default=4, help="completions per problem")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per completion (at most)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (round 1: warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model", default="smollm2", help="smollm2, tiny-random (the code paths in seconds), a folder"
    )
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (round 1 is warm-up)")

    import reasoning_gym
    import torch

    from lanpo.feedback.contexts import fit_prompt
    from lanpo.models import LoraSpec, adapter_state, attach_lora, cpu_name, load_causal_lm, prepare_smollm2
    from lanpo.rewards import grade
    from lanpo.rl.advantages import group_advantages
    from lanpo.rollout import SamplingParams
    from lanpo.rollout.hf import HFBackend
    from lanpo.train.config import GRPOConfig
    from lanpo.train.consumer.update import micro_batch_loss
    from lanpo.train.forward.batch import autocast_dtype, build_batch
    from lanpo.train.forward.logprob_settings import LogprobSettings
    from lanpo.train.policy import LoraPolicy

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    torch.manual_seed(args.seed)
    folder = prepare_smollm2() if args.model == "smollm2" else args.model
    cfg = GRPOConfig(beta=5e-4, eps_low=0.2, eps_high=0.28, loss_agg="token-mean")

    def policy_in(dtype: str, state: dict[str, torch.Tensor] | None) -> tuple[Any, Any]:
        base, tokenizer = load_causal_lm(folder, device="cpu", dtype=dtype)
        model = attach_lora(base, LoraSpec(rank=16, alpha=32))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if state is not None and "lora_" in name:
                    p.copy_(state[name].to(p.dtype))
                elif state is None and "lora_B" in name:
                    p.normal_(0, 0.01)
        return model, tokenizer

    fp32, tokenizer = policy_in("float32", None)
    state = {k: v.clone() for k, v in fp32.named_parameters() if "lora_" in k}
    models = {"fp32": fp32, "autocast bf16": fp32, "bf16 weights": policy_in("bfloat16", state)[0]}
    lora_dtype = next(p.dtype for n, p in models["bf16 weights"].named_parameters() if "lora_" in n)
    assert adapter_state(models["bf16 weights"]).keys() == adapter_state(fp32).keys()

    data = reasoning_gym.create_dataset(
        "chain_sum", size=args.prompts, seed=args.seed, min_terms=2, max_terms=2, min_digits=1, max_digits=2
    )
    problems = [data[i] for i in range(args.prompts)]
    prompts = [fit_prompt(tokenizer, "zero_shot", p["question"], [], 1024)[0] for p in problems]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, seed=args.seed)
    started = time.perf_counter()
    groups = HFBackend(fp32, tokenizer).generate(prompts, args.n, params)
    print(f"sampled {args.prompts} x {args.n} completions in fp32 in {time.perf_counter() - started:.1f} s")
    flat = [c for g in groups for c in g]
    graded = grade(
        [c.text for c in flat], [p["answer"] for p in problems for _ in range(args.n)], ["zero_shot"] * len(flat)
    )
    rewards = torch.tensor([g.reward for g in graded])
    advantages = group_advantages(rewards, args.n)
    if float(advantages.abs().sum()) == 0:  # no group had spread: a fixed +-1 pattern keeps a gradient to compare
        advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(flat))])
    batch = build_batch(
        [c.prompt_token_ids for c in flat], [c.token_ids for c in flat], tokenizer.pad_token_id, torch.device("cpu")
    )
    tokens = int(batch.completion_mask.sum())
    print(
        f"batch: {batch.size} sequences, {tokens} completion tokens, mean reward {float(rewards.mean()):.3f}; "
        f"bf16-weights LoRA dtype {lora_dtype}"
    )

    def run(variant: str) -> tuple[float, torch.Tensor, float]:
        model = models[variant]
        model.zero_grad(set_to_none=True)
        policy = LoraPolicy(model)
        variant_cfg = replace(cfg, autocast="bf16" if variant == "autocast bf16" else "off")  # as the trainer runs
        started = time.perf_counter()
        ref = policy.reference_logprobs(
            batch,
            LogprobSettings(
                micro_batch_size=batch.size,
                share_prompts=cfg.share_prompts,
                autocast=autocast_dtype(variant_cfg.autocast, batch.input_ids.device),
            ),
        )
        loss, _, _ = micro_batch_loss(model, batch, advantages, None, ref, None, variant_cfg)
        loss.backward()
        seconds = time.perf_counter() - started
        grad = torch.cat([p.grad.double().flatten() for n, p in model.named_parameters() if "lora_" in n])
        return loss.item(), grad, seconds

    rounds = Rounds(VARIANTS, args.rounds)
    results: dict[str, tuple[float, torch.Tensor]] = {}
    for r, order in rounds:
        for variant in order:
            loss, grad, s = run(variant)
            results[variant] = (loss, grad)
            rounds.add(r, variant, s)
        timed = ", ".join(f"{v} {rounds.last(v):.2f} s" for v in order) if rounds.counted(r) else "warm-up"
        print(f"round {r + 1}/{args.rounds}: {timed}")

    base_loss, base_grad = results["fp32"]
    print(
        f"\n{args.prompts} prompts x {args.n} x <= {args.max_new_tokens} tokens, {args.threads} thread(s), "
        f"medians of {args.rounds - 1} rounds; CPU: {cpu_name()}"
    )
    print("| precision | loss | loss - fp32 | grad norm / fp32 | grad cosine | s (ref + fwd/bwd) | speed vs fp32 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for variant, s, speedup in rounds.against("fp32"):
        loss, grad = results[variant]
        cosine = float(torch.nn.functional.cosine_similarity(grad, base_grad, dim=0))
        print(
            f"| {variant} | {loss:+.4e} | {loss - base_loss:+.1e} | {float(grad.norm() / base_grad.norm()):.4f} "
            f"| {cosine:.4f} | {s:.2f} | {speedup:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
