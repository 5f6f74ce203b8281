"""`lanpo retrieve "QUESTION"`: test-time retrieval of experiences from the current pool, with their scores."""

from __future__ import annotations

import click

from lanpo.cli.params import Float, Int, field_option
from lanpo.db.connection import connect
from lanpo.inference.config import RetrievalSettings
from lanpo.retrieval import EF_SEARCH_MAX, STAGE1
from lanpo.retrieval.search import SearchParams


@click.command("retrieve")
@click.argument("question")
@field_option(
    SearchParams, "stage1", type=click.Choice(STAGE1), help="Candidate search over the current experience summaries."
)
@field_option(RetrievalSettings, "top_k", type=Int(1))
@field_option(RetrievalSettings, "gamma", type=Float(0, 1))
@field_option(RetrievalSettings, "m", "--m", "m", type=Int(1), help="Experiences returned, best first (at most).")
@click.option(
    "--judge",
    "--scorer",
    "judge",
    default="smollm2",
    show_default=True,
    help="Judge model (`smollm2`, HF folder, hub id), or `none`: stage 1 only, no gamma filter (--scorer: the old "
    "spelling).",
)
@click.option(
    "--embedding-model", default="all-MiniLM-L6-v2", show_default=True, help="Embeds the question (vector/hybrid)."
)
@field_option(SearchParams, "ef_search", type=Int(1, EF_SEARCH_MAX), help="HNSW ef_search.")
@click.option("--device", default=None, help="torch device for the judge.")
@click.option(
    "--pool", "pool_name", default=None, help="Experience pool to search (default: the only pool in the store)."
)
def command(
    question: str,
    stage1: str,
    top_k: int,
    gamma: float,
    m: int,
    judge: str,
    embedding_model: str,
    ef_search: int,
    device: str | None,
    pool_name: str | None,
) -> None:
    """Print up to M experiences relevant to QUESTION (stage 1 -> LLM rerank -> gamma filter).

    A pool with no active lesson is not an error: the command says so at once, before it loads a model, and exits 0
    (the question is then answered zero-shot). A --pool that names no pool, or several pools and no --pool, is an
    error (exit 2).

    \b
    Example:
      lanpo retrieve "What is 17 + 25 - 3?" --stage1 bm25 --gamma 0.5 --m 3
    """

    from lanpo.db.connection import transaction
    from lanpo.db.repo.pools import active_size, resolve_pool
    from lanpo.models import check_device, check_model_ref
    from lanpo.retrieval.corpus import BM25Cache
    from lanpo.retrieval.embeddings import check_embedder_ref
    from lanpo.retrieval.judge import load_judge
    from lanpo.retrieval.testtime import check_question, default_embedder, retrieve

    check_question(question)  # everything a typo can break is checked before a model loads
    if judge.lower() != "none":
        check_model_ref(judge, "--judge")
    if stage1 != "bm25":
        check_embedder_ref(embedding_model)
    check_device(device)
    db = connect()
    with transaction(db) as session:
        pool = resolve_pool(session, pool_name)  # before loading any model: a wrong name fails at once
        lessons = active_size(session, pool.id)
    if lessons == 0:  # nothing to rank: loading the judge and the embedder would take seconds for nothing
        click.echo(f"no experiences: pool {pool.name!r} holds no active lesson yet, so answer zero-shot")
        return
    rater = None if judge.lower() == "none" else load_judge(judge, device=device)
    embedder = default_embedder(embedding_model) if stage1 != "bm25" else None
    with transaction(db) as session:  # commits the embeddings vector search fills in for new lessons
        found = retrieve(
            session,
            question,
            pool_id=pool.id,
            stage1=stage1,
            top_k=top_k,
            gamma=gamma,
            m=m,
            rater=rater,
            embedder=embedder,
            ef_search=ef_search,
            cache=BM25Cache(),
        )
    if not found:
        what = f"none of its {lessons} lesson(s) reached gamma" if rater else "stage 1 found none"
        click.echo(f"no experiences ({what}): answer zero-shot")
        return
    for rank, hit in enumerate(found, start=1):
        relevance = "-" if hit.relevance is None else f"{hit.relevance:.3f}"
        click.echo(
            f"#{rank} version {hit.experience_version_id} (problem {hit.source_problem_id}) "
            f"relevance {relevance} stage1 {hit.stage1_score:.4f}"
        )
        click.echo("   " + hit.summary.replace("\n", "\n   "))
