"""`lanpo demo`: the whole LANPO loop on two CPU cores, end to end, on the embedded database.

migrate -> generate and import problems (reasoning-gym) -> problem-to-problem relevance (LLM judge) ->
SFT warm start + a few GRPO steps with intra/inter feedback from the store -> SQL over the history ->
held-out problems answered zero-shot and in retrieval mode, side by side, each retrieval answer beside the
lessons it read, with both accuracies and one line saying whether the store helped and by how much against the
noise. The summariser is scaffolded (`summarizer.scaffold`): the code writes the lesson's headers and SmolLM2 each
section's body, under the same admission check, so lessons reach the pool in the first steps and the inter prompts
of the next ones. Every stage prints what it did and how long it took.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Iterator, Sequence
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


DEFAULT_RUN = "demo"  # the training run's name; a store that has one already gets demo-2, demo-3, ...


@dataclass
class DemoOptions:
    config: Path
    steps: int | None = None
    n_train: int = 8  # few problems, so they recur within a few steps and intra-sample feedback has history
    n_test: int = 8  # the one held-out set: validated during training (stage 4) and answered in stage 6
    run_name: str | None = None  # None: DEFAULT_RUN, or the first of demo-2, demo-3, ... no run has
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
    from lanpo.db import migrate
    from lanpo.db.connection import current_revision, is_embedded, make_db

    cfg = _demo_config(options)
    home = lanpo_home()
    started = time.perf_counter()

    with stage(1, "experience store: connect and migrate", echo):
        db = make_db()
        migrate.upgrade(db)
        where = f"embedded Postgres in {home / 'pgdata'}" if is_embedded() else "LANPO_DATABASE_URL"
        echo(f"      {where}, schema at {current_revision(db)}")
        cfg = dataclasses.replace(cfg, run_name=_run_name(db, options.run_name))
        echo(f"      this demo's training run: {cfg.run_name}")
    out: dict[str, Any] = {"run_name": cfg.run_name, "home": str(home)}

    data_dir = home / "demo"
    test_dataset = cfg.eval.dataset  # the one held-out set (`_demo_config`)
    with stage(2, f"problems: reasoning-gym {cfg.data.task} -> JSONL -> store", echo):
        out["test_questions"] = _import_problems(db, cfg, options.n_test, data_dir, test_dataset, echo)

    with stage(3, "relevance: the base model judges each problem's nearest other problems (BM25 + vector)", echo):
        _say_conversion(cfg.model.name, echo)
        scorer_id = _build_relevance(db, cfg.model.name, cfg.data.dataset, options.relevance_top_k, echo)
        inter = dataclasses.replace(cfg.feedback.inter, scorer=scorer_id)
        cfg = dataclasses.replace(cfg, feedback=dataclasses.replace(cfg.feedback, inter=inter))

    with stage(4, f"training: SFT warm start, then {cfg.steps} LANPO GRPO steps ({cfg.feedback.mode} feedback)", echo):
        from lanpo.train.loop import train
        from lanpo.train.plumbing.step_line import StepClock

        before = ["the policy loads"]
        if cfg.sft.enabled and not cfg.model.init_adapter:
            before.append("the SFT warm start trains")
        if cfg.eval.every:
            before.append(f"the {cfg.eval.n} held-out problems are validated at step 0")
        echo(f"      {', '.join(before)}, then one line per GRPO step with the time left")
        clock = StepClock(cfg.steps)

        def on_step(step: int, metrics: dict[str, float]) -> None:
            echo(f"      {clock.line(step, metrics)}")

        result = train(cfg, db=db, progress=False, on_step=on_step, notify=lambda line: echo(f"      {line}"))
        out["rewards"] = [m["reward/mean"] for m in result.metrics]
        out["summaries"] = _summary_counts(result.metrics, echo)
        out["checkpoint_dir"] = str(result.checkpoint_dir)
        out["run_id"] = result.run_id
        out["held_out"] = _held_out_change(result.validation, cfg.eval.n, echo)
        out["report_dir"] = _write_report(db, cfg.run_name, home / "reports" / cfg.run_name, echo)

    with stage(5, "SQL over the history (read-only, as `lanpo sql` runs it)", echo):
        _sql_tour(db, cfg, echo)

    with stage(6, "held-out problems: zero-shot and retrieval-augmented answers, side by side", echo):
        out["answers"] = _answer_held_out(db, cfg, result.checkpoint_dir, test_dataset, echo)

    echo(click.style(f"\nDemo finished in {time.perf_counter() - started:.0f}s.", bold=True))
    _print_next(options, cfg, home, data_dir, result.checkpoint_dir, out["report_dir"], echo)
    return out


def _demo_config(options: DemoOptions) -> Any:
    """The recipe with the demo's overrides: few problems, the step count and run name asked for, and one held-out
    set: validation (eval.dataset, eval.n) reads the `--n-test` problems that stage 6 answers."""
    from lanpo.config import parse_override
    from lanpo.train.config import load_config

    # p_t = 0.75 (the paper's best for intra): most prompts of the few demo steps carry feedback.
    overrides = [f"data.n={options.n_train}", "feedback.p_t=0.75", *options.overrides]
    if options.steps is not None:
        overrides.append(f"steps={options.steps}")
    overrides.append(f'run_name="{options.run_name or DEFAULT_RUN}"')
    cfg = load_config(options.config, overrides)
    held_out = f"{cfg.data.dataset}-test"
    asked = {".".join(parse_override(text)[0]) for text in options.overrides}
    other_n = "eval.n" in asked and cfg.eval.n != options.n_test
    if other_n or ("eval.dataset" in asked and cfg.eval.dataset != held_out):
        raise InputError(
            f"the demo validates on its one held-out set, the {options.n_test} problems of {held_out}",
            hint="set its size with --n-test instead of eval.n / eval.dataset",
        )
    return dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, dataset=held_out, n=options.n_test))


def demo_overrides(cfg: Any, options: DemoOptions) -> list[str]:
    """The `--set` overrides that make `options.config` train as this demo's run did (for `lanpo train --resume`)."""
    return [
        "feedback.p_t=0.75",
        f"feedback.inter.scorer={cfg.feedback.inter.scorer}",
        f"eval.dataset={cfg.eval.dataset}",
        f"eval.n={cfg.eval.n}",
        *options.overrides,
    ]


