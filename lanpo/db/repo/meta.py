"""MEL's provenance in the store: the contrastive pairs a step diagnosed (with their lesson, replays and verdict)
and the lessons its NLL term trained on; and the two views read back (history per pair, yield per step).

The lessons themselves are experiences of kind `meta` (`experiences.add_experiences` when validated, so the pool's
caps apply; `experiences.add_evicted` with `mel:rejected` otherwise), and the replays are rollout groups of mode
`replay` (`attempts.record_groups`) whose context names the lesson's version. Session in, dataclasses out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.models_mel import META_VERDICTS, NLL_TARGETS
from lanpo.db.repo import bulk, checks
from lanpo.errors import InputError


@dataclass
class NewMetaPair:
    """One diagnosed pair; the last five fields are set together when the diagnosis gave a lesson."""

    run_id: int
    step: int
    problem_id: int
    positive_attempt_id: int
    negative_attempt_id: int
    step_split: str
    bifurcation_step: int  # 1-based, in the negative's steps
    shared_prefix_steps: int
    located_by: str  # model | heuristic
    diagnosis: str
    prompt_version: str | None
    group_success_rate: float
    experience_id: int | None = None
    replay_group_id: int | None = None
    replay_success_rate: float | None = None
    validation_rule: str | None = None
    verdict: str | None = None  # validated | rejected


@dataclass
class NewNllUse:
    """A validated lesson the NLL term trained on at `step`: on its text (`lesson`) or a replay (`replay`)."""

    experience_id: int
    run_id: int
    step: int
    target: str
    tokens: int
    attempt_id: int | None = None  # the replay trained on (target replay)


@dataclass(frozen=True)
class YieldRow:
    """One step of a MEL run, as `meta_experience_yield` counts it."""

    run_id: int
    run_name: str
    step: int
    qualifying_groups: int
    pairs: int
    candidates: int
    validated: int
    rejected: int
    validation_yield: float | None
    replay_success_rate: float | None
    nll_examples: int
    nll_tokens: int


@dataclass(frozen=True)
class HistoryRow:
    """One pair of `meta_experience_history`: pair -> lesson -> replays -> verdict -> NLL steps."""

    pair_id: int
    step: int
    problem_id: int
    positive_attempt_id: int
    negative_attempt_id: int
    bifurcation_step: int
    shared_prefix_steps: int
    located_by: str
    diagnosis: str
    experience_id: int | None
    version_id: int | None
    meta_experience: str | None
    replay_group_id: int | None
    replays: int | None
    replay_successes: int | None
    replay_success_rate: float | None
    verdict: str | None
    active: bool
    evicted_by: str | None
    nll_steps: list[int] | None


def _pair_row(p: NewMetaPair, where: str) -> tuple:
    lesson = (p.experience_id, p.replay_group_id, p.replay_success_rate, p.validation_rule, p.verdict)
    if any(v is None for v in lesson) and any(v is not None for v in lesson):
        raise InputError(f"{where}: experience, replay group, replay rate, rule and verdict are set together")
    if p.verdict is not None and p.verdict not in META_VERDICTS:
        raise InputError(f"{where}: verdict must be one of {', '.join(META_VERDICTS)}, got {p.verdict!r}")
    return (
        checks.row_id(p.run_id, f"{where}: run_id"),
        checks.int_or_none(p.step, f"{where}: step", minimum=0),
        checks.row_id(p.problem_id, f"{where}: problem_id"),
        checks.row_id(p.positive_attempt_id, f"{where}: positive_attempt_id"),
        checks.row_id(p.negative_attempt_id, f"{where}: negative_attempt_id"),
        p.step_split,
        checks.int_or_none(p.bifurcation_step, f"{where}: bifurcation_step", minimum=1),
        checks.int_or_none(p.shared_prefix_steps, f"{where}: shared_prefix_steps", minimum=0),
        p.located_by,
        checks.generated_text(p.diagnosis, f"{where}: diagnosis"),
        checks.generated_text(p.prompt_version, f"{where}: prompt_version", True),
        checks.finite_or_none(p.group_success_rate, f"{where}: group_success_rate"),
        *lesson[:2],
        checks.finite_or_none(p.replay_success_rate, f"{where}: replay_success_rate"),
        *lesson[3:],
    )


def record_pairs(session: Session, pairs: list[NewMetaPair]) -> list[int]:
    """Insert diagnosed pairs (COPY, in the caller's transaction); returns their ids in input order."""
    rows = [_pair_row(p, f"pair {i}") for i, p in enumerate(pairs)]
    ids = bulk.reserve_ids(session, "meta_pairs", len(rows))
    if rows:
        numbered = ((i, *row) for i, row in zip(ids, rows, strict=True))
        bulk.copy_rows(session, "queries/meta_pairs_copy", numbered, None, "MEL pairs")
    return ids


def record_nll_uses(session: Session, uses: list[NewNllUse]) -> None:
    """Insert the lessons a step's NLL term trained on (COPY, in the caller's transaction)."""
    rows = []
    for i, u in enumerate(uses):
        if u.target not in NLL_TARGETS:
            raise InputError(f"NLL use {i}: target must be one of {', '.join(NLL_TARGETS)}, got {u.target!r}")
        if (u.target == "replay") != (u.attempt_id is not None):
            raise InputError(f"NLL use {i}: a replay target names its attempt, a lesson target none")
        rows.append((u.experience_id, u.run_id, u.step, u.target, u.attempt_id, u.tokens))
    if rows:
        bulk.copy_rows(session, "queries/meta_nll_uses_copy", rows, None, "MEL NLL uses")


def replay_group_ids(session: Session, attempt_ids: Sequence[int]) -> dict[int, int]:
    """The rollout group of each of `attempt_ids` (MEL names a lesson's replay group by its first replay)."""
    found = session.execute(sqlfiles.load("queries/meta_replay_groups"), {"attempt_ids": list(attempt_ids)})
    return {attempt_id: group_id for attempt_id, group_id in found.all()}


def step_yield(session: Session, run_id: int) -> list[YieldRow]:
    """Pairs -> candidates -> validated per committed step of a MEL run (`meta_experience_yield`), by step."""
    rows = session.execute(sqlfiles.load("queries/meta_yield"), {"run_id": run_id})
    return [YieldRow(**{f.name: getattr(r, f.name) for f in fields(YieldRow)}) for r in rows]


def history(session: Session, run_id: int) -> list[HistoryRow]:
    """Every pair a run diagnosed with what became of it (`meta_experience_history`), by step and pair."""
    rows = session.execute(sqlfiles.load("queries/meta_history"), {"run_id": run_id})
    return [HistoryRow(**{f.name: getattr(r, f.name) for f in fields(HistoryRow)}) for r in rows]
