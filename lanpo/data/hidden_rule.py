"""`hidden_rule`: a generated task where experience must transfer (a test of the mechanism, not a paper benchmark).

Each family is an imaginary land with its own rule for the operator `⊙`; a question names the land and asks for
`a ⊙ b` on small operands, never stating the rule: "In Zorvia, a ⊙ b is computed by the Zorvia rule. What is
7 ⊙ 4?". Solving one problem of a family tells what every other problem of that family needs, so an inter-sample
lesson ("In Zorvia, a ⊙ b = a * b") transfers to its neighbours, while a policy without experience must find each
family's rule from rewards alone. Every family uses the same symbol, so only the land's name tells which rule holds.

- Deterministic: item i of a split is family `i % families` (each family equally often), its operands drawn by
  `random.Random(split_seed(seed, split))` from that family's operand pairs of the split.
- Held out with the same families: each family's operand pairs (a, b in [min_operand, max_operand]) are split once,
  independently of the seed, a quarter (at least one) to `test`, the rest to `train`, so no question is in both
  splits for any two seeds; test problems need the very rule a train problem of their family revealed. Within a
  split a pair repeats only once the family's pairs of that split are used up.
- The rule is in no field a prompt reads: the question names the land only, and the record's metadata holds the
  family's name (`family`, for grouping in SQL: `metadata->>'family'`) and the operands, never the rule. No worked
  solution is given, so an SFT warm start cannot be built from these problems (`lanpo sft` says "no SFT pairs"):
  a run on them starts from another task's warm start (`model.init_adapter`, or `sft.data` pairs).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lanpo.errors import InputError

TASK = "hidden_rule"
SYMBOL = "⊙"
QUESTION = "In {land}, a {symbol} b is computed by the {land} rule. What is {a} {symbol} {b}?"
TEST_SHARE = 4  # one operand pair in TEST_SHARE (at least one per family) is held out


@dataclass(frozen=True)
class Family:
    name: str
    rule: str  # the formula in a and b, for hand-written lessons and tests; never in a question or its metadata
    apply: Callable[[int, int], int]


# One or two plain operations each, on one-digit operands: a model that can substitute into a stated rule can apply
# every one, and a guess of + or * is right for some lands by chance.
FAMILIES: tuple[Family, ...] = (
    Family("Zorvia", "a * b", lambda a, b: a * b),
    Family("Quellan", "a + b", lambda a, b: a + b),
    Family("Brimmor", "a + b + 1", lambda a, b: a + b + 1),
    Family("Tessaly", "a * b + 1", lambda a, b: a * b + 1),
    Family("Vornish", "a + b + 10", lambda a, b: a + b + 10),
    Family("Kelpa", "a - b", lambda a, b: a - b),  # negative when b > a
)
DEFAULTS: dict[str, int] = {"families": len(FAMILIES), "min_operand": 1, "max_operand": 9}


def _options(options: dict[str, Any] | None) -> tuple[int, int, int]:
    unknown = sorted(set(options or {}) - set(DEFAULTS))
    if unknown:
        raise InputError(f"unknown {TASK} option(s): {', '.join(unknown)}", hint=f"options: {', '.join(DEFAULTS)}")
    merged = {**DEFAULTS, **(options or {})}
    families, low, high = merged["families"], merged["min_operand"], merged["max_operand"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (families, low, high)):
        raise InputError(f"{TASK} options must be integers, got {merged}")
    if not 1 <= families <= len(FAMILIES):
        raise InputError(f"{TASK}: families must be between 1 and {len(FAMILIES)}, got {families}")
    if not 0 <= low < high:
        raise InputError(
            f"{TASK}: need 0 <= min_operand < max_operand, got {low} and {high}",
            hint="two operand values at least, so that each family has a train and a test pair",
        )
    return families, low, high


def split_pairs(family: Family, low: int, high: int, split: str) -> list[tuple[int, int]]:
    """Pure: `family`'s operand pairs of `split`; the two splits partition the pairs, whatever the seed."""
    pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    random.Random(f"{TASK}:{family.name}").shuffle(pairs)  # a fixed order per family (str seeds hash with sha512)
    held = max(1, len(pairs) // TEST_SHARE)
    return pairs[:held] if split == "test" else pairs[held:]


def question(family: Family, a: int, b: int) -> str:
    return QUESTION.format(land=family.name, symbol=SYMBOL, a=a, b=b)


def generate(n: int, seed: int, split: str, base_seed: int, options: dict[str, Any] | None) -> list[dict[str, Any]]:
    """`n` import records (the format of `lanpo.data.generate`), drawn with `random.Random(base_seed)`."""
    families, low, high = _options(options)
    rng = random.Random(base_seed)
    orders = {}
    for family in FAMILIES[:families]:
        pairs = split_pairs(family, low, high, split)
        orders[family.name] = rng.sample(pairs, len(pairs))
    records = []
    for index in range(n):
        family = FAMILIES[index % families]
        order = orders[family.name]
        a, b = order[(index // families) % len(order)]
        records.append(
            {
                "id": f"{TASK}-{split}-{seed}-{index}",
                "question": question(family, a, b),
                "answer": str(family.apply(a, b)),
                "task": TASK,
                "split": split,
                "seed": seed,
                "index": index,
                "family": family.name,
                "source": {"family": family.name, "a": a, "b": b},
            }
        )
    return records
