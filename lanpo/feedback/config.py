"""The tables any trainer's store client reads: `[data]` (the problems), `[feedback]` (which contexts, how often, how
many), `[feedback.inter]` (which experiences of other problems, and what an item shows), `[summarizer]` (distilling
successful rollouts into lessons) and `[reward]` (when the format bonus is paid). lanpo's `TrainConfig`
(lanpo.train.config) composes them; `StoreRunConfig` holds them for a trainer lanpo does not know, and
`load_store_config` reads them from a lanpo recipe. `[store]` (the capacity policies) is `lanpo.config.StoreConfig`:
the store's own pool repository reads it, so it sits below this layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from lanpo.config import Renamed, StoreConfig, apply_overrides, from_mapping, help_field, read_toml
from lanpo.config import check as _check
from lanpo.db.repo.sampling import PRIORS, RANKS, VALUE_PRIOR_SD, Ranking
from lanpo.feedback.intra_gate import GATES
from lanpo.feedback_modes import FEEDBACK_SETTINGS, GAMMA, asks_inter
from lanpo.rewards import DEFAULT_FORMAT_RULE, FORMAT_RULES

INTER_KINDS = ("summary", "meta")  # feedback.inter.kinds: experience kinds inter contexts draw from
INTER_SHOWS = ("lesson", "response")  # feedback.inter.shows: what an inter item shows of the experience drawn
INTER_DRAWS = ("relevant", "random")  # feedback.inter.draw: where inter items come from


@dataclass
class InterConfig:
    """Inter-sample feedback: which experiences of other problems a context draws, and what each item shows."""

    kinds: list[str] = field(
        default_factory=lambda: ["summary"],
        metadata={"help": "experience kinds inter contexts draw from: summary (LANPO's) | meta (MEL's lessons)"},
    )
    shows: str = help_field(
        "lesson",
        "what an item shows -- lesson (the distilled lesson, paper) | response (the source rollout's own response, "
        "unsummarised: lanpo's own ablation, not a row of the paper's Table 2)",
    )
    gamma: float = help_field(
        GAMMA,
        "minimum relevance of a lesson's source problem (paper: 0.9); 0: no relevance filter at all -- every "
        "active lesson of another problem is a candidate, ranked by recency, no relevance read (lanpo's reading of "
        "Table 2's w/o filtering, which only drops the threshold)",
    )
    draw: str = help_field(
        "relevant",
        "where items come from -- relevant (the pool's lessons of other problems at gamma, ranked: the paper) | "
        "random (the run's correct attempts of any other problem, uniformly, no relevance: Fig. 2c's random arm, "
        "needs shows = response)",
    )
    scorer: str | None = help_field(
        None, "the relevance scorer whose scores to read (None: the only one in relevance_scores)"
    )
    allow_empty: bool = help_field(
        False, "start inter / both even when relevance_scores holds no score (every inter prompt goes zero-shot)"
    )
    rank: str = help_field(
        "relevance",
        "how candidates are ranked -- relevance (the paper: relevance, then recency) | value (lessons on probation: "
        "an upper confidence bound on each lesson's lift, untried ones optimistic, relevance only gating; "
        "docs/concepts.md)",
    )
    prior_sd: float = help_field(
        VALUE_PRIOR_SD,
        "rank = value: the prior's standard deviation of a lesson's lift; an untried lesson is worth 1.96 x this, "
        "so it is tried before lessons known to do nothing and after lessons known to help",
    )
    value_bound: float = help_field(
        0.0,
        "rank = value: a lesson whose value (the upper bound on its lift) is below this is never drawn; with none "
        "left the prompt goes zero-shot",
    )
    prior: str = help_field(
        "zero",
        "rank = value: the prior's mean -- zero | pool (the pool's graded lessons' mean lift, shrunk toward 0: where "
        "the lessons tried so far hurt, an untried one is not presumed to help; docs/concepts.md)",
    )

    def __post_init__(self) -> None:
        distinct = len(set(self.kinds)) == len(self.kinds)
        _check(
            bool(self.kinds) and distinct and set(self.kinds) <= set(INTER_KINDS),
            f"feedback.inter.kinds must list distinct kinds of {', '.join(INTER_KINDS)}, got {self.kinds}",
            'e.g. kinds = ["summary"] (LANPO\'s lessons), or ["summary", "meta"] with MEL\'s',
        )
        _check(
            self.shows in INTER_SHOWS,
            f"feedback.inter.shows must be one of {', '.join(INTER_SHOWS)}, got {self.shows!r}",
            "lesson shows the distilled lesson (the paper); response the rollout it came from (lanpo's own ablation)",
        )
        _check(0.0 <= self.gamma <= 1.0, f"feedback.inter.gamma must be in [0, 1], got {self.gamma}")
        _check(
            self.draw in INTER_DRAWS,
            f"feedback.inter.draw must be one of {', '.join(INTER_DRAWS)}, got {self.draw!r}",
            "relevant draws the pool's lessons by relevance (the paper); random the run's correct attempts (Fig. 2c)",
        )
        _check(
            self.rank in RANKS,
            f"feedback.inter.rank must be one of {', '.join(RANKS)}, got {self.rank!r}",
            "relevance ranks as the paper does; value ranks by what each lesson is known to be worth",
        )
        _check(0.0 < self.prior_sd <= 1.0, f"feedback.inter.prior_sd must be in (0, 1], got {self.prior_sd}")
        _check(
            -1.0 <= self.value_bound <= 1.0, f"feedback.inter.value_bound must be in [-1, 1], got {self.value_bound}"
        )
        _check(
            self.prior in PRIORS,
            f"feedback.inter.prior must be one of {', '.join(PRIORS)}, got {self.prior!r}",
            "zero centres a lesson's prior on 0; pool on what the pool's graded lessons did",
        )
        _check(
            self.draw != "random" or self.shows == "response",
            "feedback.inter.draw = random draws attempts, which have no lesson to show",
            'set feedback.inter.shows = "response" (Fig. 2c: raw correct rollouts of other problems)',
        )

    @property
    def ranking(self) -> Ranking:
        """The draw's ranking (`lanpo.db.repo.sampling.Ranking`)."""
        return Ranking(self.rank, self.prior_sd, self.value_bound, self.prior)

    @property
    def reads_relevance(self) -> bool:
        """Whether a draw reads relevance_scores: relevant draws at gamma > 0 (random and gamma 0 read none)."""
        return self.draw == "relevant" and self.gamma > 0

    @property
    def shows_response(self) -> bool:
        """Items show the source rollout's own response, not its lesson (lanpo's own ablation, not a Table 2 row)."""
        return self.shows == "response"


