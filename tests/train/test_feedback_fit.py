"""Fitting feedback prompts into `rollout.max_prompt_tokens`: items cut to water-filled shares, head and tail kept.

Compared against: the old dropping loop (kept here as the reference for prompts that already fit), a plain
water-filling property (no item gets more than a cut one's share plus one token), the original items' text (a cut
item is a head and a tail of it around the marker), the cap itself (char-level and BPE tokenizers, many random
lengths), and at the paper's shapes the real trainer on the real store (3,072-token prompts, ~1,500-token attempts).
"""

from __future__ import annotations

import functools
import random
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from lanpo import feedback_modes, prompts
from lanpo.db.connection import transaction
from lanpo.db.repo.contexts import InterItem, IntraItem
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.feedback.contexts import MIN_ITEM_TOKENS, StepPrompts, fit_prompt, water_fill
from lanpo.models import apply_chat, prepare_tokenizer, tiny_causal_lm, tiny_tokenizer

WORDS = ("step", "add", "the", "sum", "of", "carry", "so", "we", "get", "then", "\\boxed{12}", "###", "\n\n", "=")
CUT = re.compile(r"\A(?P<head>.*)\n\[\.\.\. (?P<omitted>\d+) tokens omitted \.\.\.\]\n(?P<tail>.*)\Z", re.DOTALL)


@functools.cache
def char_tokenizer() -> Any:
    """One token per character, ~32k of them: token counts add up exactly over a join."""
    return tiny_tokenizer(large_vocab=True)


@functools.cache
def bpe_tokenizer() -> Any:
    """A small BPE trained without a pre-tokenizer: merges cross the joins, so a rendered prompt's length is not
    the sum of its parts (the budget has to shrink by the overflow)."""
    from tokenizers import Tokenizer, decoders, models, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(50)]
    corpus += [prompts.INTRA, prompts.INTER, prompts.SYSTEM, prompts.ACTOR]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"],
            initial_alphabet=[chr(c) for c in range(32, 127)] + ["\n"],
            show_progress=False,
        ),
    )
    bpe.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = tiny_tokenizer().chat_template
    return prepare_tokenizer(tokenizer)


TOKENIZERS = {"char": char_tokenizer, "bpe": bpe_tokenizer}


def count(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def old_fit_prompt(tokenizer: Any, mode: str, question: str, found: list[Any], limit: int) -> tuple[str, list[Any]]:
    """The behaviour before truncation: drop items, last drawn first, until the prompt fits."""
    while True:
        text = apply_chat(tokenizer, feedback_modes.build_messages(mode, question, found))
        if not found or count(tokenizer, text) <= limit:
            return text, found
        found = found[:-1]


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def ideographs(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(n))


def items_of(mode: str, texts: list[str]) -> list[Any]:
    if mode == "intra":
        return [IntraItem(100 + i, text) for i, text in enumerate(texts)]
    return [InterItem(200 + i, 7, text, 0.95) for i, text in enumerate(texts)]


def check_shown(mode: str, original: Any, shown: Any) -> bool:
    """`shown` is `original` itself, or its head and tail around the marker; True when cut."""
    if shown == original:
        return False
    assert shown == feedback_modes.with_context_text(mode, original, feedback_modes.context_text(mode, shown)), (
        "ids changed"
    )
    whole = feedback_modes.context_text(mode, original).strip()
    match = CUT.match(feedback_modes.context_text(mode, shown))
    assert match, feedback_modes.context_text(mode, shown)[:200]
    assert whole.startswith(match["head"]) and whole.endswith(match["tail"])
    assert len(match["head"]) + len(match["tail"]) < len(whole)
    return True


# --------------------------------------------------------------------------- water filling


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 5000), min_size=1, max_size=6), budget=st.integers(-50, 20000))
def test_water_fill_gives_equal_shares_and_passes_on_what_short_items_leave(lengths: list[int], budget: int) -> None:
    caps = water_fill(lengths, budget)
    assert all(0 <= cap <= length for cap, length in zip(caps, lengths, strict=True))
    assert sum(caps) == min(max(budget, 0), sum(lengths))  # nothing wasted: every token a short item leaves is used
    for i, (cap, length) in enumerate(zip(caps, lengths, strict=True)):
        if cap < length:  # a cut item: nobody is given more than its share (+1 for the integer remainder)
            assert all(other <= cap + 1 for j, other in enumerate(caps) if j != i)


