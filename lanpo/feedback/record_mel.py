"""What MEL keeps of a step (`method = "mel"`), written inside the step's transaction after the step's own rows, whose
attempt ids the pairs point to (`lanpo.feedback.lifecycle.write_groups`, given `mel`), and the `mel/*` metrics of the
step. The pairs come with their groups (`GroupRecord.meta`, `lanpo.feedback.record.MetaRecord`).

- a lesson (meta-experience) is an experience of kind `meta` in the run's pool: validated ones through
  `add_experiences`, so the pool's caps apply (one the per-step cap drops stays in history as `mel:dropped`);
  rejected ones enter history already evicted, `evicted_by = 'mel:rejected'` (never in the active pool);
- its replays are a rollout group of mode `replay` whose context names the lesson's version;
- every diagnosed pair is a `meta_pairs` row (attempts, bifurcation, diagnosis, and the lesson's experience,
  replay group, rates, rule and verdict), and every lesson the NLL term trained on a `meta_nll_uses` row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from lanpo.db.repo import attempts as attempts_repo
from lanpo.db.repo import experiences as experiences_repo
from lanpo.db.repo import meta as meta_repo
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo.attempts import ContextRef
from lanpo.db.repo.pools import PoolRow
from lanpo.feedback.record import GroupRecord, MetaRecord
from lanpo.mel.config import MELConfig
from lanpo.mel.pairs import is_mixed
from lanpo.mel.prompts import DIAGNOSIS_VERSION, REPLAY_VERSION, has_lesson_headers
from lanpo.mel.verdict import success_rate

AUTHOR = "policy"  # the diagnosis, and so the lesson, is the policy's own


Diagnosed = tuple[GroupRecord, Sequence[int], MetaRecord]  # a pair with its group and the group's attempt ids


def record_meta(
    session: Session,
    mel: MELConfig | None,
    run_id: int,
    pool: PoolRow,
    step: int,
    policy_version_id: int | None,
    groups: Sequence[GroupRecord],
    attempt_ids: Sequence[Sequence[int]],
) -> dict[str, float]:
    """Write the step's MEL rows (see the module docstring); returns its `mel/*` metrics ({} when `mel` is None:
    the run's method is not MEL)."""
    if mel is None:
        return {}
    at = _At(run_id, step, policy_version_id)
    pairs: list[Diagnosed] = [(g, ids, m) for g, ids in zip(groups, attempt_ids, strict=True) for m in g.meta]
    candidates = [p for p in pairs if p[2].lesson is not None]
    validated = [p for p in candidates if p[2].verdict == "validated"]
    rejected = [p for p in candidates if p[2].verdict != "validated"]
    added, stored = _store_lessons(session, pool, at, validated, rejected)
    replayed = _record_replays(session, at, candidates, stored)  # per candidate, its replays' attempt ids
    replays_of = {id(m): ids for (_, _, m), ids in zip(candidates, replayed, strict=True)}
    group_of = meta_repo.replay_group_ids(session, [ids[0] for ids in replays_of.values()])
    lessons = {id(m): (stored[id(m)][0], group_of[replays_of[id(m)][0]]) for _, _, m in candidates}
    meta_repo.record_pairs(
        session, [_pair_row(at, g, ids, m, lessons.get(id(m)), mel.validation) for g, ids, m in pairs]
    )
    meta_repo.record_nll_uses(
        session,
        [
            meta_repo.NewNllUse(
                experience_id=stored[id(m)][0],
                run_id=run_id,
                step=step,
                target=mel.nll_target,
                tokens=m.nll_tokens,
                attempt_id=None if m.nll_replay is None else replays_of[id(m)][m.nll_replay],
            )
            for _, _, m in validated
            if m.nll_tokens > 0
        ],
    )
    metrics = meta_metrics(groups, mel.nll_coef)
    metrics["mel/pool/added"] = float(len(added.experience_ids))
    metrics["mel/pool/evicted"] = float(len(added.evicted_ids))
    metrics["pool/active"] = float(pools_repo.active_size(session, pool.id))  # after the lessons joined
    return metrics


@dataclass(frozen=True)
class _At:
    """Where the step's MEL rows belong: the run, the step and the policy version that produced them."""

    run_id: int
    step: int
    policy_version_id: int | None


def _lesson(at: _At, g: GroupRecord, ids: Sequence[int], m: MetaRecord) -> experiences_repo.NewExperience:
    return experiences_repo.NewExperience(
        problem_id=g.problem_id,
        summary=m.lesson or "",
        reward=success_rate([r.correct for r in m.replays]),
        source_attempt_id=ids[m.negative],
        kind="meta",
        run_id=at.run_id,
        step=at.step,
        author=AUTHOR,
        policy_version_id=at.policy_version_id,
        prompt_version=DIAGNOSIS_VERSION,
    )


