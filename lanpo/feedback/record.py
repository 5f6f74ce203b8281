"""What one step of any trainer writes: its rollout groups (prompt, context rows, n rollouts with their rewards), the
lessons summarised from them (admitted under the pool's capacity policies), the replayed rows it trained on
(`write_replays`), and the metrics of its rollouts; MEL's rows of the step are `lanpo.feedback.record_mel`'s. Every
function takes a session and never opens one: the caller owns the one-transaction-per-step boundary (lanpo's loop,
`lanpo.feedback.StoreClient.record`), and `lanpo.feedback.lifecycle.write_groups` calls them in order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from lanpo import diagnostics, feedback_modes, prompts
from lanpo.db.repo import attempts as attempts_repo
from lanpo.db.repo import capacity
from lanpo.db.repo import experiences as experiences_repo
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo import trajectories as replay_repo
from lanpo.db.repo.attempts import ContextRef
from lanpo.db.repo.pools import PoolRow
from lanpo.feedback.contexts import StepPrompts
from lanpo.feedback.replay_draw import ReplayDraw
from lanpo.feedback.summarize import REJECTIONS, Summary
from lanpo.rewards import Graded
from lanpo.rollout import Completion


@dataclass
class RolloutTokens:
    """What the engine sampled, kept for replay (`attempt_tokens`, `[replay]`): the token ids and each token's
    behaviour log-prob, the engine's ('engine') or the trainer's under the sampling policy ('trainer')."""

    token_ids: list[int]
    logprobs: list[float]
    logprobs_of: str


@dataclass
class RolloutRecord:
    """One rollout as the store keeps it: the response and its grade (its prompt is its group's)."""

    response: str
    reward: float
    correct: bool
    format_ok: bool
    completion_tokens: int
    truncated: bool
    summary: str | None = None  # the lesson distilled from it, when it was chosen for summarising
    served_adapter_sha256: str | None = None  # the adapter the engine sampled it with
    summary_format_ok: bool | None = None  # None: not summarised; else whether its summary had the lesson's format
    summary_rejected: str | None = None  # why its summary was not admitted (lanpo.feedback.summarize.REJECTIONS)
    summary_generated_tokens: int = 0  # what writing its summary generated (0: not summarised)
    summary_prompt_tokens: int = 0  # ... and read as prompt, over its generation calls
    tokens: RolloutTokens | None = None  # kept for replay (`replay.stores_tokens`); None: not kept
    # partial rollout (verl's async modes): the weights of its first and last segments; None: its group's version
    first_policy_version_id: int | None = None
    last_policy_version_id: int | None = None


@dataclass
class MetaRecord:
    """One MEL pair diagnosed in a group (rollout indices within it) and what became of it (`method = "mel"`; the
    trainer's phase that makes it is `lanpo.train.mel.experiences`, its rows `lanpo.feedback.record_mel`)."""

    positive: int
    negative: int
    step_split: str
    bifurcation_step: int  # 1-based, in the negative's steps
    shared_prefix_steps: int
    located_by: str  # model | heuristic
    diagnosis: str
    group_success_rate: float
    diagnosis_tokens: int = 0  # what the diagnosis generated (the step's cost/generated_tokens/mel_diagnosis)
    diagnosis_prompt_tokens: int = 0  # the diagnosis prompt's tokens (cost/prompt_tokens/mel_diagnosis)
    lesson: str | None = None  # the meta-experience M (None: the diagnosis gave none: a pair, not a candidate)
    replay_prompt: str = ""
    replay_prompt_tokens: int = 0
    replays: list[RolloutRecord] = field(default_factory=list)
    verdict: str | None = None  # validated | rejected
    nll_tokens: int = 0  # target tokens the NLL term trained on (0: not trained on)
    nll_replay: int | None = None  # nll_target = replay: the replay trained on


@dataclass
class GroupRecord:
    """One prompt, the context it carried and its n rollouts (what every rank sends to rank 0 for the commit)."""

    problem_id: int
    mode: str
    prompt: str
    prompt_tokens: int
    contexts: list[ContextRef]
    rollouts: list[RolloutRecord]
    meta: list[MetaRecord] = field(default_factory=list)  # MEL's diagnosed pairs of this group
    prompt_version: str | None = None  # the template's version (None: the one of `mode`)
    # what the prompt showed, for the use diagnostics (never written: the items are group_contexts' rows)
    context_texts: list[str] = field(default_factory=list)  # each context item's text as shown (cut ones cut)
    question: str = ""
    trainer_uid: str | None = None  # the trainer's name for the group (verl's uid): a re-issue replaces it


def group_records(
    prompts: StepPrompts,
    groups: Sequence[Sequence[Completion]],
    graded: Sequence[Graded],
    summaries: dict[int, Summary],
    meta: dict[int, list[MetaRecord]] | None = None,
) -> list[GroupRecord]:
    """What the store keeps of a step's groups: one record per prompt with its n graded rollouts (`graded` and
    `summaries` are flat over the rollouts, group by group; `meta`: MEL's pairs per group)."""
    n = len(groups[0]) if groups else 0
    return [
        GroupRecord(
            problem_id=prompts.problem_ids[g],
            mode=prompts.modes[g],
            prompt=prompts.texts[g],
            prompt_tokens=len(completions[0].prompt_token_ids),
            contexts=[item.ref(pos) for pos, item in enumerate(prompts.items[g])],
            prompt_version=prompts.version(g),
            context_texts=[feedback_modes.context_text(prompts.modes[g], item) for item in prompts.items[g]],
            question=prompts.questions[g],
            rollouts=[
                RolloutRecord(
                    response=c.text,
                    reward=graded[g * n + j].reward,
                    correct=graded[g * n + j].correct,
                    format_ok=graded[g * n + j].format_ok,
                    completion_tokens=len(c.token_ids),
                    truncated=c.finish_reason == "length",
                    served_adapter_sha256=c.served_adapter_sha256,
                    **summary_fields(summaries.get(g * n + j)),
                )
                for j, c in enumerate(completions)
            ],
            meta=(meta or {}).get(g, []),
        )
        for g, completions in enumerate(groups)
    ]


def summary_fields(summary: Summary | None) -> dict[str, Any]:
    """A rollout's summary as RolloutRecord fields: the admitted text, whether it had the format, why it was
    turned away (none: the rollout was not summarised)."""
    if summary is None:
        return {}
    return {
        "summary": summary.admitted,
        "summary_format_ok": summary.format_ok,
        "summary_rejected": summary.rejected,
        "summary_generated_tokens": summary.generated_tokens,  # the step's cost/*/summary (cost_metrics)
        "summary_prompt_tokens": summary.prompt_tokens,
    }


@dataclass
class StepWrite:
    attempts: int
    added: int  # new lessons
    evicted: int
    pool_active: int
    attempt_ids: list[list[int]] = field(default_factory=list)  # per group, its attempts' ids in rollout order
    merged: int = 0  # lessons that became a new version of an active one (a merging pool)
    duplicates: int = 0  # lessons that repeated an active one and added nothing
    expired: int = 0  # lessons retired by policy age (store.max_policy_age) before the step's were added
    mel_metrics: dict[str, float] = field(default_factory=dict)  # mel/* and pool/active after MEL's lessons ({}: none)

    def as_metrics(self) -> dict[str, float]:
        """pool/*, then MEL's (`lanpo.feedback.record_mel.record_meta`), whose pool/active counts its lessons."""
        return {
            "pool/added": float(self.added),
            "pool/merged": float(self.merged),
            "pool/duplicates": float(self.duplicates),
            "pool/evicted": float(self.evicted),
            "pool/expired": float(self.expired),
            "pool/active": float(self.pool_active),
            **self.mel_metrics,
        }


def write_step_rows(
    session: Session,
    run_id: int,
    pool: PoolRow,
    step: int,
    policy_version_id: int,
    groups: Sequence[GroupRecord],
    summary_author: str,
) -> StepWrite:
    """Groups with their attempts and contexts, then the lessons too old in policy versions retired
    (`store.max_policy_age`), then experiences summarised from the groups (capacity enforced inside; a merging
    pool takes a near-duplicate as a new version of the lesson it repeats)."""
    attempt_ids = write_groups(session, run_id, step, policy_version_id, groups)
    write_tokens(session, groups, attempt_ids)
    expired = capacity.expire(session, pool, run_id, step)
    lessons = [
        experiences_repo.NewExperience(
            problem_id=g.problem_id,
            summary=r.summary,
            reward=r.reward,
            source_attempt_id=attempt_id,
            run_id=run_id,
            step=step,
            author=summary_author,
            policy_version_id=policy_version_id,
            prompt_version=prompts.SUMMARY_VERSION,
        )
        for g, ids in zip(groups, attempt_ids, strict=True)
        for r, attempt_id in zip(g.rollouts, ids, strict=True)
        if r.summary
    ]
    embed_lessons(session, pool, lessons)
    added = experiences_repo.add_experiences(session, pool, lessons)
    return StepWrite(
        attempts=sum(len(ids) for ids in attempt_ids),
        added=len(added.experience_ids) - len(added.merged),
        evicted=len(added.evicted_ids),
        pool_active=pools_repo.active_size(session, pool.id),
        attempt_ids=attempt_ids,
        merged=len(added.merged),
        duplicates=len(added.duplicates),
        expired=len(expired),
    )


def embed_lessons(session: Session, pool: PoolRow, lessons: list[experiences_repo.NewExperience]) -> None:
    """A merging pool compares lessons by embedding: embed the new ones, and the pool's active ones that have none
    yet (a pool that started merging late, a lesson another writer left unembedded). Any other pool: nothing."""
    if not (pool.merges and lessons):
        return
    from lanpo.retrieval.embeddings import embed_pool, fill_embeddings, shared_embedder

    embedder = shared_embedder()
    embed_pool(session, pool.id, embedder)
    fill_embeddings(lessons, embedder)


def write_tokens(session: Session, groups: Sequence[GroupRecord], attempt_ids: list[list[int]]) -> None:
    """The kept rollouts' tokens and behaviour log-probs (`attempt_tokens`), beside their attempts."""
    kept = [
        (attempt_id, r.tokens.token_ids, r.tokens.logprobs, r.tokens.logprobs_of)
        for g, ids in zip(groups, attempt_ids, strict=True)
        for r, attempt_id in zip(g.rollouts, ids, strict=True)
        if r.tokens is not None
    ]
    if kept:
        replay_repo.write_tokens(session, kept)


def write_replays(
    session: Session, run_id: int, step: int, policy_version_id: int | None, draws: Sequence[ReplayDraw]
) -> None:
    """The step's replayed rows (`[replay]`) as 'replayed' groups, one per problem, each attempt naming its source;
    nothing when the draws hold no row."""
    if sum(len(d.candidates) for d in draws):
        replay_repo.record_replays(session, run_id, step, policy_version_id, draws)


def write_groups(
    session: Session, run_id: int, step: int, policy_version_id: int, groups: Sequence[GroupRecord]
) -> list[list[int]]:
    """The rollout groups of a step (or of a validation): prompts, contexts, rollouts; each group's attempt ids."""
    return attempts_repo.record_groups(
        session,
        [
            attempts_repo.NewGroup(
                problem_id=g.problem_id,
                mode=g.mode,
                prompt=g.prompt,
                prompt_version=g.prompt_version or feedback_modes.version_of(g.mode),
                prompt_tokens=g.prompt_tokens,
                step=step,
                run_id=run_id,
                policy_version_id=policy_version_id,
                contexts=g.contexts,
                attempts=[attempts_repo.NewAttempt.of(r) for r in g.rollouts],
            )
            for g in groups
        ],
    )


COST_SOURCES = ("rollout", "summary", "mel_diagnosis", "mel_replay")  # cost/<kind>_tokens/<source>


def cost_metrics(groups: Sequence[GroupRecord]) -> dict[str, float]:
    """Every token the step generated, and every prompt token its generations read, by source (lanpo report's
    compute-matched axes, `lanpo.report.cost`): `cost/generated_tokens/<source>` and `cost/prompt_tokens/<source>`
    for the training rollouts, the summaries, MEL's diagnoses and MEL's replays (0 where a source did not run),
    and their sums `cost/generated_tokens` and `cost/prompt_tokens`. A prompt is counted once per sample drawn
    from it (n rollouts of a prompt read it n times: no prefix cache is assumed). Validation is not a training
    cost: it records its own (`cost/validation/*`, lanpo.train.validate)."""
    rollouts = [r for g in groups for r in g.rollouts]
    meta = [m for g in groups for m in g.meta]  # (none unless method = mel)
    replays = [m for m in meta if m.replays]
    generated = {
        "rollout": sum(r.completion_tokens for r in rollouts),
        "summary": sum(r.summary_generated_tokens for r in rollouts),
        "mel_diagnosis": sum(m.diagnosis_tokens for m in meta),
        "mel_replay": sum(r.completion_tokens for m in replays for r in m.replays),
    }
    read = {
        "rollout": sum(g.prompt_tokens * len(g.rollouts) for g in groups),
        "summary": sum(r.summary_prompt_tokens for r in rollouts),
        "mel_diagnosis": sum(m.diagnosis_prompt_tokens for m in meta),
        "mel_replay": sum(m.replay_prompt_tokens * len(m.replays) for m in replays),
    }
    out = {"cost/generated_tokens": float(sum(generated.values())), "cost/prompt_tokens": float(sum(read.values()))}
    for source in COST_SOURCES:
        out[f"cost/generated_tokens/{source}"] = float(generated[source])
        out[f"cost/prompt_tokens/{source}"] = float(read[source])
    return out


def rollout_metrics(groups: Sequence[GroupRecord]) -> dict[str, float]:
    """Reward and accuracy overall and by mode, format rate, response length, summaries (generated, with the
    lesson's format, admitted, turned away by reason), and whether the answers use their context by mode
    (`use/<diagnostic>/<mode>`, lanpo.diagnostics)."""

    def mean(values: list[float]) -> float:
        return float(sum(values) / len(values)) if values else math.nan

    rollouts = [r for g in groups for r in g.rollouts]

    out = {
        "reward/mean": mean([r.reward for r in rollouts]),
        "accuracy/mean": mean([float(r.correct) for r in rollouts]),
        # in its feedback mode's format under reward.format_rule (paper: the headers; correct_only: and a boxed
        # answer; a zero-shot rollout never is): what the bonus is paid for
        "format/headers": mean([float(r.format_ok) for r in rollouts]),
        "response_len/mean": mean([float(r.completion_tokens) for r in rollouts]),
        "response_len/truncated": mean([float(r.truncated) for r in rollouts]),
        "pool/summaries": float(sum(1 for r in rollouts if r.summary)),
        # what the step's rollouts cost: generated, and the prompt each carried (cost/* below counts every source)
        "tokens/completion": float(sum(r.completion_tokens for r in rollouts)),
        "tokens/prompt": float(sum(g.prompt_tokens * len(g.rollouts) for g in groups)),
        **cost_metrics(groups),
    }
    # summaries generated, the share with the lesson's format (none generated: no share), and those turned away
    summarised = [r for r in rollouts if r.summary_format_ok is not None]
    out["summary/generated"] = float(len(summarised))
    if summarised:
        out["summary/format"] = mean([float(bool(r.summary_format_ok)) for r in summarised])
    for reason in REJECTIONS:
        out[f"summary/rejected/{reason}"] = float(sum(1 for r in summarised if r.summary_rejected == reason))
    for mode in feedback_modes.PROMPT_MODES:
        picked = [r for g in groups if g.mode == mode for r in g.rollouts]
        if feedback_modes.MODES[mode].opt_in and not picked:  # Fig. 2b's arm: its metrics in its own runs only
            continue
        out[f"count/{mode}"] = float(len(picked))
        if picked:
            out[f"reward/{mode}"] = mean([r.reward for r in picked])
            out[f"accuracy/{mode}"] = mean([float(r.correct) for r in picked])
    out.update(diagnostics.use_metrics(groups))  # use/<diagnostic>/<mode>: do the answers use their context
    return out
