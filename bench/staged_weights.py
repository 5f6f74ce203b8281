"""Benchmark: what a step between checkpoints writes for rollout workers (`lanpo.train.plumbing.staged`: the
policy's weights alone) against what a checkpoint writes (`save_checkpoint`: weights, AdamW moments, schedule,
RNG), bytes on disk and seconds, for a LoRA policy and for full fine-tuning.

Both write the same policy after one AdamW step (so its moments exist), the rows taken in turns (bench/harness.py).
With workers and `checkpoint.every = k`, a run writes k - 1 staged versions and one checkpoint every k steps.

    python bench/staged_weights.py                        # SmolLM2-135M, LoRA r16 on q/k/v/o and full, 3 rounds
    python bench/staged_weights.py --model tiny-random --rounds 1   # the smoke test
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Rounds

ROWS = ("checkpoint", "staged")


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def bench(model_name: str, kind: str, rounds: int) -> tuple[dict[str, int], Rounds[str]]:
    """{row: bytes written} and the timed rounds, for one policy kind (lora | full)."""
    import torch

    from lanpo.train.config import LoraConfig, ModelConfig
    from lanpo.train.plumbing.checkpoint import save_checkpoint
    from lanpo.train.plumbing.staged import stage_policy
    from lanpo.train.policy import build_policy, load_base

    base, tokenizer = load_base(ModelConfig(name=model_name, dtype="float32", device="cpu"))
    lora = LoraConfig(enabled=kind == "lora", r=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    policy = build_policy(base, tokenizer, lora, seed=0)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-6)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    for p in policy.trainable_parameters():  # one step: the moments exist, as in a checkpoint of a running run
        p.grad = torch.full_like(p, 1e-3)
    optimizer.step()

    def checkpoint(root: Path) -> Path:
        save_checkpoint(root, 1, policy, optimizer, scheduler)
        return root

    def staged(root: Path) -> Path:
        stage_policy(root, policy)
        return root

    writes = {"checkpoint": checkpoint, "staged": staged}
    sizes: dict[str, int] = {}
    timed: Rounds[str] = Rounds(ROWS, rounds)
    for round_, order in timed:
        for row in order:
            root = Path(tempfile.mkdtemp(prefix=f"bench-{row}-"))
            try:
                folder, _ = timed.time(round_, row, lambda w=writes[row], r=root: w(r))
                sizes[row] = _bytes(folder)
            finally:
                shutil.rmtree(root, ignore_errors=True)
    return sizes, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="model.name (smollm2, tiny-random, a folder)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the first is a warm-up)")
    args = parser.parse_args()
    print("| policy | written | MB | seconds |")
    print("| --- | --- | --- | --- |")
    for kind in ("lora", "full"):
        sizes, timed = bench(args.model, kind, args.rounds)
        for row in ROWS:
            print(f"| {kind} | {row} | {sizes[row] / 1e6:.1f} | {timed.median(row):.2f} |", flush=True)
        ratio = sizes["staged"] / sizes["checkpoint"]
        seconds = timed.median("staged") / timed.median("checkpoint")
        print(f"{kind}: staged/checkpoint {ratio:.3f}x bytes, {seconds:.2f}x time")


if __name__ == "__main__":
    main()
