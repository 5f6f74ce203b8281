"""Replay's store side: the tokens and behaviour log-probs of attempts, the stored trajectories a step may replay,
the problems' latest correctness, and the replayed groups a step trains on (migration 0017).

A replayed attempt is a copy of a stored one (its response and grade) in a group of mode `replayed` at the step
that replays it, with `replay_of` naming the source; it is never generated, and no fresh-rollout view, metric or
cost counts it (the `replays` view lists them). Its group belongs to the step, so a resume's rollback of the step
(`sql/queries/rollback_groups.sql`) removes it with the step's other groups. The draw of which to replay is
`lanpo.feedback.replay_draw`, one floor up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.models_replay import LOGPROBS_OF
from lanpo.db.repo import bulk
from lanpo.db.repo.attempts import NewAttempt, NewGroup, record_groups
from lanpo.errors import InputError

TOKEN_TYPES = ("int8", "int4[]", "float4[]", "text")


@dataclass(frozen=True)
class Candidate:
    """A stored trajectory a step may replay: a graded attempt of a zero_shot group, with its tokens."""

    attempt_id: int
    problem_id: int
    run_id: int
    step: int
    prompt: str  # the group's prompt text (the question alone, as the actor template rendered it)
    prompt_version: str | None
    response: str
    reward: float | None
    correct: bool | None
    format_ok: bool | None
    token_ids: list[int]
    logprobs: list[float]  # the behaviour log-prob of each token, under the policy that generated it
    logprobs_of: str  # engine | trainer
    completion_tokens: int | None
    created_at: datetime
    prompt_tokens: int | None = None


class ReplayGroup(Protocol):
    """One problem's replayed trajectories at a step (`lanpo.feedback.replay_draw.ReplayDraw` is one)."""

    @property
    def problem_id(self) -> int: ...
    @property
    def candidates(self) -> Sequence[Candidate]: ...


def _token_row(row: Sequence[object], where: str) -> tuple[int, list[int], list[float], str]:
    if len(row) != 4:
        raise InputError(f"{where}: expected (attempt_id, token_ids, logprobs, logprobs_of), got {len(row)} fields")
    attempt_id, token_ids, logprobs, logprobs_of = row
    if not isinstance(attempt_id, int) or isinstance(attempt_id, bool):
        raise InputError(f"{where}: attempt_id must be an integer, got {attempt_id!r}")
    ids, lps = list(token_ids), list(logprobs)  # type: ignore[call-overload]
    if not ids or len(ids) != len(lps):
        raise InputError(f"{where}: token_ids and logprobs must be of one length >= 1, got {len(ids)} and {len(lps)}")
    if any(not isinstance(t, int) or t < 0 for t in ids):
        raise InputError(f"{where}: token ids must be integers >= 0")
    if any(not math.isfinite(float(x)) for x in lps):
        raise InputError(f"{where}: logprobs must be finite")
    if logprobs_of not in LOGPROBS_OF:
        raise InputError(f"{where}: logprobs_of must be one of {', '.join(LOGPROBS_OF)}, got {logprobs_of!r}")
    return attempt_id, [int(t) for t in ids], [float(x) for x in lps], str(logprobs_of)


def write_tokens(session: Session, rows: Iterable[Sequence[object]]) -> int:
    """Store each attempt's completion token ids and their behaviour log-probs: rows of (attempt_id, token_ids,
    logprobs, logprobs_of), logprobs_of 'engine' or 'trainer'. Every row is checked before anything is written
    (InputError names the first bad one); an unknown or repeated attempt is an InputError from the COPY. Returns
    the rows written."""
    checked = [_token_row(row, f"tokens row {i}") for i, row in enumerate(rows)]
    if checked:
        bulk.copy_rows(session, "queries/replay_tokens_copy", checked, TOKEN_TYPES, "attempt tokens")
    return len(checked)


