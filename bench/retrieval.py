"""Retrieval benchmark: lanpo's stage 1 and relevance judge against their references, side by side.

Corpus: `--n` experience summaries (paper scale: 544,000 = 17,000 problems x 32) written from templates around
real reasoning-gym questions of ten tasks (flow of thought, principles, pitfalls, with the problem's own words
and numbers), plus held-out questions of the same tasks as queries.

  bm25    lanpo BM25Index (idf=okapi: exact BM25Okapi) vs rank-bm25 BM25Okapi on the same tokens: build time,
          query p50/p99 (rank-bm25 on `--ref-queries` only: it takes seconds per query at this size), and
          whether the top-10 lists agree (same ids, same order).
  vector  the corpus loaded into a private embedded Postgres (real lanpo schema: problems, experiences,
          experience_versions), the HNSW index built, then lanpo's pool vector search (the SQL the code runs)
          at several ef_search vs the same query as an exact scan: recall@10 and p50/p99.
  hybrid  lanpo's pool search with RRF of BM25 (index built from the store) and HNSW: p50/p99.
  scorer  the SmolLM2 relevance judge on CPU: pairs/s one pair per forward vs batched.

Run:  python bench/retrieval.py                      (everything, paper scale; tens of minutes on 2 cores)
      python bench/retrieval.py --n 100000 --only bm25,scorer
      python bench/retrieval.py --vectors minilm --n 50000 --only vector,hybrid
"""

from __future__ import annotations

import argparse
import os
import random
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TASKS = [
    "basic_arithmetic", "chain_sum", "gsm_symbolic", "simple_equations", "leg_counting",
    "fraction_simplification", "prime_factorization", "gcd", "lcm", "time_intervals",
]  # fmt: skip
FLOWS = [
    "Restate what is asked, list the given quantities {nums}, then combine them step by step.",
    "Identify the unknown, write one equation from the {words} relation and solve it carefully.",
    "Work left to right over {nums}, keeping a running total and checking each partial result.",
    "Translate the {words} description into arithmetic, compute, and re-read the question before answering.",
    "Break the problem into small steps; track units for {words}; verify the final value against {nums}.",
]
PRINCIPLES = [
    "Keep signs attached to their numbers when subtracting.",
    "Multiplication and division bind tighter than addition and subtraction.",
    "Divide both sides by the coefficient only after moving the constant term.",
    "Use the prime factorisation to find the greatest common divisor and least common multiple.",
    "Convert times to seconds before subtracting, then convert back to HH:MM:SS.",
    "Count per item first (legs per animal), then multiply by how many there are.",
    "Simplify a fraction by dividing numerator and denominator by their gcd.",
    "Write the final answer in the requested format inside \\boxed{{}}.",
    "Check the answer by substituting it back into the original statement.",
    "Quantities described as 'times as much' multiply; 'more than' adds.",
]
PITFALLS = [
    "Dropping a minus sign in the middle of a long chain.",
    "Answering an intermediate quantity instead of what was asked.",
    "Forgetting to carry when adding multi-digit numbers.",
    "Mixing up the gcd and the lcm.",
    "Rounding too early.",
    "Misreading which item a 'times as much' refers to.",
    "Reporting minutes where seconds were asked.",
    "Stopping before the fraction is fully reduced.",
]
STOP = {"the", "a", "an", "of", "to", "is", "and", "in", "what", "how", "many", "your", "are", "there", "for", "be"}


