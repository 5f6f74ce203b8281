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


LESSON = (
    "## Flow\nSplit the problem into single operations and do them in order, one per line.\n"
    "## Principles\n- Write every intermediate result.\n"
    "## Pitfalls\n- Dropping a minus sign.\n- Leaving the final number unboxed."
)


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
    usable = [
        (p["question"], s)
        for p in problems
        if (s := worked_solution(p["question"], str(p["answer"]), p.get("metadata") or {})) is not None
    ]
    for number, (question, solution) in enumerate(usable):
        pairs.append({"messages": [*prompts.actor_messages(question), {"role": "assistant", "content": solution}]})
        if 0 <= skill_problems <= number:
            continue
        attempt = _slip(solution)
        review = "I recompute attempt 1 line by line and redo the calculation below."
        intra_user = prompts.intra_messages(question, [prompts.Attempt(attempt)])
        inter_user = prompts.inter_messages(question, [prompts.Lesson(LESSON)])
        plan = "Work out each operation on its own line, in order, then box the final number."
        for messages, reply in (
            (intra_user, f"## Review\n{review}\n## Solution\n{solution}"),
            (
                inter_user,
                f"## Relevance\nLesson 1 applies: it is the same kind of calculation.\n## Plan\n{plan}\n"
                f"## Solution\n{solution}",
            ),
            (prompts.summary_messages(question, solution), LESSON),
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
