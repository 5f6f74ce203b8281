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
  paper gives one context per prompt) and writes the finished group back in one transaction (`write_group`),
  named by verl's uid, with the weights of each response's segments;
- under verl's asynchronous modes, verl's sampler (`LanpoReplayBuffer`, in the manager's process) says what each
  step trains and drops (`consume`) and commits the step; the manager removes, at their dispatch, the rows a killed
  run wrote of the groups a resumed verl re-issues (`dispatch`).

The run's life (open, roll back, group writes under the step's lesson cap, step commits, checkpoints) is the store
API's (`lanpo.feedback.lifecycle.Run`), as for every trainer: this module only says when verl's steps begin and end.

verl syncs its weights to the rollout servers every step, and the rollout never sees them: the policy version of
step t - 1 is named by the run and the step (`verl_policy_sha256`), not by the weights' content as lanpo's own
trainer and the TRL adapter name it.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.engine import Engine

from lanpo import feedback_modes
from lanpo.config import apply_overrides, read_toml
from lanpo.errors import ConfigError
from lanpo.feedback import record as rows
from lanpo.feedback.client import StoreClient
from lanpo.feedback.config import StoreRunConfig, load_store_config
from lanpo.feedback.contexts import StepPrompts, contexted_prompts
from lanpo.feedback.lifecycle import RollbackResult, Run
from lanpo.feedback.schedule import choose_modes
from lanpo.rewards import Graded
from lanpo.rollout import Completion
from lanpo.seeds import mix_seed