def generate_questions(n: int, seed: int) -> list[tuple[str, str]]:
    """(task, question) from reasoning-gym, round-robin over TASKS, seeded."""
    import reasoning_gym

    per_task = -(-n // len(TASKS))
    out: list[tuple[str, str]] = []
    for t, task in enumerate(TASKS):
        dataset = reasoning_gym.create_dataset(task, size=per_task, seed=seed * 100 + t)
        out.extend((task, dataset[i]["question"]) for i in range(per_task))
    random.Random(seed).shuffle(out)
    return out[:n]


def summary_for(rng: random.Random, task: str, question: str) -> str:
    """One experience summary about `question`: flow of thought, principles, pitfalls, in the problem's terms."""
    nums = re.findall(r"\d+", question)[:4] or ["the given values"]
    words = [w for w in re.findall(r"[a-zA-Z]{3,}", question.lower()) if w not in STOP]
    topic = " ".join(rng.sample(words, min(3, len(words)))) or task.replace("_", " ")
    flow = rng.choice(FLOWS).format(nums=", ".join(nums), words=topic)
    principles = " ".join(rng.sample(PRINCIPLES, 2))
    return (
        f"Task {task.replace('_', ' ')} about {topic}. Flow of thought: {flow} "
        f"Principles: {principles} Pitfalls: {rng.choice(PITFALLS)}"
    )


def make_corpus(n: int, n_problems: int, seed: int) -> tuple[list[tuple[str, str]], np.ndarray, list[str]]:
    """Problems, the problem index of each summary (n // n_problems per problem), and the summaries."""
    problems = generate_questions(n_problems, seed)
    rng = random.Random(seed)
    owners = np.arange(n) % n_problems
    texts = [summary_for(rng, *problems[p]) for p in owners]
    return problems, owners, texts


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(f"{c:.4g}" if isinstance(c, float) else str(c) for c in row) + " |")


# --------------------------------------------------------------------------- BM25


def bench_bm25(texts: list[str], queries: list[str], ref_queries: int) -> None:
    import bm25s
    from rank_bm25 import BM25Okapi

    from lanpo.retrieval.bm25 import BM25Index, tokenize, top_k_positions

    tokens, t_tok = timed(lambda: [tokenize(t) for t in texts])
    ours, t_ours = timed(lambda: BM25Index(texts, idf="okapi"))  # includes its own tokenising; rank-bm25's idf
    ref, t_ref = timed(lambda: BM25Okapi(tokens))  # type: ignore[arg-type]
    other = bm25s.BM25()  # its default (lucene idf): fast, but not BM25Okapi's numbers
    _, t_other = timed(lambda: other.index(tokens, show_progress=False))  # type: ignore[arg-type]
    ids = np.arange(len(texts))
    lat: dict[str, list[float]] = {"ref": [], "ours": [], "bm25s": []}
    agree = {"ours": 0, "ours_set": 0, "bm25s": 0}
    for i, q in enumerate(queries):
        top, dt = timed(lambda q=q: ours.top_k(q, 10))  # type: ignore[union-attr]
        lat["ours"].append(dt)
        other_scores, dt = timed(lambda q=q: other.get_scores(tokenize(q) or [""]))
        lat["bm25s"].append(dt)
        if i < ref_queries:
            scores, dt_ref = timed(lambda q=q: ref.get_scores(tokenize(q)))  # type: ignore[union-attr]
            lat["ref"].append(dt_ref)
            ref_ids = [doc for doc, _ in top_k_positions(np.asarray(scores), 10, ids)]
            ours_ids = [doc for doc, _ in top]  # type: ignore[union-attr]
            agree["ours"] += ours_ids == ref_ids
            agree["ours_set"] += set(ours_ids) == set(ref_ids)
            agree["bm25s"] += [d for d, _ in top_k_positions(np.asarray(other_scores), 10, ids)] == ref_ids
    n_ref = min(ref_queries, len(queries))

    def ratio(q: float) -> str:
        return f"{pct(lat['ref'], q) / pct(lat['ours'], q):.0f}x"

    table(
        f"BM25, {len(texts):,} summaries; rank-bm25 timed on {n_ref} queries, the others on {len(queries)}",
        ["", "rank-bm25 BM25Okapi (reference)", "lanpo BM25Index", "lanpo vs reference", "bm25s 0.3 (lucene)"],
        [
            ["build (s)", t_ref + t_tok, t_ours, f"{(t_ref + t_tok) / t_ours:.1f}x", t_other + t_tok],
            ["query p50 (ms)", pct(lat["ref"], 50), pct(lat["ours"], 50), ratio(50), pct(lat["bm25s"], 50)],
            ["query p99 (ms)", pct(lat["ref"], 99), pct(lat["ours"], 99), ratio(99), pct(lat["bm25s"], 99)],
            ["top-10 = reference (ids and order)", "-", f"{agree['ours']}/{n_ref}", "", f"{agree['bm25s']}/{n_ref}"],
            ["top-10 set = reference", "-", f"{agree['ours_set']}/{n_ref}", "", ""],
        ],
    )


# --------------------------------------------------------------------------- store load (vector, hybrid)


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


