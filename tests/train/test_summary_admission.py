"""The summary's format: what counts as a lesson, what the pool admits, and what each step reports about it."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo import prompts
from lanpo.feedback import summarize
from lanpo.feedback.record import GroupRecord, RolloutRecord, rollout_metrics
from lanpo.feedback.summarize import Candidate, check_summary, summarise
from lanpo.rollout import Completion
from lanpo.train.config import SummarizerConfig, load_config
from lanpo.train.sft.warm_start import lesson_for
from tests.train.conftest import tiny_config

GOOD = (
    "## Flow\nRead the terms left to right and keep a running total.\n"
    "## Principles\n- Add one term at a time.\n- Carry when a column passes nine.\n"
    "## Pitfalls\n- Skipping the carry.\n- Boxing an intermediate total instead of the last."
)

LESSONS = [
    GOOD,
    lesson_for("Step by step:\n18 + 47 = 65\nThe answer is \\boxed{65}.", random.Random(0)),  # an SFT target
    GOOD.replace("## ", "### "),  # a deeper heading level
    GOOD.replace("## ", "# ").replace("Flow", "FLOW").replace("Pitfalls", "pitfalls"),  # level 1, any case
    GOOD.replace("## Flow", "## Flow:").replace("## Principles", "## Principles:"),  # trailing colons
    GOOD.replace("## Flow", "## Flow of thought").replace("## Pitfalls", "## **Pitfalls**"),  # long name, bold
    "Here is the lesson.\n\n" + GOOD + "\n",  # a preamble before the first header
    "## Flow\n### Step 1\nWrite each operand.\n### Step 2\nCombine them in order.\n"
    "## Principles\nCheck each partial sum.\n## Pitfalls\nSign slips.",  # deeper sub-headings inside Flow
    GOOD.replace("\n## Principles", "\n\n## Principles ##"),  # a closing run of #
]

TEMPLATE_ECHOES = [
    "### Flow ### Principles ### Pitfalls ## Problem Write a lesson that helps on other problems",  # one line
    "## Flow\n## Principles\n## Pitfalls\n",  # the headers and nothing under them
    "## Flow\n(the flow of thought, in abstract steps)\n## Principles\n(transferable rules)\n"
    "## Pitfalls\n(mistakes to avoid)",  # the headers with the template's own hints
    prompts.SUMMARY.format(question="What is 4 + 5?", response="4 + 5 = 9. \\boxed{9}"),  # the whole prompt back
    "### Flow\n### Principles\n### Pitfalls\n## Problem\nWrite a lesson that helps on other, similar problems.",
    "## Flow\nDistil this into a lesson.\n## Principles\nDescribe the method.\n## Pitfalls\nDo not repeat numbers.",
]

NEAR_MISSES = [
    GOOD.replace("## Pitfalls", "## Mistakes"),  # a header missing (renamed)
    GOOD.split("## Pitfalls")[0],  # a header missing (cut off)
    GOOD.replace("## Principles", "Principles"),  # not a heading: plain text
    "## Flow: read the terms left to right and keep a running total.\n## Principles: one term at a time.\n"
    "## Pitfalls: skipping the carry.",  # text on the header's own line
    "## Flow\nKeep a running total of terms.\n## Principles\n\n## Pitfalls\nSkipping the carry step.",  # one empty
    "## Flow\nKeep a running total of terms.\n## Principles\nAdd.\n## Pitfalls\nSkipping the carry step.",  # 1 word
    "## Flow\n(the flow of thought, in abstract steps)\n## Principles\n(transferable rules)\n## Pitfalls\n"
    "(mistakes to avoid)\n\n## Flow\nKeep a running total.\n## Principles\nOne term at a time.\n"
    "## Pitfalls\nSkipping the carry.",  # the echo first, then a lesson: the echoed headers are empty
    "**Flow**\nKeep a running total.\n**Principles**\nOne term at a time.\n**Pitfalls**\nSkipping the carry.",
]


@pytest.mark.parametrize("text", LESSONS)
def test_lessons_have_the_format(text: str) -> None:
    assert prompts.has_summary_format(text), text
    assert check_summary(text).admitted == text.strip()


@pytest.mark.parametrize("text", TEMPLATE_ECHOES + NEAR_MISSES)
def test_template_echoes_and_near_misses_do_not(text: str) -> None:
    assert not prompts.has_summary_format(text), text
    checked = check_summary(text)
    assert checked.admitted is None and checked.rejected in ("short", "format") and not checked.format_ok
    kept = check_summary(text, require_format=False)  # today's rule: any 20+ characters
    assert kept.admitted == (text.strip() if len(text.strip()) >= summarize.MIN_SUMMARY_CHARS else None)


def test_sections_and_own_words() -> None:
    assert [name for name, _ in prompts.summary_sections(GOOD)] == ["flow", "principles", "pitfalls"]
    assert prompts.own_words("(mistakes to avoid) Write a lesson that helps") == []
    assert prompts.own_words("Skipping the carry") == ["skipping", "carry"]
    assert all(w in prompts.SUMMARY.lower() or w in prompts.SUMMARY_SYSTEM.lower() for w in prompts._PROMPT_WORDS)


def test_short_text_is_rejected_as_short_whatever_the_setting() -> None:
    for require in (True, False):
        checked = check_summary(" \x00 ## Flow\n", require)
        assert (checked.text, checked.rejected, checked.admitted) == ("## Flow", "short", None)


def test_the_setting_defaults_to_requiring_the_format_and_a_recipe_may_turn_it_off() -> None:
    assert SummarizerConfig().require_format is True
    recipe = Path(__file__).resolve().parents[2] / "train/configs/demo-cpu.toml"
    assert load_config(recipe).summarizer.require_format is True
    assert load_config(recipe, ["summarizer.require_format=false"]).summarizer.require_format is False


def _completion(text: str, prompt: str) -> Completion:
    """A scripted reply as the engine returns it: a token per word of the text and of the prompt."""
    return Completion(text, tuple(range(len(text.split()))), tuple(range(len(prompt.split()))), "stop")


class _Replies:
    """A generation backend that answers each prompt with the next of `texts` (round robin)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts, self.calls = list(texts), 0

    def generate(self, prompts_: list[str], n: int, params: Any) -> list[list[Any]]:
        out = []
        for prompt in prompts_:
            out.append([_completion(self.texts[self.calls % len(self.texts)], prompt)])
            self.calls += 1
        return out


