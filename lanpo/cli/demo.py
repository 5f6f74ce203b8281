"""`lanpo demo`: the main job end to end on the embedded database (see lanpo/demo.py)."""

from __future__ import annotations

from pathlib import Path

import click

from lanpo.cli.params import Int, recipe_option, set_option
from lanpo.demo import DemoOptions


@click.command("demo")
@recipe_option("Training recipe (default: train/configs/demo-cpu.toml).", required=False)
@click.option("--steps", type=Int(1), default=None, help="GRPO steps (default: the recipe's).")
@click.option(
    "--n-train", type=Int(2), default=DemoOptions.n_train, show_default=True, help="Training problems generated."
)
@click.option(
    "--n-test",
    type=Int(1),
    default=DemoOptions.n_test,
    show_default=True,
    help="Size of the one held-out set (dataset <data.dataset>-test, none of it a training problem): training "
    "validates on it (eval.dataset, eval.n) and the last stage answers it.",
)
@click.option(
    "--run-name",
    default=None,
    help="Training run name, one no run has yet (default: demo, or demo-2, demo-3, ... when taken). The demo "
    "prints it; its pool has the same name.",
)
@set_option("Override a recipe field.")
def command(
    config_path: Path | None, steps: int | None, n_train: int, n_test: int, run_name: str | None, overrides: tuple
) -> None:
    """Run LANPO end to end in a few minutes on a CPU.

    \b
    1. migrate the experience store (embedded Postgres, or LANPO_DATABASE_URL)
    2. generate problems with reasoning-gym and import them
    3. score problem-to-problem relevance with the offline SmolLM2 as judge
    4. SFT warm start, then a few LANPO GRPO steps (a line per step with the time left)
    5. two SQL queries over the history
    6. answer the held-out problems zero-shot and in retrieval mode (a retrieval
       prompt without a lesson at gamma falls back to the zero-shot one, and says so)
    """
    from lanpo.demo import recipe_path, run_demo

    run_demo(
        DemoOptions(
            config=config_path or recipe_path("demo-cpu.toml"),
            steps=steps,
            n_train=n_train,
            n_test=n_test,
            run_name=run_name,
            overrides=overrides,
        )
    )
