"""SFT data: chat pairs for the answer format and the three atomic skills, built from worked solutions.

Pairs are built from problems with a worked solution: reasoning-gym's `answer_cot` (`... #### N`, rewritten to
end in `\\boxed{N}`), or, for arithmetic tasks, steps derived from the expression (one operation per line).
Per problem: a zero-shot answer, an intra-sample reflection (review of an earlier attempt, then a solution,
under the intra headers), an inter-sample exploration (relevance, plan, solution) and a summary (flow,
principles, pitfalls). Pairs are stored as JSONL, one `{"messages": [...]}` a line. Pairs a teacher model
writes come from `lanpo.train.sft.teacher`; `lanpo.train.sft.warm_start` trains on either.
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from lanpo import prompts
from lanpo.data.jsonl import read_jsonl
from lanpo.errors import InputError
from lanpo.paths import atomic_write
from lanpo.train.config import TrainConfig

Message = dict[str, str]
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _fmt(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def expression_steps(expression: str) -> tuple[list[str], str] | None:
    """`4 - 1 + 7` -> (["4 - 1 = 3", "3 + 7 = 10"], "10"): one line per operation, precedence respected."""
    try:
        tree = ast.parse(expression.replace("×", "*").replace("÷", "/"), mode="eval").body
    except SyntaxError:
        return None
    steps: list[str] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return Fraction(node.value).limit_denominator()
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                value = left + right
            elif isinstance(node.op, ast.Sub):
                value = left - right
            elif isinstance(node.op, ast.Mult):
                value = left * right
            else:
                if right == 0:
                    raise ZeroDivisionError
                value = left / right
            steps.append(f"{_fmt(left)} {_OPS[type(node.op)]} {_fmt(right)} = {_fmt(value)}")
            return value
        raise ValueError(f"unsupported expression node {type(node).__name__}")

    try:
        result = walk(tree)
    except (ValueError, ZeroDivisionError):
        return None
    return steps, _fmt(result)


def worked_solution(question: str, answer: str, metadata: dict[str, Any]) -> str | None:
    """A step-by-step solution ending in `\\boxed{answer}`, or None when the problem has none to offer."""
    solution = metadata.get("solution")
    if isinstance(solution, str) and "####" in solution:
        body = solution.rsplit("####", 1)[0].strip()
        return f"{body}\nThe answer is \\boxed{{{answer}}}."
    expression = (metadata.get("source") or {}).get("expression") or metadata.get("expression")
    if isinstance(expression, str):
        derived = expression_steps(expression)
        if derived is not None and derived[1] == str(answer).strip():
            steps, result = derived
            return "Step by step:\n" + "\n".join(steps) + f"\nThe answer is \\boxed{{{result}}}."
    return None


# --------------------------------------------------------------------------- each problem's own lesson
# A summary pair's target is a lesson built from that problem's own worked solution, in the summary template's
# three sections, with no number of the problem in it (the summary prompt's rule, `lanpo.prompts.repeated_numbers`):
# the operations it used, in order, and what kind of step each was (a carry, a borrow, a sign change, the sizes of
# the operands); its principles follow from those kinds; its pitfalls name the slip `_slip` builds for the
# reflection pair (the last result off by one, the box left out) and the one each kind of step invites. The wording
# of each section is drawn from a few phrasings, and a lesson already given to another problem is drawn again, so
# no two problems get the same text. Bodies hold no blank line: a scaffolded summariser (`summarizer.scaffold`)
# ends a section there, and learns here where a section ends.

_STEP = re.compile(r"(-?\d+(?:\.\d+)?)\s*([-+*/×÷])\s*(-?\d+(?:\.\d+)?)\s*=\s*(-?\d+(?:\.\d+)?)")
_OP_WORDS = {
    "+": ("addition", "additions"),
    "-": ("subtraction", "subtractions"),
    "*": ("multiplication", "multiplications"),
    "/": ("division", "divisions"),
}
_COUNTS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
_SIZES = {1: "one-digit", 2: "two-digit", 3: "three-digit"}


def _steps_of(solution: str) -> list[tuple[str, Fraction, Fraction, Fraction]]:
    """The worked solution's operations `a op b = c`, in order (op normalised to + - * /)."""
    out = []
    for a, op, b, c in _STEP.findall(solution):
        op = {"×": "*", "÷": "/"}.get(op, op)
        out.append((op, Fraction(a), Fraction(b), Fraction(c)))
    return out


def _ops_phrase(ops: Sequence[str]) -> str:
    """["+", "+", "-"] -> "two additions, then one subtraction"."""
    runs: list[tuple[str, int]] = []
    for op in ops:
        if runs and runs[-1][0] == op:
            runs[-1] = (op, runs[-1][1] + 1)
        else:
            runs.append((op, 1))
    parts = []
    for op, count in runs:
        singular, plural = _OP_WORDS[op]
        parts.append(
            f"{'an' if singular[0] in 'aeiou' else 'a'} {singular}"
            if count == 1
            else f"{_COUNTS[min(count, 10)]} {plural}"
        )
    return ", then ".join(parts) if parts else "a chain of operations"


