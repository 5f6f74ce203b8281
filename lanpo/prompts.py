"""Prompt templates (our own words): zero-shot actor, intra-sample reflection, inter-sample exploration, summarizer.

Every template has a version string; the trainer stores it with each attempt / experience it produced, so a
changed wording is visible in the history. Messages are plain `[{"role", "content"}]` lists; the model's chat
template turns them into text (`lanpo.models.apply_chat`).

Leakage rules (tested with hypothesis in tests/test_prompts.py):
- the intra (reflection) prompt shows the model's earlier *responses* only. It takes objects with a `response`
  attribute and reads nothing else, so rewards, correctness and the gold answer cannot reach it; its wording
  never judges the earlier attempts (no "correct", "wrong", "reward", "score", "answer key").
- the inter prompt shows summaries of experiences from *other* problems (the store guarantees that); their
  relevance score is not shown either, the model judges relevance itself. Its raw variant (lanpo's own ablation,
  not a row of Table 2) shows those experiences' source responses instead of their summaries, still other problems'
  only.
- self-correction's second turn is the same conversation: the model's first answer as an assistant message, then
  a fixed reflection request as a user message. The request is one constant string that reads nothing of the
  first turn's grade, so a correct and a wrong first answer get the very same request.
- a context item cut to fit the prompt's token limit (`lanpo.feedback.contexts.fit_prompt`) shows a head and a
  tail of its own text with the fixed `OMITTED` marker between them, which names a token count and nothing else
  (`elided`); no other text is added to or taken from the item.

The one exception, by name: `LEAKED_VERSION` (the mode `leaked_intra`, `feedback.mode = "leaked-intra"`) is the
paper's Fig. 2b arm, built to show leakage: "We provided the correct answer to the same training problem during
rollouts, akin to rejection fine-tuning (RFT)" (Section 3). Its prompt is the reflection prompt over the same earlier
responses plus the problem's gold answer (`leaked_question`). Every leakage check skips it by that name and no other;
tests/feedback/test_fig2_leakage.py shows that every other setting's prompts never carry the gold answer and this
one's always do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

Message = dict[str, str]

ACTOR_VERSION = "actor-v1"
INTRA_VERSION = "intra-v1"
INTER_VERSION = "inter-v1"
INTER_RAW_VERSION = "inter-raw-v1"
LEAKED_VERSION = "intra-leaked-v1"  # Fig. 2b's arm: the intra prompt plus the gold answer; never a default
REFLECT_VERSION = "reflect-v1"  # the second turn of two-turn self-correction
SUMMARY_VERSION = "summary-v1"

# Fixed headers a feedback-mode response must carry (the +0.1 format bonus checks for them, paper 10.3).
INTRA_HEADERS = ("## Review", "## Solution")
INTER_HEADERS = ("## Relevance", "## Plan", "## Solution")
SUMMARY_HEADERS = ("## Flow", "## Principles", "## Pitfalls")

SYSTEM = "You are a careful math assistant. Think step by step and put the final answer in \\boxed{}."

ACTOR = "{question}\n\nSolve the problem step by step. End with the final answer as \\boxed{{N}}."

INTRA = (
    "{question}\n\n"
    "Here are earlier attempts at this problem, written by you:\n\n"
    "{context}\n\n"
    "Read the attempts step by step and look for slips in arithmetic or reasoning. Then solve the problem again.\n"
    "Write your answer under exactly these headers:\n"
    "## Review\n(what the attempts did, step by step, and what to do differently)\n"
    "## Solution\n(your own full solution, ending with \\boxed{{N}})"
)

INTER = (
    "{question}\n\n"
    "Here are lessons learned on other problems; some may not apply:\n\n"
    "{context}\n\n"
    "Decide which lessons apply to this problem, plan, then solve it.\n"
    "Write your answer under exactly these headers:\n"
    "## Relevance\n(which lessons apply and why)\n"
    "## Plan\n(the steps you will take)\n"
    "## Solution\n(the full solution, ending with \\boxed{{N}})"
)

INTER_RAW = (
    "{question}\n\n"
    "Here are solutions written earlier for other problems; some may not apply:\n\n"
    "{context}\n\n"
    "Decide which of them help with this problem, plan, then solve it.\n"
    "Write your answer under exactly these headers:\n"
    "## Relevance\n(which solutions help and why)\n"
    "## Plan\n(the steps you will take)\n"
    "## Solution\n(the full solution, ending with \\boxed{{N}})"
)

# Fig. 2b's leakage arm (LEAKED_VERSION): the problem's gold answer stated after its question, and the reflection
# prompt over the same earlier responses (none yet: the question, the answer and the request alone).
LEAKED_QUESTION = "{question}\n\nThe answer to this problem is {answer}."
LEAKED_INTRA = (
    "{question}\n\n"
    "{context}"
    "Work out a full solution that reaches this answer.\n"
    "Write your answer under exactly these headers:\n"
    "## Review\n(what the attempts did, step by step, and what to do differently)\n"
    "## Solution\n(your own full solution, ending with \\boxed{{N}})"
)

# Turn 2 of self-correction: a user message after the model's own first answer, in the same conversation.
REFLECT = (
    "Read your solution above again, step by step, and look for slips in arithmetic or reasoning. "
    "Then solve the problem again.\n"
    "Write your answer under exactly these headers:\n"
    "## Review\n(what your solution did, step by step, and what to do differently)\n"
    "## Solution\n(your own full solution, ending with \\boxed{N})"
)

SUMMARY = (
    "Problem:\n{question}\n\n"
    "A solution that worked:\n{response}\n\n"
    "Distil this into a lesson that helps on *other*, similar problems. Do not repeat this problem's numbers "
    "or its final result; describe the method.\n"
    "Write under exactly these headers:\n"
    "## Flow\n(the flow of thought, in abstract steps)\n"
    "## Principles\n(transferable rules)\n"
    "## Pitfalls\n(mistakes to avoid)"
)
SUMMARY_SYSTEM = "You write short, abstract lessons."

# Stands for the middle of a context item cut to fit the prompt: how many of the item's own tokens are left out.
OMITTED = "[... {n} tokens omitted ...]"

# Words that would reveal a judgement of an earlier attempt; the reflection template must contain none.
JUDGEMENT_WORDS = ("correct", "incorrect", "wrong", "right", "reward", "score", "gold", "answer key", "true", "false")


class HasResponse(Protocol):
    """What the reflection prompt may read from an earlier attempt: its text, nothing else."""

    @property
    def response(self) -> str: ...


class HasSummary(Protocol):
    """What the exploration prompt reads from an experience: its summary text."""

    @property
    def summary(self) -> str: ...


@dataclass(frozen=True)
class Attempt:
    """An earlier response as the reflection prompt reads it (SFT pairs and teacher requests build these)."""

    response: str


@dataclass(frozen=True)
class Lesson:
    """A lesson's text as the exploration prompt reads it."""

    summary: str


