"""MEL through the whole loop, on the tiny model with a scripted policy (tests/mel/conftest.py) and the real store:
every pair of every mixed group is diagnosed, its lesson replayed and judged, the validated ones trained on and
pooled, the rejected ones kept in history; the provenance rows are complete; no lesson leaks a number into a
replay or inter prompt; and the NLL term moves the weights."""

from __future__ import annotations

import math
import re
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.feedback.config import FeedbackConfig, InterConfig
from lanpo.mel.config import MELConfig
from lanpo.train.loop import train
from tests.mel.conftest import MelScript
from tests.train.conftest import tiny_config


def _config(tmp_path: Path, **overrides: object):
    values: dict[str, object] = {
        "run_name": "mel",
        "steps": 2,
        "method": "mel",
        "feedback": FeedbackConfig(mode="none", p_t=0.0),
        "mel": MELConfig(pairs_per_problem=1, replays=2, diagnosis_max_new_tokens=64, nll_target="lesson"),
    }
    values.update(overrides)
    return tiny_config(tmp_path, **values)


def _rows(db: Engine, sql: str, **params: object) -> list[tuple]:
    with db.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def test_mel_steps_write_complete_provenance(
    db: Engine, toy_problems: list[int], tmp_path: Path, scripted: list[MelScript]
) -> None:
    result = train(_config(tmp_path), db=db, progress=False)
    run = result.run_id
    even = dict(_rows(db, "SELECT id, (CAST(external_id AS int) % 2 = 0) FROM problems WHERE dataset = 'toy'"))
    # MEL's replays on the cost axis: what their stored attempts generated and read (a prompt once per replay)
    replays = _rows(
        db,
        "SELECT g.step, sum(a.completion_tokens), sum(g.prompt_tokens) FROM attempts a JOIN rollout_groups g "
        "ON g.id = a.group_id WHERE g.run_id = :r AND g.mode = 'replay' GROUP BY g.step ORDER BY g.step",
        r=result.run_id,
    )
    assert [(s, float(c), float(p)) for s, c, p in replays] == [
        (step, m["cost/generated_tokens/mel_replay"], m["cost/prompt_tokens/mel_replay"])
        for step, m in enumerate(result.metrics, start=1)
    ]
    for m in result.metrics:
        assert (m["mel/groups/qualifying"], m["mel/pairs"], m["mel/candidates"]) == (3.0, 3.0, 3.0)
        assert m["mel/validated"] + m["mel/rejected"] == 3.0 and m["mel/yield"] == m["mel/validated"] / 3
        assert m["mel/bifurcation/by_model"] == 1.0 and m["mel/diagnosis/format"] == 1.0
        assert m["mel/nll_coef"] == 0.1 and m["time/mel"] >= 0
        # what MEL generated is on the cost axis: its diagnoses, and its replays as stored (attempts of mode replay)
        assert m["cost/generated_tokens/mel_diagnosis"] > 0 and m["cost/prompt_tokens/mel_diagnosis"] > 0
        parts = ("rollout", "summary", "mel_diagnosis", "mel_replay")
        assert m["cost/generated_tokens"] == sum(m[f"cost/generated_tokens/{x}"] for x in parts)
        if m["mel/validated"]:
            assert m["mel/nll_tokens"] > 0 and math.isfinite(m["mel/nll"]) and m["mel/nll"] > 0
    # rollouts keep their behaviour log-probs (TIS, replay); diagnoses and replays are read as text and tokens only
    asked = scripted[-1].asked_logprobs
    assert (asked["rollout"], asked["diagnosis"], asked["replay"]) == ({True}, {False}, {False})

    pairs = _rows(
        db,
        "SELECT mp.step, mp.problem_id, pos.correct, neg.correct, pos.group_id = neg.group_id, g.step, g.problem_id, "
        "mp.bifurcation_step, mp.shared_prefix_steps, mp.located_by, mp.group_success_rate, mp.verdict, "
        "mp.validation_rule, mp.replay_success_rate, e.kind, e.evicted_by, rg.mode, gc.experience_version_id = "
        "(SELECT v.id FROM experience_versions v WHERE v.experience_id = e.id), "
        "(SELECT count(*) FROM attempts r WHERE r.group_id = rg.id), v.summary, mp.diagnosis "
        "FROM meta_pairs mp JOIN attempts pos ON pos.id = mp.positive_attempt_id "
        "JOIN attempts neg ON neg.id = mp.negative_attempt_id JOIN rollout_groups g ON g.id = pos.group_id "
        "JOIN experiences e ON e.id = mp.experience_id JOIN experience_versions v ON v.experience_id = e.id "
        "JOIN rollout_groups rg ON rg.id = mp.replay_group_id JOIN group_contexts gc ON gc.group_id = rg.id "
        "WHERE mp.run_id = :r ORDER BY mp.id",
        r=run,
    )
    assert len(pairs) == 6  # 2 steps x 3 problems, one pair each
    for (
        step,
        pid,
        pos_ok,
        neg_ok,
        same_group,
        g_step,
        g_pid,
        bif,
        shared,
        by,
        rate,
        verdict,
        rule,
        replay_rate,
        kind,
        evicted_by,
        mode,
        names_version,
        replays,
        lesson,
        diagnosis,
    ) in pairs:
        assert pos_ok and not neg_ok and same_group and (g_step, g_pid) == (step, pid)
        assert (bif, shared, by, rate, rule, kind, mode, names_version, replays) == (
            2,
            1,
            "model",
            0.5,
            "beats_group",
            "meta",
            "replay",
            True,
            2,
        )
        assert verdict == ("validated" if even[pid] else "rejected")
        assert replay_rate == (1.0 if even[pid] else 0.0)
        assert evicted_by == (None if even[pid] else "mel:rejected")
        assert lesson.startswith("## Mistake") and not re.search(r"\d", lesson)
        assert "Step 2" in diagnosis  # the raw diagnosis is kept as the model wrote it

    # every attempt, rollout or replay, names the adapter that served it: the policy of its step
    served = _rows(
        db,
        "SELECT g.mode, a.served_adapter_sha256 FROM attempts a JOIN rollout_groups g ON g.id = a.group_id "
        "WHERE g.run_id = :r",
        r=run,
    )
    assert {mode for mode, _ in served} >= {"replay"} and all(sha and len(sha) == 64 for _, sha in served)

    uses = _rows(
        db,
        "SELECT u.step, u.target, u.attempt_id, u.tokens, length(v.summary) FROM meta_nll_uses u "
        "JOIN experience_versions v ON v.experience_id = u.experience_id WHERE u.run_id = :r",
        r=run,
    )
    assert len(uses) == sum(m["mel/validated"] for m in result.metrics) > 0
    # a character tokenizer: a lesson's tokens are its characters and EOS
    assert all(
        target == "lesson" and attempt is None and tokens == chars + 1 for _, target, attempt, tokens, chars in uses
    )

    yields = _rows(
        db,
        "SELECT step, pairs, candidates, validated, rejected FROM meta_experience_yield "
        "WHERE run_id = :r ORDER BY step",
        r=run,
    )
    assert [y[:3] for y in yields] == [(1, 3, 3), (2, 3, 3)]
    assert [y[3] for y in yields] == [m["mel/validated"] for m in result.metrics]

    # replay prompts carry the question and a lesson without a single digit; nothing else
    (script,) = scripted
    assert len(script.prompts["replay"]) == 6 and len(script.prompts["diagnosis"]) == 6
    for prompt in script.prompts["replay"]:
        lesson = prompt.split("to keep in mind:\n\n")[1].split("\n\nSolve the problem")[0]
        assert lesson.startswith("## Mistake") and not re.search(r"\d", lesson)
        assert "reward" not in prompt.lower() and "correct" not in prompt.lower()
    for prompt in script.prompts["diagnosis"]:
        assert "reward" not in prompt.lower()


