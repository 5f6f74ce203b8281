"""StoreClient's checks: a step's prompts need the policy version that generates them, and the error says how to
record it; a config's feedback that reads relevance is refused before any model loads when the store has none."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine

from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.errors import ConfigError, InputError
from lanpo.feedback import DataConfig, FeedbackConfig, StepPrompts, StoreClient, StoreRunConfig
from lanpo.rollout import Completion


def _config(mode: str) -> StoreRunConfig:
    return StoreRunConfig(run_name="api", data=DataConfig(dataset="api-toy"), feedback=FeedbackConfig(mode=mode))


def test_prompts_without_a_policy_version_say_how_to_record_one(db: Engine) -> None:
    with transaction(db) as session:
        upsert_problems(session, "api-toy", [Question(external_id="1", question="1 + 1?", answer="2")])
    client = StoreClient(_config("intra"), db)
    run = client.start("tiny-random")
    with pytest.raises(InputError, match="no policy version for step 0") as raised:
        client.prompts(run, 1, client.problem_ids, tokenizer=None)
    assert "policy_sha256" in str(raised.value.hint)


def test_inter_feedback_without_relevance_is_refused_before_a_run(db: Engine) -> None:
    with transaction(db) as session:
        upsert_problems(session, "api-toy", [Question(external_id="1", question="1 + 1?", answer="2")])
    with pytest.raises(ConfigError, match="relevance_scores holds no score"):
        StoreClient(_config("inter"), db)


def test_grade_takes_your_rewards_one_per_rollout_and_refuses_a_count_that_differs(db: Engine) -> None:
    with transaction(db) as session:
        upsert_problems(session, "api-toy", [Question(external_id="1", question="1 + 1?", answer="2")])
    client = StoreClient(_config("none"), db)
    prompts = StepPrompts(
        client.problem_ids, ["1 + 1?"], ["2"], ["zero_shot"], ["zero_shot"], ["1 + 1?"], [[]], policy_version_id=0
    )
    group = [Completion(text, (1,), (2,), "stop") for text in (r"\boxed{2}", r"\boxed{3}")]
    graded = client.grade(prompts, [group], [0.25, float("nan")])
    assert [(g.reward, g.correct) for g in graded] == [(0.25, True), (0.0, False)]  # yours, lanpo's correctness
    with pytest.raises(InputError, match="1 rewards for 2 rollouts") as raised:
        client.grade(prompts, [group], [1.0])
    assert "one reward per rollout" in str(raised.value.hint)
