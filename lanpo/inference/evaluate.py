"""`lanpo eval`: datasets x modes x k samples -> a mean@k table shaped like the paper's Table 1.

With `[[methods]]` the table takes Table 2's shape: rows are training method x test-time mode (e.g. "GRPO x
Retrieval" = GRPO + test-time retrieval). Each method is evaluated as its own eval run `<run_name>-<method>`
(its own policy, its own pool for retrieval) and the combined table is recounted from those runs.

One eval run in the store holds every attempt (each batch of questions in its own transaction, so an
interrupted evaluation keeps what it finished); its metrics hold each cell (`mean@k/<mode>/<dataset>`), the
first-turn accuracy of self-correction (`first_turn/<dataset>`) and how many retrieval questions fell back to
zero-shot (`retrieval_fallbacks/<dataset>`). The printed table is recounted from the stored attempts, so what
you read is what the database says.

A second table gives MEL's metrics: Avg@k (= mean@k) and Pass@k (`pass@k/<mode>/<dataset>`: problems with a
correct sample) at the sampling temperature, and with `pass_at_1 = true` Pass@1 at temperature 0
(`pass@1/<mode>/<dataset>`): every question answered once more, greedily, in its own eval run `<name>-greedy`
(recounted from its attempts as mean@1). It goes to `pass.md`; table.csv carries both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lanpo.config import lanpo_home, to_mapping
from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question
from lanpo.errors import InputError
from lanpo.inference import store
from lanpo.inference.answerer import Answerer
from lanpo.inference.config import EvalConfig
from lanpo.inference.io import read_questions
from lanpo.inference.results import Solution
from lanpo.inference.run import InferenceRun, answering, default_name, pool_id
from lanpo.inference.table import Table, mean_at_k, pass_markdown, recount
from lanpo.paths import atomic_write, output_dir


@dataclass
class EvalResult:
    run_id: int
    run_name: str
    table: Table  # recounted from the stored attempts
    computed: Table  # from the solutions in memory (equal to `table`; tests check it)
    markdown_path: Path
    csv_path: Path
    seconds: float
    problems_per_second: float
    greedy: Table | None = None  # Pass@1: the greedy pass's mean@1 (pass_at_1 = true)
    pass_path: Path | None = None  # pass.md: Pass@1 / Avg@k / Pass@k


def build_answerer(config: EvalConfig, db: Any) -> Answerer:
    """The answerer `config` describes (its model loaded), reading retrieval's pool from `db`."""
    from lanpo.models import set_threads

    set_threads(config.threads)
    return Answerer(
        config.model,
        config.adapter,
        config.backend,
        dtype=config.dtype,
        device=config.device,
        sampling=config.sampling,
        retrieval=config.retrieval,
        db=db,
        batch_size=config.batch_size,
        vllm=config.vllm,
    )


def load_questions(db: Any, config: EvalConfig, config_dir: Path) -> dict[str, list[Question]]:
    """Each dataset's questions (importing `file` datasets first), with their problem ids."""
    out: dict[str, list[Question]] = {}
    with transaction(db) as session:
        for spec in config.datasets:
            if spec.file is not None:
                path = Path(spec.file).expanduser()
                path = path if path.is_absolute() else config_dir / path
                questions = store.import_questions(session, spec.name, read_questions(path))
                questions = questions[: spec.limit] if spec.limit else questions
            else:
                questions = store.dataset_questions(session, spec.name, spec.limit)
            ungraded = [q.external_id for q in questions if q.answer is None]
            if ungraded:
                raise InputError(
                    f"dataset {spec.name!r}: problem(s) {', '.join(ungraded[:5])} have no gold answer",
                    hint="evaluation grades every answer; use `lanpo infer` for questions without one",
                )
            out[spec.name] = questions
    return out


@dataclass
class MethodsResult:
    """A Table 2-shaped evaluation: one EvalResult per method and the combined table (rows `method/mode`)."""

    table: Table
    results: dict[str, EvalResult]
    markdown_path: Path
    csv_path: Path


def run_methods(
    config: EvalConfig,
    db: Any,
    *,
    config_dir: Path | str = ".",
    echo: Callable[[str], None] = print,
    show_progress: bool = True,
) -> MethodsResult:
    """Evaluate every `[[methods]]` entry (one eval run each) and write the combined method x mode table."""
    name, out_dir = _name_and_out_dir(config)
    subs = {
        m.name: replace(
            config,
            run_name=f"{name}-{m.name}",
            model=m.model or config.model,
            adapter=m.adapter if m.adapter is not None else config.adapter,
            out_dir=str(out_dir / m.name),
            retrieval=replace(config.retrieval, pool=m.pool or config.retrieval.pool),
            methods=[],
        )
        for m in config.methods
    }
    for sub in subs.values():  # every name and pool, before the first model loads
        InferenceRun.check(db, str(sub.run_name), "eval", sub.model)
        if "retrieval" in config.modes:
            pool_id(db, sub.retrieval.pool)
    results = {}
    for method, sub in subs.items():
        echo(f"== {method}")
        results[method] = run_eval(sub, db, config_dir=config_dir, echo=echo, show_progress=show_progress)
    rows = [f"{method}/{mode}" for method in subs for mode in config.modes]
    datasets = [d.name for d in config.datasets]
    table = Table(rows, datasets, config.k_samples)
    for method, result in results.items():
        for (mode, dataset), cell in result.table.cells.items():
            table.cells[(f"{method}/{mode}", dataset)] = cell
    markdown_path, csv_path = _write(out_dir, {"table.md": table.to_markdown(), "table.csv": table.to_csv()})
    echo(table.to_markdown())
    echo(f"{len(results)} methods x {len(config.modes)} modes; wrote {markdown_path} and {csv_path}")
    return MethodsResult(table, results, markdown_path, csv_path)


def run_eval(
    config: EvalConfig,
    db: Any,
    *,
    config_dir: Path | str = ".",
    answerer: Answerer | None = None,
    echo: Callable[[str], None] = print,
    show_progress: bool = True,
) -> EvalResult:
    """Run the evaluation, store it, write table.md / table.csv and return the recounted table."""
    name, out_dir = _name_and_out_dir(config)
    # before the model loads: a taken name, a missing dataset or an unknown or ambiguous pool fails in a second
    run = InferenceRun.check(db, name, "eval", config.model)
    greedy_run = InferenceRun.check(db, f"{name}-greedy", "eval", config.model) if config.pass_at_1 else None
    questions = load_questions(db, config, Path(config_dir))
    if "retrieval" in config.modes:
        run.pool_id = pool_id(db, config.retrieval.pool)
        if greedy_run is not None:
            greedy_run.pool_id = run.pool_id
    answerer = answerer or build_answerer(config, db)
    run.open(to_mapping(config), answerer.adapter_sha256)
    datasets = [d.name for d in config.datasets]
    outcomes: list[tuple[str, str, object, bool]] = []
    metrics: dict[str, float] = {}
    total = sum(len(q) for q in questions.values()) * len(config.modes)
    started = time.perf_counter()
    with answering(run, total, "eval", show_progress) as (bar, keep):  # failed if this raises, finished otherwise
        for mode in config.modes:
            for dataset in datasets:
                bar.set_description(f"{mode} {dataset}")
                solutions = answerer.solve(questions[dataset], mode, config.k_samples, on_batch=keep)
                outcomes.extend(
                    (mode, dataset, s.question.problem_id, bool(x.final.correct)) for s in solutions for x in s.samples
                )
                metrics.update(_cell_metrics(mode, dataset, solutions))
        seconds = time.perf_counter() - started
        computed = mean_at_k(outcomes, config.modes, datasets, config.k_samples)
        for (mode, dataset), cell in computed.cells.items():
            metrics[f"mean@k/{mode}/{dataset}"] = cell.mean
            metrics[f"pass@k/{mode}/{dataset}"] = float(cell.pass_at_k or 0.0)
        greedy = None
        if greedy_run is not None:
            greedy = _greedy_pass(config, greedy_run, answerer, questions, show_progress)
            metrics.update({f"pass@1/{m}/{d}": cell.mean for (m, d), cell in greedy.cells.items()})
        rate = metrics["problems_per_second"] = total / seconds if seconds > 0 else 0.0
        run.record_metrics(metrics)
        with transaction(db) as session:
            table = recount(session, run.run_id, config.modes, datasets, config.k_samples)
    markdown_path, csv_path, pass_path, passes = _write_tables(out_dir, table, greedy, answerer.sampling.temperature)
    echo(table.to_markdown())
    echo(passes)
    echo(
        f"run {name} (id {run.run_id}): {total} problem-mode pairs x {config.k_samples} samples in {seconds:.1f}s "
        f"({rate:.2f} problems/s); wrote {markdown_path}, {pass_path} and {csv_path}"
    )
    return EvalResult(run.run_id, name, table, computed, markdown_path, csv_path, seconds, rate, greedy, pass_path)


def _write_tables(
    out_dir: Path, table: Table, greedy: Table | None, temperature: float | None
) -> tuple[Path, Path, Path, str]:
    """table.md, table.csv and pass.md under `out_dir`, each written whole; their paths and pass.md's text."""
    passes = pass_markdown(table, greedy, temperature)
    texts = {"table.md": table.to_markdown(), "table.csv": table.to_csv(greedy), "pass.md": passes}
    markdown_path, csv_path, pass_path = _write(out_dir, texts)
    return markdown_path, csv_path, pass_path, passes


def _name_and_out_dir(config: EvalConfig) -> tuple[str, Path]:
    """The eval run's name (`run_name`, else `eval-<UTC time>`) and the folder its tables go to (checked writable)."""
    name = config.run_name or default_name("eval")
    folder = Path(config.out_dir).expanduser() if config.out_dir else lanpo_home() / "eval" / name
    return name, output_dir(folder, "out_dir")


def _write(out_dir: Path, texts: dict[str, str]) -> list[Path]:
    """Each `file name: text` written whole under `out_dir`; the paths, in order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for file_name, text in texts.items():
        with atomic_write(out_dir / file_name) as handle:
            handle.write(text)
        paths.append(out_dir / file_name)
    return paths


def _greedy_pass(
    config: EvalConfig,
    run: InferenceRun,
    answerer: Answerer,
    questions: dict[str, list[Question]],
    show_progress: bool,
) -> Table:
    """Every question once more, greedily, in every mode, stored as the eval run `<name>-greedy`; its mean@1 table
    (recounted from the stored attempts) is Pass@1 at temperature 0."""
    run.open(to_mapping(config), answerer.adapter_sha256)
    sampling = answerer.sampling
    answerer.sampling = replace(sampling, temperature=0.0)
    datasets = list(questions)
    total = sum(len(q) for q in questions.values()) * len(config.modes)
    try:
        with answering(run, total, "greedy", show_progress) as (_, keep):
            for mode in config.modes:
                for dataset in datasets:
                    answerer.solve(questions[dataset], mode, 1, on_batch=keep)
            with transaction(run.db) as session:
                return recount(session, run.run_id, config.modes, datasets, 1)
    finally:
        answerer.sampling = sampling


def _cell_metrics(mode: str, dataset: str, solutions: list[Solution]) -> dict[str, float]:
    """Side figures of one cell: self-correct's first-turn accuracy, retrieval fallbacks."""
    out: dict[str, float] = {}
    if mode in ("self_correct", "self_correct_single"):
        first = [bool(x.turns[0].correct) for s in solutions for x in s.samples]
        if first:
            out[f"first_turn/{dataset}"] = sum(first) / len(first)
    if mode == "retrieval":
        out[f"retrieval_fallbacks/{dataset}"] = float(sum(1 for s in solutions if s.fallback))
    return out
