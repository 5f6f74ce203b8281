"""MEL's settings (`[mel]` of a training recipe; in effect when `method = "mel"`).

The MEL paper's method section gives no equations and few numbers, so most of these are choices of ours; each
help string says which value the paper gives where it gives one. Recipes: `train/configs/mel-*.toml`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lanpo.config import check as _check
from lanpo.config import help_field

STEP_SPLITS = ("lines", "sentences")
LOCATORS = ("model", "heuristic")
VALIDATION_RULES = ("beats_group", "any_success")
NLL_TARGETS = ("lesson", "replay")


@dataclass
class MELConfig:
    """Contrastive pairs -> bifurcation -> diagnosis and lesson -> replay validation -> NLL internalisation."""

    pairs_per_problem: int = help_field(2, "contrastive pairs (y+, y-) diagnosed per problem and step")
    pairs_per_step: int = help_field(0, "pairs per step over all problems and ranks (0: no limit; CPU demos cap it)")
    step_split: str = help_field("lines", "a response's reasoning steps: lines (non-empty lines) | sentences")
    locate: str = help_field(
        "model",
        "who names the bifurcation step: model (the diagnosis names it; the first textual difference is its hint "
        "and fallback) | heuristic (the first step that differs after normalisation)",
    )
    diagnosis_max_new_tokens: int = help_field(512, "diagnosis length limit (bifurcation step and lesson)")
    diagnosis_temperature: float = help_field(0.7, "diagnosis sampling temperature (0: greedy)")
    replays: int = help_field(4, "r: re-attempts of the problem with the lesson in the prompt")
    replay_temperature: float = help_field(1.0, "replay sampling temperature (the paper's rollout temperature)")
    validation: str = help_field(
        "beats_group",
        "keep a lesson when its replays: beats_group (succeed more often than the group did without it) | "
        "any_success (succeed at least once)",
    )
    nll_coef: float = help_field(0.1, "lambda in J = J_GRPO + lambda * J_NLL (0: the update is plain GRPO)")
    nll_target: str = help_field(
        "replay",
        "what J_NLL is taken on: replay (a successful replay, given the plain question without the lesson: context "
        "distillation, MEL section 3.3) | lesson (the meta-experience text, given the diagnosis prompt)",
    )
    mask_numbers: bool = help_field(
        True, "replace every numeral of a lesson with N (the gold answer's text is masked either way)"
    )

    def __post_init__(self) -> None:
        _check(self.pairs_per_problem >= 1, f"mel.pairs_per_problem must be >= 1, got {self.pairs_per_problem}")
        _check(self.pairs_per_step >= 0, f"mel.pairs_per_step must be >= 0, got {self.pairs_per_step}")
        _check(
            self.step_split in STEP_SPLITS,
            f"mel.step_split must be one of {', '.join(STEP_SPLITS)}, got {self.step_split!r}",
        )
        _check(self.locate in LOCATORS, f"mel.locate must be one of {', '.join(LOCATORS)}, got {self.locate!r}")
        _check(
            self.diagnosis_max_new_tokens >= 1,
            f"mel.diagnosis_max_new_tokens must be >= 1, got {self.diagnosis_max_new_tokens}",
        )
        _check(
            self.diagnosis_temperature >= 0,
            f"mel.diagnosis_temperature must be >= 0, got {self.diagnosis_temperature}",
        )
        _check(self.replays >= 1, f"mel.replays must be >= 1, got {self.replays}", "a lesson is validated by replay")
        _check(self.replay_temperature > 0, f"mel.replay_temperature must be > 0, got {self.replay_temperature}")
        _check(
            self.validation in VALIDATION_RULES,
            f"mel.validation must be one of {', '.join(VALIDATION_RULES)}, got {self.validation!r}",
        )
        _check(self.nll_coef >= 0, f"mel.nll_coef must be >= 0, got {self.nll_coef}")
        _check(
            self.nll_target in NLL_TARGETS,
            f"mel.nll_target must be one of {', '.join(NLL_TARGETS)}, got {self.nll_target!r}",
        )
