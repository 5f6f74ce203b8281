"""Rollout backends behind one interface: prompts (already chat-formatted) in, n completions each out.

`HFBackend` (transformers `generate`, CPU or GPU) lives in `lanpo.rollout.hf`; the vLLM backend (GPU, optional
extra) in `lanpo.rollout.vllm` and is imported only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: `temperature == 0` means greedy (then n identical completions are returned)."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]  # generated tokens, up to and including EOS when it stopped there
    prompt_token_ids: tuple[int, ...]
    finish_reason: str  # "stop" (EOS) or "length" (max_new_tokens)


class GenerationBackend(Protocol):
    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        """For each prompt, `n` completions (outer list follows `prompts`)."""
        ...


def make_backend(name: str, model: object, tokenizer: object, **kwargs: object) -> GenerationBackend:
    """`hf` or `vllm` by name."""
    if name == "hf":
        from lanpo.rollout.hf import HFBackend

        return HFBackend(model, tokenizer, **kwargs)  # type: ignore[arg-type]
    if name == "vllm":
        from lanpo.rollout.vllm import VLLMBackend  # type: ignore[import-not-found]

        return VLLMBackend(model, tokenizer, **kwargs)  # type: ignore[arg-type]
    from lanpo.errors import ConfigError

    raise ConfigError(f"unknown rollout backend {name!r}", hint="use hf or vllm")