def format_intra(items: Sequence[HasResponse]) -> str:
    """Earlier attempts as numbered blocks: only their `response` text is read."""
    blocks = [f"### Attempt {i + 1}\n{item.response.strip()}" for i, item in enumerate(items)]
    return "\n\n".join(blocks)


def format_inter(items: Sequence[HasSummary], shows_response: bool = False) -> str:
    """Retrieved experiences as numbered lessons (or, `shows_response`, solutions): only their `summary` text is
    read."""
    label = "Solution" if shows_response else "Lesson"
    blocks = [f"### {label} {i + 1}\n{item.summary.strip()}" for i, item in enumerate(items)]
    return "\n\n".join(blocks)


def elided(head: str, omitted: int, tail: str) -> str:
    """A context item's text cut to fit: its `head`, the `OMITTED` marker on a line of its own, its `tail`."""
    return f"{head}\n{OMITTED.format(n=omitted)}\n{tail}"


def actor_messages(question: str) -> list[Message]:
    """Zero-shot actor prompt."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ACTOR.format(question=question)}]


def intra_messages(question: str, items: Sequence[HasResponse]) -> list[Message]:
    """Intra-sample reflection over the model's own earlier responses to `question`."""
    user = INTRA.format(question=question, context=format_intra(items))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def inter_messages(question: str, items: Sequence[HasSummary], shows_response: bool = False) -> list[Message]:
    """Inter-sample exploration with lessons from other problems (`shows_response`: their unsummarised solutions)."""
    context = format_inter(items, shows_response)
    user = (INTER_RAW if shows_response else INTER).format(question=question, context=context)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def leaked_question(question: str, answer: str) -> str:
    """Fig. 2b's arm alone (`LEAKED_VERSION`): `question` with its gold `answer` stated after it."""
    return LEAKED_QUESTION.format(question=question, answer=str(answer).strip())


def leaked_intra_messages(question: str, items: Sequence[HasResponse]) -> list[Message]:
    """Fig. 2b's leakage arm: `question` (already `leaked_question`, carrying the gold answer), the model's earlier
    responses to it as in `intra_messages` (none: no attempt block), then a request to solve towards the answer."""
    shown = f"Here are earlier attempts at this problem, written by you:\n\n{format_intra(items)}\n\n"
    attempts = shown if items else ""
    user = LEAKED_INTRA.format(question=question, context=attempts)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def self_correct_messages(question: str, first: HasResponse) -> list[Message]:
    """Two-turn self-correction: the zero-shot conversation, the model's first answer as its own assistant turn,
    then the fixed reflection request. Only `first.response` is read."""
    return [
        *actor_messages(question),
        {"role": "assistant", "content": first.response.strip()},
        {"role": "user", "content": REFLECT},
    ]


