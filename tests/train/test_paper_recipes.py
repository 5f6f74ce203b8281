"""The paper recipes against the papers' text, and each recipe running one step on a tiny model.

`PAPER` is the LANPO paper's settings (arXiv 2510.16552, ../shared/papers/000_*.txt) these tests hold the
recipes to, and `MEL_PAPER` the MEL paper's (arXiv 2602.10224, 002_*.txt, Section 4): both read from
lanpo/papers.toml (`lanpo.papers`), where each value sits beside the words of the paper it comes from. Where lanpo
counts in other units the test converts: the PPO mini-batch is counted in prompts by the paper (as verl's
ppo_mini_batch_size is) and in sequences by lanpo.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from lanpo import papers
from lanpo.config import load_toml
from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.inference.config import EvalConfig
from lanpo.retrieval.judge import PROMPT_VERSION
from lanpo.train.config import TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "train" / "configs"

# The papers' values, each with its source and quote, from their one home (lanpo/papers.toml)
PAPER = papers.values("lanpo")  # LANPO (arXiv 2510.16552)
# verl's defaults, where the paper trains with verl and is silent (verl/trainer/config/actor/actor.yaml)
VERL = papers.values("verl")
MEL_PAPER = papers.values("mel")  # MEL (arXiv 2602.10224), Section 4
DAPO17K_PROBLEMS = 17_398  # distinct problems of DAPO-Math-17k (the published parquet repeats each ~100 times)
PAPER_RECIPES = {"grpo-baseline": "none", "lanpo-intra": "intra", "lanpo-inter": "inter", "lanpo-both": "both"}
LORA_RECIPES = [f"{name}-lora" for name in PAPER_RECIPES]
TABLE2_RECIPES = ["table2/grpo-retrieval", "table2/lanpo-inter-nofilter", "table2/lanpo-inter-raw"]
TABLE3_RECIPES = ["table3/lanpo-intra-pt025", "table3/lanpo-intra-pt050"]
MEL_RECIPES = ["mel-qwen3-8b"]


def recipe(name: str, overrides: list[str] | None = None, world: int = 8) -> TrainConfig:
    """A recipe whose shapes must hold on one 8-GPU node (the tiny run below is one process)."""
    return load_config(CONFIGS / f"{name}.toml", overrides, world=world)


@pytest.mark.parametrize("name", list(PAPER_RECIPES))
def test_paper_recipe_equals_the_papers_tables(name: str) -> None:
    cfg = recipe(name)
    assert cfg.model.name.endswith(PAPER["base_model"])
    assert cfg.data.dataset == "dapo17k"
    assert cfg.sft.enabled and cfg.sft.data, "RL starts from the SFT model"
    assert (cfg.sft.epochs, cfg.sft.batch_size, cfg.sft.micro_batch_size, cfg.sft.max_length) == (
        PAPER["sft_epochs"],
        PAPER["sft_global_batch"],
        PAPER["sft_micro_batch"],
        PAPER["sft_max_length"],
    )
    assert cfg.steps == PAPER["steps"]
    # the batch the paper does not state: 10 epochs in 330 steps under verl's drop_last is 33 batches an epoch
    assert math.floor(DAPO17K_PROBLEMS / cfg.batch_size) * PAPER["epochs"] == PAPER["steps"]
    assert cfg.grpo.learning_rate == PAPER["learning_rate"]
    assert not cfg.lora.enabled and cfg.model.gradient_checkpointing, "the paper fine-tunes every weight"
    assert cfg.rollout.n == PAPER["rollouts_per_prompt"]
    assert cfg.grpo.minibatch_size == PAPER["ppo_minibatch_prompts"] * cfg.rollout.n  # lanpo counts sequences
    assert cfg.batch_size * cfg.rollout.n // cfg.grpo.minibatch_size == 8  # optimizer steps a training step
    assert (cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens, cfg.summarizer.max_new_tokens) == (
        PAPER["max_prompt_tokens"],
        PAPER["max_response_tokens"],
        PAPER["max_summary_tokens"],
    )
    g = cfg.grpo
    assert (g.eps_low, g.eps_high, g.beta, g.lr_schedule, g.warmup_ratio) == (
        PAPER["clip_low"],
        PAPER["clip_high"],
        PAPER["kl_beta"],
        PAPER["lr_schedule"],
        PAPER["warmup_ratio"],
    )
    assert (g.dual_clip, g.loss_agg, g.ppo_epochs, g.max_grad_norm, g.weight_decay) == (
        VERL["clip_ratio_c"],
        VERL["loss_agg_mode"],
        VERL["ppo_epochs"],
        VERL["grad_clip"],
        VERL["weight_decay"],
    )
    assert cfg.summarizer.max_total_per_step == PAPER["new_experiences_per_step"]  # in all a step
    assert cfg.store.per_problem_cap == PAPER["experiences_per_problem"]
    assert (cfg.eval.dataset, cfg.eval.temperature, cfg.eval.top_p, cfg.eval.k) == (
        PAPER["val_dataset"],
        PAPER["val_temperature"],
        PAPER["val_top_p"],
        PAPER["val_n"],
    )
    assert cfg.feedback.mode == PAPER_RECIPES[name]
    if name == "lanpo-intra":
        assert cfg.feedback.p_t == PAPER["p_t_intra"]
    elif name != "grpo-baseline":
        assert (cfg.feedback.p_t, cfg.feedback.inter.gamma) == (PAPER["p_t"], PAPER["gamma"])
        assert cfg.feedback.inter.scorer == f"Qwen/Qwen2.5-Math-7B-Instruct|{PROMPT_VERSION}"  # the judge's scores
        assert cfg.summarizer.enabled


@pytest.mark.parametrize("name", list(PAPER_RECIPES))
def test_qwen3_14b_recipes_are_the_7b_ones_on_the_papers_second_model(name: str) -> None:
    """Table 1's Qwen3-14B-Base-SFT rows: the 7B recipe with the model changed and nothing else (with the engine
    asleep through the update and bf16 compute, the 14B fits 8 x 80 GB with the 7B's memory settings)."""
    big, small = recipe(f"qwen3-14b/{name}"), recipe(name)
    assert big.model.name == f"Qwen/{PAPER['second_model']}-Base" and big.run_name == f"{name}-qwen3-14b"
    assert replace(big, run_name=small.run_name, model=replace(big.model, name=small.model.name)) == small


