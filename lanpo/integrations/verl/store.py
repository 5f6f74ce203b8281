"""lanpo's store as verl's rollout reads and writes it, in one process: no verl import here (the main lane tests it).

A verl run is a lanpo run (`runs.config->>'trainer' = 'verl'`) named `lanpo.run_name` (default: verl's
`trainer.experiment_name`), training `actor_rollout_ref.model.path`. Its step is verl's `global_steps`. What each
process does with it:

- the agent loop manager (verl's TaskRunner process) opens or resumes the run before any worker starts
  (`open_run`: every check that refuses bad input runs here, before a rollout) and, before each step's rollouts,
  `begin_step`: the first call of a process rolls back whatever the run recorded at or after that step (verl
  resumed from its checkpoint of the step before; so no step is recorded twice), and every call commits the steps
  before it and records the policy version the step samples with;
- each agent loop worker (a Ray actor) draws a group's prompt once (`draw`: its n samples share one draw, as the
  paper gives one context per prompt) and writes the finished group back in one transaction (`write_group`).

verl syncs its weights to the rollout servers every step, and the rollout never sees them: the policy version of
step t - 1 is named by the run and the step (`verl_policy_sha256`), not by the weights' content as lanpo's own
trainer and the TRL adapter name it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo import feedback_modes
from lanpo.config import apply_overrides, read_toml
from lanpo.db.connection import transaction
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.errors import ConfigError, InputError
from lanpo.feedback import record as rows
from lanpo.feedback.client import StoreClient
from lanpo.feedback.config import StoreRunConfig, load_store_config
from lanpo.feedback.contexts import StepPrompts, contexted_prompts
from lanpo.feedback.schedule import choose_modes, mix_seed
from lanpo.feedback.store import RunRef
from lanpo.integrations.trl_checks import same_kind_of_run
from lanpo.rewards import Graded
from lanpo.rollout import Completion

log = logging.getLogger(__name__)

TRAINER = "verl"  # runs.config->>'trainer' of a run the integration writes
REWARDS = ("lanpo", "verl")  # lanpo.reward: who sets each sample's reward
ZERO_SHOT_PROMPT = "verl-row"  # rollout_groups.prompt_version of a zero-shot group: the dataset row's own prompt
_STEP_LESSONS = sa.text("SELECT count(*) FROM experiences WHERE run_id = :run AND step = :step")


@dataclass(frozen=True)
class Settings:
    """The `lanpo:` section of a verl config (docs/verl.md)."""

    config: str  # a lanpo recipe (TOML): its [data], [feedback], [summarizer], [store], [reward], seed
    run_name: str
    reward: str = "lanpo"  # lanpo: lanpo's grader sets each sample's reward (format bonus included); verl: verl's
    overrides: tuple[str, ...] = ()  # a.b=value on the recipe

    @classmethod
    def of(cls, verl_config: Mapping[str, Any]) -> Settings:
        section = verl_config.get("lanpo") or {}
        if not section.get("config"):
            raise ConfigError(
                "the verl config has no lanpo.config: the lanpo agent loop needs a lanpo recipe",
                hint="add +lanpo.config=train/configs/lanpo-both.toml (docs/verl.md)",
            )
        reward = str(section.get("reward") or "lanpo")
        if reward not in REWARDS:
            raise ConfigError(
                f"lanpo.reward must be one of {', '.join(REWARDS)}, got {reward!r}",
                hint="lanpo: lanpo's grader and format bonus (the paper's reward); verl: verl's reward function",
            )
        name = section.get("run_name") or verl_config["trainer"]["experiment_name"]
        given = section.get("overrides") or ()
        # one a.b=value (Hydra reads `+lanpo.overrides=a.b=1` as a string): one override, not one per character
        overrides = (str(given),) if isinstance(given, str) else tuple(str(o) for o in given)
        return cls(str(section["config"]), str(name), reward, overrides)


def recipe_config(settings: Settings, prompt_length: int) -> StoreRunConfig:
    """The store's part of the lanpo recipe, for verl: its prompt limit is verl's `data.max_prompt_length` (where
    verl would left-truncate), and MEL, or lessons written by a model other than the policy, are refused."""
    recipe = apply_overrides(read_toml(settings.config), list(settings.overrides))  # method=mel among them too
    if recipe.get("method") == "mel":
        raise ConfigError(
            f"{settings.config} is a MEL recipe: MEL's NLL term on the meta-experiences is a second loss, and verl "
            "0.9.1 registers policy losses per token of the rollout batch only",
            hint="run MEL with lanpo train; on verl use a LANPO or GRPO recipe (docs/verl.md says what MEL needs)",
        )
    cfg = load_store_config(settings.config, list(settings.overrides))
    if cfg.wants_lessons() and cfg.summarizer.model != "policy":
        raise ConfigError(
            f"summarizer.model = {cfg.summarizer.model!r}: on verl the lessons are written by the policy's servers",
            hint="set summarizer.model = 'policy' (the paper's setting), or summarizer.enabled = false",
        )
    return replace(cfg, run_name=settings.run_name, max_prompt_tokens=prompt_length)


def verl_policy_sha256(run_id: int, step: int) -> str:
    """The name of verl's weights after step `step` of run `run_id` (the rollout never sees their content)."""
    return hashlib.sha256(f"lanpo-verl|run {run_id}|weights after step {step}".encode()).hexdigest()


