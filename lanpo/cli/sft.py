"""`lanpo sft`: the supervised warm start (answer format + the three atomic skills) into a LoRA adapter;
`lanpo sft data`: teacher-written pairs for the three skills, verified (the paper's SFT data)."""

from __future__ import annotations

from pathlib import Path

import click

from lanpo.cli.keys import keys_option
from lanpo.cli.params import SEED, Float, Int, recipe_option, set_option
from lanpo.config import DTYPE_NAMES


@click.group("sft", invoke_without_command=True)
@keys_option("lanpo.train.config:TrainConfig")
@recipe_option(
    "TOML recipe; uses its model, lora, data and sft sections (required unless a sub-command is given).",
    required=False,
)
@click.option(
    "--data",
    "data_path",
    type=click.Path(dir_okay=False, exists=True),
    help='Chat pairs JSONL, one {"messages": [...]} per line (default: built from data.task).',
)
@set_option("Override a config field, e.g. --set sft.max_steps=20.")
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
@click.pass_context
def command(
    ctx: click.Context,
    config_path: Path | None,
    data_path: str | None,
    overrides: tuple[str, ...],
    out_dir: str | None,
    write_data: str | None,
    no_db: bool,
) -> None:
    """Fine-tune a LoRA adapter on chat pairs; the adapter is a valid model.init_adapter for `lanpo train`.

    \b
    lanpo sft --config C [--data pairs.jsonl]      train the warm start
    lanpo sft data --teacher M --dataset D --n 3000 --out pairs.jsonl   write teacher pairs (see its --help)
    """
    if ctx.invoked_subcommand is not None:
        return
    if config_path is None:
        raise click.UsageError("missing option '--config'", ctx)
    from lanpo.paths import output_file
    from lanpo.train.config import load_config
    from lanpo.train.sft.pairs import problems_for_sft, sft_pairs, write_pairs
    from lanpo.train.sft.warm_start import run_sft

    cfg = load_config(config_path, list(overrides))
    if write_data:
        output_file(write_data, "--write-data")
        pairs = sft_pairs(problems_for_sft(cfg), seed=cfg.sft.seed, skill_problems=cfg.sft.skill_problems)
        write_pairs(pairs, write_data)
        click.echo(f"wrote {len(pairs)} chat pairs to {write_data}")
        return
    db = None
    if not no_db:
        from lanpo.db.connection import connect

        db = connect()
    result = run_sft(cfg, data_path, db=db, out_dir=out_dir, progress=True)
    curve = ", ".join(f"{x:.3f}" for x in result.losses[:: max(1, len(result.losses) // 10)])
    click.echo(f"{result.pairs} pairs, {len(result.losses)} steps in {result.seconds:.0f}s; loss: {curve}")
    click.echo(f"adapter: {result.adapter_dir}")
    click.echo(f"next: lanpo train --config {config_path} --set model.init_adapter={result.adapter_dir}")


@command.command("data")
@click.option(
    "--teacher",
    required=True,
    help="Teacher: a model name or folder (smollm2, a HF folder, a cached hub id); with --url, the model it serves.",
)
@click.option("--dataset", required=True, help="Problems in the store to write pairs for (gold answers grade them).")
@click.option("--n", "n", default=3000, show_default=True, type=Int(1), help="Pairs wanted (split over 3 skills).")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Pairs JSONL to write.")
@click.option(
    "--url", default=None, help="An OpenAI-compatible endpoint (e.g. http://host:8000/v1) instead of a local model."
)
@click.option(
    "--api-key-env",
    default="OPENAI_API_KEY",
    show_default=True,
    help="Environment variable holding the endpoint's API key (unset: no key is sent).",
)
@click.option("--backend", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True, help="Local teacher.")
@click.option("--max-new-tokens", default=2048, show_default=True, type=Int(1), help="Reply length limit.")
@click.option("--temperature", default=0.7, show_default=True, type=Float(min=0), help="Sampling temperature.")
@click.option("--top-p", default=0.95, show_default=True, type=Float(0, 1, min_open=True), help="Nucleus mass.")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Problem order, lesson choice, sampling.")
@click.option("--batch-size", default=16, show_default=True, type=Int(1), help="Problems per round of requests.")
@click.option(
    "--dtype", type=click.Choice(DTYPE_NAMES), default="auto", show_default=True, help="Local teacher dtype."
)
@click.option("--device", default=None, help="torch device of a local teacher (default: cuda when available).")
def data_cmd(
    teacher: str,
    dataset: str,
    n: int,
    out_path: str,
    url: str | None,
    api_key_env: str,
    backend: str,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    batch_size: int,
    dtype: str,
    device: str | None,
) -> None:
    """Write teacher pairs for the three atomic skills (summarisation, inspection / reflection, response with
    feedback), keeping only verified ones: a correct final answer (math-verify against the gold) and the skill's
    headers. Each line is {"messages": [...], "provenance": {teacher, skill, template versions, time, problem,
    verdicts}}; `lanpo sft --data` and `sft.data` read it. Prompts never carry the gold answer.
    """
    import os

    from lanpo.db.connection import connect, transaction
    from lanpo.db.repo.problems import problems_of_dataset, require_dataset
    from lanpo.errors import InputError
    from lanpo.models import check_device, check_model_ref
    from lanpo.paths import output_file
    from lanpo.rollout import SamplingParams
    from lanpo.train.sft import teacher as teachers
    from lanpo.train.sft.pairs import write_pairs

    output_file(out_path, "--out")
    with transaction(connect()) as session:
        require_dataset(session, dataset)
        rows = problems_of_dataset(session, dataset)
    problems = [teachers.SourceProblem(f"{dataset}:{r.external_id}", r.question, r.answer) for r in rows if r.answer]
    if not problems:
        raise InputError(f"dataset {dataset!r} has no problem with a gold answer", hint="pairs are kept by grading")
    if url is not None:
        source: teachers.Teacher = teachers.EndpointTeacher(url, teacher, os.environ.get(api_key_env) or None)
    else:
        check_model_ref(teacher, "--teacher")
        check_device(device)
        source = teachers.load_teacher(teacher, backend, dtype=dtype, device=device)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    report = teachers.generate_pairs(source, problems, n, params, seed=seed, batch_size=batch_size)
    for skill in teachers.SKILLS:
        rejected = ", ".join(
            f"{k.split('/')[1]} {v}" for k, v in sorted(report.rejected.items()) if k.startswith(skill)
        )
        click.echo(
            f"{skill}: {report.kept[skill]} kept of {report.generated[skill]}"
            + (f" (rejected: {rejected})" if rejected else ""),
            err=True,
        )
    if not report.pairs:
        raise InputError(
            f"no pair passed the filters (correct answer and headers): nothing was written to {out_path}",
            hint="use a stronger teacher, more problems, or a longer --max-new-tokens",
        )
    write_pairs(report.pairs, out_path)
    short = f" (wanted {n}: the dataset ran out)" if len(report.pairs) < n else ""
    click.echo(f"wrote {len(report.pairs)} pairs to {out_path}{short}")
