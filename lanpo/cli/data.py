"""`lanpo data ...`: import problems from JSONL, generate them offline with reasoning-gym, export them for verl."""

from __future__ import annotations

from pathlib import Path

import click

from lanpo.cli.params import Int
from lanpo.config import parse_override
from lanpo.data import generate, importer
from lanpo.data.presets import PRESETS
from lanpo.db.connection import connect, open_store, transaction
from lanpo.errors import InputError
from lanpo.paths import output_file


@click.group("data")
def command() -> None:
    """Problems: import JSONL, generate from reasoning-gym, export for another trainer (verl)."""


@command.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--dataset",
    default=None,
    help="Dataset name the problems belong to (ids are unique within it); with --preset, default: the preset's name.",
)
@click.option(
    "--preset",
    type=click.Choice(list(PRESETS)),
    default=None,
    help="Read FILE in a benchmark's published layout (parquet, JSONL or JSON) instead of lanpo's JSONL.",
)
@click.option("--skip-bad", is_flag=True, help="Import the good lines even if some are bad (bad ones are listed).")
@click.option("--update", is_flag=True, help="Overwrite question/answer/metadata of ids already stored.")
def import_cmd(file: Path, dataset: str | None, preset: str | None, skip_bad: bool, update: bool) -> None:
    """Import FILE (JSONL: {"id", "question", "answer", ...metadata}) in one transaction.

    \b
    Idempotent: re-importing the same file adds nothing. An id already stored with different
    text is refused unless --update. Any bad line (bad JSON, missing key, wrong type, empty
    question, NUL byte, text over 1 MiB, duplicate id) makes the import write NOTHING, unless
    --skip-bad; bad lines are always listed with their line number and reason.

    \b
    --preset reads the paper's benchmarks as published: dapo17k (DAPO-Math-17k parquet; its
    ~100x copies folded, its "Answer:" wrapper stripped), math500, aime24, aime25, amc23,
    olympiadbench. A row whose gold answer math-verify cannot parse is a bad row.
    """
    from lanpo.data import presets

    if preset is None and dataset is None:
        raise InputError("--dataset is required without --preset", hint="e.g. --dataset gsm, or --preset math500")
    folded = 0
    with transaction(connect()) as session:
        if preset is None:
            report = importer.import_file(session, file, str(dataset), skip_bad=skip_bad, update=update)
        else:
            report, folded = presets.import_preset(session, file, preset, dataset, skip_bad=skip_bad, update=update)
        if not report.imported:
            session.rollback()
    dataset = dataset or preset
    unit = "row" if preset else "line"
    for bad in report.bad[:200]:
        click.echo(
            f"{file}:{unit} {bad.line}: {bad.reason}" if preset else f"{file}:{bad.line}: {bad.reason}", err=True
        )
    if len(report.bad) > 200:
        click.echo(f"... and {len(report.bad) - 200} more bad lines", err=True)
    if not report.imported:
        changed = any("--update" in b.reason for b in report.bad)
        raise InputError(
            f"{len(report.bad)} bad {unit}{'s' if len(report.bad) != 1 else ''} in {file}: nothing was imported",
            hint="fix the lines listed above, or pass --skip-bad to import the good lines"
            + (" (or --update to overwrite changed problems)" if changed else ""),
        )
    click.echo(
        f"{dataset}: {report.inserted} inserted, {report.unchanged} unchanged, {report.updated} updated"
        + (f", {folded} duplicate row(s) folded" if folded else "")
        + (f", {len(report.bad)} bad {unit}(s) skipped" if report.bad else "")
    )


@command.command("gen")
@click.option(
    "--task",
    required=True,
    help="reasoning-gym task, e.g. gsm_symbolic, basic_arithmetic, chain_sum; or lanpo's hidden_rule.",
)
@click.option("--n", "n", required=True, type=Int(1), help="Number of problems.")
@click.option("--seed", default=0, show_default=True, type=Int(0), help="Seed (reproducible).")
@click.option(
    "--split",
    type=click.Choice(generate.SPLITS),
    default="train",
    show_default=True,
    help="train or test: disjoint seed ranges (tiny task settings can still repeat a question).",
)
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Output JSONL file.")
@click.option(
    "--task-option",
    "task_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Task config option (value read as TOML), e.g. --task-option max_terms=3. Repeatable.",
)
def gen_cmd(task: str, n: int, seed: int, split: str, out: Path, task_options: tuple[str, ...]) -> None:
    """Generate problems offline from reasoning-gym in the `data import` format (worked solution kept).

    \b
    --task hidden_rule is lanpo's own transfer task (no reasoning-gym): each question names a land whose rule for
    the operator ⊙ it never states, so a lesson from one problem of a land serves the others. Options:
    families (1-6), min_operand, max_operand (default 1-9); the test split holds other operand pairs of the
    same lands.
    """
    options = {}
    for text in task_options:
        try:
            path, value = parse_override(text)
        except Exception as exc:
            raise InputError(
                f"--task-option {text!r} must look like key=value", hint="e.g. --task-option max_terms=3"
            ) from exc
        options[".".join(path)] = value
    output_file(out, "--out")
    records = generate.generate_problems(task, n, seed=seed, split=split, options=options)
    generate.write_jsonl(records, out)
    click.echo(f"wrote {len(records)} {task} problems ({split}, seed {seed}) to {out}")


EXPORT_FORMATS = ("verl",)


@command.command("export")
@click.option("--dataset", required=True, help="The dataset to export (every problem of it, by id).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(EXPORT_FORMATS),
    default="verl",
    show_default=True,
    help="verl: RLHF parquet for verl's RLHFDataset (data.train_files / data.val_files).",
)
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Output .parquet file.")
@click.option(
    "--split",
    default="train",
    show_default=True,
    help="The split named in each row's extra_info (verl reads it as metadata only), e.g. train or test.",
)
def export_cmd(dataset: str, fmt: str, out: Path, split: str) -> None:
    """Write a dataset's problems as a file another trainer reads.

    \b
    --format verl: one row a problem, the columns verl's RLHFDataset reads (docs/verl.md, "The data"):
      prompt        lanpo's zero-shot chat messages for the question (system + user), never the answer
      data_source   "lanpo/<dataset>"
      ability       "math"
      reward_model  {"style": "rule", "ground_truth": <gold answer>}: read by the reward, never shown
      extra_info    {"problem_id", "dataset", "external_id", "index", "split"}: which stored problem it is
    lanpo's verl agent loop puts a feedback context into the prompt when p_t draws one. Every problem needs a
    gold answer; the file appears only when it is whole (an error leaves no file, nor half of one).

    \b
    Example:
      lanpo data export --dataset dapo17k --format verl --out ~/data/lanpo/dapo17k.parquet
    """
    from lanpo.integrations.verl_data import export_verl

    if out.suffix != ".parquet":
        raise InputError(
            f"--out {out} must end in .parquet", hint="verl's RLHFDataset picks its reader by the file's extension"
        )
    if not split.strip():
        raise InputError("--split must not be empty", hint="e.g. --split train")
    output_file(out, "--out")
    done = export_verl(open_store(), dataset, out, split=split)
    click.echo(f"{dataset}: wrote {done.rows} problems ({fmt}, split {split}) to {out}")
