"""`method` and `[mel]`: the recipes load with the paper's settings, impossible combinations fail naming the key
and the fix, and `lanpo experiment` knows a `mel` arm that works from any recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanpo.errors import ConfigError
from lanpo.experiment import DEFAULT_ARMS, ExperimentConfig, arm_config
from lanpo.mel.config import MELConfig
from lanpo.train.config import FeedbackConfig, StoreConfig, SummarizerConfig, TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "train" / "configs"


@pytest.mark.parametrize("size", ["4b", "8b", "14b"])
def test_paper_recipes_carry_the_mel_paper_settings(size: str) -> None:
    cfg = load_config(CONFIGS / f"mel-qwen3-{size}.toml")
    assert cfg.method == cfg.resolved_method() == "mel"
    assert cfg.model.name == f"Qwen/Qwen3-{size.upper()}-Base"
    assert (cfg.rollout.n, cfg.rollout.temperature, cfg.batch_size) == (8, 1.0, 128)
    assert cfg.grpo.minibatch_size == 128 * 8  # mini-batch 128 prompts: one optimizer step per step
    assert cfg.feedback.mode == "none" and cfg.feedback.inter.kinds == ["summary"]  # meta as feedback: off


def test_cpu_demo_recipe_loads() -> None:
    cfg = load_config(CONFIGS / "mel-demo-cpu.toml")
    assert cfg.method == "mel" and cfg.model.name == "smollm2" and cfg.sft.enabled


def test_method_resolves_and_refuses_what_contradicts_it() -> None:
    assert TrainConfig().resolved_method() == "lanpo"
    assert TrainConfig(feedback=FeedbackConfig(mode="none")).resolved_method() == "grpo"
    assert TrainConfig(method="mel", feedback=FeedbackConfig(mode="both")).resolved_method() == "mel"  # together
    with pytest.raises(ConfigError, match="method = grpo trains without language feedback") as info:
        TrainConfig(method="grpo")
    assert info.value.hint and "feedback.mode = none" in info.value.hint
    with pytest.raises(ConfigError, match="method = lanpo needs language feedback"):
        TrainConfig(method="lanpo", feedback=FeedbackConfig(mode="none"))
    with pytest.raises(ConfigError, match="method must be one of auto, grpo, lanpo, mel"):
        TrainConfig(method="ppo")
    small = {"store": StoreConfig(per_step_cap=2), "summarizer": SummarizerConfig(max_new_per_step=1)}
    with pytest.raises(ConfigError, match=r"mel.pairs_per_problem \(4\) exceeds store.per_step_cap \(2\)"):
        TrainConfig(method="mel", mel=MELConfig(pairs_per_problem=4), **small)  # type: ignore[arg-type]
    TrainConfig(mel=MELConfig(pairs_per_problem=4), **small)  # type: ignore[arg-type]  (MEL off: no matter)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("mel.step_split='paragraphs'", "mel.step_split must be one of lines, sentences"),
        ("mel.locate='oracle'", "mel.locate must be one of model, heuristic"),
        ("mel.validation='majority'", "mel.validation must be one of beats_group, any_success"),
        ("mel.nll_target='trajectory'", "mel.nll_target must be one of lesson, replay"),
        ("mel.replays=0", "mel.replays must be >= 1"),
        ("mel.nll_coef=-0.1", "mel.nll_coef must be >= 0"),
        ("mel.pairs_per_problem=0", "mel.pairs_per_problem must be >= 1"),
        ("feedback.inter.kinds=['lessons']", "feedback.inter.kinds must list distinct kinds of summary, meta"),
        ("feedback.inter.kinds=['meta', 'meta']", "feedback.inter.kinds must list distinct kinds"),
        ("mel.bogus=1", "unknown config key mel.bogus"),
    ],
)
def test_bad_mel_keys_fail_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(CONFIGS / "mel-demo-cpu.toml", [override])


def test_experiment_arms_name_their_method_so_any_recipe_serves_them() -> None:
    exp = ExperimentConfig(name="e", recipe="r.toml", arms=["grpo", "lanpo-both", "mel"])
    mel_recipe = load_config(CONFIGS / "mel-demo-cpu.toml")
    lanpo_recipe = load_config(CONFIGS / "demo-cpu.toml")
    for base in (mel_recipe, lanpo_recipe):
        arms = {arm: arm_config(base, DEFAULT_ARMS[arm], arm, 0, exp) for arm in exp.arms}
        assert {arm: cfg.resolved_method() for arm, cfg in arms.items()} == {
            "grpo": "grpo",
            "lanpo-both": "lanpo",
            "mel": "mel",
        }
        assert arms["mel"].feedback.mode == "none" and arms["mel"].run_name == "e-mel-s0"
