"""The simulated policy (`rollout.backend = "sim"`): its table is what it claims (shares, difficulties, effects), its
answers are graded by the real grader at the table's chance, its lessons pass the real admission, and a run of
lanpo's trainer with it writes lessons whose tags its later prompts carry."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.errors import ConfigError
from lanpo.feedback.config import FeedbackConfig, InterConfig, SummarizerConfig
from lanpo.feedback.summarize import check_summary
from lanpo.models.tiny import tiny_tokenizer
from lanpo.prompts import summary_messages
from lanpo.rewards import correctness_reward
from lanpo.rollout import SamplingParams
from lanpo.rollout.sim import SimBackend, SimTable, tags_in
from lanpo.train.config import RolloutConfig, WorkersConfig
from lanpo.train.loop import train
from tests.train.conftest import tiny_config

QUESTIONS = {f"What is {i} + {i + 10}?": str(2 * i + 10) for i in range(40)}


def test_the_table_has_its_shares_and_bounds() -> None:
    table = SimTable(seed=3)
    effects = [table.effect_of(f"tag{i}") for i in range(4000)]
    assert effects.count(0.3) / 4000 == pytest.approx(0.2, abs=0.02)
    assert effects.count(-0.3) / 4000 == pytest.approx(0.2, abs=0.02)
    assert set(effects) == {0.3, -0.3, 0.0}
    bases = [table.base(q) for q in QUESTIONS]
    assert min(bases) >= 0.2 and max(bases) <= 0.8 and max(bases) - min(bases) > 0.3  # difficulty varies
    q = next(iter(QUESTIONS))
    helping = [f"tag{i}" for i in range(200) if table.effect_of(f"tag{i}") > 0][:5]
    assert table.p_correct(q, helping) == 0.98  # clipped: never certain
    assert SimTable(seed=3, helps=0.0, hurts=0.0).effect_of("x") == 0


@pytest.mark.parametrize(
    ("field", "value"), [("helps", 1.5), ("hurts", -0.1), ("effect", 2.0), ("base_low", 0.9), ("helps", 0.9)]
)
def test_a_table_out_of_range_is_refused(field: str, value: float) -> None:
    kwargs = {field: value, **({"hurts": 0.2} if field == "helps" else {})}
    with pytest.raises(ConfigError):
        SimTable(**kwargs)


def test_answers_are_graded_by_the_real_grader_at_the_tables_chance() -> None:
    table = SimTable(seed=1)
    backend = SimBackend(None, tiny_tokenizer(), table, QUESTIONS)
    hurting = next(f"abcdefg{c}" for c in "abcdefghijklmnopqrstuvwxyz" if table.effect_of(f"abcdefg{c}") < 0)
    for tags in ([], [hurting]):
        prompts = [f"Lessons: {' '.join(f'[lesson {t}]' for t in tags)}\nQuestion: {q}" for q in QUESTIONS]
        groups = backend.generate(prompts, 12, SamplingParams(max_new_tokens=200, seed=7))
        total = 0.0
        for q, group in zip(QUESTIONS, groups, strict=True):
            rewards = correctness_reward([c.text for c in group], answer=QUESTIONS[q])
            assert all(c.finish_reason == "stop" for c in group)
            assert sum(rewards) / len(rewards) == pytest.approx(table.p_correct(q, tags), abs=0.45)
            total += sum(rewards)
        expected = sum(table.p_correct(q, tags) * 12 for q in QUESTIONS)
        assert total == pytest.approx(expected, rel=0.12)  # 480 draws: the table's chance, within noise
    again = backend.generate(prompts[:2], 3, SamplingParams(max_new_tokens=200, seed=7))
    assert [c.text for c in again[0]] == [c.text for c in groups[0][:3]]  # seeded: the same answers


def test_its_lessons_pass_admission_and_carry_a_tag() -> None:
    backend = SimBackend(None, tiny_tokenizer(), SimTable(), QUESTIONS)
    q, a = next(iter(QUESTIONS.items()))
    prompt = "\n".join(m["content"] for m in summary_messages(q, f"so \\boxed{{{a}}}"))
    lessons = [c.text for c in backend.generate([prompt], 6, SamplingParams(max_new_tokens=400, seed=0))[0]]
    assert len({tuple(tags_in(t)) for t in lessons}) == 6  # a fresh tag each
    for text in lessons:
        summary = check_summary(text, True, q, a)
        assert summary.rejected is None, (summary.rejected, text)
    with pytest.raises(Exception, match="no gold answer"):
        backend.generate(["What is the capital of France?"], 1, SamplingParams(seed=0))


def test_a_sim_run_with_rollout_workers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sim"):
        tiny_config(tmp_path, rollout=RolloutConfig(backend="sim", n=2), workers=WorkersConfig(count=1))


def test_lanpos_trainer_with_the_sim_writes_tagged_lessons_and_draws_them(
    db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    feedback = FeedbackConfig(mode="inter", p_t=0.5, k=2, candidates=4, inter=InterConfig(gamma=0.5, scorer="test"))
    cfg = tiny_config(
        tmp_path,
        run_name="sim",
        steps=4,
        batch_size=6,
        feedback=feedback,
        rollout=RolloutConfig(backend="sim", n=4, max_new_tokens=200),
        summarizer=SummarizerConfig(min_reward=1.0, max_new_tokens=400, max_new_per_step=1),
    )
    train(cfg, db=db, progress=False)
    with db.connect() as conn:
        lessons = conn.execute(sa.text("SELECT summary FROM experience_versions")).scalars().all()
        prompts = (
            conn.execute(
                sa.text("SELECT g.prompt FROM rollout_groups g JOIN runs r ON r.id = g.run_id WHERE g.mode = 'inter'")
            )
            .scalars()
            .all()
        )
        rewards = conn.execute(sa.text("SELECT reward FROM attempts")).scalars().all()
    assert lessons and all(len(tags_in(t)) == 1 for t in lessons)  # admitted with the format required
    assert prompts and all(tags_in(p) for p in prompts)
    assert 0 < sum(r > 0 for r in rewards) < len(rewards)  # graded: some right, some wrong
