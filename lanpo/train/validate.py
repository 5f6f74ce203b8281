"""Held-out validation during training: the current policy answers a held-out dataset zero-shot, k samples each.

`eval.every = N` validates at step 0 (the start, before any update), every N steps and at the last step, with the
paper's sampling (Table 7: temperature 0.6, top-p 0.9, k = 8). Per dataset it records in `run_metrics`:
`val/<dataset>/mean@<k>` (mean over problems of the share of correct samples), `val/<dataset>/pass@<k>` (share of
problems with a correct sample) and `val/<dataset>/boxed` (share of samples with a `\\boxed{}` answer), and
`time/validate` (its seconds, wall; not a phase of the step, so kept out of the step's `time/step`), and
`cost/validation/generated_tokens` and `cost/validation/prompt_tokens` (kept off the training cost axes too). The
attempts are stored as rollout groups of mode `val` under the run and step, so SQL sees them; the intra pool
never draws them and validation never writes experiences.

Held out means held out: a generated validation set (`<data.dataset>-val`, reasoning-gym's test split) leaves out
every question the training dataset holds, and a named one that shares questions with it is refused.
Under torchrun each rank answers its share of the problems and rank 0 records them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from lanpo import prompts
from lanpo.db.connection import transaction
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.errors import ConfigError
from lanpo.feedback.record import GroupRecord, RolloutRecord, write_groups
from lanpo.feedback.store import RunRef
from lanpo.models import apply_chat
from lanpo.rewards import extract_boxed, grade
from lanpo.rollout import SamplingParams
from lanpo.seeds import mix_seed
from lanpo.train.config import TrainConfig
from lanpo.train.parts import Sampler
from lanpo.train.policy import Policy


@dataclass(frozen=True)
class ValidationSet:
    """The held-out problems validation answers (the first `eval.n` of the dataset, by id)."""

    dataset: str
    problem_ids: list[int]
    questions: list[str]
    answers: list[str | None]


def prepare_validation(session: Session, cfg: TrainConfig) -> ValidationSet | None:
    """The held-out set (generated from data.task's test split when the dataset is empty); None when `eval.every`
    is 0. ConfigError when it shares a question with the training dataset."""
    if not cfg.eval.every:
        return None
    dataset = cfg.validation_dataset()
    training = {p.question for p in problems_repo.problems_of_dataset(session, cfg.data.dataset)}
    if dataset not in problems_repo.known_datasets(session):
        if not cfg.data.task:
            raise ConfigError(
                f"eval.dataset {dataset!r} is not in the store and data.task is unset, so nothing can generate it",
                hint=f"import a held-out set (`lanpo data import FILE --dataset {dataset}`) or set data.task",
            )
        _generate(session, cfg, dataset, training)
    rows = problems_repo.problems_of_dataset(session, dataset)[: cfg.eval.n]
    if len(rows) < cfg.eval.n and not cfg.eval.dataset and cfg.data.task:
        # lanpo generated this set, for a smaller eval.n: validating on fewer problems than asked would be silent
        raise ConfigError(
            f"the validation dataset {dataset!r} holds {len(rows)} problems, generated for a smaller eval.n; "
            f"eval.n asks for {cfg.eval.n}",
            hint=f"set eval.n = {len(rows)}, or eval.dataset to a new name (lanpo generates it with eval.n problems)",
        )
    shared = sum(1 for r in rows if r.question in training)
    if shared:
        raise ConfigError(
            f"the validation dataset {dataset!r} shares {shared} question(s) with the training dataset "
            f"{cfg.data.dataset!r}: it would not be held out",
            hint="validate on problems the training set does not hold",
        )
    return ValidationSet(dataset, [r.id for r in rows], [r.question for r in rows], [r.answer for r in rows])


def _generate(session: Session, cfg: TrainConfig, dataset: str, training: set[str]) -> None:
    """`eval.n` test-split problems of data.task that the training set does not hold, imported as `dataset`."""
    from lanpo.data.generate import generate_problems
    from lanpo.data.importer import parse_line

    wanted, n = cfg.eval.n, cfg.eval.n
    kept: dict[str, dict] = {}
    while len(kept) < wanted and n <= 64 * wanted:  # small task spaces repeat questions: ask for more
        for record in generate_problems(cfg.data.task, n, cfg.data.seed, "test", dict(cfg.data.task_options)):  # type: ignore[arg-type]
            if record["question"] not in training:
                kept.setdefault(record["question"], record)
        n *= 2
    if len(kept) < wanted:
        raise ConfigError(
            f"data.task {cfg.data.task!r} has only {len(kept)} questions outside the training set; eval.n asks for "
            f"{wanted}",
            hint="lower eval.n, or widen data.task_options (more terms or digits)",
        )
    records = list(kept.values())[:wanted]
    problems_repo.upsert_problems(session, dataset, [parse_line(json.dumps(r)) for r in records])


def due(cfg: TrainConfig, step: int) -> bool:
    """Whether `step` is validated: step 0, every `eval.every` steps, and the last step."""
    every = cfg.eval.every
    return bool(every) and (step == 0 or step % every == 0 or step == cfg.steps)


def validate(
    cfg: TrainConfig, vs: ValidationSet | None, step: int, policy: Policy, sampler: Sampler, run: RunRef
) -> dict[str, float]:
    """Answer the held-out set `vs` with the current policy; rank 0 records and returns the `val/...` metrics."""
    ev, dist = cfg.eval, sampler.dist
    if vs is None:
        return {}
    started = time.perf_counter()
    mine = dist.share(range(len(vs.problem_ids)))
    texts = [apply_chat(sampler.tokenizer, prompts.actor_messages(vs.questions[i])) for i in mine]
    params = SamplingParams(
        max_new_tokens=ev.max_new_tokens or cfg.rollout.max_new_tokens,
        temperature=ev.temperature,
        top_p=ev.top_p,
        seed=mix_seed(cfg.seed, "validate", step, dist.rank),
        logprobs=False,  # validation answers are graded, never trained on
    )
    with policy.generating():  # every rank enters, with or without problems of its own
        groups = sampler.backend.generate(texts, ev.k, params)  # one list of k completions per problem
    records = []
    for i, text, completions in zip(mine, texts, groups, strict=True):
        graded = grade([c.text for c in completions], [vs.answers[i]] * ev.k, ["val"] * ev.k, cfg.reward.format_rule)
        rollouts = [
            RolloutRecord(
                c.text,
                g.reward,
                g.correct,
                extract_boxed(c.text) is not None,
                len(c.token_ids),
                c.finish_reason == "length",
                served_adapter_sha256=c.served_adapter_sha256,
            )
            for c, g in zip(completions, graded, strict=True)
        ]
        prompt_tokens = len(completions[0].prompt_token_ids) if completions else 0
        records.append(GroupRecord(vs.problem_ids[i], "val", text, prompt_tokens, [], rollouts))
    gathered = dist.gather(records)
    if gathered is None:
        return {}
    rows = [r for rank_rows in gathered for r in rank_rows]
    metrics = validation_metrics(rows, vs.dataset, ev.k) | {"time/validate": time.perf_counter() - started}
    # what it generated and read: recorded apart, never on the training cost axes (a measurement, the same for every
    # arm; lanpo.report.cost)
    metrics["cost/validation/generated_tokens"] = float(sum(r.completion_tokens for g in rows for r in g.rollouts))
    metrics["cost/validation/prompt_tokens"] = float(sum(g.prompt_tokens * len(g.rollouts) for g in rows))
    with transaction(run.db) as session:
        version = steps_repo.policy_version_id(session, run.run_id, step)  # the weights after `step`
        write_groups(session, run.run_id, step, version, rows)
        runs_repo.record_metrics(session, run.run_id, step, metrics)
    return metrics


def validation_metrics(groups: list[GroupRecord], dataset: str, k: int) -> dict[str, float]:
    """mean@k, pass@k and the boxed-answer rate over the held-out groups (one group of k samples per problem)."""
    correct = [sum(r.correct for r in g.rollouts) for g in groups]
    samples = [r for g in groups for r in g.rollouts]
    return {
        f"val/{dataset}/mean@{k}": sum(c / k for c in correct) / max(len(groups), 1),
        f"val/{dataset}/pass@{k}": sum(c > 0 for c in correct) / max(len(groups), 1),
        f"val/{dataset}/boxed": sum(r.format_ok for r in samples) / max(len(samples), 1),
        f"val/{dataset}/samples": float(len(samples)),  # the n of mean@k's binomial SE (lanpo.report.matched)
    }


def validated(session: Session, run_id: int, step: int) -> bool:
    """Whether the run's validation of `step` is recorded (a resumed run does not redo it)."""
    return runs_repo.has_metric_prefix(session, run_id, step, "val/")