def corpus_vectors(kind: str, owners: np.ndarray, texts: list[str], n_problems: int, dim: int, seed: int
                   ) -> tuple[np.ndarray, Callable[[int, list[str]], np.ndarray]]:  # fmt: skip
    """Vectors for the corpus, and a function making `n` query vectors (for the held-out `queries`).

    random:    i.i.d. unit vectors (no structure: the worst case for any ANN index).
    clustered: task -> problem -> summary hierarchy like real embeddings (cosine ~0.7 problem-to-task,
               ~0.8 summary-to-problem); a query is a new question close to one existing problem.
    minilm:    all-MiniLM-L6-v2 of the texts and queries (slow on CPU: use a small --n).
    """
    rng = np.random.default_rng(seed)
    if kind == "random":
        return _unit(rng.normal(size=(len(texts), dim))), lambda n, _q: _unit(rng.normal(size=(n, dim)))
    if kind == "minilm":
        from lanpo.retrieval.embeddings import SentenceTransformerEmbedder

        model = SentenceTransformerEmbedder()
        return model.encode(texts, batch_size=128), lambda _n, q: model.encode(q, batch_size=128)
    noise = 1.0 / np.sqrt(dim)  # a N(0, I/d) vector has norm ~1
    tasks = _unit(rng.normal(size=(len(TASKS), dim)))
    problems = _unit(tasks[np.arange(n_problems) % len(TASKS)] + rng.normal(scale=noise, size=(n_problems, dim)))
    vectors = _unit(problems[owners] + 0.7 * rng.normal(scale=noise, size=(len(owners), dim)))

    def queries(n: int, _q: list[str]) -> np.ndarray:
        near = problems[rng.integers(0, n_problems, size=n)]
        return _unit(near + 0.9 * rng.normal(scale=noise, size=(n, dim)))

    return vectors, queries