def _run_name(db: Any, asked: str | None) -> str:
    """The training run's name: `asked` (InputError when a run has it), else DEFAULT_RUN or the first of demo-2,
    demo-3, ... that no run has."""
    from lanpo.db.connection import transaction
    from lanpo.db.repo.runs import find_run, free_name

    with transaction(db) as session:
        if asked is None:
            return free_name(session, DEFAULT_RUN)
        if find_run(session, asked) is not None:
            raise InputError(
                f"a run named {asked!r} already exists", hint="pass another --run-name, or none (the demo picks one)"
            )
        return asked


def _import_problems(
    db: Any, cfg: Any, n_test: int, data_dir: Path, test_dataset: str, echo: Callable[[str], None]
) -> list[tuple[str, str]]:
    """Training problems and the one held-out set from reasoning-gym, written as JSONL and imported; the held-out
    (q, a). The held-out set is `n_test` problems of the test split that the training dataset does not hold."""
    from lanpo.data.generate import generate_problems, write_jsonl
    from lanpo.data.importer import import_file
    from lanpo.db.connection import transaction
    from lanpo.db.repo.problems import problems_of_dataset

    if not cfg.data.task:
        raise InputError("the demo recipe needs data.task (a reasoning-gym task) to generate problems")
    task_options = dict(cfg.data.task_options)

    def store(dataset: str, records: list[dict[str, Any]]) -> None:
        path = data_dir / f"{dataset}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(records, path)
        with transaction(db) as session:
            report = import_file(session, path, dataset)
        echo(f"      {dataset}: {report.inserted} new, {report.unchanged} already there  ({path})")

    store(cfg.data.dataset, generate_problems(cfg.data.task, cfg.data.n, cfg.data.seed, "train", task_options))
    with transaction(db) as session:  # every training problem the store holds, not only those just generated
        training = {p.question for p in problems_of_dataset(session, cfg.data.dataset)}
    held_out = held_out_problems(cfg.data.task, n_test, cfg.data.seed, task_options, training)
    store(test_dataset, held_out)
    echo(
        f"      held out: the {len(held_out)} problems of {test_dataset}, none of them a training problem; stage 4 "
        "validates on them (mean@k at step 0 and after the last step), stage 6 answers them"
    )
    return [(r["question"], r["answer"]) for r in held_out]