def candidates(
    session: Session,
    run_ids: Sequence[int],
    problem_ids: Sequence[int],
    before_step: int,
    successes_only: bool,
    this_run: int | None = None,
) -> dict[int, list[Candidate]]:
    """Per problem of `problem_ids`, the stored trajectories it may replay (`sql/queries/replay_candidates.sql`):
    graded attempts of the zero_shot groups of `run_ids` at steps before `before_step` with stored tokens, not
    replays themselves (correct ones only when `successes_only`), oldest first. Problems without one are absent.
    `this_run`: the replaying run, whose own steps count only before `before_step`; another run's (RLEP's earlier
    run) all count. None: `before_step` holds for every run."""
    rows = session.execute(
        sqlfiles.load("queries/replay_candidates"),
        {
            "run_ids": list(run_ids),
            "problem_ids": list(problem_ids),
            "before_step": before_step,
            "successes_only": successes_only,
            "this_run": this_run,
        },
    ).mappings()
    out: dict[int, list[Candidate]] = {}
    for r in rows:
        out.setdefault(r["problem_id"], []).append(Candidate(**r))
    return out


def latest_correctness(
    session: Session, run_ids: Sequence[int], problem_ids: Sequence[int], before_step: int, this_run: int | None = None
) -> dict[int, float]:
    """Per problem, the mean correctness of its fresh graded attempts (zero_shot, intra, inter) in `run_ids` at its
    latest graded step before `before_step` (`sql/queries/replay_latest_correctness.sql`); problems never graded
    there are absent. `this_run`: as for `candidates`."""
    rows = session.execute(
        sqlfiles.load("queries/replay_latest_correctness"),
        {"run_ids": list(run_ids), "problem_ids": list(problem_ids), "before_step": before_step, "this_run": this_run},
    )
    return {int(r.problem_id): float(r.correctness) for r in rows}


def record_replays(
    session: Session, run_id: int, step: int, policy_version_id: int | None, groups: Sequence[ReplayGroup]
) -> list[list[int]]:
    """Write the step's replays: per problem a rollout group of mode `replayed` with the source group's prompt,
    template and prompt tokens, holding one attempt per chosen candidate that copies its response, reward,
    correctness, format and completion tokens, with `replay_of` = the candidate. Candidates of one problem whose
    prompts differ (two templates) get a group per prompt. Returns the new attempt ids per group of `groups`, in the
    candidates' order. A group without candidates, or a candidate of another problem, is an InputError."""
    new_groups: list[NewGroup] = []
    sources: list[list[int]] = []  # per new group, its candidates' attempt ids
    owner: list[int] = []  # per new group, the index of its ReplayGroup
    for i, g in enumerate(groups):
        if not g.candidates:
            raise InputError(f"replay group {i} (problem {g.problem_id}) has no candidates")
        if len({c.attempt_id for c in g.candidates}) != len(g.candidates):
            raise InputError(f"replay group {i} (problem {g.problem_id}) names a candidate twice")
        by_prompt: dict[tuple[str, str | None, int | None], list[Candidate]] = {}
        for c in g.candidates:
            if c.problem_id != g.problem_id:
                raise InputError(f"replay group {i}: candidate {c.attempt_id} is of problem {c.problem_id}")
            by_prompt.setdefault((c.prompt, c.prompt_version, c.prompt_tokens), []).append(c)
        for (prompt, version, tokens), cs in by_prompt.items():
            attempts = [NewAttempt(c.response, c.reward, c.correct, c.format_ok, c.completion_tokens) for c in cs]
            new_groups.append(
                NewGroup(g.problem_id, "replayed", prompt, attempts, version, tokens, step, run_id, policy_version_id)
            )
            sources.append([c.attempt_id for c in cs])
            owner.append(i)
    written = record_groups(session, new_groups)
    new_ids = [a for ids in written for a in ids]
    source_ids = [s for ids in sources for s in ids]
    if new_ids:
        session.execute(sqlfiles.load("queries/replay_link"), {"attempt_ids": new_ids, "source_ids": source_ids})
    # back to the caller's groups, each in its candidates' order
    order: list[dict[int, int]] = [{} for _ in groups]
    for i, ids, srcs in zip(owner, written, sources, strict=True):
        order[i].update(zip(srcs, ids, strict=True))
    return [[order[i][c.attempt_id] for c in g.candidates] for i, g in enumerate(groups)]