def test_summarise_checks_every_generated_summary() -> None:
    tokenizer = SimpleNamespace(apply_chat_template=lambda messages, **_: "\n".join(m["content"] for m in messages))
    candidates = [
        Candidate(i, i, f"What is {i} + 1?", f"{i} + 1 = {i + 1}. \\boxed{{{i + 1}}}", 1.0) for i in range(3)
    ]
    backend = _Replies([GOOD, TEMPLATE_ECHOES[0], "tiny"])
    checked = summarise(backend, tokenizer, candidates, 16, 1.0, seed=0)
    assert [(s.format_ok, s.rejected) for s in checked] == [(True, None), (False, "format"), (False, "short")]
    assert [s.admitted for s in checked] == [GOOD, None, None]
    lenient = summarise(_Replies([GOOD, TEMPLATE_ECHOES[0], "tiny"]), tokenizer, candidates, 16, 1.0, 0, False)
    assert [s.admitted for s in lenient] == [GOOD, TEMPLATE_ECHOES[0], None]


def test_rollout_metrics_report_the_format_share_and_rejections() -> None:
    def rollout(summary: str | None, format_ok: bool | None, rejected: str | None) -> RolloutRecord:
        return RolloutRecord("r", 1.0, True, False, 4, False, summary, None, format_ok, rejected)

    rows = [
        GroupRecord(1, "zero_shot", "p", 3, [], [rollout(GOOD, True, None), rollout(None, False, "format")]),
        GroupRecord(2, "zero_shot", "p", 3, [], [rollout(None, False, "short"), rollout(None, None, None)]),
        GroupRecord(3, "zero_shot", "p", 3, [], [rollout("lenient echo", False, None), rollout(GOOD, True, None)]),
    ]
    metrics = rollout_metrics(rows)
    assert metrics["summary/generated"] == 5.0  # the rollout without a summary is not counted
    assert metrics["summary/format"] == pytest.approx(2 / 5)
    assert (metrics["summary/rejected/format"], metrics["summary/rejected/short"]) == (1.0, 1.0)
    assert metrics["pool/summaries"] == 3.0  # admitted: both lessons and the echo a lenient run let in
    nothing = rollout_metrics([GroupRecord(1, "zero_shot", "p", 3, [], [rollout(None, None, None)])])
    assert nothing["summary/generated"] == 0.0 and "summary/format" not in nothing  # no share of nothing