@dataclass
class IntraConfig:
    """Intra-sample feedback: whether the run's own earlier attempts are served while they are known to hurt."""

    gate: str = help_field(
        "none",
        "none (the paper: intra served at p_t) | value (lanpo's: intra served only while the run's intra groups are "
        "not known to do worse than its zero-shot ones, by the value rule with feedback.inter.prior_sd and "
        "value_bound) | thompson (lanpo's: each prompt that asks for intra served it with the posterior chance that "
        "intra's lift is at least value_bound: half of them untried; lanpo.feedback.intra_gate, docs/concepts.md)",
    )

    def __post_init__(self) -> None:
        _check(
            self.gate in GATES,
            f"feedback.intra.gate must be one of {', '.join(GATES)}, got {self.gate!r}",
            "none serves intra as the paper does; value stops serving it while it is known to hurt; thompson serves "
            "it by the chance that it helps",
        )


@dataclass
class FeedbackConfig:
    """Language feedback: which contexts are drawn from the store, how often, and how many."""

    # the flat keys before [feedback.inter] (read as its keys, with a warning; lanpo.config.Renamed)
    RENAMED: ClassVar[dict[str, Renamed]] = {
        "sources": Renamed("inter.kinds"),
        "inter_source": Renamed("inter.shows", {"summary": "lesson", "raw": "response"}),
        "gamma": Renamed("inter.gamma"),
        "scorer": Renamed("inter.scorer"),
        "allow_empty_inter": Renamed("inter.allow_empty"),
    }

    mode: str = help_field(
        "both",
        "none (plain GRPO) | intra | inter | both (pick per problem) | leaked-intra (Fig. 2b's arm, built to show "
        "leakage: the intra prompt plus the problem's gold answer; never a default)",
    )
    p_t: float = help_field(0.5, "probability that a problem gets a feedback context (paper: 0.5; intra best 0.75)")
    k: int = help_field(2, "items in a context (earlier attempts or lessons)")
    candidates: int = help_field(8, "top-ranked candidates kept before the weighted draw w_i = 1/(i+1)")
    inter: InterConfig = field(
        default_factory=InterConfig, metadata={"help": "inter-sample feedback: what is drawn and shown"}
    )
    intra: IntraConfig = field(
        default_factory=IntraConfig, metadata={"help": "intra-sample feedback: when the run's own attempts are served"}
    )

    def __post_init__(self) -> None:
        _check(
            self.mode in FEEDBACK_SETTINGS,
            f"feedback.mode must be one of {', '.join(FEEDBACK_SETTINGS)}, got {self.mode!r}",
        )
        _check(0.0 <= self.p_t <= 1.0, f"feedback.p_t must be in [0, 1], got {self.p_t}")
        _check(self.k >= 1, f"feedback.k must be >= 1, got {self.k}")
        _check(self.candidates >= self.k, f"feedback.candidates ({self.candidates}) must be >= feedback.k ({self.k})")


