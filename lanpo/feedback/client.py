"""`StoreClient`: what any trainer needs from a lanpo store, in five calls (docs/api.md).

    client = StoreClient(StoreRunConfig(...))               # the store (a fresh one migrated), problems, relevance
    run = client.start("my-model")                          # the run and its pool
    prompts = client.prompts(run, step, problem_ids, tokenizer, policy_sha256=...)   # contexts drawn and fitted
    graded = client.grade(prompts, groups, rewards)         # your rewards, with lanpo's correctness and format
    client.record(run, step, prompts, groups, graded, client.lessons(...))           # one transaction: the step

lanpo's own trainer and the TRL adapter (`lanpo.integrations.trl`) draw and record through the same functions
(`lanpo.feedback.contexts.contexted_prompts`, `lanpo.feedback.record.write_step_rows`); this class adds only the
order they are called in and the one transaction a step commits in. It knows no trainer: the caller generates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Engine

from lanpo.config import to_mapping
from lanpo.db.connection import open_store, require_migrated, transaction
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.errors import InputError
from lanpo.feedback import record as rows
from lanpo.feedback.config import StoreRunConfig
from lanpo.feedback.contexts import StepPrompts, contexted_prompts, per_rollout
from lanpo.feedback.schedule import choose_modes
from lanpo.feedback.store import RunRef, ensure_dataset, require_relevance, resolve_scorer
from lanpo.feedback.summarize import Chooser, Summary, choose_candidates, summaries_of
from lanpo.feedback_modes import asks_inter
from lanpo.rewards import Graded, grade
from lanpo.rollout import Completion, GenerationBackend


class StoreClient:
    """A lanpo store seen by one trainer's config: its problems (`data`, generated on first use), the relevance
    scorer inter feedback reads, and the runs it writes. Everything is checked here, before any model loads."""

    def __init__(self, config: Any, db: Engine | None = None) -> None:
        self.cfg = StoreRunConfig.of(config)
        self.db = open_store() if db is None else db
        require_migrated(self.db)
        fb = self.cfg.feedback
        with transaction(self.db) as session:
            self.problem_ids = ensure_dataset(session, self.cfg.data)
            require_relevance(session, fb, self.cfg.data.dataset)
            inter = asks_inter(fb.mode) and fb.inter.reads_relevance
            self.scorer = resolve_scorer(session, fb.inter.scorer) if inter else None
            self.problems = {p.id: p for p in problems_repo.problems_by_ids(session, self.problem_ids)}

    def start(self, model: str, config: dict[str, Any] | None = None, trainer: str = "api") -> RunRef:
        """A new run named `run_name` (its pool `store.pool`, else one named after it), training `model`; its
        config keeps this client's config, `trainer` and `config` (your trainer's own settings)."""
        with transaction(self.db) as session:
            pool = pools_repo.ensure_pool(session, self.cfg.pool_name(), self.cfg.store)
            kept = {"trainer": trainer, "lanpo": to_mapping(self.cfg), **({trainer: config} if config else {})}
            run = runs_repo.create_run(session, self.cfg.run_name, "train", kept, model, pool.id)
            return RunRef(self.db, run.id, pool)

    def prompts(
        self,
        run: RunRef,
        step: int,
        problem_ids: Sequence[int],
        tokenizer: Any,
        policy_sha256: str | None = None,
        asked: Sequence[str] | None = None,
        p_t: float | None = None,
    ) -> StepPrompts:
        """Step `step`'s prompts (1-based) for `problem_ids`, each in the mode `asked` (default: a feedback mode
        with probability `p_t`, default `feedback.p_t`, seeded by (seed, step)), with the contexts the store gives
        it, fitted within `max_prompt_tokens` by `tokenizer` (a fast HF tokenizer with a chat template).
        `policy_sha256` (64 hex digits: `lanpo.models.hashing.state_sha256`) records the weights that generate
        them as the policy version of step - 1; without it that version must be recorded already."""
        if asked is None:
            fb = self.cfg.feedback
            asked = choose_modes(problem_ids, fb.mode, fb.p_t if p_t is None else p_t, self.cfg.seed, step)
        with transaction(self.db) as session:
            if policy_sha256 is not None:
                steps_repo.add_policy_version(session, run.run_id, step - 1, policy_sha256)
            try:
                steps_repo.policy_version_id(session, run.run_id, step - 1)
            except InputError as exc:  # say how to record it
                exc.hint = "pass policy_sha256 (lanpo.models.hashing.state_sha256(model.state_dict())) to prompts()"
                raise
        limit = self.cfg.max_prompt_tokens
        return contexted_prompts(
            self.cfg.feedback, limit, self.cfg.seed, step, run, self.scorer, problem_ids, asked, tokenizer, step - 1
        )

    def grade(
        self, prompts: StepPrompts, groups: Sequence[Sequence[Completion]], rewards: Sequence[float] | None = None
    ) -> list[Graded]:
        """Per rollout (group by group): `rewards` (yours; NaN stored as 0), else lanpo's reward, each with lanpo's
        correctness against the gold answer and its mode's format (`lanpo.rewards.grade`)."""
        n = len(groups[0]) if groups else 0
        texts = [c.text for group in groups for c in group]
        answers, modes = per_rollout(prompts.answers, n), per_rollout(prompts.modes, n)
        graded = grade(texts, answers, modes, self.cfg.reward.format_rule)
        if rewards is None:
            return graded
        if len(rewards) != len(graded):
            raise InputError(
                f"{len(rewards)} rewards for {len(graded)} rollouts",
                hint="one reward per rollout, group by group, in the order of `groups`",
            )
        return [
            Graded(0.0 if math.isnan(r) else float(r), g.correct, g.format_ok)
            for r, g in zip(rewards, graded, strict=True)
        ]

    def lessons(
        self,
        step: int,
        prompts: StepPrompts,
        groups: Sequence[Sequence[Completion]],
        graded: Sequence[Graded],
        backend: GenerationBackend,
        tokenizer: Any,
        choose: Chooser = choose_candidates,
    ) -> dict[int, Summary]:
        """Lessons of the step's successful rollouts written by `backend` (`lanpo.rollout.make_backend`), each
        checked for admission (flat rollout index -> summary); none when the config summarises nothing."""
        if not self.cfg.wants_lessons():
            return {}
        rollouts = [c for group in groups for c in group]
        return summaries_of(
            self.cfg.summarizer, backend, tokenizer, self.cfg.seed, step, prompts, rollouts, list(graded), 0, 1, choose
        )

    def record(
        self,
        run: RunRef,
        step: int,
        prompts: StepPrompts,
        groups: Sequence[Sequence[Completion]],
        graded: Sequence[Graded],
        summaries: dict[int, Summary] | None = None,
        metrics: dict[str, float] | None = None,
        prompt_versions: dict[int, str] | None = None,
    ) -> rows.StepWrite:
        """Step `step` in ONE transaction that commits it: each group (prompt, context rows, completions, rewards,
        policy version), the admitted lessons under the pool's capacity policies, and the step's metrics (lanpo's
        rollout and feedback metrics, the pool's, and `metrics`). `prompt_versions`: group -> the stored template
        version, where a prompt is not lanpo's (a zero-shot prompt your trainer rendered)."""
        n = len(groups[0]) if groups else 0
        written_rows = rows.group_records(prompts, groups, graded, summaries or {})
        for g, version in (prompt_versions or {}).items():
            written_rows[g].prompt_version = version
        step_metrics = {**rows.rollout_metrics(written_rows), **prompts.feedback_metrics(n), **(metrics or {})}
        with transaction(self.db) as session:
            written = rows.write_step_rows(
                session, run.run_id, run.pool, step, prompts.policy_version_id, written_rows, self.cfg.summarizer.model
            )
            step_metrics.update(written.as_metrics())
            runs_repo.record_metrics(session, run.run_id, step, step_metrics)
            steps_repo.commit_step(session, run.run_id, step, prompts.policy_version_id)
        return written

    def finish(self, run: RunRef, failed: bool = False) -> None:
        """Mark the run finished (or failed)."""
        with transaction(self.db) as session:
            runs_repo.finish_run(session, run.run_id, "failed" if failed else "finished")
