"""Building the trainable policy: the start (base model, with a start adapter merged in), then a fresh LoRA adapter.

RL starts from the SFT model, as the paper does: the SFT adapter (`model.init_adapter`, or the run's own warm
start) is merged into the base weights, and RL trains a new adapter on top. The reference policy, the same model
with the RL adapter disabled, is therefore the SFT model, and the KL at step 1 is exactly 0.

`model.name = "tiny-random"` builds the tiny randomly initialised model of `lanpo.models` (unit tests, benches of
the machinery); anything else goes through `lanpo.models.load_causal_lm`.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from lanpo.models import LoraSpec, attach_lora, check_adapter_dir, load_causal_lm, merge_adapter, tiny_causal_lm
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


def with_fresh_adapter(model: Any, lora_cfg: LoraConfig, seed: int) -> Any:
    """`model` with a new trainable LoRA adapter (seeded init: B = 0, so the policy starts equal to `model`)."""
    torch.manual_seed(seed)
    spec = LoraSpec(
        rank=lora_cfg.r, alpha=lora_cfg.alpha, dropout=lora_cfg.dropout, target_modules=lora_cfg.target_modules
    )
    # Keep the model's KV cache on: generation needs it (without it every new token re-reads the whole
    # sequence, ~50x slower on CPU); the update's forwards pass use_cache=False themselves.
    return attach_lora(model, spec)


def load_policy(model_cfg: ModelConfig, lora_cfg: LoraConfig, seed: int = 0) -> tuple[Any, Any]:
    """(PEFT model with a fresh trainable adapter, tokenizer) on the start: the base with `model.init_adapter`
    merged in, when one is named."""
    set_threads(model_cfg.threads)
    if model_cfg.init_adapter:  # a wrong folder fails now, not after the base model has loaded
        check_adapter_dir(model_cfg.init_adapter, "model.init_adapter")
    model, tokenizer = load_base(model_cfg, seed)
    if model_cfg.init_adapter:
        model, _ = merge_adapter(model, model_cfg.init_adapter)
    return with_fresh_adapter(model, lora_cfg, seed), tokenizer