def held_out_problems(
    task: str, n: int, seed: int, task_options: dict[str, Any], training: set[str]
) -> list[dict[str, Any]]:
    """The first `n` distinct test-split problems of `task` whose question is not in `training`."""
    from lanpo.data.generate import generate_problems

    asked = n
    while True:
        kept: dict[str, dict[str, Any]] = {}
        for record in generate_problems(task, asked, seed, "test", task_options):
            if record["question"] not in training:
                kept.setdefault(record["question"], record)
        if len(kept) >= n:
            return list(kept.values())[:n]
        if asked >= 64 * n:  # small task spaces repeat questions: asked for more, still too few
            raise InputError(
                f"reasoning-gym {task} has only {len(kept)} test problems outside the training set; --n-test asks "
                f"for {n}",
                hint="lower --n-test, or widen data.task_options (more terms or digits)",
            )
        asked *= 2


def _sql_tour(db: Any, cfg: Any, echo: Callable[[str], None]) -> None:
    """Three queries over the run's history, printed as `lanpo sql` prints them."""
    from lanpo.db.format import format_result
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
        "the pool's lessons: versions, and uses against their zero-shot baselines (lanpo pool history ID)": (
            "SELECT experience_id, version, reason, uses, helped, hurt, even, unknown, left(summary, 30) AS summary "
            f"FROM lesson_history WHERE pool = '{cfg.pool_name()}' AND active ORDER BY experience_id, version LIMIT 4"
        ),
    }
    for title, sql in queries.items():
        echo(f'      -- {title}\n      lanpo sql "{sql}"')
        table = format_result(query_readonly(db, sql), "table", max_width=70)
        echo("\n".join("      " + line for line in table.splitlines()))


def _print_next(
    options: DemoOptions,
    cfg: Any,
    home: Path,
    data_dir: Path,
    checkpoint_dir: Path,
    report_dir: str,
    echo: Callable[[str], None],
) -> None:
    """Where the demo left everything, and the commands to go on with."""
    from lanpo.db.connection import is_embedded

    echo(f"  database:     {'embedded, ' + str(home / 'pgdata') if is_embedded() else 'LANPO_DATABASE_URL'}")
    echo(f"  problems:     {data_dir}")
    echo(f"  checkpoints:  {checkpoint_dir}")
    echo(f"  report:       {report_dir}  (lanpo report {cfg.run_name} --out DIR redraws it)")
    runs = [f"{cfg.run_name} (training; its pool: {cfg.pool_name()})", f"{cfg.run_name}-infer (stage 6)"]
    if cfg.sft.enabled and not cfg.model.init_adapter:
        runs.insert(1, f"{cfg.run_name}-sft (the warm start)")
    echo(f"  runs:         {', '.join(runs)}")
    echo("  next:")
    echo(f"    lanpo sql \"SELECT * FROM run_rewards WHERE run_name = '{cfg.run_name}'\"")
    echo(f"    lanpo pool stats --pool {cfg.pool_name()}")
    echo("    lanpo pool history ID      (a lesson of stage 5: its versions, and its uses after stage 6)")
    echo(f'    lanpo retrieve "What is 6 - 2?" --pool {cfg.pool_name()} --judge none')
    same = " ".join(f"--set {shlex.quote(o)}" for o in demo_overrides(cfg, options))
    echo(
        f"    lanpo train --config {options.config} {same} --set run_name={cfg.run_name} --set steps={cfg.steps + 4} "
        "--resume"
    )
    echo(f"    lanpo eval --config {recipe_path('eval-demo-cpu.toml')}")
    echo("    lanpo sql --file sql/recipes/best_experiences_by_lift.sql")


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
            "      it is `lanpo experiment --config train/experiments/grpo-vs-lanpo.toml` (docs/results.md)"
        )
    return {"metric": key, "before": before, "after": after, "noise_2se": 2 * se}


def _summary_counts(metrics: list[dict[str, float]], echo: Callable[[str], None]) -> dict[str, int]:
    """How many summaries training wrote, how many had the lesson format, how many the pool admitted, and why the
    others were turned away (summary/* metrics of every step; a reason of `REJECTIONS` -> its count)."""
    from lanpo.feedback.summarize import REJECTIONS

    names = {"written": "summary/generated", "admitted": "pool/summaries"}
    names |= {reason: f"summary/rejected/{reason}" for reason in REJECTIONS}
    counts = {key: round(sum(m.get(name, 0.0) for m in metrics)) for key, name in names.items()}
    counts["with_format"] = round(sum(m.get("summary/format", 0.0) * m.get("summary/generated", 0.0) for m in metrics))
    echo(
        f"      summaries: {counts['written']} written, {counts['with_format']} with the lesson format "
        f"(## Flow / ## Principles / ## Pitfalls, each with text of its own), {counts['admitted']} admitted to the "
        f"pool; turned away, by reason (docs/concepts.md#lessons): {', '.join(f'{r} {counts[r]}' for r in REJECTIONS)}"
    )
    return counts


