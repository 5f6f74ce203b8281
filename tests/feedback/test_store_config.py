"""`load_store_config` reads from a lanpo recipe the very tables `lanpo train` reads (old key names included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanpo.config import quiet_renames
from lanpo.feedback.config import StoreRunConfig, load_store_config
from lanpo.train.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "train/configs"


@pytest.mark.parametrize("recipe", ["demo-cpu.toml", "lanpo-inter.toml"])
def test_a_recipe_gives_the_tables_train_reads(recipe: str) -> None:
    overrides = ["feedback.p_t=0.25", "rollout.max_prompt_tokens=999", "grpo.beta=0.1"]
    with quiet_renames():
        ours = load_store_config(CONFIGS / recipe, overrides)
        theirs = StoreRunConfig.of(load_config(CONFIGS / recipe, overrides, world=1))
    assert ours == theirs and ours.feedback.p_t == 0.25 and ours.max_prompt_tokens == 999


def test_an_old_key_lands_on_the_new_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recipe = tmp_path / "old.toml"
    recipe.write_text('[feedback]\nmode = "inter"\ngamma = 0.7\n')
    cfg = load_store_config(recipe)
    assert cfg.feedback.inter.gamma == 0.7 and "feedback.gamma is deprecated" in caplog.text
