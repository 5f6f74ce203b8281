"""Fig. 2b's leaked-intra arm, by name: its prompts always carry their problem's gold answer (with earlier attempts
or without), and the prompts of every other feedback setting (each inter variant included: lessons, raw responses,
gamma 0, Fig. 2c's random draw) never carry any gold answer. Built through the store client, as a trainer builds
its prompts, over several steps' draws."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine

from lanpo import feedback_modes, prompts
from lanpo.db.connection import transaction
from lanpo.db.repo.attempts import NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.feedback import DataConfig, FeedbackConfig, StoreClient, StoreRunConfig
from lanpo.feedback.config import InterConfig
from lanpo.feedback_modes import LEAKED_MODE
from lanpo.models import tiny_tokenizer

GOLDS = ["7340219", "8812907", "6650431", "9127355"]  # distinctive: no stored text or template holds them
INTERS = {
    "lesson": InterConfig(gamma=0.5, scorer="fig2"),
    "response": InterConfig(gamma=0.5, scorer="fig2", shows="response"),
    "gamma0": InterConfig(gamma=0.0, shows="response"),
    "random": InterConfig(draw="random", shows="response"),
}
SETTINGS = [
    (setting, inter)
    for setting in feedback_modes.FEEDBACK_SETTINGS
    for inter in INTERS
    if feedback_modes.asks_inter(setting) or inter == "lesson"
]


def _client(db: Engine, setting: str, inter: str) -> tuple[StoreClient, object]:
    """Four problems, all relevant to each other; the run's history on the first three (correct and wrong attempts
    in every training mode, texts without a gold) and a lesson of each, sourced from a correct attempt."""
    with transaction(db) as session:
        upsert_problems(session, "fig2", [Question(str(i), f"Find value number {i}.", g) for i, g in enumerate(GOLDS)])
        session.connection().exec_driver_sql(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) "
            "SELECT a.id, b.id, 'fig2', 1.0 FROM problems a JOIN problems b ON a.id <> b.id"
        )
    fb = FeedbackConfig(mode=setting, p_t=1.0, k=2, candidates=4, inter=INTERS[inter])
    client = StoreClient(
        StoreRunConfig(run_name=f"fig2-{setting}-{inter}", data=DataConfig(dataset="fig2"), feedback=fb), db
    )
    run = client.start("tiny-random")
    with transaction(db) as session:
        groups = [
            NewGroup(p, mode, "q", [NewAttempt(f"try {mode} {j} on {i}", float(j), j == 1) for j in range(2)],
                     step=0, run_id=run.run_id)
            for i, p in enumerate(client.problem_ids[:3]) for mode in ("zero_shot", "intra", "inter")
        ]  # fmt: skip
        ids = record_groups(session, groups)
        lessons = [NewExperience(g.problem_id, f"lesson {n}", reward=1.0, source_attempt_id=a[1])
                   for n, (g, a) in enumerate(zip(groups, ids, strict=True))]  # fmt: skip
        add_experiences(session, run.pool, lessons)
    return client, run


@pytest.mark.parametrize(("setting", "inter"), SETTINGS)
def test_only_leaked_intra_prompts_carry_a_gold_answer(db: Engine, setting: str, inter: str) -> None:
    client, run = _client(db, setting, inter)
    tokenizer = tiny_tokenizer(large_vocab=True)
    gold_of = dict(zip(client.problem_ids, GOLDS, strict=True))
    served = set()
    for step in (1, 2, 3):
        step_prompts = client.prompts(run, step, client.problem_ids, tokenizer, policy_sha256=f"{step:064x}")
        rows = zip(step_prompts.problem_ids, step_prompts.modes, step_prompts.texts, strict=True)
        for g, (pid, mode, text) in enumerate(rows):
            shown = [gold for gold in GOLDS if gold in text]
            if mode == LEAKED_MODE:  # always its own answer, and no other; marked by its template version
                assert shown == [gold_of[pid]], text
                assert step_prompts.version(g) == prompts.LEAKED_VERSION and "leaked" in prompts.LEAKED_VERSION
            else:
                assert shown == [], (setting, inter, mode, text)
            served.add(mode)
    expected = {"none": {"zero_shot"}, "leaked-intra": {LEAKED_MODE}}.get(setting)
    if expected is not None:  # leaked-intra: every prompt, the problem without history included
        assert served == expected
    else:
        assert served & set(feedback_modes.SETTING_MODES[setting]), served  # a context was drawn
    assert (LEAKED_MODE in served) == (setting == "leaked-intra")
