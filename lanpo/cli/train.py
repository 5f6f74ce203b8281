"""`lanpo train`: run or resume GRPO training (LANPO, MEL or plain GRPO) from a TOML recipe."""

from __future__ import annotations

import os
from pathlib import Path

import click

from lanpo.cli.keys import keys_option
from lanpo.cli.params import recipe_option, set_option
from lanpo.train.plumbing.step_line import StepClock, step_line


@click.command("train")
@keys_option("lanpo.train.config:TrainConfig")
@recipe_option("TOML recipe (train/configs/*.toml).")
@set_option("Override a config field, e.g. --set steps=5 --set feedback.p_t=0.75.")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run named by run_name after its last checkpointed step (checkpoint.every; the store's later "
    "steps are rolled back, their evictions undone).",
)
@click.option(
    "--no-progress",
    is_flag=True,
    help="No progress bar; print one line per step instead (ending with the time left: the steps to go x the mean "
    "step time so far), and what runs before step 1 (the SFT warm start, the first validation).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    help="Start N local rollout workers (`lanpo worker`) and train asynchronously (workers.count; "
    "workers.max_staleness bounds how stale a trained group may be).",
)
def command(
    config_path: Path, overrides: tuple[str, ...], resume: bool, no_progress: bool, workers: int | None
) -> None:
    """Train with GRPO + language feedback (LANPO) or meta-experiences (MEL, method = "mel") from the store.

    \b
    Every step commits, in one transaction, its attempts (with the contexts they saw), new experiences,
    capacity evictions, metrics and the policy version; the checkpoint is written just before. After a crash,
    `--resume` continues from the last checkpointed step (`checkpoint.every`; by default every step).
    """
    from lanpo.db.connection import connect
    from lanpo.train.config import load_config
    from lanpo.train.loop import train

    if workers is not None:
        overrides = (*overrides, f"workers.count={workers}")
    cfg = load_config(config_path, list(overrides))
    db = connect()

    clock = StepClock(cfg.steps)

    def report(step: int, metrics: dict[str, float]) -> None:
        if no_progress:
            click.echo(clock.line(step, metrics))

    notify = click.echo if no_progress else None
    result = train(cfg, db=db, resume=resume, progress=not no_progress, on_step=report, notify=notify)
    if os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 reports
        return
    if not no_progress:
        for step, metrics in zip(result.steps, result.metrics, strict=True):
            click.echo(step_line(step, metrics))
    done = f"steps {result.steps[0]}-{result.steps[-1]}" if result.steps else "no new steps (already complete)"
    click.echo(f"run {result.run_name} (id {result.run_id}): {done}; checkpoints in {result.checkpoint_dir}")
