"""`lanpo eval --config C`: datasets x modes x k samples -> a mean@k table shaped like the paper's Table 1."""

from __future__ import annotations

from pathlib import Path

import click

from lanpo.cli.keys import keys_option
from lanpo.cli.params import set_option


@click.command("eval")
@keys_option("lanpo.inference.config:EvalConfig")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),  # a folder is refused by load_toml, with the eval's own message
    required=True,
    help="Eval TOML (see train/configs/eval-*.toml).",
)
@set_option("Override a config key, e.g. --set k_samples=8 --set retrieval.gamma=0.8 (repeatable).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def command(config_path: Path, overrides: tuple[str, ...], no_progress: bool) -> None:
    """Evaluate a policy on datasets in every mode; print the table and write it as markdown and CSV.

    With [[methods]] (one trained policy each) the rows are method x mode, Table 2's shape.

    Every attempt is stored under an `eval` run with its mode, so `run_rewards` and `experience_usage` cover
    the evaluation; the printed table is recounted from those stored attempts.
    """
    from lanpo.config import load_toml
    from lanpo.db.connection import connect
    from lanpo.inference.config import EvalConfig
    from lanpo.inference.evaluate import run_eval, run_methods

    config = load_toml(EvalConfig, config_path, list(overrides))
    run = run_methods if config.methods else run_eval
    run(config, connect(), config_dir=config_path.parent, echo=click.echo, show_progress=not no_progress)
