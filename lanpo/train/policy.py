"""The policy GRPO trains, behind one small interface: a LoRA adapter on the start, or every weight of it.

RL starts from the SFT model, as the paper does: the SFT adapter (`model.init_adapter`, or the run's own warm
start) is merged into the base weights (`lanpo.train.start.load_start`) and RL trains from there. The reference
policy is that start, so the KL at step 1 is exactly 0 for both kinds:

- `LoraPolicy` (`lora.enabled`, the default): a fresh adapter on the start (B = 0); the reference is the same
  model with the adapter disabled, no second copy. Under torchrun DDP all-reduces the adapter's gradients.
- `FullPolicy` (`lora.enabled = false`, as the paper trains): every weight trains; the reference is a frozen copy
  of the start's weights. Both are fp32 whatever `model.dtype` loaded (bf16 weights would not move at lr 1e-6).
  Alone, the copy lives on the CPU and visits the policy's device for its forward pass only; under torchrun the
  policy and the copy are both sharded with FSDP2 (`lanpo.train.plumbing.fsdp`), the copy's shards on the CPU when
  the policy is on a GPU. A checkpoint holds the full weights (`save_pretrained`, with the tokenizer): a complete
  model folder that `lanpo infer --model` loads.

bf16 compute (`grpo.autocast` bf16, or auto where bf16 pays) over the fp32 master weights, by kind:
- full fine-tuning under torchrun: FSDP2 mixed precision, as verl (`fsdp.shard(..., compute=bf16)`: units
  gathered in bf16, gradients reduced in fp32 into fp32 shards), the policy and its reference alike, so the KL at
  step 1 stays exactly 0. No rank ever holds a bf16 copy of the whole model.
- full fine-tuning alone: `torch.autocast` around the forwards, which caches the bf16 cast of every trained weight
  a matmul reads until its backward (2 bytes a weight: `lanpo plan` counts it).
- LoRA (alone or under DDP): `torch.autocast`. The base is frozen and stays as loaded (bf16 on a GPU already); its
  casts, if any, are not cached (autocast caches casts of trainable leaves only). The adapter is the fp32 master
  (PEFT keeps it fp32 on a bf16 base): autocast casts it to bf16 for its matmuls, its gradients come back fp32 and
  DDP all-reduces them in fp32. That is already verl's mixed precision for an adapter; FSDP has nothing to shard
  there that DDP does not (the base trains no state), so LoRA keeps DDP.

The update, the loop and the checkpoint see only `Policy`; nothing else branches on the kind.

`model.name = "tiny-random"` builds the tiny randomly initialised model of `lanpo.models` (unit tests, benches of
the machinery); anything else goes through `lanpo.models.load_causal_lm`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import torch

from lanpo.errors import InputError
from lanpo.models import (
    LoraSpec,
    adapter_sha256,
    attach_lora,
    check_adapter_dir,
    load_causal_lm,
    merge_adapter,
    model_dir_sha256,
    read_model_state,
    set_threads,
    state_sha256,
    tiny_causal_lm,
    write_start,
)
from lanpo.train.config import LoraConfig, ModelConfig
from lanpo.train.forward.batch import RolloutBatch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import chunked_logprobs
from lanpo.train.plumbing import fsdp
from lanpo.train.plumbing.dist import Dist

log = logging.getLogger(__name__)

TINY = "tiny-random"


class Policy(Protocol):
    kind: str  # "lora" | "full": what its checkpoints hold (an adapter folder, or a whole model folder)
    model: Any  # the causal LM: it generates, and its forward gives the policy's log-probs
    trained: Any  # the module the update's gradients flow through (DDP over `model` under torchrun, else `model`)
    collective_forwards: bool  # every forward and backward of `model` is a collective (FSDP): ranks run as many
    engine_generates: bool  # an engine with weights of its own generates (vLLM), never `model`: set by the trainer

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer steps."""
        ...

    def reference_logprobs(self, batch: RolloutBatch, logprob_settings: LogprobSettings) -> torch.Tensor:
        """log p of `batch`'s completion tokens under the reference policy (the start), (B, T), no gradient, with the
        policy's own `logprob_settings` (`LogprobSettings.from_grpo`): its micro-batches and chunks, its autocast,
        and its log-probs those of softmax(logits / temperature) at the policy's own temperature (verl too;
        `lanpo.train.forward.logprobs.chunked_logprobs`)."""
        ...

    def generating(self) -> AbstractContextManager[None]:
        """Around a phase in which every rank generates on its own prompts (every rank enters it together): what
        `model` needs to generate without collectives. Nothing when `engine_generates`."""
        ...

    def no_sync(self) -> AbstractContextManager[None]:
        """Around a backward whose gradient is accumulated before the ranks exchange it."""
        ...

    def replica_sha256(self) -> str:
        """This rank's copy of the weights, hashed to check the ranks agree after an update ('' when sharded)."""
        ...

    def save(self, folder: Path, start: dict[str, Any] | None) -> str | None:
        """Every rank calls it; rank 0 writes the weights to `folder` and returns their sha256 (others: None)."""
        ...

    def load(self, folder: Path) -> None:
        """Load weights that `save` wrote (every rank reads them)."""
        ...

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's whole state on rank 0 (every rank calls it)."""
        ...

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None: ...


