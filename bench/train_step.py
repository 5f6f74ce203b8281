"""Benchmark: seconds per phase of a LANPO GRPO step on CPU with SmolLM2-135M + LoRA, and the pool's share.

The yardstick is TRL 1.16's GRPOTrainer measured on this machine (ARCHITECTURE.md, "Facts"): SmolLM2 + LoRA r16
(q/k/v/o), 4 prompts x 4 generations x 128 new tokens, beta 5e-4, clip 0.2/0.28: about 49 s per step
(generation 15-18 s, policy + reference log-probs 15-19 s, backward + optimizer ~16 s). TRL is not installed
here, so its midpoints are printed beside ours. The pool's share is the store's work (sampling contexts before
generation + the one step transaction) over the whole step; the target is under 1%.

    python bench/train_step.py                     # 3 steps, the yardstick's shape
    python bench/train_step.py --steps 2 --max-new-tokens 64 --skip-zero-spread

Runs on a fresh embedded Postgres in a temporary LANPO_HOME (the SmolLM2 folder is linked from ~/.lanpo), or on
$LANPO_DATABASE_URL. Wall seconds depend on what else the cores are doing; `cpu` is process CPU seconds (all
threads), and `cpu/threads` estimates the wall time on otherwise idle cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# TRL 1.16 GRPOTrainer midpoints on this CPU (seconds), same shape as the default run here.
TRL = {"generate": 16.5, "logprobs (policy + ref)": 17.0, "backward + optimizer": 16.0, "step": 49.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps (the first is reported apart: warm-up)")
    parser.add_argument("--prompts", type=int, default=4, help="problems per step")
    parser.add_argument("--n", type=int, default=4, help="generations per problem")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--skip-zero-spread", action="store_true", help="drop zero-spread groups from the update")
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    home_tmp = None
    if not os.environ.get("LANPO_DATABASE_URL"):
        home_tmp = tempfile.TemporaryDirectory(prefix="lanpo-bench-train-")
        models = Path("~/.lanpo/models").expanduser()
        if models.exists():
            (Path(home_tmp.name) / "models").symlink_to(models)
        os.environ["LANPO_HOME"] = home_tmp.name

    from lanpo.config import from_mapping, load_toml
    from lanpo.db import migrate
    from lanpo.db.engine import make_engine
    from lanpo.train.config import TrainConfig
    from lanpo.train.loop import train

    engine = make_engine()
    migrate.upgrade(engine)
    base = load_toml(TrainConfig, ROOT / "train/configs/demo-cpu.toml")
    cfg = from_mapping(
        TrainConfig,
        {
            "run_name": f"bench-train-{int(time.time())}",
            "steps": args.steps,
            "batch_size": args.prompts,
            "output_dir": str(Path(tempfile.mkdtemp(prefix="lanpo-bench-ckpt-"))),
            "model": {"name": args.model, "threads": args.threads},
            "data": {**_asdict(base.data), "dataset": "bench-chain_sum"},
            "rollout": {**_asdict(base.rollout), "n": args.n, "max_new_tokens": args.max_new_tokens},
            "grpo": {**_asdict(base.grpo), "skip_zero_spread": args.skip_zero_spread},
            "feedback": _asdict(base.feedback),
            "summarizer": _asdict(base.summarizer),
            "sft": {"enabled": False},
        },
    )
    started = time.perf_counter()
    result = train(cfg, engine=engine, progress=False)
    total = time.perf_counter() - started
    rows = result.metrics
    measured = rows[1:] or rows  # the first step pays one-off costs (allocator, kernels)

    def mean(key: str) -> float:
        values = [r[key] for r in measured if key in r]
        return statistics.fmean(values) if values else float("nan")

    print(
        f"lanpo GRPO step, {args.model} + LoRA r{base.lora.r}, {args.prompts} prompts x {args.n} x "
        f"{args.max_new_tokens} tokens, {args.threads} threads, {len(measured)} measured step(s) "
        f"(+{len(rows) - len(measured)} warm-up), {total:.0f}s in all"
    )
    print(f"{'phase':<28}{'lanpo s':>10}{'share':>8}{'TRL s':>9}{'ratio':>8}")
    step = mean("time/step")
    ours = {
        "context (pool sampling)": mean("time/context"),
        "generate": mean("time/generate"),
        "reward": mean("time/reward"),
        "summarize": mean("time/summarize"),
        "logprobs (policy + ref)": mean("time/ref_logp"),
        "backward + optimizer": mean("time/update"),
        "checkpoint": mean("time/checkpoint"),
        "db_write (one transaction)": mean("time/db_write"),
    }
    for name, value in ours.items():
        trl = TRL.get(name)
        ratio = f"{trl / value:>7.2f}x" if trl and value > 0 else ""
        print(f"{name:<28}{value:>10.2f}{value / step:>8.1%}{(trl or float('nan')):>9.1f}{ratio:>8}")
    print(f"{'step':<28}{step:>10.2f}{1:>8.0%}{TRL['step']:>9.1f}{TRL['step'] / step:>7.2f}x")
    cpu = mean("time/cpu_step")
    print(f"cpu seconds per step {cpu:.1f}; cpu/threads {cpu / args.threads:.1f}s (wall on idle cores, roughly)")
    note = "(ours: the update's forward carries the policy log-probs; the ref forward is counted here)"
    print(f"logprobs row {note}")
    pool = mean("time/pool_share")
    print(
        f"pool share of the step: {pool:.2%} (target < 1%)  |  mean reward {mean('reward/mean'):.3f}, "
        f"zero-spread rollouts {mean('groups/zero_spread'):.0%}"
    )
    if home_tmp is not None:
        from lanpo.db import server

        engine.dispose()
        server.stop(Path(home_tmp.name))
    return 0


def _asdict(obj: object) -> dict:
    import dataclasses

    return dataclasses.asdict(obj)  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
