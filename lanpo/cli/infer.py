"""`lanpo infer`: answer questions from a JSONL file zero-shot, with retrieved experiences, or by self-correction.

Every option that is also a key of an eval config (`lanpo eval --keys`) takes its default and help from that
dataclass field (`RetrievalSettings`, `SamplingSettings`, `EvalConfig`), so that the two cannot drift apart.
"""

from __future__ import annotations

import re
import sys
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lanpo.cli.params import SEED, Float, Int, field_option
from lanpo.config import DTYPE_NAMES
from lanpo.inference.config import BACKENDS, INFERENCE_MODES, EvalConfig, RetrievalSettings, SamplingSettings
from lanpo.retrieval import STAGE1

if TYPE_CHECKING:
    from sqlalchemy import Engine as Database

    from lanpo.inference.answerer import Answerer, Solution
    from lanpo.inference.io import Question

MODE_CHOICES = [m.replace("_", "-") for m in INFERENCE_MODES] + list(INFERENCE_MODES)


@click.command("infer")
@field_option(EvalConfig, "model")
@click.option(
    "--adapter", type=click.Path(path_type=Path), help="PEFT LoRA adapter folder (e.g. a trainer checkpoint)."
)
@click.option("--mode", type=click.Choice(MODE_CHOICES), required=True, help="How to answer.")
@click.option(
    "--input",
    "input_path",
    type=click.Path(path_type=Path),
    required=True,
    help='JSONL questions: {"id"?, "question", "answer"?} per line.',
)
@click.option("--out", "out_path", type=click.Path(path_type=Path), required=True, help="JSONL answers to write.")
@click.option("--samples", default=1, show_default=True, type=Int(1), help="Samples per question (k).")
@field_option(RetrievalSettings, "stage1", type=click.Choice(STAGE1))
@field_option(RetrievalSettings, "top_k", type=Int(1))
@field_option(RetrievalSettings, "gamma", type=Float(0, 1))
@field_option(RetrievalSettings, "m", "--m", "m", type=Int(1))
@field_option(
    RetrievalSettings,
    "pool",
    "--pool",
    "pool_name",
    help="retrieval: the experience pool to read (default: the only pool in the store).",
)
@field_option(RetrievalSettings, "judge", old="--scorer")
@field_option(SamplingSettings, "max_new_tokens", type=Int(1))
@field_option(SamplingSettings, "temperature", type=Float(min=0))
@field_option(SamplingSettings, "top_p", type=Float(0, 1, min_open=True))
@field_option(SamplingSettings, "seed", type=SEED, help="Sampling seed.")
@field_option(EvalConfig, "batch_size", type=Int(1), help="Questions generated together.")
@field_option(EvalConfig, "backend", type=click.Choice(BACKENDS))
@click.option(
    "--vllm",
    "vllm_settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="A vLLM engine setting (lanpo.rollout.config.VLLMConfig), e.g. --vllm memory_fraction=0.3 (repeatable).",
)
@field_option(EvalConfig, "dtype", type=click.Choice(DTYPE_NAMES))
@field_option(EvalConfig, "device", help="torch device (default: cuda when available, else cpu).")
@click.option(
    "--dataset", default=None, help="Dataset the questions are stored under (default: infer-<input file stem>)."
)
@field_option(EvalConfig, "run_name", help="Name of the infer run in the store (default: infer-<UTC time>).")
@click.option(
    "--no-store",
    is_flag=True,
    help="Do not record the run in the database (zero-shot / self-correct only; retrieval still reads it).",
)
def command(
    model: str,
    adapter: Path | None,
    mode: str,
    input_path: Path,
    out_path: Path,
    samples: int,
    stage1: str,
    top_k: int,
    gamma: float,
    m: int,
    pool_name: str | None,
    judge: str,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    batch_size: int,
    backend: str,
    vllm_settings: tuple[str, ...],
    dtype: str,
    device: str | None,
    dataset: str | None,
    run_name: str | None,
    no_store: bool,
) -> None:
    """Answer the questions of --input and write one JSONL record per question to --out.

    \b
    Modes:
      zero-shot     the actor prompt
      retrieval     experiences retrieved from the current pool (stage 1 -> LLM rerank -> gamma -> top m) in the
                    inter-sample prompt; an empty pool, or nothing at gamma, answers zero-shot and says so
                    (stderr and the record's `fallback` field)
      self-correct  a two-turn chat: a first attempt, then (as the user's next message) a fixed, reward-agnostic
                    request to review it and solve again; both turns are kept
      self-correct-single  the same as one fresh prompt: the reflection prompt over the first attempt's text

    Answers are the last \\boxed{} of the final turn; records carry `correct` when the input has an `answer`.
    Unless --no-store, the questions become problems of --dataset and every turn an attempt of an `infer` run.
    """
    from lanpo.config import apply_overrides, from_mapping
    from lanpo.db.engine import connect
    from lanpo.inference.answerer import Answerer
    from lanpo.inference.config import normalise_mode
    from lanpo.inference.io import read_questions
    from lanpo.paths import output_file
    from lanpo.rollout.config import VLLMConfig

    mode = normalise_mode(mode)
    questions = read_questions(input_path)
    output_file(out_path, "--out")
    retrieval = RetrievalSettings(stage1=stage1, top_k=max(top_k, m), gamma=gamma, m=m, judge=judge, pool=pool_name)
    sampling = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    vllm = from_mapping(VLLMConfig, apply_overrides({}, list(vllm_settings)), prefix="vllm.")
    db = connect() if (mode == "retrieval" or not no_store) else None
    pool_id = _pool_id(db, pool_name) if mode == "retrieval" else None  # before the model loads, as every check
    run = None if no_store else _StoredRun.checked(db, questions, input_path, dataset, run_name, model, pool_id)
    answerer = Answerer(
        model, adapter, backend, dtype=dtype, device=device, sampling=sampling, retrieval=retrieval, db=db,
        batch_size=batch_size, vllm=vllm,
    )  # fmt: skip
    try:  # the vLLM engine runs in its own processes: end them however this ends
        if run is not None:
            config = {
                "mode": mode, "input": str(input_path), "samples": samples, "dataset": run.dataset,
                "adapter": str(adapter) if adapter else None, "backend": backend,
                "vllm": vllm.__dict__ if backend == "vllm" else None, "sampling": sampling.__dict__,
                "retrieval": retrieval.__dict__ if mode == "retrieval" else None,
            }  # fmt: skip
            questions = run.start(questions, config, answerer.adapter_sha256)
        solutions = _solve(answerer, questions, mode, samples, out_path, run)
        click.echo(_summary(solutions, out_path, samples, run), err=True)
    finally:
        answerer.close()


