"""What a training step may generate, by source: the token side of `lanpo plan`, before any GPU time.

Bounds from the config alone, in the sources of the measured `cost/generated_tokens/<source>`
(`lanpo.feedback.record.COST_SOURCES`; `lanpo report` draws them): every rollout at its mode's length limit,
every lesson the summary cap allows at `summarizer.max_new_tokens`, every MEL pair diagnosed and replayed at its
limits. LANPO names the summaries a cost of their own (Section 6, "Remark on training overhead": "the
summarization step requires a separate generation process"), and the cap decides it: appendix 9.2's "maximum
number of feedback saved in each step to be 8" read in total (the paper recipes, `summarizer.max_total_per_step =
8`) is 8 summaries a step; read per problem (`summarizer.max_new_per_step`) it is 8 for every problem of the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lanpo.feedback_modes import asks_inter
from lanpo.train.config import TrainConfig


@dataclass(frozen=True)
class Generation:
    """One source's generations a step at most: how many, and tokens each at most."""

    source: str  # rollout | summary | mel_diagnosis | mel_replay
    count: int
    max_tokens: int

    @property
    def tokens(self) -> int:
        return self.count * self.max_tokens


def summaries_per_step(cfg: TrainConfig, gpus: int = 1) -> tuple[int, int]:
    """(summaries a step at most over the ranks, at most on one rank): 0 when nothing is summarised. Under a total
    cap one rank may write them all (rank 0 chooses over the step, `choose_for_step`); per problem, each rank
    writes its own prompts' share."""
    s = cfg.summarizer
    if not (s.enabled and (asks_inter(cfg.feedback.mode) or s.always)):
        return 0, 0
    if s.max_total_per_step:
        return s.max_total_per_step, s.max_total_per_step
    return cfg.batch_size * s.max_new_per_step, math.ceil(cfg.batch_size / gpus) * s.max_new_per_step


def step_generation(cfg: TrainConfig) -> list[Generation]:
    """Each source's generations a step at most (sources with none are left out)."""
    r = cfg.rollout
    out = [Generation("rollout", cfg.batch_size * r.n, max(r.max_new_tokens, r.feedback_max_new_tokens))]
    summaries, _ = summaries_per_step(cfg)
    if summaries:
        out.append(Generation("summary", summaries, cfg.summarizer.max_new_tokens))
    if cfg.method == "mel":
        m = cfg.mel
        pairs = cfg.batch_size * m.pairs_per_problem
        pairs = min(pairs, m.pairs_per_step) if m.pairs_per_step else pairs
        out.append(Generation("mel_diagnosis", pairs, m.diagnosis_max_new_tokens))
        out.append(Generation("mel_replay", pairs * m.replays, r.max_new_tokens))
    return out


def generation_line(cfg: TrainConfig) -> str:
    """`lanpo plan`'s line: what a step may generate, by source, and over the run."""
    parts = step_generation(cfg)
    total = sum(g.tokens for g in parts)
    each = ", ".join(f"{g.source} {g.count:,} x {g.max_tokens:,}" for g in parts)
    return (
        f"generation at most: {_tokens(total)} tokens a step ({each}), {_tokens(total * cfg.steps)} over "
        f"{cfg.steps} steps"
    )


def _tokens(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:g}"