@pytest.mark.parametrize("require_format", [True, False])
def test_training_admits_only_lessons_and_records_the_metrics(
    db: Engine, toy_problems: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, require_format: bool
) -> None:
    """Two tiny steps whose summariser writes a lesson, then a template echo, in turn: with the format required the
    pool holds the lessons only, and every step's metrics (in the database too) count both."""
    from lanpo.train.loop import train

    replies = _Replies([GOOD, TEMPLATE_ECHOES[0]])
    real = summarize.summarise
    monkeypatch.setattr(
        "lanpo.feedback.summarize.summarise", lambda backend, tokenizer, *args: real(replies, tokenizer, *args)
    )
    summarizer = SummarizerConfig(min_reward=0.0, max_new_tokens=8, max_new_per_step=2, require_format=require_format)
    cfg = tiny_config(tmp_path, steps=2, summarizer=summarizer)
    result = train(cfg, db=db, progress=False)
    with db.connect() as conn:
        stored = conn.execute(
            sa.text(
                "SELECT e.step, v.summary FROM experiences e JOIN experience_versions v ON v.experience_id = e.id "
                "WHERE e.run_id = :r ORDER BY v.id"
            ),
            {"r": result.run_id},
        ).all()
        recorded = {
            (r.step, r.name): r.value
            for r in conn.execute(
                sa.text("SELECT step, name, value FROM run_metrics WHERE run_id = :r"), {"r": result.run_id}
            )
        }
    assert replies.calls == 3 * 2 * 2  # min_reward 0: every rollout of 3 problems x 2 is a candidate, 2 steps
    for step, metrics in zip((1, 2), result.metrics, strict=True):
        assert metrics["summary/generated"] == 6.0 and metrics["summary/format"] == pytest.approx(0.5)
        assert metrics["summary/rejected/format"] == (3.0 if require_format else 0.0)
        assert metrics["summary/rejected/short"] == 0.0
        assert metrics["pool/summaries"] == (3.0 if require_format else 6.0)
        for name in ("summary/generated", "summary/format", "summary/rejected/format", "pool/summaries"):
            assert recorded[(step, name)] == pytest.approx(metrics[name])
    texts = [summary for _, summary in stored]
    if require_format:
        assert texts == [GOOD] * 6  # 3 a step, both steps
    else:
        assert sorted(texts) == sorted([GOOD, TEMPLATE_ECHOES[0]] * 6)


REPEATS = [
    ("## Flow\nAdd the tens, then the units: 65 in all.\n## Principles\nCarry into tens.\n## Pitfalls\nLost carries.",
     "What is 18 + 47?", "65"),  # the final result
    ("## Flow\nStart from 18 and add the rest.\n## Principles\nCarry into tens.\n## Pitfalls\nLost carries.",
     "What is 18 + 47?", "65"),  # a two-digit number of the problem
    ("## Flow\nTake the larger away.\n## Principles\nKeep the sign: 3 below.\n## Pitfalls\nLost minus signs.",
     "What is 4 - 7?", "-3"),  # the answer without its sign
    ("## Flow\nHalve it: 0.5.\n## Principles\nExact fractions stay.\n## Pitfalls\nRounding too early.",
     "What is 3 / 6?", "1/2"),  # the same value written another way
]  # fmt: skip


