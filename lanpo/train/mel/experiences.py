"""Phase 4b of a step when `method = "mel"`: meta-experience learning on this rank's groups.

    mixed groups -> pairs (y+, y-) -> steps and their first textual difference -> one batched diagnosis per pair
    (names the bifurcation s*, then writes the lesson M from x, y+, y-, s*) -> M cleaned (numbers and the gold
    answer masked) -> r replays of x with M as working memory -> verdict (mel.validation) -> validated lessons
    become the update's NLL examples: (diagnosis prompt -> M) or (plain question -> a successful replay)

Every generation here (diagnosis, replays) is the policy that generated the step's rollouts, as the summaries are:
the policy of the step before the update, or, with rollout workers, the worker's, which runs `meta_generations`
right after the rollouts and hands the pairs back with their groups (`made`). The replays must be the group's policy:
a lesson is judged against its group's success rate, by the model that erred re-attempting x with M in its working
memory (MEL 3.2, Empirical Validation via Replay). At `workers.max_staleness = k` a lesson is up to k updates
stale, as its group is; the NLL term, supervised, trains the current policy on it unweighted.
Where the MEL paper leaves a choice open, the choice is a key of `[mel]` (lanpo.mel.config):
- steps are lines (`step_split`); the textual first difference is the diagnosis prompt's hint and its fallback
  when the model names no valid step (`locate = "model"`), or the bifurcation itself (`locate = "heuristic"`);
- one diagnosis call per pair does both jobs: it names s* first and writes M after, so M is conditioned on the
  s* the model just named (a second call would double the cost of the phase);
- a lesson is kept when its replays beat the group's own success rate (`validation = "beats_group"`);
- J_NLL is taken on M given the diagnosis prompt (`nll_target = "lesson"`): the object the paper's NLL is taken
  on is the meta-experience itself, self-distilled from the contrast of y+ and y-.
Under torchrun each rank works on its own groups (the step cap is split evenly; a worker generates the whole step
as one process, with the whole cap, and each rank gets its groups' pairs); its records travel to rank 0 with their
group (`GroupRecord.meta`), and rank 0 writes them (`lanpo.feedback.record_mel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from lanpo.feedback.contexts import StepPrompts
from lanpo.feedback.record import MetaRecord, RolloutRecord
from lanpo.mel.bifurcation import first_difference, split_steps
from lanpo.mel.pairs import Pair, contrastive_pairs
from lanpo.mel.prompts import clean_lesson, diagnosis_messages, parse_diagnosis, replay_messages
from lanpo.mel.verdict import keeps, success_rate
from lanpo.models import apply_chat
from lanpo.prompts import actor_messages
from lanpo.rewards import Graded, grade
from lanpo.rollout import Completion, SamplingParams
from lanpo.seeds import mix_seed
from lanpo.train.config import TrainConfig
from lanpo.train.consumer.update import NLLTerm
from lanpo.train.forward.batch import RolloutBatch, build_batch
from lanpo.train.parts import Sampler


@dataclass
class MetaStep:
    """What MEL adds to this rank's step: records per group (local group index -> pairs) and the NLL term."""

    by_group: dict[int, list[MetaRecord]] = field(default_factory=dict)
    nll: NLLTerm | None = None  # None: MEL is off, or lambda = 0 (the update is plain GRPO)


@dataclass
class MetaWork:
    """A pair on its way through the phase, with what the NLL example needs (kept on this rank, or sent by a
    worker with its group)."""

    pair: Pair
    record: MetaRecord
    diagnosis: Completion | None = None
    replays: list[Completion] = field(default_factory=list)


def meta_experiences(
    cfg: TrainConfig,
    sampler: Sampler,
    device: torch.device,
    step: int,
    prompts: StepPrompts,
    groups: list[list[Completion]],
    graded: list[Graded],
    made: list[MetaWork] | None = None,
) -> MetaStep:
    """MEL on this rank's G groups of n rollouts (`graded`: flat, group by group); an empty step when MEL is off.
    `sampler` diagnoses and replays with the policy, unless a rollout worker did both with the rollouts (`made`,
    from `meta_generations`); the NLL examples are built on `device`."""
    if cfg.method != "mel":
        return MetaStep()
    work = made if made is not None else meta_generations(cfg, sampler, step, prompts, groups, graded)
    by_group: dict[int, list[MetaRecord]] = {}
    for w in work:
        by_group.setdefault(w.pair.group, []).append(w.record)
    if cfg.mel.nll_coef == 0.0:
        return MetaStep(by_group)
    return MetaStep(by_group, NLLTerm(_nll_batch(cfg, sampler.tokenizer, device, prompts, work), cfg.mel.nll_coef))


