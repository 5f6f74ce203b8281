"""The producer half of a step: its prompts -> n rollouts each -> rewards -> summaries of the successful ones.

The synchronous trainer runs it in its own process (`lanpo.train.loop.grpo_step`); a rollout worker
(`lanpo.train.producer.worker`) runs the very same function on prompts it claimed from the store, and hands back what
it made through `rollout_results` as JSON (`groups_to_json` / `produced_from_json`). The trainer's consumer half
(advantages -> loss -> record) cannot tell the two apart: that is what the `workers.max_staleness = 0` equivalence
test checks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from sqlalchemy.orm import Session

from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo.contexts import InterAttemptItem, InterItem, IntraItem
from lanpo.feedback import summarize as lessons
from lanpo.feedback.contexts import StepPrompts, per_rollout
from lanpo.feedback.summarize import Summary
from lanpo.rewards import Graded, grade
from lanpo.rollout import Completion, SamplingParams
from lanpo.seeds import mix_seed
from lanpo.train.config import RolloutConfig, TrainConfig
from lanpo.train.mel.experiences import MetaWork, completion_from_json, work_from_json, work_to_json
from lanpo.train.parts import Sampler
from lanpo.train.plumbing.dist import Dist
from lanpo.train.plumbing.timing import Phases
from lanpo.train.producer.summarize import choose_for_step


@dataclass
class Produced:
    """A step's rollouts as the consumer half takes them: G groups of n graded completions and their summaries;
    from a worker, also which policy step generated them and the queue's accounting."""

    prompts: StepPrompts
    groups: list[list[Completion]]  # (G,) lists of n completions, in prompt order
    graded: list[Graded]  # (G*n,) flat, group by group
    summaries: dict[int, Summary]  # flat rollout index -> its summary (only the summarised ones)
    metrics: dict[str, float] = field(default_factory=dict)  # async/*: staleness, dropped, redone, waits
    work_id: int | None = None  # the rollout_work row it came from (None: generated in this process)
    mel: list[MetaWork] | None = None  # method = mel, from a worker: its diagnoses and replays (None: not made yet)

    @property
    def rollouts(self) -> list[Completion]:
        return [c for group in self.groups for c in group]


def produce(
    cfg: TrainConfig, sampler: Sampler, summarizer: Sampler | None, step: int, prompts: StepPrompts, phase: Phases
) -> Produced:
    """Generate, grade and summarise step `step`'s prompts with the policy `sampler` serves."""
    with phase("generate"):
        groups = generate(cfg.rollout, cfg.seed, sampler, step, prompts)  # G lists of n completions
    rollouts = [c for group in groups for c in group]  # (G*n,) flat, group by group
    with phase("reward"):
        n = cfg.rollout.n
        answers, modes = per_rollout(prompts.answers, n), per_rollout(prompts.modes, n)
        graded = grade([c.text for c in rollouts], answers, modes, cfg.reward.format_rule)
    with phase("summarize"):
        summaries = summaries_of(cfg, summarizer, step, prompts, rollouts, graded)  # rollout -> summary
    return Produced(prompts, groups, graded, summaries)


def generate(
    cfg: RolloutConfig, seed: int, sampler: Sampler, step: int, prompts: StepPrompts
) -> list[list[Completion]]:
    """n completions per prompt, in prompt order. Each prompt gets its mode's length limit (`RolloutConfig.budget`):
    one call per distinct limit, so a recipe with one limit for every mode makes one call, as it always has."""
    budgets = [cfg.budget(mode) for mode in prompts.modes]
    groups: list[list[Completion]] = [[] for _ in budgets]
    for budget in sorted(set(budgets)):
        which = [g for g, b in enumerate(budgets) if b == budget]
        parts: tuple[int | str, ...] = (seed, "generate", step, sampler.dist.rank)
        if budget != cfg.max_new_tokens:  # the zero-shot call keeps the seed a one-call step has always had
            parts += (budget,)
        params = SamplingParams(
            max_new_tokens=budget, temperature=cfg.temperature, top_p=cfg.top_p, seed=mix_seed(*parts)
        )
        texts = [prompts.texts[g] for g in which]
        for g, group in zip(which, sampler.backend.generate(texts, cfg.n, params), strict=True):
            groups[g] = group
    return groups


def summaries_of(
    cfg: TrainConfig,
    summarizer: Sampler | None,
    step: int,
    prompts: StepPrompts,
    rollouts: list[Completion],
    graded: list[Graded],
) -> dict[int, Summary]:
    """Summaries of this rank's successful rollouts, checked for admission (flat rollout index -> summary);
    `summarizer`: what writes them on this rank, None when summaries are off. Rank 0 chooses over the whole step."""
    if summarizer is None:
        return {}
    dist = summarizer.dist
    return lessons.summaries_of(
        cfg.summarizer,
        summarizer.backend,
        summarizer.tokenizer,
        cfg.seed,
        step,
        prompts,
        rollouts,
        graded,
        dist.rank,
        dist.world,
        partial(choose_for_step, dist),
    )


