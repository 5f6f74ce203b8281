"""Benchmark: what `rollout.vllm.reproducible` costs. vLLM on SmolLM2-135M with the switch on and off, each in a fresh
process (one engine per process, as a trainer holds it), interleaved round by round, medians reported.

  on   the engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and the prefix cache emptied before
       every call: a seeded call repeats exactly (lanpo.rollout.config, docs/reproducibility.md)
  off  vLLM's defaults: the engine core and its worker in processes of their own, the prefix cache shared by calls

Each process starts its engine, then generates one group shape after another: P prompts x G rollouts x T tokens
(`min_new_tokens = T`, so every row decodes the same count). The prompts carry a shared feedback-sized prefix
(`--prompt-tokens`, about 1,000 tokens by default), so the G copies of a prompt share their prefix in the cache, and
each call's prompts are new (no call reads another's cache). The default shapes are the recipes' group sizes: G = 8
(learn-cpu.toml) and G = 16 (the paper's recipes). Each process also repeats its first call: whether the repeat
gave the same tokens is printed per side (promised with the switch on; not with it off).

    python bench/reproducible.py                         # 4x8x128 and 4x16x128, 3 rounds: about 10 minutes
    python bench/reproducible.py --shape 2x4x16 --rounds 1 --prompt-tokens 64    # the smoke test's size

Needs vLLM (the vllm lane's venv).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import Rounds

ROWS = ("on", "off")


def child(reproducible: bool, shapes: list[tuple[int, int, int]], prompt_tokens: int) -> dict[str, object]:
    """In the measuring process: start one engine, time each shape's call; {start, shape: seconds, repeats}."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lanpo.models import apply_chat, prepare_smollm2
    from lanpo.rollout import SamplingParams
    from lanpo.rollout.config import VLLMConfig
    from lanpo.rollout.vllm import VLLMBackend

    folder = prepare_smollm2()
    longest = max(t for _, _, t in shapes) + prompt_tokens + 128
    started = time.perf_counter()
    engine = VLLMBackend(folder, None, VLLMConfig(max_model_len=longest, reproducible=reproducible))
    out: dict[str, object] = {"start": time.perf_counter() - started, "in_process": engine.in_process}
    words = " ".join(f"Attempt line {i}: {i} + {2 * i} = {3 * i}." for i in range(prompt_tokens))
    prefix = engine.tokenizer.decode(engine.tokenizer.encode(words, add_special_tokens=False)[:prompt_tokens])
    warm = apply_chat(engine.tokenizer, [{"role": "user", "content": f"{prefix}\nWarm-up: 1 + 1?"}])
    engine.generate([warm], 2, SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))  # first-forward costs
    for index, (p, g, t) in enumerate(shapes):
        prompts = [
            apply_chat(
                engine.tokenizer, [{"role": "user", "content": f"{prefix}\nCall {index}, problem {j}: 7 + {j}?"}]
            )
            for j in range(p)
        ]
        params = SamplingParams(max_new_tokens=t, temperature=1.0, seed=index, min_new_tokens=t)
        tick = time.perf_counter()
        first = engine.generate(prompts, g, params)
        out[f"{p}x{g}x{t}"] = time.perf_counter() - tick
        if index == 0:
            again = engine.generate(prompts, g, params)
            out["repeat_equal"] = [[c.token_ids for c in x] for x in again] == [
                [c.token_ids for c in x] for x in first
            ]
    engine.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", default=[], help="PROMPTSxGxTOKENS (default 4x8x128, 4x16x128)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, one fresh process per side each")
    parser.add_argument("--prompt-tokens", type=int, default=1000, help="the shared prefix of every prompt")
    parser.add_argument("--child", choices=ROWS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shape] or [(4, 8, 128), (4, 16, 128)]
    if args.child:
        print("RESULT " + json.dumps(child(args.child == "on", shapes, args.prompt_tokens)), flush=True)  # type: ignore[arg-type]
        return 0

    from lanpo.models import cpu_name

    print(f"CPU: {cpu_name()}; {os.cpu_count()} cores")
    rounds = Rounds(ROWS, args.rounds, warmup=0)
    repeats: dict[str, list[bool]] = {row: [] for row in ROWS}
    for round_, order in rounds:
        for row in order:
            cmd = [sys.executable, __file__, "--child", row, "--prompt-tokens", str(args.prompt_tokens)]
            cmd += [arg for s in args.shape for arg in ("--shape", s)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if done.returncode != 0 or line is None:
                print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
                return 1
            result = json.loads(line.removeprefix("RESULT "))
            repeats[row].append(bool(result.pop("repeat_equal")))
            result.pop("in_process")
            for key, seconds in result.items():
                rounds.add(round_, (row, key), seconds)
            print(f"  round {round_ + 1} {row}: {result}", flush=True)

    def median(row: str, key: str) -> float:
        return statistics.median(rounds.seconds[(row, key)])

    print(f"\nmedian of {rounds.measured} fresh processes per side; prompts share a {args.prompt_tokens}-token prefix")
    print("| | reproducible on | off | on / off |\n| --- | ---: | ---: | ---: |")
    print(f"| engine start, s | {median('on', 'start'):.1f} | {median('off', 'start'):.1f} | "
          f"{median('on', 'start') / median('off', 'start'):.2f}x |")  # fmt: skip
    for p, g, t in shapes:
        key, tokens = f"{p}x{g}x{t}", p * g * t
        on, off = median("on", key), median("off", key)
        print(f"| {key}, tokens/s | {tokens / on:.0f} | {tokens / off:.0f} | {off / on:.2f}x |")
    print(f"| first call repeated exactly | {sum(repeats['on'])} of {len(repeats['on'])} | "
          f"{sum(repeats['off'])} of {len(repeats['off'])} | |")  # fmt: skip
    worst = max(median("on", f"{p}x{g}x{t}") / median("off", f"{p}x{g}x{t}") for p, g, t in shapes)
    print(f"reproducible on/off: decode time {worst:.2f}x at the slowest shape")
    return 0


if __name__ == "__main__":  # vLLM's engine core (switch off) is a spawned process that re-imports this script
    sys.exit(main())