class LoraPolicy:
    """A trainable LoRA adapter on the start; the reference is the start itself, the adapter disabled."""

    kind = "lora"
    collective_forwards = False  # DDP communicates in backward only, and the NLL term runs the unwrapped model
    engine_generates = False  # either way generating() holds nothing: every rank holds the whole model

    def __init__(self, model: Any, dist: Dist | None = None) -> None:
        self.model = model
        self.dist = dist or Dist()
        self.trained = self.dist.wrap(model)  # DDP under torchrun (it broadcasts rank 0's weights once, here)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def reference_logprobs(self, batch: RolloutBatch, logprob_settings: LogprobSettings) -> torch.Tensor:
        with self.model.disable_adapter():  # the unwrapped model: no collective, the ranks' counts may differ
            return chunked_logprobs(self.model, batch, logprob_settings)

    def generating(self) -> AbstractContextManager[None]:
        return nullcontext()

    def no_sync(self) -> AbstractContextManager[None]:
        return self.trained.no_sync() if self.trained is not self.model else nullcontext()

    def replica_sha256(self) -> str:
        return adapter_sha256(self.model)

    def save(self, folder: Path, start: dict[str, Any] | None) -> str | None:
        """The adapter, and next to it `lanpo_start.json`: `lanpo infer --adapter` rebuilds the same start."""
        if not self.dist.is_main:
            return None
        self.model.save_pretrained(folder)
        if start is not None:
            write_start(folder, start)
        return adapter_sha256(self.model)

    def load(self, folder: Path) -> None:
        load_adapter_weights(self.model, folder)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)


class FullPolicy:
    """Every weight of the start trains; the reference is a frozen copy of the start's weights."""

    kind = "full"

    def __init__(
        self, model: Any, tokenizer: Any = None, dist: Dist | None = None, compute: torch.dtype | None = None
    ) -> None:
        """`compute`: the dtype the forwards compute in (`autocast_dtype(grpo.autocast)`; None: fp32). Sharded, FSDP2
        mixed precision brings it; alone, the update's `torch.autocast` does (this argument changes nothing)."""
        self.dist = dist or Dist()
        self.collective_forwards = self.dist.enabled  # sharded below: FSDP gathers each unit for its forward
        self.tokenizer = tokenizer  # saved with the weights, so that a checkpoint is a complete model folder
        first = next(model.parameters())
        self.device, loaded = first.device, first.dtype
        # fp32 master weights, as verl's actor ("we have to create model in fp32. Otherwise, the optimizer is in
        # bf16, which is incorrect"): AdamW's step at the paper's lr 1e-6 (LANPO appendix 9.2, Table 6: "Actor
        # Learning Rate 1e-6") is below half a bf16 ulp of nearly every weight, so bf16 weights (model.dtype auto
        # on a GPU) would not move at all. The forwards still run in bf16 (grpo.autocast: FSDP2 mixed precision,
        # or autocast alone); the upcast is exact, so the policy computes as the loaded start did.
        if loaded != torch.float32:
            log.info("full fine-tuning: the %s start upcast to float32 master weights", loaded)
            model.float()
        reference = copy.deepcopy(model).requires_grad_(False).eval()  # before any step: exactly the start
        self.model = self.trained = model.requires_grad_(True)
        self.engine_generates = False  # `lanpo.train.state.setup` sets it once the served policy is open
        self._offloaded = False
        self.mixed_precision = compute if self.dist.enabled else None  # FSDP2's param_dtype (None: fp32 units)
        if self.dist.enabled:
            fsdp.shard(model, compute=self.mixed_precision)
            fsdp.shard(reference, offload=self.device.type != "cpu", compute=self.mixed_precision)
        elif self.device.type != "cpu":
            reference.to("cpu")
            self._offloaded = True
        self.reference = reference

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def reference_logprobs(self, batch: RolloutBatch, logprob_settings: LogprobSettings) -> torch.Tensor:
        collective = self.dist if self.collective_forwards else None  # sharded: the ranks run as many forwards
        with self._reference_on_device():
            return chunked_logprobs(self.reference, batch, logprob_settings, collective)

    @contextmanager
    def _reference_on_device(self) -> Iterator[None]:
        """The CPU-resident reference visits the policy's device for its pass (sharded: FSDP moves its shards)."""
        if not self._offloaded:
            yield
            return
        self.reference.to(self.device)
        try:
            yield
        finally:
            self.reference.to("cpu")

    def generating(self) -> AbstractContextManager[None]:
        """Sharded, with the hf backend generating on `model` itself: the whole model gathered on every rank for
        the phase (`fsdp.full_weights`: its forwards then need no other rank). With an engine of its own (vLLM:
        rollouts, the summariser, MEL's diagnoses and replays, validation all go to it) nothing is gathered: the
        shards stay shards, and the engine gets the weights through the streamed sync alone."""
        if self.dist.enabled and not self.engine_generates:
            return fsdp.full_weights(self.model)
        return nullcontext()

    def no_sync(self) -> AbstractContextManager[None]:
        # FSDP reduce-scatters each micro-batch's gradient into the shards: no full-size gradient is ever held.
        return nullcontext()

    def replica_sha256(self) -> str:
        return "" if self.dist.enabled else state_sha256(self.model.state_dict())

    def save(self, folder: Path, start: dict[str, Any] | None) -> str | None:
        """The full weights as safetensors (`save_pretrained`) and the tokenizer: a model folder of its own."""
        state = fsdp.full_state(self.model)  # under FSDP a collective: rank 0 receives every full weight
        if not self.dist.is_main:
            return None
        from transformers.utils import logging as hf_logging

        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # no "Writing model shards" bar in the training log at every step
        try:
            self.model.save_pretrained(folder, state_dict=state)
        finally:
            if shown:
                hf_logging.enable_progress_bar()
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(folder)
        return model_dir_sha256(folder)  # what was written (a tied weight once), as inference and vLLM load it

    def load(self, folder: Path) -> None:
        state = read_model_state(folder)
        try:
            fsdp.load_full_state(self.model, state)
        except RuntimeError as exc:
            raise InputError(
                f"the weights in {folder} do not fit this model: {exc}",
                hint="resume with the model.name the run started from",
            ) from exc

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return fsdp.full_optimizer_state(self.model, optimizer)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        fsdp.load_full_optimizer_state(self.model, optimizer, state)


