"""`[replay]`: past trajectories from the store trained on again beside a step's fresh rollouts (ExGRPO, RLEP, RePO).

Off by default and in every paper recipe (LANPO trains on-policy, App. 9). What each choice follows, and every choice
made where a source is silent, is in docs/papers.md ("Replay arms"). The draw lives in `lanpo.feedback.replay_draw`,
the loss corrections in `lanpo.rl.replay_loss`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lanpo.config import check as _check
from lanpo.config import help_field

# none: the replayed tokens are trained as if on-policy, the ratio the current policy's own (RLEP; its issue 7);
# shaped: the importance ratio w against the stored behaviour log-probs, shaped w / (w + shaping), no clip (ExGRPO);
# separate: replayed attempts get their own advantages and their own clipped term against the behaviour (RePO).
CORRECTIONS = ("none", "shaped", "separate")
# which of a step's problems get replays: any with a stored trajectory (uniformly), or by ExGRPO's buckets of the
# problem's latest correctness (the middle favoured, fully solved problems retired)
PROBLEM_CHOICES = ("any", "bucket")
# which stored trajectories of a chosen problem: uniformly, the newest, or the lowest mean entropy under the current
# policy (ExGRPO)
TRAJECTORY_CHOICES = ("random", "recent", "lowest_entropy")


@dataclass
class ReplayConfig:
    """Replay of stored trajectories (off unless `enabled`)."""

    enabled: bool = help_field(False, "join stored trajectories to the step's groups (off in the paper recipes)")
    correction: str = help_field(
        "none",
        "none (RLEP: trained as on-policy) | shaped (ExGRPO: w/(w+shaping) against the behaviour log-probs, "
        "no clip) | "
        "separate (RePO: own advantages and a clipped term against the behaviour log-probs)",
    )
    per_group: int = help_field(2, "replayed trajectories joined to a chosen problem's group (RLEP: 2 beside 16)")
    share: float = help_field(
        1.0, "of the step's problems with a stored trajectory, the share that get replays (ExGRPO's rho: 0.5)"
    )
    problems: str = help_field("any", "which problems get replays: any | bucket (ExGRPO's correctness buckets)")
    trajectories: str = help_field(
        "random", "which stored trajectories: random | recent | lowest_entropy (under the current policy, ExGRPO)"
    )
    shaping: float = help_field(0.1, "the shaping constant of correction = shaped, w / (w + shaping) (ExGRPO: 0.1)")
    successes_only: bool = help_field(
        True, "replay correct attempts only (RLEP, ExGRPO); false: any graded attempt (RePO's full scope)"
    )
    source_runs: list[str] = field(
        default_factory=list,
        metadata={"help": "earlier runs whose attempts are replayed (RLEP's fixed pool); empty: this run's own"},
    )
    keep_tokens: bool = help_field(
        False,
        "store each fresh attempt's token ids and behaviour log-probs (always on with enabled; alone, for a run "
        "that a later one replays)",
    )

    def __post_init__(self) -> None:
        hint = "see docs/configuration.md, [replay]"
        _check(self.correction in CORRECTIONS, f"replay.correction must be one of {', '.join(CORRECTIONS)}", hint)
        _check(self.problems in PROBLEM_CHOICES, f"replay.problems must be one of {', '.join(PROBLEM_CHOICES)}", hint)
        _check(
            self.trajectories in TRAJECTORY_CHOICES,
            f"replay.trajectories must be one of {', '.join(TRAJECTORY_CHOICES)}",
            hint,
        )
        _check(self.per_group >= 1, f"replay.per_group must be >= 1, got {self.per_group}", hint)
        _check(0.0 < self.share <= 1.0, f"replay.share must be in (0, 1], got {self.share}", hint)
        _check(self.shaping > 0.0, f"replay.shaping must be > 0, got {self.shaping}", hint)
        _check(
            self.correction != "separate" or self.per_group >= 2,
            "replay.correction = separate normalises the replayed attempts among themselves: it needs 2 or more",
            "set replay.per_group = 2 or more",
        )
        _check(
            self.correction != "separate" or not self.successes_only,
            "replay.correction = separate normalises the replayed attempts among themselves, and successes alone "
            "have no spread",
            "set replay.successes_only = false (RePO's full scope)",
        )

    @property
    def stores_tokens(self) -> bool:
        """Whether the run writes its fresh attempts' tokens and behaviour log-probs (`attempt_tokens`)."""
        return self.enabled or self.keep_tokens

    @property
    def needs_logprobs(self) -> bool:
        """Whether the correction reads the stored behaviour log-probs (shaped, separate; none trains on-policy)."""
        return self.correction != "none"
