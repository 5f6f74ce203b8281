"""The replay draw (lanpo.feedback.replay_draw) against exact selection probabilities on a small store written the way
training writes it, plus the trajectory choices, retirement and reproducibility."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import sqlalchemy as sa
from scipy import stats
from sqlalchemy.orm import Session

from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import trajectories as store
from lanpo.db.repo.attempts import NewAttempt, NewGroup, record_groups
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.feedback import replay_draw as replay
from lanpo.feedback.replay_config import ReplayConfig

SEEDS = 3000
Z_LIMIT = float(stats.norm.isf(1e-3 / 10 / 2))  # two-sided, Bonferroni over the few probabilities a test checks
N = 4  # rollouts per group: a problem's bucket is its latest number of successes of 4
# per problem: step 1's correctness pattern (its successes are the candidates), step 2's (the latest correctness)
PATTERNS = {
    "e": ([True, False, False, False], [False, False, False, False]),  # latest 0.0: a candidate, rarely drawn
    "a": ([True, True, False, False], [True, False, False, False]),  # 0.25
    "f": ([True, False, False, False], [False, True, False, False]),  # 0.25: a's bucket, which two now share
    "b": ([True, True, True, False], [True, True, False, False]),  # 0.5: the middle
    "c": ([False, True, False, False], [True, True, True, False]),  # 0.75
    "d": ([True, False, True, False], [True, True, True, True]),  # 1.0: retired
}


@pytest.fixture
def small_store(session: Session) -> tuple[list[int], dict, dict, dict[str, int]]:
    """Five problems, two steps of zero_shot groups of 4 rollouts (consecutive attempt ids, as a step writes them),
    tokens stored for every attempt; returns (the step's problem ids, candidates, latest correctness, names)."""
    upsert_problems(session, "d", [Question(name, f"q {name}", "1") for name in PATTERNS])
    ids = dict(session.execute(sa.text("SELECT external_id, id FROM problems WHERE dataset = 'd'")).all())
    run = runs_repo.create_run(session, "replay-draw", "train", {}).id
    for step in (1, 2):
        groups = [
            NewGroup(ids[name], "zero_shot", f"q {name}", [NewAttempt(f"{name}{step}{j}", float(c), c, True, 2)
                                                          for j, c in enumerate(pattern[step - 1])], step=step,
                     run_id=run)
            for name, pattern in PATTERNS.items()
        ]  # fmt: skip
        written = [a for g in record_groups(session, groups) for a in g]
        store.write_tokens(session, [(a, [1, 2], [-0.1, -0.2], "engine") for a in written])
    pids = list(ids.values())
    cands = store.candidates(session, [run], pids, before_step=3, successes_only=True)
    latest = store.latest_correctness(session, [run], pids, before_step=3)
    return pids, cands, latest, ids


def exact_inclusion(weights: list[float], k: int) -> list[float]:
    """P(item i is among k successive weighted draws without replacement), by enumerating every ordered draw."""
    out = [0.0] * len(weights)
    for order in itertools.permutations(range(len(weights)), k):
        prob, left = 1.0, sum(weights)
        for i in order:
            prob *= weights[i] / left
            left -= weights[i]
        for i in order:
            out[i] += prob
    return out


def exact_bucket_inclusion(buckets: list[int], k: int) -> list[float]:
    """P(item i is among k successive draws without replacement, each drawing a non-empty bucket by its weight and
    then one of its items uniformly), by enumerating every ordered draw."""
    out = [0.0] * len(buckets)
    for order in itertools.permutations(range(len(buckets)), k):
        prob, left = 1.0, list(range(len(buckets)))
        for i in order:
            keys = {buckets[j] for j in left}
            total = sum(replay.bucket_weight(b, N) for b in keys)
            same = sum(1 for j in left if buckets[j] == buckets[i])
            prob *= replay.bucket_weight(buckets[i], N) / total / same
            left.remove(i)
        for i in order:
            out[i] += prob
    return out


def _frequencies(pids, cands, latest, config: ReplayConfig) -> Counter:
    counts: Counter = Counter()
    for seed in range(SEEDS):
        for d in replay.draw(pids, cands, latest, config, seed, step=3, group_size=N):
            counts[d.problem_id] += 1
    return counts


def _z(observed: int, p: float) -> float:
    se = math.sqrt(p * (1 - p) / SEEDS)
    return abs(observed / SEEDS - p) / se if se > 0 else (0.0 if observed / SEEDS == p else math.inf)


def test_the_store_gives_the_draw_what_training_wrote(small_store) -> None:
    _pids, cands, latest, ids = small_store
    assert latest == {ids["e"]: 0.0, ids["a"]: 0.25, ids["f"]: 0.25, ids["b"]: 0.5, ids["c"]: 0.75, ids["d"]: 1.0}
    counts = {ids["e"]: 1, ids["a"]: 3, ids["f"]: 2, ids["b"]: 5, ids["c"]: 4, ids["d"]: 6}
    assert {p: len(c) for p, c in cands.items()} == counts


def test_bucket_draw_matches_exact_weighted_probabilities(small_store) -> None:
    pids, cands, latest, ids = small_store
    config = ReplayConfig(enabled=True, problems="bucket", share=0.5, per_group=1)
    eligible = ["e", "a", "f", "b", "c"]  # d is retired; 3 of the 5 are drawn (0.5 * 5, rounded half up)
    buckets = [replay.bucket_of(latest[ids[n]], N) for n in eligible]
    assert buckets == [0, 1, 1, 2, 3]
    exact = exact_bucket_inclusion(buckets, 3)
    counts = _frequencies(pids, cands, latest, config)
    assert counts[ids["d"]] == 0
    for name, p in zip(eligible, exact, strict=True):
        assert _z(counts[ids[name]], p) < Z_LIMIT, (name, counts[ids[name]] / SEEDS, p)
    # the test can fail: each problem weighted by its bucket (no bucket first), or uniform, is far from the exact
    weights = [replay.bucket_weight(b, N) for b in buckets]
    for wrong in (exact_inclusion(weights, 3), [0.6] * 5):
        assert max(abs(a - b) for a, b in zip(wrong, exact, strict=True)) > 8 * math.sqrt(0.25 / SEEDS)


def test_bucket_default_favours_the_middle_and_retires_the_solved(small_store) -> None:
    pids, cands, latest, ids = small_store
    config = ReplayConfig(enabled=True, problems="bucket", share=1.0, per_group=1)
    draws = replay.draw(pids, cands, latest, config, seed=1, step=3, group_size=N)
    assert sorted(d.problem_id for d in draws) == sorted(ids[n] for n in "eafbc")  # share 1: all but the retired
    # ExGRPO's normal mapping at 8 rollouts: N(k; 4, 1)
    assert replay.bucket_weight(4, 8) == 1.0 and replay.bucket_weight(3, 8) == pytest.approx(math.exp(-0.5))
    assert replay.bucket_weight(2, 8) == pytest.approx(replay.bucket_weight(6, 8)) == pytest.approx(math.exp(-2))


def test_any_draw_is_uniform_over_problems_with_a_candidate(small_store) -> None:
    pids, cands, latest, ids = small_store
    config = ReplayConfig(enabled=True, problems="any", share=0.5, per_group=1)
    assert replay.count_of(0.5, 5) == 3 and replay.count_of(0.5, len(PATTERNS)) == 3  # 2.5 rounds half up
    counts = _frequencies(pids, cands, latest, config)
    for name in PATTERNS:  # the solved problem too: any ignores correctness
        assert _z(counts[ids[name]], 3 / len(PATTERNS)) < Z_LIMIT, name
    assert sum(counts.values()) == 3 * SEEDS


def test_random_trajectories_are_uniform_pairs(small_store) -> None:
    pids, cands, latest, ids = small_store
    b = ids["b"]
    config = ReplayConfig(enabled=True, problems="any", share=1.0, per_group=2)
    pairs: Counter = Counter()
    for seed in range(SEEDS):
        (draw,) = [d for d in replay.draw(pids, cands, latest, config, seed, step=3) if d.problem_id == b]
        assert len({c.attempt_id for c in draw.candidates}) == 2
        pairs[frozenset(c.attempt_id for c in draw.candidates)] += 1
    n = len(cands[b])
    assert len(pairs) == math.comb(n, 2)
    observed = np.array(list(pairs.values()))
    assert stats.chisquare(observed).pvalue > 1e-3
    # e has one candidate: per_group = 2 gives the one
    (e_draw,) = [d for d in replay.draw(pids, cands, latest, config, 0, step=3) if d.problem_id == ids["e"]]
    assert [c.attempt_id for c in e_draw.candidates] == [cands[ids["e"]][0].attempt_id]


def test_recent_and_lowest_entropy(small_store) -> None:
    _pids, cands, latest, ids = small_store
    b = cands[ids["b"]]  # step 1: three successes, step 2: two (oldest first)
    recent = ReplayConfig(enabled=True, trajectories="recent", per_group=2)
    (d,) = replay.draw([ids["b"]], cands, latest, recent, seed=0, step=3)
    assert [c.attempt_id for c in d.candidates] == [b[4].attempt_id, b[3].attempt_id]
    lowest = ReplayConfig(enabled=True, trajectories="lowest_entropy", per_group=2)
    by_id = {b[0].attempt_id: 0.3, b[1].attempt_id: 0.1, b[2].attempt_id: 0.3, b[3].attempt_id: 0.9,
             b[4].attempt_id: 0.3}  # fmt: skip
    seen: list[list[int]] = []

    def entropy(cs: list[store.Candidate]) -> list[float]:
        seen.append([c.attempt_id for c in cs])
        return [by_id[c.attempt_id] for c in cs]

    (d,) = replay.draw([ids["b"]], cands, latest, lowest, seed=0, step=3, entropy=entropy)
    # the lowest (0.1), then of the three tied at 0.3 the newest (step 2's b[4])
    assert [c.attempt_id for c in d.candidates] == [b[1].attempt_id, b[4].attempt_id]
    assert len(seen) == 1  # called once, for the one chosen problem
    with pytest.raises(ValueError, match="entropy"):
        replay.draw([ids["b"]], cands, latest, lowest, seed=0, step=3)


def test_same_seed_same_draws_and_nothing_without_candidates(small_store) -> None:
    pids, cands, latest, _ids = small_store
    config = ReplayConfig(enabled=True, problems="bucket", share=0.5, per_group=2)
    first = replay.draw(pids, cands, latest, config, seed=7, step=3, group_size=N)
    assert first == replay.draw(list(pids), cands, latest, config, seed=7, step=3, group_size=N)
    assert any(replay.draw(pids, cands, latest, config, seed=s, step=3, group_size=N) != first for s in range(8, 20))
    assert replay.draw(pids, {}, latest, config, seed=7, step=3, group_size=N) == []
    assert replay.draw([], cands, latest, config, seed=7, step=3, group_size=N) == []
