"""The inter-only keys of [feedback] moved to [feedback.inter] (issue 24): the old flat names keep loading, as the
new ones, from a recipe, a `--set`, an experiment's arm table and a stored experiment identity, with one warning
line naming both; the old and the new name of one key together are refused."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from lanpo.config import apply_overrides, field_default, from_mapping, keys_text, load_toml, to_mapping
from lanpo.errors import ConfigError
from lanpo.experiment import ExperimentConfig, arm_config, identity, upgrade_identity
from lanpo.feedback.config import FeedbackConfig, InterConfig
from lanpo.train.config import TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "train" / "configs"

# (old flat [feedback] key, its value, the [feedback.inter] key it is read as, the value there)
PAIRS = [
    ("sources", ["summary", "meta"], "kinds", ["summary", "meta"]),
    ("sources", ["meta"], "kinds", ["meta"]),
    ("inter_source", "summary", "shows", "lesson"),
    ("inter_source", "raw", "shows", "response"),
    ("gamma", 0.3, "gamma", 0.3),
    ("gamma", 0.0, "gamma", 0.0),
    ("scorer", "judge|relevance-v2", "scorer", "judge|relevance-v2"),
    ("allow_empty_inter", True, "allow_empty", True),
]
IDS = [f"{old}={value}" for old, value, _, _ in PAIRS]


def _deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "lanpo.config" and "deprecated" in r.getMessage()]


@pytest.mark.parametrize(("old", "value", "new", "new_value"), PAIRS, ids=IDS)
def test_an_old_flat_key_loads_as_the_new_table(old: str, value: Any, new: str, new_value: Any) -> None:
    before = from_mapping(TrainConfig, {"feedback": {"mode": "inter", old: value}})
    today = from_mapping(TrainConfig, {"feedback": {"mode": "inter", "inter": {new: new_value}}})
    assert before == today
    assert getattr(today.feedback.inter, new) == new_value
    if new_value != field_default(InterConfig, new):  # the value was not lost on the way
        assert today != TrainConfig(feedback=FeedbackConfig(mode="inter"))


def test_every_old_key_at_once_loads_as_the_new_table() -> None:
    old = {"mode": "both", **{o: v for o, v, _, _ in PAIRS}}  # the last value of each old key: raw, 0.0, ...
    before = from_mapping(TrainConfig, {"feedback": old})
    assert before.feedback == FeedbackConfig(
        mode="both",
        inter=InterConfig(kinds=["meta"], shows="response", gamma=0.0, scorer="judge|relevance-v2", allow_empty=True),
    )


@pytest.mark.parametrize(("old", "value", "new", "new_value"), PAIRS, ids=IDS)
def test_an_old_key_in_a_recipe_and_on_the_command_line(
    tmp_path: Path, old: str, value: Any, new: str, new_value: Any
) -> None:
    text = json.dumps(value)  # JSON scalars and lists of strings are TOML values
    (tmp_path / "old.toml").write_text(f"[feedback]\nmode = 'inter'\n{old} = {text}\n")
    (tmp_path / "new.toml").write_text(
        f"[feedback]\nmode = 'inter'\n[feedback.inter]\n{new} = {json.dumps(new_value)}\n"
    )
    assert load_config(tmp_path / "old.toml") == load_config(tmp_path / "new.toml")
    # a --set with the old name lands on the new key, over what the recipe's [feedback.inter] says
    (tmp_path / "plain.toml").write_text("[feedback]\nmode = 'inter'\n[feedback.inter]\ngamma = 0.7\n")
    overridden = load_config(tmp_path / "plain.toml", [f"feedback.{old}={text}"])
    assert getattr(overridden.feedback.inter, new) == new_value
    assert overridden == load_config(tmp_path / "plain.toml", [f"feedback.inter.{new}={json.dumps(new_value)}"])


def test_an_old_key_overrides_a_shipped_recipe() -> None:
    """The shipped recipes use [feedback.inter]; `--set feedback.gamma=0` still works on them."""
    assert load_config(CONFIGS / "demo-cpu.toml").feedback.inter.gamma == 0.5
    assert load_config(CONFIGS / "demo-cpu.toml", ["feedback.gamma=0"]).feedback.inter.gamma == 0.0
    raw = load_config(CONFIGS / "lanpo-inter.toml", ["feedback.inter_source='raw'"])
    assert raw == load_config(CONFIGS / "table2" / "lanpo-inter-raw.toml", ["run_name='lanpo-inter'"])


def test_the_deprecation_is_one_line_naming_both_keys(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "old.toml").write_text("[feedback]\ngamma = 0.3\n")
    with caplog.at_level(logging.WARNING, logger="lanpo.config"):
        load_config(tmp_path / "old.toml")
    (line,) = _deprecations(caplog)
    assert "feedback.gamma" in line and "feedback.inter.gamma" in line and "\n" not in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lanpo.config"):
        load_config(CONFIGS / "demo-cpu.toml", ["feedback.inter_source='raw'"])
    (line,) = _deprecations(caplog)
    assert "feedback.inter_source = 'raw'" in line and "feedback.inter.shows = 'response'" in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lanpo.config"):
        load_config(CONFIGS / "demo-cpu.toml", ["feedback.inter.gamma=0.3"])  # today's names: no line
    assert _deprecations(caplog) == []


@pytest.mark.parametrize(("old", "value", "new", "new_value"), PAIRS, ids=IDS)
def test_the_old_and_the_new_name_together_are_refused(
    tmp_path: Path, old: str, value: Any, new: str, new_value: Any
) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(TrainConfig, {"feedback": {old: value, "inter": {new: new_value}}})
    assert f"feedback.{old}" in info.value.message and f"feedback.inter.{new}" in info.value.message
    assert info.value.hint == f"keep feedback.inter.{new} and remove feedback.{old}"
    with pytest.raises(ConfigError) as info:
        apply_overrides({}, [f"feedback.{old}={json.dumps(value)}", f"feedback.inter.{new}={json.dumps(new_value)}"],
                        TrainConfig)  # fmt: skip
    assert f"feedback.{old}" in info.value.message and info.value.hint == f"set feedback.inter.{new} once"
    (tmp_path / "both.toml").write_text(
        f"[feedback]\n{old} = {json.dumps(value)}\n[feedback.inter]\n{new} = {json.dumps(new_value)}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "both.toml")
    assert str(tmp_path / "both.toml") in info.value.message and info.value.hint


def test_a_variant_recipe_may_rename_what_its_base_spells_the_old_way(tmp_path: Path) -> None:
    (tmp_path / "base.toml").write_text("[feedback]\ngamma = 0.3\ninter_source = 'raw'\n")
    (tmp_path / "variant.toml").write_text("base = 'base.toml'\n[feedback.inter]\ngamma = 0.6\n")
    cfg = load_config(tmp_path / "variant.toml")
    assert (cfg.feedback.inter.gamma, cfg.feedback.inter.shows) == (0.6, "response")


def test_an_old_value_outside_the_old_choices_is_refused_with_the_new_spelling() -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(TrainConfig, {"feedback": {"inter_source": "lesson"}})
    assert info.value.message == "feedback.inter_source must be one of summary, raw, got 'lesson'"
    assert info.value.hint == (
        "feedback.inter_source is the old name of feedback.inter.shows: set feedback.inter.shows = lesson | response"
    )
    with pytest.raises(ConfigError, match=r"feedback\.inter\.gamma must be in \[0, 1\]"):
        from_mapping(TrainConfig, {"feedback": {"gamma": 1.5}})  # checked, by today's name, as the new key


def _flat_feedback(feedback: dict[str, Any]) -> dict[str, Any]:
    """`to_mapping(FeedbackConfig)` as it was before [feedback.inter]: the inter keys flat, under their old names."""
    inter = feedback["inter"]
    out = {k: v for k, v in feedback.items() if k != "inter"}
    out.update(
        gamma=inter["gamma"],
        inter_source={"lesson": "summary", "response": "raw"}[inter["shows"]],
        scorer=inter["scorer"],
        allow_empty_inter=inter["allow_empty"],
        sources=inter["kinds"],
    )
    return out


def test_an_experiment_stored_with_the_old_keys_is_the_same_experiment(caplog: pytest.LogCaptureFixture) -> None:
    base = load_toml(TrainConfig, CONFIGS / "learn-cpu.toml", ["feedback.inter.shows='response'"])
    exp = ExperimentConfig(name="exp", recipe="learn-cpu.toml", arm={"nofilter": {"feedback.inter.gamma": 0.0}})
    today = identity(exp, base)
    stored = json.loads(json.dumps(today))  # as the store holds it (JSON)
    stored["base"]["feedback"] = _flat_feedback(stored["base"]["feedback"])
    stored["arm"] = {"nofilter": {"feedback.gamma": 0.0}}  # an arm table written with the old name
    assert stored["base"]["feedback"]["inter_source"] == "raw" and "inter" not in stored["base"]["feedback"]
    assert stored != json.loads(json.dumps(today))
    with caplog.at_level(logging.WARNING, logger="lanpo.config"):
        upgraded = upgrade_identity(stored, exp)
    assert json.loads(json.dumps(upgraded)) == json.loads(json.dumps(today))
    assert _deprecations(caplog) == []  # a stored identity is not the user's to rewrite: no warning for it


def test_an_arm_table_with_an_old_key(caplog: pytest.LogCaptureFixture) -> None:
    base = load_toml(TrainConfig, CONFIGS / "learn-cpu.toml")
    with caplog.at_level(logging.WARNING, logger="lanpo.config"):
        exp = ExperimentConfig(name="e", recipe="r", arms=["raw"], arm={"raw": {"feedback.inter_source": "raw"}})
    (line,) = _deprecations(caplog)
    assert "feedback.inter_source" in line and "feedback.inter.shows" in line
    assert exp.arm == {"raw": {"feedback.inter.shows": "response"}}
    cfg = arm_config(base, exp.arm_overrides()["raw"], "raw", 0, exp)
    assert cfg.feedback.inter.shows == "response"
    # an arm table not yet normalised (built by hand) goes through the same path
    assert arm_config(base, {"feedback.gamma": 0.25}, "g", 0, exp).feedback.inter.gamma == 0.25
    with pytest.raises(ConfigError) as info:
        ExperimentConfig(name="e", recipe="r", arm={"x": {"feedback.gamma": 0.1, "feedback.inter.gamma": 0.2}})
    assert "feedback.inter.gamma" in info.value.message and info.value.hint


def test_the_keys_listing_shows_the_new_table() -> None:
    text = keys_text(TrainConfig)
    for key in ("kinds = ['summary']", "shows = 'lesson'", "gamma = 0.9", "scorer = unset", "allow_empty = False"):
        assert f"feedback.inter.{key}" in text
    for old in ("feedback.sources", "inter_source", "allow_empty_inter", "feedback.gamma", "feedback.scorer"):
        assert old not in text
    assert "RENAMED" not in text
    assert to_mapping(FeedbackConfig()).keys() == {"mode", "p_t", "k", "candidates", "inter", "intra"}


def test_train_keys_shows_the_new_table(run_cli) -> None:  # type: ignore[no-untyped-def]
    out = run_cli("train", "--keys")
    assert out.code == 0, out.err
    assert "feedback.inter.shows = 'lesson'" in out.out and "feedback.inter.kinds = ['summary']" in out.out
    assert "inter_source" not in out.out and "feedback.sources" not in out.out
