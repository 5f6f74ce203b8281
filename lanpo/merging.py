"""When a new lesson repeats an active one: the guard a near-duplicate must pass besides its cosine, and which text
the merge keeps. Pure: the store's writer (`lanpo.db.repo.lessons`) calls these on the candidates its pgvector
search returns.

A merge needs two things (`store.merge_threshold`, off by default):

1. Cosine similarity of the two lessons' all-MiniLM-L6-v2 embeddings at or above the threshold (ACE merges at 0.9,
   MemRL at 0.85). Only an active lesson of the SAME problem can take it: inter-sample feedback never shows a
   problem its own lessons (LANPO §3.2), and the store checks that by the lesson's problem, so a version written
   from problem B's rollout must not join a lesson of problem A.
2. The guard, `same_terms`: both texts name the same numbers and the same operations (and both or neither
   negate). Sentence embeddings barely see a changed number, a swapped operation or a "not": "add the tens first"
   and "subtract the tens first" embed at about 0.9. Those are the merges that would change what a lesson teaches,
   so they are refused whatever the cosine. A paraphrase that keeps the numbers and operations passes.

`keeps_new` decides the text: `newer` (default) always takes the new wording, since it was written by a later policy
from a fresh success and says the same thing; `higher_reward` takes it only when its source rollout scored strictly
higher than the current version's (a missing reward counts lowest), else the duplicate adds nothing but a count.
"""

from __future__ import annotations

import re

from lanpo.config import MERGE_KEEPS

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
# each word's concept: a lesson about adding is not a lesson about subtracting, however alike they embed
CONCEPTS: dict[str, tuple[str, ...]] = {
    "add": ("add", "adds", "added", "adding", "addition", "plus", "sum", "sums", "summing"),
    "subtract": ("subtract", "subtracts", "subtracted", "subtracting", "subtraction", "minus", "difference"),
    "multiply": ("multiply", "multiplies", "multiplied", "multiplying", "multiplication", "times", "product"),
    "divide": ("divide", "divides", "divided", "dividing", "division", "quotient", "ratio"),
    "power": ("power", "powers", "exponent", "exponents", "square", "squared", "cube", "cubed", "root"),
    "remainder": ("remainder", "modulo", "mod", "modulus"),
    "greater": ("greater", "larger", "more", "maximum", "max", "largest", "biggest"),
    "less": ("less", "smaller", "fewer", "minimum", "min", "smallest", "least"),
    "negation": ("not", "never", "no", "don't", "dont", "cannot", "can't", "without", "avoid"),
}
WORD_CONCEPT = {word: concept for concept, words in CONCEPTS.items() for word in words}


def terms(text: str) -> frozenset[str]:
    """The numbers (normalised: 3.0 is 3) and the operation concepts a text names."""
    numbers = {_number(match) for match in NUMBER.findall(text)}
    concepts = {WORD_CONCEPT[w] for w in WORD.findall(text.lower()) if w in WORD_CONCEPT}
    return frozenset(numbers | concepts)


def _number(raw: str) -> str:
    value = float(raw)
    return str(int(value)) if value.is_integer() else repr(value)


def same_terms(a: str, b: str) -> bool:
    """The guard: `a` and `b` name the same numbers and operation concepts (`terms`)."""
    return terms(a) == terms(b)


def same_text(a: str, b: str) -> bool:
    """Equal but for case and whitespace: a duplicate that would add a version identical to the current one."""
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def keeps_new(merge_keeps: str, new_reward: float | None, current_reward: float | None) -> bool:
    """Whether the merge writes the new text as the lesson's next version (`store.merge_keeps`)."""
    if merge_keeps not in MERGE_KEEPS:
        raise ValueError(f"merge_keeps must be one of {', '.join(MERGE_KEEPS)}, got {merge_keeps!r}")
    if merge_keeps == "newer":
        return True
    if new_reward is None:
        return False
    return current_reward is None or new_reward > current_reward