@dataclass
class GroupPrompt:
    """One group's prompt: the mode it asked for and got, the rendered text (None: the row's own prompt, zero-shot),
    and the single-prompt StepPrompts its write-back needs."""

    prompts: StepPrompts
    text: str | None

    @property
    def mode(self) -> str:
        return self.prompts.modes[0]


class VerlStore:
    """One verl run's store in one process, over one connection pool (never one per sample)."""

    def __init__(self, settings: Settings, model: str, prompt_length: int, db: Engine | None = None) -> None:
        self.settings = settings
        self.model = model
        self.client = StoreClient(recipe_config(settings, prompt_length), db)
        self.cfg = self.client.cfg
        self.db = self.client.db
        self.run: RunRef | None = None
        self._rolled_back = False  # this process's first step rolled back what the run held from it on

    # --- the manager ---

    def open_run(self, verl_settings: Mapping[str, Any] | None = None) -> RunRef:
        """The run named `run_name`: created on first use, else the same run resumed (of verl and of this model).
        Refused, with nothing written: a name taken by another kind of run or another model's, a pool other than
        the run's, a pool holding lessons of another model."""
        name, pool_name = self.cfg.run_name, self.cfg.pool_name()
        with transaction(self.db) as session:
            _require_pool_of_model(session, pool_name, self.model)
            run = runs_repo.find_run(session, name)
            if run is not None:
                same_kind_of_run(run, self.model, TRAINER)
                pool = pools_repo.get_pool(session, pool_name)
                if run.pool_id != pool.id:
                    raise InputError(
                        f"run {name!r} writes another pool than {pool_name!r}",
                        hint="keep store.pool as the run started, or set lanpo.run_name to a new run",
                    )
                runs_repo.reopen_run(session, run.id)
                self.run = RunRef(self.db, run.id, pool)
        if self.run is None:
            self.run = self.client.start(self.model, dict(verl_settings or {}), trainer=TRAINER)
        return self.run

    def attach(self, run_id: int) -> RunRef:
        """A worker's view of the run the manager opened."""
        with transaction(self.db) as session:
            run = runs_repo.require_run(session, run_id)
            pool = pools_repo.get_pool(session, self.cfg.pool_name())
        self.run = RunRef(self.db, run.id, pool)
        return self.run

    def begin_step(self, step: int) -> steps_repo.RollbackResult | None:
        """Before step `step`'s rollouts (verl's global_steps, from 1): the first call of this process rolls back
        what the run holds at or after `step`; every call commits the steps before it and names the policy version
        `step` samples with. Returns what was rolled back (None when nothing was)."""
        run = self._run()
        undone = None
        with transaction(self.db) as session:
            if not self._rolled_back:
                last = session.scalar(
                    sa.text("SELECT max(step) FROM rollout_groups WHERE run_id = :run"), {"run": run.run_id}
                )
                result = steps_repo.rollback_uncommitted(session, run.run_id, step - 1)
                if last is not None and last >= step:
                    undone = result
                    log.warning(result.line(step - 1, last))
            self._commit_before(session, step)
            steps_repo.add_policy_version(session, run.run_id, step - 1, verl_policy_sha256(run.run_id, step - 1))
        self._rolled_back = True
        return undone

    def _commit_before(self, session: Any, step: int | None) -> None:
        """Commit every step before `step` (None: every step) that wrote groups and is not committed yet, with its
        metrics."""
        run = self._run()
        pending = session.scalars(
            sa.text(
                "SELECT DISTINCT g.step FROM rollout_groups g WHERE g.run_id = :run AND g.step < :step "
                "AND NOT EXISTS (SELECT 1 FROM run_steps s WHERE s.run_id = g.run_id AND s.step = g.step) "
                "ORDER BY g.step"
            ),
            {"run": run.run_id, "step": 2**31 - 1 if step is None else step},
        ).all()
        for done in pending:
            version = steps_repo.policy_version_id(session, run.run_id, done - 1)
            metrics = step_metrics(session, run.run_id, done)
            metrics["pool/active"] = float(pools_repo.active_size(session, run.pool.id))
            runs_repo.record_metrics(session, run.run_id, done, metrics)
            steps_repo.commit_step(session, run.run_id, done, version)

    def checkpoint(self, step: int, folder: str) -> None:
        """verl saved step `step`'s checkpoint in `folder`: the step is committed (if it was not) and names it."""
        with transaction(self.db) as session:
            self._commit_before(session, step + 1)
            steps_repo.set_checkpoint(session, self._run().run_id, step, folder)

    def commit_through(self, step: int) -> None:
        """Commit every written step up to `step` (a checkpoint that is not durable yet names none)."""
        with transaction(self.db) as session:
            self._commit_before(session, step + 1)

    def finish(self, failed: bool = False) -> None:
        """The run is over: its written steps are committed, and it is marked finished (or failed)."""
        with transaction(self.db) as session:
            self._commit_before(session, None)
        self.client.finish(self._run(), failed)

    # --- the workers ---

    def draw(self, step: int, problem_id: int, tokenizer: Any, p_t: float | None = None) -> GroupPrompt:
        """Group `problem_id`'s prompt at `step`: its mode by p_t (seeded by the recipe's seed, the problem and the
        step, so a resumed step asks the same), the contexts the store gives it, fitted to verl's prompt length."""
        run = self._run()
        fb = self.cfg.feedback
        seed = mix_seed(self.cfg.seed, "verl-group", problem_id)
        asked = choose_modes([problem_id], fb.mode, fb.p_t if p_t is None else p_t, seed, step)
        prompts = contexted_prompts(
            fb,
            self.cfg.max_prompt_tokens,
            seed,
            step,
            run,
            self.client.scorer,
            [problem_id],
            asked,
            tokenizer,
            step - 1,
        )
        text = prompts.texts[0] if prompts.modes[0] in feedback_modes.CONTEXT_MODES else None
        return GroupPrompt(prompts, text)

    def grade(self, drawn: GroupPrompt, responses: Sequence[str]) -> list[Graded]:
        """lanpo's reward for each response of the group (correctness by math-verify plus the format bonus)."""
        return self.client.grade(drawn.prompts, [[_completion(r) for r in responses]])

    def lessons_left(self, step: int) -> int:
        """How many more lessons this step may summarise (summarizer.max_total_per_step; -1: no limit)."""
        total = self.cfg.summarizer.max_total_per_step
        if total == 0:
            return -1
        with transaction(self.db) as session:
            made = session.scalar(_STEP_LESSONS, {"run": self._run().run_id, "step": step})
        return max(0, total - int(made or 0))

    def write_group(
        self,
        step: int,
        drawn: GroupPrompt,
        prompt_text: str,
        completions: Sequence[Completion],
        graded: Sequence[Graded],
        summaries: Mapping[int, Any] | None = None,
    ) -> rows.StepWrite:
        """One finished group in ONE transaction: its prompt (as the model saw it), context rows, completions with
        their rewards, the step and policy version, and its admitted lessons under the pool's capacity policies."""
        run = self._run()
        record = rows.group_records(drawn.prompts, [list(completions)], list(graded), dict(summaries or {}))[0]
        record.prompt = prompt_text
        if drawn.text is None:
            record.prompt_version = ZERO_SHOT_PROMPT
        with transaction(self.db) as session:
            # groups of a step are written concurrently by every worker: one at a time per (run, step), so the
            # step's lesson cap counts the lessons of the groups written before this one
            session.execute(sa.text("SELECT pg_advisory_xact_lock(:run, :step)"), {"run": run.run_id, "step": step})
            self._within_step_cap(session, step, record)
            return rows.write_step_rows(
                session,
                run.run_id,
                run.pool,
                step,
                drawn.prompts.policy_version_id,
                [record],
                self.cfg.summarizer.model,
            )

    def _within_step_cap(self, session: Any, step: int, record: rows.GroupRecord) -> None:
        """Drop the group's lessons past `summarizer.max_total_per_step` (0: no cap) for the step so far. A worker
        checks the cap before it summarises (`lessons_left`), but its sibling workers may admit lessons meanwhile."""
        total = self.cfg.summarizer.max_total_per_step
        if total == 0:
            return
        made = int(session.scalar(_STEP_LESSONS, {"run": self._run().run_id, "step": step}) or 0)
        for rollout in record.rollouts:
            if rollout.summary is not None:
                if made >= total:
                    rollout.summary = None
                else:
                    made += 1

    def _run(self) -> RunRef:
        if self.run is None:
            raise RuntimeError("the verl store has no run yet: open_run (the manager) or attach (a worker) first")
        return self.run


