"""`lanpo demo`: the main job end to end on the embedded database (see lanpo/demo.py)."""

from __future__ import annotations

from pathlib import Path

import click

from lanpo.cli.params import Int


@click.command("demo")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Training recipe (default: train/configs/demo-cpu.toml).",
)
@click.option("--steps", type=Int(1), default=None, help="GRPO steps (default: the recipe's).")
@click.option("--n-train", type=Int(2), default=8, show_default=True, help="Training problems generated.")
@click.option("--n-test", type=Int(1), default=4, show_default=True, help="Held-out problems answered.")
@click.option("--run-name", default=None, help="Run name (default: demo-<timestamp>, so each demo is a new run).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a recipe field.")
def command(
    config_path: Path | None, steps: int | None, n_train: int, n_test: int, run_name: str | None, overrides: tuple
) -> None:
    """Run LANPO end to end in a few minutes on a CPU.

    \b
    1. migrate the experience store (embedded Postgres, or LANPO_DATABASE_URL)
    2. generate problems with reasoning-gym and import them
    3. score problem-to-problem relevance with the offline SmolLM2 as judge
    4. SFT warm start, then a few LANPO GRPO steps (reward printed per step)
    5. two SQL queries over the history
    6. answer held-out problems zero-shot and in retrieval mode (with the demo's
       empty pool, retrieval falls back to the zero-shot prompt and says so)
    """
    from lanpo.demo import DemoOptions, recipe_path, run_demo

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
