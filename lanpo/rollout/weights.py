"""Full weights on their way into an engine, checked on the driver's side: the names and shapes of the model the
engine serves (its checkpoint's safetensors headers), a state dict held to them, a saved folder snapshotted.

Imports no vLLM: the checks refuse weights of another model before anything is sent (`VLLMBackend.load_weights`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lanpo.errors import ConfigError, InputError
from lanpo.models import model_folder


def checkpoint_shapes(model_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a model folder's checkpoint, read from its safetensors headers (no tensor loaded)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def checked_state(weights: Mapping[str, Any], expected: dict[str, tuple[int, ...]], model: Any) -> dict[str, Any]:
    """`weights` under the names of `model`'s checkpoint (`expected`: name -> shape), a tied copy left out (a
    tensor sharing the storage of one the checkpoint names, e.g. `lm_head.weight`, which a tied checkpoint does
    not hold); ConfigError naming other names, missing names and other shapes."""
    state: dict[str, Any] = {}
    unknown, wrong = [], []
    ptrs = {t.data_ptr() for n, t in weights.items() if n in expected}
    for name, tensor in weights.items():
        if name not in expected:
            if tensor.data_ptr() not in ptrs:
                unknown.append(name)
        elif tuple(tensor.shape) != expected[name]:
            wrong.append(f"{name} {tuple(tensor.shape)} (the model's: {expected[name]})")
        else:
            state[name] = tensor
    missing = sorted(set(expected) - set(state) - {w.split(" ")[0] for w in wrong})
    problems = [
        *(["not in the model: " + ", ".join(unknown[:3])] if unknown else []),
        *(["missing: " + ", ".join(missing[:3])] if missing else []),
        *(["other shapes: " + ", ".join(wrong[:3])] if wrong else []),
    ]
    if problems:
        raise ConfigError(
            f"these weights are not those of {model}, which the engine serves: " + "; ".join(problems),
            hint="load the state dict of the model the engine was started with (full fine-tuning of that model)",
        )
    return state


def weights_snapshot(weights: str | Path, root: Path) -> Path:
    """A private folder under `root` of the safetensors files the engine reloads from: hard links to a saved
    folder's files (a copy across file systems). The trainer may delete its folder afterwards."""
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".weights-"))
    try:
        source = model_folder(Path(weights).expanduser())
        files = sorted(source.glob("*.safetensors")) + sorted(source.glob("*.safetensors.index.json"))
        if not files:
            raise InputError(
                f"no model weights in {source} (*.safetensors)",
                hint="pass a folder written by save_pretrained, e.g. a checkpoint step-NNNNNN",
            )
        for file in files:
            try:
                os.link(file, staging / file.name)
            except OSError:
                shutil.copyfile(file, staging / file.name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging
