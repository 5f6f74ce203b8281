"""`lanpo demo`: the whole LANPO loop on two CPU cores, end to end, on the embedded database.

migrate -> generate and import problems (reasoning-gym) -> problem-to-problem relevance (LLM judge) ->
SFT warm start + a few GRPO steps with intra/inter feedback from the store -> SQL over the history ->
retrieval-augmented answers for held-out problems. Every stage prints what it did and how long it took.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from lanpo.config import lanpo_home
from lanpo.errors import InputError
from lanpo.resources import project_dir


def recipe_path(name: str) -> Path:
    """A recipe of `train/configs/` by file name, from a checkout or the copy packed into the wheel."""
    folder = project_dir("train/configs", name)
    if folder is None:
        raise InputError(f"recipe {name} not found in train/configs", hint="pass --config PATH")
    return folder / name


@dataclass
class DemoOptions:
    config: Path
    steps: int | None = None
    n_train: int = 8  # few problems, so they recur within a few steps and intra-sample feedback has history
    n_test: int = 4
    run_name: str | None = None
    relevance_top_k: int = 7  # every other problem; the judge costs ~0.3-0.75 s per pair on 2 cores
    overrides: tuple[str, ...] = ()


@contextmanager
def stage(number: int, title: str, echo: Callable[[str], None]) -> Iterator[None]:
    echo(click.style(f"\n[{number}/6] {title}", bold=True))
    started = time.perf_counter()
    yield
    echo(f"      done in {time.perf_counter() - started:.1f}s")


def run_demo(options: DemoOptions, echo: Callable[[str], None] = click.echo) -> dict[str, Any]:
    """Run the demo; returns what it made (run name, paths, per-step rewards, answers) for tests and scripts."""
    from lanpo.data.generate import generate_problems, write_jsonl
    from lanpo.data.importer import import_file
    from lanpo.db import migrate
    from lanpo.db.engine import current_revision, is_embedded, make_engine, transaction
    from lanpo.train.config import load_config

    # p_t = 0.75 (the paper's best for intra): most prompts of the few demo steps carry feedback.
    overrides = [f"data.n={options.n_train}", "feedback.p_t=0.75", *options.overrides]
    if options.steps is not None:
        overrides.append(f"steps={options.steps}")
    if options.run_name:
        overrides.append(f'run_name="{options.run_name}"')
    else:
        overrides.append(f'run_name="demo-{time.strftime("%Y%m%d-%H%M%S")}"')
    cfg = load_config(options.config, overrides)
    home = lanpo_home()
    out: dict[str, Any] = {"run_name": cfg.run_name, "home": str(home)}
    started = time.perf_counter()

    with stage(1, "experience store: connect and migrate", echo):
        engine = make_engine()
        migrate.upgrade(engine)
        where = f"embedded Postgres in {home / 'pgdata'}" if is_embedded() else "LANPO_DATABASE_URL"
        echo(f"      {where}, schema at {current_revision(engine)}")

    data_dir = home / "demo"
    test_dataset = f"{cfg.data.dataset}-test"
    with stage(2, f"problems: reasoning-gym {cfg.data.task} -> JSONL -> store", echo):
        if not cfg.data.task:
            raise InputError("the demo recipe needs data.task (a reasoning-gym task) to generate problems")
        task_options = dict(cfg.data.task_options)
        files = {
            cfg.data.dataset: generate_problems(cfg.data.task, cfg.data.n, cfg.data.seed, "train", task_options),
            test_dataset: generate_problems(cfg.data.task, options.n_test, cfg.data.seed, "test", task_options),
        }
        for dataset, records in files.items():
            path = data_dir / f"{dataset}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_jsonl(records, path)
            with transaction(engine) as session:
                report = import_file(session, path, dataset)
            echo(f"      {dataset}: {report.inserted} new, {report.unchanged} already there  ({path})")
        out["test_questions"] = [(r["question"], r["answer"]) for r in files[test_dataset]]

    with stage(3, "relevance: the base model judges each problem's nearest other problems (BM25 + vector)", echo):
        scorer_id = _build_relevance(engine, cfg.model.name, cfg.data.dataset, options.relevance_top_k, echo)
        cfg = dataclasses.replace(cfg, feedback=dataclasses.replace(cfg.feedback, scorer=scorer_id))

    with stage(4, f"training: SFT warm start, then {cfg.steps} LANPO GRPO steps ({cfg.feedback.mode} feedback)", echo):
        from lanpo.train.loop import train

        def on_step(step: int, metrics: dict[str, float]) -> None:
            modes = " ".join(
                f"{m}={metrics[f'accuracy/{m}']:.2f}"
                for m in ("zero_shot", "intra", "inter")
                if f"accuracy/{m}" in metrics
            )
            echo(
                f"      step {step}: reward {metrics['reward/mean']:.3f}  accuracy {metrics['accuracy/mean']:.2f}"
                f" ({modes})  pool {metrics.get('pool/active', 0):.0f}  {metrics['time/step']:.0f}s"
            )

        result = train(cfg, engine=engine, progress=False, on_step=on_step)
        out["rewards"] = [m["reward/mean"] for m in result.metrics]
        out["checkpoint_dir"] = str(result.checkpoint_dir)
        out["run_id"] = result.run_id
        out["held_out"] = _held_out_change(result.validation, cfg.eval.n, echo)
        out["report_dir"] = _write_report(engine, cfg.run_name, home / "reports" / cfg.run_name, echo)

    with stage(5, "SQL over the history (read-only, as `lanpo sql` runs it)", echo):
        from lanpo.cli.sql import format_result
        from lanpo.db.readonly import query_readonly

        queries = {
            "reward and accuracy per step": (
                "SELECT step, mode, attempts, round(mean_reward::numeric, 3) AS mean_reward, "
                f"round(accuracy::numeric, 2) AS accuracy FROM run_rewards "
                f"WHERE run_name = '{cfg.run_name}' ORDER BY step, mode"
            ),
            "the newest experiences in the run's pool": (
                "SELECT experience_id, problem_id, round(reward::numeric, 2) AS reward, left(summary, 70) AS summary "
                f"FROM pool_current WHERE pool = '{cfg.pool_name()}' ORDER BY created_at DESC LIMIT 3"
            ),
        }
        for title, sql in queries.items():
            echo(f'      -- {title}\n      lanpo sql "{sql}"')
            table = format_result(query_readonly(engine, sql), "table", max_width=70)
            echo("\n".join("      " + line for line in table.splitlines()))

    with stage(6, "retrieval-augmented answers for held-out problems", echo):
        out["answers"] = _answer_held_out(engine, cfg, result.checkpoint_dir, test_dataset, echo)

    echo(click.style(f"\nDemo finished in {time.perf_counter() - started:.0f}s.", bold=True))
    echo(f"  database:     {'embedded, ' + str(home / 'pgdata') if is_embedded() else 'LANPO_DATABASE_URL'}")
    echo(f"  problems:     {data_dir}")
    echo(f"  checkpoints:  {result.checkpoint_dir}")
    echo(f"  report:       {out['report_dir']}  (lanpo report {cfg.run_name} --out DIR redraws it)")
    echo("  next:")
    echo(f"    lanpo sql \"SELECT * FROM run_rewards WHERE run_name = '{cfg.run_name}'\"")
    echo("    lanpo pool stats")
    echo(
        f"    lanpo train --config {options.config} --set run_name={cfg.run_name} --set steps={cfg.steps + 4} --resume"
    )
    echo(f"    lanpo eval --config {recipe_path('eval-demo-cpu.toml')}")
    return out


def _held_out_change(validation: dict[int, dict[str, float]], n: int, echo: Callable[[str], None]) -> dict[str, Any]:
    """Held-out mean@k before and after training, and whether the change is above noise (2 standard errors)."""
    if len(validation) < 2:
        echo("      held-out: not validated twice (eval.every = 0); see `lanpo eval`")
        return {}
    first, last = min(validation), max(validation)
    key = next(k for k in validation[first] if "/mean@" in k)
    before, after = validation[first][key], validation[last][key]
    # Each problem's mean@k lies in [0, 1] with variance at most p(1 - p): a conservative s.e. of the difference
    # of two independent held-out passes over the same n problems.
    se = ((before * (1 - before) + after * (1 - after)) / max(n, 1)) ** 0.5
    change = after - before
    echo(
        f"      held-out {key.split('/')[-1]} on {n} problems: {before:.3f} at step {first} -> {after:.3f} "
        f"at step {last} ({change:+.3f}, noise +-{2 * se:.3f} at 2 s.e.)"
    )
    if abs(change) <= 2 * se:
        echo(
            "      within noise: a few demo steps do not show learning at this size. The experiment that measures\n"
            "      it is `lanpo experiment --config train/experiments/grpo-vs-lanpo.toml` (README, 'Does it learn?')"
        )
    return {"metric": key, "before": before, "after": after, "noise_2se": 2 * se}


def _write_report(engine: Any, run_name: str, out: Path, echo: Callable[[str], None]) -> str:
    from lanpo.db.engine import transaction
    from lanpo.report.build import read_report, write_report

    with transaction(engine) as session:
        data = read_report(session, [run_name])
    written = write_report(data, out, command=f"lanpo report {run_name}")
    echo(f"      figures: {written.out_dir / 'report.md'} ({len(written.figures)} PNGs, e.g. {written.figures[0]})")
    return str(written.out_dir)


def _build_relevance(engine: Any, judge: str, dataset: str, top_k: int, echo: Callable[[str], None]) -> str:
    from lanpo.retrieval.embeddings import SentenceTransformerEmbedder, embed_missing
    from lanpo.retrieval.relevance import build_problem_relevance
    from lanpo.retrieval.scorer import load_scorer
    from lanpo.retrieval.search import SearchParams

    # Templated problems share most words, so BM25 alone ranks them poorly: fuse it with MiniLM vectors.
    count = embed_missing(engine, SentenceTransformerEmbedder(), dataset=dataset, what="problems", progress=False)
    echo(f"      embedded {count.problems} problems (all-MiniLM-L6-v2, offline)")
    scorer = load_scorer(judge)
    report = build_problem_relevance(
        engine, dataset, scorer, top_k=top_k, params=SearchParams(stage1="hybrid"), progress=False
    )
    echo(
        f"      {report.scored} pairs scored, {report.cached} cached  ({report.pairs_per_second:.1f} pairs/s), "
        f"scorer {scorer.identity}"
    )
    return scorer.identity


def _answer_held_out(
    engine: Any, cfg: Any, checkpoint_root: Path, test_dataset: str, echo: Callable[[str], None]
) -> list[dict[str, Any]]:
    from lanpo.db.engine import transaction
    from lanpo.inference.config import RetrievalSettings, SamplingSettings
    from lanpo.inference.engine import Engine
    from lanpo.inference.store import dataset_questions, record_solutions, start_run

    adapters = sorted(checkpoint_root.glob("step-*/adapter"))
    with transaction(engine) as session:
        questions = dataset_questions(session, test_dataset)
    solver = Engine(
        cfg.model.name,
        adapters[-1] if adapters else None,
        db=engine,
        sampling=SamplingSettings(max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0),
        retrieval=RetrievalSettings(
            stage1="bm25", top_k=8, gamma=cfg.feedback.gamma, m=2, scorer="policy", pool=cfg.pool_name()
        ),
        notify=lambda message: echo(f"      note: {message}"),
    )
    solutions = solver.solve(questions, "retrieval", 1)
    with transaction(engine) as session:
        run_id, version = start_run(
            session,
            f"{cfg.run_name}-infer",
            "infer",
            {"mode": "retrieval", "dataset": test_dataset},
            cfg.model.name,
            solver.adapter_sha256,
            pool_id=solver.pool().id,
        )
        record_solutions(session, solutions, run_id, version)
    for solution in solutions:
        final = solution.samples[0].final
        used = ", ".join(f"#{u.experience_version_id} (r={u.relevance:.2f})" for u in solution.experiences)
        echo(f"      Q: {solution.question.question.splitlines()[0][:100]}")
        echo(
            f"         answer {final.answer!s:>6}  gold {solution.question.answer!s:>6}  "
            f"{'correct' if final.correct else 'wrong'};  experiences used: {used or 'none above gamma'}"
        )
    echo(f"      stored as run {cfg.run_name}-infer")
    return [s.to_record() for s in solutions]
