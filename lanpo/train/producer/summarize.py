"""The cross-rank half of choosing which successful rollouts to summarise: under torchrun, rank 0 chooses over the
whole step. Choosing, summarising and admission are `lanpo.feedback.summarize`'s.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from lanpo.feedback.summarize import Candidate, choose_candidates
from lanpo.train.plumbing.dist import Dist


def choose_for_step(dist: Dist, candidates: list[Candidate], per_problem: int, total: int) -> list[Candidate]:
    """This rank's share of `choose_candidates` over the whole step (`Candidate.index` numbers the step's
    rollouts). With a total cap under torchrun, rank 0 chooses from every rank's candidates at once: the lessons
    one process would choose from the same rollouts, never more than `total` over the ranks, wherever the
    successes fall. Only keys travel (index, problem, reward, a digest of the response), never the texts."""
    if not dist.enabled or total == 0:  # per problem alone, each problem's rollouts are on one rank
        return choose_candidates(candidates, per_problem, total)
    keys = [replace(c, question="", response=_digest(c.response), answer=None) for c in candidates]
    everyone = dist.gather(keys)  # rank 0: one list a rank
    picked = None
    if everyone is not None:
        chosen = {c.index for c in choose_candidates([k for rank in everyone for k in rank], per_problem, total)}
        picked = [[k.index for k in rank if k.index in chosen] for rank in everyone]
    mine = set(dist.scatter(picked))
    return [c for c in candidates if c.index in mine]


def _digest(response: str) -> str:
    """What `choose_candidates` compares of a response (its stripped text), in 40 characters."""
    return hashlib.sha1(response.strip().encode()).hexdigest()
