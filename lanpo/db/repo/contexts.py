"""The two feedback contexts the prompts consume, drawn with `sampling`.

`IntraItem` carries ONLY prompt-visible text: the attempt id (for attempt_contexts) and the response.
It has no field that could hold a reward, correctness flag or gold answer, and none is ever read here.
`InterItem` carries an experience version's summary, its source problem and the relevance score.
`InterAttemptItem` is Fig. 2c's random arm's item: a correct attempt of another problem, its response as `summary`
(the field the inter prompt reads), nothing of its grade. `leaked_gold_answers` is read by Fig. 2b's leakage arm
alone (`lanpo.feedback.draw.leaked_questions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.repo import runs, sampling
from lanpo.db.repo.attempts import ContextRef
from lanpo.errors import InputError, listing


@dataclass(frozen=True, slots=True)
class IntraItem:
    """An earlier attempt on the same problem, as the actor may see it: its response text, nothing else."""

    attempt_id: int
    response: str

    def ref(self, position: int) -> ContextRef:
        return ContextRef(position=position, context_attempt_id=self.attempt_id)


@dataclass(frozen=True, slots=True)
class InterItem:
    """A lesson from another problem: the current summary of an experience version and its relevance."""

    experience_version_id: int
    source_problem_id: int
    summary: str
    score: float

    def ref(self, position: int) -> ContextRef:
        return ContextRef(position=position, experience_version_id=self.experience_version_id, score=self.score)


@dataclass(frozen=True, slots=True)
class InterAttemptItem:
    """A correct attempt of another problem of the run, shown raw (Fig. 2c's random arm): its response, nothing else
    of its grade. `summary` holds the response because that is the field an inter prompt reads."""

    attempt_id: int
    source_problem_id: int
    summary: str

    def ref(self, position: int) -> ContextRef:
        return ContextRef(position=position, context_attempt_id=self.attempt_id)


# the groups whose correct attempts Fig. 2c's random arm may show: a run's ordinary training rollouts
RANDOM_SOURCE_MODES = ("zero_shot", "intra", "inter")


def random_attempt_contexts(
    session: Session, problem_ids: Sequence[int], k: int, seed: int, run_id: int
) -> dict[int, list[InterAttemptItem]]:
    """problem id -> up to k of run `run_id`'s correct attempts of OTHER problems, drawn uniformly without
    replacement (sample_inter_random_attempts.sql: Fig. 2c's random arm, feedback.inter.draw = random)."""
    runs.require_run(session, run_id)
    ids = sorted({int(p) for p in problem_ids})
    out: dict[int, list[InterAttemptItem]] = {p: [] for p in ids}
    if not ids or k <= 0:
        return out
    params = {"problem_ids": ids, "k": k, "seed": seed, "run_id": run_id, "modes": list(RANDOM_SOURCE_MODES)}
    for r in session.execute(sqlfiles.load("queries/sample_inter_random_attempts"), params):
        out[r.problem_id].append(InterAttemptItem(r.candidate_id, r.source_problem_id, r.text))
    return out


def leaked_gold_answers(session: Session, problem_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
    """Fig. 2b's leakage arm alone: problem id -> (question, gold answer). InputError for a problem with no answer
    (its leaked prompt would show nothing)."""
    ids = sorted({int(p) for p in problem_ids})
    rows = session.execute(sqlfiles.load("queries/leaked_gold_answers"), {"ids": ids}).all()
    missing = [r.id for r in rows if r.answer is None or not str(r.answer).strip()]
    if missing:
        raise InputError(
            f"feedback.mode = leaked-intra shows each problem's gold answer; problems {listing(map(str, missing))} "
            "have none",
            hint="train the leaked-intra arm on a dataset whose problems all have answers",
        )
    return {r.id: (r.question, str(r.answer)) for r in rows}


def intra_contexts(
    session: Session,
    problem_ids: Sequence[int],
    k: int,
    candidates: int,
    seed: int,
    run_id: int | None = None,
) -> dict[int, list[IntraItem]]:
    """problem id -> up to k earlier attempts on that same problem (recency-ranked pool, weighted draw).

    `run_id` (only that run's attempts) must name a run: an unknown one is an InputError, not an empty draw.
    """
    if run_id is not None:
        runs.require_run(session, run_id)
    draws = sampling.sample_intra(session, problem_ids, k=k, candidates=candidates, seed=seed, run_id=run_id)
    return {p: [IntraItem(d.candidate_id, d.text) for d in ds] for p, ds in draws.items()}


def inter_contexts(
    session: Session,
    problem_ids: Sequence[int],
    k: int,
    candidates: int,
    seed: int,
    gamma: float,
    scorer: str | None,
    pool_id: int,
    kinds: Sequence[str] | None = None,
    shows_response: bool = False,
    ranking: sampling.Ranking = sampling.PAPER_RANKING,
) -> dict[int, list[InterItem]]:
    """problem id -> up to k lessons of pool `pool_id` (of `kinds` only, when given) from OTHER problems with
    relevance >= gamma (relevance-ranked, weighted draw). `scorer = None` draws with no relevance filter at all (the
    whole pool, recency-ranked: gamma = 0 in training, lanpo's reading of Table 2's w/o filtering).
    `shows_response`: items carry the source rollout's response instead of the summary (feedback.inter.shows =
    response: lanpo's own ablation, not a Table 2 row). `ranking`: relevance (the paper) or value-aware
    (`sampling.Ranking`).

    `scorer` must have scores in the store: when nothing is drawn at all, an unknown scorer is an InputError
    naming the scorers there (checked only then, so a training step that draws pays nothing for it).
    """
    if scorer is None:
        draws = sampling.sample_inter_unfiltered(
            session,
            problem_ids,
            k=k,
            candidates=candidates,
            seed=seed,
            pool_id=pool_id,
            kinds=kinds,
            shows_response=shows_response,
            ranking=ranking,
        )
    else:
        draws = sampling.sample_inter(
            session,
            problem_ids,
            k,
            candidates,
            seed,
            gamma=gamma,
            scorer=scorer,
            pool_id=pool_id,
            kinds=kinds,
            shows_response=shows_response,
            ranking=ranking,
        )
    if scorer is not None and not any(draws.values()):
        require_scorer(session, scorer)
    return {
        p: [InterItem(d.candidate_id, int(d.source_problem_id or 0), d.text, float(d.score or 0.0)) for d in ds]
        for p, ds in draws.items()
    }


def scorers(session: Session) -> list[str]:
    """The relevance scorers with scores in `relevance_scores`, by name."""
    return list(session.scalars(sqlfiles.load("queries/scorers")))


def require_scorer(session: Session, scorer: str) -> None:
    """InputError listing the scorers in `relevance_scores` unless `scorer` has scores there."""
    if session.scalar(sqlfiles.load("queries/scorer_exists"), {"scorer": scorer}):
        return
    known = scorers(session)
    raise InputError(
        f"unknown relevance scorer {scorer!r}: relevance_scores holds no score by it",
        hint=f"scorers in the store: {listing(known)}"
        if known
        else "compute relevance first: lanpo relevance build --dataset NAME",
    )
