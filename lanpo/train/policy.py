"""Building the trainable policy: base model (+ dtype/device), a LoRA adapter (fresh or from a folder), threads.

`model.name = "tiny-random"` builds the tiny randomly initialised model of `lanpo.models` (unit tests, benches of
the machinery); anything else goes through `lanpo.models.load_causal_lm`.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from lanpo.models import LoraSpec, attach_lora, check_adapter_dir, load_adapter, load_causal_lm, tiny_causal_lm
from lanpo.train.config import LoraConfig, ModelConfig

TINY = "tiny-random"


def set_threads(threads: int) -> None:
    """torch CPU threads: `threads`, or every core when 0 (torch's default may undercount in containers)."""
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))


def load_base(model_cfg: ModelConfig, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) without an adapter."""
    if model_cfg.name == TINY:
        return tiny_causal_lm(seed=seed)
    device = None if model_cfg.device == "auto" else model_cfg.device
    return load_causal_lm(model_cfg.name, dtype=model_cfg.dtype, device=device)


def load_policy(model_cfg: ModelConfig, lora_cfg: LoraConfig, seed: int = 0) -> tuple[Any, Any]:
    """(PEFT model with a trainable adapter, tokenizer); the LoRA init is seeded."""
    set_threads(model_cfg.threads)
    if model_cfg.init_adapter:  # a wrong folder fails now, not after the base model has loaded
        check_adapter_dir(model_cfg.init_adapter, "model.init_adapter")
    model, tokenizer = load_base(model_cfg, seed)
    torch.manual_seed(seed)
    if model_cfg.init_adapter:
        model = load_adapter(model, model_cfg.init_adapter, trainable=True)
    else:
        spec = LoraSpec(
            rank=lora_cfg.r, alpha=lora_cfg.alpha, dropout=lora_cfg.dropout, target_modules=lora_cfg.target_modules
        )
        model = attach_lora(model, spec)
    # Keep the model's KV cache on: generation needs it (without it every new token re-reads the whole
    # sequence, ~50x slower on CPU); the update's forwards pass use_cache=False themselves.
    return model, tokenizer
