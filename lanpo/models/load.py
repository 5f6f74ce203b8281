"""Loading (model, tokenizer) from any reference, and the forward keywords that differ across transformers versions.

The reference policy is the same model with the adapter disabled: no second copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lanpo.errors import InputError
from lanpo.models.device import check_device, default_device, parse_dtype
from lanpo.models.refs import MODEL_HINT, TINY_RANDOM, resolve_model
from lanpo.models.tiny import tiny_causal_lm
from lanpo.models.tokenizer import prepare_tokenizer


def load_causal_lm(
    name_or_path: str | Path, dtype: str | torch.dtype | None = None, device: str | torch.device | None = None
) -> tuple[Any, Any]:
    """Load (model, tokenizer) from `smollm2`, `tiny-random`, a local HF folder, or a hub id (cached offline)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if str(name_or_path) == TINY_RANDOM:
        return tiny_causal_lm()
    check_device(device)
    if not isinstance(dtype, torch.dtype):
        parse_dtype(dtype, torch.device("cpu"))  # an unknown name fails before the (slow) resolve and load
    resolved = resolve_model(name_or_path)
    dev = torch.device(device) if device is not None else default_device()
    torch_dtype = dtype if isinstance(dtype, torch.dtype) else parse_dtype(dtype, dev)
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved)
        model = AutoModelForCausalLM.from_pretrained(resolved, dtype=torch_dtype)
    except OSError as exc:
        raise InputError(f"cannot load model {name_or_path!r}: {exc}", hint=MODEL_HINT) from exc
    model.to(dev)
    model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    return model, prepare_tokenizer(tokenizer)


def cache_kwarg(model: Any) -> str:
    """The forward keyword a key/value cache is passed in: `cache` (transformers 5) or `past_key_values` (4.x).
    Looked up on the model under any DDP / PEFT wrapper, which pass keywords through."""
    import inspect

    inner = getattr(model, "module", model)  # DistributedDataParallel
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner  # PEFT wraps forward(**kw)
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The key/value cache a `use_cache=True` forward returned, under either name (see `cache_kwarg`)."""
    cache = out.get("cache")
    return cache if cache is not None else out.get("past_key_values")