def test_water_fill_by_hand() -> None:
    assert water_fill([100, 5000, 5000], 3000) == [100, 1450, 1450]
    assert water_fill([100, 5000, 5000], 3001) == [100, 1450, 1451]  # the remainder to the last of equal ones
    assert water_fill([2000, 800], 3000) == [2000, 800]
    assert water_fill([2000, 2000], 3000) == [1500, 1500]


# --------------------------------------------------------------------------- fit_prompt


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(TOKENIZERS)),
    mode=st.sampled_from(["intra", "inter"]),
    lengths=st.lists(st.integers(0, 120), max_size=4),
    seed=st.integers(0, 2**20),
    limit=st.integers(100, 2000),
)
def test_a_prompt_that_fits_is_the_old_prompt_bit_for_bit(
    name: str, mode: str, lengths: list[int], seed: int, limit: int
) -> None:
    tokenizer = TOKENIZERS[name]()
    found = items_of(mode, [words(seed + i, n) for i, n in enumerate(lengths)])
    old_text, old_kept = old_fit_prompt(tokenizer, mode, "What is 3 + 4?", found, limit)
    if len(old_kept) < len(found):
        return  # the old loop dropped something: not the case this test is about
    fit = fit_prompt(tokenizer, mode, "What is 3 + 4?", found, limit)
    assert fit.text == old_text and fit.items == old_kept and fit.truncated == 0
    assert all(a is b for a, b in zip(fit.items, found, strict=True))


def test_items_shorter_than_their_share_stay_whole_and_the_rest_share_the_budget() -> None:
    tokenizer = char_tokenizer()
    found = items_of("intra", [ideographs(1, 100), ideographs(2, 5000), ideographs(3, 4000)])
    fit = fit_prompt(tokenizer, "intra", "What is 3 + 4?", found, 3072)
    assert count(tokenizer, fit.text) <= 3072 and fit.truncated == 2 and len(fit.items) == 3
    assert fit.items[0] is found[0]  # 100 tokens: under its share, whole
    shown = [count(tokenizer, item.response) for item in fit.items[1:]]
    assert abs(shown[0] - shown[1]) <= 1  # the two long ones split what is left equally (to a token)
    blank = count(
        tokenizer, apply_chat(tokenizer, prompts.intra_messages("What is 3 + 4?", items_of("intra", [""] * 3)))
    )
    assert 3072 - blank - 100 - 2 <= sum(shown) <= 3072 - blank - 100  # ~ the whole budget (marker digits aside)
    _, old_kept = old_fit_prompt(tokenizer, "intra", "What is 3 + 4?", found, 3072)
    assert len(old_kept) == 1  # what the old loop served: the short attempt alone


def test_a_cut_item_keeps_its_head_and_its_tail_around_the_marker() -> None:
    tokenizer = char_tokenizer()
    texts = [
        "APPROACH: add the units first. " + ideographs(seed, 3000) + " so the total is \\boxed{42}" for seed in (4, 5)
    ]
    found = items_of("intra", texts)
    fit = fit_prompt(tokenizer, "intra", "What is 3 + 4?", found, 3072)
    assert fit.truncated == 2 and [item.attempt_id for item in fit.items] == [100, 101]
    for original, shown in zip(found, fit.items, strict=True):
        assert check_shown("intra", original, shown)
        match = CUT.match(shown.response)
        assert match
        assert match["head"].startswith("APPROACH: add the units first.")
        assert match["tail"].endswith("so the total is \\boxed{42}")
        # one token per character here: the marker names exactly the tokens left out
        assert int(match["omitted"]) == len(original.response) - len(match["head"]) - len(match["tail"])
        assert abs(len(match["head"]) - len(match["tail"])) <= 1  # halves
        assert match["omitted"] in fit.text and shown.response in fit.text


