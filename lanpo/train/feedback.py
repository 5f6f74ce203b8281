"""Phase 1 of a step: this rank's prompts, each with the feedback context drawn from the store (if any).

The step's problems and their modes come from `lanpo.train.schedule` (the same on every rank); this rank takes
its share, draws intra contexts (its run's earlier attempts on the problem) and inter contexts (lessons of other
problems in the run's pool, relevance >= gamma) for the whole share in two queries, and renders each chat prompt,
dropping context items (last drawn first) until it fits `rollout.max_prompt_tokens`.

A prompt that asked for feedback and got none is rendered zero-shot and counted by reason: `empty_pool` (inter:
the pool holds no active experience), `none_relevant` (inter: nothing at gamma by the scorer), `no_history`
(intra: no earlier attempt of this run on the problem), `too_long` (items drawn, none fit).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lanpo import prompts as templates
from lanpo.db.engine import transaction
from lanpo.db.repo import contexts as contexts_repo
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.models import apply_chat
from lanpo.prompts import FEEDBACK_MODES
from lanpo.train.schedule import batch_problem_ids, choose_modes, mix_seed

if TYPE_CHECKING:
    from lanpo.train.state import Trainer

MISSED = ("empty_pool", "none_relevant", "no_history", "too_long")


@dataclass
class StepPrompts:
    """This rank's G prompts of one step (one entry per prompt, in the step's order)."""

    problem_ids: list[int]
    questions: list[str]
    answers: list[str | None]
    asked: list[str]  # the mode each prompt asked for: zero_shot | intra | inter
    modes: list[str]  # the mode it got (zero_shot when no context could be drawn or fitted)
    texts: list[str]  # the chat prompt, rendered
    items: list[list[Any]]  # the context items in it (IntraItem / InterItem), in prompt order
    policy_version_id: int  # the weights that generate this step: the policy of the step before
    missed: Counter[str] = field(default_factory=Counter)  # prompts that asked and got nothing, by reason
    raw: bool = False  # inter items are raw rollouts of other problems, not summaries (feedback.inter_source)

    def version(self, g: int) -> str:
        """The template version of prompt g (stored with its group)."""
        return templates.version_of(self.modes[g], raw=self.raw)

    def feedback_metrics(self, n: int) -> dict[str, float]:
        """Rollouts that asked for each kind of feedback and got it, and why the others did not (counts)."""
        out: dict[str, float] = {}
        for mode in FEEDBACK_MODES:
            out[f"feedback/asked/{mode}"] = float(n * self.asked.count(mode))
            out[f"feedback/served/{mode}"] = float(n * self.modes.count(mode))
        for reason in MISSED:
            out[f"feedback/missed/{reason}"] = float(n * self.missed[reason])
        return out


def feedback_prompts(t: Trainer, step: int) -> StepPrompts:
    """This rank's share of the step's prompts, each with the context the store gives it."""
    cfg, fb, dist = t.cfg, t.cfg.feedback, t.dist
    all_pids = batch_problem_ids(t.problem_ids, cfg.batch_size, cfg.seed, step)  # (G_all,)
    all_modes = choose_modes(all_pids, fb.mode, fb.p_t, cfg.seed, step)
    pids, asked = dist.share(all_pids), dist.share(all_modes)  # (G,) this rank's share
    seed = mix_seed(cfg.seed, "contexts", step)
    with transaction(t.engine) as session:
        rows = {p.id: p for p in problems_repo.problems_by_ids(session, sorted(set(pids)))}
        wanted = {mode: sorted({p for p, m in zip(pids, asked, strict=True) if m == mode}) for mode in FEEDBACK_MODES}
        drawn: dict[str, dict[int, list[Any]]] = {"intra": {}, "inter": {}}
        drawn["intra"] = contexts_repo.intra_contexts(
            session, wanted["intra"], fb.k, fb.candidates, seed, run_id=t.run_id
        )
        unfiltered = fb.gamma == 0.0  # Table 2, w/o filtering: the whole pool, no relevance consulted
        if wanted["inter"] and (t.scorer or unfiltered):
            drawn["inter"] = contexts_repo.inter_contexts(
                session, wanted["inter"], fb.k, fb.candidates, seed, fb.gamma, None if unfiltered else t.scorer,
                t.pool.id, fb.sources, raw=fb.inter_source == "raw",
            )  # fmt: skip
        pool_empty = bool(wanted["inter"]) and pools_repo.active_size(session, t.pool.id) == 0
        policy_version_id = steps_repo.policy_version_id(session, t.run_id, step - 1)
    out = StepPrompts([], [], [], asked, [], [], [], policy_version_id, raw=fb.inter_source == "raw")
    for pid, mode in zip(pids, asked, strict=True):
        found = list(drawn.get(mode, {}).get(pid, []))
        text, kept = fit_prompt(
            t.tokenizer, mode, rows[pid].question, found, cfg.rollout.max_prompt_tokens, fb.inter_source == "raw"
        )
        if mode in FEEDBACK_MODES and not kept:  # an honest from-scratch rollout, and the reason it is one
            out.missed[_missed_reason(mode, found, pool_empty)] += 1
        out.problem_ids.append(pid)
        out.questions.append(rows[pid].question)
        out.answers.append(rows[pid].answer)
        out.modes.append(mode if kept else "zero_shot")
        out.texts.append(text)
        out.items.append(kept)
    return out


def _missed_reason(mode: str, found: list[Any], pool_empty: bool) -> str:
    if found:
        return "too_long"
    if mode == "intra":
        return "no_history"
    return "empty_pool" if pool_empty else "none_relevant"


def fit_prompt(
    tokenizer: Any, mode: str, question: str, found: list[Any], limit: int, raw: bool = False
) -> tuple[str, list[Any]]:
    """The chat prompt for `mode`, dropping context items (last drawn first) until it fits `limit` tokens.

    Nothing is ever cut out of the question or an item: with no item left the prompt is the zero-shot one.
    `raw`: inter items are unsummarised solutions of other problems (their own wording, Table 2).
    """
    while True:
        text = apply_chat(tokenizer, templates.build_messages(mode, question, found, raw=raw))
        if not found or len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= limit:
            return text, found
        found = found[:-1]
