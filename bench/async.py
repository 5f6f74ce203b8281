"""Benchmark: asynchronous GRPO (a trainer and one rollout worker, one core each) against the synchronous trainer on
both cores, interleaved; rollouts trained per minute.

Both sides run the CPU learning recipe's GRPO arm (train/configs/learn-cpu.toml with method = grpo, feedback.mode =
none: SmolLM2-135M + LoRA r16, 8 prompts x 8 rollouts of at most 64 tokens a step, four minibatches), validation
off, as `lanpo train` processes on one embedded Postgres:
- sync: `model.threads = 2`: generation, then the update, on both cores;
- async: `lanpo train --workers 1`, `model.threads = 1`, `workers.threads = 1`, `workers.max_staleness = 1` (the
  worker generates step s + 1 while the trainer trains step s), `grpo.tis_cap = 2`.
Both start from the recipe's SFT warm start, trained once up front (`lanpo sft`, a few minutes; `--adapter` reuses
one), so that groups have reward spread and the update trains (from the base model every reward is 0, and every
step would skip its update). A round runs one of each (the order turns every round); each run takes `--steps`
steps, and its throughput is 64 rollouts a step over the wall seconds of its steps after the first (`time/step`
in run_metrics: the first step of the async run also waits for the worker to load its model).

    python bench/async.py                        # 2 rounds of 3 steps each side
    python bench/async.py --rounds 1 --steps 2 --adapter ~/.lanpo/runs/learn-cpu/sft/adapter
    python bench/async.py --model tiny-random --no-sft --rounds 1 --steps 2 --set batch_size=2   # the smoke test

Its last line reads `async/sync: throughput X.XXx (...)`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "train" / "configs" / "learn-cpu.toml"
COMMON = ["method=grpo", "feedback.mode=none", "feedback.p_t=0.0", "sft.enabled=false", "eval.every=0",
          "summarizer.enabled=false"]  # fmt: skip
SIDES = {
    "sync": ["model.threads=2"],
    "async": ["model.threads=1", "workers.count=1", "workers.threads=1", "workers.max_staleness=1", "grpo.tis_cap=2"],
}


def run_side(
    side: str, round_: int, args: argparse.Namespace, model: str, adapter: str | None, env: dict[str, str]
) -> tuple[float, float]:
    """One `lanpo train` run; returns (rollouts trained per minute after the first step, the command's seconds)."""
    name = f"bench-{side}-{round_}"
    sets = [*COMMON, *SIDES[side], f"steps={args.steps}", f"run_name={name}", f"model.name={model}", *args.set]
    if adapter is not None:
        sets.append(f"model.init_adapter={adapter}")
    cmd = [sys.executable, "-m", "lanpo", "train", "--config", str(RECIPE), "--no-progress"]
    for s in sets:
        cmd += ["--set", s]
    started = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    wall = time.perf_counter() - started
    import sqlalchemy as sa

    from lanpo.db.connection import connect

    with connect().connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT m.step, m.value FROM run_metrics m JOIN runs r ON r.id = m.run_id "
                "WHERE r.name = :n AND m.name = 'time/step' ORDER BY m.step"
            ),
            {"n": name},
        ).all()
        # rollouts a step: batch_size x rollout.n, as the run recorded them
        per_step = conn.execute(sa.text("SELECT config FROM runs WHERE name = :n"), {"n": name}).scalar_one()
    rollouts = per_step["batch_size"] * per_step["rollout"]["n"]
    seconds = [float(r.value) for r in rows][1:]
    return rollouts * len(seconds) / sum(seconds) * 60, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="steps per run (>= 2: the first is not counted)")
    parser.add_argument("--adapter", default=None, help="an SFT adapter folder to start from (default: train one)")
    parser.add_argument("--no-sft", action="store_true", help="start from the base model (the smoke test)")
    parser.add_argument("--model", default=None, help="model folder or name (default: the offline SmolLM2)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override (both sides)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2: the first step of each run is not counted")
    from lanpo.models import cpu_name, prepare_smollm2

    model = args.model or str(prepare_smollm2())
    home = tempfile.mkdtemp(prefix="lanpo-bench-async-")
    env = {**os.environ, "LANPO_HOME": home, "PYTHONUNBUFFERED": "1"}
    os.environ["LANPO_HOME"] = home
    subprocess.run(
        [sys.executable, "-m", "lanpo", "db", "upgrade"], env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT
    )
    print(f"CPU: {cpu_name()}; {args.rounds} round(s) x {args.steps} steps per side; LANPO_HOME {home}")
    adapter = args.adapter
    if adapter is None and not args.no_sft:
        adapter = str(Path(home) / "sft" / "adapter")
        sft = [sys.executable, "-m", "lanpo", "sft", "--config", str(RECIPE), "--set", f"model.name={model}",
               "--set", "model.threads=2", "--out", str(Path(home) / "sft"), "--no-db"]  # fmt: skip
        started = time.perf_counter()
        subprocess.run(sft, env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        print(f"SFT start: {adapter} ({time.perf_counter() - started:.0f} s)", flush=True)
    got: dict[str, list[float]] = {side: [] for side in SIDES}
    try:
        for round_ in range(args.rounds):
            order = list(SIDES) if round_ % 2 == 0 else list(reversed(SIDES))
            for side in order:
                rate, wall = run_side(side, round_, args, model, adapter, env)
                got[side].append(rate)
                print(f"round {round_ + 1} {side:5}: {rate:6.1f} rollouts/min ({wall:.0f} s in all)", flush=True)
    finally:
        subprocess.run([sys.executable, "-m", "lanpo", "db", "stop"], env=env, stdout=subprocess.DEVNULL)
    sync, asyn = statistics.median(got["sync"]), statistics.median(got["async"])
    print("| side | rollouts trained / min (median) |")
    print("|---|---|")
    print(f"| sync (2 threads) | {sync:.1f} |")
    print(f"| async (trainer 1 + worker 1 thread, staleness 1) | {asyn:.1f} |")
    print(f"async/sync: throughput {asyn / sync:.2f}x (async {asyn:.1f}, sync {sync:.1f} rollouts/min, "
          f"medians of {args.rounds} round(s) x {args.steps - 1} steps)")  # fmt: skip


if __name__ == "__main__":
    main()
