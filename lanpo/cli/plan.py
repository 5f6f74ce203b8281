"""`lanpo plan --config X --gpus N --gpu-memory G`: a recipe's peak GPU memory per phase, before any GPU time; with
`--verl FILE [KEY=VALUE ...]`, the same for a verl config's shapes (`lanpo.train.plan_verl`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from lanpo.cli.params import Float, Int, recipe_option, set_option
from lanpo.errors import InputError

if TYPE_CHECKING:
    from lanpo.train.config import TrainConfig


@click.command("plan")
@recipe_option("TOML recipe (train/configs/*.toml).", required=False)
@set_option("Override a config field, as `lanpo train --set` does, e.g. --set grpo.micro_batch_size=2.")
@click.option(
    "--verl",
    "verl_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A verl config (examples/verl/lanpo_paper.yaml) instead of --config: its shapes are mapped to the "
    "planner's inputs, the mapping printed. KEY=VALUE arguments after it are Hydra overrides of it.",
)
@click.argument("verl_overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option(
    "--gpus",
    type=Int(1, 4096),
    default=None,
    help="GPUs the run gets (torchrun ranks). Default: 1; with --verl, trainer.nnodes x trainer.n_gpus_per_node.",
)
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
def command(
    config_path: Path | None,
    overrides: tuple[str, ...],
    verl_path: Path | None,
    verl_overrides: tuple[str, ...],
    gpus: int | None,
    gpu_memory: float,
    model: str | None,
) -> None:
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

    \b
    --verl FILE [KEY=VALUE ...]: a verl config read with OmegaConf (no verl import), Hydra's overrides applied; its
    lanpo.config is the recipe, verl's keys (model path, rollout.n, train_batch_size, ppo_mini_batch_size, prompt
    and response lengths, micro-batches, lora_rank, dtypes, the engine's share, nnodes x n_gpus_per_node) override
    it. The plan is lanpo's trainer's memory model for the same shapes, not verl's (verl's FSDP shards, offloads and
    packs on its own terms): the keys it could not map are listed. docs/verl.md, "Planning".
      lanpo plan --verl examples/verl/lanpo_paper.yaml --gpu-memory 79 trainer.n_gpus_per_node=4
    """
    from lanpo.train.config import load_config
    from lanpo.train.plan import make_plan
    from lanpo.train.plan_shapes import model_shape
    from lanpo.train.plan_tokens import generation_line
    from lanpo.train.plan_verdict import check_fits, table, tight_hint

    if (config_path is None) == (verl_path is None):
        raise InputError("name one recipe: --config FILE.toml or --verl FILE.yaml", hint="see `lanpo plan --help`")
    if verl_path is not None:
        if overrides:
            raise InputError("--set overrides a lanpo recipe", hint="with --verl, override its keys as KEY=VALUE")
        if gpus is not None:
            raise InputError(
                "--verl reads the GPUs from the verl config", hint="pass trainer.n_gpus_per_node=N trainer.nnodes=M"
            )
        cfg, gpus = _from_verl(verl_path, list(verl_overrides))
    else:
        if verl_overrides:
            raise InputError(
                f"unexpected argument {verl_overrides[0]!r}", hint="override a lanpo recipe with --set KEY=VALUE"
            )
        cfg = load_config(config_path, list(overrides))
        gpus = gpus or 1
    shape = model_shape(model or cfg.model.name)
    plan = make_plan(cfg, shape, gpus, gpu_memory)
    click.echo(table(plan))
    click.echo(generation_line(cfg))
    hint = tight_hint(cfg, shape, gpus, gpu_memory, plan)
    if hint:
        click.echo(f"hint: {hint}")
    check_fits(cfg, shape, gpus, gpu_memory, plan, warn=False)


def _from_verl(path: Path, overrides: list[str]) -> tuple[TrainConfig, int]:
    """The TrainConfig a verl config maps to and its GPUs; prints the mapping and the keys not mapped."""
    from lanpo.paths import input_file
    from lanpo.train.config import load_config
    from lanpo.train.plan_verl import map_verl

    inputs = map_verl(input_file(path, "--verl"), overrides)
    click.echo(
        f"verl config {path} mapped to lanpo's planner: this is lanpo's trainer's memory model for the same shapes, "
        "not verl's (verl's FSDP shards, offloads and packs sequences on its own terms; docs/verl.md, \"Planning\")"
    )
    extra = f", with lanpo.overrides {' '.join(inputs.lanpo_overrides)}" if inputs.lanpo_overrides else ""
    click.echo(f"  lanpo recipe: {inputs.recipe} (lanpo.config{extra})")
    width = max(len(m.verl_key) for m in inputs.mapped)
    for m in inputs.mapped:
        shown = f"{m.verl_value}" + (" (verl's default)" if m.default else "")
        click.echo(f"  {m.verl_key:<{width}} = {shown}  ->  {m.lanpo_key} = {m.lanpo_value}")
    unmapped = ", ".join(inputs.unmapped) if inputs.unmapped else "none"
    click.echo(f"  not mapped (verl's memory, no counterpart in lanpo's trainer): {unmapped}")
    if not any(m.lanpo_key == "steps" for m in inputs.mapped):
        click.echo(
            "  steps: the lanpo recipe's (verl counts trainer.total_epochs over the data; "
            "trainer.total_training_steps=N maps)"
        )
    click.echo("  a hint below names lanpo's key: the verl key it comes from is on its line above")
    return load_config(inputs.recipe, inputs.overrides, world=1), inputs.gpus
