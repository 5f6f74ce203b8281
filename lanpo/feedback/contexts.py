"""Prompts with feedback contexts drawn from the store, for a batch of problems each asking for a mode.

A trainer chooses the problems and their modes (`lanpo.feedback.schedule`: lanpo's trainer the same on every rank,
each rank then taking its share); this draws intra contexts (the run's earlier attempts on the problem) and inter
contexts (lessons of other problems in the run's pool, relevance >= gamma) for the whole batch in two queries, and
renders each chat prompt within `rollout.max_prompt_tokens` (`fit_prompt`): a prompt over it keeps its items, each
cut to a head and a tail of its own text around an `[... N tokens omitted ...]` marker, as the paper truncates
prompts (3,072 tokens) rather than dropping the context; an item is dropped (last drawn first) only when keeping it
would cut one below `MIN_ITEM_TOKENS`. The question is never cut. The stored prompt (`rollout_groups.prompt`) is the
rendered text, so the store shows exactly what the model saw; its context rows (`group_contexts`) name the whole
attempt or experience version each item was cut from.

Per step, counted in rollouts (prompts x n), for each feedback mode:
- `feedback/asked/<mode>`: asked for that feedback; `feedback/served/<mode>`: got at least one item. Served ones
  split into `feedback/items/all_k/<mode>` (all k items), `feedback/items/fewer_drawn/<mode>` (every item the store
  gave, but it had fewer than k) and `feedback/items/fewer_fitted/<mode>` (items dropped to fit the limit);
  `feedback/truncated/<mode>`: served with at least one item cut to fit (any of the three).
- `feedback/missed/<reason>`: asked and got none, rendered zero-shot: `empty_pool` (inter: the pool holds no active
  experience), `none_relevant` (inter: nothing at gamma by the scorer), `no_history` (intra: no earlier attempt of
  this run on the problem), `no_correct` (inter, `feedback.inter.draw = random`: the run has no correct attempt of
  another problem yet), `too_long` (items drawn, not one fits even cut to `MIN_ITEM_TOKENS`), `intra_hurts` (intra: the
  store held earlier attempts and the gate kept them back; `feedback.intra.gate = "value"`: the run's intra groups are
  known to do worse than its zero-shot ones; `"thompson"`: the prompt's draw from the intra lift's posterior fell
  below the bound; `lanpo.feedback.intra_gate`, whose estimate each step also reports as `feedback/intra_gate/*`).

Fig. 2b's leakage arm (`LEAKED_MODE`, `feedback.mode = "leaked-intra"` only) draws as intra and states the gold
answer after the question (`lanpo.feedback.draw.leaked_questions`, called for its prompts alone); with no earlier
attempt its prompt still carries the answer, so it is never re-labelled zero-shot and never missed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lanpo import feedback_modes
from lanpo import prompts as templates
from lanpo.db.connection import transaction
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.errors import InputError
from lanpo.feedback.config import FeedbackConfig
from lanpo.feedback.draw import ContextDraw, draw_contexts, leaked_questions
from lanpo.feedback.intra_gate import IntraGate, intra_gate
from lanpo.feedback.store import RunRef
from lanpo.feedback_modes import CONTEXT_MODES, LEAKED_MODE, MODES
from lanpo.models import apply_chat
from lanpo.seeds import mix_seed

MISSED = ("empty_pool", "none_relevant", "no_history", "no_correct", "too_long", "intra_hurts")
ITEM_COUNTS = ("all_k", "fewer_drawn", "fewer_fitted")  # feedback/items/<count>/<mode>: how many items a prompt kept
MIN_ITEM_TOKENS = 64  # a cut item shorter than this is mostly marker: drop the last item and share its budget out


@dataclass
class StepPrompts:
    """This rank's G prompts of one step (one entry per prompt, in the step's order)."""

    problem_ids: list[int]
    questions: list[str]
    answers: list[str | None]
    asked: list[str]  # the mode each prompt asked for: zero_shot | intra | inter
    modes: list[str]  # the mode it got (zero_shot when no context could be drawn or fitted)
    texts: list[str]  # the chat prompt, rendered
    items: list[list[Any]]  # the context items in it (IntraItem / InterItem), in prompt order
    policy_version_id: int  # the weights that generate this step: the policy of the step before
    missed: Counter[str] = field(default_factory=Counter)  # prompts that asked and got nothing, by reason
    shows_response: bool = False  # inter items are rollouts of other problems, not lessons (feedback.inter.shows)
    k: int = 0  # items a feedback prompt asks for (feedback.k)
    drawn: list[int] = field(default_factory=list)  # items the store gave each prompt
    truncated: list[int] = field(default_factory=list)  # items of each prompt cut to fit (shown cut in `items`)
    gate: IntraGate | None = None  # the intra gate's estimate at this step (feedback.intra.gate value | thompson)

    def version(self, g: int) -> str:
        """The template version of prompt g (stored with its group)."""
        return feedback_modes.version_of(self.modes[g], shows_response=self.shows_response)

    def item_count(self, g: int) -> str:
        """How many items served prompt g kept: all_k | fewer_drawn (the store had fewer) | fewer_fitted (dropped)."""
        kept = len(self.items[g])
        if kept < self.drawn[g]:
            return "fewer_fitted"
        return "all_k" if kept >= self.k else "fewer_drawn"

    def feedback_metrics(self, n: int) -> dict[str, float]:
        """Rollouts that asked for each kind of feedback and got it (with how many items, cut or whole), and why the
        others did not (counts; the names are in the module docstring)."""
        out: dict[str, float] = {}
        for mode in CONTEXT_MODES:
            if MODES[mode].opt_in and mode not in self.asked:  # Fig. 2b's arm: its metrics in its own runs only
                continue
            served = [g for g, m in enumerate(self.modes) if m == mode]
            out[f"feedback/asked/{mode}"] = float(n * self.asked.count(mode))
            out[f"feedback/served/{mode}"] = float(n * len(served))
            counts = Counter(self.item_count(g) for g in served)
            for count in ITEM_COUNTS:
                out[f"feedback/items/{count}/{mode}"] = float(n * counts[count])
            out[f"feedback/truncated/{mode}"] = float(n * sum(self.truncated[g] > 0 for g in served))
        for reason in MISSED:
            out[f"feedback/missed/{reason}"] = float(n * self.missed[reason])
        return out | (self.gate.metrics() if self.gate is not None else {})


def contexted_prompts(
    fb: FeedbackConfig,
    max_prompt_tokens: int,
    seed: int,
    step: int,
    run: RunRef,
    scorer: str | None,
    pids: Sequence[int],
    asked: Sequence[str],
    tokenizer: Any,
    version_step: int,
) -> StepPrompts:
    """The prompts of problems `pids`, each asking for the mode in `asked`, with the context the store gives it:
    intra and inter draws for the whole list in two queries (seeded by (seed, step)), each prompt fitted within
    `max_prompt_tokens`. lanpo's trainer (`lanpo.train.producer.contexts.feedback_prompts`), the TRL integration
    and any other trainer (`lanpo.feedback.StoreClient.prompts`) build their prompts here: one implementation of the
    draws, the leakage rules and the fitting."""
    pids, asked = list(pids), list(asked)
    draw_seed = mix_seed(seed, "contexts", step)
    with transaction(run.db) as session:
        rows = {p.id: p for p in problems_repo.problems_by_ids(session, sorted(set(pids)))}
        wanted = {mode: sorted({p for p, m in zip(pids, asked, strict=True) if m == mode}) for mode in CONTEXT_MODES}
        draw = ContextDraw(
            fb.k,
            fb.candidates,
            draw_seed,
            run.run_id,
            run.pool.id,
            fb.inter.gamma,
            scorer,
            fb.inter.kinds,
            fb.inter.shows_response,
            fb.inter.draw,
            fb.inter.ranking,
        )
        gate, gated = None, set()
        if fb.intra.gate != "none" and wanted["intra"]:
            h, inter = run.pool.baseline_half_life, fb.inter
            gate = intra_gate(
                session, run.run_id, step, version_step, h, inter.prior_sd, inter.value_bound, fb.intra.gate
            )
            # drawn all the same (each problem's draw is keyed by itself alone), so that a withheld prompt is told
            # from one with nothing to show
            gated = {p for p in wanted["intra"] if not gate.serves(draw_seed, p)}
        drawn = draw_contexts(session, wanted, draw)
        leaked = leaked_questions(session, wanted[LEAKED_MODE]) if wanted[LEAKED_MODE] else {}
        pool_empty = bool(wanted["inter"]) and pools_repo.active_size(session, run.pool.id) == 0
        policy_version_id = steps_repo.policy_version_id(session, run.run_id, version_step)
    shows_response = fb.inter.shows_response
    out = StepPrompts([], [], [], asked, [], [], [], policy_version_id, shows_response=shows_response, k=fb.k)
    out.gate = gate
    for pid, mode in zip(pids, asked, strict=True):
        found = list(drawn.get(mode, {}).get(pid, []))
        withheld = False  # the gate kept back what the store holds (not: the store held nothing)
        if mode == "intra" and pid in gated:
            withheld, found = bool(found), []
        question = leaked[pid] if mode == LEAKED_MODE else rows[pid].question
        text, kept, truncated = fit_prompt(tokenizer, mode, question, found, max_prompt_tokens, shows_response)
        served = bool(kept) or MODES[mode].served_without_items  # leaked: the answer, with attempts or without
        if mode in CONTEXT_MODES and not served:  # an honest from-scratch rollout, and the reason it is one
            out.missed[_missed_reason(mode, found, pool_empty, fb.inter.draw, withheld)] += 1
        out.problem_ids.append(pid)
        out.questions.append(rows[pid].question)
        out.answers.append(rows[pid].answer)
        out.modes.append(mode if served else "zero_shot")
        out.texts.append(text)
        out.items.append(kept)
        out.drawn.append(len(found))
        out.truncated.append(truncated)
    return out


def per_rollout(values: Sequence[Any], n: int) -> list[Any]:
    """One value per prompt -> one per rollout, group by group: (G,) -> (G*n,)."""
    return [value for value in values for _ in range(n)]


def _missed_reason(mode: str, found: list[Any], pool_empty: bool, inter_draw: str, withheld: bool) -> str:
    if found:
        return "too_long"
    if mode == "intra":
        return "intra_hurts" if withheld else "no_history"
    if inter_draw == "random":
        return "no_correct"
    return "empty_pool" if pool_empty else "none_relevant"


class Fit(NamedTuple):
    """A rendered prompt and the context items in it, cut ones as they are shown."""

    text: str
    items: list[Any]
    truncated: int  # how many of `items` were cut to fit


def fit_prompt(
    tokenizer: Any,
    mode: str,
    question: str,
    found: Sequence[Any],
    limit: int,
    shows_response: bool = False,
    min_item_tokens: int = MIN_ITEM_TOKENS,
) -> Fit:
    """The chat prompt for `mode` with the context items `found`, within `limit` tokens.

    A prompt that fits is rendered as it is. Over `limit`, every item is kept and cut to a share of the budget (the
    limit less the prompt rendered with every item empty): equal shares, water-filled (`water_fill`: an item
    shorter than its share stays whole and the others share what it leaves). A cut item keeps the head and the tail
    of its own text, the approach and the conclusion with its final answer, around the `templates.OMITTED` marker
    naming how many of its tokens are left out (`templates.elided`). Tokenising the joined prompt can differ by a
    few tokens from the sum of its parts, so the rendered prompt is counted and the budget shrunk by the overflow
    until it fits. Only when an item would be cut below `min_item_tokens` (marker included) is the last drawn item
    dropped and its share given to the rest; with no item left the prompt is the zero-shot one. The question is
    never cut. A cut item is `found`'s dataclass with its text replaced, so its ids (`ref`) are the original's.
    `shows_response`: inter items are unsummarised solutions of other problems (their own wording: lanpo's
    raw-response ablation).
    """

    def render(items: Sequence[Any]) -> str:
        return apply_chat(
            tokenizer, feedback_modes.build_messages(mode, question, items, shows_response=shows_response)
        )

    text = render(found)
    if not found or _count(tokenizer, text) <= limit:
        return Fit(text, list(found), 0)
    texts = [feedback_modes.context_text(mode, item).strip() for item in found]
    spans = [_token_spans(tokenizer, item_text) for item_text in texts]
    for kept in range(len(found), 0, -1):
        fit = _cut_to_fit(tokenizer, render, mode, found[:kept], texts, spans, limit, min_item_tokens)
        if fit is not None:
            return fit
    return Fit(render([]), [], 0)


def water_fill(lengths: Sequence[int], budget: int) -> list[int]:
    """Token caps for items of `lengths` sharing `budget`: equal shares, but an item shorter than its share keeps
    its length and what it leaves is shared among the others (the shortest are settled first; the integer
    remainder goes to the longest, the last of equal ones). Sum <= max(budget, 0); a cap never exceeds its length."""
    caps = [0] * len(lengths)
    left = max(budget, 0)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for settled, i in enumerate(order):
        caps[i] = min(lengths[i], left // (len(order) - settled))
        left -= caps[i]
    return caps


def _cut_to_fit(
    tokenizer: Any,
    render: Callable[[Sequence[Any]], str],
    mode: str,
    items: Sequence[Any],
    texts: Sequence[str],
    spans: Sequence[list[tuple[int, int]]],
    limit: int,
    min_item_tokens: int,
) -> Fit | None:
    """The prompt with `items`, each cut to its water-filled share; None when one would be cut below the minimum."""
    budget = limit - _count(tokenizer, render([feedback_modes.with_context_text(mode, item, "") for item in items]))
    lengths = [len(span) for span in spans[: len(items)]]
    while budget >= 0:  # below 0 even empty items overflow: no cut helps (the budget falls each round, so this ends)
        caps = water_fill(lengths, budget)
        cut = {i for i, (cap, length) in enumerate(zip(caps, lengths, strict=True)) if cap < length}
        if any(caps[i] < min_item_tokens for i in cut):
            return None
        shown = [
            feedback_modes.with_context_text(mode, item, _elide(tokenizer, texts[i], spans[i], caps[i]))
            if i in cut
            else item
            for i, item in enumerate(items)
        ]
        text = render(shown)
        over = _count(tokenizer, text) - limit
        if over <= 0:
            return Fit(text, shown, len(cut))
        budget -= over
    return None


def _elide(tokenizer: Any, text: str, spans: list[tuple[int, int]], cap: int) -> str:
    """`text` (of `len(spans)` tokens) cut to about `cap` tokens: its head and tail halves around the marker."""
    length = len(spans)
    marker = _count(tokenizer, templates.elided("", length, ""))  # the most digits the count can have
    keep = max(cap - marker, 0)
    head, tail = keep - keep // 2, keep // 2
    head_end = spans[head - 1][1] if head else 0
    tail_start = max(spans[length - tail][0], head_end) if tail else len(text)
    return templates.elided(text[:head_end].rstrip(), length - head - tail, text[tail_start:].lstrip())


def _count(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _token_spans(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each token of `text`: cuts fall between tokens, inside the text."""
    try:
        return list(tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"])
    except NotImplementedError as exc:  # a slow (Python) tokenizer has no offsets
        raise InputError(
            "cutting a feedback item to fit rollout.max_prompt_tokens needs a fast tokenizer (token offsets)",
            hint="load the model's tokenizer.json (use_fast=True), or raise rollout.max_prompt_tokens",
        ) from exc
