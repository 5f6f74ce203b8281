"""Reward functions, plain and callable without the trainer: `reward(completions, **context) -> list[float | None]`.

Correctness is deliberately strict: only the content of the *last* `\\boxed{...}` in a completion is graded
(math-verify against the gold answer). math-verify on its own also accepts an unboxed trailing number, which
rewards wrong answers that merely end on the right digit and teaches nothing about the answer format; here an
unboxed answer earns 0. A grader that raises or times out gives 0.0 and a logged warning, never a crash.

Format bonus, by `reward.format_rule` (`FORMAT_RULES`):
- "paper" (the paper recipes): LANPO's rule, Table 6 "Correctness Reward Plus Format Reward" and appendix 10.3:
  "The model receives a +0.1 bonus if its generated text contains certain predefined headers". +0.1 when a
  feedback-mode (intra / inter) response carries its mode's headers, correct or not, boxed or not (Figure 6: "a 0.1
  bonus for responses that adhere to the correct format when language feedback is utilized").
- "correct_only" (the default and the CPU recipes): +0.1 when a feedback-mode response carries its mode's headers
  *and* ends in a boxed answer, paid only on top of a correct answer. A departure, listed in docs/papers.md. Both
  conditions were learnt the hard way on the CPU experiment (docs/log.md, "How the format bonus was gamed"),
  where feedback-prompt rollouts were almost all wrong, so that in their groups the bonus was the only reward
  spread and the std-normalised advantage turned its 0.1 points into a full unit:
  - paid for headers alone (the paper's rule), 28% of inter rollouts won it without a box, and zero-shot answers
    lost the box (0.74 boxed on held-out problems vs 0.99 for plain GRPO);
  - paid for headers and a box, the policy learnt to echo the prompt's template, "## Solution (your own full
    solution, ending with \\boxed{N})": 151 of 168 feedback rollouts of the last steps won the bonus, 1% correct.
  Paid only on correct answers, it ranks a correct answer in the asked format above a correct one without it and
  cannot create spread in a group where nothing is right.
`Graded.format_ok` is the rule's format condition (paper: the headers; correct_only: the headers and a box), so the
stored `format_ok` says which rollouts the rule paid for, given correctness under correct_only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from lanpo.feedback_modes import CONTEXT_MODES, required_headers
from lanpo.prompts import has_headers

log = logging.getLogger(__name__)

FORMAT_BONUS = 0.1  # Table 6; appendix 10.3: "a +0.1 bonus"
FORMAT_RULES = ("paper", "correct_only")  # reward.format_rule: see the module docstring
DEFAULT_FORMAT_RULE = "correct_only"
GRADER_TIMEOUT_S = 3


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces balanced), or None when there is none or it is unclosed."""
    start = text.rfind("\\boxed{")
    while start != -1:
        depth = 0
        i = start + len("\\boxed{")
        begin = i
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                if depth == 0:
                    inner = text[begin:i].strip()
                    return inner or None
                depth -= 1
            i += 1
        start = text.rfind("\\boxed{", 0, start)  # unclosed: try an earlier box
    return None


def _timeouts() -> int | None:
    # math-verify times out with signal.alarm, which only works on the main thread; elsewhere we pass None
    # (no timeout) rather than let it raise for every call.
    return GRADER_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def answers_match(predicted: str, gold: str) -> bool:
    """math-verify equivalence of a boxed prediction and the gold answer; raises on grader errors / timeouts."""
    from math_verify import parse, verify

    timeout = _timeouts()
    gold_parsed = parse(f"${gold}$", parsing_timeout=timeout, raise_on_error=True)  # type: ignore[arg-type]
    if not gold_parsed:
        gold_parsed = parse(gold, parsing_timeout=timeout, raise_on_error=True)  # type: ignore[arg-type]
    pred_parsed = parse(f"\\boxed{{{predicted}}}", parsing_timeout=timeout, raise_on_error=True)  # type: ignore[arg-type]
    if not gold_parsed or not pred_parsed:
        return predicted.strip() == gold.strip()
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout, raise_on_error=True))


