"""The relevance judge on the vLLM engine: the same prompt and score as `HFJudge`, from log-probs.

`r(p, c) = softmax(l_yes, l_no)` needs the logits of the yes/no tokens only, and log-probs differ from logits by
one constant per row (log Z), which cancels in `l_yes - l_no`. So one prefill per pair asks the vLLM engine for the
next-token log-probs of exactly those token ids (`SamplingParams(logprob_token_ids=...)`, computed before any
sampling processor) and feeds them to the same `yes_no_probability`. Pairs of one problem share their prefix in
vLLM's prefix cache, as they share a KV cache in the HF judge.

The judge is the policy the vLLM engine serves when the `VLLMJudge` is built (base model or adapter): its hash is
pinned, and scoring under another adapter is refused, since the identity would then name the wrong weights.

`AsyncVLLMJudge` is the same judge on the serving engine (`lanpo.serve.vllm_engine.AsyncVLLMEngine`): the same
prompts, token ids and maths (`EngineJudge`), its `score` awaited; all pairs go to the engine at once and its
continuous batching schedules them beside the requests being served.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lanpo.errors import InputError, LanpoError
from lanpo.retrieval.judge import MAX_CHARS, PROMPT_VERSION, JudgePrompt, yes_no_probability


class EngineJudge(JudgePrompt):
    """What the judges on a vLLM engine share: the prompts as token ids, the yes/no ids asked for, the pinned adapter
    and the scores from the engine's next-token log-probs. `engine` has `tokenizer`, `adapter_sha256` and
    `next_token_logprobs(prompts, token_ids)` (sync or async)."""

    def __init__(
        self,
        engine: Any,
        model_id: str,
        *,
        batch_size: int = 64,
        max_chars: int = MAX_CHARS,
        prompt_version: str = PROMPT_VERSION,
    ) -> None:
        if batch_size < 1:
            raise InputError(f"judge batch size must be >= 1, got {batch_size}")
        super().__init__(engine.tokenizer, model_id, max_chars, prompt_version)
        self.backend = engine
        self.batch_size = batch_size
        self.adapter_sha256: str | None = engine.adapter_sha256
        self.answer_ids = [*self.yes_ids, *self.no_ids]

    def prompts(self, pairs: Sequence[tuple[str, str]]) -> list[list[int]]:
        """The judge's prompt of each pair as token ids; refused when the engine serves another adapter now."""
        if self.backend.adapter_sha256 != self.adapter_sha256:
            raise LanpoError(
                f"the judge was built on adapter {self.adapter_sha256} but the engine now serves "
                f"{self.backend.adapter_sha256}",
                hint="build a new judge after set_adapter (its identity names the weights)",
            )
        return [prefix + suffix for prefix, suffix in self.token_rows(pairs)]

    def scores(self, logprobs: Sequence[Sequence[float]]) -> list[float]:
        """r(p, c) in [0, 1] from each row of next-token log-probs of `answer_ids` (yes ids first, then no ids)."""
        yes = range(len(self.yes_ids))
        no = range(len(self.yes_ids), len(self.answer_ids))
        probs = yes_no_probability(torch.tensor(logprobs), yes, no)  # (B, Y + N) log-probs -> (B,)
        return [min(1.0, max(0.0, float(p))) for p in probs.tolist()]


class VLLMJudge(EngineJudge):
    """Scores (problem, feedback) pairs with a `VLLMBackend`'s vLLM engine, `batch_size` pairs per call."""

    def score(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None) -> list[float]:
        """r(problem, feedback) for every pair, in input order."""
        size = batch_size or self.batch_size
        prompts = self.prompts(pairs)
        scores: list[float] = []
        for start in range(0, len(prompts), size):
            scores.extend(
                self.scores(self.backend.next_token_logprobs(prompts[start : start + size], self.answer_ids))
            )
        return scores


class AsyncVLLMJudge(EngineJudge):
    """Scores (problem, feedback) pairs on an `AsyncVLLMEngine`, every pair of a call submitted at once."""

    async def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """r(problem, feedback) for every pair, in input order."""
        prompts = self.prompts(pairs)
        if not prompts:
            return []
        return self.scores(await self.backend.next_token_logprobs(prompts, self.answer_ids))