def meta_generations(
    cfg: TrainConfig,
    sampler: Sampler,
    step: int,
    prompts: StepPrompts,
    groups: list[list[Completion]],
    graded: list[Graded],
) -> list[MetaWork]:
    """The phase's generations on G groups: pairs -> one diagnosis each -> r replays of each lesson, judged. The
    policy `sampler` serves is the one that generated `groups` (the trainer's before its update, or a worker's)."""
    mel, n = cfg.mel, cfg.rollout.n
    correct = [[graded[g * n + j].correct for j in range(n)] for g in range(len(groups))]  # (G, n)
    pairs = contrastive_pairs(
        prompts.problem_ids,
        correct,
        [[c.text for c in group] for group in groups],
        mel.pairs_per_problem,
        -(-mel.pairs_per_step // sampler.dist.world) if mel.pairs_per_step else 0,
    )
    work = _diagnose(cfg, sampler, step, prompts, groups, correct, pairs)
    _replay(cfg, sampler, step, prompts, [w for w in work if w.record.lesson is not None])
    return work


def work_to_json(w: MetaWork) -> dict[str, Any]:
    """A diagnosed pair as a worker hands it back with its group (`rollout_results.groups`)."""
    return {
        "pair": asdict(w.pair),
        "record": asdict(w.record),
        "diagnosis": None if w.diagnosis is None else asdict(w.diagnosis),
        "replays": [asdict(c) for c in w.replays],
    }


def work_from_json(data: dict[str, Any], group: int) -> MetaWork:
    """`work_to_json`'s inverse, its pair in group `group` (the group's index in the step, or in a rank's share)."""
    record = dict(data["record"])
    record["replays"] = [RolloutRecord(**r) for r in record["replays"]]
    pair = Pair(**{**data["pair"], "group": group})
    diagnosis = data["diagnosis"]
    return MetaWork(
        pair,
        MetaRecord(**record),
        None if diagnosis is None else completion_from_json(diagnosis),
        [completion_from_json(c) for c in data["replays"]],
    )


def completion_from_json(data: dict[str, Any]) -> Completion:
    """A `Completion` from its `asdict` (JSON turns its tuples into lists)."""
    c = dict(data)
    for key in ("token_ids", "prompt_token_ids"):
        c[key] = tuple(c[key])
    if c.get("logprobs") is not None:
        c["logprobs"] = tuple(c["logprobs"])
    return Completion(**c)


def _diagnose(
    cfg: TrainConfig,
    sampler: Sampler,
    step: int,
    prompts: StepPrompts,
    groups: list[list[Completion]],
    correct: list[list[bool]],
    pairs: list[Pair],
) -> list[MetaWork]:
    """One batched diagnosis per pair: the bifurcation step, the raw diagnosis and the cleaned lesson."""
    mel = cfg.mel
    steps, texts = [], []
    for pair in pairs:
        positive = split_steps(groups[pair.group][pair.positive].text, mel.step_split)
        negative = split_steps(groups[pair.group][pair.negative].text, mel.step_split)
        hint, shared = first_difference(positive, negative)
        steps.append((negative, hint, shared))
        question = prompts.questions[pair.group]
        messages = diagnosis_messages(question, positive, negative, hint, given=mel.locate == "heuristic")
        texts.append(apply_chat(sampler.tokenizer, messages))
    params = SamplingParams(
        max_new_tokens=mel.diagnosis_max_new_tokens,
        temperature=mel.diagnosis_temperature,
        seed=mix_seed(cfg.seed, "mel-diagnose", step, sampler.dist.rank),
        logprobs=False,  # the NLL reads the diagnosis's prompt and tokens, never its behaviour log-probs
    )
    outputs = sampler.backend.generate(texts, 1, params) if texts else []
    work = []
    for pair, (negative, hint, shared), output in zip(pairs, steps, outputs, strict=True):
        completion = output[0]
        parsed = parse_diagnosis(completion.text, len(negative))
        by_model = mel.locate == "model" and parsed.step is not None
        record = MetaRecord(
            positive=pair.positive,
            negative=pair.negative,
            step_split=mel.step_split,
            bifurcation_step=parsed.step if by_model and parsed.step is not None else hint,
            shared_prefix_steps=shared,
            located_by="model" if by_model else "heuristic",
            diagnosis=completion.text.replace("\x00", ""),
            group_success_rate=success_rate(correct[pair.group]),
            diagnosis_tokens=len(completion.token_ids),
            diagnosis_prompt_tokens=len(completion.prompt_token_ids),
            lesson=clean_lesson(parsed.lesson, prompts.answers[pair.group], mel.mask_numbers),
        )
        work.append(MetaWork(pair, record, completion))
    return work


def _replay(cfg: TrainConfig, sampler: Sampler, step: int, prompts: StepPrompts, candidates: list[MetaWork]) -> None:
    """r re-attempts of each candidate's problem with its lesson in the prompt, graded; sets each verdict."""
    if not candidates:
        return
    mel = cfg.mel
    texts = [
        apply_chat(sampler.tokenizer, replay_messages(prompts.questions[w.pair.group], w.record.lesson or ""))
        for w in candidates
    ]
    params = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=mel.replay_temperature,
        top_p=cfg.rollout.top_p,
        seed=mix_seed(cfg.seed, "mel-replay", step, sampler.dist.rank),
        logprobs=False,  # replays are graded (and their tokens an NLL target), never trained as rollouts
    )
    outputs = sampler.backend.generate(texts, mel.replays, params)  # (C, r)
    for w, text, completions in zip(candidates, texts, outputs, strict=True):
        answer = prompts.answers[w.pair.group]
        count = len(completions)
        marks = grade([c.text for c in completions], [answer] * count, ["replay"] * count, cfg.reward.format_rule)
        w.replays = completions
        w.record.replay_prompt = text
        w.record.replay_prompt_tokens = len(completions[0].prompt_token_ids) if completions else 0
        w.record.replays = [
            RolloutRecord(
                c.text,
                m.reward,
                m.correct,
                m.format_ok,
                len(c.token_ids),
                c.finish_reason == "length",
                served_adapter_sha256=c.served_adapter_sha256,
            )
            for c, m in zip(completions, marks, strict=True)
        ]
        kept = keeps(mel.validation, [m.correct for m in marks], w.record.group_success_rate)
        w.record.verdict = "validated" if kept else "rejected"


