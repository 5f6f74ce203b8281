"""transformers models as a rollout backend: batched with left padding, CPU or GPU.

A PEFT model's adapter is hashed once per `generate` call (`lanpo.models.adapter_sha256`) and the hash rides on
every completion, as the vLLM backend's does; the trainer's forward pass is the reference for log-probs, so
`Completion.logprobs` stays None here (no behaviour log-probs, so no TIS: the config refuses `grpo.tis_cap` with
this backend). The rows are sampled from softmax(logits / T) (transformers' `TemperatureLogitsWarper` divides the
scores by T; then top-p), and the trainer's log-probs at `rollout.temperature` are of that softmax
(`lanpo.train.forward.logprobs`): the same model, the same distribution, all of it when `rollout.top_p = 1`.

Decoding is lanpo's own loop over the model's forward (`_decode`), for two savings `model.generate` does not make:

- n samples of a prompt share its prefill: the distinct prompts run once through the model, their key/value cache
  is repeated n times, and decoding starts from it (what `num_return_sequences = n` computes with every prompt
  token n times over). vLLM's prefix caching does this inside the engine.
- a row that has finished (EOS, or its length limit) leaves the batch: its cache rows are dropped and the next
  forward runs only the rows still decoding. `generate` keeps decoding every row until the last one ends, padding
  the finished ones; with chain-sum answers of ~30 tokens under a 64-token limit that was half its forwards
  (bench/decode.py, 8 prompts x 8 samples on one core: 30.7 s in `generate` from the shared prefill, 18.8 s
  here). vLLM's continuous batching does the same; transformers' `generate_batch` (continuous batching on paged
  attention) took 73-80 s for the same rows on this CPU.

Sampling is transformers' own: its temperature and top-p warpers, then `torch.multinomial` over the rows in
order, one draw per row and step. Until a row finishes, the loop therefore draws the random numbers `generate`
draws: with `min_new_tokens = max_new_tokens` (no row finishes early) it gives `generate`'s tokens exactly, at the
same seed (tests/rollout/test_hf_decode.py, tests/train/test_shared_prompts.py). Once rows leave, the draws differ
(fewer rows per step), the distribution does not. `reference = True` runs transformers' `generate` with
`num_return_sequences`: the reference the loop is tested and timed against (bench/decode.py,
bench/shared_prompts.py).
"""

from __future__ import annotations

from typing import Any

import torch

from lanpo.models import cache_kwarg, returned_cache
from lanpo.rollout import Completion, SamplingParams, cut_at_stop