def _require_pool_of_model(session: Any, pool_name: str, model: str) -> None:
    """Lessons of other models' runs are not this policy's experience: a pool holding them is refused."""
    other = session.scalar(
        sa.text(
            "SELECT r.model FROM experiences e JOIN runs r ON r.id = e.run_id JOIN pools p ON p.id = e.pool_id "
            "WHERE p.name = :pool AND r.model IS DISTINCT FROM :model LIMIT 1"
        ),
        {"pool": pool_name, "model": model},
    )
    if other is not None:
        raise InputError(
            f"pool {pool_name!r} holds lessons of {other}, not of {model}",
            hint="set store.pool (lanpo.overrides) to a pool of this model's runs, or a new one",
        )


def _completion(text: str) -> Completion:
    return Completion(text, (), (), "stop")


def step_metrics(session: Any, run_id: int, step: int) -> dict[str, float]:
    """A committed verl step's rollout metrics, read back from its rows (its groups were written one by one)."""
    row = session.execute(
        sa.text(
            "SELECT avg(a.reward) AS reward, avg(a.correct::int) AS accuracy, avg(a.format_ok::int) AS format, "
            "avg(a.completion_tokens) AS length, count(*) AS rollouts, "
            "count(*) FILTER (WHERE g.mode = 'zero_shot') AS zero_shot, "
            "count(*) FILTER (WHERE g.mode = 'intra') AS intra, count(*) FILTER (WHERE g.mode = 'inter') AS inter "
            "FROM rollout_groups g JOIN attempts a ON a.group_id = g.id WHERE g.run_id = :run AND g.step = :step"
        ),
        {"run": run_id, "step": step},
    ).one()
    added = session.scalar(_STEP_LESSONS, {"run": run_id, "step": step})
    return {
        "reward/mean": float(row.reward or 0.0),
        "accuracy/mean": float(row.accuracy or 0.0),
        "format/headers": float(row.format or 0.0),
        "response_len/mean": float(row.length or 0.0),
        "count/zero_shot": float(row.zero_shot),
        "count/intra": float(row.intra),
        "count/inter": float(row.inter),
        "pool/added": float(added or 0),
    }
