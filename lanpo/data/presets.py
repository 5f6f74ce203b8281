"""`lanpo data import FILE --preset NAME`: the paper's benchmarks in their published layouts (parquet, JSONL, JSON).

Each preset knows its dataset's field names and answer format (as the datasets are published on the Hugging Face
hub and read by verl's and the Qwen2.5-Math evaluation's loaders):

- dapo17k: BytedTsinghua-SIA/DAPO-Math-17k's parquet (verl's layout: the question in `prompt[0].content` inside
  DAPO's wrapper, the answer in `reward_model.ground_truth`, the id in `extra_info.index`), or
  open-r1/DAPO-Math-17k-Processed (the bare problem in `prompt`, the answer in `solution`);
- math500: HuggingFaceH4/MATH-500's `test.jsonl` (`problem`, `answer`, id `unique_id`);
- aime24: HuggingFaceH4/aime_2024, Maxwell-Jia/AIME_2024, math-ai/aime24 (`problem` / `Problem`, `answer` /
  `Answer`, `id` / `ID`);
- aime25: yentinglin/aime_2025, math-ai/aime25, opencompass/AIME2025 (`problem` / `question`, `answer`);
- amc23: zwhe99/amc23, math-ai/amc23 (`question`, and answers published as floats: 27.0);
- olympiadbench: Hothan/OlympiadBench (OE_TO_maths_en_COMP) and the Qwen2.5-Math evaluation's copy (`question`,
  after its `context` when set; the answer is `final_answer[0]` without its `$...$`, as that evaluation reads it).

Answers are stored as math-verify reads them at grading time (`lanpo.rewards.answers_match`): whitespace and
surrounding `$` removed, an integral float written as an integer. A row whose gold answer math-verify cannot
parse is refused and listed (row number and reason), and nothing is imported unless `--skip-bad`, as for any
bad line. DAPO-Math-17k's published parquet holds each problem about 100 times: copies with the same question and
answer fold into the first; the same question with another answer is listed as a conflict.

DAPO's prompts ask for a final `Answer:` line, which conflicts with lanpo's `\\boxed{}` templates: the preset
imports the bare problem (the wrapper's first paragraph and its closing reminder are cut) and lanpo applies its
own templates.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from lanpo.data.importer import BadLine, ImportReport, store_problems
from lanpo.data.jsonl import read_jsonl, read_text
from lanpo.db.repo import checks
from lanpo.db.repo.problems import Question
from lanpo.errors import InputError
from lanpo.paths import input_file

DAPO_HEAD = "Solve the following math problem step by step."
DAPO_TAIL = 'Remember to put your answer on its own line after "Answer:"'

Row = dict[str, Any]


def _parquet_rows(path: Path) -> Iterator[Row]:
    """A parquet file's rows, one record batch at a time (DAPO's published file holds 1.79 M rows)."""
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=8192)
        for batch in batches:
            yield from batch.to_pylist()
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError...
        raise InputError(f"{path} is not a readable parquet file: {exc}") from exc


def read_rows(path: str | Path) -> Iterable[Row]:
    """The rows of a parquet (streamed), JSONL or JSON (a list, or {"data": [...]}) file, as dicts."""
    path = input_file(path, "dataset file")
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    if path.suffix != ".json":
        return [row for _, row in read_jsonl(path, "dataset file")]
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from exc
    data = data.get("data", data) if isinstance(data, dict) else data
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise InputError(f"{path}: expected a list of objects", hint='or {"data": [...]}, or JSONL')
    return data


def _first(row: Row, *keys: str) -> Any:
    for key in keys:
        if row.get(key) is not None:
            return row[key]
    raise InputError(f"none of the fields {', '.join(keys)} is present (fields: {', '.join(sorted(row))})")


def strip_dapo_wrapper(text: str) -> str:
    """DAPO's instruction wrapper (first paragraph: "Solve ... Answer: $Answer ..."; last: the reminder) removed."""
    text = text.strip()
    if text.startswith(DAPO_HEAD):
        _, sep, rest = text.partition("\n\n")
        text = rest if sep else text
    if DAPO_TAIL in text:
        text = text.split(DAPO_TAIL, 1)[0]
    return text.strip()


def _dapo_question(row: Row) -> str:
    prompt = _first(row, "prompt", "problem", "question")
    if isinstance(prompt, list):  # verl layout: [{"role": "user", "content": ...}]
        prompt = "\n\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict) and m.get("content"))
    return strip_dapo_wrapper(str(prompt))


def _dapo_answer(row: Row) -> Any:
    reward = row.get("reward_model")
    if isinstance(reward, dict) and reward.get("ground_truth") is not None:
        return reward["ground_truth"]
    return _first(row, "solution", "answer")


def _dapo_id(row: Row) -> Any:
    extra = row.get("extra_info")
    if isinstance(extra, dict) and extra.get("index") is not None:
        return extra["index"]
    return None


def _olympiad_question(row: Row) -> str:
    question = str(_first(row, "question", "problem"))
    context = row.get("context")
    return f"{context.strip()}\n\n{question}" if isinstance(context, str) and context.strip() else question


def _olympiad_answer(row: Row) -> Any:
    final = _first(row, "final_answer", "answer")
    if isinstance(final, list):
        if not final:
            raise InputError("final_answer is an empty list")
        return final[0]  # as the Qwen2.5-Math evaluation reads it
    return final