def _kinds(steps: Sequence[tuple[str, Fraction, Fraction, Fraction]]) -> list[str]:
    """What kind of step each operation was, as lesson keys: carry, borrow, negative, fraction, sizes-X-Y."""
    kinds: list[str] = []
    for op, a, b, c in steps:
        whole = a.denominator == b.denominator == 1
        if op == "+" and whole and a >= 0 and b >= 0 and (a.numerator % 10 + b.numerator % 10) >= 10:
            kinds.append("carry")
        if op == "-" and whole and a >= 0 and b >= 0 and 0 <= b <= a and a.numerator % 10 < b.numerator % 10:
            kinds.append("borrow")
        if c < 0 <= min(a, b) or (op == "-" and c < 0):
            kinds.append("negative")
        if c.denominator != 1:
            kinds.append("fraction")
    if steps:
        op, a, b, _ = steps[0]
        if a.denominator == b.denominator == 1:
            sizes = sorted({min(len(str(abs(a.numerator))), 3), min(len(str(abs(b.numerator))), 3)})
            kinds.append("sizes-" + "-".join(_SIZES[n] for n in sizes))
    return list(dict.fromkeys(kinds))


_FLOWS = (
    "Read the expression from left to right and do {ops}, each on a line of its own, then box the last value.",
    "Break the expression into {ops}; write each one out with its value before moving on, and box the last.",
    "Work through {ops} in the order written, one operation per line, and end with the last value boxed.",
    "Do {ops} one at a time, keeping every partial value on its own line; the last one is what gets boxed.",
)
_PRINCIPLES = {
    "carry": (
        "- When the units add up to ten or more, carry one into the tens.",
        "- A units sum of ten or more carries one to the next column.",
    ),
    "borrow": (
        "- When the units digit on top is smaller, borrow ten from the tens first.",
        "- Borrow from the tens whenever the units cannot be taken away directly.",
    ),
    "negative": (
        "- Taking a larger amount from a smaller one leaves a negative value: keep its minus sign.",
        "- A difference below zero keeps its minus sign through every later line.",
    ),
    "fraction": (
        "- Keep a division that does not come out even as an exact fraction.",
        "- Write an uneven quotient as a fraction, never a rounded decimal.",
    ),
}
_GENERAL = (
    "- Line the digits up by place value before combining them.",
    "- Recompute each line once before using its value in the next.",
    "- Keep the order of operations: multiply and divide before adding and subtracting.",
    "- Name every intermediate value so the next line can use it.",
)
_SIZE_PRINCIPLES = {
    "sizes-one-digit": "- With single digits the whole operation fits on one line.",
    "sizes-two-digit": "- With two-digit operands, settle the units first, then the tens.",
    "sizes-one-digit-two-digit": "- A two-digit and a single-digit operand: the digit lines up under the units.",
}
_PITFALLS = {
    "carry": ("- Forgetting the carried one in the tens.", "- Dropping the carry when the units overflow."),
    "borrow": (
        "- Taking the smaller units digit from the larger one instead of borrowing.",
        "- Borrowing but not lowering the tens digit.",
    ),
    "negative": ("- Losing the minus sign of a negative value.", "- Writing a negative difference as positive."),
    "fraction": ("- Rounding a fraction to a decimal.", "- Inverting the fraction of an uneven division."),
}
_SLIPS = (
    "- Writing the last value one off: recompute it before boxing.",
    "- An off-by-one slip in the final line; check it against the line before.",
    "- Stating the last value without checking it: a slip of one goes unnoticed.",
)
_UNBOXED = ("- Leaving the final value unboxed.", "- Ending without the box around the final value.")


def lesson_for(solution: str, rng: random.Random) -> str:
    """A lesson (## Flow / ## Principles / ## Pitfalls) of `solution`'s own method, with none of its numbers."""
    steps = _steps_of(solution)
    kinds = _kinds(steps)
    ops = _ops_phrase([op for op, *_ in steps])
    principles = [rng.choice(_PRINCIPLES[k]) for k in kinds if k in _PRINCIPLES]
    principles += [_SIZE_PRINCIPLES[k] for k in kinds if k in _SIZE_PRINCIPLES]
    principles.append(rng.choice(_GENERAL))
    pitfalls = [rng.choice(_PITFALLS[k]) for k in kinds if k in _PITFALLS]
    pitfalls += [rng.choice(_SLIPS), rng.choice(_UNBOXED)]
    return (
        f"## Flow\n{rng.choice(_FLOWS).format(ops=ops)}\n"
        f"## Principles\n" + "\n".join(principles) + "\n"
        "## Pitfalls\n" + "\n".join(pitfalls)
    )


