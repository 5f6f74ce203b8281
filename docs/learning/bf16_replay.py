"""Does bf16 autocast move the policy less on the same data? A finished fp32 GRPO run's own rollouts, replayed
through the trainer's update twice from the run's start: once in fp32, once under `grpo.autocast = "bf16"`.

In a real run the two precisions sample different rollouts from the first update on, so a difference in how far the
policy moves mixes numerics with the run's own randomness. Here both copies see exactly the stored batches of the
fp32 run (its prompts and responses, re-tokenised; advantages from its rewards), step by step, with the same
optimizer, schedule and minibatch order (`update_policy`, as `grpo_step` calls it). What differs is only the
precision of the forwards. Per step it prints each copy's distance from the start (L2 norm of the LoRA parameters'
change), the ratio bf16 / fp32, the cosine between the two changes, and each update's own KL and clip fraction.

    cd $LANPO_HOME && python docs/learning/bf16_replay.py RUN [--steps N] [--threads T]
    # e.g. fast-paths-grpo-s0 (its recipe and start are read from the store)
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import sqlalchemy as sa
import torch

from lanpo.config import from_mapping
from lanpo.db.connection import connect
from lanpo.models import merge_adapter, set_threads
from lanpo.rl.advantages import group_advantages
from lanpo.seeds import mix_seed
from lanpo.train.config import TrainConfig
from lanpo.train.consumer.update import update_policy
from lanpo.train.forward.batch import build_batch
from lanpo.train.plumbing.dist import Dist
from lanpo.train.policy import build_policy, load_base
from lanpo.train.state import optimizer_and_schedule

ROWS = """
SELECT g.step, g.id AS group_id, g.prompt, a.response, a.reward, a.completion_tokens
FROM rollout_groups g JOIN runs r ON r.id = g.run_id JOIN attempts a ON a.group_id = g.id
WHERE r.name = :run AND g.step BETWEEN 1 AND :steps
ORDER BY g.step, g.id, a.id
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a finished fp32 GRPO run (its stored rollouts are replayed)")
    parser.add_argument("--steps", type=int, default=20, help="steps replayed from step 1")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()

    db = connect()
    with db.connect() as conn:
        config = conn.execute(sa.text("SELECT config FROM runs WHERE name = :run"), {"run": args.run}).scalar_one()
        rows = conn.execute(sa.text(ROWS), {"run": args.run, "steps": args.steps}).all()
    db.dispose()
    cfg = from_mapping(TrainConfig, config)
    if cfg.grpo.autocast != "off" or cfg.method != "grpo" or cfg.model.init_adapter is None:
        raise SystemExit(f"{args.run}: an fp32 GRPO run from an init_adapter is needed")
    set_threads(args.threads)

    copies = {}
    for name, autocast in (("fp32", "off"), ("bf16", "bf16")):
        base, tokenizer = load_base(cfg.model, cfg.seed)
        base, _ = merge_adapter(base, cfg.model.init_adapter)
        policy = build_policy(base, tokenizer, cfg.lora, cfg.seed, Dist())  # the same fresh adapter (seeded)
        optimizer, scheduler = optimizer_and_schedule(cfg, policy)
        copies[name] = (policy, optimizer, scheduler, replace(cfg.grpo, autocast=autocast))
    start = _flat(copies["fp32"][0])
    assert torch.equal(start, _flat(copies["bf16"][0])), "the two copies must start from the same adapter"

    n = cfg.rollout.n
    print(f"{args.run}: {cfg.steps} steps recorded, replaying {args.steps}; {n} rollouts a group")
    print(
        "| step | rollouts | ‖Δ‖ fp32 | ‖Δ‖ bf16 | bf16 / fp32 | cos(Δ fp32, Δ bf16) | KL fp32 | KL bf16 "
        "| clip fp32 | clip bf16 | s fp32 | s bf16 |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for step in range(1, args.steps + 1):
        got = [r for r in rows if r.step == step]
        if not got or len(got) % n:
            raise SystemExit(f"step {step}: {len(got)} attempts stored, not groups of {n}")
        prompt_ids = [tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in got]
        completions = [_completion(tokenizer, r.response, r.completion_tokens) for r in got]
        rewards = torch.tensor([r.reward for r in got], dtype=torch.float32)
        advantages = group_advantages(rewards, n)
        batch = build_batch(prompt_ids, completions, tokenizer.pad_token_id, torch.device("cpu"))
        out = {}
        for name, (policy, optimizer, scheduler, grpo) in copies.items():
            started = time.perf_counter()
            stats = update_policy(
                policy, optimizer, scheduler, batch, advantages, grpo, mix_seed(cfg.seed, "update", step), Dist(),
                temperature=cfg.rollout.temperature,
            )  # fmt: skip
            metrics = stats.as_metrics()
            out[name] = (_flat(policy) - start, metrics, time.perf_counter() - started)
        (d32, m32, s32), (d16, m16, s16) = out["fp32"], out["bf16"]
        n32, n16 = float(d32.norm()), float(d16.norm())
        cos = float(torch.nn.functional.cosine_similarity(d32, d16, dim=0)) if n32 and n16 else float("nan")
        print(
            f"| {step} | {len(got)} | {n32:.4f} | {n16:.4f} | {n16 / n32 if n32 else float('nan'):.3f} | {cos:.4f} "
            f"| {m32.get('kl', float('nan')):.2e} | {m16.get('kl', float('nan')):.2e} "
            f"| {m32.get('clip_frac', float('nan')):.4f} | {m16.get('clip_frac', float('nan')):.4f} "
            f"| {s32:.1f} | {s16:.1f} |",
            flush=True,
        )


def _flat(policy: object) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in policy.trainable_parameters()])  # type: ignore[attr-defined]


def _completion(tokenizer: object, response: str, tokens: int | None) -> list[int]:
    """The response's tokens as the engine wrote them: the text re-tokenised, with the end-of-text token the
    decoded text drops when the stored count says there was one."""
    ids = tokenizer(response, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    if tokens is not None and tokens == len(ids) + 1:
        ids.append(tokenizer.eos_token_id)  # type: ignore[attr-defined]
    return ids


if __name__ == "__main__":
    main()