# --------------------------------------------------------------------------- through the store, as JSON

_ITEMS = {"intra": IntraItem, "inter": InterItem, "inter_attempt": InterAttemptItem}
_KINDS = {cls: kind for kind, cls in _ITEMS.items()}


def prompts_to_json(prompts: StepPrompts) -> dict[str, Any]:
    """A step's prompts as the queue keeps them (`rollout_work.prompts`). Gold answers stay out: a worker reads
    them from `problems` to grade, and nothing a prompt is built from carries them."""
    out = asdict(prompts)
    del out["answers"]
    out["missed"] = dict(prompts.missed)
    out["items"] = [[{"kind": _KINDS[type(item)], **asdict(item)} for item in items] for items in prompts.items]
    return out


def prompts_from_json(data: dict[str, Any], answers: list[str | None]) -> StepPrompts:
    """`prompts_to_json`'s inverse, with the gold answers of its problems (in prompt order)."""
    fields = dict(data)
    fields["missed"] = Counter(fields["missed"])
    fields["items"] = [
        [_ITEMS[item["kind"]](**{k: v for k, v in item.items() if k != "kind"}) for item in items]
        for items in fields["items"]
    ]
    return StepPrompts(answers=answers, **fields)


def prompts_from_store(session: Session, data: dict[str, Any]) -> StepPrompts:
    """`prompts_from_json` with the gold answers of its problems read from the store."""
    return prompts_from_json(data, [p.answer for p in problems_repo.problems_by_ids(session, data["problem_ids"])])


def groups_to_json(produced: Produced) -> list[dict[str, Any]]:
    """What a worker hands back (`rollout_results.groups`): per group, its completions, grades and summaries."""
    n = len(produced.groups[0]) if produced.groups else 0
    out = []
    for g, group in enumerate(produced.groups):
        rows = []
        for j, c in enumerate(group):
            graded, summary = produced.graded[g * n + j], produced.summaries.get(g * n + j)
            summary_row = None if summary is None else asdict(summary)
            rows.append({"completion": asdict(c), "graded": asdict(graded), "summary": summary_row})
        out.append({"rollouts": rows})
    if produced.mel is not None:  # MEL's diagnosed pairs travel with their group (a group may have none)
        for group in out:
            group["mel"] = []
        for w in produced.mel:
            out[w.pair.group]["mel"].append(work_to_json(w))
    return out


def produced_from_json(prompts: StepPrompts, groups: list[dict[str, Any]]) -> Produced:
    """`groups_to_json`'s inverse, for the prompts they were generated from."""
    completions: list[list[Completion]] = []
    graded: list[Graded] = []
    summaries: dict[int, Summary] = {}
    mel: list[MetaWork] | None = None
    for g, group in enumerate(groups):
        completions.append([])
        for row in group["rollouts"]:
            if row["summary"] is not None:
                summaries[len(graded)] = Summary(**row["summary"])
            completions[-1].append(completion_from_json(row["completion"]))
            graded.append(Graded(**row["graded"]))
        if "mel" in group:
            mel = (mel or []) + [work_from_json(w, g) for w in group["mel"]]
    return Produced(prompts, completions, graded, summaries, mel=mel)


def share_of(got: Produced, dist: Dist) -> Produced:
    """Rank `dist.rank`'s strided share of a whole step (groups r, r + W, ...: the prompts `feedback_prompts`
    gives the rank synchronously), its summaries and MEL pairs renumbered within the share. The queue's
    accounting (`metrics`, `work_id`) stays with rank 0, which commits the step."""
    p, n = got.prompts, len(got.groups[0]) if got.groups else 0
    keep = dist.share(range(len(got.groups)))  # the step's group indices on this rank
    local = {g: i for i, g in enumerate(keep)}
    prompts = replace(
        p,
        **{name: dist.share(getattr(p, name)) for name in PER_PROMPT},
        missed=Counter(),  # counted over the whole step: rank 0's metrics say it (`RolloutQueue.take`)
    )
    summaries = {local[i // n] * n + i % n: s for i, s in got.summaries.items() if i // n in local}
    mel = None
    if got.mel is not None:
        mel = [replace(w, pair=replace(w.pair, group=local[w.pair.group])) for w in got.mel if w.pair.group in local]
    return Produced(
        prompts,
        [got.groups[g] for g in keep],
        [got.graded[g * n + j] for g in keep for j in range(n)],
        summaries,
        metrics=got.metrics if dist.is_main else {},
        work_id=got.work_id if dist.is_main else None,
        mel=mel,
    )


PER_PROMPT = ("problem_ids", "questions", "answers", "asked", "modes", "texts", "items", "drawn", "truncated")
