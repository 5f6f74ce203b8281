"""Every way of reusing experience as an arm of one `lanpo experiment` on the tiny model: GRPO, the replay arms
(RLEP, ExGRPO, RePO) and the paper's Fig. 2 arms train on one start, the same problems and seeds, and the report's
table has a row for each; replays are stored as replays only in the replay arms, the gold answer only in the
leaked-intra arm's prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.train.test_experiment import experiment_file, tiny_dir  # noqa: F401 (a fixture, used by name)
from tests.train.test_replay import _alternating

ARMS = ["grpo", "rlep", "exgrpo", "repo", "leaked-intra", "naive-inter-random"]
REPLAYING = {"rlep", "exgrpo", "repo"}


def test_every_reuse_arm_trains_and_has_its_row(
    run_cli,
    db: Engine,
    toy_problems: list[int],
    tmp_path: Path,
    tiny_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("lanpo.train.producer.produce.grade", _alternating)  # successes to replay and to reuse
    config = experiment_file(db, tmp_path, tiny_dir, "reuse")
    text = config.read_text().replace('arms = ["grpo", "lanpo-both"]', f"arms = {ARMS!r}".replace("'", '"'))
    config.write_text(text.replace("seeds = [0, 1]", "seeds = [0]"))
    done = run_cli("experiment", "--config", config, "--jobs", "1", "--set", "batch_size=6")  # every problem a step
    assert done.code == 0, done.err
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT r.arm, r.status, count(*) FILTER (WHERE g.mode = 'replayed'), "
                "count(*) FILTER (WHERE g.mode = 'leaked_intra'), "
                "count(*) FILTER (WHERE position('The answer to this problem is ' || p.answer IN g.prompt) > 0) "
                "FROM runs r JOIN rollout_groups g ON g.run_id = r.id JOIN problems p ON p.id = g.problem_id "
                "WHERE r.name LIKE 'reuse-%' AND g.mode <> 'val' GROUP BY r.arm, r.status"
            )
        ).all()
    by_arm = {arm: tuple(rest) for arm, *rest in rows}  # status, replayed, leaked, gold elsewhere
    assert set(by_arm) == set(ARMS) and {v[0] for v in by_arm.values()} == {"finished"}
    assert {arm for arm, v in by_arm.items() if v[1]} == REPLAYING
    assert {arm for arm, v in by_arm.items() if v[2]} == {"leaked-intra"}
    assert {arm: v[3] for arm, v in by_arm.items() if v[3]} == {"leaked-intra": by_arm["leaked-intra"][2]}
    report = (tmp_path / "reuse" / "report" / "report.md").read_text()
    for arm in ARMS:
        assert f"| {arm}" in report, arm
    assert "trained tokens" in report and "Recorded but in no figure" not in report
    assert (tmp_path / "reuse" / "report" / "replay.png").is_file()