def test_table3_recipes_are_lanpo_intra_at_each_feedback_ratio() -> None:
    runs = {
        "grpo-baseline": 0.0,
        "table3/lanpo-intra-pt025": 0.25,
        "table3/lanpo-intra-pt050": 0.5,
        "lanpo-intra": 0.75,
    }
    assert tuple(runs.values()) == PAPER["p_t_ablation"]
    intra = recipe("lanpo-intra")
    for name, p_t in runs.items():
        cfg = recipe(name)
        assert cfg.feedback.p_t == p_t
        if p_t > 0:  # the same run as lanpo-intra but for p_t
            assert cfg.grpo == intra.grpo and cfg.rollout == intra.rollout and cfg.feedback.mode == "intra"
            assert cfg.feedback.k == intra.feedback.k and cfg.steps == intra.steps
    table3 = load_toml(EvalConfig, CONFIGS / "table3" / "eval-table3.toml")
    assert table3.modes == ["zero_shot", "self_correct"] and table3.k_samples == PAPER["eval_mean_at"]
    assert [m.model for m in table3.methods] == [
        f"~/.lanpo/runs/{recipe(n).run_name}/step-{PAPER['steps']:06d}/model" for n in runs
    ]


def test_eval_paper_equals_the_papers_evaluation() -> None:
    cfg = load_toml(EvalConfig, CONFIGS / "eval-paper.toml")
    assert cfg.k_samples == PAPER["eval_mean_at"]
    assert (cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.max_new_tokens) == (
        PAPER["eval_temperature"],
        PAPER["eval_top_p"],
        PAPER["eval_max_tokens"],
    )
    assert [d.name for d in cfg.datasets] == [n.lower() for n in PAPER["eval_datasets"]]
    assert cfg.retrieval.stage1 == "bm25" and cfg.retrieval.gamma == PAPER["gamma"]
    assert cfg.retrieval.judge.startswith("Qwen/Qwen2.5-Math-7B")
    assert cfg.modes == ["zero_shot", "retrieval", "self_correct"]


