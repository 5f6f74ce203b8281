"""The LLM relevance judge (paper appendix 10.1): `r(p, c) = softmax(l_yes, l_no)` from a yes/no prompt.

The model reads a problem and a candidate (another problem's question, or an experience summary) and is asked
whether the candidate is relevant and useful for solving the problem. The score is the probability mass of
"yes" against "no" in the next-token distribution. Tokenizers split these words differently ("yes", " yes",
"Yes", ...; some into several pieces), so each side takes the first token of every variant and combines
their logits with logsumexp; a token that starts both a yes and a no variant is dropped from both.

Pairs are scored in batches (left padding, explicit position ids so a padded row scores exactly as it would
alone, only the last position's logits computed). The scorer identity stored in `relevance_scores.scorer` is
`"<model id>|<prompt version>"`: change the prompt, bump `PROMPT_VERSION`, and nothing cached is reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lanpo.errors import InputError

PROMPT_VERSION = "relevance-v1"
SYSTEM = "You judge whether a piece of feedback helps with a math problem. Answer with one word: yes or no."
USER_TEMPLATE = (
    "Problem:\n{problem}\n\n"
    "Feedback:\n{feedback}\n\n"
    "Is this feedback relevant and useful for solving the problem? Answer yes or no."
)
YES_VARIANTS = ("yes", " yes", "Yes", " Yes", "YES")
NO_VARIANTS = ("no", " no", "No", " No", "NO")


def first_token_ids(tokenizer: Any, variants: Sequence[str]) -> list[int]:
    """The first token id of each spelling in `variants`, deduplicated, in order."""
    ids: list[int] = []
    for text in variants:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if encoded and encoded[0] not in ids:
            ids.append(int(encoded[0]))
    return ids


def answer_token_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """Disjoint yes / no first-token ids (a token starting both a yes and a no spelling says nothing)."""
    yes, no = first_token_ids(tokenizer, YES_VARIANTS), first_token_ids(tokenizer, NO_VARIANTS)
    shared = set(yes) & set(no)
    yes, no = [t for t in yes if t not in shared], [t for t in no if t not in shared]
    if not yes or not no:
        raise InputError("the scorer's tokenizer cannot tell 'yes' from 'no' by their first tokens")
    return yes, no


def yes_no_probability(logits: torch.Tensor, yes_ids: Sequence[int], no_ids: Sequence[int]) -> torch.Tensor:
    """`softmax(l_yes, l_no)[yes]` per row: logits `(B, V)` -> probabilities `(B,)` in [0, 1].

    `l_yes = logsumexp(logits[yes_ids])`, likewise for no, so several spellings of one answer add their mass.
    """
    logits = logits.float()
    l_yes = torch.logsumexp(logits[:, list(yes_ids)], dim=-1)  # (B,)
    l_no = torch.logsumexp(logits[:, list(no_ids)], dim=-1)  # (B,)
    return torch.sigmoid(l_yes - l_no)  # = exp(l_yes) / (exp(l_yes) + exp(l_no))


class RelevanceScorer:
    """Scores (problem, feedback) text pairs with a causal LM, many pairs per forward pass."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_id: str,
        *,
        batch_size: int = 16,
        max_chars: int = 1500,
        prompt_version: str = PROMPT_VERSION,
    ) -> None:
        if batch_size < 1:
            raise InputError(f"scorer batch size must be >= 1, got {batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model_id = model_id
        self.batch_size = batch_size
        self.max_chars = max_chars
        self.prompt_version = prompt_version
        self.yes_ids, self.no_ids = answer_token_ids(tokenizer)
        self.forward_calls = 0

    @property
    def identity(self) -> str:
        """What `relevance_scores.scorer` holds for this scorer: `"<model id>|<prompt version>"`."""
        return f"{self.model_id}|{self.prompt_version}"

    def prompt(self, problem: str, feedback: str) -> str:
        """The judgement prompt, in the model's chat template when it has one."""
        user = USER_TEMPLATE.format(problem=problem[: self.max_chars], feedback=feedback[: self.max_chars])
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"{SYSTEM}\n\n{user}\nAnswer:"

    @torch.no_grad()
    def score(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None) -> list[float]:
        """r(problem, feedback) for every pair, in input order (no caching here: see `lanpo.retrieval.relevance`)."""
        size = batch_size or self.batch_size
        prompts = [self.prompt(problem, feedback) for problem, feedback in pairs]
        encoded = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        # Similar lengths together: less padding per batch.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        device = next(self.model.parameters()).device
        scores = [0.0] * len(encoded)
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            batch = self.tokenizer.pad({"input_ids": [encoded[i] for i in chunk]}, return_tensors="pt")
            input_ids = batch["input_ids"].to(device)  # (B, T)
            attention_mask = batch["attention_mask"].to(device)  # (B, T)
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # left padding: real tokens start at 0
            self.forward_calls += 1
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
                logits_to_keep=1,
            )
            probs = yes_no_probability(out.logits[:, -1, :], self.yes_ids, self.no_ids)  # (B,)
            for i, p in zip(chunk, probs.tolist(), strict=True):
                scores[i] = min(1.0, max(0.0, float(p)))
        return scores


def load_scorer(
    name_or_path: str,
    *,
    batch_size: int = 16,
    device: str | None = None,
    dtype: str | None = None,
) -> RelevanceScorer:
    """A scorer on `smollm2` (the offline SmolLM2-135M-Instruct), a local HF folder, or a cached hub id."""
    from lanpo.models import load_causal_lm

    model, tokenizer = load_causal_lm(name_or_path, dtype=dtype, device=device)
    return RelevanceScorer(model, tokenizer, model_id=str(name_or_path), batch_size=batch_size)
