"""Benchmark: does the store learn which lessons help? lanpo's trainer on the simulated policy (`rollout.backend =
"sim"`, lanpo.rollout.sim), whose lessons' true effects are set by a table, so every estimate can be checked.

A fifth of the lessons the sim writes help by +0.3, a fifth hurt by -0.3, the rest do nothing; each problem's
zero-shot chance is uniform in 0.2..0.8; relevance between problems is uniform in 0.5..1 (gamma 0.6 gates). Each
arm is a real training run (tiny model, the real loop, admission, capacity under `store.global_cap` with
`lowest_utility` eviction, retirement below 0, the SQL estimator of every use's baseline), one pool each, and
differs from the others in `feedback.inter.rank` and `prior` only:

- relevance: the paper's ranking (relevance, then recency);
- value: lessons on probation (an upper confidence bound on lift; untried ones optimistic; below 0 never drawn);
- value-pool: the same, the bound's prior centred on the pool's graded lessons' mean lift (`feedback.inter.prior =
  "pool"`, empirical Bayes) instead of 0.

Per arm, over the inter prompts of the second half of the run (when the store has had time to learn):
- gain: the mean of p(correct | the lessons drawn) - p(correct | none), by the table (0 for a prompt that asked for
  lessons and was answered zero-shot); oracle: the same with the k best lessons the pool held for that prompt
  (active, relevant at gamma, of another problem); share = gain / oracle;
- rank corr: Spearman's correlation of each lesson's estimated lift (lesson_history, current version) with its true
  effect, over the run's lessons with at least `store.min_uses` known uses (helped + hurt + even), and with 4+;
  with three tied true values in shares 0.2 / 0.6 / 0.2 a perfect ordering scores sqrt(1 - 0.2^3 - 0.6^3 - 0.2^3) =
  0.88, not 1;
- helpful kept: of the helpful lessons with `min_uses` known uses, the share no cap evicted; helpful retired: how
  many of them were retired as harmful (a false retirement); harmful retired: the share of the known harmful ones
  retired.

    python bench/value.py                              # 40 problems, 60 steps of 8 x 16 rollouts, three arms, seed 0
    python bench/value.py --seeds 0 1 2
    python bench/value.py --seeds 0 1 2 --n 16          # at the paper's group size (Table 7)
    python bench/value.py --steps 4 --problems 12      # the smoke

Uses its own embedded Postgres in a temporary folder, or a new database on $LANPO_DATABASE_URL's server.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa
from pool_ops import bench_database
from scipy.stats import spearmanr

from lanpo.config import StoreConfig
from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, problem_ids, upsert_problems
from lanpo.db.repo.sampling import VALUE_PRIOR_SD
from lanpo.feedback.config import DataConfig, FeedbackConfig, InterConfig, SummarizerConfig
from lanpo.feedback.schedule import batch_problem_ids, choose_modes
from lanpo.rollout.sim import SimTable, tags_in
from lanpo.train.config import GRPOConfig, LoraConfig, ModelConfig, RolloutConfig, TrainConfig
from lanpo.train.loop import train

ARMS = ("relevance", "value", "value-pool")
RANKING = {"relevance": ("relevance", "zero"), "value": ("value", "zero"), "value-pool": ("value", "pool")}
GAMMA, K, P_T = 0.6, 2, 0.5


def make_problems(db: sa.Engine, n: int) -> tuple[list[int], dict[int, str]]:
    """n sums in dataset `sim` (and 4 in `sim-val`), and a relevance score for every ordered pair (scorer `sim`)."""
    rows = [Question(str(i), f"What is {i} + {i + 11}?", str(2 * i + 11)) for i in range(n)]
    with transaction(db) as session:
        upsert_problems(session, "sim", rows)
        upsert_problems(
            session, "sim-val", [Question(str(i), f"What is {i} + 1000?", str(i + 1000)) for i in range(4)]
        )
        ids = problem_ids(session, "sim")
        session.execute(
            sa.text(
                "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) "
                "SELECT a.id, b.id, 'sim', 0.5 + 0.5 * ((hashtext(a.id || '/' || b.id) & 65535) / 65536.0) "
                "FROM problems a JOIN problems b ON a.id <> b.id AND a.dataset = 'sim' AND b.dataset = 'sim'"
            ),
        )
        questions = dict(session.execute(sa.text("SELECT id, question FROM problems WHERE dataset = 'sim'")).all())
    return ids, questions


def config(arm: str, seed: int, steps: int, batch: int, n: int, out: Path, prior_sd: float) -> TrainConfig:
    return TrainConfig(
        run_name=f"{arm}-{seed}",
        steps=steps,
        batch_size=batch,
        seed=seed,
        output_dir=str(out / f"{arm}-{seed}"),
        model=ModelConfig(name="tiny-random", threads=1),
        lora=LoraConfig(r=4, alpha=8),
        data=DataConfig(dataset="sim"),
        rollout=RolloutConfig(backend="sim", n=n, max_new_tokens=200, sim=SimTable(seed=seed)),
        grpo=GRPOConfig(learning_rate=1e-4, warmup_ratio=0.0),
        feedback=FeedbackConfig(
            mode="inter",
            p_t=P_T,
            k=K,
            candidates=8,
            inter=InterConfig(
                gamma=GAMMA, scorer="sim", rank=RANKING[arm][0], prior_sd=prior_sd, prior=RANKING[arm][1]
            ),
        ),
        summarizer=SummarizerConfig(min_reward=1.0, max_new_tokens=400, max_new_per_step=1, max_total_per_step=3),
        store=StoreConfig(global_cap=40, eviction="lowest_utility", min_uses=2, retire_below=0.0),
    )


def measure(db: sa.Engine, cfg: TrainConfig, ids: list[int], questions: dict[int, str]) -> dict[str, float]:
    table = cfg.rollout.sim
    with db.connect() as conn:
        run_id, pool_id = conn.execute(
            sa.text("SELECT id, pool_id FROM runs WHERE name = :n"), {"n": cfg.run_name}
        ).one()
        groups = conn.execute(
            sa.text("SELECT step, problem_id, mode, prompt FROM rollout_groups WHERE run_id = :r ORDER BY id"),
            {"r": run_id},
        ).all()
        lessons = conn.execute(
            sa.text(
                "SELECT h.experience_id, h.source_problem_id, h.summary, h.graded, h.lift, h.evicted_by, "
                "  h.helped + h.hurt + h.even AS known_uses, "
                "  (SELECT min(v.step) FROM experience_versions v WHERE v.experience_id = h.experience_id) AS born, "
                "  h.evicted_step FROM lesson_history h WHERE h.pool_id = :p AND h.is_current"
            ),
            {"p": pool_id},
        ).all()
        relevant = conn.execute(
            sa.text(
                "SELECT problem_id, candidate_problem_id FROM relevance_scores WHERE scorer = 'sim' AND score >= :g"
            ),
            {"g": GAMMA},
        ).all()
    near = {(p, c) for p, c in relevant}
    effect = {lesson.experience_id: sum(table.effect_of(t) for t in tags_in(lesson.summary)) for lesson in lessons}
    gains, oracles = [], []
    by_step: dict[int, dict[int, tuple[str, str]]] = {}
    for g in groups:
        by_step.setdefault(g.step, {})[g.problem_id] = (g.mode, g.prompt)
    for step in range(cfg.steps // 2 + 1, cfg.steps + 1):
        pids = batch_problem_ids(ids, cfg.batch_size, cfg.seed, step)
        for pid, asked in zip(pids, choose_modes(pids, "inter", P_T, cfg.seed, step), strict=True):
            if asked != "inter" or pid not in by_step.get(step, {}):
                continue
            mode, prompt = by_step[step][pid]
            q = questions[pid]
            base = table.p_correct(q, [])
            gains.append(table.p_correct(q, tags_in(prompt)) - base if mode == "inter" else 0.0)
            held = [
                lesson
                for lesson in lessons
                if lesson.born is not None
                and lesson.born < step
                and (lesson.evicted_step is None or lesson.evicted_step >= step)
                and (pid, lesson.source_problem_id) in near
            ]
            best = sorted((tag for lesson in held for tag in tags_in(lesson.summary)), key=table.effect_of)[::-1][:K]
            oracles.append(table.p_correct(q, best) - base)
    min_uses = cfg.store.min_uses
    known = [lesson for lesson in lessons if lesson.known_uses >= min_uses]
    helpful = [lesson for lesson in known if effect[lesson.experience_id] > 0]
    harmful = [lesson for lesson in known if effect[lesson.experience_id] < 0]
    capacity = [h for h in helpful if h.evicted_by and h.evicted_by.split(":")[0] in ("global", "per_problem")]
    return {
        "prompts": len(gains),
        "gain": statistics.fmean(gains) if gains else float("nan"),
        "oracle": statistics.fmean(oracles) if oracles else float("nan"),
        "corr": _spearman(known, effect),
        "known": len(known),
        "corr_4": _spearman([lesson for lesson in known if lesson.known_uses >= 4], effect),
        "known_4": sum(lesson.known_uses >= 4 for lesson in known),
        # of the helpful lessons known (min_uses known uses), the share no cap evicted
        "helpful_kept": 1 - len(capacity) / len(helpful) if helpful else float("nan"),
        "helpful": len(helpful),
        "helpful_retired": sum(h.evicted_by == "retired:harmful" for h in helpful),
        "harmful_retired": sum(h.evicted_by == "retired:harmful" for h in harmful) / len(harmful) if harmful else 0.0,
        "lessons": len(lessons),
    }


def _spearman(lessons: list, effect: dict[int, float]) -> float:
    """Spearman's correlation of the lessons' estimated lifts with their true effects (nan under 3 lessons)."""
    if len(lessons) < 3:
        return float("nan")
    return float(spearmanr([x.lift for x in lessons], [effect[x.experience_id] for x in lessons]).statistic)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=40)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--n", type=int, default=16, help="rollouts per prompt (the paper's group size, Table 7: 16)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="the arms to run")
    parser.add_argument(
        "--prior-sd",
        type=float,
        default=VALUE_PRIOR_SD,
        help="the value arms' prior_sd (default: lanpo's, the value rule's)",
    )
    args = parser.parse_args()
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in args.arms}
    with bench_database() as db, tempfile.TemporaryDirectory(prefix="lanpo-value-") as out:
        ids, questions = make_problems(db, args.problems)
        for seed in args.seeds:
            for arm in args.arms:  # interleaved: every arm of a seed, then the next seed
                cfg = config(arm, seed, args.steps, args.batch, args.n, Path(out), args.prior_sd)
                started = time.perf_counter()
                train(cfg, db=db, progress=False)
                rows[arm].append(measure(db, cfg, ids, questions))
                print(f"seed {seed} {arm}: {rows[arm][-1]} ({time.perf_counter() - started:.0f} s)", flush=True)
    shape = f"{args.problems} problems, {args.steps} steps of {args.batch} x {args.n} rollouts"
    print(f"\n{shape}, seeds {args.seeds}; medians")
    print(
        "| arm | inter prompts | gain | oracle gain | share of oracle | rank corr (lessons) | rank corr, 4+ uses "
        "| helpful kept | helpful retired | harmful retired |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for arm in args.arms:
        r = rows[arm]
        med = {key: statistics.median(x[key] for x in r) for key in r[0]}
        share = med["gain"] / med["oracle"] if med["oracle"] else float("nan")
        print(
            f"| {arm} | {med['prompts']:.0f} | {med['gain']:+.3f} | {med['oracle']:+.3f} | "
            f"{share:.2f} | {med['corr']:.2f} ({med['known']:.0f}) | {med['corr_4']:.2f} ({med['known_4']:.0f}) | "
            f"{med['helpful_kept']:.2f} ({med['helpful']:.0f}) | {med['helpful_retired']:.0f} | "
            f"{med['harmful_retired']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