def build_policy(
    start: Any,
    tokenizer: Any,
    lora_cfg: LoraConfig,
    seed: int,
    dist: Dist | None = None,
    compute: torch.dtype | None = None,
) -> Policy:
    """The policy RL trains from `start`: a fresh adapter on it, or (`lora.enabled = false`) all of its weights.
    `compute`: the forwards' dtype (`FullPolicy`: FSDP2 mixed precision when sharded; LoRA: autocast alone)."""
    if lora_cfg.enabled:
        return LoraPolicy(with_fresh_adapter(start, lora_cfg, seed), dist)
    return FullPolicy(start, tokenizer, dist, compute)


# --------------------------------------------------------------------------- loading


def load_base(model_cfg: ModelConfig, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) without an adapter; gradient checkpointing on when `model.gradient_checkpointing`."""
    if model_cfg.name == TINY:
        model, tokenizer = tiny_causal_lm(seed=seed)
    else:
        device = None if model_cfg.device == "auto" else model_cfg.device
        model, tokenizer = load_causal_lm(model_cfg.name, dtype=model_cfg.dtype, device=device)
    if model_cfg.gradient_checkpointing:
        enable_checkpointing(model)
    return model, tokenizer


def enable_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them (training mode only, so
    generation keeps its KV cache). Non-reentrant: a frozen base under LoRA needs no input that requires grad, and
    transformers checkpoints the layer's `forward`, leaving FSDP2's hooks outside the recompute."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # newer transformers; the old name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def with_fresh_adapter(model: Any, lora_cfg: LoraConfig, seed: int) -> Any:
    """`model` with a new trainable LoRA adapter (seeded init: B = 0, so the policy starts equal to `model`)."""
    torch.manual_seed(seed)
    spec = LoraSpec(
        rank=lora_cfg.r, alpha=lora_cfg.alpha, dropout=lora_cfg.dropout, target_modules=lora_cfg.target_modules
    )
    # Keep the model's KV cache on: generation needs it (without it every new token re-reads the whole
    # sequence, ~50x slower on CPU); the update's forwards pass use_cache=False themselves.
    return attach_lora(model, spec)


def load_policy(model_cfg: ModelConfig, lora_cfg: LoraConfig, seed: int = 0) -> tuple[Any, Any]:
    """(PEFT model with a fresh trainable adapter, tokenizer) on the start: the base with `model.init_adapter`
    merged in, when one is named."""
    set_threads(model_cfg.threads)
    if model_cfg.init_adapter:  # a wrong folder fails now, not after the base model has loaded
        check_adapter_dir(model_cfg.init_adapter, "model.init_adapter")
    model, tokenizer = load_base(model_cfg, seed)
    if model_cfg.init_adapter:
        model, _ = merge_adapter(model, model_cfg.init_adapter)
    return with_fresh_adapter(model, lora_cfg, seed), tokenizer


def load_adapter_weights(model: Any, adapter_dir: Path) -> None:
    """Copy a saved adapter's weights into the live PEFT model (same LoRA shape)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = Path(adapter_dir) / "adapter_model.safetensors"
    if not weights.exists():
        raise InputError(f"no adapter weights in {adapter_dir}")
    device = next(model.parameters()).device
    result = set_peft_model_state_dict(model, load_file(str(weights), device=str(device)))
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise InputError(
            f"adapter in {adapter_dir} does not fit this model ({len(unexpected)} unexpected keys)",
            hint="use the same lora.r / lora.target_modules as when it was saved",
        )
