"""The LLM relevance judge (paper appendix 10.1): `r(p, c) = softmax(l_yes, l_no)` from a yes/no prompt.

The prompt follows the structure of the paper's judge prompt, in our own words: the judge's role (system), the
problem, the candidate feedback (another problem's question, or an experience summary), what counts as relevant
(a method, principle or pitfall that carries over -- not shared wording or numbers), and the yes / no question.
(With the criterion SmolLM2-135M ranks the same problem above a related one above an unrelated one:
0.62 / 0.56 / 0.47.) The score is the probability mass of
"yes" against "no" in the next-token distribution. Tokenizers split these words differently ("yes", " yes",
"Yes", ...; some into several pieces), so each side takes the first token of every variant and combines
their logits with logsumexp; a token that starts both a yes and a no variant is dropped from both.

Pairs are scored in batches (left padding, explicit position ids so a padded row scores exactly as it would
alone, only the last position's logits computed). Candidates of one problem share the prompt's prefix (system
prompt + problem): it runs once and its KV cache serves the whole batch.

Three names, one meaning each, from the CLI to the SQL parameter:
  judge   the model reference a user names (`--judge smollm2`, a HF folder, a hub id), up to `load_judge`;
  rater   a loaded `Judge` (`HFJudge` here, `lanpo.retrieval.vllm_judge.VLLMJudge` on the vLLM engine);
  scorer  the identity its scores are stored under, `relevance_scores.scorer` = `judge_cache.scorer` =
          `"<model id>|<prompt version>"` (`Judge.identity`; the served adapter's hash is part of the model id):
          change the prompt, bump `PROMPT_VERSION`, and nothing cached is reused.
`JudgePrompt` builds and tokenises the prompt; `HFJudge` scores it with a HF model, `VLLMJudge` with the vLLM
engine's next-token log-probs (same identity: the same model and prompt are the same judge, up to the vLLM engine's
bf16 arithmetic).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from lanpo.errors import InputError
from lanpo.models import cache_kwarg, returned_cache

PROMPT_VERSION = "relevance-v2"
MAX_CHARS = 1500  # the problem and the feedback are each cut to this many characters in the prompt
SYSTEM = "You judge whether a piece of feedback helps with a math problem. Answer with one word: yes or no."
FEEDBACK_LABEL = "Feedback:\n"
USER_TEMPLATE = (
    "Problem:\n{problem}\n\n" + FEEDBACK_LABEL + "{feedback}\n\n"
    "Relevant feedback shares a method, principle or pitfall with the problem, not just words or numbers.\n"
    "Is this feedback relevant and useful for solving the problem? Answer yes or no."
)
YES_VARIANTS = ("yes", " yes", "Yes", " Yes", "YES")
NO_VARIANTS = ("no", " no", "No", " No", "NO")
_SENTINEL = "\x00FEEDBACK\x00"  # marks where the feedback goes when the prompt is split into prefix and suffix


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
        raise InputError("the judge's tokenizer cannot tell 'yes' from 'no' by their first tokens")
    return yes, no


def yes_no_probability(logits: torch.Tensor, yes_ids: Sequence[int], no_ids: Sequence[int]) -> torch.Tensor:
    """`softmax(l_yes, l_no)[yes]` per row: logits `(B, V)` -> probabilities `(B,)` in [0, 1].

    `l_yes = logsumexp(logits[yes_ids])`, likewise for no, so several spellings of one answer add their mass.
    """
    logits = logits.float()
    l_yes = torch.logsumexp(logits[:, list(yes_ids)], dim=-1)  # (B,)
    l_no = torch.logsumexp(logits[:, list(no_ids)], dim=-1)  # (B,)
    return torch.sigmoid(l_yes - l_no)  # = exp(l_yes) / (exp(l_yes) + exp(l_no))


class Judge(Protocol):
    """What retrieval needs of a loaded relevance judge (a `rater`): `HFJudge` and `VLLMJudge` (vLLM).

    `identity` is the scorer: what `relevance_scores.scorer` holds for its scores.
    """

    batch_size: int

    @property
    def identity(self) -> str: ...

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]: ...


class JudgePrompt:
    """The judgement prompt in a tokenizer's chat template, tokenised as (prefix, suffix) around the feedback.

    The prefix (system prompt + problem) is the same for every candidate of one problem, so a backend can run it
    once (the HF judge's shared KV cache, vLLM's prefix cache).
    """

    def __init__(self, tokenizer: Any, model_id: str, max_chars: int, prompt_version: str) -> None:
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.max_chars = max_chars
        self.prompt_version = prompt_version
        self.yes_ids, self.no_ids = answer_token_ids(tokenizer)

    @property
    def identity(self) -> str:
        """The scorer, `"<model id>|<prompt version>"`: what `relevance_scores.scorer` and `judge_cache.scorer` hold
        for this judge; a text limit other than the default (`MAX_CHARS`), which changes long texts' prompts,
        is appended (`"|chars=<n>"`)."""
        limit = "" if self.max_chars == MAX_CHARS else f"|chars={self.max_chars}"
        return f"{self.model_id}|{self.prompt_version}{limit}"

    def prompt(self, problem: str, feedback: str) -> str:
        """The judgement prompt, in the model's chat template when it has one."""
        head, tail = self._template_parts(problem)
        return head + self._feedback_part(feedback) + tail

    def _feedback_part(self, feedback: str) -> str:
        return FEEDBACK_LABEL + feedback[: self.max_chars]

    def _template_parts(self, problem: str) -> tuple[str, str]:
        """The prompt before and after the feedback: (system + problem, question + assistant header)."""
        user = USER_TEMPLATE.format(problem=problem[: self.max_chars], feedback=_SENTINEL)
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = f"{SYSTEM}\n\n{user}\nAnswer:"
        head, tail = text.split(FEEDBACK_LABEL + _SENTINEL)
        return head, tail

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def token_rows(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """(prefix ids, suffix ids) per pair; pairs of one problem share the very same prefix list object."""
        prefixes: dict[str, list[int]] = {}
        tails: dict[str, str] = {}
        rows: list[tuple[list[int], list[int]]] = []
        for problem, feedback in pairs:
            if problem not in prefixes:
                head, tails[problem] = self._template_parts(problem)
                prefixes[problem] = self._encode(head)
            rows.append((prefixes[problem], self._encode(self._feedback_part(feedback) + tails[problem])))
        return rows


class HFJudge(JudgePrompt):
    """Scores (problem, feedback) text pairs with a HF causal LM, many pairs per forward pass."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_id: str,
        *,
        batch_size: int = 16,
        max_chars: int = MAX_CHARS,
        prompt_version: str = PROMPT_VERSION,
        share_prefix: bool = True,
    ) -> None:
        if batch_size < 1:
            raise InputError(f"judge batch size must be >= 1, got {batch_size}")
        super().__init__(tokenizer, model_id, max_chars, prompt_version)
        self.model = model.eval()
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.batch_size = batch_size
        self.share_prefix = share_prefix
        self._cache_kwarg = cache_kwarg(model)
        self.forward_calls = 0

    @torch.no_grad()
    def score(
        self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None, share_prefix: bool | None = None
    ) -> list[float]:
        """r(problem, feedback) for every pair, in input order (no caching here: see `lanpo.retrieval.relevance`).

        A prompt is tokenised as `prefix + suffix`: the prefix (system prompt and problem) is the same for every
        candidate of one problem. With `share_prefix` (default: the judge's setting) pairs are grouped by
        problem, the prefix runs once per batch and its KV cache is repeated over the batch, so each pair
        costs only its suffix (feedback + question). Without it, every row carries its whole prompt.
        """
        size = batch_size or self.batch_size
        share = self.share_prefix if share_prefix is None else share_prefix
        rows = self.token_rows(pairs)
        scores = [0.0] * len(rows)
        if share:
            groups: dict[int, list[int]] = {}
            for i, (prefix, _) in enumerate(rows):
                groups.setdefault(id(prefix), []).append(i)
            chunks = [
                sorted_group[start : start + size]
                for group in groups.values()
                for sorted_group in [sorted(group, key=lambda i: len(rows[i][1]))]
                for start in range(0, len(sorted_group), size)
            ]
        else:
            order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]) + len(rows[i][1]))  # less padding
            chunks = [order[start : start + size] for start in range(0, len(order), size)]
        for chunk in chunks:
            if share:
                probs = self._forward_shared(rows[chunk[0]][0], [rows[i][1] for i in chunk])
            else:
                probs = self._forward_full([rows[i][0] + rows[i][1] for i in chunk])
            for i, p in zip(chunk, probs.tolist(), strict=True):
                scores[i] = min(1.0, max(0.0, float(p)))
        return scores

    def _left_pad(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.tokenizer.pad({"input_ids": sequences}, return_tensors="pt")
        device = next(self.model.parameters()).device
        return batch["input_ids"].to(device), batch["attention_mask"].to(device)  # (B, T), (B, T)

    def _forward_full(self, sequences: list[list[int]]) -> torch.Tensor:
        """One forward over whole prompts (left padded) -> yes probabilities (B,)."""
        input_ids, attention_mask = self._left_pad(sequences)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # left padding: real tokens start at 0
        self.forward_calls += 1
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=1,
        )
        return yes_no_probability(out.logits[:, -1, :], self.yes_ids, self.no_ids)

    def _forward_shared(self, prefix: list[int], suffixes: list[list[int]]) -> torch.Tensor:
        """Prefix once, its KV cache repeated over the batch, then the left-padded suffixes -> (B,)."""
        device = next(self.model.parameters()).device
        prefix_ids = torch.tensor([prefix], device=device)  # (1, P)
        self.forward_calls += 1
        prefix_out = self.model(input_ids=prefix_ids, use_cache=True, logits_to_keep=1)
        cache = returned_cache(prefix_out)
        cache.batch_repeat_interleave(len(suffixes))
        suffix_ids, suffix_mask = self._left_pad(suffixes)  # (B, S); padding sits between prefix and suffix
        attention_mask = torch.cat(
            [torch.ones(len(suffixes), len(prefix), dtype=suffix_mask.dtype, device=device), suffix_mask], dim=1
        )  # (B, P + S)
        position_ids = len(prefix) + (suffix_mask.cumsum(-1) - 1).clamp(min=0)  # (B, S)
        self.forward_calls += 1
        out = self.model(
            input_ids=suffix_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_kwarg: cache},
            logits_to_keep=1,
        )
        return yes_no_probability(out.logits[:, -1, :], self.yes_ids, self.no_ids)


def load_judge(
    judge: str,
    *,
    batch_size: int = 16,
    device: str | None = None,
    dtype: str | None = None,
) -> HFJudge:
    """The judge model `judge` loaded: `smollm2` (the offline SmolLM2-135M-Instruct), a local HF folder, or a
    cached hub id. `judge` is its model id, so its scorer is `"<judge>|<prompt version>"`."""
    from lanpo.models import load_causal_lm

    model, tokenizer = load_causal_lm(judge, dtype=dtype, device=device)
    return HFJudge(model, tokenizer, model_id=str(judge), batch_size=batch_size)