@pytest.mark.parametrize(("text", "question", "answer"), REPEATS)
def test_a_summary_that_repeats_its_problem_is_refused(text: str, question: str, answer: str) -> None:
    assert prompts.has_summary_format(text)
    checked = check_summary(text, True, question, answer)
    assert (checked.rejected, checked.admitted, checked.format_ok) == ("repeats", None, True)
    assert check_summary(text, False, question, answer).rejected == "repeats"  # whatever the format setting
    assert check_summary(text).admitted == text  # without its problem nothing is repeated


def test_one_digit_numbers_of_the_problem_are_not_a_copy_but_its_answer_is() -> None:
    text = "## Flow\nStep 1: add.\n## Principles\nUse 2 columns.\n## Pitfalls\nLost carries again."
    assert check_summary(text, True, "What is 1 + 2 + 4?", "7").admitted == text
    assert check_summary(text, True, "What is 1 + 1?", "2").rejected == "repeats"


class _Recorder:
    """A backend that records each call and answers every prompt with `body` (cut at the call's stop strings)."""

    def __init__(self, body: str) -> None:
        self.body, self.calls = body, []

    def generate(self, prompts_: list[str], n: int, params: Any) -> list[list[Any]]:
        from lanpo.rollout import cut_at_stop

        self.calls.append((list(prompts_), params))
        return [[_completion(cut_at_stop(self.body, params.stop)[0], p)] for p in prompts_]


def test_a_scaffolded_summary_has_the_codes_headers_and_the_models_bodies() -> None:
    tokenizer = SimpleNamespace(apply_chat_template=lambda messages, **_: "\n".join(m["content"] for m in messages))
    candidates = [Candidate(i, i, f"What is {i} + 1?", f"{i} + 1 = {i + 1}. \\boxed{{{i + 1}}}", 1.0, str(i + 1))
                  for i in range(2)]  # fmt: skip
    backend = _Recorder("  carry the tens over  \n\n## Principles\nthe model's own header, cut off")
    checked = summarise(backend, tokenizer, candidates, 30, 0.7, seed=3, scaffold=True)
    assert len(backend.calls) == 3  # one batched call per section
    for number, (sent, params) in enumerate(backend.calls):
        header = prompts.SUMMARY_HEADERS[number]
        assert all(p.endswith(f"{header}\n") for p in sent) and len(sent) == 2
        assert params.stop == summarize.SECTION_STOP and params.max_new_tokens == 10 and params.seed == 3 + number
    # the second call continues the first: prompt, header, the body the model wrote, the next header
    assert backend.calls[1][0][0].endswith("## Flow\ncarry the tens over\n## Principles\n")
    expected = "## Flow\ncarry the tens over\n## Principles\ncarry the tens over\n## Pitfalls\ncarry the tens over"
    assert [s.text for s in checked] == [expected, expected] and all(s.format_ok for s in checked)
    assert [s.rejected for s in checked] == ["copied", "copied"]  # the same body under every header is a copy
    # what it cost: each section's generated tokens (the body, 4 words, cut at the stop), and every call's prompt,
    # which grows by the header and the body before it (the engine's own counts: a token per word here)
    assert [s.generated_tokens for s in checked] == [3 * 4, 3 * 4]
    assert [s.prompt_tokens for s in checked] == [sum(len(p[i].split()) for p, _ in backend.calls) for i in (0, 1)]
    # the same check decides: an echo of the prompt's hints under the code's headers is refused
    echo = summarise(_Recorder("(transferable rules)"), tokenizer, candidates, 30, 0.7, 3, scaffold=True)
    assert [s.rejected for s in echo] == ["format", "format"]
