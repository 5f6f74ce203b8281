"""Benchmark: what keeping `lesson_usefulness` current costs a training step, against recomputing the step's
versions from their whole history (the reference: what the refresh would cost without its per-use rows).

A history is written as a training run writes it: --steps steps of --groups inter groups (16 attempts, 4 lessons
drawn from --versions versions) each beside a zero-shot group of its problem (an exact baseline for every use), or
with --estimated of another problem, as lanpo's trainer draws each problem once a step: no use has an exact
baseline, and each is compared with the estimate from the run's zero-shot attempts at the 8 steps before its own.
Then, interleaved for --rounds: lanpo writes one more such step through `record_groups` (its refresh recomputes the
uses at the step's keys and sums each version's rows), and the reference refreshes the same versions as the refresh
was first written (`bench/usefulness_reference.sql`: each version recomputed from all its uses, exact baselines
only). Medians of both, their ratio.

    python bench/usefulness.py                          # 200 steps x 100 groups over 400 versions: 80,000 uses
    python bench/usefulness.py --estimated              # the same, every use against an estimated baseline
    python bench/usefulness.py --steps 2 --groups 4 --versions 8 --rounds 1   # the smoke
    python bench/usefulness.py --verdicts 32 --clients 8   # and what a server's verdicts cost on that history

With --verdicts V: one more step of V retrieval answers as a server writes them (one ungraded attempt, 4 lessons,
beside a graded zero-shot group), then, interleaved for --rounds, --clients threads send one verdict on each (a
round flips them all): `in transaction`, the verdict's own transaction refits the pool (what `lanpo serve` did
before `lanpo.serve.refit`), against `group commit`, the verdict commits its use rows and awaits
`Refitter.settle` (what it does now). Verdicts/s of each, medians, their ratio, and the refits the group commit ran.

Uses its own embedded Postgres in a temporary folder, or a new database on $LANPO_DATABASE_URL's server.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa
from pool_ops import bench_database

from lanpo.config import StoreConfig
from lanpo.db.connection import transaction
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.pools import ensure_pool
from lanpo.db.repo.problems import Question, problem_ids, upsert_problems
from lanpo.db.repo.serving import record_feedback
from lanpo.serve.refit import Refitter

ITEMS, ROLLOUTS = 4, 16
REFERENCE = sa.text((Path(__file__).parent / "usefulness_reference.sql").read_text())


def step_groups(
    step: int, run: int, version: int, pids: list[int], vids: list[int], n: int, estimated: bool = False
) -> list[NewGroup]:
    """One step's groups: n inter groups of 4 lessons, each beside a zero-shot group of its problem, or (estimated)
    of a problem of the other half, which no inter group of the step draws."""
    groups = []
    half = len(pids) // 2
    for j in range(n):
        problem = pids[1 + (step * 7 + j) % (half - 1)] if estimated else pids[1 + (step * 7 + j) % (len(pids) - 1)]
        zero_shot = pids[half + (step * 7 + j) % half] if estimated else problem
        attempts = [NewAttempt("r", reward=float((a + j) % 2), correct=bool((a + j) % 2)) for a in range(ROLLOUTS)]
        contexts = [ContextRef(k, vids[(step + j + k) % len(vids)]) for k in range(ITEMS)]
        common = {"step": step, "run_id": run, "policy_version_id": version}
        groups.append(NewGroup(problem, "inter", "prompt", attempts, contexts=contexts, **common))  # type: ignore[arg-type]
        groups.append(NewGroup(zero_shot, "zero_shot", "prompt", attempts, **common))  # type: ignore[arg-type]
    return groups


def write_step(
    db: sa.Engine, run: int, step: int, pids: list[int], vids: list[int], n: int, estimated: bool = False
) -> float:
    """lanpo: one step's groups through record_groups (with its refresh); seconds."""
    with transaction(db) as session:
        version = steps_repo.add_policy_version(session, run, step, f"{step:064x}")
        groups = step_groups(step, run, version, pids, vids, n, estimated)
        started = time.perf_counter()
        record_groups(session, groups)
        return time.perf_counter() - started


def full_recompute(db: sa.Engine, vids: list[int]) -> float:
    """The reference: the refresh as first written, each version recomputed from all its uses; seconds."""
    with transaction(db) as session:
        started = time.perf_counter()
        session.execute(REFERENCE, {"version_ids": vids})
        return time.perf_counter() - started


def served_answers(db: sa.Engine, run: int, step: int, pids: list[int], vids: list[int], n: int) -> list[int]:
    """One step of `n` retrieval answers as a server writes them (ungraded, 4 lessons), each beside a graded
    zero-shot group of its question; the answers' attempt ids."""
    groups = []
    with transaction(db) as session:
        version = steps_repo.add_policy_version(session, run, step, f"{step:064x}")
        common = {"step": step, "run_id": run, "policy_version_id": version}
        for j in range(n):
            problem = pids[1 + j % (len(pids) - 1)]
            contexts = [ContextRef(k, vids[(step + j + k) % len(vids)]) for k in range(ITEMS)]
            zero = [NewAttempt("z", float(a % 2), bool(a % 2)) for a in range(ROLLOUTS)]
            groups.append(NewGroup(problem, "retrieval", "p", [NewAttempt("r")], contexts=contexts, **common))  # type: ignore[arg-type]
            groups.append(NewGroup(problem, "zero_shot", "p", zero, **common))  # type: ignore[arg-type]
        written = record_groups(session, groups)
    return [ids[0] for ids in written[::2]]


