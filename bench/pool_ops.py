"""Benchmark: one training step's pool work on the Postgres store vs an in-memory Python reference pool.

Paper scale: 17,000 problems x 32 experiences (544,000) in one pool, 4 relevant other problems per problem
(problem-to-problem relevance >= gamma), 8 earlier attempts per problem. One step = sample k=4 contexts
for 512 problems (inter: relevance-ranked; intra: recency-ranked) + insert 8 new experiences for each of
the 512 problems with capacity enforcement (per-problem cap 32, oldest out) + record 512 prompts x 16 rollouts
(one rollout group per prompt; half the prompts carry an inter context, a quarter an intra one, as p_t = 0.5-0.75
gives). The same operations run on a reference pool (dicts of lists, numpy weighted choice without replacement),
interleaved step by step with the database's; medians are reported.

    python bench/pool_ops.py                 # paper scale (loads ~1.3 M rows with COPY first)
    python bench/pool_ops.py --scale small   # 1,000 problems, a quick run
    python bench/pool_ops.py --scale small --prompt-chars 12000 --response-chars 4000   # storage per attempt

Texts are word salad with a natural-language word distribution (so TOAST compression sees what real text gives);
by default they are short, as the timing targets assume. "bytes per attempt" is what the step's rows add to the
attempt tables (rollout_groups + attempts + group_contexts, with indexes and TOAST), over the attempts written.

Uses its own embedded Postgres in a temporary LANPO_HOME, or a fresh database on $LANPO_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lanpo.config import EVICTION_POLICIES, StoreConfig
from lanpo.db import migrate, server
from lanpo.db.connection import ENV_URL, make_db, normalise_url
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.contexts import inter_contexts, intra_contexts
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.pools import PoolRow, ensure_pool
from lanpo.db.repo.sampling import rank_weights

SCALES = {"paper": 17_000, "small": 1_000}
PER_PROBLEM, RELEVANT, EARLIER, BATCH, K, GROUP, NEW_PER_STEP, CANDIDATES = 32, 4, 8, 512, 4, 16, 8, 32
SCORER, GAMMA, POOL = "bench", 0.9, "bench"
ATTEMPT_TABLES = ("rollout_groups", "attempts", "group_contexts")
WORDS = str.split(
    "the of and to in is that it for on with as was by be this are from at or an which have not one all their "
    "if can has more when there so what each we first then number than how total sum add subtract multiply divide "
    "step answer value result equation term left right side both times minus plus equals half twice remaining "
    "solve check write compute find let so therefore given since apples train speed hours distance cost price"
)


# --------------------------------------------------------------------------- database


@contextmanager
def bench_database() -> Iterator[Engine]:
    """A fresh, migrated database: a temp embedded server, or a new database on $LANPO_DATABASE_URL."""
    external = os.environ.get(ENV_URL)
    if external:
        admin = sa.create_engine(normalise_url(external), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        name = f"lanpo_bench_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        db = make_db(make_url(normalise_url(external)).set(database=name).render_as_string(False))
        try:
            migrate.upgrade(db)
            yield db
        finally:
            db.dispose()
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        return
    with tempfile.TemporaryDirectory(prefix="lanpo-bench-") as home:
        db = make_db(server.start(Path(home)))
        try:
            migrate.upgrade(db)
            yield db
        finally:
            db.dispose()
            server.stop(Path(home))


def summary_text(problem: int, n: int) -> str:
    return f"Flow: split the problem into parts. Principle {n}: check units. Pitfall: sign errors ({problem})."


def prose(rng: np.random.Generator, chars: int) -> str:
    """About `chars` characters of Zipf-distributed words and numbers: compresses roughly as real text does."""
    if chars <= 0:
        return ""
    ranks = np.minimum(rng.zipf(1.3, size=chars // 4 + 1), len(WORDS)) - 1
    words = [WORDS[r] if r < len(WORDS) - 8 else str(int(rng.integers(0, 1000))) for r in ranks]
    return " ".join(words)[:chars]


def load(db: Engine, n_problems: int, rng: np.random.Generator) -> dict[int, list[tuple[int, float]]]:
    """COPY problems, experiences (+ version 1), relevance and earlier attempts; returns the relevance lists."""
    relevant: dict[int, list[tuple[int, float]]] = {}
    raw = db.raw_connection()
    try:
        conn = raw.driver_connection
        with conn.cursor() as cur:
            with cur.copy("COPY problems (id, dataset, external_id, question, answer) FROM STDIN") as copy:
                for p in range(1, n_problems + 1):
                    copy.write_row((p, "bench", str(p), f"What is {p} + {p}?", str(2 * p)))
            eid = 0
            pool_id = cur.execute("SELECT id FROM pools WHERE name = %s", (POOL,)).fetchone()[0]
            with cur.copy("COPY experiences (id, pool_id, problem_id, kind, reward, created_at) FROM STDIN") as copy:
                for p in range(1, n_problems + 1):
                    for n in range(PER_PROBLEM):
                        eid += 1
                        copy.write_row((eid, pool_id, p, "summary", 1.0, f"2026-01-01 00:00:{n:02d}+00"))
            with cur.copy("COPY experience_versions (id, experience_id, version, summary) FROM STDIN") as copy:
                for e in range(1, eid + 1):
                    copy.write_row((e, e, 1, summary_text((e - 1) // PER_PROBLEM + 1, e)))
            with cur.copy(
                "COPY relevance_scores (problem_id, candidate_problem_id, scorer, score) FROM STDIN"
            ) as copy:
                for p in range(1, n_problems + 1):
                    others = rng.choice(n_problems - 1, size=RELEVANT, replace=False) + 1
                    pairs = [(int(o) + (o >= p), float(rng.uniform(GAMMA, 1.0))) for o in others]
                    relevant[p] = pairs
                    for c, s in pairs:
                        copy.write_row((p, c, SCORER, s))
            with cur.copy("COPY rollout_groups (id, problem_id, mode, prompt) FROM STDIN") as copy:
                for p in range(1, n_problems + 1):
                    copy.write_row((p, p, "zero_shot", f"What is {p} + {p}?"))
            aid = 0
            with cur.copy("COPY attempts (id, group_id, response, reward) FROM STDIN") as copy:
                for p in range(1, n_problems + 1):
                    for n in range(EARLIER):
                        aid += 1
                        copy.write_row((aid, p, f"{p} + {p} = {2 * p + n}", 0.0))
            for table, last in (
                ("problems", n_problems),
                ("experiences", eid),
                ("experience_versions", eid),
                ("rollout_groups", n_problems),
                ("attempts", aid),
            ):
                cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), {last})")
        conn.commit()
        with conn.cursor() as cur:
            conn.autocommit = True
            cur.execute("VACUUM ANALYZE")
            conn.autocommit = False
    finally:
        raw.close()
    return relevant


# --------------------------------------------------------------------------- in-memory reference


@dataclass
class ReferencePool:
    """Dict-of-lists pool: per problem, its active experiences as (version id, created order, summary)."""

    experiences: dict[int, list[tuple[int, int, str]]] = field(default_factory=dict)
    attempts: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    relevant: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    log: list[tuple] = field(default_factory=list)
    next_id: int = 10**9
    clock: int = 10**6


def reference_pool(n_problems: int, relevant: dict[int, list[tuple[int, float]]]) -> ReferencePool:
    pool = ReferencePool(relevant=relevant)
    eid = aid = 0
    for p in range(1, n_problems + 1):
        pool.experiences[p] = []
        for n in range(PER_PROBLEM):
            eid += 1
            pool.experiences[p].append((eid, n, summary_text(p, eid)))
        pool.attempts[p] = []
        for n in range(EARLIER):
            aid += 1
            pool.attempts[p].append((aid, f"{p} + {p} = {2 * p + n}"))
    return pool


def _draw(n: int, rng: np.random.Generator) -> np.ndarray:
    w = rank_weights(n)
    return rng.choice(n, size=min(K, n), replace=False, p=w / w.sum())


def ref_sample_inter(pool: ReferencePool, problems: list[int], rng: np.random.Generator) -> dict[int, list]:
    out = {}
    for p in problems:
        cands = [
            (s, created, vid, text)
            for c, s in pool.relevant[p]
            if s >= GAMMA
            for vid, created, text in pool.experiences[c]
        ]
        cands.sort(key=lambda x: (-x[0], -x[1], -x[2]))
        cands = cands[:CANDIDATES]
        out[p] = [cands[i] for i in _draw(len(cands), rng)] if cands else []
    return out


def ref_sample_intra(pool: ReferencePool, problems: list[int], rng: np.random.Generator) -> dict[int, list]:
    out = {}
    for p in problems:
        cands = pool.attempts[p][::-1][:CANDIDATES]
        out[p] = [cands[i] for i in _draw(len(cands), rng)] if cands else []
    return out


def ref_insert(pool: ReferencePool, problems: list[int]) -> int:
    evicted = 0
    pool.clock += 1
    for p in problems:
        items = pool.experiences[p]
        for n in range(NEW_PER_STEP):
            pool.next_id += 1
            items.append((pool.next_id, pool.clock, f"new lesson {n} for {p}"))
        if len(items) > PER_PROBLEM:
            items.sort(key=lambda x: (x[1], x[0]))
            evicted += len(items) - PER_PROBLEM
            del items[: len(items) - PER_PROBLEM]
    return evicted


def ref_record(pool: ReferencePool, groups: list[NewGroup]) -> None:
    for g in groups:
        pool.next_id += 1
        pool.log.append((pool.next_id, g.problem_id, g.mode, g.prompt, tuple(g.contexts)))
        for a in g.attempts:
            pool.next_id += 1
            pool.attempts[g.problem_id].append((pool.next_id, a.response))
            pool.log.append((pool.next_id, a.response, a.reward))


# --------------------------------------------------------------------------- one step


@dataclass
class Texts:
    """The step's prompt and response texts, made once per step so both sides store the same strings."""

    prompt_chars: int = 0
    response_chars: int = 0
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def prompt(self, p: int) -> str:
        return f"What is {p} + {p}? " + prose(self.rng, self.prompt_chars)

    def response(self, p: int, step: int, g: int) -> str:
        return f"step {step} try {g}: {2 * p} " + prose(self.rng, self.response_chars)