class HFBackend:
    """Generate with a (possibly PEFT-wrapped) HF causal LM; `max_batch` caps sequences per call of the decode loop.
    `reference = True` decodes with transformers' `generate` instead (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 64, reference: bool = False) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.reference = reference

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
        copies = 1 if greedy else n
        was_training = self.model.training
        self.model.eval()
        try:
            if self.reference:
                generated = self._reference(batch, copies, params, greedy)
            else:
                generated = self._decode(batch, copies, params, greedy)  # (B * copies) lists of token ids
        finally:
            self.model.train(was_training)
        results = []
        for i in range(len(prompts)):
            mask = batch["attention_mask"][i].bool()
            prompt_ids = tuple(batch["input_ids"][i][mask].tolist())
            group = [
                self._completion(generated[i * copies + j], prompt_ids, served, params.stop) for j in range(copies)
            ]
            results.append(group * n if greedy else group)
        return results

    def _decode(self, batch: Any, copies: int, params: SamplingParams, greedy: bool) -> list[list[int]]:
        """Every row's generated tokens (up to and including EOS), rows of a prompt together: prompt i's copy j is
        row i * copies + j. Rows leave the batch as they finish (see the module docstring).

        Every rank decodes its own prompts for as many steps as they need: a sharded (FSDP) policy holds its full
        weights while the ranks generate (`Policy.generating`), so no forward waits on another rank."""
        ids, mask = batch["input_ids"], batch["attention_mask"]  # (U, P)
        rows = ids.shape[0] * copies
        generated: list[list[int]] = [[] for _ in range(rows)]
        if params.max_new_tokens < 1:
            return generated
        # The last prompt token starts the loop in every row, as `generate` feeds it (so the first step's logits are
        # computed as `generate` computes them).
        cache, positions = prompt_cache(self.model, ids, mask, copies)
        live = torch.arange(rows, device=ids.device)  # which rows the batch holds now
        tokens = ids[:, -1:].repeat_interleave(copies, 0)  # (R, 1): the input of the next forward
        mask = mask.repeat_interleave(copies, 0)
        position = positions[:, -1:].repeat_interleave(copies, 0)
        warp = _warpers(params, greedy)
        eos = self.tokenizer.eos_token_id
        stopped = _stop_check(self.tokenizer, params.stop)
        kw = cache_kwarg(self.model)
        for step in range(params.max_new_tokens):
            out = self.model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=position,
                use_cache=True,
                logits_to_keep=1,
                **{kw: cache},
            )
            cache = returned_cache(out)
            scores = out.logits[:, -1, :].to(torch.float32)  # (R, V), as `generate` reads them
            if step < params.min_new_tokens and eos is not None:
                scores[:, eos] = -float("inf")
            if greedy:
                chosen = scores.argmax(-1)
            else:
                chosen = torch.multinomial(torch.softmax(warp(tokens, scores), -1), num_samples=1).squeeze(1)
            for row, token in zip(live.tolist(), chosen.tolist(), strict=True):
                generated[row].append(token)
            going = chosen != eos if eos is not None else torch.ones_like(chosen, dtype=torch.bool)
            if stopped is not None:  # a row whose text now holds a stop string has finished too
                ended = [stopped(generated[row]) for row in live.tolist()]
                going &= ~torch.tensor(ended, dtype=torch.bool, device=going.device)
            if step + 1 == params.max_new_tokens or not bool(going.any()):
                break
            if not bool(going.all()):  # finished rows leave: their cache rows, mask and positions go with them
                keep = going.nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                live, chosen, mask, position = live[keep], chosen[keep], mask[keep], position[keep]
            tokens = chosen[:, None]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            position = position + 1
        return generated

    def _reference(self, batch: Any, copies: int, params: SamplingParams, greedy: bool) -> list[list[int]]:
        """transformers' `generate` with `num_return_sequences`: every row decoded to the longest, then trimmed."""
        out = self.model.generate(**batch, num_return_sequences=copies, **self.generate_kwargs(params, greedy))
        rows = self.trimmed(out, batch["input_ids"].shape[1])  # out: (B * copies, P + T)
        stopped = _stop_check(self.tokenizer, params.stop)
        if stopped is None:
            return rows
        # `generate(stop_strings=...)` also matches a stop string that starts in the prompt; vLLM and the decode
        # loop match the generated text only: cut each row at the first token that completes one there
        return [next((row[:t] for t in range(1, len(row) + 1) if stopped(row[:t])), row) for row in rows]

    def generate_kwargs(self, params: SamplingParams, greedy: bool) -> dict[str, Any]:
        """transformers `generate`'s keywords for `params` (`top_k = 0`: top-p and temperature only)."""
        tok = self.tokenizer
        sampling: dict[str, Any] = (
            {"do_sample": False}
            if greedy
            else {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
        )
        return {
            "max_new_tokens": params.max_new_tokens,
            "min_new_tokens": params.min_new_tokens,
            "pad_token_id": tok.pad_token_id,
            "eos_token_id": tok.eos_token_id,
            "synced_gpus": False,
            **sampling,
        }

    def trimmed(self, out: torch.Tensor, prompt_width: int) -> list[list[int]]:
        """`generate`'s rows (prompt + completion, right padded) -> each completion's tokens, through EOS."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        return [_trim(row[prompt_width:].tolist(), eos, pad) for row in out]

    def _completion(
        self, generated: list[int], prompt_ids: tuple[int, ...], served: str | None, stop: tuple[str, ...] = ()
    ) -> Completion:
        ids = list(generated)
        reason = "stop" if ids and ids[-1] == self.tokenizer.eos_token_id else "length"
        text, hit = cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), stop)
        return Completion(text, tuple(ids), prompt_ids, "stop" if hit else reason, served_adapter_sha256=served)


def prompt_cache(model: Any, ids: torch.Tensor, mask: torch.Tensor, copies: int) -> tuple[Any, torch.Tensor]:
    """(the key/value cache of every left-padded prompt but its last token, computed once per prompt and repeated
    `copies` times, each prompt's copies together; None for one-token prompts), and the prompts' positions (U, P)
    numbered as `generate` numbers left-padded rows."""
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    if ids.shape[1] < 2:
        return None, positions
    out = model(
        input_ids=ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=positions[:, :-1],
        use_cache=True,
        logits_to_keep=1,
    )
    cache = returned_cache(out)
    if copies > 1:
        cache.batch_repeat_interleave(copies)  # (U, ...) -> (U * copies, ...)
    return cache, positions


def _warpers(params: SamplingParams, greedy: bool) -> Any:
    """transformers' temperature and top-p warpers, in `generate`'s order (`top_k = 0`: none)."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    warpers = LogitsProcessorList()
    if greedy:
        return warpers
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    return warpers


def _stop_check(tokenizer: Any, stop: tuple[str, ...]) -> Any:
    """None without stop strings; else a test of a row's generated tokens: does the text of its last tokens hold
    a stop string? A stop string is met on the step its last character is written, so the tail that can hold it
    is as many tokens as it has characters (a token writes at least one), plus a few for tokens that decode to
    nothing on their own (parts of one character's bytes)."""
    stops = tuple(s for s in stop if s)
    if not stops:
        return None
    window = max(map(len, stops)) + 4

    def stopped(row: list[int]) -> bool:
        tail = tokenizer.decode(row[-window:], skip_special_tokens=True)
        return any(s in tail for s in stops)

    return stopped


def _trim(generated: list[int], eos: int, pad: int | None) -> list[int]:
    """A row of `generate`'s output: up to and including EOS; without EOS, right padding is not a token."""
    if eos in generated:
        return generated[: generated.index(eos) + 1]
    ids = list(generated)
    while ids and ids[-1] == pad and pad != eos:
        ids.pop()
    return ids