def verdict(db: sa.Engine, answer: int, correct: bool, fit: bool) -> None:
    """One verdict in its own transaction; `fit`: refit the pool there (before), or leave it to the refitter (now)."""
    with transaction(db) as session:
        record_feedback(session, answer, reward=None, correct=correct, gold_answer=None, key_name="bench", fit=fit)


def verdicts_in_transaction(db: sa.Engine, answers: list[int], correct: bool, clients: int) -> float:
    """Each verdict refits its pool inside its own transaction; seconds for all."""
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda answer: verdict(db, answer, correct, fit=True), answers))
    return time.perf_counter() - started


def verdicts_group_commit(
    db: sa.Engine, pool_id: int, answers: list[int], correct: bool, clients: int
) -> tuple[float, int]:
    """Each verdict commits its use rows, then awaits a refit begun after its commit (lanpo serve's path); seconds
    for all, and the refits run."""

    async def run() -> tuple[float, int]:
        executor = ThreadPoolExecutor(clients + 1)
        refitter = Refitter(db, executor)
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(clients)

        async def request(answer: int) -> None:
            async with slots:  # `clients` requests at a time, as the other arm's threads
                await loop.run_in_executor(executor, verdict, db, answer, correct, False)
                await refitter.settle([pool_id])

        started = time.perf_counter()
        await asyncio.gather(*(request(a) for a in answers))
        seconds = time.perf_counter() - started
        executor.shutdown()
        return seconds, refitter.refits

    return asyncio.run(run())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps of history")
    parser.add_argument("--groups", type=int, default=100, help="inter groups a step (each beside a zero-shot one)")
    parser.add_argument("--versions", type=int, default=400, help="lesson versions the contexts draw from")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--estimated", action="store_true", help="zero-shot groups of other problems: every use's baseline estimated"
    )
    parser.add_argument("--verdicts", type=int, default=0, help="then a server's verdicts on this many answers")
    parser.add_argument("--clients", type=int, default=8, help="verdicts sent at a time (--verdicts)")
    args = parser.parse_args()
    with bench_database() as db:
        with transaction(db) as session:
            upsert_problems(session, "bench", [Question(str(i), f"question {i}", "1") for i in range(200)])
            pids = problem_ids(session, "bench")
            pool = ensure_pool(session, "bench", StoreConfig(per_problem_cap=100_000, per_step_cap=100_000))
            lessons = [NewExperience(pids[0], f"lesson {i}") for i in range(args.versions)]
            vids = add_experiences(session, pool, lessons).version_ids
            run = runs_repo.create_run(session, "bench", "train", {}, pool_id=pool.id).id
        started = time.perf_counter()
        for step in range(1, args.steps + 1):
            write_step(db, run, step, pids, vids, args.groups, args.estimated)
        with db.connect() as conn:
            uses = conn.scalar(sa.text("SELECT count(*) FROM lesson_uses"))
            sources = dict(conn.execute(sa.text("SELECT baseline_source, count(*) FROM lesson_uses GROUP BY 1")).all())
        print(f"history: {args.steps} steps, {uses} uses of {len(vids)} versions (baselines: {sources}), written in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        lanpo, reference = [], []
        for r in range(args.rounds):
            lanpo.append(write_step(db, run, args.steps + 1 + r, pids, vids, args.groups, args.estimated))
            reference.append(full_recompute(db, vids))
        lanpo_ms, ref_ms = 1000 * statistics.median(lanpo), 1000 * statistics.median(reference)
        print(f"| one more step's record_groups, refresh included (lanpo) | {lanpo_ms:.1f} ms |")
        print(f"| the refresh as first written: its versions from all their uses (reference) | {ref_ms:.1f} ms |")
        print(f"lanpo / reference: {lanpo_ms / ref_ms:.3f}x (medians of {args.rounds})")
        if args.verdicts:
            bench_verdicts(db, pool.id, run, args.steps + args.rounds + 1, pids, vids, args)
    return 0


def bench_verdicts(
    db: sa.Engine, pool_id: int, run: int, step: int, pids: list[int], vids: list[int], args: argparse.Namespace
) -> None:
    """--verdicts: both arms interleaved for --rounds, the order alternating; verdicts/s, medians."""
    answers = served_answers(db, run, step, pids, vids, args.verdicts)
    inside, grouped, refits = [], [], []
    for r in range(args.rounds):
        for arm in ("inside", "grouped") if r % 2 == 0 else ("grouped", "inside"):
            correct = (len(inside) + len(grouped)) % 2 == 0  # each pass flips every verdict: the fit moves
            if arm == "inside":
                inside.append(verdicts_in_transaction(db, answers, correct, args.clients))
            else:
                seconds, ran = verdicts_group_commit(db, pool_id, answers, correct, args.clients)
                grouped.append(seconds)
                refits.append(ran)
    rate_inside = args.verdicts / statistics.median(inside)
    rate_grouped = args.verdicts / statistics.median(grouped)
    print(f"\n{args.verdicts} verdicts, {args.clients} at a time, on a pool of {len(vids)} lessons:")
    print(f"| each refits in its transaction (before) | {rate_inside:.1f} verdicts/s |")
    print(f"| group commit, lanpo serve's refitter (now) | {rate_grouped:.1f} verdicts/s |")
    print(f"group commit / in transaction: {rate_grouped / rate_inside:.2f}x (medians of {args.rounds}); refits "
          f"per pass: {sorted(refits)}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
