"""Devices, dtypes and CPU threads: checked before anything slow, defaulted to what the machine does well."""

from __future__ import annotations

import os

import torch

from lanpo.errors import InputError


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


def set_threads(threads: int) -> None:
    """torch CPU threads: `threads`, or every core when 0 (torch's default may undercount in containers)."""
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))


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
