"""examples/verl/lanpo_paper.yaml composes as `python -m verl.trainer.main_ppo --config-path examples/verl
--config-name lanpo_paper` composes it (Hydra, `pkg://verl.trainer.config`), every key it sets is one of verl's own
(or a field of verl's agent-loop config, or lanpo's block), and the paper's values arrive where verl reads them. Runs
where Hydra and verl are installed (the verl lane); `lanpo plan --verl` reads the same file everywhere
(test_plan_verl.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.verl,
    pytest.mark.skipif(
        importlib.util.find_spec("hydra") is None or importlib.util.find_spec("verl") is None,
        reason="needs hydra-core and verl (the verl lane)",
    ),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verl"
# Keys verl's YAML leaves out but its dataclass has: AgentLoopConfig.agent_loop_manager_class (read by main_ppo with
# .get(); verl/workers/config/rollout.py), and `rollout.name`, which verl's YAML holds as `???` (no default).
NOT_IN_VERLS_YAML = {
    "actor_rollout_ref.rollout.agent.agent_loop_manager_class": "agent_loop_manager_class: Optional[str] = None",
    "actor_rollout_ref.rollout.name": None,
}


def _leaves(node: Any, prefix: str = "") -> list[str]:
    from omegaconf import OmegaConf

    if OmegaConf.is_dict(node):
        return [leaf for key in node for leaf in _leaves(node._get_node(key), f"{prefix}{key}.")]
    return [prefix[:-1]]


def test_the_example_composes_with_verls_config() -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    verl = Path(importlib.util.find_spec("verl").origin).parent  # type: ignore[union-attr, arg-type]
    with initialize_config_dir(config_dir=str(EXAMPLES), version_base=None):
        cfg = compose(config_name="lanpo_paper", overrides=["lanpo.config=/abs/recipe.toml", "trainer.nnodes=2"])
    with initialize_config_dir(config_dir=str(verl / "trainer" / "config"), version_base=None):
        base = compose(config_name="ppo_trainer")
    own = OmegaConf.load(EXAMPLES / "lanpo_paper.yaml")
    for key in _leaves(own):
        if key.startswith(("hydra", "defaults", "lanpo.")):
            continue
        if key in NOT_IN_VERLS_YAML:
            field = NOT_IN_VERLS_YAML[key]
            assert field is None or field in (verl / "workers" / "config" / "rollout.py").read_text(), key
            continue
        assert OmegaConf.select(base, key, default="<absent>") != "<absent>", f"{key} is not one of verl's keys"
    OmegaConf.resolve(cfg)
    select = lambda key: OmegaConf.select(cfg, key)  # noqa: E731
    assert select("actor_rollout_ref.rollout.prompt_length") == 3072  # Table 7, through verl's interpolation
    assert select("actor_rollout_ref.rollout.response_length") == 8192
    assert select("actor_rollout_ref.actor.rollout_n") == 16
    assert select("actor_rollout_ref.ref.log_prob_use_dynamic_bsz") is True
    assert select("actor_rollout_ref.actor.optim.lr") == 1e-6
    assert (select("actor_rollout_ref.actor.clip_ratio_low"), select("actor_rollout_ref.actor.clip_ratio_high")) == (
        0.2,
        0.28,
    )
    assert select("actor_rollout_ref.actor.kl_loss_coef") == 0.0005
    assert select("actor_rollout_ref.rollout.agent.default_agent_loop") == "lanpo"
    assert select("trainer.checkpoint_callback_class") == "lanpo.integrations.verl.LanpoCheckpointCallback"
    assert select("lanpo.config") == "/abs/recipe.toml" and select("lanpo.run_name") == "lanpo-both"
    assert select("trainer.nnodes") == 2