log = logging.getLogger(__name__)
TRAINER = "verl"  # runs.config->>'trainer' of a run the integration writes
REWARDS = ("lanpo", "verl")  # lanpo.reward: who sets each sample's reward
ZERO_SHOT_PROMPT = "verl-row"  # rollout_groups.prompt_version of a zero-shot group: the dataset row's own prompt
RESUME_HINT = "keep store.pool and the model as the run started, or set lanpo.run_name to a new run"


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
    if (recipe.get("replay") or {}).get("enabled"):
        raise ConfigError(
            f"{settings.config} enables [replay]: replayed rows are stored trajectories with earlier policies' "
            "behaviour log-probs, and verl 0.9.1 trains only the groups its agent loops generate for its own prompts",
            hint="run replay with lanpo train (docs/configuration.md, [replay]); on verl set replay.enabled = false",
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
        self.run: Run | None = None
        self._rolled_back = False  # this process's first step rolled back what the run held from it on
        self._versions: dict[int, int] = {}  # verl's weights label (a step) -> policy_versions.id
        self._fates: dict[int, Counter[str]] = {}  # step -> the groups consumed at it (verl's asynchronous modes)

    # --- the manager ---

    def open_run(self, verl_settings: Mapping[str, Any] | None = None) -> Run:
        """The run named `run_name`, opened through the store API in one transaction: created on first use, else
        the same run resumed (of verl and of this model). Refused, with nothing written: a name taken by another
        kind of run or another model's, a pool other than the run's, a pool holding lessons of another model. The
        rollback waits for the first step (`begin_step`): only then does verl say which step it resumes from."""
        self.run = self.client.open(
            self.model,
            dict(verl_settings or {}),
            trainer=TRAINER,
            resume=True,
            roll_back=False,
            pool_of_model=True,
            resume_hint=RESUME_HINT,
        )
        return self.run

    def attach(self, run_id: int) -> Run:
        """A worker's view of the run the manager opened."""
        self.run = self.client.attach(run_id)
        return self.run

    def begin_step(self, step: int) -> RollbackResult | None:
        """Before step `step`'s rollouts (verl's global_steps, from 1): the first call of this process rolls back
        what the run holds at or after `step`; every call commits the steps before it (verl trained their groups:
        they are complete) and names the policy version `step` samples with. Returns what was rolled back (None when
        nothing was)."""
        run = self._run()
        undone = None
        if not self._rolled_back:
            rolled = run.roll_back_after(step - 1)
            undone = rolled if rolled.groups or rolled.steps else None
            self._rolled_back = True
        run.commit_written(before=step, trained=self._trained(step - 1))
        run.add_policy_version(step - 1, verl_policy_sha256(run.run_id, step - 1))
        return undone

    def dispatch(self, uids: Sequence[str]) -> None:
        """verl dispatches these groups (its uids): a group a resumed verl re-issues was maybe written by the killed
        run after the checkpoint it resumed from; that row and its lessons go now, before any draw reads them."""
        removed = self._run().redispatch(uids)
        if removed:
            log.warning("%s group(s) re-issued after the resume: the killed run's rows of them removed", removed)

    def checkpoint(self, step: int, folder: str) -> None:
        """verl saved step `step`'s checkpoint in `folder`: the step is committed (if it was not) and names it."""
        run = self._run()
        run.commit_written(before=step + 1, trained=self._trained(step))
        run.name_checkpoint(step, folder)

    def commit_through(self, step: int) -> None:
        """Commit every written step up to `step` (a checkpoint that is not durable yet names none)."""
        self._run().commit_written(before=step + 1, trained=self._trained(step))

    def _trained(self, step: int) -> int | None:
        """`step` if verl's asynchronous sampler handed it a batch in this process (`consume`): it commits with its
        metrics over the groups it trained, whether or not a group dispatched at it is written yet. A step's batch
        may come in several parts (`parameter_sync_step`), so it commits at its end: the next step's dispatch,
        its checkpoint, or the run's end."""
        return step if step in self._fates else None

    def consume(self, step: int, trained: Sequence[str], dropped: Mapping[str, str]) -> dict[str, float]:
        """verl's asynchronous sampler took these groups (verl's uids) off its buffer at `step`: trained, or dropped
        with a reason. Every trained group must be in the store (its worker wrote it before verl saw it finish); a
        dropped one may not be (a failed group whose sessions wrote nothing). Returns the step's metrics of it."""
        done = self._run().consume(step, list(trained), dict(dropped))
        unwritten = [u for u in done.missing if u not in dropped]
        if unwritten:
            raise RuntimeError(
                f"step {step} trains {len(unwritten)} group(s) the store never recorded ({unwritten[0]}, ...): "
                "lanpo's agent loop workers write each group before verl sees it finish"
            )
        if done.missing:
            log.warning("step %s: verl dropped %s failed group(s) that wrote nothing", step, len(done.missing))
        metrics = {f"lanpo/dropped/{reason}": float(n) for reason, n in done.dropped.items()}
        if trained:
            metrics["lanpo/trained_groups"] = float(done.trained)
        if done.missing:
            metrics["lanpo/dropped/unwritten"] = float(len(done.missing))
        totals = self._fates.setdefault(step, Counter())  # verl evicts in several passes a step: the store sums
        totals.update(metrics)
        self._run().record_metrics(step, dict(totals))
        return metrics  # this call's counts (verl's own metrics sum them over its passes)

    def finish(self, failed: bool = False) -> None:
        """The run is over: its written steps are committed, and it is marked finished (or failed)."""
        run = self._run()
        run.commit_written(trained=self._trained(max(self._fates, default=0)))
        run.finish(failed)

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
            run.ref,
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
        return self._run().lessons_left(step)

    def write_group(
        self,
        step: int,
        drawn: GroupPrompt,
        prompt_text: str,
        completions: Sequence[Completion],
        graded: Sequence[Graded],
        summaries: Mapping[int, Any] | None = None,
        uid: str | None = None,
        segments: Sequence[tuple[int | None, int | None]] = (),
    ) -> rows.StepWrite:
        """One finished group in ONE transaction: its prompt (as the model saw it), context rows, completions with
        their rewards, the step and policy version, and its admitted lessons under the pool's capacity policies and
        the step's lesson cap, which the store API holds across the workers writing the step's groups at once.
        `uid`: verl's name for the group (a group verl re-issues after a resume replaces the killed run's row);
        `segments`: each completion's (first, last) weights version as verl labels them (`min_global_steps`,
        `max_global_steps`: the weights after that step; partial rollout spans several)."""
        record = rows.group_records(drawn.prompts, [list(completions)], list(graded), dict(summaries or {}))[0]
        record.prompt = prompt_text
        record.trainer_uid = uid
        if drawn.text is None:
            record.prompt_version = ZERO_SHOT_PROMPT
        for rollout, (first, last) in zip(record.rollouts, segments, strict=False):
            rollout.first_policy_version_id = self._version_id(first)
            rollout.last_policy_version_id = self._version_id(last)
        return self._run().write_groups(step, [record], drawn.prompts.policy_version_id)

    def _version_id(self, after_step: int | None) -> int | None:
        """The policy version of verl's weights after step `after_step` (None: not reported)."""
        if after_step is None:
            return None
        found = self._versions.get(after_step)
        if found is None:
            run = self._run()
            found = self._versions[after_step] = run.add_policy_version(
                after_step, verl_policy_sha256(run.run_id, after_step)
            )
        return found

    def _run(self) -> Run:
        if self.run is None:
            raise RuntimeError("the verl store has no run yet: open_run (the manager) or attach (a worker) first")
        return self.run


def _completion(text: str) -> Completion:
    return Completion(text, (), (), "stop")
