"""`lanpo report RUN|EXPERIMENT... [--out DIR]`: figures, report.md and table.csv from the store."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from lanpo.report.series import BAND_LABELS


@click.command("report")
@click.argument("names", nargs=-1, required=True, metavar="RUN|EXPERIMENT...")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder to write (created; one holding an earlier report is replaced). "
    "Default: $LANPO_HOME/reports/<first name>.",
)
@click.option(
    "--band",
    type=click.Choice(list(BAND_LABELS)),
    default="minmax",
    show_default=True,
    help="The shaded band of an arm over its seeds: min–max, or ±1 sample std.",
)
@click.option(
    "--baseline",
    metavar="ARM",
    default=None,
    help="The arm paired differences are taken against (default: the arm named grpo, or the one without feedback).",
)
def command(names: tuple[str, ...], out_dir: Path | None, band: str, baseline: str | None) -> None:
    """Plot runs (overlaid) or an experiment (its arms, each with a band over seeds) and write a report.

    \b
    Writes PNG figures (reward and accuracy by mode, validation mean@k against steps, generated tokens and
    training time, response length and tokens per step, KL / entropy / clip fraction, loss, feedback served
    against p_t, pool size, seconds per phase, MEL and engine when recorded), report.md embedding them with the
    final table in the paper's Table 1 shape and its cost (every generated token, training minutes, prompt
    tokens), each arm's accuracy at a matched generated-token budget (matched_budget.png / .csv), the lift of
    each lesson version the runs used against its graded attempts, with its 95% interval and probation state
    (lesson_lift.png / .csv, when they used any), and table.csv.
    A name is a run or an experiment; `run:NAME` or `experiment:NAME` says which when a name is both.
    """
    import sqlalchemy as sa

    from lanpo.config import lanpo_home
    from lanpo.db.connection import connect, transaction
    from lanpo.report.build import read_report, write_report
    from lanpo.report.output import check_out_dir

    out = check_out_dir(out_dir if out_dir is not None else lanpo_home() / "reports" / names[0].replace("/", "_"))
    with transaction(connect()) as session:
        # one snapshot: a run that commits a step meanwhile is read as it was, not half before and half after
        session.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
        data = read_report(session, names, baseline)
    line = shlex.join(["lanpo", "report", *names, "--out", str(out), "--band", band])
    result = write_report(data, out, band, line)  # type: ignore[arg-type]
    final = result.table.to_markdown("final")
    if final:
        click.echo(final)
    click.echo(f"wrote {len(result.figures)} figures, report.md and table.csv to {out}")
    if result.not_recorded:
        click.echo(f"not recorded, so not drawn: {', '.join(result.not_recorded)}")
