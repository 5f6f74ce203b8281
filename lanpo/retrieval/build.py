"""`lanpo relevance build`'s one way in, for the CLI, the demo and the experiment: embed the problems where asked,
load the judge model `judge`, and run `lanpo.retrieval.relevance.build_problem_relevance` with it.

The model reference `judge` goes one way: down to `load_judge`, which makes it a loaded judge (a `rater`) whose
identity is the scorer the scores are stored under; the rater then goes to the build.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Engine

from lanpo.retrieval.embeddings import SentenceTransformerEmbedder, embed_missing
from lanpo.retrieval.judge import load_judge
from lanpo.retrieval.relevance import BuildReport, build_problem_relevance
from lanpo.retrieval.search import SearchParams


@dataclass
class RelevanceBuild:
    """What `build_relevance` did: the build, the scorer (judge identity) its scores are stored under, and how many
    problems were embedded first (None when embedding was not asked for)."""

    report: BuildReport
    scorer: str
    embedded: int | None = None


def build_relevance(
    db: Engine,
    dataset: str,
    judge: str,
    *,
    top_k: int = 16,
    params: SearchParams | None = None,
    embed: bool = False,
    batch_size: int = 16,
    device: str | None = None,
    progress: bool = False,
) -> RelevanceBuild:
    """Problem-to-problem relevance of `dataset` judged by the model `judge` (`lanpo relevance build`, the demo and
    the experiment's shared step): with `embed`, first the problems still without a vector get one (MiniLM,
    offline); then the judge loads and every stage-1 pair not scored yet is scored and stored."""
    embedded = None
    if embed:
        count = embed_missing(db, SentenceTransformerEmbedder(), dataset=dataset, what="problems", progress=False)
        embedded = count.problems
    rater = load_judge(judge, batch_size=batch_size, device=device)
    report = build_problem_relevance(db, dataset, rater, top_k=top_k, params=params, progress=progress)
    return RelevanceBuild(report, rater.identity, embedded)
