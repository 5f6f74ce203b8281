"""A decoder's shape without its weights: what `lanpo plan` (`lanpo.train.plan`) counts bytes from.

The papers' models ship in `lanpo/plan_models.toml`, each value with the published config.json it was read from.
Any other `model.name` is read from a config.json: a local model folder (or a full fine-tuning checkpoint's
`model/`), the converted offline SmolLM2, or the HF hub cache (`~/.cache/huggingface/hub`, offline: nothing is
downloaded). `tiny-random` is the shape `lanpo.models.tiny_causal_lm` builds.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lanpo.errors import InputError, listing

SHIPPED = Path(__file__).resolve().parent.parent / "plan_models.toml"
FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a Llama-style decoder (Qwen2, Qwen3, Llama, SmolLM2) that its memory depends on."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    torch_dtype: str
    model_type: str
    source: str

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2"  # Qwen2 biases q, k and v (transformers' Qwen2Attention)

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"  # Qwen3 RMS-normalises each head's q and k

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: q, k, v, o, gate, up, down, two norms (+ biases, + q/k norms)."""
        H, I, q, kv = self.hidden_size, self.intermediate_size, self.q_dim, self.kv_dim  # noqa: E741
        params = H * q + 2 * H * kv + q * H + 3 * H * I + 2 * H
        params += (q + 2 * kv) if self.qkv_bias else 0
        params += 2 * self.head_dim if self.qk_norm else 0
        return params

    @property
    def outer_params(self) -> int:
        """The embedding, the output head (none when tied) and the final norm: FSDP's root unit."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    @property
    def params(self) -> int:
        return self.num_hidden_layers * self.layer_params + self.outer_params

    def lora_params(self, rank: int, target_modules: list[str]) -> int:
        """Trainable LoRA parameters: r x (d_in + d_out) for each targeted projection of each layer."""
        H, I, q, kv = self.hidden_size, self.intermediate_size, self.q_dim, self.kv_dim  # noqa: E741
        dims = {
            "q_proj": (H, q),
            "k_proj": (H, kv),
            "v_proj": (H, kv),
            "o_proj": (q, H),
            "gate_proj": (H, I),
            "up_proj": (H, I),
            "down_proj": (I, H),
        }
        per_layer = sum(rank * sum(dims[m]) for m in target_modules if m in dims)
        return self.num_hidden_layers * per_layer


def shape_from_config(config: dict[str, Any], name: str, source: str) -> ModelShape:
    """A ModelShape from a config.json's fields (a multimodal config's `text_config` when it has one)."""
    text = config.get("text_config") or config
    missing = [k for k in FIELDS if k not in text]
    if missing:
        raise InputError(
            f"{source} has no {', '.join(missing)}: not a decoder config lanpo plan can read",
            hint="pass a Llama-style causal LM (Qwen2/Qwen3/Llama) folder",
        )
    heads = int(text["num_attention_heads"])
    return ModelShape(
        name=name,
        hidden_size=int(text["hidden_size"]),
        intermediate_size=int(text["intermediate_size"]),
        num_hidden_layers=int(text["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
        vocab_size=int(text["vocab_size"]),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        torch_dtype=str(text.get("torch_dtype") or text.get("dtype") or "bfloat16"),
        model_type=str(text.get("model_type") or config.get("model_type") or ""),
        source=source,
    )


def shipped_shapes() -> dict[str, ModelShape]:
    """The shapes in lanpo/plan_models.toml, by hub id."""
    with open(SHIPPED, "rb") as f:
        table = tomllib.load(f)
    return {name: shape_from_config(values, name, values["source"]) for name, values in table.items()}


def _hub_cache_config(repo_id: str) -> Path | None:
    """config.json of `repo_id` in the HF hub cache (newest snapshot), or None."""
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snapshots = hub.expanduser() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    return found[-1] if found else None


def _tiny_shape() -> ModelShape:
    from lanpo.models.tiny import tiny_tokenizer

    config = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": len(tiny_tokenizer()),
        "tie_word_embeddings": True,
        "model_type": "llama",
        "torch_dtype": "float32",
    }
    return shape_from_config(config, "tiny-random", "lanpo.models.tiny_causal_lm's defaults")


def model_shape(name: str) -> ModelShape:
    """The shape of `model.name`: shipped, or read from a config.json on this machine (never downloaded)."""
    from lanpo.models.gguf import SMOLLM2, prepare_smollm2, smollm2_converted
    from lanpo.models.refs import TINY_RANDOM, model_folder

    text = name.strip()
    shipped = shipped_shapes()
    if text in shipped:
        return shipped[text]
    if text == TINY_RANDOM:
        return _tiny_shape()
    if text.lower() in (SMOLLM2, "smollm2-135m-instruct"):
        if not smollm2_converted():
            raise InputError("the offline SmolLM2 is not converted yet", hint="run `lanpo model prepare` once")
        config_path = prepare_smollm2() / "config.json"
    elif Path(text).expanduser().exists():
        config_path = model_folder(Path(text).expanduser()) / "config.json"
    else:
        config_path = _hub_cache_config(text)  # type: ignore[assignment]
    if config_path is None or not config_path.is_file():
        raise InputError(
            f"no shape for model {text!r}: not shipped with lanpo, no config.json found on this machine",
            hint=f"pass a model folder with a config.json, or one of: {listing(shipped, room=110)}",
        )
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{config_path} is not readable JSON: {exc}", hint="pass the model's config.json") from exc
    return shape_from_config(config, text, str(config_path))