def test_no_item_fits_gives_the_zero_shot_prompt() -> None:
    tokenizer = char_tokenizer()
    found = items_of("intra", [ideographs(6, 500)])
    blank = count(tokenizer, apply_chat(tokenizer, prompts.intra_messages("What is 3 + 4?", items_of("intra", [""]))))
    fit = fit_prompt(tokenizer, "intra", "What is 3 + 4?", found, blank + MIN_ITEM_TOKENS - 1)
    assert fit.items == [] and fit.text == apply_chat(tokenizer, prompts.actor_messages("What is 3 + 4?"))
    kept = fit_prompt(tokenizer, "intra", "What is 3 + 4?", found, blank + MIN_ITEM_TOKENS)
    assert len(kept.items) == 1 and kept.truncated == 1 and count(tokenizer, kept.text) <= blank + MIN_ITEM_TOKENS


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(TOKENIZERS)),
    mode=st.sampled_from(["intra", "inter"]),
    lengths=st.lists(st.integers(0, 3000), min_size=1, max_size=4),
    seed=st.integers(0, 2**20),
    limit=st.integers(150, 4000),
    question_words=st.integers(1, 300),
    shows_response=st.booleans(),
)
def test_the_prompt_fits_the_cap_for_any_lengths(
    name: str, mode: str, lengths: list[int], seed: int, limit: int, question_words: int, shows_response: bool
) -> None:
    tokenizer = TOKENIZERS[name]()
    question = words(seed, question_words)
    found = items_of(mode, [words(seed + 1 + i, n) for i, n in enumerate(lengths)])
    fit = fit_prompt(tokenizer, mode, question, found, limit, shows_response=shows_response)
    zero_shot = apply_chat(tokenizer, prompts.actor_messages(question))
    if not fit.items:
        assert fit.text == zero_shot and fit.truncated == 0
        return
    assert count(tokenizer, fit.text) <= limit
    assert question in fit.text  # the question is never cut
    # what was drawn, the last drawn dropped first; each item whole or its head and tail (its ids unchanged)
    assert fit.truncated == sum(check_shown(mode, f, s) for f, s in zip(found, fit.items, strict=False))
    # char-level counts add up exactly: an item is dropped just when keeping it would cut one below the minimum
    if name == "char" and len(fit.items) < len(found):
        more = found[: len(fit.items) + 1]
        empty = [feedback_modes.with_context_text(mode, f, "") for f in more]
        blank = feedback_modes.build_messages(mode, question, empty, shows_response)
        lengths = [len(feedback_modes.context_text(mode, f).strip()) for f in more]
        caps = water_fill(lengths, limit - count(tokenizer, apply_chat(tokenizer, blank)))
        assert any(cap < min(MIN_ITEM_TOKENS, length) for cap, length in zip(caps, lengths, strict=True))


def test_the_marker_carries_no_judgement() -> None:
    for word in prompts.JUDGEMENT_WORDS:
        assert not re.search(rf"\b{re.escape(word)}", prompts.OMITTED, re.IGNORECASE), word
    assert prompts.elided("ab", 12, "cd") == "ab\n[... 12 tokens omitted ...]\ncd"


def test_feedback_metrics_split_served_prompts_by_items() -> None:
    a, b, c = IntraItem(1, "x"), IntraItem(2, "y"), IntraItem(3, "z")
    lesson = InterItem(4, 9, "l", 0.9)
    step = StepPrompts(
        problem_ids=[1, 2, 3, 4, 5, 6],
        questions=["q"] * 6,
        answers=["1"] * 6,
        asked=["intra", "intra", "intra", "intra", "inter", "zero_shot"],
        modes=["intra", "intra", "intra", "zero_shot", "inter", "zero_shot"],
        texts=["p"] * 6,
        items=[[a, b], [a], [c], [], [lesson], []],
        policy_version_id=1,
        k=2,
        drawn=[2, 1, 2, 2, 1, 0],  # the 2nd: the store had one; the 3rd and 4th: dropped to fit (the 4th: all)
        truncated=[2, 0, 1, 0, 1, 0],
    )
    step.missed["too_long"] = 1
    m = step.feedback_metrics(n=4)
    assert (m["feedback/asked/intra"], m["feedback/served/intra"], m["feedback/missed/too_long"]) == (16, 12, 4)
    assert (m["feedback/items/all_k/intra"], m["feedback/items/fewer_drawn/intra"]) == (4, 4)
    assert (m["feedback/items/fewer_fitted/intra"], m["feedback/truncated/intra"]) == (4, 8)
    assert (m["feedback/items/fewer_drawn/inter"], m["feedback/truncated/inter"], m["feedback/items/all_k/inter"]) == (
        4,
        4,
        0,
    )


