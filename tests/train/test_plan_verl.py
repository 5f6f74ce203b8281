"""`lanpo plan --verl`: examples/verl/lanpo_paper.yaml mapped to the planner's inputs through the CLI, each mapped
number held to the YAML (read here with PyYAML, not the code's OmegaConf), Hydra overrides applied, the plan the same
as `lanpo plan --config` with the mapped keys; bad input refused. verl 0.9.1's defaults held to verl's own file when
verl is installed (the verl lane)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from lanpo.cli import main
from lanpo.train.plan_verl import VERL_DEFAULTS, map_verl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "verl" / "lanpo_paper.yaml"
LINE = re.compile(r"^  (\S.*?)\s+= (.+?)  ->  (\S+) = (.+)$")


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _mapping(out: str) -> dict[str, tuple[str, str]]:
    """lanpo key -> (verl value as printed, lanpo value as printed)."""
    return {m[3]: (m[2], m[4]) for m in (LINE.match(line) for line in out.splitlines()) if m}


def test_the_paper_example_maps_to_its_own_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _plan(capsys, "--verl", str(EXAMPLE), "--gpu-memory", "79")
    assert code == 0, err
    assert "lanpo's trainer's memory model for the same shapes, not verl's" in out
    got = _mapping(out)
    raw = yaml.safe_load(EXAMPLE.read_text())
    data, actor, rollout, model, trainer = (
        raw["data"],
        raw["actor_rollout_ref"]["actor"],
        raw["actor_rollout_ref"]["rollout"],
        raw["actor_rollout_ref"]["model"],
        raw["trainer"],
    )
    n = rollout["n"]
    assert got["--gpus"][1] == str(trainer["nnodes"] * trainer["n_gpus_per_node"]) == "8"
    assert got["model.name"][1] == model["path"] == "Qwen/Qwen2.5-7B"
    assert got["lora.enabled"][1] == str(model["lora_rank"] > 0) == "False"
    assert got["batch_size"][1] == str(data["train_batch_size"]) == "512"
    assert got["rollout.max_prompt_tokens"][1] == str(data["max_prompt_length"]) == "3072"
    assert got["rollout.max_new_tokens"][1] == str(data["max_response_length"]) == "8192"
    assert got["rollout.n"][1] == str(n) == "16"
    assert got["grpo.minibatch_size"][1] == str(actor["ppo_mini_batch_size"] * n) == "1024"
    assert got["grpo.max_tokens_per_micro_batch"][1] == str(actor["ppo_max_token_len_per_gpu"]) == "11264"
    row = data["max_prompt_length"] + data["max_response_length"]
    assert got["grpo.micro_batch_size"][1] == str(actor["ppo_max_token_len_per_gpu"] // row) == "1"
    assert got["model.gradient_checkpointing"][1] == str(model["enable_gradient_checkpointing"])
    assert got["rollout.backend"][1] == rollout["name"] == "vllm"
    assert got["rollout.vllm.memory_fraction"][1] == str(rollout["gpu_memory_utilization"])
    assert got["rollout.vllm.sleep_during_update"][1] == str(rollout["free_cache_engine"])
    assert got["grpo.autocast"] == ("bfloat16 (verl's default)", "bf16")
    assert got["rollout.vllm.tensor_parallel_size"] == ("2 (verl's default)", "2")
    assert (
        "not mapped (verl's memory, no counterpart in lanpo's trainer): actor_rollout_ref.model.use_remove_padding"
        in out
    )
    assert "lanpo recipe: " in out and "lanpo-both.toml (lanpo.config)" in out
    assert "verdict: " in out
    assert "steps: the lanpo recipe's" in out and "over 330 steps" in out  # lanpo-both.toml's: Section 5's 330

    # The same plan as `lanpo plan --config` on the recipe with the mapped keys set.
    inputs = map_verl(EXAMPLE, [])
    sets = [arg for o in inputs.overrides for arg in ("--set", o)]
    code, direct, err = _plan(capsys, "--config", str(inputs.recipe), *sets, "--gpus", "8", "--gpu-memory", "79")
    assert code == 0, err
    assert out[out.index("\nmodel ") :] == "\n" + direct


def test_hydra_overrides_change_the_mapping(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _plan(
        capsys,
        "--verl",
        str(EXAMPLE),
        "actor_rollout_ref.rollout.n=8",
        "trainer.n_gpus_per_node=4",
        "trainer.nnodes=2",
        "actor_rollout_ref.model.lora_rank=32",
        "+actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "trainer.total_training_steps=20",
    )
    assert code == 0, err
    got = _mapping(out)
    assert got["--gpus"] == ("2 x 4", "8")
    assert got["rollout.n"][1] == "8" and got["grpo.minibatch_size"][1] == str(64 * 8)
    assert (
        got["lora.enabled"][1] == "True" and got["lora.r"][1] == "32" and got["rollout.vllm.max_lora_rank"][1] == "32"
    )
    assert got["lora.alpha"] == ("16 (verl's default)", "16")
    assert got["grpo.micro_batch_size"][1] == "2" and got["grpo.max_tokens_per_micro_batch"][1] == "0"
    assert got["steps"][1] == "20" and "over 20 steps" in out
    unmapped = next(line for line in out.splitlines() if line.startswith("  not mapped"))
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" in unmapped


def test_bad_input_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    recipe = str(ROOT / "train" / "configs" / "lanpo-both.toml")
    cases = [
        (["--verl", str(EXAMPLE), "--config", recipe], "name one recipe"),
        ([], "name one recipe"),
        (["--verl", str(EXAMPLE), "--gpus", "2"], "reads the GPUs from the verl config"),
        (["--verl", str(EXAMPLE), "--set", "steps=2"], "--set overrides a lanpo recipe"),
        (["--verl", str(EXAMPLE), "actor_rollout_ref.rollout.n"], "must look like key=value"),
        (["--config", recipe, "rollout.n=2"], "unexpected argument"),
        (["--verl", str(tmp_path / "none.yaml")], "does not exist"),
        (["--verl", str(EXAMPLE), "actor_rollout_ref.actor.use_dynamic_bsz=false"], "ppo_micro_batch_size_per_gpu"),
        (["--verl", str(EXAMPLE), "actor_rollout_ref.rollout.n=many"], "actor_rollout_ref.rollout.n must be a whole"),
        (["--verl", str(EXAMPLE), "~actor_rollout_ref.rollout.n"], "must look like key=value"),
    ]
    bare = tmp_path / "bare.yaml"
    bare.write_text("actor_rollout_ref:\n  rollout:\n    name: vllm\n")
    cases.append((["--verl", str(bare)], "has no lanpo.config"))
    for args, said in cases:
        code, _, err = _plan(capsys, *args)
        assert code == 2 and said in err and "hint:" in err, (args, err)


@pytest.mark.verl
@pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed (the verl lane has it)")
def test_verl_defaults_are_verls_own() -> None:
    from omegaconf import OmegaConf

    folder = Path(importlib.util.find_spec("verl").origin).parent  # type: ignore[union-attr, arg-type]
    generated = OmegaConf.load(folder / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    for key, value in VERL_DEFAULTS.items():
        theirs = OmegaConf.select(generated, key, throw_on_missing=False)
        assert theirs == value or (value is None and OmegaConf.is_missing(generated, key)), key
