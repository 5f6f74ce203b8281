"""The samplers bound to the context modes of `lanpo.feedback_modes`: how each draws its items from the store.

`intra` draws the run's own earlier attempts on the same problem (recency-ranked, weighted draw: responses only);
`inter` draws lessons of OTHER problems of the run's pool whose relevance passes gamma (relevance-ranked, weighted
draw; or, `feedback.inter.draw = random`, Fig. 2c's random arm: correct attempts of other problems of the run, drawn
uniformly); `leaked_intra` (Fig. 2b's arm) draws exactly as intra, and its gold answers come from a function of its
own, `leaked_questions`, that no other mode's path calls. What each may show and must never show is the mode
table's (`lanpo.feedback_modes.MODES`); the SQL that keeps those rules is `lanpo.db.repo.contexts`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from lanpo import prompts
from lanpo.db.repo.contexts import inter_contexts, intra_contexts, leaked_gold_answers, random_attempt_contexts
from lanpo.db.repo.sampling import PAPER_RANKING, Ranking
from lanpo.feedback_modes import CONTEXT_MODES, GAMMA, LEAKED_MODE, mode


@dataclass(frozen=True)
class ContextDraw:
    """What a context draw needs from the run: the sampler of each context mode reads its own fields."""

    k: int  # items per prompt
    candidates: int  # the ranked candidates the k are drawn from (pool_size in the paper)
    seed: int
    run_id: int | None = None  # intra: only this run's attempts
    pool_id: int | None = None  # inter: the pool lessons come from
    gamma: float = GAMMA  # inter: minimum relevance; 0 reads no relevance at all (the whole pool, by recency)
    scorer: str | None = None  # inter: the stored relevance identity; None with gamma > 0 draws nothing
    kinds: Sequence[str] | None = None  # inter: experience kinds drawn from
    shows_response: bool = False  # inter: items show the source rollout's response instead of its lesson
    inter_draw: str = "relevant"  # inter: relevant (the pool's lessons) | random (correct attempts, Fig. 2c)
    ranking: Ranking = PAPER_RANKING  # inter: relevance (the paper) | value (lessons on probation)


ContextSampler = Callable[[Session, Sequence[int], ContextDraw], dict[int, list[Any]]]


def same_problem(session: Session, problem_ids: Sequence[int], draw: ContextDraw) -> dict[int, list[Any]]:
    """Up to k of the run's earlier attempts on each problem (recency-ranked, weighted draw): responses only."""
    return dict(intra_contexts(session, problem_ids, draw.k, draw.candidates, draw.seed, run_id=draw.run_id))


def other_problems(session: Session, problem_ids: Sequence[int], draw: ContextDraw) -> dict[int, list[Any]]:
    """Up to k lessons of the pool from other problems with relevance >= gamma (relevance-ranked, weighted draw);
    gamma 0 consults no relevance and ranks by recency (lanpo's reading of Table 2's w/o filtering); with gamma > 0
    and no scorer nothing is drawn. `inter_draw = random` (Fig. 2c's random arm): up to k of the run's correct
    attempts of other problems, uniformly, no relevance and no pool read."""
    if draw.inter_draw == "random":
        if not problem_ids or draw.run_id is None:
            return {}
        return dict(random_attempt_contexts(session, problem_ids, draw.k, draw.seed, draw.run_id))
    unfiltered = draw.gamma == 0.0
    if not problem_ids or not (draw.scorer or unfiltered) or draw.pool_id is None:
        return {}
    drawn = inter_contexts(
        session,
        problem_ids,
        draw.k,
        draw.candidates,
        draw.seed,
        draw.gamma,
        None if unfiltered else draw.scorer,
        draw.pool_id,
        draw.kinds,
        shows_response=draw.shows_response,
        ranking=draw.ranking,
    )
    return dict(drawn)


def leaked_questions(session: Session, problem_ids: Sequence[int]) -> dict[int, str]:
    """Fig. 2b's leakage arm alone (`LEAKED_MODE`): problem id -> its question with its gold answer stated
    (`prompts.leaked_question`), read from the problem row. The intra sampler reads responses only; this is the one
    path from a gold answer to a prompt, and `lanpo.feedback.contexts` calls it for prompts asked in LEAKED_MODE."""
    return {p: prompts.leaked_question(q, a) for p, (q, a) in leaked_gold_answers(session, problem_ids).items()}


# LEAKED_MODE draws its earlier attempts exactly as intra does (responses only); its gold answer is leaked_questions'
SAMPLERS: dict[str, ContextSampler] = {"intra": same_problem, "inter": other_problems, LEAKED_MODE: same_problem}
if set(SAMPLERS) != set(CONTEXT_MODES):  # a context mode added to the table needs its sampler here
    raise RuntimeError(f"samplers for {sorted(SAMPLERS)}, context modes {sorted(CONTEXT_MODES)}")


def draw_contexts(
    session: Session, wanted: dict[str, Sequence[int]], draw: ContextDraw
) -> dict[str, dict[int, list[Any]]]:
    """Per context mode, the contexts its sampler draws for the problems `wanted` in it (problem id -> items)."""
    out: dict[str, dict[int, list[Any]]] = {}
    for name, problem_ids in wanted.items():
        mode(name)  # an unknown mode is a ValueError naming the modes
        if name not in SAMPLERS:
            raise ValueError(f"mode {name!r} draws no context; expected one of {', '.join(CONTEXT_MODES)}")
        out[name] = SAMPLERS[name](session, problem_ids, draw)
    return out
