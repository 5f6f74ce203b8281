"""LoRA through PEFT: attach a trainable adapter, load a saved one, merge one into the base (or fold one into a
copy of its weights, `merged_state`), and the start file that says which adapter an RL adapter was trained on
top of."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lanpo.errors import InputError
from lanpo.models.hashing import adapter_sha256


@dataclass
class LoraSpec:
    """PEFT LoRA settings (the trainer's config maps onto this)."""

    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


def attach_lora(model: Any, spec: LoraSpec) -> Any:
    """Wrap `model` in a trainable LoRA adapter; base weights are frozen."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def check_adapter_dir(adapter_dir: str | Path, what: str = "adapter folder") -> Path:
    """`adapter_dir` as a folder holding a saved PEFT adapter; InputError saying what is wrong otherwise."""
    path = Path(adapter_dir).expanduser()
    if not (path / "adapter_config.json").is_file():
        why = "does not exist" if not path.exists() else "holds no PEFT adapter (adapter_config.json missing)"
        raise InputError(f"{what} {path} {why}", hint="pass a folder written by the trainer (e.g. <run>/sft/adapter)")
    return path


def load_adapter(model: Any, adapter_dir: str | Path, trainable: bool = False) -> Any:
    """Attach a saved PEFT adapter to `model`."""
    from peft import PeftModel

    path = check_adapter_dir(adapter_dir)
    return PeftModel.from_pretrained(model, str(path), is_trainable=trainable)


# An RL adapter trained on top of a start (an SFT adapter merged into the base) says so in this file, next to its
# weights: loading it onto the plain base would give another policy.
START_FILE = "lanpo_start.json"


def merge_adapter(model: Any, adapter_dir: str | Path) -> tuple[Any, str]:
    """`model` with a saved LoRA adapter merged into its weights (no adapter left), and that adapter's sha256."""
    with_adapter = load_adapter(model, adapter_dir)
    sha = adapter_sha256(with_adapter)
    return with_adapter.merge_and_unload(), sha


def merged_state(model: Any) -> dict[str, Any]:
    """The weights a PEFT LoRA model computes with, folded: each adapted layer's base weight plus its adapter's
    delta (PEFT's own `get_delta_weight`: scaling · B·A, fan-in-fan-out handled), every other weight as it is,
    named as the base model names them (a tied weight stays tied). The model is not changed: PEFT's
    `merge_adapter` / `unmerge_adapter` would add and subtract the delta in place, moving the trained base
    weights by rounding at every sync. What a vLLM engine serves as "merged LoRA" (`rollout.vllm.lora_sync`)."""
    import torch
    from peft.tuners.lora import LoraLayer

    inner = model.get_base_model()
    active = model.active_adapter
    with torch.no_grad():
        deltas = {
            f"{name}.weight": module.get_delta_weight(active)
            for name, module in inner.named_modules()
            if isinstance(module, LoraLayer) and active in module.lora_A
        }
        state = {}
        for name, tensor in inner.state_dict().items():
            if ".lora_" in name:
                continue
            plain = name.replace(".base_layer.", ".")
            delta = deltas.get(plain)
            state[plain] = tensor if delta is None else tensor + delta.to(tensor.dtype)
    return state


def write_start(adapter_dir: str | Path, start: dict[str, Any]) -> None:
    """Record in an adapter folder the start it was trained on: {"adapter": folder or None, "adapter_sha256": ...}."""
    Path(adapter_dir, START_FILE).write_text(json.dumps(start, indent=1) + "\n")


def read_start(adapter_dir: str | Path) -> dict[str, Any] | None:
    path = Path(adapter_dir, START_FILE)
    return json.loads(path.read_text()) if path.is_file() else None


def load_adapter_stack(model: Any, adapter_dir: str | Path, trainable: bool = False) -> tuple[Any, str | None]:
    """Attach a saved adapter to `model`, first merging the start adapter it was trained on (if its folder says so).

    Returns (the PEFT model, the start adapter's sha256 or None). InputError when the start adapter is gone or is
    not the one the RL adapter was trained on.
    """
    start = read_start(adapter_dir)
    start_sha = None
    if start and start.get("adapter"):
        folder = check_adapter_dir(start["adapter"], f"the start adapter {adapter_dir} was trained on")
        model, start_sha = merge_adapter(model, folder)
        if start.get("adapter_sha256") not in (None, start_sha):
            raise InputError(
                f"the start adapter {folder} changed since {adapter_dir} was trained on it",
                hint="restore the start adapter the run used (see lanpo_start.json in the adapter folder)",
            )
    return load_adapter(model, adapter_dir, trainable=trainable), start_sha
