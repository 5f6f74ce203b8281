"""What the store must hold after an asynchronous verl run (docs/verl.md, "Asynchronous training"), read the same
way after the verl lane's run on its module's server (test_rollout.py) and the full lane's killed and resumed run
(test_async.py): the example's colocate_async settings, one warmup batch ahead and `max_off_policy_threshold = 1`."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

FATES = (
    "SELECT consumed_step, coalesce(dropped, 'trained') AS fate, count(*) AS n, count(DISTINCT trainer_uid) AS uids, "
    "max(step) AS newest, min(step) AS oldest "
    "FROM rollout_groups WHERE run_id = :r AND consumed_step IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2"
)
WEIGHTS = (
    "SELECT g.consumed_step, g.dropped, f.step AS first, l.step AS last, v.step AS drawn "
    "FROM rollout_groups g JOIN attempts a ON a.group_id = g.id JOIN policy_versions v ON v.id = g.policy_version_id "
    "LEFT JOIN policy_versions f ON f.id = a.first_policy_version_id "
    "LEFT JOIN policy_versions l ON l.id = a.last_policy_version_id WHERE g.run_id = :r"
)


def check_async_run(db: Engine, name: str, steps: int, batch: int) -> None:
    """Every group a step trained is in the store once, at that step, dispatched then or before; what a step left
    is dropped as stale at a later one; each step commits once with its checkpoint and its count of trained groups;
    each response names weights no newer than the step before the one that trained it."""
    with db.connect() as conn:
        run = conn.scalar(sa.text("SELECT id FROM runs WHERE name = :n"), {"n": name})
        fates = conn.execute(sa.text(FATES), {"r": run}).all()
        weights = conn.execute(sa.text(WEIGHTS), {"r": run}).all()
        committed = conn.execute(
            sa.text("SELECT step, checkpoint FROM run_steps WHERE run_id = :r ORDER BY step"), {"r": run}
        ).all()
        unnamed = conn.scalar(
            sa.text("SELECT count(*) FROM rollout_groups WHERE run_id = :r AND trainer_uid IS NULL"), {"r": run}
        )
        trained_metric = dict(
            conn.execute(
                sa.text("SELECT step, value FROM run_metrics WHERE run_id = :r AND name = 'lanpo/trained_groups'"),
                {"r": run},
            ).all()
        )
    every = list(range(1, steps + 1))
    trained = {f.consumed_step: f for f in fates if f.fate == "trained"}
    assert sorted(trained) == every
    for step, f in trained.items():
        assert f.n == f.uids == batch  # one row a group, each group once
        assert f.newest <= step  # dispatched at the step that trained it, or before
    dropped = [f for f in fates if f.fate != "trained"]
    assert dropped and {f.fate for f in dropped} == {"stale"}  # the groups a step left, a step later
    assert all(f.oldest < f.consumed_step for f in dropped)
    assert [(s.step, Path(s.checkpoint).name) for s in committed] == [(s, f"global_step_{s}") for s in every]
    assert unnamed == 0 and trained_metric == dict.fromkeys(every, batch)
    assert weights and all(w.first is not None and w.last is not None for w in weights)
    for w in weights:
        assert w.drawn <= w.first <= w.last  # drawn under some weights, generated under those or newer
        if w.consumed_step is not None and w.dropped is None:
            assert w.last < w.consumed_step  # a step trains on what the weights before it generated
