"""`lanpo plan --config X --gpus N --gpu-memory G`: a recipe's peak GPU memory per phase, before any GPU time."""

from __future__ import annotations

from pathlib import Path

import click

from lanpo.cli.params import Float, Int, recipe_option, set_option


@click.command("plan")
@recipe_option("TOML recipe (train/configs/*.toml).")
@set_option("Override a config field, as `lanpo train --set` does, e.g. --set grpo.micro_batch_size=2.")
@click.option("--gpus", type=Int(1, 4096), default=1, show_default=True, help="GPUs the run gets (torchrun ranks).")
@click.option(
    "--gpu-memory",
    type=Float(1.0, 4096.0),
    default=80.0,
    show_default=True,
    help="Memory of each GPU in GiB (2^30 bytes), as torch.cuda.get_device_properties reports it.",
)
@click.option(
    "--model",
    default=None,
    help="Plan for this model instead of the recipe's model.name: a shipped shape (Qwen/Qwen2.5-7B, "
    "Qwen/Qwen3-4B-Base, -8B-Base, -14B-Base), a folder with a config.json, or a hub id in the local HF cache.",
)
def command(config_path: Path, overrides: tuple[str, ...], gpus: int, gpu_memory: float, model: str | None) -> None:
    """Print the peak memory per GPU of each phase of a training step (generate, reference and old log-probs,
    update, weight sync, checkpoint), the disk of a checkpoint, whether the recipe fits, and the most a step may
    generate, by source (rollouts, summaries, MEL's diagnoses and replays).

    \b
    From the model's config alone: no weights are loaded or downloaded (the papers' models ship with lanpo, any
    other is read from its config.json). The arithmetic is lanpo.train.plan's docstring; docs/scaling.md,
    "Planning memory", gives its assumptions and how it was checked against measured peaks.
    The verdict is "fits" only with the plan's own measured error to spare; "tight" (exit 0) fits by less, and
    names the key that makes it fit with margin. Exit status 2, with the key to change, when the recipe does not
    fit; `lanpo train` runs the same check on CUDA.
    """
    from lanpo.train.config import load_config
    from lanpo.train.plan import make_plan
    from lanpo.train.plan_shapes import model_shape
    from lanpo.train.plan_tokens import generation_line
    from lanpo.train.plan_verdict import check_fits, table, tight_hint

    cfg = load_config(config_path, list(overrides))
    shape = model_shape(model or cfg.model.name)
    plan = make_plan(cfg, shape, gpus, gpu_memory)
    click.echo(table(plan))
    click.echo(generation_line(cfg))
    hint = tight_hint(cfg, shape, gpus, gpu_memory, plan)
    if hint:
        click.echo(f"hint: {hint}")
    check_fits(cfg, shape, gpus, gpu_memory, plan, warn=False)