def _write_report(db: Any, run_name: str, out: Path, echo: Callable[[str], None]) -> str:
    from lanpo.db.connection import transaction
    from lanpo.report.build import read_report, write_report

    with transaction(db) as session:
        data = read_report(session, [run_name])
    written = write_report(data, out, command=f"lanpo report {run_name}")
    echo(f"      figures: {written.out_dir / 'report.md'} ({len(written.figures)} PNGs, e.g. {written.figures[0]})")
    return str(written.out_dir)


def _say_conversion(model: str, echo: Callable[[str], None]) -> None:
    """A line before the one-time conversion of the offline SmolLM2 (about 40 s), which logs at INFO only."""
    from lanpo.models.gguf import SMOLLM2, smollm2_converted

    if model.lower() == SMOLLM2 and not smollm2_converted():
        echo("      first use of SmolLM2: its GGUF is converted into a cached HF folder (once, about 40 s)")


def _build_relevance(db: Any, judge: str, dataset: str, top_k: int, echo: Callable[[str], None]) -> str:
    from lanpo.retrieval.build import build_relevance
    from lanpo.retrieval.search import SearchParams

    # Templated problems share most words, so BM25 alone ranks them poorly: fuse it with MiniLM vectors.
    built = build_relevance(db, dataset, judge, top_k=top_k, params=SearchParams(stage1="hybrid"), embed=True)
    report = built.report
    echo(f"      embedded {built.embedded} problems (all-MiniLM-L6-v2, offline)")
    echo(
        f"      {report.scored} pairs scored, {report.cached} cached  ({report.pairs_per_second:.1f} pairs/s), "
        f"scorer {built.scorer}"
    )
    return built.scorer