@pytest.mark.parametrize("size", ["4b", "8b", "14b"])
def test_mel_recipes_equal_the_mel_papers_setup(size: str) -> None:
    cfg = recipe(f"mel-qwen3-{size}")  # on one 8-GPU node, as the paper's 8 x H20
    assert cfg.method == "mel" and cfg.model.name == f"Qwen/{MEL_PAPER['models'][['4b', '8b', '14b'].index(size)]}"
    assert cfg.data.dataset == MEL_PAPER["train_dataset"]
    assert not cfg.lora.enabled and cfg.grpo.learning_rate == MEL_PAPER["learning_rate"]
    assert (cfg.rollout.n, cfg.rollout.temperature, cfg.batch_size) == (
        MEL_PAPER["rollouts_per_prompt"],
        MEL_PAPER["temperature"],
        MEL_PAPER["batch_size"],
    )
    assert cfg.grpo.minibatch_size == MEL_PAPER["minibatch_prompts"] * cfg.rollout.n  # one optimizer step a step
    assert cfg.mel.nll_target == "replay"  # section 3.3: from the context window into parametric memory
    assert cfg.feedback.mode == "none"  # meta-experiences as LANPO feedback: lanpo's addition, off


def test_mel_eval_has_the_mel_papers_benchmarks_and_metrics() -> None:
    cfg = load_toml(EvalConfig, CONFIGS / "eval-mel.toml")
    assert tuple(d.name for d in cfg.datasets) == MEL_PAPER["eval_datasets"]
    assert (cfg.k_samples, cfg.sampling.temperature, cfg.pass_at_1) == (
        MEL_PAPER["eval_k"],
        MEL_PAPER["eval_temperature"],
        True,
    )
    assert cfg.modes == ["zero_shot"]


def test_lora_variants_and_table2_recipes_depart_only_where_they_say() -> None:
    for name, mode in PAPER_RECIPES.items():
        paper, lora = recipe(name), recipe(f"{name}-lora")
        assert (lora.lora.r, lora.grpo.learning_rate, lora.run_name) == (64, 1e-5, f"{name}-lora")
        assert lora.lora.enabled
        assert lora.feedback == paper.feedback and lora.steps == paper.steps
        assert lora.rollout.vllm.max_lora_rank == 64  # the engine's LoRA slots for r 64: the rollout's one change
        assert lora.rollout == replace(paper.rollout, vllm=replace(paper.rollout.vllm, max_lora_rank=64))
        assert lora.feedback.mode == mode
    inter = recipe("lanpo-inter")
    nofilter, raw, grpo = (recipe(n) for n in ("table2/lanpo-inter-nofilter", "table2/lanpo-inter-raw",
                                              "table2/grpo-retrieval"))  # fmt: skip
    assert nofilter.feedback.inter.gamma == 0.0 and nofilter.grpo == inter.grpo and nofilter.rollout == inter.rollout
    assert raw.feedback.inter.shows == "response" and raw.feedback.inter.gamma == inter.feedback.inter.gamma
    assert grpo.feedback.mode == "none" and grpo.summarizer.enabled and grpo.summarizer.always
    assert grpo.grpo == recipe("grpo-baseline").grpo


TABLE2_RUNS = {"grpo": "table2/grpo-retrieval", "lanpo-inter": "lanpo-inter",
               "nofilter": "table2/lanpo-inter-nofilter", "raw": "table2/lanpo-inter-raw"}  # fmt: skip
TABLE4_RUNS = {"grpo": "table2/grpo-retrieval"}


def checkpoint_of(name: str) -> str:
    """Where the recipe's run leaves its last policy: a whole model folder (every weight trains)."""
    cfg = recipe(name)
    assert not cfg.lora.enabled
    return f"~/.lanpo/runs/{cfg.run_name}/step-{cfg.steps:06d}/model"


