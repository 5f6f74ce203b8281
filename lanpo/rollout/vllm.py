"""vLLM as a rollout backend (GPU, optional extra `lanpo[vllm]`): the same `generate(prompts, n, params)` as HF.

vLLM is imported only when this backend is built; without it (or without CUDA) a `LanpoError` says how to
install it. Prompts go in as token ids from lanpo's own tokenizer (no special tokens added), so both backends
see exactly the same tokens.

LoRA: each policy version is served through its own `LoRARequest` (a fresh integer id per distinct adapter
hash, so vLLM never answers from a stale cached copy). `set_adapter(dir)` hashes the adapter files the same
way `lanpo.models.adapter_sha256` hashes a loaded PEFT model; before each `generate` the folder is checked
(by file size and mtime, re-hashed when they change): rewritten weights become a new request. After each
`generate`, every request output must name the LoRA request that was sent, and `served` records, per call,
the adapter hash that answered it.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lanpo.errors import InputError, LanpoError
from lanpo.rollout import Completion, SamplingParams

log = logging.getLogger(__name__)

INSTALL_HINT = "on a CUDA machine: pip install 'lanpo[vllm]'; elsewhere use the hf backend (--backend hf)"


def import_vllm() -> Any:
    """The `vllm` module, or a LanpoError with the install hint (vLLM is optional and GPU-only)."""
    try:
        import vllm
    except ImportError as exc:
        raise LanpoError(
            f"the vllm backend needs the vLLM package, which is not installed ({exc})", INSTALL_HINT
        ) from exc
    except Exception as exc:  # a vLLM built against another torch fails at import with assorted errors
        raise LanpoError(
            f"vLLM is installed but cannot be imported: {type(exc).__name__}: {exc}", INSTALL_HINT
        ) from exc
    return vllm


def _adapter_file(adapter_dir: Path) -> Path:
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        if (adapter_dir / name).is_file():
            return adapter_dir / name
    raise InputError(f"no adapter weights in {adapter_dir} (adapter_model.safetensors missing)")


def read_adapter_state(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The saved adapter tensors of a PEFT folder, by name (as `get_peft_model_state_dict` names them)."""
    path = Path(adapter_dir)
    if not (path / "adapter_config.json").is_file():
        raise InputError(f"no PEFT adapter in {path} (adapter_config.json missing)")
    weights = _adapter_file(path)
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(weights))
    return torch.load(weights, map_location="cpu", weights_only=True)


def adapter_dir_sha256(adapter_dir: str | Path) -> str:
    """The hash of a saved adapter; equal to `lanpo.models.adapter_sha256` of the model it loads into."""
    digest = hashlib.sha256()
    for name, tensor in sorted(read_adapter_state(adapter_dir).items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str((tuple(t.shape), str(t.dtype))).encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def _fingerprint(adapter_dir: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(adapter_dir.iterdir()) if p.is_file()
    )


@dataclass(frozen=True)
class ServedCall:
    """One `generate` call: how many requests, which LoRA request served them and its adapter hash."""

    requests: int
    lora_int_id: int | None
    adapter_sha256: str | None


class VLLMBackend:
    """Generate with `vllm.LLM`; `model` is a HF folder or hub id, `tokenizer` lanpo's tokenizer for it."""

    def __init__(
        self,
        model: str,
        tokenizer: Any,
        *,
        max_lora_rank: int = 64,
        gpu_memory_utilization: float = 0.85,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        llm: Any = None,
    ) -> None:
        vllm = import_vllm()
        if llm is None and not torch.cuda.is_available():
            raise LanpoError("the vllm backend needs a CUDA GPU and none is visible", INSTALL_HINT)
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.llm = llm or vllm.LLM(
            model=str(model),
            tokenizer=str(model),
            enable_lora=True,
            max_lora_rank=max_lora_rank,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
        )
        self._adapter_dir: Path | None = None
        self._fingerprint: tuple[tuple[str, int, int], ...] = ()
        self._requests: dict[str, Any] = {}  # adapter sha256 -> LoRARequest
        self.adapter_sha256: str | None = None
        self.served: list[ServedCall] = []

    # ------------------------------------------------------------------ adapters

    def set_adapter(self, adapter_dir: str | Path | None) -> str | None:
        """Serve `adapter_dir` from now on (None: the base model); returns the adapter's sha256."""
        if adapter_dir is None:
            self._adapter_dir, self.adapter_sha256, self._fingerprint = None, None, ()
            return None
        path = Path(adapter_dir).resolve()
        sha = adapter_dir_sha256(path)
        self._adapter_dir, self._fingerprint, self.adapter_sha256 = path, _fingerprint(path), sha
        if sha not in self._requests:
            from vllm.lora.request import LoRARequest

            lora_id = len(self._requests) + 1  # vLLM caches adapters by this id: one id per distinct weights
            self._requests[sha] = LoRARequest(f"lanpo-{sha[:12]}", lora_id, str(path))
        return sha

    def _current_request(self) -> Any:
        if self._adapter_dir is None:
            return None
        if _fingerprint(self._adapter_dir) != self._fingerprint:
            old = self.adapter_sha256
            new = self.set_adapter(self._adapter_dir)
            if new != old:
                log.warning(
                    "adapter %s was rewritten (%s -> %s): serving the new weights", self._adapter_dir, old, new
                )
        return self._requests[self.adapter_sha256]  # type: ignore[index]

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        vllm = self._vllm
        greedy = params.temperature <= 0
        sampling = vllm.SamplingParams(
            n=1 if greedy else n,  # greedy: one completion, copied n times (as the hf backend does)
            temperature=max(0.0, params.temperature),
            top_p=params.top_p if params.temperature > 0 else 1.0,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
        )
        token_prompts = [{"prompt_token_ids": self.tokenizer.encode(p, add_special_tokens=False)} for p in prompts]
        request = self._current_request()
        outputs = self.llm.generate(token_prompts, sampling_params=sampling, lora_request=request, use_tqdm=False)
        expected = None if request is None else request.lora_int_id
        for out in outputs:
            served = getattr(out, "lora_request", None)
            served_id = None if served is None else served.lora_int_id
            if served_id != expected:
                raise LanpoError(
                    f"vLLM answered a request with LoRA {served_id}, but LoRA {expected} "
                    f"(adapter {self.adapter_sha256}) was requested",
                    hint="this is a serving bug: do not trust these completions",
                )
        self.served.append(ServedCall(len(prompts), expected, self.adapter_sha256))
        return [
            [
                Completion(
                    text=c.text,
                    token_ids=tuple(c.token_ids),
                    prompt_token_ids=tuple(out.prompt_token_ids),
                    finish_reason="stop" if c.finish_reason == "stop" else "length",
                )
                for c in out.outputs
            ]
            * (n if greedy else 1)
            for out in outputs
        ]