@dataclass(frozen=True)
class Preset:
    name: str
    question: Callable[[Row], str]
    answer: Callable[[Row], Any]
    external_id: Callable[[Row], Any]
    fold_duplicates: bool = False  # identical (question, answer) rows are one problem (DAPO's ~100x copies)


def _plain(*question_keys: str) -> Callable[[Row], str]:
    return lambda row: str(_first(row, *question_keys))


def _ids(*keys: str) -> Callable[[Row], Any]:
    return lambda row: next((row[k] for k in keys if row.get(k) is not None), None)


PRESETS: dict[str, Preset] = {
    "dapo17k": Preset("dapo17k", _dapo_question, _dapo_answer, _dapo_id, fold_duplicates=True),
    "math500": Preset(
        "math500", _plain("problem", "question"), lambda r: _first(r, "answer"), _ids("unique_id", "id")
    ),
    "aime24": Preset(
        "aime24", _plain("problem", "Problem", "question"), lambda r: _first(r, "answer", "Answer"), _ids("id", "ID")
    ),
    "aime25": Preset(
        "aime25", _plain("problem", "question", "Problem"), lambda r: _first(r, "answer", "Answer"), _ids("id", "ID")
    ),
    "amc23": Preset("amc23", _plain("question", "problem"), lambda r: _first(r, "answer"), _ids("id")),
    "olympiadbench": Preset("olympiadbench", _olympiad_question, _olympiad_answer, _ids("id")),
}


def normalise_answer(value: Any) -> str:
    """The gold answer as stored: a string, surrounding `$` and whitespace removed, 27.0 written 27."""
    if isinstance(value, bool):
        raise InputError(f"the answer is a boolean ({value})")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(f"the answer is {value}")
        value = int(value) if value.is_integer() else value
    if isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str):
        raise InputError(f"the answer is a {type(value).__name__}, not text or a number")
    text = value.strip()
    while len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    if not text:
        raise InputError("the answer is empty")
    return text


def gold_parses(answer: str) -> bool:
    """True when math-verify parses `answer` into a mathematical object, read as the grader reads it (`$answer$`,
    else the bare text). math-verify hands back the bare string when it cannot (`\\frac{`): that is refused."""
    import logging

    from math_verify import parse

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its note that no timeout is set, once per call
    try:
        for text in (f"${answer}$", answer):
            if any(not isinstance(item, str) for item in parse(text, parsing_timeout=None)):
                return True
    except Exception:  # math-verify raises from sympy on malformed LaTeX
        return False
    return False


def _json_safe(row: Row, used: set[str]) -> dict[str, Any]:
    return json.loads(json.dumps({k: v for k, v in row.items() if k not in used}, default=str))


def rows_to_problems(
    preset: Preset, rows: Iterable[Row]
) -> tuple[list[tuple[int, Question]], list[BadLine], int, int]:
    """(good (row number, problem) pairs, bad rows, duplicates folded, rows read). Row numbers count from 1."""
    good: list[tuple[int, Question]] = []
    bad: list[BadLine] = []
    seen_question: dict[str, tuple[int, str]] = {}  # question -> (row, answer) of its first row
    seen_id: dict[str, int] = {}
    folded = number = 0
    for number, row in enumerate(rows, start=1):
        try:
            question = preset.question(row).strip()
            if not question:
                raise InputError("the question is empty")
            answer = normalise_answer(preset.answer(row))
            raw_id = preset.external_id(row)
            external_id = str(raw_id).strip() if raw_id is not None and str(raw_id).strip() else str(number - 1)
            for what, value in (("id", external_id), ("question", question), ("answer", answer)):
                if "\x00" in value:
                    raise InputError(f"{what} contains a NUL byte (\\x00), which Postgres cannot store")
                checks.check_size(value, what)
        except InputError as exc:
            bad.append(BadLine(number, exc.message))
            continue
        if preset.fold_duplicates and question in seen_question:
            first_row, first_answer = seen_question[question]
            if first_answer == answer:
                folded += 1
            else:
                bad.append(
                    BadLine(
                        number,
                        f"same question as row {first_row} with another answer ({answer!r} vs {first_answer!r})",
                    )
                )
            continue
        if not gold_parses(answer):
            bad.append(BadLine(number, f"math-verify cannot parse the gold answer {answer!r}"))
            continue
        if external_id in seen_id:
            bad.append(BadLine(number, f"duplicate id {external_id!r} (first on row {seen_id[external_id]})"))
            continue
        seen_question.setdefault(question, (number, answer))
        seen_id[external_id] = number
        wrapper = {"prompt"} if preset.name == "dapo17k" else set()  # its instruction wrapper is not kept
        metadata = {"preset": preset.name, "source": _json_safe(row, wrapper)}
        good.append((number, Question(external_id, question, answer, metadata)))
    return good, bad, folded, number


def import_preset(
    session: Session,
    path: str | Path,
    preset: str,
    dataset: str | None = None,
    skip_bad: bool = False,
    update: bool = False,
) -> tuple[ImportReport, int]:
    """Import FILE in `preset`'s layout into `dataset` (default: the preset's name), all or nothing;
    returns the report (bad rows listed by row number) and how many duplicate rows were folded."""
    if preset not in PRESETS:
        raise InputError(f"unknown preset {preset!r}", hint=f"presets: {', '.join(PRESETS)}")
    good, bad, folded, count = rows_to_problems(PRESETS[preset], read_rows(path))
    if not count:
        raise InputError(f"{path} holds no problems", hint="is this the dataset's file?")
    report = ImportReport(lines=count, bad=bad)
    return store_problems(session, report, good, dataset or preset, skip_bad, update), folded