def _answer_held_out(
    db: Any, cfg: Any, checkpoint_root: Path, test_dataset: str, echo: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The trained policy answers the held-out problems twice, greedily: zero-shot, then with lessons retrieved from
    the run's pool. Both go into one `infer` run (step 0, one policy version), so `experience_usage` compares them."""
    from lanpo.db.connection import transaction
    from lanpo.db.repo.lessons import retired_as_harmful
    from lanpo.db.repo.pools import active_size
    from lanpo.inference.answerer import Answerer
    from lanpo.inference.config import RetrievalSettings, SamplingSettings
    from lanpo.inference.run import InferenceRun, answering, pool_id
    from lanpo.inference.store import dataset_questions

    adapters, inter = sorted(checkpoint_root.glob("step-*/adapter")), cfg.feedback.inter
    with transaction(db) as session:
        questions = dataset_questions(session, test_dataset, limit=cfg.eval.n)  # the set validation read
    pool = pool_id(db, cfg.pool_name())
    run = InferenceRun.check(db, f"{cfg.run_name}-infer", "infer", cfg.model.name, pool_id=pool)
    answerer = Answerer(
        cfg.model.name,
        adapters[-1] if adapters else None,
        db=db,
        sampling=SamplingSettings(max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0),
        # Stage 1 is `lanpo infer`'s and `lanpo serve`'s default, BM25 (its idf stays positive, so a pool of one
        # lesson is searched, not missed). The judge is training's (the base model of stage 3), so a lesson relevant
        # in training is judged by the same model, at the same gamma, here; ranked as training ranks (value: a
        # lesson known to hurt is never read).
        retrieval=RetrievalSettings(
            top_k=8,
            gamma=inter.gamma,
            m=2,
            judge=cfg.model.name,
            pool=cfg.pool_name(),
            rank=inter.rank,
        ),
        notify=lambda message: echo(f"      note: {message}"),
    )
    with transaction(db) as session:
        lessons = active_size(session, pool)
    echo(f"      pool {cfg.pool_name()}: {lessons} active lesson(s)")
    run.open({"modes": ["zero_shot", "retrieval"], "dataset": test_dataset}, answerer.adapter_sha256)
    with answering(run, 2 * len(questions), "held out", show=False) as (_, keep):  # each batch stored as it ends
        zero_shot = answerer.solve(questions, "zero_shot", 1, on_batch=keep)
        retrieval = answerer.solve(questions, "retrieval", 1, on_batch=keep)
    for line in side_by_side(zero_shot, retrieval):
        echo("      " + line)
    verdict = retrieval_verdict(
        [bool(s.samples[0].final.correct) for s in zero_shot],
        [bool(s.samples[0].final.correct) for s in retrieval],
        lessons_used=sum(1 for s in retrieval if s.experiences),
        model=cfg.model.name,
    )
    echo(click.style(f"      {verdict}", bold=True))
    echo(f"      stored as run {cfg.run_name}-infer (both modes, step 0: experience_usage compares them)")
    with transaction(db) as session:  # store.retire_below: the store acts on what it measured
        retired = retired_as_harmful(session, cfg.pool_name())
    for r in retired:
        interval = f"95% interval {r.lift_low:+.3f} .. {r.lift_high:+.3f}"
        echo(f"      lesson #{r.experience_id} retired as harmful: lift {r.lift:+.3f} over {r.uses} uses, {interval}, "
             "below the pool's retire_below; no later prompt reads it")  # fmt: skip
    return [
        {
            "id": z.question.external_id,
            "question": z.question.question,
            "gold": z.question.answer,
            "zero_shot": z.to_record(),
            "retrieval": r.to_record(),
            "verdict": verdict,
        }
        for z, r in zip(zero_shot, retrieval, strict=True)
    ]


def side_by_side(zero_shot: Sequence[Any], retrieval: Sequence[Any]) -> list[str]:
    """One line per held-out problem: gold, the zero-shot answer, the retrieval answer and the lessons it was given;
    then both accuracies. An answer of None is one without a \\boxed{} (math-verify may still grade it)."""

    def answer(solution: Any) -> str:
        final = solution.samples[0].final
        return f"{final.answer!s:>8} {'right' if final.correct else 'wrong'}"

    lines = [f"{'problem':<44} {'gold':>8}  {'zero-shot':>14}  {'retrieval':>14}  lessons in the retrieval prompt"]
    for z, r in zip(zero_shot, retrieval, strict=True):
        lessons = ", ".join(
            f"#{e.experience_version_id}" + ("" if e.relevance is None else f" (r={e.relevance:.2f})")
            for e in r.experiences
        )
        lines.append(
            f"{_one_line(z.question.question, 44, tail=True):<44} {z.question.answer!s:>8}  {answer(z):>14}  "
            f"{answer(r):>14}  {lessons or 'none: the zero-shot prompt'}"
        )
        lines.extend(  # what the retrieval answer read, under its row
            f"    read #{e.experience_version_id} (of problem {e.source_problem_id}): {_one_line(e.summary, 100)}"
            for e in r.experiences
        )
    n = len(zero_shot)
    right = [sum(bool(s.samples[0].final.correct) for s in mode) for mode in (zero_shot, retrieval)]
    lines.append(
        f"accuracy on {n} held-out problems: zero-shot {right[0]}/{n} ({right[0] / max(n, 1):.0%}), "
        f"retrieval {right[1]}/{n} ({right[1] / max(n, 1):.0%})"
    )
    return lines


def retrieval_verdict(zero_shot: Sequence[bool], retrieval: Sequence[bool], lessons_used: int, model: str) -> str:
    """One honest line: did the store's lessons change the held-out accuracy, which way, and above noise or not."""
    n = len(zero_shot)
    if n == 0:
        return "no held-out problems: nothing to compare"
    if lessons_used == 0:
        return (
            "no lesson reached these problems (the pool is empty, or nothing reached gamma): retrieval answered "
            "with the zero-shot prompt, so the store changed nothing here"
        )
    z, r = sum(zero_shot) / n, sum(retrieval) / n
    lost = sum(1 for a, b in zip(zero_shot, retrieval, strict=True) if a and not b)
    fixed = sum(1 for a, b in zip(zero_shot, retrieval, strict=True) if b and not a)
    # the same conservative 2 standard errors as the held-out comparison of stage 4
    noise = 2 * ((z * (1 - z) + r * (1 - r)) / n) ** 0.5
    how = f"{r:.0%} with lessons against {z:.0%} without; {fixed} answer(s) fixed, {lost} broken"
    beyond = f"beyond noise (+-{noise:.0%})" if abs(r - z) > noise else f"within noise (+-{noise:.0%}) on {n} problems"
    if r < z:
        return f"retrieval hurt at this model size ({model}): {how}, {beyond}"
    if r == z:
        return f"retrieval did not help at this model size ({model}): {how}"
    return f"retrieval helped ({model}): {how}, {beyond}"


def _one_line(text: str, width: int, tail: bool = False) -> str:
    """`text` on one line, cut to `width`: its start, or (`tail`) its end, where a templated question differs."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    return "..." + flat[3 - width :] if tail else flat[: width - 3] + "..."
