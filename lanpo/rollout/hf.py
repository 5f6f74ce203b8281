"""transformers `generate` as a rollout backend: batched with left padding, CPU or GPU.

A PEFT model's adapter is hashed once per `generate` call (`lanpo.models.adapter_sha256`) and the hash rides on
every completion, as the vLLM backend's does; the trainer's forward pass is the reference for log-probs, so
`Completion.logprobs` stays None here.

n samples of a prompt share its prefill: the distinct prompts run once through the model, their key/value cache
is repeated n times, and `generate` decodes from it (what `num_return_sequences = n` would compute with every
prompt token n times over; the same rows in the same order, so a seed draws the same random numbers). vLLM's
prefix caching does this inside the engine.
"""

from __future__ import annotations

from typing import Any

import torch

from lanpo.models import cache_kwarg, returned_cache
from lanpo.rollout import Completion, SamplingParams


class HFBackend:
    """Generate with a (possibly PEFT-wrapped) HF causal LM; `max_batch` caps sequences per `generate` call.
    `share_prefill = False` has transformers repeat each prompt n times (`num_return_sequences`): the reference
    the shared prefill is tested and timed against."""

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 64, share_prefill: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.share_prefill = share_prefill

    @torch.inference_mode()
    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        if params.seed is not None:
            torch.manual_seed(params.seed)
        greedy = params.temperature <= 0
        served = self.served_adapter_sha256()
        per_call = max(1, self.max_batch // (1 if greedy else n))
        results: list[list[Completion]] = []
        for start in range(0, len(prompts), per_call):
            results.extend(self._generate_chunk(prompts[start : start + per_call], n, params, greedy, served))
        return results

    def served_adapter_sha256(self) -> str | None:
        """The hash of the adapter `generate` samples from now (None: a plain model, or its adapter disabled)."""
        if not hasattr(self.model, "peft_config"):
            return None
        from peft.tuners.lora import LoraLayer

        layers = [m for m in self.model.modules() if isinstance(m, LoraLayer)]
        if not layers or all(m.disable_adapters for m in layers):
            return None
        from lanpo.models import adapter_sha256

        return adapter_sha256(self.model)

    def _generate_chunk(
        self, prompts: list[str], n: int, params: SamplingParams, greedy: bool, served: str | None
    ) -> list[list[Completion]]:
        tok = self.tokenizer
        device = next(self.model.parameters()).device
        batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        sampling: dict[str, Any] = (
            {"do_sample": False}
            if greedy
            else {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
        )
        copies = 1 if greedy else n
        was_training = self.model.training
        self.model.eval()
        try:
            if copies > 1 and self.share_prefill:
                inputs = self._shared_prefill(batch, copies)
            else:
                inputs = {**batch, "num_return_sequences": copies}
            out = self.model.generate(
                **inputs,
                max_new_tokens=params.max_new_tokens,
                min_new_tokens=params.min_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                # Every rank generates on its own prompts, and may call this a different number of times. A sharded
                # (FSDP) policy holds its full weights while the ranks generate (`Policy.generating`), so no forward
                # waits on another rank; transformers would otherwise keep FSDP ranks' decoding loops in step.
                synced_gpus=False,
                **sampling,
            )  # (B * n', P + T)
        finally:
            self.model.train(was_training)
        prompt_len = batch["input_ids"].shape[1]
        results = []
        for i in range(len(prompts)):
            mask = batch["attention_mask"][i].bool()
            prompt_ids = tuple(batch["input_ids"][i][mask].tolist())
            group = []
            for j in range(copies):
                group.append(self._completion(out[i * copies + j, prompt_len:].tolist(), prompt_ids, served))
            results.append(group * n if greedy else group)
        return results

    def _shared_prefill(self, batch: Any, copies: int) -> dict[str, Any]:
        """`generate`'s inputs for `copies` samples of each prompt: rows repeated, and a cache holding every prompt
        token but the last, computed once per distinct prompt (positions as `generate` numbers left-padded rows)."""
        ids, mask = batch["input_ids"], batch["attention_mask"]  # (U, P)
        rows = {"input_ids": ids.repeat_interleave(copies, dim=0), "attention_mask": mask.repeat_interleave(copies, 0)}
        if ids.shape[1] < 2:
            return {**rows, "num_return_sequences": 1}
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
        out = self.model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=positions[:, :-1],
            use_cache=True,
            logits_to_keep=1,
        )
        cache = returned_cache(out)
        cache.batch_repeat_interleave(copies)  # (U, ...) -> (U * copies, ...), each prompt's copies together
        return {**rows, cache_kwarg(self.model): cache, "num_return_sequences": 1}

    def _completion(self, generated: list[int], prompt_ids: tuple[int, ...], served: str | None) -> Completion:
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        if eos in generated:
            ids, reason = generated[: generated.index(eos) + 1], "stop"
        else:
            # Right padding only appears after EOS; without EOS the sequence ran to max_new_tokens.
            ids, reason = generated, "length"
            while ids and ids[-1] == pad and pad != eos:
                ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(text, tuple(ids), prompt_ids, reason, served_adapter_sha256=served)
