"""`lanpo experiment --config train/experiments/FILE.toml`: arms x seeds of training runs from one shared start."""

from __future__ import annotations

from pathlib import Path

import click

from lanpo.cli.keys import keys_option
from lanpo.cli.params import recipe_option, set_option


@click.command("experiment")
@keys_option("lanpo.experiment:ExperimentConfig")
@recipe_option("Experiment file (train/experiments/*.toml): the recipe, the arms, the seeds.")
@click.option(
    "--arms", default=None, help="Comma-separated arms to run instead of the file's (e.g. grpo,lanpo-intra)."
)
@click.option("--seeds", default=None, help="Comma-separated seeds instead of the file's (e.g. 0,1,2).")
@set_option("Override a key of the recipe every arm shares, e.g. --set steps=10 (repeatable).")
@click.option(
    "--jobs",
    default="auto",
    show_default=True,
    metavar="N|auto",
    help="Runs trained side by side, each in its own process (output in <experiment folder>/logs/<run>.log). "
    "auto: on a CPU one per model.threads of the usable cores (the recipes use one thread: one run per core), "
    "on a GPU one.",
)
@click.option("--no-report", is_flag=True, help="Do not write the report at the end (lanpo report EXPERIMENT can).")
def command(
    config_path: Path, arms: str | None, seeds: str | None, overrides: tuple[str, ...], jobs: str, no_report: bool
) -> None:
    """Train GRPO and LANPO arms from the same SFT start, seed by seed, and report held-out accuracy.

    \b
    Every arm shares the start, the problems, the steps, the group size and the held-out set; a finished run
    is skipped and an unfinished one resumed, so running the command again continues where it stopped. Runs
    train side by side (--jobs; on a CPU one per core), and a run trains the same alone or beside others.
    Ctrl-C or SIGTERM stops every run at once (each keeps the steps it committed). At the end `lanpo report
    EXPERIMENT` writes the figures and the Table 1-shaped result (also at any time).
    """
    from dataclasses import replace

    from lanpo.db.connection import connect
    from lanpo.errors import InputError
    from lanpo.experiment import auto_jobs, load_experiment, run_experiment

    exp, base = load_experiment(config_path, overrides)
    if arms is not None:
        exp = replace(exp, arms=[a.strip() for a in arms.split(",") if a.strip()])
    if seeds is not None:
        try:
            exp = replace(exp, seeds=[int(s) for s in seeds.split(",") if s.strip()])
        except ValueError as exc:
            raise InputError(f"--seeds must be integers separated by commas, got {seeds!r}") from exc
    if jobs.strip() == "auto":
        workers = auto_jobs(base, len(exp.arms) * len(exp.seeds))
    elif jobs.strip().isdigit() and int(jobs) >= 1:
        workers = int(jobs)
    else:
        raise InputError(f"--jobs must be a whole number >= 1 or auto, got {jobs!r}", hint="e.g. --jobs 2")
    result = run_experiment(exp, base, connect(), echo=click.echo, report=not no_report, jobs=workers)
    trained = sum(r.status != "skipped" for r in result.runs)
    click.echo(f"experiment {result.name}: {trained} run(s) trained or resumed, {len(result.runs) - trained} skipped")
