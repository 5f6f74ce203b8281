"""Phase 1 of a step: this rank's prompts, each with the feedback context drawn from the store (if any).

The step's problems and their modes come from `lanpo.feedback.schedule` (the same on every rank); this rank takes its
share and `lanpo.feedback.contexts.contexted_prompts` draws and fits their contexts (its docstring says how, and the
`feedback/*` metrics each step records).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lanpo.feedback.contexts import StepPrompts, contexted_prompts
from lanpo.feedback.schedule import batch_problem_ids, choose_modes
from lanpo.feedback.store import RunRef
from lanpo.train.config import TrainConfig
from lanpo.train.plumbing.dist import Dist


def feedback_prompts(
    cfg: TrainConfig,
    step: int,
    run: RunRef,
    scorer: str | None,
    problem_ids: Sequence[int],
    tokenizer: Any,
    dist: Dist,
    version_step: int | None = None,
) -> StepPrompts:
    """This rank's share of the step's prompts, each with the context the store gives it (`scorer`: the stored
    relevance identity inter draws by; `problem_ids`: the training set the batch is drawn from). The prompts'
    policy version is `version_step`'s (default: the step before, which generates them synchronously; a step
    queued ahead for a worker names the newest committed one, and the worker's result says which served it)."""
    fb = cfg.feedback
    all_pids = batch_problem_ids(problem_ids, cfg.batch_size, cfg.seed, step)  # (G_all,)
    all_modes = choose_modes(all_pids, fb.mode, fb.p_t, cfg.seed, step)
    pids, asked = dist.share(all_pids), dist.share(all_modes)  # (G,) this rank's share
    version = step - 1 if version_step is None else version_step
    limit = cfg.rollout.max_prompt_tokens
    return contexted_prompts(fb, limit, cfg.seed, step, run, scorer, pids, asked, tokenizer, version)