def new_groups(problems: list[int], inter: dict[int, list], intra: dict[int, list], step: int, texts: Texts):
    """One group of GROUP rollouts per problem: half carry their inter context, a quarter their intra one."""
    out = []
    for i, p in enumerate(problems):
        if i % 2 == 0:
            mode, refs = (
                "inter",
                [ContextRef(j, it.experience_version_id, score=it.score) for j, it in enumerate(inter.get(p, []))],
            )
        elif i % 4 == 1:
            mode, refs = (
                "intra",
                [ContextRef(j, context_attempt_id=it.attempt_id) for j, it in enumerate(intra.get(p, []))],
            )
        else:
            mode, refs = "zero_shot", []
        rollouts = [
            NewAttempt(texts.response(p, step, g), reward=float(g % 2), correct=bool(g % 2), format_ok=True)
            for g in range(GROUP)
        ]
        out.append(NewGroup(p, mode if refs else "zero_shot", texts.prompt(p), rollouts, step=step, contexts=refs))
    return out


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    """Wall milliseconds of `fn()` and its value."""
    start = time.perf_counter()
    value = fn()
    return (time.perf_counter() - start) * 1000, value


@dataclass
class Meter:
    """Wall time and CPU time (this process + the Postgres backend serving it, from /proc/<pid>/schedstat).

    On a shared machine wall time includes waiting for a CPU; CPU time is what the work costs.
    """

    backend_pid: int | None = None
    wall: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    def _backend_ns(self) -> int:
        if self.backend_pid is None:
            return 0
        try:
            return int(Path(f"/proc/{self.backend_pid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def run(self, name: str, fn: Callable[[], object]) -> object:
        wall, cpu, server = time.perf_counter_ns(), time.process_time_ns(), self._backend_ns()
        value = fn()
        self.wall[name] = (time.perf_counter_ns() - wall) / 1e6
        self.cpu[name] = (time.process_time_ns() - cpu + self._backend_ns() - server) / 1e6
        return value

    def total(self) -> None:
        for d in (self.wall, self.cpu):
            d["step total"] = sum(d.values())


def local_backend_pid(session: Session) -> int | None:
    """The backend's pid when the server runs on this machine (its /proc entry readable), else None."""
    pid = int(session.scalar(sa.text("SELECT pg_backend_pid()")))
    return pid if Path(f"/proc/{pid}/schedstat").exists() and os.environ.get(ENV_URL) is None else None


def attempt_bytes(session: Session) -> int:
    """Bytes on disk of the attempt tables (heap, TOAST, indexes)."""
    return int(
        session.scalar(
            sa.text("SELECT sum(pg_total_relation_size(CAST(t AS regclass))) FROM unnest(CAST(:t AS text[])) t"),
            {"t": list(ATTEMPT_TABLES)},
        )
    )


def db_step(db: Engine, pool: PoolRow, problems: list[int], step: int, seed: int, texts: Texts) -> Meter:
    items = [
        NewExperience(p, f"step {step}: new lesson {n} for {p}", reward=1.0, step=step)
        for p in problems
        for n in range(NEW_PER_STEP)
    ]
    session = Session(db)
    transaction = session.begin()
    meter = Meter(local_backend_pid(session))
    inter = meter.run(
        "sample inter",
        lambda: inter_contexts(
            session, problems, k=K, candidates=CANDIDATES, seed=seed, gamma=GAMMA, scorer=SCORER, pool_id=pool.id
        ),
    )
    intra = meter.run("sample intra", lambda: intra_contexts(session, problems, k=K, candidates=CANDIDATES, seed=seed))
    groups = new_groups(problems, inter, intra, step, texts)  # type: ignore[arg-type]
    added = meter.run("insert 8x512 + cap", lambda: add_experiences(session, pool, items))
    evicted = len(added.evicted_ids)  # type: ignore[attr-defined]
    assert evicted == len(items), f"every problem was full: each new item evicts one ({evicted})"
    meter.run("record 512x16 attempts", lambda: record_groups(session, groups))
    meter.run("commit", transaction.commit)
    session.close()
    meter.total()
    return meter


def ref_step(pool: ReferencePool, problems: list[int], step: int, rng: np.random.Generator, texts: Texts) -> Meter:
    meter = Meter()
    inter = meter.run("sample inter", lambda: ref_sample_inter(pool, problems, rng))
    intra = meter.run("sample intra", lambda: ref_sample_intra(pool, problems, rng))

    @dataclass
    class Item:
        experience_version_id: int
        score: float

    @dataclass
    class Earlier:
        attempt_id: int

    wrapped_inter = {p: [Item(x[2], x[0]) for x in v] for p, v in inter.items()}  # type: ignore[attr-defined]
    wrapped_intra = {p: [Earlier(x[0]) for x in v] for p, v in intra.items()}  # type: ignore[attr-defined]
    groups = new_groups(problems, wrapped_inter, wrapped_intra, step, texts)
    meter.run("insert 8x512 + cap", lambda: ref_insert(pool, problems))
    meter.run("record 512x16 attempts", lambda: ref_record(pool, groups))
    meter.wall["commit"] = meter.cpu["commit"] = 0.0
    meter.total()
    return meter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--scale", choices=sorted(SCALES), default="paper", help="paper: 17,000 problems; small: 1,000"
    )
    parser.add_argument("--steps", type=int, default=5, help="measured steps (after one warm-up); medians reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--eviction", choices=EVICTION_POLICIES, default="oldest", help="store eviction policy (reference: oldest)"
    )
    parser.add_argument("--prompt-chars", type=int, default=0, help="extra prompt text per group (paper: ~12000)")
    parser.add_argument("--response-chars", type=int, default=0, help="extra response text per rollout")
    args = parser.parse_args(argv)
    n_problems = SCALES[args.scale]
    rng = np.random.default_rng(args.seed)
    with bench_database() as db:
        with Session(db) as session, session.begin():
            pool = ensure_pool(session, POOL, StoreConfig(eviction=args.eviction))
        load_ms, relevant = timed(lambda: load(db, n_problems, rng))
        print(
            f"scale {args.scale}: {n_problems:,} problems x {PER_PROBLEM} = {n_problems * PER_PROBLEM:,} experiences, "
            f"{n_problems * RELEVANT:,} relevance rows, {n_problems * EARLIER:,} attempts"
        )
        print(f"load (COPY + VACUUM ANALYZE): {load_ms / 1000:.1f} s")
        ref_ms, ref = timed(lambda: reference_pool(n_problems, relevant))  # type: ignore[arg-type]
        print(f"reference pool build: {ref_ms / 1000:.1f} s")
        db_runs, ref_runs = [], []
        with Session(db) as session:
            size_before = attempt_bytes(session)
        for step in range(args.steps + 1):
            problems = sorted(int(p) for p in rng.choice(n_problems, size=BATCH, replace=False) + 1)
            # the reference pool holds millions of Python objects: keep the cyclic GC out of both timings
            gc.collect()
            gc.disable()
            seed = args.seed * 1000 + step

            def texts(seed: int = seed) -> Texts:  # the same strings on both sides
                return Texts(args.prompt_chars, args.response_chars, np.random.default_rng(seed))

            try:
                d = db_step(db, pool, problems, step, seed, texts())
                r = ref_step(ref, problems, step, rng, texts())  # type: ignore[arg-type]
            finally:
                gc.enable()
            if step:  # step 0 warms caches and plans
                db_runs.append(d)
                ref_runs.append(r)
        with Session(db) as session:
            session.execute(sa.text("CHECKPOINT"))  # settle the TOAST and index pages before measuring sizes
            per_attempt = (attempt_bytes(session) - size_before) / ((args.steps + 1) * BATCH * GROUP)
        with db.connect() as conn:
            active_max = conn.scalar(
                sa.text(
                    "SELECT max(n) FROM (SELECT count(*) AS n FROM experiences WHERE evicted_at IS NULL "
                    "GROUP BY problem_id) c"
                )
            )
    print(
        f"\nmedian of {args.steps} steps (batch {BATCH}, k={K}, candidates={CANDIDATES}, group {GROUP}, "
        f"eviction {args.eviction}); cpu = this process + its Postgres backend"
    )
    print(f"{'operation':<24} {'pg wall ms':>10} {'pg cpu ms':>10} {'ref ms':>8} {'wall ratio':>10} {'cpu ratio':>10}")

    def med(runs: list[Meter], kind: str, op: str) -> float:
        return statistics.median(getattr(run, kind)[op] for run in runs)

    for op in db_runs[0].wall:
        dw, dc, rw, rc = (
            med(db_runs, "wall", op),
            med(db_runs, "cpu", op),
            med(ref_runs, "wall", op),
            med(ref_runs, "cpu", op),
        )
        wr = f"{dw / rw:9.2f}x" if rw > 0 else "         -"
        cr = f"{dc / rc:9.2f}x" if rc > 0 else "         -"
        print(f"{op:<24} {dw:10.1f} {dc:10.1f} {rw:8.1f} {wr:>10} {cr:>10}")
    total_wall, total_cpu = med(db_runs, "wall", "step total"), med(db_runs, "cpu", "step total")
    sample_wall = med(db_runs, "wall", "sample inter") / med(ref_runs, "wall", "sample inter")
    sample_cpu = med(db_runs, "cpu", "sample inter") / med(ref_runs, "cpu", "sample inter")
    loadavg = os.getloadavg()[0]
    print(f"\nmax active experiences per problem after the run: {active_max} (cap {PER_PROBLEM})")
    print(
        f"storage: {per_attempt:,.0f} bytes per attempt (texts: prompt {args.prompt_chars} + ~20 chars per group, "
        f"response {args.response_chars} + ~20 chars per rollout; {BATCH * GROUP:,} attempts in {BATCH} groups a step)"
    )
    print(f"machine: {os.cpu_count()} cores, load average {loadavg:.1f} at the end")
    print(
        f"target: step pool work < 250 ms -> wall {total_wall:.0f} ms, cpu {total_cpu:.0f} ms "
        f"{'OK' if total_wall < 250 else 'OK in cpu time' if total_cpu < 250 else 'MISSED'}"
    )
    print(
        f"target: inter sampling <= 2x in-memory -> wall {sample_wall:.2f}x, cpu {sample_cpu:.2f}x "
        f"{'OK' if sample_wall <= 2 else 'MISSED'}"
    )
    ref_total = med(ref_runs, "wall", "step total")
    step_ok = "OK" if total_wall <= 1.5 * ref_total else "MISSED"
    print(
        f"target: whole step <= 1.5x in-memory -> wall {total_wall / ref_total:.2f}x, "
        f"cpu {total_cpu / med(ref_runs, 'cpu', 'step total'):.2f}x {step_ok}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
