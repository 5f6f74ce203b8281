"""Offline problems from reasoning-gym, in the JSONL import format.

`generate_problems(task, n, seed, split)` is what the trainer and `lanpo data gen` call. reasoning-gym
seeds item i of a dataset with `seed + i`, so the splits use disjoint seed ranges: train items come from
`base = seed * 2 * SPLIT_STRIDE`, test items from `base + SPLIT_STRIDE` (n must stay below the stride).
Each record: `{"id", "question", "answer", "task", "split", "seed", "index", "solution"?, "source": {...}}`,
where `solution` is the task's worked solution when it has one (gsm_symbolic's `answer_cot`, ending in
`#### N`) for the trainer's SFT warm start, and `source` keeps reasoning-gym's own metadata.

One task is lanpo's own, not reasoning-gym's: `hidden_rule` (`lanpo.data.hidden_rule`), where a lesson transfers
between problems of a family; it takes the same arguments and gives records of the same format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lanpo.data import hidden_rule
from lanpo.errors import InputError, listing
from lanpo.paths import atomic_write

SPLITS = ("train", "test")
SPLIT_STRIDE = 1 << 24  # items per split and seed; reasoning-gym seeds item i with seed + i
SOLUTION_KEYS = ("answer_cot", "solution", "cot", "rationale", "worked_solution")


def split_seed(seed: int, split: str) -> int:
    """Pure: the reasoning-gym base seed of `split` (train and test ranges never overlap)."""
    if split not in SPLITS:
        raise InputError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if seed < 0:
        raise InputError(f"seed must be >= 0, got {seed}")
    return seed * 2 * SPLIT_STRIDE + (SPLIT_STRIDE if split == "test" else 0)


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def generate_problems(
    task: str, n: int, seed: int = 0, split: str = "train", options: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """`n` problems of reasoning-gym `task` (or lanpo's `hidden_rule`) as import records (see the module docstring)."""
    if n < 1 or n >= SPLIT_STRIDE:
        raise InputError(f"n must be between 1 and {SPLIT_STRIDE - 1}, got {n}")
    base = split_seed(seed, split)
    if task == hidden_rule.TASK:
        return hidden_rule.generate(n, seed, split, base, options)
    import reasoning_gym

    known = sorted([*reasoning_gym.factory.DATASETS, hidden_rule.TASK])
    if task not in known:
        raise InputError(
            f"unknown reasoning-gym task {task!r}",
            hint=f"tasks include: {listing(known, 140)}",
        )
    try:
        dataset = reasoning_gym.create_dataset(task, size=n, seed=base, **(options or {}))
    except (TypeError, ValueError, AssertionError) as exc:
        raise InputError(
            f"reasoning-gym rejected the options for {task!r}: {exc}",
            hint="see the task's config class in reasoning-gym for its option names and ranges",
        ) from exc
    records = []
    for index in range(n):
        entry = dataset[index]
        metadata = dict(entry.get("metadata") or {})
        record: dict[str, Any] = {
            "id": f"{task}-{split}-{seed}-{index}",
            "question": entry["question"],
            "answer": str(entry["answer"]),
            "task": task,
            "split": split,
            "seed": seed,
            "index": index,
        }
        for key in SOLUTION_KEYS:
            if isinstance(metadata.get(key), str) and metadata[key].strip():
                record["solution"] = metadata[key]
                break
        record["source"] = _json_safe(metadata)
        records.append(record)
    return records


def write_jsonl(records: list[dict[str, Any]], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
