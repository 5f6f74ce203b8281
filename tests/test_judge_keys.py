"""The keys that name a judge model are `judge` (issue 24: `scorer` names only the stored "<model>|<prompt version>"):
`retrieval.scorer` of an eval config (and `lanpo infer --scorer`) became `retrieval.judge`, an experiment's
`relevance.scorer` became `relevance.judge`. The old names keep loading, as the new ones, from a mapping, a TOML
file, a `--set` and a stored experiment identity, with one warning line naming both; both together are refused."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lanpo.cli import infer
from lanpo.config import apply_overrides, from_mapping, keys_text, load_toml, to_mapping
from lanpo.errors import ConfigError
from lanpo.experiment import ExperimentConfig, RelevanceStep, identity, upgrade_identity
from lanpo.inference.config import EvalConfig, RetrievalSettings
from lanpo.train.config import TrainConfig

CONFIGS = Path(__file__).resolve().parents[1] / "train" / "configs"
EXPERIMENTS = Path(__file__).resolve().parents[1] / "train" / "experiments"

# (the class, the table it is in a file, its old key's path, its new key's path, a value that is not the default)
KEYS = [
    (EvalConfig, "retrieval", "retrieval.scorer", "retrieval.judge", "none"),
    (EvalConfig, "retrieval", "retrieval.scorer", "retrieval.judge", "Qwen/Qwen2.5-Math-7B-Instruct"),
    (ExperimentConfig, "relevance", "relevance.scorer", "relevance.judge", "tiny-random"),
]
IDS = [f"{old}={value}" for _, _, old, _, value in KEYS]
REQUIRED = {EvalConfig: {"datasets": [{"name": "d"}]}, ExperimentConfig: {"name": "e", "recipe": "r.toml"}}
HEAD = {EvalConfig: '[[datasets]]\nname = "d"\n', ExperimentConfig: 'name = "e"\nrecipe = "r.toml"\n'}  # as TOML


def _deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "lanpo.config" and "deprecated" in r.getMessage()]


def _nested(path: str, value: object) -> dict:
    table, key = path.split(".")
    return {table: {key: value}}


@pytest.mark.parametrize(("cls", "table", "old", "new", "value"), KEYS, ids=IDS)
def test_the_old_key_loads_as_the_new_one(
    cls: type, table: str, old: str, new: str, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="lanpo.config"):
        before = from_mapping(cls, {**REQUIRED[cls], **_nested(old, value)})
    (line,) = _deprecations(caplog)
    assert old in line and new in line and "\n" not in line
    today = from_mapping(cls, {**REQUIRED[cls], **_nested(new, value)})
    assert before == today and getattr(today, table).judge == value
    assert today != from_mapping(cls, REQUIRED[cls])  # the value was not lost on the way
    assert "scorer" not in to_mapping(getattr(today, table))  # stored (runs.config, an identity) by the new name


@pytest.mark.parametrize(("cls", "table", "old", "new", "value"), KEYS, ids=IDS)
def test_the_old_key_in_a_file_and_in_an_override(
    tmp_path: Path, cls: type, table: str, old: str, new: str, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    head = HEAD[cls]
    (tmp_path / "old.toml").write_text(f"{head}[{table}]\nscorer = {json.dumps(value)}\n")
    (tmp_path / "new.toml").write_text(f"{head}[{table}]\njudge = {json.dumps(value)}\n")
    (tmp_path / "plain.toml").write_text(head)
    with caplog.at_level(logging.WARNING, logger="lanpo.config"):
        from_file = load_toml(cls, tmp_path / "old.toml")
    assert len(_deprecations(caplog)) == 1
    caplog.clear()
    assert from_file == load_toml(cls, tmp_path / "new.toml")
    with caplog.at_level(logging.WARNING, logger="lanpo.config"):
        overridden = load_toml(cls, tmp_path / "plain.toml", [f"{old}={json.dumps(value)}"])
    (line,) = _deprecations(caplog)
    assert old in line and new in line
    assert overridden == load_toml(cls, tmp_path / "plain.toml", [f"{new}={json.dumps(value)}"]) == from_file
    # an old-name override lands over the file's new-name key
    assert load_toml(cls, tmp_path / "new.toml", [f"{old}='policy'"]) == load_toml(
        cls, tmp_path / "plain.toml", [f"{new}='policy'"]
    )


@pytest.mark.parametrize(("cls", "table", "old", "new", "value"), KEYS, ids=IDS)
def test_the_old_and_the_new_name_together_are_refused(
    tmp_path: Path, cls: type, table: str, old: str, new: str, value: str
) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(cls, {**REQUIRED[cls], table: {"scorer": value, "judge": value}})
    assert old in info.value.message and new in info.value.message
    assert info.value.hint == f"keep {new} and remove {old}"
    with pytest.raises(ConfigError) as info:
        apply_overrides({}, [f"{old}={json.dumps(value)}", f"{new}={json.dumps(value)}"], cls)
    assert old in info.value.message and info.value.hint == f"set {new} once"
    head = HEAD[cls]
    (tmp_path / "both.toml").write_text(f"{head}[{table}]\nscorer = 'a'\njudge = 'b'\n")
    with pytest.raises(ConfigError) as info:
        load_toml(cls, tmp_path / "both.toml")
    assert str(tmp_path / "both.toml") in info.value.message and info.value.hint


def test_the_shipped_files_spell_judge() -> None:
    assert load_toml(EvalConfig, CONFIGS / "eval-demo-cpu.toml").retrieval.judge == "policy"
    assert load_toml(EvalConfig, CONFIGS / "eval-paper.toml").retrieval.judge == "Qwen/Qwen2.5-Math-7B-Instruct"
    assert load_toml(ExperimentConfig, EXPERIMENTS / "grpo-vs-lanpo.toml").relevance.judge == "smollm2"
    for path in [*CONFIGS.glob("eval-*.toml"), *EXPERIMENTS.glob("*.toml")]:
        for line in path.read_text().splitlines():
            assert not line.strip().startswith("scorer"), f"{path}: {line}"
    text = keys_text(EvalConfig)
    assert "retrieval.judge = 'policy'" in text and "retrieval.scorer" not in text
    assert "relevance.judge = 'smollm2'" in keys_text(ExperimentConfig)


def test_a_stored_identity_with_relevance_scorer_is_the_same_experiment(caplog: pytest.LogCaptureFixture) -> None:
    base = load_toml(TrainConfig, CONFIGS / "learn-cpu.toml")
    exp = ExperimentConfig(name="exp", recipe="learn-cpu.toml", relevance=RelevanceStep(judge="tiny-random", top_k=4))
    today = identity(exp, base)
    stored = json.loads(json.dumps(today))  # as the store holds it (JSON)
    stored["relevance"] = {"scorer" if k == "judge" else k: v for k, v in stored["relevance"].items()}
    assert stored["relevance"]["scorer"] == "tiny-random" and "judge" not in stored["relevance"]
    assert stored != json.loads(json.dumps(today))
    with caplog.at_level(logging.WARNING, logger="lanpo.config"):
        upgraded = upgrade_identity(stored, exp)
    assert json.loads(json.dumps(upgraded)) == json.loads(json.dumps(today))
    assert _deprecations(caplog) == []  # a stored identity is not the user's to rewrite: no warning for it


@pytest.mark.parametrize("flag", ["--judge", "--scorer"])
def test_infer_takes_judge_and_the_old_scorer_flag(flag: str) -> None:
    args = ["--model", "m", "--mode", "retrieval", "--input", "q.jsonl", "--out", "a.jsonl", flag, "my-judge"]
    params = infer.command.make_context("infer", args).params  # parsed, not run
    assert params["judge"] == "my-judge" and "scorer" not in params
    option = next(p for p in infer.command.params if p.name == "judge")
    assert option.opts == ["--judge", "--scorer"] and "--scorer: the old spelling" in (option.help or "")
    assert option.default == RetrievalSettings().judge == "policy"
