"""The Fig. 2 arms end to end on the tiny model: each experiment arm's overrides train two steps and write groups of
the mode and template its prompts were built in. leaked-intra's groups are `leaked_intra` with the leaked template
from step 1 on (the gold answer needs no history); naive-inter's are `inter` with the raw template once the run has a
correct attempt of another problem (random) or a lesson of a relevant one (similar). The tiny random model is never
correct, so here every rollout is graded correct (the grader is not what these tests are about)."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo import prompts
from lanpo.db.repo.contexts import InterAttemptItem, InterItem, IntraItem
from lanpo.experiment import DEFAULT_ARMS, ExperimentConfig, arm_config
from lanpo.feedback.contexts import StepPrompts
from lanpo.rewards import Graded
from lanpo.train.loop import train
from lanpo.train.producer.produce import prompts_from_json, prompts_to_json
from tests.train.conftest import tiny_config

EXPECTED = {  # arm -> (mode, template version) of its context groups
    "leaked-intra": ("leaked_intra", prompts.LEAKED_VERSION),
    "naive-inter-random": ("inter", prompts.INTER_RAW_VERSION),
    "naive-inter-similar": ("inter", prompts.INTER_RAW_VERSION),
}


def _all_correct(texts: list[str], answers: object, modes: object, format_rule: str = "paper") -> list[Graded]:
    return [Graded(1.0, True, False) for _ in texts]


@pytest.mark.parametrize("arm", sorted(EXPECTED))
def test_each_fig2_arm_trains_and_marks_its_groups(
    db: Engine, toy_problems: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arm: str
) -> None:
    monkeypatch.setattr("lanpo.train.producer.produce.grade", _all_correct)
    base = tiny_config(tmp_path, steps=2)
    cfg = arm_config(base, DEFAULT_ARMS[arm], arm, 0, ExperimentConfig(name="fig2", recipe="tiny", arms=[arm]))
    assert cfg.feedback.p_t == 1.0 and cfg.feedback.inter.scorer == "test"  # tiny_config's, kept by the arm
    cfg = replace(cfg, output_dir=str(tmp_path / "ckpt"), experiment=None)  # the arm's run, outside an experiment
    run = train(cfg, db=db, progress=False).run_id
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT g.step, g.mode, g.prompt_version, g.prompt, p.answer FROM rollout_groups g "
                "JOIN problems p ON p.id = g.problem_id WHERE g.run_id = :r ORDER BY g.step"
            ),
            {"r": run},
        ).all()
        config = conn.execute(sa.text("SELECT config FROM runs WHERE id = :r"), {"r": run}).scalar_one()
    assert config["arm"] == arm  # the run's config names its arm and its settings
    for key, value in DEFAULT_ARMS[arm].items():
        assert functools.reduce(lambda table, part: table[part], key.split("."), config) == value, key
    mode, version = EXPECTED[arm]
    context = [r for r in rows if r.mode == mode]
    assert context and all(r.prompt_version == version for r in context), rows
    assert {r.mode for r in rows} <= {"zero_shot", mode}
    if arm == "leaked-intra":
        assert {r.step for r in context} == {1, 2} and len(context) == len(rows)  # every prompt, from step 1 on
        assert all(f"The answer to this problem is {r.answer}." in r.prompt for r in rows)
    else:
        assert {r.step for r in context} == {2}  # step 1 had nothing to show yet


def test_a_random_arm_item_survives_the_rollout_queue() -> None:
    """A worker gets a step's prompts as JSON: an inter item that is an attempt (Fig. 2c's random arm) comes back as
    one, so its group_contexts row names the attempt."""
    items = [[InterAttemptItem(7, 3, "raw response")], [IntraItem(8, "earlier")], [InterItem(9, 4, "lesson", 0.9)]]
    sent = StepPrompts([1, 2, 3], ["q"] * 3, ["1"] * 3, ["inter", "intra", "inter"], ["inter", "intra", "inter"],
                       ["t"] * 3, items, 5, k=1, drawn=[1] * 3, truncated=[0] * 3)  # fmt: skip
    back = prompts_from_json(json.loads(json.dumps(prompts_to_json(sent))), sent.answers)
    assert back.items == items and back.items[0][0].ref(0).context_attempt_id == 7
