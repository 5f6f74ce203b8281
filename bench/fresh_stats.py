"""Benchmark: the FIRST draws on a pool just written, planned on the statistics lanpo refreshed (lanpo.db.stats),
against the same draws after a manual ANALYZE, and against the same draws planned blind (no refresh at all).

Three identical databases are written through the record path a training step uses (`record_groups` for each
step's groups of 16 rollouts, `add_experiences` for its lessons, one transaction per step), after an import and a
relevance build: 2,048 problems, 13 steps of 512 problems, about 106,000 attempts and 13,000 lessons. Autovacuum
is off on their tables, so nothing but lanpo (or the manual ANALYZE) takes statistics:

- lanpo:   as lanpo writes them (each commit analyzes the tables it grew 10x);
- blind:   the refresh switched off, as before issue 35;
- analyze: the refresh switched off, then `ANALYZE` by hand: the reference.

The first inter draw and the first intra draw (512 problems, k = 4 of 32 candidates, the trainer's batch) are
timed on each; then further draws, taken in turns across the three, give medians. The last line prints the ratio
lanpo / analyze for the first draw of each kind (the goal: at most 1.5x).

    python bench/fresh_stats.py                   # about 106,000 attempts
    python bench/fresh_stats.py --steps 2         # a quick run
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import Rounds, timed
from pool_ops import bench_database

from lanpo.config import StoreConfig
from lanpo.db import stats
from lanpo.db.repo.attempts import NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.pools import ensure_pool
from lanpo.db.repo.problems import Question, problem_ids, upsert_problems
from lanpo.db.repo.sampling import sample_inter, sample_intra
from lanpo.feedback.schedule import batch_problem_ids
from lanpo.retrieval.relevance import store_scores

PROBLEMS, BATCH, GROUP, LESSONS, RELEVANT, K, CANDIDATES = 2048, 512, 16, 2, 4, 4, 32
SCORER, GAMMA = "bench", 0.9
ROWS = ("lanpo", "blind", "analyze")


def write(db: Engine, steps: int, refresh: bool) -> tuple[list[int], int]:
    """Import, relevance build and `steps` training steps, each in its own transaction; (problem ids, pool id)."""
    stats.enabled = refresh
    try:
        with db.begin() as conn:
            for table in stats.TABLES:
                conn.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        with Session(db) as session, session.begin():
            upsert_problems(session, "bench", [Question(str(i), f"What is {i} + {i}?", str(2 * i)) for i in
                                                range(PROBLEMS)])  # fmt: skip
        with Session(db) as session, session.begin():
            pids = problem_ids(session, "bench")
            pool = ensure_pool(session, "bench", StoreConfig(per_problem_cap=32))
            rng = np.random.default_rng(0)
            scores = {}
            for i, p in enumerate(pids):
                for j in rng.choice(PROBLEMS - 1, size=RELEVANT, replace=False):
                    scores[(p, pids[(i + 1 + int(j)) % PROBLEMS])] = float(rng.uniform(GAMMA, 1.0))
            store_scores(session, SCORER, scores)
        for step in range(1, steps + 1):
            batch = batch_problem_ids(pids, BATCH, 0, step)
            with Session(db) as session, session.begin():
                groups = [
                    NewGroup(p, "zero_shot", f"What is {p} + {p}? Think step by step.",
                             [NewAttempt(f"step {step} try {g}: the sum is {2 * p + g % 3}", float(g % 2), g % 2 == 1)
                              for g in range(GROUP)], step=step)
                    for p in batch
                ]  # fmt: skip
                attempts = record_groups(session, groups)
                lessons = [
                    NewExperience(p, f"Flow: add the parts. Principle {j}: carry the tens. ({p}, step {step})",
                                  1.0, attempts[i][j], step=step)
                    for i, p in enumerate(batch) for j in range(LESSONS)
                ]  # fmt: skip
                add_experiences(session, pool, lessons)
        return pids, pool.id
    finally:
        stats.enabled = True


def draw(db: Engine, kind: str, pids: list[int], pool_id: int, seed: int) -> int:
    """One batch draw, as the trainer makes it; returns how many contexts were drawn."""
    with Session(db) as session:
        if kind == "inter":
            out = sample_inter(session, pids, k=K, candidates=CANDIDATES, seed=seed, gamma=GAMMA, scorer=SCORER,
                               pool_id=pool_id)  # fmt: skip
        else:
            out = sample_intra(session, pids, k=K, candidates=CANDIDATES, seed=seed)
    return sum(len(v) for v in out.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=13, help="training steps written (13: ~106,000 attempts)")
    parser.add_argument("--rounds", type=int, default=5, help="later draws per database, taken in turns")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        engines = {row: stack.enter_context(bench_database()) for row in ROWS}
        written = {}
        for row, db in engines.items():
            written[row], took = timed(lambda: write(db, args.steps, refresh=row == "lanpo"))  # noqa: B023
            print(f"{row:<8} written in {took:.1f} s")
        with engines["analyze"].connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
        with engines["lanpo"].connect() as conn:
            attempts = conn.scalar(sa.text("SELECT count(*) FROM attempts"))
            lessons = conn.scalar(sa.text("SELECT count(*) FROM experiences"))
        print(f"each: {PROBLEMS:,} problems, {attempts:,} attempts, {lessons:,} lessons; batch {BATCH}, k={K}")

        batch = batch_problem_ids(written["lanpo"][0], BATCH, 0, 1)  # problems with attempts, as a later step's
        first: dict[tuple[str, str], float] = {}
        for kind in ("inter", "intra"):
            for row, db in engines.items():
                pool_id = written[row][1]
                drawn, seconds = timed(lambda: draw(db, kind, batch, pool_id, 1))  # noqa: B023
                first[(kind, row)] = seconds
                assert drawn > 0, (kind, row)
        rounds = Rounds(ROWS, args.rounds, warmup=0)
        for round_, order in rounds:
            for row in order:
                for kind in ("inter", "intra"):
                    pool_id = written[row][1]
                    rounds.time(round_, (kind, row), lambda: draw(engines[row], kind, batch, pool_id, 2 + round_))  # noqa: B023
    print(f"\n{'draw':<6} {'database':<8} {'first ms':>9} {'later ms (median)':>18}")
    for kind in ("inter", "intra"):
        for row in ROWS:
            later = statistics.median(rounds.seconds[(kind, row)]) * 1000
            print(f"{kind:<6} {row:<8} {first[(kind, row)] * 1000:9.1f} {later:18.1f}")
    ratios = {kind: first[(kind, "lanpo")] / first[(kind, "analyze")] for kind in ("inter", "intra")}
    blind = {kind: first[(kind, "blind")] / first[(kind, "analyze")] for kind in ("inter", "intra")}
    print(f"\nblind / analyze, first draw: inter {blind['inter']:.2f}x, intra {blind['intra']:.2f}x")
    ok = "OK" if max(ratios.values()) <= 1.5 else "MISSED"
    inter, intra = ratios["inter"], ratios["intra"]
    print(f"target: first draw lanpo / analyze <= 1.5x -> inter {inter:.2f}x, intra {intra:.2f}x {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
