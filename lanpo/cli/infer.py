"""`lanpo infer`: answer questions from a JSONL file zero-shot, with retrieved experiences, or by self-correction.

Every option that is also a key of an eval config (`lanpo eval --keys`) takes its default and help from that
dataclass field (`RetrievalSettings`, `SamplingSettings`, `EvalConfig`), so that the two cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lanpo.cli.params import SEED, VLLM_SETTINGS, Float, Int, field_option
from lanpo.config import DTYPE_NAMES, apply_overrides, from_mapping
from lanpo.db.repo.sampling import PRIORS, RANKS
from lanpo.inference.config import BACKENDS, INFERENCE_MODES, EvalConfig, RetrievalSettings, SamplingSettings
from lanpo.inference.io import read_questions, write_jsonl
from lanpo.inference.run import InferenceRun, answering, default_dataset, pool_id
from lanpo.paths import output_file
from lanpo.retrieval import STAGE1
from lanpo.rollout.config import VLLMConfig

if TYPE_CHECKING:
    from lanpo.inference.answerer import Solution

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
@field_option(RetrievalSettings, "rank", type=click.Choice(RANKS))
@field_option(RetrievalSettings, "value_bound", type=Float(-1, 1))
@field_option(RetrievalSettings, "prior", type=click.Choice(PRIORS))
@field_option(SamplingSettings, "max_new_tokens", type=Int(1))
@field_option(SamplingSettings, "temperature", type=Float(min=0))
@field_option(SamplingSettings, "top_p", type=Float(0, 1, min_open=True))
@field_option(SamplingSettings, "seed", type=SEED, help="Sampling seed.")
@field_option(EvalConfig, "batch_size", type=Int(1), help="Questions generated together.")
@field_option(EvalConfig, "backend", type=click.Choice(BACKENDS))
@VLLM_SETTINGS
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
    pool_name: str | None,
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
    **options: Any,  # RetrievalSettings' fields: stage1, top_k, gamma, m, judge, rank, value_bound, prior
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
    from lanpo.db.connection import connect
    from lanpo.inference.answerer import Answerer  # loads torch
    from lanpo.inference.config import normalise_mode

    mode = normalise_mode(mode)
    questions = read_questions(input_path)
    output_file(out_path, "--out")
    retrieval = RetrievalSettings(**{**options, "top_k": max(options["top_k"], options["m"])}, pool=pool_name)
    sampling = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    vllm = from_mapping(VLLMConfig, apply_overrides({}, list(vllm_settings)), prefix="vllm.")
    db = connect() if (mode == "retrieval" or not no_store) else None
    pool = pool_id(db, pool_name) if mode == "retrieval" else None  # before the model loads, as every check
    dataset = default_dataset(input_path) if dataset is None else dataset
    run = None  # checked by a dry run: what the store refuses fails before the model loads
    if not no_store:
        run = InferenceRun.check(db, run_name, "infer", model, pool_id=pool, dataset=dataset, questions=questions)
    answerer = Answerer(
        model,
        adapter,
        backend,
        dtype=dtype,
        device=device,
        sampling=sampling,
        retrieval=retrieval,
        db=db,
        batch_size=batch_size,
        vllm=vllm,
    )
    try:  # the vLLM engine runs in its own processes: end them however this ends
        if run is not None:
            config = _run_config(mode, input_path, samples, dataset, adapter, backend, vllm, sampling, retrieval)
            questions = run.open(config, answerer.adapter_sha256, questions)
        with answering(run, len(questions), mode) as (_, keep):  # failed if this raises, finished otherwise
            solutions = answerer.solve(questions, mode, samples, on_batch=keep)
            write_jsonl(out_path, (s.to_record() for s in solutions))
        click.echo(_summary(solutions, out_path, samples, run), err=True)
    finally:
        answerer.close()


def _run_config(
    mode: str,
    input_path: Path,
    samples: int,
    dataset: str,
    adapter: Path | None,
    backend: str,
    vllm: VLLMConfig,
    sampling: SamplingSettings,
    retrieval: RetrievalSettings,
) -> dict[str, Any]:
    """The infer run's config in the store: what made its answers."""
    return {
        "mode": mode,
        "input": str(input_path),
        "samples": samples,
        "dataset": dataset,
        "adapter": str(adapter) if adapter else None,
        "backend": backend,
        "vllm": vllm.__dict__ if backend == "vllm" else None,
        "sampling": sampling.__dict__,
        "retrieval": retrieval.__dict__ if mode == "retrieval" else None,
    }


def _summary(solutions: list[Solution], out_path: Path, samples: int, run: InferenceRun | None) -> str:
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