def _nll_batch(
    cfg: TrainConfig, tokenizer: Any, device: torch.device, prompts: StepPrompts, work: Sequence[MetaWork]
) -> RolloutBatch | None:
    """The validated lessons as NLL examples (prompt -> target); marks each record with its target tokens.

    lesson: the diagnosis prompt -> M (+ EOS); replay: the plain actor prompt -> the first successful replay.
    """
    target = cfg.mel.nll_target
    prompt_ids: list[Sequence[int]] = []
    target_ids: list[Sequence[int]] = []
    for w in work:
        if w.record.verdict != "validated" or w.diagnosis is None or w.record.lesson is None:
            continue
        if target == "lesson":
            ids = [*tokenizer(w.record.lesson, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
            prompt_ids.append(w.diagnosis.prompt_token_ids)
        else:
            index = next(i for i, r in enumerate(w.record.replays) if r.correct)  # validated: one succeeded
            ids = list(w.replays[index].token_ids)
            question = prompts.questions[w.pair.group]
            prompt_ids.append(
                tokenizer(apply_chat(tokenizer, actor_messages(question)), add_special_tokens=False)["input_ids"]
            )
            w.record.nll_replay = index
        target_ids.append(ids)
        w.record.nll_tokens = len(ids)
    if not target_ids:
        return None
    return build_batch(prompt_ids, target_ids, tokenizer.pad_token_id, device)  # (E, P' + T')
