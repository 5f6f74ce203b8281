"""The trainer's end of the queue on the real store: groups older than the staleness bound are dropped, counted
and queued again, and the step trains on the redone ones, tied to the policy version that generated them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy.engine import Engine

from lanpo.config import StoreConfig
from lanpo.db.connection import transaction
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo import queue as queue_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.feedback.store import RunRef
from lanpo.rewards import Graded
from lanpo.rollout import Completion
from lanpo.train.config import FeedbackConfig, GRPOConfig, ModelConfig, WorkersConfig
from lanpo.train.plumbing.timing import Phases
from lanpo.train.policy import TINY, load_base
from lanpo.train.producer.produce import Produced, groups_to_json, prompts_from_json
from lanpo.train.producer.rollout_queue import RolloutQueue
from tests.train.conftest import tiny_config

AGAIN = "SELECT 1 FROM rollout_work WHERE run_id = %s AND step = 3 AND attempt = 1 AND status = 'queued'"


def _finish(db: Engine, run_id: int, policy_step: int, text: str) -> None:
    """A worker's turn: claim the open work, answer every prompt with `text`, hand it back as `policy_step`'s."""
    with transaction(db) as session:
        claim = queue_repo.claim(session, run_id, "test-worker", lease_s=60)
        assert claim is not None
        prompts = prompts_from_json(claim.prompts, [None] * len(claim.prompts["problem_ids"]))
        groups = [[Completion(text, (1, 2), (3,), "stop", (-0.5, -0.25), "f" * 64)] * 2 for _ in prompts.texts]
        graded = [Graded(0.0, False, False)] * (2 * len(groups))
        produced = Produced(prompts, groups, graded, {})
        assert queue_repo.finish(session, claim, "test-worker", policy_step, None, groups_to_json(produced), {})


def test_a_group_past_the_bound_is_dropped_and_redone(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    cfg = tiny_config(
        tmp_path, workers=WorkersConfig(external=True, max_staleness=1), feedback=FeedbackConfig(mode="none"),
        grpo=GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, tis_cap=2.0), steps=4,
    )  # fmt: skip
    with transaction(db) as session:
        pool = pools_repo.ensure_pool(session, "queue-test", StoreConfig())
        run_id = runs_repo.create_run(session, "queue-test", "train", pool_id=pool.id).id
        for step in range(3):  # steps 0-2 committed: the trainer is about to train step 3
            pv = steps_repo.add_policy_version(session, run_id, step, f"{step:x}" * 64)
            steps_repo.commit_step(session, run_id, step, pv, None)
        version_2 = steps_repo.policy_version_id(session, run_id, 2)
    _, tokenizer = load_base(ModelConfig(name=TINY))
    queue = RolloutQueue(cfg, RunRef(db, run_id, pool), None, toy_problems, tokenizer)
    queue._queue_ahead(3)  # steps 3 and 4 (max_staleness 1), as step 3 queues them
    _finish(db, run_id, 0, "stale")  # step 3, by the policy of step 0: 3 - 1 - 0 = 2 updates behind

    def redo() -> None:  # the worker that picks up the requeued attempt, with the newest policy
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with db.connect() as conn:
                if conn.exec_driver_sql(AGAIN, (run_id,)).first() is not None:
                    break
            time.sleep(0.05)
        _finish(db, run_id, 2, "fresh")

    worker = threading.Thread(target=redo)
    worker.start()
    got = queue.take(3, Phases(None, 3))
    worker.join(60)
    assert got.metrics["async/dropped"] == 1 and got.metrics["async/staleness"] == 0
    assert {c.text for group in got.groups for c in group} == {"fresh"}
    assert got.prompts.policy_version_id == version_2  # the attempts will name the policy that generated them
    assert got.rollouts[0].logprobs == (-0.5, -0.25)  # the worker's log-probs, for TIS
    with db.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT step, attempt, status FROM rollout_work WHERE run_id = %s ORDER BY step, attempt", (run_id,)
        ).all()
    assert [tuple(r) for r in rows] == [(3, 0, "dropped"), (3, 1, "done"), (4, 0, "queued")]


def test_each_rank_gets_the_strided_share_of_a_workers_step_with_its_summaries_and_mel_pairs() -> None:
    """`share_of` (what rank 0 scatters under torchrun) after the queue's JSON round trip: rank r holds groups
    r, r + W, ... (the prompts `feedback_prompts` gives it synchronously), each group with its own grades,
    summaries and MEL pairs renumbered within the share, and the shares together are the whole step, once."""
    from collections import Counter

    from lanpo.feedback.contexts import StepPrompts
    from lanpo.feedback.record import MetaRecord, RolloutRecord
    from lanpo.feedback.summarize import Summary
    from lanpo.mel.pairs import Pair
    from lanpo.train.mel.experiences import MetaWork
    from lanpo.train.plumbing.dist import Dist
    from lanpo.train.producer.produce import produced_from_json, share_of

    G, n, world = 5, 2, 2
    prompts = StepPrompts(
        list(range(G)), [f"q{g}" for g in range(G)], [str(g) for g in range(G)], ["intra"] * G, ["zero_shot"] * G,
        [f"p{g}" for g in range(G)], [[] for _ in range(G)], 7, Counter(none_relevant=G), k=2, drawn=[0] * G,
        truncated=[0] * G,
    )  # fmt: skip
    groups = [[Completion(f"g{g}r{j}", (g, j), (g,), "stop") for j in range(n)] for g in range(G)]
    graded = [Graded(float(g + j), j == 0, False) for g in range(G) for j in range(n)]
    summaries = {g * n: Summary(f"lesson of g{g}", True) for g in (1, 2, 4)}

    def work(g: int) -> MetaWork:
        replay = Completion(f"replay of g{g}", (9,), (g, 0), "stop")
        record = MetaRecord(0, 1, "lines", 2, 1, "model", f"diagnosis of g{g}", 0.5, lesson=f"M{g}",
                            replays=[RolloutRecord(replay.text, 1.0, True, True, 1, False)])  # fmt: skip
        return MetaWork(Pair(g, 0, 1), record, Completion(f"diagnosis of g{g}", (5,), (g, 1), "stop"), [replay])

    whole = Produced(prompts, groups, graded, summaries, metrics={"async/staleness": 0.0}, work_id=11)
    whole.mel = [work(0), work(3), work(4)]
    got = produced_from_json(prompts, groups_to_json(whole))  # through the queue's JSON
    got.metrics, got.work_id = whole.metrics, whole.work_id
    shares = [share_of(got, Dist(rank=r, world=world)) for r in range(world)]
    seen = []
    for r, share in enumerate(shares):
        keep = list(range(r, G, world))
        assert share.prompts.problem_ids == keep and share.prompts.texts == [f"p{g}" for g in keep]
        assert share.groups == [groups[g] for g in keep]
        assert share.graded == [graded[g * n + j] for g in keep for j in range(n)]
        assert {i: s.text for i, s in share.summaries.items()} == {
            i * n: f"lesson of g{g}" for i, g in enumerate(keep) if g in (1, 2, 4)
        }
        assert share.mel is not None
        for w in share.mel:  # a pair still points at its own group's rollouts, by the share's index
            g = keep[w.pair.group]
            assert w.record.diagnosis == f"diagnosis of g{g}" and w.replays[0].text == f"replay of g{g}"
            assert w.diagnosis is not None and w.diagnosis.prompt_token_ids == (g, 1)
            seen.append(g)
        assert (share.work_id, share.metrics) == ((11, whole.metrics) if r == 0 else (None, {}))
        assert share.prompts.missed == Counter()  # the step's own counts go with rank 0's metrics
    assert sorted(seen) == [0, 3, 4]  # every pair on exactly one rank
    assert share_of(got, Dist()).groups == groups  # one rank: the whole step