def is_correct(completion: str, gold: str | None) -> bool:
    """Strict correctness of one completion: its last boxed answer equals `gold` (grader failure: False + warning)."""
    if gold is None:
        return False
    boxed = extract_boxed(completion)
    if boxed is None:
        return False
    try:
        return answers_match(boxed, gold)
    except Exception as exc:  # math-verify raises sympy errors, TimeoutException, ValueError...
        log.warning(
            "grader failed on %r vs gold %r (%s: %s): reward 0", boxed[:80], gold[:80], type(exc).__name__, exc
        )
        return False


def correctness_reward(
    completions: Sequence[str], answer: Sequence[str | None] | str | None, **_: object
) -> list[float]:
    """1.0 per completion whose boxed answer matches the gold `answer` (one per completion, or one for all)."""
    golds = [answer] * len(completions) if answer is None or isinstance(answer, str) else list(answer)
    if len(golds) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(golds)} answers")
    return [1.0 if is_correct(c, g) else 0.0 for c, g in zip(completions, golds, strict=True)]


def check_format_rule(rule: str) -> None:
    """ValueError unless `rule` is one of FORMAT_RULES."""
    if rule not in FORMAT_RULES:
        raise ValueError(f"unknown format rule {rule!r}: one of {', '.join(FORMAT_RULES)}")


def format_ok(completion: str, mode: str, rule: str = DEFAULT_FORMAT_RULE) -> bool:
    """True when a feedback-mode response is in its mode's format under `rule` (zero_shot, val, replay: never):
    paper: its mode's headers; correct_only: its mode's headers and a boxed answer."""
    check_format_rule(rule)
    if mode not in CONTEXT_MODES or not has_headers(completion, required_headers(mode)):
        return False
    return rule == "paper" or extract_boxed(completion) is not None


def format_bonus(correct: bool, formatted: bool, rule: str = DEFAULT_FORMAT_RULE) -> float:
    """The bonus part of a graded completion's reward: FORMAT_BONUS when it is in its mode's format, and under
    correct_only only when it is also correct."""
    check_format_rule(rule)
    return FORMAT_BONUS if formatted and (correct or rule == "paper") else 0.0


def reward_of(correct: bool, formatted: bool, rule: str = DEFAULT_FORMAT_RULE) -> float:
    """Total reward of one graded completion: 1 when correct, plus `format_bonus`."""
    return float(correct) + format_bonus(correct, formatted, rule)


def format_reward(
    completions: Sequence[str],
    mode: Sequence[str] | str,
    answer: Sequence[str | None] | str | None,
    format_rule: str = DEFAULT_FORMAT_RULE,
    **_: object,
) -> list[float]:
    """`format_bonus` per completion: with correctness_reward it sums to `reward_of`, as TRL sums reward functions.
    Under format_rule = "paper" the answer is not read (the bonus does not depend on it)."""
    modes = [mode] * len(completions) if isinstance(mode, str) else list(mode)
    correct = [0.0] * len(completions) if format_rule == "paper" else correctness_reward(completions, answer)
    return [
        format_bonus(c > 0, format_ok(text, m, format_rule), format_rule)
        for text, m, c in zip(completions, modes, correct, strict=True)
    ]


@dataclass(frozen=True)
class Graded:
    """One graded completion: total reward and its parts (what the attempts table stores)."""

    reward: float
    correct: bool
    format_ok: bool


def grade(
    completions: Sequence[str],
    answers: Sequence[str | None],
    modes: Sequence[str],
    format_rule: str = DEFAULT_FORMAT_RULE,
) -> list[Graded]:
    """Correctness + format bonus (under `format_rule`) for a batch of completions, one gold answer and mode each."""
    correct = correctness_reward(completions, answers)
    fmt = [format_ok(c, m, format_rule) for c, m in zip(completions, modes, strict=True)]
    return [
        Graded(reward=reward_of(c > 0, f, format_rule), correct=c > 0, format_ok=f)
        for c, f in zip(correct, fmt, strict=True)
    ]
