"""MEL's templates (our own words, versioned like lanpo.prompts): the diagnosis and the replay; and the lesson a
diagnosis yields, parsed and cleaned.

- The **diagnosis** prompt sees the problem and both trajectories, split into numbered steps, and is told which
  one is correct: that is the method. It never sees a reward or the gold answer itself (only the correct
  attempt's own text). It answers under fixed headers: `## Bifurcation` (the first step of the incorrect attempt
  that goes astray, "Step K"), then the lesson: `## Mistake`, `## Principle`, `## Heuristic`.
- The **lesson** (the meta-experience, M) is the text from the first lesson header on. Every numeral in it is
  replaced by `N` (`mel.mask_numbers`, default on) and the gold answer's text is masked in any case, so that no
  value of the problem -- its result least of all -- reaches a replay prompt or, through the pool, an inter one.
- The **replay** prompt is the actor's prompt with the lesson as working memory. It reads the question and the
  lesson text, nothing else: no reward, no grade, no gold answer (tests/mel/test_prompts.py checks it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from lanpo.prompts import SYSTEM, Message, has_headers

DIAGNOSIS_VERSION = "mel-diagnosis-v1"
REPLAY_VERSION = "mel-replay-v1"

LESSON_HEADERS = ("## Mistake", "## Principle", "## Heuristic")
DIAGNOSIS_HEADERS = ("## Bifurcation", *LESSON_HEADERS)
MIN_LESSON_CHARS = 20
MASK = "N"

DIAGNOSIS_SYSTEM = "You compare two attempts at a problem and write short, general lessons."

DIAGNOSIS = (
    "Problem:\n{question}\n\n"
    "Two attempts at this problem, split into numbered steps. Attempt A is correct; attempt B is not.\n\n"
    "### Attempt A\n{positive}\n\n"
    "### Attempt B\n{negative}\n\n"
    "{locate}\n"
    "Write under exactly these headers:\n"
    "## Bifurcation\n(the first step of attempt B that goes astray, as: Step K)\n"
    "## Mistake\n(what went astray at that step, and what attempt A did instead)\n"
    "## Principle\n(the knowledge or rule behind it)\n"
    "## Heuristic\n(a check that helps on any problem with the same structure; no numbers from this problem)"
)
LOCATE_HINT = "The two attempts first differ at step {step} of attempt B; the step that goes astray is there or later."
LOCATE_GIVEN = "Attempt B goes astray at step {step}."

REPLAY = (
    "{question}\n\n"
    "A lesson from earlier work, to keep in mind:\n\n"
    "{lesson}\n\n"
    "Solve the problem step by step. End with the final answer as \\boxed{{N}}."
)

_NUMERAL = re.compile(r"\d+(?:[.,]\d+)*")
_INTEGER = re.compile(r"\d+")


@dataclass(frozen=True)
class Diagnosis:
    """What a diagnosis response says: the step it names (None: no valid one) and the raw lesson text."""

    step: int | None
    lesson: str


def numbered(steps: Sequence[str]) -> str:
    """Steps as the diagnosis prompt shows them: `[1] ...` one per line."""
    return "\n".join(f"[{i + 1}] {s}" for i, s in enumerate(steps)) or "[1] (empty)"


def diagnosis_messages(
    question: str, positive_steps: Sequence[str], negative_steps: Sequence[str], step: int, given: bool
) -> list[Message]:
    """The diagnosis prompt. `step`: the textual first difference, offered as a hint (`given` False: the model
    names the bifurcation) or stated as the bifurcation (`given` True: mel.locate = heuristic)."""
    locate = (LOCATE_GIVEN if given else LOCATE_HINT).format(step=step)
    user = DIAGNOSIS.format(
        question=question, positive=numbered(positive_steps), negative=numbered(negative_steps), locate=locate
    )
    return [{"role": "system", "content": DIAGNOSIS_SYSTEM}, {"role": "user", "content": user}]


def replay_messages(question: str, lesson: str) -> list[Message]:
    """The problem again, with a (cleaned) lesson as working memory; the answer format is the actor's."""
    user = REPLAY.format(question=question, lesson=lesson.strip())
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _header_at(line: str, headers: Sequence[str]) -> str | None:
    stripped = line.strip().lower()
    for header in headers:
        if stripped.startswith(header.lower()):
            return header
    return None


def parse_diagnosis(text: str, negative_steps: int) -> Diagnosis:
    """The step named under `## Bifurcation` (valid when 1 <= K <= `negative_steps`) and the lesson: the text from
    the first lesson header on; without one, whatever follows the line that names the step; without any header, all
    of it."""
    lines = text.replace("\x00", "").splitlines()
    heads = [i for i, line in enumerate(lines) if _header_at(line, DIAGNOSIS_HEADERS) is not None]
    first_lesson = next((i for i in heads if _header_at(lines[i], LESSON_HEADERS)), None)
    bifurcation = next((i for i in heads if _header_at(lines[i], DIAGNOSIS_HEADERS[:1])), None)
    step, lesson_from = None, 0
    if bifurcation is not None:
        lesson_from = bifurcation + 1
        end = next((i for i in heads if i > bifurcation), len(lines))
        for i in range(bifurcation, end):
            line = lines[i][len(DIAGNOSIS_HEADERS[0]) :] if i == bifurcation else lines[i]
            found = _INTEGER.search(line)
            if found is not None:
                step = int(found.group()) if 1 <= int(found.group()) <= negative_steps else None
                lesson_from = i + 1
                break
    lesson = lines[first_lesson if first_lesson is not None else lesson_from :]
    return Diagnosis(step, "\n".join(lesson).strip())


def mask_answer(text: str, answer: str | None) -> str:
    """`text` with every occurrence of the gold answer's text replaced by N (whole words where it starts or ends
    with a letter or digit)."""
    gold = (answer or "").strip()
    if not gold:
        return text
    pattern = re.escape(gold)
    if gold[0].isalnum():
        pattern = r"(?<![\w.])" + pattern
    if gold[-1].isalnum():
        pattern = pattern + r"(?![\w])"
    return re.sub(pattern, MASK, text, flags=re.IGNORECASE)


def clean_lesson(text: str, answer: str | None, mask_numbers: bool = True) -> str | None:
    """The meta-experience as stored, replayed and served: numerals masked (when asked), the gold answer masked;
    None when what is left is too short to be a lesson."""
    lesson = text.replace("\x00", "").strip()
    if mask_numbers:
        lesson = _NUMERAL.sub(MASK, lesson)
    lesson = mask_answer(lesson, answer).strip()
    return lesson if len(lesson) >= MIN_LESSON_CHARS else None


def has_lesson_headers(text: str) -> bool:
    """Whether a diagnosis carries every header, in order (the `mel/diagnosis/format` metric)."""
    return has_headers(text, DIAGNOSIS_HEADERS)