def lessons_for(solutions: Sequence[str], seed: int = 0, tries: int = 64) -> list[str]:
    """One lesson per solution (`lesson_for`), no two the same: a repeat is drawn again (up to `tries` times),
    then told apart by the place of its problem in the set."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out = []
    for solution in solutions:
        for _ in range(tries):
            lesson = lesson_for(solution, rng)
            if lesson not in seen:
                break
        else:
            lesson += f"\n- Another {rng.choice(('slip', 'trap', 'mistake'))}: skipping the check of any line."
        seen.add(lesson)
        out.append(lesson)
    return out


def _relevance(own: str, other: str) -> str:
    """The exploration pair's relevance line: does the other problem's lesson name this one's operations?"""
    mine, theirs = _ops_phrase([op for op, *_ in _steps_of(own)]), _ops_phrase([op for op, *_ in _steps_of(other)])
    if mine == theirs:
        return f"Lesson 1 applies: it is the same kind of calculation, {mine}."
    return f"Lesson 1 is about {theirs} and this one needs {mine}: only its general advice applies."


def _slip(solution: str) -> str:
    """An earlier attempt with a slip: the last intermediate number off by one, and no box."""
    numbers = list(re.finditer(r"-?\d+", solution.split("The answer is")[0]))
    text = solution.split("The answer is")[0].rstrip()
    if numbers:
        last = numbers[-1]
        text = text[: last.start()] + str(int(last.group()) + 1) + text[last.end() :]
    return text + "\nSo the result is " + (str(int(numbers[-1].group()) + 1) if numbers else "unclear") + "."


def sft_pairs(
    problems: Sequence[dict[str, Any]], seed: int = 0, skill_problems: int = -1
) -> list[dict[str, list[Message]]]:
    """Chat pairs `{"messages": [...]}` from problems `{"question", "answer", "metadata"}` (see the docstring).

    Every usable problem gives a zero-shot pair; the first `skill_problems` (-1: all) also give the reflection,
    exploration and summary pairs.
    """
    rng = random.Random(seed)
    pairs: list[dict[str, list[Message]]] = []
    usable = list(  # one pair set per question: a question drawn twice would get two targets
        {
            p["question"]: s
            for p in problems
            if (s := worked_solution(p["question"], str(p["answer"]), p.get("metadata") or {})) is not None
        }.items()
    )
    skilled = usable if skill_problems < 0 else usable[:skill_problems]
    lessons = lessons_for([solution for _, solution in skilled], seed)
    for number, (question, solution) in enumerate(usable):
        pairs.append({"messages": [*prompts.actor_messages(question), {"role": "assistant", "content": solution}]})
        if number >= len(skilled):
            continue
        attempt = _slip(solution)
        review = "I recompute attempt 1 line by line and redo the calculation below."
        intra_user = prompts.intra_messages(question, [prompts.Attempt(attempt)])
        # the exploration pair shows another problem's lesson, as the store would (never this problem's own)
        other = (number + 1) % len(usable)
        other_solution = usable[other][1]
        shown = lessons[other] if other < len(skilled) else lessons_for([other_solution], seed + 1)[0]
        inter_user = prompts.inter_messages(question, [prompts.Lesson(shown)])
        plan = "Work out each operation on its own line, in order, then box the final number."
        for messages, reply in (
            (intra_user, f"## Review\n{review}\n## Solution\n{solution}"),
            (
                inter_user,
                f"## Relevance\n{_relevance(solution, other_solution)}\n## Plan\n{plan}\n## Solution\n{solution}",
            ),
            (prompts.summary_messages(question, solution), lessons[number]),
        ):
            pairs.append({"messages": [*messages, {"role": "assistant", "content": reply}]})
    rng.shuffle(pairs)
    return pairs


def read_pairs(path: str | Path) -> list[dict[str, list[Message]]]:
    """Chat pairs from JSONL: one `{"messages": [{"role", "content"}, ...]}` per line, ending with the assistant."""
    out = []
    for number, obj in read_jsonl(path, "SFT data"):
        messages = obj.get("messages")
        ok = isinstance(messages, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
        if not ok or not messages or messages[-1]["role"] != "assistant":
            raise InputError(
                f'{path}:{number}: expected {{"messages": [...]}} ending with an assistant message',
                hint="build pairs with `lanpo sft --config C --write-data pairs.jsonl`",
            )
        out.append({"messages": messages})
    if not out:
        raise InputError(f"{path} holds no SFT pairs", hint='one {"messages": [...]} per line')
    return out


def write_pairs(pairs: Sequence[dict[str, list[Message]]], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:
        for pair in pairs:
            handle.write(json.dumps(pair, ensure_ascii=False) + "\n")


def problems_for_sft(cfg: TrainConfig) -> list[dict[str, Any]]:
    """Problems for the warm start: `cfg.data.task` from reasoning-gym, on a seed range apart from training's."""
    if not cfg.data.task:
        raise InputError("no SFT data: pass --data FILE.jsonl or set data.task to build pairs from reasoning-gym")
    from lanpo.data.generate import generate_problems

    records = generate_problems(
        cfg.data.task, n=cfg.sft.n_problems, seed=cfg.data.seed + 1000 + cfg.sft.seed, options=cfg.data.task_options
    )
    return [{"question": r["question"], "answer": r["answer"], "metadata": r} for r in records]
