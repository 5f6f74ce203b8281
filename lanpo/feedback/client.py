"""`StoreClient`: what any trainer needs from a lanpo store, in five calls (docs/api.md).

    client = StoreClient(StoreRunConfig(...))               # the store (a fresh one migrated), problems, relevance
    run = client.open("my-model", resume=True)              # the run and its pool: created, or resumed after a kill
    prompts = client.prompts(run, step, problem_ids, tokenizer, policy_sha256=...)   # contexts drawn and fitted
    graded = client.grade(prompts, groups, rewards)         # your rewards, with lanpo's correctness and format
    client.record(run, step, prompts, groups, graded, client.lessons(...))           # one transaction: the step

or, for groups that finish apart, `client.write(run, step, ...)` per group or batch, then `client.commit(run,
step, checkpoint=...)` once the caller says the step's groups are complete. The run's life (open, write, commit,
checkpoint, roll back) is `lanpo.feedback.lifecycle`'s, which lanpo's own trainer and the TRL and verl adapters
call too; this class adds only the order the calls come in. It knows no trainer: the caller generates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Engine

from lanpo.config import to_mapping
from lanpo.db.connection import open_store, require_migrated, transaction
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.errors import InputError
from lanpo.feedback import lifecycle
from lanpo.feedback import record as rows
from lanpo.feedback.config import StoreRunConfig
from lanpo.feedback.contexts import StepPrompts, contexted_prompts, per_rollout
from lanpo.feedback.replay_draw import ReplayDraw
from lanpo.feedback.schedule import choose_modes
from lanpo.feedback.store import RunRef, ensure_dataset, require_relevance, resolve_scorer
from lanpo.feedback.summarize import Chooser, Summary, choose_candidates, summaries_of
from lanpo.feedback_modes import asks_inter
from lanpo.mel.config import MELConfig
from lanpo.rewards import Graded, grade
from lanpo.rollout import Completion, GenerationBackend


class StoreClient:
    """A lanpo store seen by one trainer's config: its problems (`data`, generated on first use), the relevance
    scorer inter feedback reads, and the runs it writes. Everything is checked here, before any model loads."""

    def __init__(self, config: Any, db: Engine | None = None) -> None:
        self.cfg = StoreRunConfig.of(config)
        self.source = config  # as given (a TrainConfig keeps all its tables in runs.config.lanpo)
        self.db = open_store() if db is None else db
        require_migrated(self.db)
        fb = self.cfg.feedback
        with transaction(self.db) as session:
            self.problem_ids = ensure_dataset(session, self.cfg.data)
            require_relevance(session, fb, self.cfg.data.dataset)
            inter = asks_inter(fb.mode) and fb.inter.reads_relevance
            self.scorer = resolve_scorer(session, fb.inter.scorer) if inter else None
            self.problems = {p.id: p for p in problems_repo.problems_by_ids(session, self.problem_ids)}

    def spec(
        self,
        model: str,
        config: dict[str, Any] | None = None,
        trainer: str = "api",
        pool_of_model: bool = False,
        resume_hint: str = "open it with resume=True, or set run_name to a new name",
    ) -> lifecycle.RunSpec:
        """The run this client opens: named `run_name`, training `model`, its pool `store.pool` (else one named
        after it); a new run's config keeps this client's config, `trainer` and `config` (your trainer's own)."""
        kept = {"trainer": trainer, "lanpo": to_mapping(self.source), **({trainer: config} if config else {})}
        name, pool, store = self.cfg.run_name, self.cfg.pool_name(), self.cfg.store
        return lifecycle.RunSpec(
            name, model, pool, store, kept, trainer, pool_of_model=pool_of_model, resume_hint=resume_hint
        )

    def check_open(
        self, model: str, trainer: str = "api", resume: bool = False, after: int | None = None, **spec: Any
    ) -> None:
        """What `open` would refuse, checked with nothing written (`lanpo.feedback.lifecycle.check_run`)."""
        with transaction(self.db) as session:
            lifecycle.check_run(session, self.spec(model, None, trainer, **spec), resume, after)

    def open(
        self,
        model: str,
        config: dict[str, Any] | None = None,
        trainer: str = "api",
        resume: bool = False,
        after: int | None = None,
        roll_back: bool = True,
        **spec: Any,
    ) -> lifecycle.Run:
        """The run `spec` names, opened in ONE transaction (`lanpo.feedback.lifecycle.open_run`): created, or
        (`resume`) resumed after its last checkpointed step (`after`: another step) with every newer row rolled
        back. Two processes opening it at once take turns: one creates it, the other resumes it or is refused.
        `run.next_step` says where to continue, `run.opened.checkpoint` what to load. `spec`: `pool_of_model`,
        `resume_hint` (`spec`)."""
        run_spec = self.spec(model, config, trainer, **spec)
        with transaction(self.db) as session:
            opened = lifecycle.open_run(session, run_spec, resume, after, roll_back)
        total = self.cfg.summarizer.max_total_per_step
        return lifecycle.Run(self.db, opened, self.cfg.summarizer.model, total)

    def attach(self, run_id: int) -> lifecycle.Run:
        """Run `run_id`, which another process opened (a worker writing groups of the run its driver opened)."""
        with transaction(self.db) as session:
            opened = lifecycle.attach_run(session, run_id, self.cfg.pool_name())
        return lifecycle.Run(self.db, opened, self.cfg.summarizer.model, self.cfg.summarizer.max_total_per_step)

    def start(self, model: str, config: dict[str, Any] | None = None, trainer: str = "api") -> RunRef:
        """A new run (`open` without resume): its reference."""
        return self.open(model, config, trainer).ref

    def prompts(
        self,
        run: RunRef | lifecycle.Run,
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
        run = _ref(run)
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
        run: RunRef | lifecycle.Run,
        step: int,
        prompts: StepPrompts,
        groups: Sequence[Sequence[Completion]],
        graded: Sequence[Graded],
        summaries: dict[int, Summary] | None = None,
        metrics: dict[str, float] | None = None,
        prompt_versions: dict[int, str] | None = None,
        checkpoint: str | None = None,
        mel: MELConfig | None = None,
        meta: dict[int, list[rows.MetaRecord]] | None = None,
        replays: Sequence[ReplayDraw] = (),
    ) -> rows.StepWrite:
        """Step `step` in ONE transaction that commits it: each group (prompt, context rows, completions, rewards,
        policy version), the admitted lessons under the pool's capacity policies, and the step's metrics (lanpo's
        rollout and feedback metrics, the pool's, and `metrics`). `prompt_versions`: group -> the stored template
        version, where a prompt is not lanpo's (a zero-shot prompt your trainer rendered); `checkpoint`: the folder
        your trainer saved this step in (a resume continues after the last step that names one). `mel`, `meta` and
        `replays`: the step's MEL pairs (group -> its pairs, under the run's `[mel]`) and replayed rows, written
        with its groups (`lanpo.feedback.lifecycle.write_groups`)."""
        run = _ref(run)
        n = len(groups[0]) if groups else 0
        written_rows = self._records(prompts, groups, graded, summaries, prompt_versions, meta)
        step_metrics = {**rows.rollout_metrics(written_rows), **prompts.feedback_metrics(n), **(metrics or {})}
        with transaction(self.db) as session:
            written = self._write(session, run, step, prompts, written_rows, mel, replays)
            step_metrics.update(written.as_metrics())
            lifecycle.commit_step(session, run, step, prompts.policy_version_id, checkpoint, step_metrics)
        return written

    def write(
        self,
        run: RunRef | lifecycle.Run,
        step: int,
        prompts: StepPrompts,
        groups: Sequence[Sequence[Completion]],
        graded: Sequence[Graded],
        summaries: dict[int, Summary] | None = None,
        prompt_versions: dict[int, str] | None = None,
        mel: MELConfig | None = None,
        meta: dict[int, list[rows.MetaRecord]] | None = None,
        replays: Sequence[ReplayDraw] = (),
    ) -> rows.StepWrite:
        """Some groups of step `step` (one, or a batch, as they finish) in one transaction, without committing the
        step: `commit` does, once you say its groups are complete. The step's lesson cap holds across writers.
        `mel`, `meta`, `replays`: these groups' MEL pairs and replayed rows, as `record` takes them."""
        run = _ref(run)
        records = self._records(prompts, groups, graded, summaries, prompt_versions, meta)
        with transaction(self.db) as session:
            return self._write(session, run, step, prompts, records, mel, replays)

    def commit(
        self,
        run: RunRef | lifecycle.Run,
        step: int,
        checkpoint: str | None = None,
        metrics: dict[str, float] | None = None,
    ) -> None:
        """Step `step`'s groups are complete (`write`): the step is committed with its rollout metrics read back
        from its rows, the pool's size and `metrics`, naming the policy version that generated it and `checkpoint`
        (or name it later: `lifecycle.Run.name_checkpoint`)."""
        run = _ref(run)
        with transaction(self.db) as session:
            step_metrics = {**lifecycle.written_metrics(session, run, step), **(metrics or {})}
            version = steps_repo.policy_version_id(session, run.run_id, step - 1)
            lifecycle.commit_step(session, run, step, version, checkpoint, step_metrics)

    def _records(
        self,
        prompts: StepPrompts,
        groups: Sequence[Sequence[Completion]],
        graded: Sequence[Graded],
        summaries: dict[int, Summary] | None,
        prompt_versions: dict[int, str] | None,
        meta: dict[int, list[rows.MetaRecord]] | None = None,
    ) -> list[rows.GroupRecord]:
        records = rows.group_records(prompts, groups, graded, summaries or {}, meta)
        for g, version in (prompt_versions or {}).items():
            records[g].prompt_version = version
        return records

    def _write(
        self,
        session: Any,
        run: RunRef,
        step: int,
        prompts: StepPrompts,
        records: list[rows.GroupRecord],
        mel: MELConfig | None = None,
        replays: Sequence[ReplayDraw] = (),
    ) -> rows.StepWrite:
        author, total = self.cfg.summarizer.model, self.cfg.summarizer.max_total_per_step
        return lifecycle.write_groups(
            session, run, step, prompts.policy_version_id, records, author, total, mel, replays
        )

    def finish(self, run: RunRef | lifecycle.Run, failed: bool = False) -> None:
        """Mark the run finished (or failed)."""
        if isinstance(run, lifecycle.Run):
            run.finish(failed)
            return
        with transaction(self.db) as session:
            lifecycle.finish_run(session, run, failed)


def _ref(run: RunRef | lifecycle.Run) -> RunRef:
    return run.ref if isinstance(run, lifecycle.Run) else run
