"""`lanpo sft`: the supervised warm start (answer format + the three atomic skills) into a LoRA adapter."""

from __future__ import annotations

import click

from lanpo.cli.keys import keys_option


@click.command("sft")
@keys_option("lanpo.train.config:TrainConfig")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="TOML recipe; uses its model, lora, data and sft sections.",
)
@click.option(
    "--data",
    "data_path",
    type=click.Path(dir_okay=False, exists=True),
    help='Chat pairs JSONL, one {"messages": [...]} per line (default: built from data.task).',
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config field, e.g. --set sft.max_steps=20.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    help="Where to write the adapter (default: <output_dir>/sft).",
)
@click.option(
    "--write-data", type=click.Path(dir_okay=False), help="Only write the built chat pairs to this JSONL and exit."
)
@click.option("--no-db", is_flag=True, help="Do not record the run and its loss curve in the database.")
def command(
    config_path: str,
    data_path: str | None,
    overrides: tuple[str, ...],
    out_dir: str | None,
    write_data: str | None,
    no_db: bool,
) -> None:
    """Fine-tune a LoRA adapter on chat pairs; the adapter is a valid model.init_adapter for `lanpo train`."""
    from lanpo.paths import output_file
    from lanpo.train.config import load_config
    from lanpo.train.sft import problems_for_sft, run_sft, sft_pairs, write_pairs

    cfg = load_config(config_path, list(overrides))
    if write_data:
        output_file(write_data, "--write-data")
        pairs = sft_pairs(problems_for_sft(cfg), seed=cfg.sft.seed, skill_problems=cfg.sft.skill_problems)
        write_pairs(pairs, write_data)
        click.echo(f"wrote {len(pairs)} chat pairs to {write_data}")
        return
    engine = None
    if not no_db:
        from lanpo.db.engine import connect

        engine = connect()
    result = run_sft(cfg, data_path, engine=engine, out_dir=out_dir, progress=True)
    curve = ", ".join(f"{x:.3f}" for x in result.losses[:: max(1, len(result.losses) // 10)])
    click.echo(f"{result.pairs} pairs, {len(result.losses)} steps in {result.seconds:.0f}s; loss: {curve}")
    click.echo(f"adapter: {result.adapter_dir}")
    click.echo(f"next: lanpo train --config {config_path} --set model.init_adapter={result.adapter_dir}")
