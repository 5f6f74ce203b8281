"""`lanpo relevance ...`: pre-compute problem-to-problem relevance scores (stage 1 + LLM judge), and inspect them."""

from __future__ import annotations

import click

from lanpo.cli.params import Float, Int, field_option
from lanpo.db.connection import connect
from lanpo.feedback.config import InterConfig
from lanpo.inference.config import RetrievalSettings
from lanpo.retrieval import EF_SEARCH_MAX, STAGE1
from lanpo.retrieval.search import SearchParams

STAGE1_CHOICE = click.Choice(STAGE1)


@click.group("relevance")
def command() -> None:
    """Problem-to-problem relevance r(p, c) in relevance_scores, read by inter-sample training."""


@command.command("build")
@click.option("--dataset", required=True, help="Dataset whose problems are scored against each other.")
@field_option(
    RetrievalSettings, "top_k", type=Int(1), help="Stage-1 candidates per problem, judged by the judge model."
)
@click.option(
    "--judge",
    "--scorer",
    "judge",
    default="smollm2",
    show_default=True,
    help="Judge model: `smollm2` (offline), HF folder or hub id (--scorer: the old spelling).",
)
@click.option("--stage1", type=STAGE1_CHOICE, default="bm25", show_default=True, help="Candidate search.")
@click.option("--batch-size", type=Int(1), default=16, show_default=True, help="Pairs per forward.")
@field_option(SearchParams, "ef_search", type=Int(1, EF_SEARCH_MAX), help="HNSW ef_search.")
@click.option("--device", default=None, help="torch device for the judge (default: cuda if available, else cpu).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def build_cmd(
    dataset: str,
    top_k: int,
    judge: str,
    stage1: str,
    batch_size: int,
    ef_search: int,
    device: str | None,
    no_progress: bool,
) -> None:
    """For every problem: stage-1 top-k other problems, judged by the judge model, stored under its scorer identity.

    Resumable (each batch commits; a rerun scores only missing pairs) and idempotent.

    \b
    Example:
      lanpo relevance build --dataset chain_sum --top-k 16 --judge smollm2 --stage1 hybrid
    """
    from sqlalchemy.orm import Session

    from lanpo.db.repo.problems import require_dataset
    from lanpo.models import check_device, check_model_ref
    from lanpo.retrieval.build import build_relevance
    from lanpo.retrieval.search import SearchParams

    params = SearchParams(stage1=stage1, ef_search=ef_search)
    check_model_ref(judge, "--judge")
    check_device(device)
    db = connect()
    with Session(db) as session:  # before the judge loads: a typo in the name fails in a second
        require_dataset(session, dataset)
    built = build_relevance(
        db,
        dataset,
        judge,
        top_k=top_k,
        params=params,
        batch_size=batch_size,
        device=device,
        progress=not no_progress,
    )
    report = built.report
    click.echo(
        f"{report.problems} problems, {report.pairs} pairs: {report.cached} already scored, {report.scored} scored "
        f"now ({report.pairs_per_second:.2f} pairs/s) by {built.scorer} in {report.seconds:.1f} s"
    )


@command.command("status")
@click.option("--dataset", required=True, help="Dataset to report on.")
@field_option(InterConfig, "gamma", type=Float(0, 1), help="Relevance threshold (the trainer's feedback.inter.gamma).")
def status_cmd(dataset: str, gamma: float) -> None:
    """Scored problem pairs per scorer, and how many reach gamma."""
    from sqlalchemy.orm import Session

    from lanpo.retrieval.relevance import relevance_status

    with Session(connect()) as session:
        rows = relevance_status(session, dataset, gamma)
    if not rows:
        click.echo(f"no relevance scores for dataset {dataset!r} yet (run `lanpo relevance build`)")
        return
    click.echo(f"{'scorer':<40} {'problems':>8} {'pairs':>8} {'>=gamma':>8} {'mean':>6}")
    for row in rows:
        counts = f"{row['problems']:>8} {row['pairs']:>8} {row['at_gamma']:>8}"
        click.echo(f"{row['scorer']:<40} {counts} {row['mean_score']:>6.3f}")
