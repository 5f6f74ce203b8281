"""Devices, dtypes and CPU threads: checked before anything slow, defaulted to what the machine does well."""

from __future__ import annotations

import functools
import os
import time

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


def native_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether `device` computes in bf16 natively. A CPU needs AVX512-BF16 or AMX (oneDNN's check): without them
    torch falls back to a reference GEMM, and a bf16 matmul is far slower than fp32 (measured on an AVX2-only AMD
    EPYC: a 3200 x 576 by 576 x 1536 product 5.0 s in bf16 against 0.063 s in fp32, 80x)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def bf16_pays(device: torch.device | str = "cpu") -> bool:
    """Whether bf16 matmuls are measurably faster than fp32 on `device`: the trainer's shape (a 1,024 x 576 by
    576 x 1,536 product, SmolLM2's MLP), the better of 3 timings each after a warm-up, bf16 at least 1.25x faster.
    On a GPU, its bf16 support. oneDNN's native-bf16 flag is not enough on a CPU: it read True on an Intel Xeon
    (AVX512-BF16, no AMX) where this product took 0.096 s in bf16 against 0.067 s in fp32; on an AMD EPYC with
    AVX512-BF16 it took 0.014 s against 0.062 s. Measured once per process (~0.1 s)."""
    device = torch.device(device)
    if device.type == "cuda":
        return native_bf16(device)
    if device.type != "cpu" or not native_bf16(device):
        return False
    a, b = torch.randn(1024, 576), torch.randn(576, 1536)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y
        times = []
        for _ in range(3):
            start = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - start)
        best[dtype] = min(times)
    return best[torch.float32] >= 1.25 * best[torch.bfloat16]


def cpu_name() -> str:
    """This CPU's model name and torch's vector capability, e.g. "AMD EPYC (AVX2, no native bf16)"."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    bf16 = "native bf16" if native_bf16("cpu") else "no native bf16"
    return f"{model} ({torch.backends.cpu.get_cpu_capability()}, {bf16})"


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