def _pool_id(db: Database | None, pool_name: str | None) -> int:
    """The id of the pool retrieval reads: an unknown or ambiguous name fails here, before any model loads."""
    from lanpo.db.engine import transaction
    from lanpo.db.repo.pools import resolve_pool

    with transaction(db) as session:
        return resolve_pool(session, pool_name).id


@dataclass
class _StoredRun:
    """The `infer` run that records the answers: its store, names, and ids once started."""

    db: Database
    dataset: str
    name: str
    model: str
    pool_id: int | None
    run_id: int | None = None
    version_id: int | None = None

    @classmethod
    def checked(
        cls,
        db: Database | None,
        questions: list[Question],
        input_path: Path,
        dataset: str | None,
        run_name: str | None,
        model: str,
        pool_id: int | None,
    ) -> _StoredRun:
        """The run to record, after a dry run of it: what the store refuses fails before the model loads."""
        from datetime import UTC, datetime

        from lanpo.db.engine import session_factory
        from lanpo.inference import store

        assert db is not None
        if dataset is None:
            dataset = "infer-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", input_path.stem).strip("-") or "input")
        name = run_name if run_name is not None else f"infer-{datetime.now(UTC):%Y%m%d-%H%M%S}"
        with session_factory(db)() as session:
            store.import_questions(session, dataset, questions)
            store.start_run(session, name, "infer", {}, model, None, pool_id=pool_id)
            session.rollback()
        return cls(db, dataset, name, model, pool_id)

    def start(self, questions: list[Question], config: dict[str, Any], adapter_sha256: str | None) -> list[Question]:
        """Store the questions as problems and start the run; the questions come back with their problem ids."""
        from lanpo.db.engine import transaction
        from lanpo.inference import store

        with transaction(self.db) as session:
            questions = store.import_questions(session, self.dataset, questions)
            self.run_id, self.version_id = store.start_run(
                session, self.name, "infer", config, self.model, adapter_sha256, pool_id=self.pool_id
            )
        return questions

    def lifecycle(self) -> AbstractContextManager[None]:
        """The run is marked failed if the body raises, finished if it returns."""
        from lanpo.db.repo.runs import run_lifecycle

        return run_lifecycle(self.db, self.run_id)

    def record(self, batch: list[Solution]) -> None:
        """Every turn of `batch` as an attempt of the run."""
        from lanpo.db.engine import transaction
        from lanpo.inference import store

        with transaction(self.db) as session:
            store.record_solutions(session, batch, self.run_id, self.version_id)


def _solve(
    answerer: Answerer, questions: list[Question], mode: str, samples: int, out_path: Path, run: _StoredRun | None
) -> list[Solution]:
    """Answer `questions` with a progress bar, recording each batch as it comes; the run is marked failed if this
    raises, finished otherwise."""
    from tqdm import tqdm

    from lanpo.inference.io import write_jsonl

    bar = tqdm(total=len(questions), unit="problem", desc=mode, file=sys.stderr, dynamic_ncols=True)

    def keep(batch: list[Solution]) -> None:
        if run is not None:
            run.record(batch)
        bar.update(len(batch))

    try:
        with run.lifecycle() if run is not None else nullcontext():
            solutions = answerer.solve(questions, mode, samples, on_batch=keep)
            write_jsonl(out_path, (s.to_record() for s in solutions))
    finally:
        bar.close()
    return solutions


def _summary(solutions: list[Solution], out_path: Path, samples: int, run: _StoredRun | None) -> str:
    """The closing line on stderr: answers written, mean@k over the graded ones, fallbacks, the run id."""
    graded = [s.mean_correct for s in solutions if s.mean_correct is not None]
    summary = f"wrote {len(solutions)} answers to {out_path}"
    if graded:
        summary += f"; mean@{samples} {100 * sum(graded) / len(graded):.1f}% over {len(graded)} graded question(s)"
    fallbacks = sum(1 for s in solutions if s.fallback)
    if fallbacks:
        summary += f"; {fallbacks} answered zero-shot (fallback)"
    if run is not None and run.run_id is not None:
        summary += f"; run id {run.run_id}"
    return summary
