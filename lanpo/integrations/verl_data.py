"""A lanpo dataset as verl's RLHF parquet (`lanpo data export --format verl`), without importing verl.

verl's `RLHFDataset` (verl 0.9.1, `verl/utils/dataset/rl_dataset.py`) reads one row a prompt and keeps every column:
- `prompt` (`data.prompt_key`, default "prompt"): the chat messages, `[{"role", "content"}]`. Here they are lanpo's
  zero-shot prompt for the question (`feedback_modes.build_messages("zero_shot", ...)`, the messages lanpo's own
  trainer renders when a prompt gets no context), so that a row's prompt is the one lanpo's trainer would show,
  and lanpo's verl agent loop swaps in a contexted prompt only when `p_t` draws feedback for it;
- `data_source` (`data.reward_fn_key`, default "data_source"): "lanpo/<dataset>";
- `ability`: "math";
- `reward_model`: `{"style": "rule", "ground_truth": answer}`, which verl's reward managers read
  (`data_item.non_tensor_batch["reward_model"]["ground_truth"]`). It is a column of its own and reaches no prompt;
- `extra_info`: `{"problem_id", "dataset", "external_id", "index", "split"}`: `index` is verl's (it reads
  `extra_info.index` into the row's `index`), the rest name the store's problem, so that the agent loop can find
  its contexts and its write-back can name the problem.

Every problem of the dataset, by `problems.id`; the file appears only when it is whole (`lanpo.paths.atomic_path`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from lanpo import feedback_modes
from lanpo.errors import InputError
from lanpo.feedback.store import ProblemRow, dataset_problems
from lanpo.paths import atomic_path

ABILITY = "math"
REWARD_STYLE = "rule"  # verl's rule-based reward: the ground truth is compared with the response


def data_source(dataset: str) -> str:
    """verl's `data_source` of a lanpo dataset's rows (its reward managers dispatch on it)."""
    return f"lanpo/{dataset}"


def verl_row(problem: ProblemRow, index: int, split: str) -> dict[str, Any]:
    """One problem as verl's RLHFDataset reads a row. The gold answer goes to `reward_model` only."""
    if problem.answer is None:
        raise ValueError(f"problem {problem.id} has no gold answer")
    return {
        "data_source": data_source(problem.dataset),
        "prompt": feedback_modes.build_messages("zero_shot", problem.question),
        "ability": ABILITY,
        "reward_model": {"style": REWARD_STYLE, "ground_truth": problem.answer},
        "extra_info": {
            "problem_id": problem.id,
            "dataset": problem.dataset,
            "external_id": problem.external_id,
            "index": index,
            "split": split,
        },
    }


@dataclass(frozen=True)
class Exported:
    rows: int
    path: Path


def export_verl(db: Engine, dataset: str, out: Path, split: str = "train") -> Exported:
    """Write every problem of `dataset` to `out` as verl's RLHF parquet. InputError, with nothing written, for an
    unknown dataset or a problem without a gold answer (verl's reward needs one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    problems = dataset_problems(db, dataset)
    unanswered = [p.external_id for p in problems if p.answer is None]
    if unanswered:
        shown = ", ".join(unanswered[:10]) + (f" and {len(unanswered) - 10} more" if len(unanswered) > 10 else "")
        raise InputError(
            f"{len(unanswered)} problem(s) of {dataset!r} have no gold answer: {shown}",
            hint="verl's reward reads reward_model.ground_truth: import them with an answer (lanpo data import "
            "--update), or export a dataset whose problems all have one",
        )
    table = pa.Table.from_pylist([verl_row(p, i, split) for i, p in enumerate(problems)])
    with atomic_path(out) as staging:
        pq.write_table(table, staging)
    return Exported(len(problems), out)