def test_table2_and_table4_evals_point_at_what_the_runs_write() -> None:
    cfg = load_toml(EvalConfig, CONFIGS / "table2" / "eval-table2.toml")
    assert [m.name for m in cfg.methods] == list(TABLE2_RUNS)
    assert cfg.modes == ["zero_shot", "retrieval"] and cfg.k_samples == PAPER["eval_mean_at"]
    for method in cfg.methods:
        assert (method.model, method.adapter) == (checkpoint_of(TABLE2_RUNS[method.name]), None), method.name
        assert method.pool == recipe(TABLE2_RUNS[method.name]).run_name  # each retrieves from its own run's pool
    table4 = load_toml(EvalConfig, CONFIGS / "table4" / "eval-table4.toml")
    assert table4.modes == ["retrieval", "self_correct"] and [m.name for m in table4.methods] == ["sft", "grpo"]
    sft, grpo = table4.methods
    assert (sft.model, sft.adapter) == (None, "runs/sft-start/adapter")  # README: lanpo sft ... --out runs/sft-start
    assert grpo.model == checkpoint_of(TABLE4_RUNS["grpo"]) and sft.pool == grpo.pool == "grpo-retrieval"


def _tiny(tmp_path: Path) -> list[str]:
    """The recipe as written, with the tiny model, tiny lengths and a tiny batch of the same shape."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n"
            for q, a in (("What is 1 + 1?", "\\boxed{2}"), ("What is 2 + 2?", "\\boxed{4}"))
        )
    )
    return [
        "model.name='tiny-random'",
        "model.threads=1",
        "rollout.backend='hf'",  # the recipes sample with vLLM, which loads a model folder; the tiny model has none
        "steps=1",
        "batch_size=2",
        "rollout.n=2",
        "grpo.minibatch_size=2",  # = 1 prompt x n: two optimizer steps a step, as the recipe's 512 / 64
        "grpo.micro_batch_size=4",
        "rollout.max_new_tokens=8",
        "rollout.max_prompt_tokens=512",
        "summarizer.max_new_tokens=8",
        "summarizer.min_reward=0.0",
        "data.dataset='toy'",
        f"sft.data='{pairs}'",
        "sft.max_length=64",
        "sft.batch_size=2",
        "eval.n=2",
        "eval.k=2",
        "eval.max_new_tokens=8",
        f"output_dir='{tmp_path / 'run'}'",
    ]


def test_the_paper_evals_run_on_checkpoints_laid_out_as_the_recipes_write_them(
    run_cli, db: Engine, toy_problems: list[int], held_out: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """`lanpo eval` with eval-paper.toml and table2/eval-table2.toml as written (their paths under ~/.lanpo), on a
    tiny policy that the grpo-baseline recipe itself trained and checkpointed, copied where each run would leave
    its step-000330."""
    import shutil

    from lanpo.db.repo.pools import ensure_pool
    from lanpo.train.loop import train

    result = train(recipe("grpo-baseline", _tiny(tmp_path), world=1), db=db, progress=False)
    written = result.checkpoint_dir / "step-000001" / "model"
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    runs = {TABLE2_RUNS[m] for m in TABLE2_RUNS} | {"lanpo-both"}
    with transaction(db) as session:
        for name in ("aime25", "amc23", "math500"):  # the benchmarks (aime24: the held_out fixture)
            upsert_problems(session, name, [Question(f"{name}-1", "What is 3 + 4?", "7")])
        for name in runs:
            folder = Path(checkpoint_of(name)).expanduser()
            shutil.copytree(written, folder)
            ensure_pool(session, recipe(name).run_name, recipe(name).store)  # empty: retrieval answers zero-shot
    tiny = ["backend='hf'", "retrieval.judge='none'", "k_samples=1", "sampling.max_new_tokens=4", "batch_size=4"]
    paper = run_cli(
        "eval", "--config", CONFIGS / "eval-paper.toml", "--no-progress",
        "--set", f"model='{Path(checkpoint_of('lanpo-both')).expanduser()}'", "--set", "retrieval.pool='lanpo-both'",
        "--set", "run_name='eval-lanpo-both'", "--set", f"out_dir='{tmp_path / 'paper'}'",
        *[a for t in tiny for a in ("--set", t)],
    )  # fmt: skip
    assert paper.code == 0, paper.err
    assert "| aime24 | aime25 | amc23 | math500 | Average |" in paper.out and "| Self-correct |" in paper.out
    table2 = run_cli(
        "eval", "--config", CONFIGS / "table2" / "eval-table2.toml", "--no-progress",
        "--set", "run_name='table2'", "--set", f"out_dir='{tmp_path / 'table2'}'",
        *[a for t in tiny for a in ("--set", t)],
    )  # fmt: skip
    assert table2.code == 0, table2.err
    for method in TABLE2_RUNS:
        assert f"{method}/zero_shot" in (tmp_path / "table2" / "table.csv").read_text(), method


@pytest.fixture
def held_out(db: Engine) -> None:
    """The recipes validate on `aime25` (LANPO, Figure 5(a)) or `aime24` (MEL): two problems of each, apart
    from the toy training set."""
    with transaction(db) as session:
        for name in ("aime24", "aime25"):
            upsert_problems(session, name, [Question("a1", "What is 40 + 2?", "42"), Question("a2", "7 * 6?", "42")])


@pytest.mark.parametrize("name", [*PAPER_RECIPES, *LORA_RECIPES, *TABLE2_RECIPES, *TABLE3_RECIPES, *MEL_RECIPES])
def test_recipe_runs_one_step_on_a_tiny_model(
    name: str, db: Engine, toy_problems: list[int], held_out: None, tmp_path: Path
) -> None:
    """The recipe as written, with the tiny model, tiny lengths and a tiny batch of the same shape; its SFT start
    is trained from a two-pair file first."""
    from lanpo.train.loop import train

    tiny = _tiny(tmp_path)
    cfg = recipe(name, tiny, world=1)
    if cfg.feedback.mode in ("inter", "both") and cfg.feedback.inter.gamma > 0:
        cfg.feedback.inter.scorer = "test"  # the toy problems' scores; the recipe names the paper's judge
    result = train(cfg, db=db, progress=False)
    assert result.steps == [1]
    assert result.metrics[0]["reward/mean"] >= 0.0


@pytest.mark.parametrize("name", ["table2/lanpo-inter-nofilter", "table2/lanpo-inter-raw"])
def test_table2_inter_ablations_draw_in_training(
    name: str, db: Engine, toy_problems: list[int], held_out: None, tmp_path: Path
) -> None:
    """Two tiny steps: step 1 fills the pool, step 2's inter prompts draw from it -- with no relevance read at
    all (gamma = 0: the recipe names no scorer the toy store has), or showing raw rollouts."""
    import sqlalchemy as sa

    from lanpo.train.loop import train

    cfg = recipe(
        name,
        [
            "model.name='tiny-random'", "model.threads=1", "rollout.backend='hf'", "steps=2", "batch_size=2",
            "rollout.n=2", "grpo.minibatch_size=4", "rollout.max_new_tokens=8", "summarizer.max_new_tokens=32",
            "summarizer.min_reward=0.0", "summarizer.require_format=false",  # a random model writes no lesson
            "feedback.p_t=1.0", "data.dataset='toy'", "sft.enabled=false", "eval.every=0",
            f"output_dir='{tmp_path / 'run'}'",
        ],
        world=1,
    )  # fmt: skip
    if cfg.feedback.inter.gamma > 0:
        cfg.feedback.inter.scorer = "test"
    train(cfg, db=db, progress=False)
    with db.connect() as conn:
        groups = conn.execute(
            sa.text(
                "SELECT g.prompt, g.prompt_version, count(c.*) AS contexts FROM rollout_groups g "
                "LEFT JOIN group_contexts c ON c.group_id = g.id WHERE g.step = 2 AND g.mode = 'inter' "
                "GROUP BY g.id"
            )
        ).all()
    assert groups and all(g.contexts > 0 for g in groups)
    if name.endswith("raw"):
        assert {g.prompt_version for g in groups} == {"inter-raw-v1"}
        assert all("### Solution 1" in g.prompt for g in groups)
    else:
        assert {g.prompt_version for g in groups} == {"inter-v1"}
