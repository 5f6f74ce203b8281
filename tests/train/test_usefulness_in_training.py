"""Usefulness inside training, the path it exists for: lanpo's trainer draws each problem once a step, in one mode,
so no lesson use it writes has a same-step zero-shot group; every use whose run has graded zero-shot attempts in
its span gets an estimated baseline and a known outcome (docs/concepts.md, "Usefulness per version")."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.feedback.config import FeedbackConfig, InterConfig
from lanpo.train.loop import train
from tests.train.conftest import tiny_config


def test_lesson_uses_written_by_the_trainer_have_a_known_outcome(
    db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    feedback = FeedbackConfig(mode="inter", p_t=0.5, k=2, candidates=4, inter=InterConfig(gamma=0.5, scorer="test"))
    cfg = tiny_config(tmp_path, run_name="uses-known", steps=4, batch_size=6, feedback=feedback)
    train(cfg, db=db, progress=False)
    with db.connect() as conn:
        uses = conn.execute(
            sa.text(
                "SELECT g.step, lu.baseline_source, lu.outcome, lu.baseline, lu.baseline_n, "
                "  (SELECT count(*) FROM rollout_groups z WHERE z.run_id = g.run_id AND z.mode = 'zero_shot' "
                "   AND z.step < g.step AND z.step >= g.step - 8) AS zero_shot_in_span "
                "FROM lesson_uses lu JOIN rollout_groups g ON g.id = lu.group_id JOIN runs r ON r.id = g.run_id "
                "WHERE r.name = 'uses-known'"
            )
        ).all()
    assert uses, "the run drew no lesson: the test shows nothing"
    assert all(u.baseline_source != "exact" for u in uses)  # training never wrote a same-step baseline
    spanned = [u for u in uses if u.zero_shot_in_span]
    assert spanned, "no use had a zero-shot group in its span"
    for u in spanned:  # every one of them is known, against an estimate worth at least the prior's 2 attempts
        assert u.baseline_source == "estimated" and u.outcome is not None, u
        assert 0.0 <= u.baseline <= 1.0 and u.baseline_n >= 2.0, u