# --------------------------------------------------------------------------- the trainer at the paper's shapes


def test_intra_prompts_at_paper_lengths_keep_both_attempts_cut_to_the_cap(
    db: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paper, Section 5: prompts truncated at 3,072 tokens. Two problems x n = 2, ~1,500-token attempts, intra
    feedback with k = 2 at p_t = 1: from step 2 on every prompt holds both attempts of step 1, cut, within the cap."""
    from lanpo.train import policy
    from lanpo.train.config import DataConfig, FeedbackConfig, GRPOConfig, RolloutConfig
    from lanpo.train.loop import train
    from tests.train.conftest import tiny_config

    monkeypatch.setattr(
        policy, "tiny_causal_lm", functools.partial(tiny_causal_lm, large_vocab=True, max_positions=8192)
    )
    with transaction(db) as session:
        upsert_problems(session, "paper_shapes", [Question(str(i), f"What is {i} + 2?", str(i + 2)) for i in range(2)])
    cfg = tiny_config(
        tmp_path,
        steps=2,
        batch_size=2,
        data=DataConfig(dataset="paper_shapes"),
        rollout=RolloutConfig(n=2, max_new_tokens=1500, max_prompt_tokens=3072),
        grpo=GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, skip_zero_spread=True, micro_batch_size=1),
        feedback=FeedbackConfig(mode="intra", p_t=1.0, k=2, candidates=4),
    )
    result = train(cfg, db=db, progress=False)
    first, second = result.metrics
    assert first["feedback/missed/no_history"] == 4 and first["feedback/served/intra"] == 0
    assert second["feedback/served/intra"] == second["feedback/items/all_k/intra"] == 4
    assert second["feedback/truncated/intra"] == 4
    assert second["feedback/items/fewer_drawn/intra"] == second["feedback/items/fewer_fitted/intra"] == 0
    assert second["feedback/missed/too_long"] == 0

    tokenizer = tiny_tokenizer(large_vocab=True)
    with db.connect() as conn:
        attempts = conn.execute(
            sa.text("SELECT response, completion_tokens FROM run_attempts WHERE run_id = :r AND step = 1"),
            {"r": result.run_id},
        ).all()
        assert len(attempts) == 4 and min(tokens for _, tokens in attempts) > 1000  # the model writes to its limit
        groups = conn.execute(
            sa.text("SELECT id, mode, prompt, prompt_tokens FROM rollout_groups WHERE run_id = :r AND step = 2"),
            {"r": result.run_id},
        ).all()
        assert len(groups) == 2
        for group_id, mode, prompt, prompt_tokens in groups:
            assert mode == "intra"
            assert count(tokenizer, prompt) == prompt_tokens <= 3072  # the stored prompt is what the model saw
            assert prompt_tokens >= 3072 - 8  # the budget is used, not thrown away
            sources = (
                conn.execute(
                    sa.text(
                        "SELECT a.response FROM group_contexts c JOIN attempts a ON a.id = c.context_attempt_id "
                        "WHERE c.group_id = :g ORDER BY c.position"
                    ),
                    {"g": group_id},
                )
                .scalars()
                .all()
            )
            assert len(sources) == 2 and prompt.count(" tokens omitted ...]") == 2
            for source in sources:  # each context row names the whole attempt its cut item came from
                whole = source.strip()
                assert whole[:200] in prompt and whole[-200:] in prompt and whole not in prompt
