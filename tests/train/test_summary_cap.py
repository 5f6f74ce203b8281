"""The cap on lessons a step: LANPO appendix 9.2, "we set the maximum number of feedback saved in each step to be 8"
(../shared/papers/000_*.txt), read as 8 in total (`summarizer.max_total_per_step`) by the paper recipes, and per
problem (`summarizer.max_new_per_step`) as an option.

Which candidates a cap keeps is checked against a reference written another way (each candidate's round, then the
step's order), at, below and above the cap; across gloo ranks against the one-process choice; and through a real
training step, whose stored lessons are counted against the attempts that qualified."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch
import torch.multiprocessing as mp
from sqlalchemy.engine import Engine

from lanpo.feedback import schedule, summarize
from lanpo.feedback.summarize import Candidate, choose_candidates
from lanpo.train.config import RolloutConfig, SummarizerConfig, load_config
from lanpo.train.plan import make_plan
from lanpo.train.plan_shapes import model_shape
from lanpo.train.plan_tokens import step_generation, summaries_per_step
from tests.train import summary_cap_ranks as ranks
from tests.train.conftest import tiny_config
from tests.train.test_summary_admission import GOOD, _Replies

CONFIGS = Path(__file__).resolve().parents[2] / "train" / "configs"
PAPER_CAP = ranks.PAPER_CAP


def reference(candidates: list[Candidate], per_problem: int, total: int) -> list[int]:
    """The indices a cap keeps, written another way: a problem's distinct responses ranked (best reward, then
    earliest), the first `per_problem` of them; each kept one's round is its rank; then every round-0 lesson in
    the step's order (a problem's first index), then round 1, ...: the first `total`."""
    places: dict[int, int] = {}
    for c in candidates:
        places[c.problem_id] = min(places.get(c.problem_id, c.index), c.index)
    ranked: list[tuple[int, int, int]] = []  # (round, place of its problem, index)
    for pid in places:
        mine = sorted((c for c in candidates if c.problem_id == pid), key=lambda c: (-c.reward, c.index))
        seen: list[str] = []
        for c in mine:
            if c.response.strip() not in seen and len(seen) < per_problem:
                ranked.append((len(seen), places[pid], c.index))
                seen.append(c.response.strip())
    ranked.sort()
    return sorted(i for _, _, i in (ranked[:total] if total else ranked))


@pytest.mark.parametrize("total", [0, 1, PAPER_CAP - 1, PAPER_CAP, PAPER_CAP + 1, 40])
@pytest.mark.parametrize("per_problem", [1, 2, PAPER_CAP])
def test_the_cap_keeps_what_the_reference_keeps(total: int, per_problem: int) -> None:
    rng = random.Random(total * 100 + per_problem)
    for trial in range(40):
        problems = rng.sample(range(100, 200), rng.randrange(1, 14))  # ids in no order: the step's shuffle
        candidates = ranks.step_candidates(problems, rng.choice([1, 4, 16]), rng)
        rng.shuffle(candidates)  # the input's order does not matter
        kept = [c.index for c in choose_candidates(candidates, per_problem, total)]
        assert kept == reference(candidates, per_problem, total), (trial, problems)
        assert total == 0 or len(kept) <= total


def test_below_at_and_above_the_cap_of_8() -> None:
    """Ten problems with two distinct successes each, in the step's order 9, 8, ..., 0 (ids descending): 7, 8 and 9
    candidates are all kept; from 20, the cap keeps one of each of the first 8 problems of the step, not the 8
    lowest ids; at 9 a problem's second only after each problem's first."""
    problems = list(range(9, -1, -1))
    both = [Candidate(2 * g + j, pid, "q", f"way {j}", 1.0) for g, pid in enumerate(problems) for j in range(2)]
    firsts = both[::2]
    for count in (PAPER_CAP - 1, PAPER_CAP, PAPER_CAP + 1):
        assert choose_candidates(firsts[:count], PAPER_CAP, PAPER_CAP) == firsts[: min(count, PAPER_CAP)]
    kept = choose_candidates(both, PAPER_CAP, PAPER_CAP)
    assert [c.problem_id for c in kept] == problems[:PAPER_CAP] and all(c.response == "way 0" for c in kept)
    nine = choose_candidates(both[:16], PAPER_CAP, PAPER_CAP + 1)  # 8 problems, two each: the step's first gets two
    assert Counter(c.problem_id for c in nine) == Counter({**{p: 1 for p in problems[:8]}, 9: 2})
    bonus = [Candidate(0, 9, "q", "way 0", 1.0), Candidate(1, 9, "q", "way 1", 1.1)]  # the second has the bonus
    assert [c.index for c in choose_candidates(bonus, PAPER_CAP, 1)] == [1]


def test_the_paper_recipes_cap_the_step_at_8_in_total() -> None:
    for name in ("grpo-baseline", "lanpo-intra", "lanpo-inter", "lanpo-both", "table2/grpo-retrieval"):
        summarizer = load_config(CONFIGS / f"{name}.toml").summarizer
        assert (summarizer.max_total_per_step, summarizer.max_new_per_step) == (PAPER_CAP, PAPER_CAP), name
    per_problem = load_config(CONFIGS / "lanpo-inter.toml", ["summarizer.max_total_per_step=0"])
    assert per_problem.summarizer.max_total_per_step == 0  # the per-problem reading stays an option


# --------------------------------------------------------------------------- across ranks


def test_ranks_keep_what_one_process_keeps(tmp_path: Path) -> None:
    """3 gloo ranks (3 does not divide 8: a share of ceil(8 / 3) a rank would keep 9): together they keep the
    one-process choice, at most 8, also when every success is on one rank."""
    world, out = 3, tmp_path / "picked.pt"
    mp.start_processes(
        ranks.worker, args=(world, str(tmp_path / "store"), str(out)), nprocs=world, start_method="spawn", join=True
    )
    by_rank = torch.load(out, weights_only=False)
    for name, (candidates, total) in ranks.cases(world).items():
        union = sorted(i for got in by_rank for i in got[name])
        assert union == [c.index for c in choose_candidates(candidates, PAPER_CAP, total)], name
        assert total == 0 or len(union) <= total
    assert len([i for got in by_rank for i in got["one rank succeeds"]]) == PAPER_CAP


# --------------------------------------------------------------------------- through a training step


def test_a_step_with_more_candidates_stores_at_most_8(
    db: Engine, toy_problems: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One `lanpo train` step with the paper recipe's caps: 6 problems x 4 rollouts, every one a candidate
    (min_reward 0), each summary a lesson: 8 lessons stored, two from each of the step's first two problems and
    one from each other, counted against the attempts that qualified."""
    from lanpo.train.loop import train

    real = summarize.summarise
    monkeypatch.setattr(
        "lanpo.feedback.summarize.summarise",
        lambda backend, tokenizer, *args: real(_Replies([GOOD]), tokenizer, *args),
    )  # the summariser's text only: a lesson every time, so each chosen one is admitted
    paper = load_config(CONFIGS / "lanpo-inter.toml").summarizer
    cfg = tiny_config(
        tmp_path, steps=1, batch_size=6, rollout=RolloutConfig(n=4, max_new_tokens=24),
        summarizer=SummarizerConfig(
            min_reward=0.0, max_new_tokens=8, require_format=False,
            max_new_per_step=paper.max_new_per_step, max_total_per_step=paper.max_total_per_step,
        ),
    )  # fmt: skip
    result = train(cfg, db=db, progress=False)
    with db.connect() as conn:
        attempts = conn.execute(
            sa.text(
                "SELECT g.problem_id, a.response FROM attempts a JOIN rollout_groups g ON g.id = a.group_id "
                "WHERE g.run_id = :r AND g.step = 1"
            ),
            {"r": result.run_id},
        ).all()
        stored = conn.execute(
            sa.text("SELECT problem_id FROM experiences WHERE run_id = :r AND step = 1"), {"r": result.run_id}
        ).all()
    distinct = {(a.problem_id, a.response.strip()) for a in attempts}
    assert len(attempts) == 24 and len(distinct) > PAPER_CAP  # more qualified than the cap
    per_problem = Counter(pid for pid, _ in distinct)
    assert min(per_problem.values()) >= 2, per_problem  # each problem could give two
    order = schedule.batch_problem_ids(toy_problems, 6, cfg.seed, 1)  # the step's order
    assert result.metrics[0]["pool/added"] == PAPER_CAP
    assert Counter(r.problem_id for r in stored) == Counter({**{p: 1 for p in order}, order[0]: 2, order[1]: 2})