def load_store(db: object, problems: list[tuple[str, str]], owners: np.ndarray, texts: list[str],
               vectors: np.ndarray, dataset: str, pool_id: int) -> None:  # fmt: skip
    """Bulk-load problems, experiences of pool `pool_id` and versions (binary COPY), then build the HNSW index."""
    import sqlalchemy as sa
    from pgvector.psycopg import register_vector

    with db.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(sa.text("DROP INDEX IF EXISTS ix_experience_versions_embedding_hnsw"))
    raw = db.raw_connection()  # type: ignore[attr-defined]
    pg = raw.driver_connection
    register_vector(pg)
    start = time.perf_counter()
    with pg.cursor() as cur:
        with cur.copy("COPY problems (dataset, external_id, question) FROM STDIN") as copy:
            for i, (_task, question) in enumerate(problems):
                copy.write_row((dataset, str(i), question))
        cur.execute("SELECT id FROM problems WHERE dataset = %s ORDER BY id", (dataset,))
        problem_ids = np.array([r[0] for r in cur.fetchall()])
        cur.execute("SELECT coalesce(max(id), 0) FROM experiences")
        first = cur.fetchone()[0]
        with cur.copy("COPY experiences (pool_id, problem_id, reward) FROM STDIN") as copy:
            for p in owners:
                copy.write_row((pool_id, int(problem_ids[p]), 1.0))
        cur.execute("SELECT id FROM experiences WHERE id > %s ORDER BY id", (first,))
        experience_ids = [r[0] for r in cur.fetchall()]
        assert len(experience_ids) == len(texts)
        with cur.copy(
            "COPY experience_versions (experience_id, version, summary, embedding) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(["int8", "int4", "text", "vector"])
            for e, text, v in zip(experience_ids, texts, vectors, strict=True):
                copy.write_row((e, 1, text, v))
    pg.commit()
    print(f"loaded {len(problems):,} problems and {len(texts):,} experiences in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    with pg.cursor() as cur:
        cur.execute("SET maintenance_work_mem = '4GB'")
        cur.execute("SET max_parallel_maintenance_workers = 1")
        cur.execute(
            "CREATE INDEX ix_experience_versions_embedding_hnsw ON experience_versions "
            "USING hnsw (embedding vector_cosine_ops)"
        )
        cur.execute("ANALYZE problems; ANALYZE experiences; ANALYZE experience_versions")
    pg.commit()
    raw.close()
    print(f"built HNSW (m=16, ef_construction=64) over {len(texts):,} vectors in {time.perf_counter() - start:.1f} s")


def bench_vector(db: object, pool_id: int, query_vectors: np.ndarray, ef_values: Sequence[int], n_exact: int) -> None:
    from sqlalchemy.orm import Session

    from lanpo.retrieval.vector import search_pool

    with Session(db) as session:  # type: ignore[arg-type]
        exact, exact_lat = [], []
        for q in query_vectors[:n_exact]:
            hits, dt = timed(lambda q=q: search_pool(session, q, 10, pool_id=pool_id, exact=True))
            session.rollback()
            exact.append([h[0] for h in hits])  # type: ignore[union-attr]
            exact_lat.append(dt)
        rows: list[list[object]] = [["exact scan", 1.0, pct(exact_lat, 50), pct(exact_lat, 99)]]
        for ef in ef_values:
            lat, recall = [], []
            for i, q in enumerate(query_vectors):
                hits, dt = timed(lambda q=q, ef=ef: search_pool(session, q, 10, pool_id=pool_id, ef_search=ef))
                session.rollback()
                lat.append(dt)
                if i < n_exact:
                    found = {h[0] for h in hits}  # type: ignore[union-attr]
                    recall.append(len(found & set(exact[i])) / max(1, len(exact[i])))
            rows.append([f"HNSW ef_search={ef}", float(np.mean(recall)), pct(lat, 50), pct(lat, 99)])
    table(
        f"Vector search over the pool (lanpo's SQL: active, latest version; recall on {n_exact} queries, "
        f"latency on {len(query_vectors)})",
        ["method", "recall@10", "p50 (ms)", "p99 (ms)"],
        rows,
    )


def bench_hybrid(db: object, pool_id: int, queries: list[str], query_vectors: np.ndarray) -> None:
    from sqlalchemy.orm import Session

    from lanpo.retrieval.corpus import BM25Cache, pool_key
    from lanpo.retrieval.search import SearchParams, search_pool

    cache = BM25Cache(max_staleness_s=3600.0)  # the pool does not change here: time the searches themselves
    rows: list[list[object]] = []
    with Session(db) as session:  # type: ignore[arg-type]
        _, t_build = timed(lambda: cache.pool(session, pool_id))
        _, t_key = timed(lambda: pool_key(session, pool_id))
        session.rollback()
        for stage1 in ("bm25", "vector", "hybrid"):
            lat = []
            for q, v in zip(queries, query_vectors, strict=False):
                _, dt = timed(
                    lambda q=q, v=v, s=stage1: search_pool(session, q, 16, pool_id=pool_id, query_vector=v,
                                                           params=SearchParams(s), cache=cache)
                )  # fmt: skip
                session.rollback()
                lat.append(dt)
            rows.append([stage1, pct(lat, 50), pct(lat, 99)])
    print(
        f"\npool BM25 index built from the store in {t_build:.1f} s; pool-state check per lookup {t_key * 1000:.1f} ms"
    )
    table(f"Pool search, top-16, {len(queries)} queries (pool-state check skipped inside the staleness window)",
          ["stage1", "p50 (ms)", "p99 (ms)"], rows)  # fmt: skip


# --------------------------------------------------------------------------- scorer


def bench_scorer(pairs: list[tuple[str, str]], batch_size: int, judge: str = "smollm2") -> None:
    import torch

    from lanpo.retrieval.judge import load_judge

    rater = load_judge(judge, device="cpu", dtype="float32")
    rater.score(pairs[:2], batch_size=2)  # warm-up
    rows: list[list[object]] = []
    base: tuple[float, float] | None = None
    settings = [
        ("one pair per forward", 1, False),
        (f"batch {batch_size}, whole prompts", batch_size, False),
        (f"batch {batch_size}, shared problem prefix (default)", batch_size, True),
    ]
    results = []
    for label, size, share in settings:
        cpu = time.process_time()
        scores, dt = timed(lambda size=size, share=share: rater.score(pairs, batch_size=size, share_prefix=share))
        cpu = time.process_time() - cpu
        results.append(scores)
        rate = len(pairs) / dt
        base = base or (rate, cpu)
        rows.append([label, rate, f"{rate / base[0]:.2f}x", cpu / len(pairs), f"{base[1] / cpu:.2f}x"])
    drift = max(abs(a - b) for other in results[1:] for a, b in zip(results[0], other, strict=True))  # type: ignore[arg-type]
    judge_name = "SmolLM2-135M" if judge == "smollm2" else judge
    table(
        f"Relevance judge {judge_name} on CPU ({torch.get_num_threads()} threads), {len(pairs)} pairs "
        f"({len({p for p, _ in pairs})} problems x {len(pairs) // len({p for p, _ in pairs})} candidates); "
        f"max score difference between settings {drift:.1e}",
        ["", "pairs/s (wall)", "vs one pair per forward", "CPU s per pair", "CPU vs one pair per forward"],
        rows,
    )


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=544_000, help="summaries in the corpus (paper: 544,000)")
    parser.add_argument("--problems", type=int, default=17_000, help="problems they belong to (paper: 17,000)")
    parser.add_argument("--queries", type=int, default=500, help="held-out questions timed on lanpo's engines")
    parser.add_argument("--ref-queries", type=int, default=20, help="of those, timed on rank-bm25 too")
    parser.add_argument(
        "--vectors", choices=["clustered", "random", "minilm"], default="clustered", help="embeddings to load"
    )
    parser.add_argument("--vector-queries", type=int, default=200, help="queries timed on HNSW")
    parser.add_argument("--exact-queries", type=int, default=30, help="of those, also run as an exact scan")
    parser.add_argument("--ef", default="40,100,200", help="HNSW ef_search values")
    parser.add_argument("--scorer-problems", type=int, default=2, help="problems the judge scores (x --top-k)")
    parser.add_argument("--top-k", type=int, default=16, help="candidates per problem, as in relevance build")
    parser.add_argument("--only", default="bm25,vector,hybrid,scorer", help="sections to run")
    parser.add_argument("--home", type=Path, default=None, help="LANPO_HOME of the bench's own Postgres (temp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--judge", default="smollm2", help="the scorer's model: smollm2, tiny-random, a folder")
    args = parser.parse_args()
    only = set(args.only.split(","))

    (problems, owners, texts), t_gen = timed(lambda: make_corpus(args.n, min(args.problems, args.n), args.seed))
    queries = [q for _, q in generate_questions(max(args.queries, args.vector_queries), args.seed + 1)]
    print(f"corpus: {len(texts):,} summaries over {len(problems):,} problems, generated in {t_gen:.1f} s")
    print(f"example summary: {texts[0]}")
    print(f"example query:   {queries[0]}")

    if "bm25" in only:
        bench_bm25(texts, queries[: args.queries], args.ref_queries)
    if only & {"vector", "hybrid"}:
        from lanpo.db import migrate, server
        from lanpo.db.connection import make_db

        home = args.home or Path(tempfile.mkdtemp(prefix="lanpo-bench-"))
        db = make_db(server.start(home))
        migrate.upgrade(db)
        dataset = f"bench-{args.n}-{args.vectors}-{args.seed}"
        import sqlalchemy as sa

        from lanpo.config import StoreConfig
        from lanpo.db.connection import transaction
        from lanpo.db.repo.pools import ensure_pool

        with transaction(db) as session:  # the pool the corpus lives in, named like its dataset
            pool_id = ensure_pool(session, dataset, StoreConfig()).id
        with db.connect() as conn:
            loaded = conn.scalar(sa.text("SELECT count(*) FROM problems WHERE dataset = :d"), {"d": dataset})
        (vectors, make_queries), t_embed = timed(
            lambda: corpus_vectors(args.vectors, owners, texts, len(problems), 384, args.seed)
        )
        if not loaded:
            print(f"{args.vectors} vectors for {len(texts):,} summaries in {t_embed:.1f} s")
            load_store(db, problems, owners, texts, vectors, dataset, pool_id)  # type: ignore[arg-type]
        query_vectors = make_queries(args.vector_queries, queries[: args.vector_queries])
        if "vector" in only:
            ef_values = [int(x) for x in args.ef.split(",")]
            bench_vector(db, pool_id, query_vectors, ef_values, args.exact_queries)
        if "hybrid" in only:
            bench_hybrid(db, pool_id, queries[: args.vector_queries], query_vectors)
        db.dispose()
        if args.home is None:
            server.stop(home)
    if "scorer" in only:
        # As in `lanpo relevance build`: each problem against its top-k candidates (here: other problems' text).
        rng = random.Random(args.seed)
        pairs = [(q, rng.choice(problems)[1]) for q in queries[: args.scorer_problems] for _ in range(args.top_k)]
        bench_scorer(pairs, args.top_k, args.judge)


if __name__ == "__main__":
    main()
