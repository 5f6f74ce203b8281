"""Model references: what a `model` string may name, checked cheaply, and resolved to what transformers loads."""

from __future__ import annotations

from pathlib import Path

from lanpo.errors import InputError
from lanpo.models import gguf
from lanpo.models.gguf import SMOLLM2

TINY_RANDOM = "tiny-random"  # a tiny randomly initialised model: exercises every code path in milliseconds
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


def resolve_model(name_or_path: str | Path) -> str:
    """`smollm2` -> the cached offline folder; an existing path -> itself (a full fine-tuning checkpoint
    `step-NNNNNN` -> its `model/`); anything else is a hub id."""
    check_model_ref(name_or_path)
    text = str(name_or_path).strip()
    if text.lower() in (SMOLLM2, "smollm2-135m-instruct"):
        return str(gguf.prepare_smollm2())  # looked up at call time: tests replace it
    path = Path(text).expanduser()
    return str(model_folder(path)) if path.exists() else text