def test_validated_lessons_serve_as_inter_feedback_and_rejected_ones_never(
    db: Engine, toy_problems: list[int], tmp_path: Path, scripted: list[MelScript]
) -> None:
    cfg = _config(
        tmp_path,
        steps=3,
        feedback=FeedbackConfig(
            mode="inter", p_t=1.0, k=2, candidates=4, inter=InterConfig(gamma=0.5, scorer="test", kinds=["meta"])
        ),
    )
    result = train(cfg, db=db, progress=False)
    used = _rows(
        db,
        "SELECT e.kind, e.evicted_by, mp.verdict, v.summary FROM group_contexts c "
        "JOIN rollout_groups g ON g.id = c.group_id JOIN experience_versions v ON v.id = c.experience_version_id "
        "JOIN experiences e ON e.id = v.experience_id LEFT JOIN meta_pairs mp ON mp.experience_id = e.id "
        "WHERE g.run_id = :r AND g.mode = 'inter'",
        r=result.run_id,
    )
    assert used, "later steps draw validated lessons as inter feedback"
    assert {(kind, verdict) for kind, _, verdict, _ in used} == {("meta", "validated")}
    assert all(evicted_by != "mel:rejected" for _, evicted_by, _, _ in used)
    (script,) = scripted
    inter = [p for p in script.prompts["rollout"] if "lessons learned on other problems" in p]
    blocks = [p.split("some may not apply:")[1].split("Decide which")[0] for p in inter]
    assert blocks and all(not re.search(r"\d", re.sub(r"### Lesson \d+", "", b)) for b in blocks)


