"""Recipes load; unknown keys and impossible values fail with a message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanpo.errors import ConfigError
from lanpo.train.config import TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "train" / "configs"
RECIPES = ["demo-cpu", "grpo-baseline", "lanpo-intra", "lanpo-inter", "lanpo-both", "sft-demo"]


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_load(name: str) -> None:
    cfg = load_config(CONFIGS / f"{name}.toml")
    assert isinstance(cfg, TrainConfig) and cfg.run_name


def test_paper_recipes_carry_the_paper_settings() -> None:
    for name, mode, p_t in [
        ("grpo-baseline", "none", 0.0),
        ("lanpo-intra", "intra", 0.75),
        ("lanpo-both", "both", 0.5),
    ]:
        cfg = load_config(CONFIGS / f"{name}.toml")
        assert (cfg.feedback.mode, cfg.feedback.p_t) == (mode, p_t)
        assert (cfg.grpo.eps_low, cfg.grpo.eps_high, cfg.grpo.beta, cfg.grpo.loss_agg) == (
            0.2,
            0.28,
            5e-4,
            "token-mean",
        )
        assert cfg.rollout.n == 16 and cfg.grpo.warmup_ratio == 0.1


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("feedback.p_t=1.5", "feedback.p_t"),
        ("rollout.n=1", "rollout.n"),
        ("grpo.eps_high=0.1", "grpo.eps_high"),
        ("grpo.loss_agg='sum'", "grpo.loss_agg"),
        ("feedback.mode='sideways'", "feedback.mode"),
        ("grpo.bogus=1", "grpo.bogus"),
        ("steps='many'", "steps"),
        ("grpo.minibatch_size=5", "grpo.minibatch_size"),
        ("summarizer.max_new_per_step=20", "summarizer.max_new_per_step"),
        ("grpo.tis_cap=2.0", "grpo.tis_cap"),
    ],
)
def test_impossible_values_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "demo-cpu.toml", [override])
    assert key in str(info.value)


def test_a_lora_rank_above_the_engine_limit_is_refused_before_loading() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "demo-cpu.toml", ["rollout.backend='vllm'", "lora.r=32"])
    assert "rollout.vllm.max_lora_rank" in str(info.value)
    cfg = load_config(
        CONFIGS / "demo-cpu.toml", ["rollout.backend='vllm'", "lora.r=32", "rollout.vllm.max_lora_rank=32"]
    )
    assert cfg.lora.r == 32 and cfg.grpo.tis_cap is None


def test_keys_lists_every_field_with_its_help(run_cli) -> None:  # type: ignore[no-untyped-def]
    from lanpo.config import describe
    from lanpo.train.config import TrainConfig

    out = run_cli("train", "--keys")
    assert out.code == 0, out.err
    for key, default, help_text in describe(TrainConfig):
        assert help_text, f"{key} has no help"
        assert f"{key} = {default}" in out.out and help_text in out.out
    assert "feedback.candidates = 8" in out.out and "grpo.tis_cap = unset" in out.out


def test_a_recipe_starts_from_its_base(tmp_path: Path) -> None:
    (tmp_path / "parent.toml").write_text('run_name = "p"\nsteps = 7\n[lora]\nr = 8\nalpha = 16\n[rollout]\nn = 4\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "child.toml").write_text('base = "../parent.toml"\nrun_name = "c"\n[lora]\nr = 32\n')
    cfg = load_config(tmp_path / "sub" / "child.toml", ["steps=9"])
    assert (cfg.run_name, cfg.steps, cfg.lora.r, cfg.lora.alpha, cfg.rollout.n) == ("c", 9, 32, 16, 4)
    (tmp_path / "a.toml").write_text('base = "b.toml"\n')
    (tmp_path / "b.toml").write_text('base = "a.toml"\n')
    with pytest.raises(ConfigError, match="form a cycle"):
        load_config(tmp_path / "a.toml")
    (tmp_path / "bad.toml").write_text("base = 3\n")
    with pytest.raises(ConfigError, match="`base` must name another recipe file"):
        load_config(tmp_path / "bad.toml")


def test_full_fine_tuning_config() -> None:
    """lora.enabled = false takes the other LoRA keys as they are (the SFT warm start still uses them), on either
    rollout backend: vLLM loads the full weights after every update (tests/vllm_engine/test_full_weights.py)."""
    cfg = load_config(CONFIGS / "lanpo-both.toml", ["lora.enabled=false", "grpo.learning_rate=1e-6"])
    assert not cfg.lora.enabled and cfg.lora.r == 16 and cfg.grpo.learning_rate == 1e-6
    assert load_config(CONFIGS / "demo-cpu.toml", ["model.gradient_checkpointing=true"]).model.gradient_checkpointing
    full_vllm = load_config(CONFIGS / "lanpo-both.toml", ["lora.enabled=false", "rollout.backend='vllm'"])
    assert not full_vllm.lora.enabled and full_vllm.rollout.backend == "vllm"
    assert load_config(CONFIGS / "lanpo-both.toml", ["lora.enabled=true", "rollout.backend='vllm'"]).lora.enabled
    # MEL's NLL term under FSDP (full fine-tuning on several ranks) pads the ranks' forwards to the same count
    # (tests/mel/test_update_nll.py), so the MEL paper's 8-GPU full fine-tuning loads
    assert not load_config(CONFIGS / "mel-qwen3-4b.toml", world=8).lora.enabled


def test_lora_sync_is_chosen_per_device_and_merged_needs_the_vllm_backend() -> None:
    """auto: merged on CPU (vLLM's CPU LoRA kernels lose most of its speed), adapter on CUDA; merged with the hf
    backend, which generates with the trained model itself, is refused with what to do."""
    from lanpo.rollout.config import VLLMConfig

    assert (VLLMConfig().lora_sync_on("cpu"), VLLMConfig().lora_sync_on("cuda")) == ("merged", "adapter")
    assert VLLMConfig(lora_sync="adapter").lora_sync_on("cpu") == "adapter"
    vllm = load_config(CONFIGS / "demo-cpu.toml", ["rollout.backend='vllm'", "rollout.vllm.lora_sync='merged'"])
    assert vllm.rollout.vllm.lora_sync == "merged"
    with pytest.raises(ConfigError, match=r"lora_sync = 'merged' with rollout.backend = hf") as info:
        load_config(CONFIGS / "demo-cpu.toml", ["rollout.backend='hf'", "rollout.vllm.lora_sync='merged'"])
    assert info.value.hint == "set rollout.backend = vllm, or leave rollout.vllm.lora_sync at auto"
    with pytest.raises(ConfigError, match="lora_sync must be one of auto, adapter, merged"):
        load_config(CONFIGS / "demo-cpu.toml", ["rollout.vllm.lora_sync='folded'"])