# --------------------------------------------------------------------------- what the plan counts


def test_the_plan_bounds_a_steps_summaries_by_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    """lanpo-inter at the paper's 512 prompts: 8 summaries of 2,048 tokens a step in total, 4,096 per problem;
    GRPO writes none; `lanpo plan` prints the bound beside the rollouts'."""
    from lanpo.cli import main

    def summary(name: str, overrides: list[str] | None = None) -> tuple[int, int] | None:
        found = [g for g in step_generation(load_config(CONFIGS / f"{name}.toml", overrides)) if g.source == "summary"]
        return (found[0].count, found[0].max_tokens) if found else None

    assert summary("lanpo-inter") == summary("table2/grpo-retrieval") == (PAPER_CAP, 2048)
    assert summary("lanpo-inter", ["summarizer.max_total_per_step=0"]) == (512 * PAPER_CAP, 2048)
    assert summary("grpo-baseline") is None and summary("lanpo-intra") is None  # no lessons: no summariser
    inter = load_config(CONFIGS / "lanpo-inter.toml")
    assert summaries_per_step(inter, 8) == (PAPER_CAP, PAPER_CAP)  # one rank may write all 8
    per_problem = load_config(CONFIGS / "lanpo-inter.toml", ["summarizer.max_total_per_step=0"])
    assert summaries_per_step(per_problem, 8) == (4096, 64 * PAPER_CAP)
    assert main(["plan", "--config", str(CONFIGS / "lanpo-inter.toml"), "--gpus", "8", "--gpu-memory", "79"]) in (
        0,
        None,
    )
    assert "rollout 8,192 x 8,192, summary 8 x 2,048), 22.2 B over 330 steps" in capsys.readouterr().out


@pytest.mark.parametrize(("total", "enabled", "rows"), [(PAPER_CAP, True, 0), (0, True, 64), (0, False, 0)])
def test_the_hf_kv_cache_holds_the_summaries_rows_when_they_are_longer(total: int, enabled: bool, rows: int) -> None:
    """With the hf backend the policy summarises after its rollouts, through the same cache: 64 rows of S = 3,072
    + 8,192 positions, or the summaries' rows of S + 2,048 when more: 8 summaries (the paper's cap) fit in the
    rollouts' rows; per problem a rank has 64 x 8 to write and 64 rows of the longer length."""
    cfg = load_config(
        CONFIGS / "lanpo-inter.toml",
        ["rollout.backend=hf", f"summarizer.max_total_per_step={total}", f"summarizer.enabled={str(enabled).lower()}"],
    )
    shape = model_shape(cfg.model.name)
    kv = next(p for p in make_plan(cfg, shape, 8, 79.0).phases if p.name == "generate").terms["hf KV cache"]
    per_row = shape.num_hidden_layers * 2 * shape.kv_dim * 2  # a = 2: the recipes compute in bf16
    assert kv == max(64 * (3072 + 8192), rows * (3072 + 8192 + 2048)) * per_row
