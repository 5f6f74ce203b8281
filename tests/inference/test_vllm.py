"""The vLLM backend: adapter hashing and the import guard run anywhere; generation needs vLLM and a CUDA GPU."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from lanpo.errors import ConfigError, InputError, LanpoError
from lanpo.inference.engine import Engine
from lanpo.models import LoraSpec, adapter_sha256, attach_lora, load_adapter, tiny_causal_lm
from lanpo.rollout import SamplingParams, make_backend
from lanpo.rollout.vllm import ServedCall, adapter_dir_sha256, import_vllm

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_gpu = pytest.mark.skipif(
    not (HAS_VLLM and torch.cuda.is_available()),
    reason="vLLM backend tests need the vllm package and a CUDA GPU (pip install 'lanpo[vllm]' on a GPU machine)",
)


def saved_adapter(path: Path, seed: int = 0, bump: float = 0.25) -> str:
    base, _ = tiny_causal_lm(seed=seed)
    model = attach_lora(base, LoraSpec(rank=2, alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(bump)
    model.save_pretrained(path)
    return adapter_sha256(model)


def test_adapter_folder_hash_equals_the_loaded_models(tmp_path: Path) -> None:
    in_memory = saved_adapter(tmp_path / "a")
    assert adapter_dir_sha256(tmp_path / "a") == in_memory
    reloaded = load_adapter(tiny_causal_lm(seed=0)[0], tmp_path / "a")
    assert adapter_sha256(reloaded) == in_memory
    assert adapter_dir_sha256(tmp_path / "a") != saved_adapter(tmp_path / "b", bump=0.5)


def test_adapter_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"adapter_config\.json missing"):
        adapter_dir_sha256(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(InputError, match="no adapter weights"):
        adapter_dir_sha256(tmp_path)


def test_missing_vllm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # what an absent package looks like to `import`
    with pytest.raises(LanpoError, match="needs the vLLM package") as info:
        import_vllm()
    assert "pip install 'lanpo[vllm]'" in (info.value.hint or "")
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(LanpoError, match="needs the vLLM package"):
        make_backend("vllm", "some/model", tokenizer)
    with pytest.raises(ConfigError, match="loads the model itself"):
        Engine(model, tokenizer=tokenizer, backend="vllm")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.slow
def test_vllm_serves_the_adapter_it_was_given(tmp_path: Path) -> None:
    from lanpo.models import apply_chat, load_causal_lm, prepare_smollm2

    folder = str(prepare_smollm2())
    base, tokenizer = load_causal_lm(folder, device="cpu", dtype="float32")
    lora = attach_lora(base, LoraSpec(rank=8, alpha=16))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    lora.save_pretrained(tmp_path / "v1")
    expected = adapter_sha256(lora)

    backend = make_backend("vllm", folder, tokenizer, gpu_memory_utilization=0.3, max_model_len=1024)
    prompts = [apply_chat(tokenizer, [{"role": "user", "content": f"What is {i}+{i}?"}]) for i in range(3)]
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    plain = backend.generate(prompts, 2, greedy)
    assert [len(g) for g in plain] == [2, 2, 2] and backend.served[-1].adapter_sha256 is None
    assert all(
        c.prompt_token_ids == tuple(tokenizer.encode(p, add_special_tokens=False))
        for p, g in zip(prompts, plain, strict=True)
        for c in g
    )
    assert backend.set_adapter(tmp_path / "v1") == expected
    adapted = backend.generate(prompts, 1, greedy)
    assert backend.served[-1].adapter_sha256 == expected and backend.served[-1].lora_int_id == 1
    assert [g[0].text for g in adapted] != [g[0].text for g in plain]  # the adapter changed what was said

    # rewriting the folder's weights is noticed: a new LoRA request (id) serves the new hash
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.mul_(-1)
    lora.save_pretrained(tmp_path / "v1")
    backend.generate(prompts[:1], 1, greedy)
    assert backend.served[-1].adapter_sha256 == adapter_sha256(lora) != expected
    assert backend.served[-1].lora_int_id == 2


# --------------------------------------------------------------------------- lanpo's bookkeeping around vLLM
# vLLM itself cannot run here; these tests swap in a minimal stand-in for the `vllm` module and its engine so
# that lanpo's own logic (request ids per adapter hash, rewritten folders, the served-adapter check) is tested.


class _Req:
    def __init__(self, name: str, lora_int_id: int, path: str) -> None:
        self.lora_name, self.lora_int_id, self.lora_path = name, lora_int_id, path


class _FakeLLM:
    def __init__(self, lie: bool = False) -> None:
        self.lie = lie
        self.calls: list[Any] = []

    def generate(self, prompts: list[dict], sampling_params: Any, lora_request: Any, use_tqdm: bool) -> list[Any]:
        self.calls.append((sampling_params, lora_request))
        served = _Req("other", 99, "/x") if self.lie and lora_request is not None else lora_request
        return [
            SimpleNamespace(
                prompt_token_ids=p["prompt_token_ids"],
                lora_request=served,
                outputs=[SimpleNamespace(text="ok", token_ids=[5, 6], finish_reason="stop")] * sampling_params.n,
            )
            for p in prompts
        ]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    module = ModuleType("vllm")
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)  # type: ignore[attr-defined]
    lora, request = ModuleType("vllm.lora"), ModuleType("vllm.lora.request")
    request.LoRARequest = _Req  # type: ignore[attr-defined]
    for name, mod in (("vllm", module), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_requests_follow_adapter_hashes(fake_vllm: None, tmp_path: Path) -> None:
    from lanpo.rollout.vllm import VLLMBackend

    _, tokenizer = tiny_causal_lm()
    llm = _FakeLLM()
    backend = VLLMBackend("m", tokenizer, llm=llm)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=1)
    backend.generate(["a"], 2, params)
    assert backend.served[-1] == ServedCall(1, None, None) and llm.calls[-1][1] is None
    sha = saved_adapter(tmp_path / "v")
    assert backend.set_adapter(tmp_path / "v") == sha
    groups = backend.generate(["a", "b"], 3, params)
    assert [len(g) for g in groups] == [3, 3] and backend.served[-1] == ServedCall(2, 1, sha)
    assert backend.set_adapter(tmp_path / "v") == sha and len(backend._requests) == 1  # same weights, same id
    time.sleep(0.01)
    new_sha = saved_adapter(tmp_path / "v", bump=0.75)  # rewritten in place
    backend.generate(["a"], 1, params)
    assert backend.served[-1] == ServedCall(1, 2, new_sha) and new_sha != sha
    greedy = backend.generate(["a"], 4, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert llm.calls[-1][0].n == 1 and len(greedy[0]) == 4


def test_a_request_served_by_another_adapter_is_refused(fake_vllm: None, tmp_path: Path) -> None:
    from lanpo.rollout.vllm import VLLMBackend

    _, tokenizer = tiny_causal_lm()
    backend = VLLMBackend("m", tokenizer, llm=_FakeLLM(lie=True))
    saved_adapter(tmp_path / "v")
    backend.set_adapter(tmp_path / "v")
    with pytest.raises(LanpoError, match="answered a request with LoRA 99"):
        backend.generate(["a"], 1, SamplingParams(max_new_tokens=4))