def summary_messages(question: str, response: str) -> list[Message]:
    """Summarizer prompt: a successful trajectory -> flow of thought, principles, pitfalls."""
    user = SUMMARY.format(question=question, response=response.strip())
    return [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": user}]


def has_headers(text: str, headers: Sequence[str]) -> bool:
    """True when every header starts a line of `text`, in the given order."""
    position = 0
    lines = text.splitlines()
    for header in headers:
        for i in range(position, len(lines)):
            if lines[i].strip().lower().startswith(header.lower()):
                position = i + 1
                break
        else:
            return False
    return True


# --------------------------------------------------------------------------- the summary's format
# A lesson has the summary template's three headers, each with words of the model's own under it. Tolerated, as a
# model writes them: any markdown heading level (# to ######), any case, bold markers, a trailing colon, a closing
# run of #, and "Flow of thought" for Flow. A header is a line of its own; its section runs to the next heading of
# the same or a higher level (a deeper one, "### Step 1" under "## Flow", stays inside it). A section needs at least
# SUMMARY_MIN_OWN_WORDS words of two or more letters or digits, outside its heading lines, that are not words of
# the summary prompt itself (instructions, placeholder hints, header names): a template echo, with headers and
# nothing under them or the prompt's own words under them, fails. Every occurrence of a header needs such words.

SUMMARY_MIN_OWN_WORDS = 2
_SUMMARY_NAMES = {"flow": "flow", "flow of thought": "flow", "principles": "principles", "pitfalls": "pitfalls"}
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]*(.*?)(?:[ \t]+#+)?[ \t]*$")
_WORD = re.compile(r"[a-z0-9]{2,}")
_PROMPT_WORDS = frozenset(_WORD.findall(f"{SUMMARY_SYSTEM}\n{SUMMARY.format(question='', response='')}".lower()))


def _summary_header(line: str) -> tuple[int, str | None] | None:
    """(heading level, summary section name or None) for a markdown heading line; None for any other line."""
    match = _HEADING.match(line)
    if match is None:
        return None
    title = re.sub(r"\s+", " ", match.group(2).strip("*_ \t").rstrip(":").strip("*_ \t")).lower()
    return len(match.group(1)), _SUMMARY_NAMES.get(title)


def summary_sections(text: str) -> list[tuple[str, str]]:
    """(section name, its text without heading lines) for every summary header of `text`, in order."""
    sections: list[tuple[str, int, list[str]]] = []
    open_section: tuple[str, int, list[str]] | None = None
    for line in text.splitlines():
        heading = _summary_header(line)
        if heading is not None:
            level, name = heading
            if open_section is not None and level <= open_section[1]:
                open_section = None  # a heading of the same or a higher level ends the section
            if name is not None:
                open_section = (name, level, [])
                sections.append(open_section)
            continue
        if open_section is not None:
            open_section[2].append(line)
    return [(name, "\n".join(lines).strip()) for name, _, lines in sections]


def own_words(section: str) -> list[str]:
    """The words of `section` that are not the summary prompt's own."""
    return [w for w in _WORD.findall(section.lower()) if w not in _PROMPT_WORDS]


def has_summary_format(text: str) -> bool:
    """True when `text` is a lesson: the three summary headers, each with words of its own under it."""
    sections = summary_sections(text)
    names = {name for name, _ in sections}
    return names == {"flow", "principles", "pitfalls"} and all(
        len(own_words(body)) >= SUMMARY_MIN_OWN_WORDS for _, body in sections
    )


# --------------------------------------------------------------------------- the summary prompt's own rule
# "Do not repeat this problem's numbers or its final result." A lesson repeats its problem when a number it writes
# has the value of the problem's final answer, or of a number of the question with two or more digits. A one-digit
# number of the question ("2 numbers", "step 1") is too common in an abstract lesson to count as a copy; the final
# answer counts whatever its size. Values, not strings: "0.50" repeats an answer of "1/2".

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+|/\d+)?")


def _value(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def repeated_numbers(text: str, question: str, answer: str | None) -> list[str]:
    """The numbers of `text` that repeat its problem: the final `answer`, or a number of `question` of 2+ digits."""
    wide = [n for n in _NUMBER.findall(question) if len(n.lstrip("-").split(".")[0].split("/")[0]) >= 2]
    values = [_value(n) for n in [*wide, *([answer] if answer is not None else [])]]
    banned = {abs(v) for v in values if v is not None}  # a sign a lesson drops still repeats the number
    return [n for n in _NUMBER.findall(text) if (v := _value(n)) is not None and abs(v) in banned]