def _store_lessons(
    session: Session, pool: PoolRow, at: _At, validated: list[Diagnosed], rejected: list[Diagnosed]
) -> tuple[experiences_repo.AddResult, dict[int, tuple[int, int]]]:
    """The lessons as experiences: validated ones through the pool's caps, the rest straight into history.
    Returns what the pool admitted and, per record (by id), its (experience id, version id). MEL's lessons are never
    merged: each is tied to its own pair and replays."""
    added = experiences_repo.add_experiences(session, pool, [_lesson(at, *p) for p in validated], merge=False)
    dropped = [validated[i] for i in added.dropped]
    kept = [p for i, p in enumerate(validated) if i not in set(added.dropped)]
    stored = {id(p[2]): (e, v) for p, e, v in zip(kept, added.experience_ids, added.version_ids, strict=True)}
    for reason, items in (("mel:dropped", dropped), ("mel:rejected", rejected)):
        out = experiences_repo.add_evicted(session, pool, [_lesson(at, *p) for p in items], reason)
        stored.update({id(p[2]): (e, v) for p, e, v in zip(items, out.experience_ids, out.version_ids, strict=True)})
    return added, stored


def _record_replays(
    session: Session, at: _At, candidates: list[Diagnosed], stored: dict[int, tuple[int, int]]
) -> list[list[int]]:
    """Each candidate's replays as a rollout group whose context is its lesson; the attempt ids of each."""
    return attempts_repo.record_groups(
        session,
        [
            attempts_repo.NewGroup(
                problem_id=g.problem_id,
                mode="replay",
                prompt=m.replay_prompt,
                prompt_version=REPLAY_VERSION,
                prompt_tokens=m.replay_prompt_tokens,
                step=at.step,
                run_id=at.run_id,
                policy_version_id=at.policy_version_id,
                contexts=[ContextRef(position=0, experience_version_id=stored[id(m)][1])],
                attempts=[attempts_repo.NewAttempt.of(r) for r in m.replays],
            )
            for g, _, m in candidates
        ],
    )


def _pair_row(
    at: _At, g: GroupRecord, ids: Sequence[int], m: MetaRecord, lesson: tuple[int, int] | None, rule: str
) -> meta_repo.NewMetaPair:
    """One diagnosed pair's row; `lesson`: (experience id, replay group id) when the diagnosis gave one, judged
    by the validation `rule`."""
    return meta_repo.NewMetaPair(
        run_id=at.run_id,
        step=at.step,
        problem_id=g.problem_id,
        positive_attempt_id=ids[m.positive],
        negative_attempt_id=ids[m.negative],
        step_split=m.step_split,
        bifurcation_step=m.bifurcation_step,
        shared_prefix_steps=m.shared_prefix_steps,
        located_by=m.located_by,
        diagnosis=m.diagnosis,
        prompt_version=DIAGNOSIS_VERSION,
        group_success_rate=m.group_success_rate,
        **(
            {}
            if lesson is None
            else {
                "experience_id": lesson[0],
                "replay_group_id": lesson[1],
                "replay_success_rate": success_rate([r.correct for r in m.replays]),
                "validation_rule": rule,
                "verdict": m.verdict,
            }
        ),
    )


def meta_metrics(groups: Sequence[GroupRecord], nll_coef: float) -> dict[str, float]:
    """Validation yield and its stages over the step's groups (every rank's), replay success, bifurcations."""

    def share(values: list[bool]) -> float:
        return sum(values) / len(values) if values else math.nan

    records = [m for g in groups for m in g.meta]
    candidates = [m for m in records if m.lesson is not None]
    validated = sum(m.verdict == "validated" for m in candidates)
    return {
        "mel/groups/qualifying": float(sum(is_mixed([r.correct for r in g.rollouts]) for g in groups)),
        "mel/pairs": float(len(records)),
        "mel/candidates": float(len(candidates)),
        "mel/validated": float(validated),
        "mel/rejected": float(len(candidates) - validated),
        "mel/yield": validated / len(records) if records else math.nan,
        "mel/replay/success_rate": share([r.correct for m in candidates for r in m.replays]),
        "mel/bifurcation/by_model": share([m.located_by == "model" for m in records]),
        "mel/diagnosis/format": share([has_lesson_headers(m.diagnosis) for m in records]),
        "mel/nll_coef": nll_coef,
    }
