"""Benchmark: full fine-tuning against LoRA, one GRPO update and one checkpoint each: seconds and peak memory.

LoRA (the default policy) is the reference; full fine-tuning (`lora.enabled = false`) trains every weight, keeps a
frozen copy of the start as its reference, two AdamW moments per weight, and writes the whole model at every
checkpoint. Each kind runs in a fresh process, so its peak RSS (`ru_maxrss`) is its own: `model` is the RSS after
the policy is built, `peak` the highest RSS over the updates and checkpoints. Same synthetic rollouts on both
sides (random tokens, group-centred advantages), reference and update passes included, no generation.

    python bench/full_ft.py                                  # the tiny test model (hidden 32, 2 layers)
    python bench/full_ft.py --hidden 512 --layers 8          # a larger random Llama: the memory gap shows
    python bench/full_ft.py --model smollm2 --steps 2        # SmolLM2-135M (the offline model)
    python bench/full_ft.py --gradient-checkpointing         # both sides with model.gradient_checkpointing
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(args: argparse.Namespace, kind: str) -> dict[str, float]:
    """One kind's numbers, in this (fresh) process."""
    import torch

    sys.path.insert(0, str(ROOT))
    from lanpo.models import tiny_causal_lm
    from lanpo.train.config import GRPOConfig, LoraConfig, ModelConfig
    from lanpo.train.consumer.update import update_policy, warmup_schedule
    from lanpo.train.forward.batch import build_batch
    from lanpo.train.plumbing import checkpoint as ckpt
    from lanpo.train.policy import build_policy, enable_checkpointing, load_base

    torch.set_num_threads(args.threads)
    before = rss_mib()
    if args.model == "tiny-random":
        model, tokenizer = tiny_causal_lm(seed=0, hidden=args.hidden, layers=args.layers)
        if args.gradient_checkpointing:
            enable_checkpointing(model)
    else:
        model, tokenizer = load_base(
            ModelConfig(name=args.model, threads=args.threads, gradient_checkpointing=args.gradient_checkpointing)
        )
    params = sum(p.numel() for p in model.parameters())
    lora = LoraConfig(enabled=kind == "lora", r=16, alpha=32)
    policy = build_policy(model, tokenizer, lora, seed=0)
    trained = sum(p.numel() for p in policy.trainable_parameters())
    cfg = GRPOConfig(learning_rate=1e-6 if kind == "full" else 1e-4, micro_batch_size=args.micro_batch)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    scheduler = warmup_schedule(optimizer, args.steps, 0.0)
    built = rss_mib()

    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts, completions = [], []
    for _ in range(args.prompts):
        prompt = torch.randint(5, vocab, (args.prompt_tokens,), generator=generator).tolist()
        for _ in range(args.n):
            prompts.append(prompt)
            completions.append(torch.randint(5, vocab, (args.completion_tokens,), generator=generator).tolist())
    advantages = torch.randn(args.prompts, args.n, generator=generator)
    advantages = (advantages - advantages.mean(dim=1, keepdim=True)).flatten()
    batch = build_batch(prompts, completions, tokenizer.pad_token_id, next(model.parameters()).device)

    update_seconds, save_seconds = [], []
    with tempfile.TemporaryDirectory(prefix="lanpo-bench-fullft-") as root:
        for step in range(1, args.steps + 1):
            started = time.perf_counter()
            update_policy(policy, optimizer, scheduler, batch, advantages, cfg, seed=step)
            update_seconds.append(time.perf_counter() - started)
            started = time.perf_counter()
            ckpt.save_checkpoint(Path(root), step, policy, optimizer, scheduler)
            save_seconds.append(time.perf_counter() - started)
            ckpt.prune_checkpoints(Path(root), 1, protect=step)
    measured = update_seconds[1:] or update_seconds  # the first step warms up (allocations, Adam state)
    return {
        "params": params,
        "trained": trained,
        "rss_before": before,
        "rss_model": built,
        "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "update_s": statistics.median(measured),
        "checkpoint_s": statistics.median(save_seconds),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-random", help="tiny-random (sized by --hidden/--layers) or smollm2")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="updates per kind (the first is a warm-up)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4, help="rollouts per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--child", choices=["lora", "full"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args, args.child)))
        return 0

    results = {}
    for kind in ("lora", "full"):
        argv = [sys.executable, __file__, *sys.argv[1:], "--child", kind]
        out = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return out.returncode
        results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    lora, full = results["lora"], results["full"]
    shape = f"{args.prompts} prompts x {args.n} rollouts x ({args.prompt_tokens} + {args.completion_tokens}) tokens"
    gc = ", gradient checkpointing" if args.gradient_checkpointing else ""
    print(f"model {args.model} ({full['params'] / 1e6:.2f}M weights), {shape}, {args.threads} threads{gc}")
    print(f"trained weights: LoRA r16 {lora['trained'] / 1e6:.3f}M, full {full['trained'] / 1e6:.2f}M")
    print(f"{'':28}{'LoRA':>10}{'full':>10}{'full/LoRA':>11}")
    rows = [
        ("RSS after the policy, MiB", "rss_model"),
        ("peak RSS, MiB", "rss_peak"),
        ("peak - imports, MiB", None),
        ("update, s (median)", "update_s"),
        ("checkpoint, s (median)", "checkpoint_s"),
    ]
    for label, key in rows:
        a, b = (
            (r[key] if key else r["rss_peak"] - r["rss_before"]) for r in (lora, full)
        )  # fmt: skip
        print(f"{label:28}{a:10.2f}{b:10.2f}{b / a if a else float('nan'):10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