def test_the_nll_term_moves_the_weights_and_lambda_zero_leaves_plain_grpo(
    db: Engine, toy_problems: list[int], tmp_path: Path, scripted: list[MelScript]
) -> None:
    shas = {}
    for coef in (0.0, 0.1):
        mel = MELConfig(pairs_per_problem=1, replays=2, diagnosis_max_new_tokens=64, nll_coef=coef)
        result = train(_config(tmp_path / str(coef), run_name=f"mel-{coef}", steps=1, mel=mel), db=db, progress=False)
        sql = "SELECT adapter_sha256 FROM policy_versions WHERE run_id = :r AND step = 1"
        ((shas[coef],),) = _rows(db, sql, r=result.run_id)
        assert ("mel/nll" in result.metrics[0]) is (coef > 0)
    assert shas[0.0] != shas[0.1]


def test_replay_target_trains_on_a_successful_replay(
    db: Engine, toy_problems: list[int], tmp_path: Path, scripted: list[MelScript]
) -> None:
    cfg = _config(tmp_path, steps=1, mel=MELConfig(pairs_per_problem=1, replays=2, nll_target="replay"))
    result = train(cfg, db=db, progress=False)
    uses = _rows(
        db,
        "SELECT u.target, a.correct, g.mode, u.tokens = a.completion_tokens FROM meta_nll_uses u "
        "JOIN attempts a ON a.id = u.attempt_id JOIN rollout_groups g ON g.id = a.group_id WHERE u.run_id = :r",
        r=result.run_id,
    )
    assert uses and set(uses) == {("replay", True, "replay", True)}


def test_mel_with_a_worker_is_the_synchronous_run_and_the_worker_replays(
    db: Engine, toy_problems: list[int], tmp_path: Path, scripted: list[MelScript], monkeypatch
) -> None:
    """method = mel with a rollout worker (max_staleness 0): the worker diagnoses and replays with the policy that
    generated the groups (the trainer's engine is sent nothing), and the run is the synchronous one, metric for
    metric; the replays the store keeps are the ones the worker handed back through the queue."""
    import json

    from lanpo.train.config import WorkersConfig
    from lanpo.train.producer import worker as worker_mod
    from tests.conftest import truncate_all
    from tests.train.conftest import insert_toy_problems
    from tests.train.test_workers import TIMING, _train_in_thread, _wait_for

    sync = train(_config(tmp_path / "sync"), db=db, progress=False)
    truncate_all(db)
    assert insert_toy_problems(db) == toy_problems
    real = worker_mod.open_served_policy

    def scripted_worker(cfg: object, model: object, tokenizer: object, *args: object, **kwargs: object):
        engine = real(cfg, model, tokenizer, *args, **kwargs)  # the worker's engine too
        scripted.append(MelScript(tokenizer, served=engine.backend.served_adapter_sha256))
        engine.backend = scripted[-1]
        return engine

    monkeypatch.setattr(worker_mod, "open_served_policy", scripted_worker)
    cfg = _config(tmp_path / "async", workers=WorkersConfig(external=True, lease_s=30))
    thread, out = _train_in_thread(cfg, db)
    _wait_for(lambda: _rows(db, "SELECT 1 FROM rollout_work"), 120, "step 1 to be queued")
    assert worker_mod.run_worker(db, "mel", max_claims=2).claims == 2
    thread.join(120)
    assert "result" in out, out.get("error")
    split = out["result"]
    _, trainer, worker = scripted  # the synchronous trainer's, the asynchronous trainer's, the worker's
    assert trainer.prompts == {"rollout": [], "diagnosis": [], "replay": [], "summary": []}
    assert len(worker.prompts["diagnosis"]) == len(worker.prompts["replay"]) == 6  # 2 steps x 3 pairs
    for step, (a, s) in enumerate(zip(split.metrics, sync.metrics, strict=True), start=1):
        assert {k: v for k, v in a.items() if not k.startswith(TIMING)} == {
            k: v for k, v in s.items() if not k.startswith(TIMING)
        }, f"step {step}"
        assert a["mel/pairs"] == 3 and a["async/worker/mel"] > 0
    for step in (1, 2):
        (groups,) = _rows(
            db,
            "SELECT r.groups FROM rollout_results r JOIN rollout_work w ON w.id = r.work_id "
            "WHERE w.run_id = :r AND w.step = :s AND w.status = 'used'",
            r=split.run_id,
            s=step,
        )[0]
        groups = groups if isinstance(groups, list) else json.loads(groups)
        handed = sorted(c["text"] for g in groups for w in g["mel"] for c in w["replays"])
        stored = _rows(
            db,
            "SELECT a.response FROM attempts a JOIN rollout_groups g ON g.id = a.group_id "
            "WHERE g.run_id = :r AND g.step = :s AND g.mode = 'replay' ORDER BY a.response",
            r=split.run_id,
            s=step,
        )
        assert [r[0] for r in stored] == handed and len(handed) == 3 * 2  # 3 lessons x 2 replays