@dataclass
class SummarizerConfig:
    """Distilling successful rollouts into experiences for the inter-sample pool."""

    enabled: bool = help_field(True, "summarise successful rollouts into new experiences")
    model: str = help_field("policy", "'policy' (the model being trained) or another model folder / hub id")
    max_new_tokens: int = help_field(2048, "summary length limit (paper: 2048; CPU demos set far less)")
    min_reward: float = help_field(1.0, "a rollout is 'successful' at reward >= this")
    max_new_per_step: int = help_field(
        8,
        "lessons summarised per problem per step (appendix 9.2's 8 read per problem; the paper recipes cap the "
        "step's total instead, max_total_per_step)",
    )
    max_total_per_step: int = help_field(
        0,
        "lessons summarised per step over every problem and rank (0: no limit; the paper recipes: 8, appendix "
        "9.2's 'maximum number of feedback saved in each step'), one problem at a time in the step's order",
    )
    temperature: float = help_field(0.7, "summary sampling temperature")
    always: bool = help_field(
        False,
        "summarise even when training draws no inter lesson (feedback.mode none / intra): fills the pool for "
        "test-time retrieval (Table 2, GRPO + test-time retrieval)",
    )
    require_format: bool = help_field(
        True,
        "admit a summary to the pool only when it is a lesson: the headers ## Flow, ## Principles, ## Pitfalls, each "
        "with words of its own under it (lanpo.prompts.has_summary_format), no section a repetition loop or a copy of "
        "the template or of another section, not its question restated (lanpo.feedback.summarize.check_summary); "
        "false admits any 20+ characters that do not repeat the problem's numbers",
    )
    scaffold: bool = help_field(
        False,
        "write the lesson's headers for the model, which writes each section's body (ends at a blank line or the "
        "next heading; max_new_tokens split over the three): for summarisers too weak to keep the format (the CPU "
        "recipes); the paper's model writes the whole lesson (off)",
    )

    def __post_init__(self) -> None:
        _check(self.max_new_tokens >= 1, f"summarizer.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _check(self.max_new_per_step >= 1, f"summarizer.max_new_per_step must be >= 1, got {self.max_new_per_step}")
        _check(self.temperature > 0, f"summarizer.temperature must be > 0, got {self.temperature}")
        total = self.max_total_per_step
        _check(total >= 0, f"summarizer.max_total_per_step must be >= 0, got {total}")


@dataclass
class DataConfig:
    """Which problems to train on: a dataset already imported, or generated from reasoning-gym on first use."""

    dataset: str = help_field("chain_sum", "dataset name in the store (problems.dataset)")
    task: str | None = help_field(None, "reasoning-gym task to generate the dataset from when it is empty")
    n: int = help_field(200, "problems to generate when the dataset is empty and `task` is set")
    seed: int = help_field(0, "generation seed")
    task_options: dict = field(default_factory=dict, metadata={"help": "reasoning-gym task options"})

    def __post_init__(self) -> None:
        _check(self.dataset.strip() != "", "data.dataset must not be empty")
        _check(self.n >= 1, f"data.n must be >= 1, got {self.n}")


@dataclass
class RewardConfig:
    """A rollout's reward: correctness (its last `\\boxed{}`, by math-verify) plus the format bonus (lanpo.rewards)."""

    format_rule: str = help_field(
        DEFAULT_FORMAT_RULE,
        "when the +0.1 format bonus is paid: paper (LANPO appendix 10.3: a feedback-mode response with its mode's "
        "headers, right or wrong) | correct_only (headers and a boxed answer, on a correct answer only: the paper's "
        "rule was gamed on the CPU experiment, docs/results.md)",
    )

    def __post_init__(self) -> None:
        _check(
            self.format_rule in FORMAT_RULES,
            f"reward.format_rule must be one of {', '.join(FORMAT_RULES)}, got {self.format_rule!r}",
            "paper (the paper recipes) or correct_only (the CPU recipes)",
        )


@dataclass
class StoreRunConfig:
    """What a trainer's run in the store reads: the tables above, `[store]`, and the prompt limit
    (`rollout.max_prompt_tokens` in a lanpo recipe). `of` takes them from a lanpo `TrainConfig`."""

    run_name: str = help_field("lanpo", "unique run name")
    seed: int = help_field(0, "seed for the modes and the context draws")
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "training problems"})
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig, metadata={"help": "language feedback contexts"})
    summarizer: SummarizerConfig = field(default_factory=SummarizerConfig, metadata={"help": "distillation"})
    store: StoreConfig = field(default_factory=StoreConfig, metadata={"help": "experience store capacity policies"})
    reward: RewardConfig = field(default_factory=RewardConfig, metadata={"help": "the rollouts' reward"})
    max_prompt_tokens: int = help_field(3072, "prompt length limit: context items are cut to fit, never dropped")

    def __post_init__(self) -> None:
        _check(self.run_name.strip() != "", "run_name must not be empty")
        _check(self.max_prompt_tokens >= 8, f"max_prompt_tokens must be >= 8, got {self.max_prompt_tokens}")

    @classmethod
    def of(cls, cfg: Any) -> StoreRunConfig:
        """`cfg` itself, or the tables of a lanpo `TrainConfig` (anything with its attribute names)."""
        if isinstance(cfg, cls):
            return cfg
        tables = ("run_name", "seed", "data", "feedback", "summarizer", "store", "reward")
        return cls(**{name: getattr(cfg, name) for name in tables}, max_prompt_tokens=cfg.rollout.max_prompt_tokens)

    def pool_name(self) -> str:
        """The experience pool the run reads and writes: `store.pool`, else one named after the run."""
        return self.store.pool or self.run_name

    def wants_lessons(self) -> bool:
        """Whether successful rollouts are summarised: inter feedback reads lessons, or `summarizer.always`."""
        return self.summarizer.enabled and (asks_inter(self.feedback.mode) or self.summarizer.always)


def load_store_config(path: str | Path, overrides: list[str] | None = None) -> StoreRunConfig:
    """The tables a store run reads from a lanpo recipe (`train/configs/*.toml`, its `base` chain resolved) plus
    `a.b=value` overrides: run_name, seed, `[data]`, `[feedback]`, `[summarizer]`, `[store]`, `[reward]` and
    `rollout.max_prompt_tokens`; the trainer's own tables are left to the trainer."""
    data = apply_overrides(read_toml(path), overrides or [])
    tables = ("run_name", "seed", "data", "feedback", "summarizer", "store", "reward")
    picked = {name: data[name] for name in tables if name in data}
    if "max_prompt_tokens" in data.get("rollout", {}):
        picked["max_prompt_tokens"] = data["rollout"]["max_prompt_tokens"]
    return from_mapping(StoreRunConfig, picked)
