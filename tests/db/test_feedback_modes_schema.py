"""The modes of lanpo.feedback_modes and the migrated schema agree: every `mode` CHECK lists exactly its modes.

Adding a mode means an entry in lanpo.feedback_modes plus a migration that widens these CHECKs; this test fails
when one is done without the other.
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo import feedback_modes
from lanpo.db import models
from lanpo.feedback.contexts import StepPrompts
from lanpo.feedback.draw import SAMPLERS
from lanpo.feedback.record import GroupRecord, RolloutRecord, rollout_metrics

MODE_CHECKS = """
SELECT c.conrelid::regclass::text AS table_name, c.conname, pg_get_constraintdef(c.oid) AS definition
FROM pg_constraint c
JOIN pg_namespace n ON n.oid = c.connamespace
WHERE c.contype = 'c' AND n.nspname = current_schema() AND pg_get_constraintdef(c.oid) ~ '\\mmode\\M'
ORDER BY 1, 2
"""


def test_every_mode_check_lists_exactly_the_modules_modes(migrated_db: Engine) -> None:
    with migrated_db.connect() as conn:
        checks = conn.execute(sa.text(MODE_CHECKS)).all()
    tables = {c.table_name for c in checks}
    assert "rollout_groups" in tables, checks  # a group holds the mode its attempts were made in
    for check in checks:
        listed = re.findall(r"'([^']+)'", check.definition)
        assert sorted(listed) == sorted(feedback_modes.ATTEMPT_MODES), (check.table_name, check.conname)
    # the models keep their own copy of the table's tuple
    assert sorted(models.ATTEMPT_MODES) == sorted(feedback_modes.ATTEMPT_MODES)


def test_each_meaning_has_its_own_tuple() -> None:
    assert set(feedback_modes.CONTEXT_MODES) < set(feedback_modes.PROMPT_MODES) < set(feedback_modes.ATTEMPT_MODES)
    assert "zero_shot" in feedback_modes.PROMPT_MODES and "zero_shot" not in feedback_modes.CONTEXT_MODES
    for setting, asks in feedback_modes.SETTING_MODES.items():
        assert set(asks) <= set(feedback_modes.CONTEXT_MODES), setting
    for name in feedback_modes.CONTEXT_MODES:  # a context mode draws from the store and reads one field of an item
        mode = feedback_modes.MODES[name]
        assert mode.drawn and name in SAMPLERS and mode.context_field is not None and mode.headers, name


def test_declared_metrics_are_the_ones_a_step_writes() -> None:
    rollout = RolloutRecord("r", 1.0, True, True, 10, False)
    groups = [GroupRecord(1, name, "p", 4, [], [rollout]) for name in feedback_modes.PROMPT_MODES]
    written = set(rollout_metrics(groups))
    n = len(feedback_modes.PROMPT_MODES)
    prompts = StepPrompts(
        list(range(n)), ["q"] * n, ["1"] * n, list(feedback_modes.PROMPT_MODES), list(feedback_modes.PROMPT_MODES),
        ["t"] * n, [[object()] for _ in range(n)], 1, k=1, drawn=[1] * n, truncated=[0] * n,
    )  # fmt: skip
    written |= set(prompts.feedback_metrics(4))
    for name in feedback_modes.PROMPT_MODES:
        declared = set(feedback_modes.MODES[name].metrics)
        by_mode = {m for m in written if m.endswith(f"/{name}")}
        assert declared == by_mode, name
