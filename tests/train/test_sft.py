"""SFT warm start: worked solutions, the chat pairs for the three skills, JSONL I/O, a tiny training run + CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lanpo import prompts
from lanpo.errors import InputError
from lanpo.rewards import correctness_reward, format_ok
from lanpo.train.config import LoraConfig, ModelConfig, SFTConfig, TrainConfig
from lanpo.train.sft.warm_start import expression_steps, read_pairs, run_sft, sft_pairs, worked_solution, write_pairs


def test_expression_steps_respect_precedence_and_signs() -> None:
    assert expression_steps("4 - 1 + 7") == (["4 - 1 = 3", "3 + 7 = 10"], "10")
    assert expression_steps("3 + 4 * 2") == (["4 * 2 = 8", "3 + 8 = 11"], "11")
    assert expression_steps("2 - -1") == (["2 - -1 = 3"], "3")
    assert expression_steps("1 / 0") is None
    assert expression_steps("import os") is None


def test_worked_solutions_end_boxed_and_are_graded_correct() -> None:
    gsm = worked_solution("q", "560", {"solution": "160-48=112\n112*5=560\n#### 560"})
    arith = worked_solution("q", "10", {"source": {"expression": "4 - 1 + 7"}})
    assert gsm is not None and gsm.endswith("\\boxed{560}.") and "####" not in gsm
    assert arith is not None and correctness_reward([arith], "10") == [1.0]
    assert worked_solution("q", "11", {"source": {"expression": "4 - 1 + 7"}}) is None  # disagrees with gold
    assert worked_solution("q", "3", {}) is None


def test_pairs_cover_the_three_skills_with_their_headers() -> None:
    problems = [
        {"question": f"Calculate {i} + 2.", "answer": str(i + 2), "metadata": {"source": {"expression": f"{i} + 2"}}}
        for i in range(3)
    ]
    pairs = sft_pairs(problems, seed=1)
    assert len(pairs) == 3 * 4
    by_kind: dict[str, list[str]] = {"intra": [], "inter": [], "summary": [], "zero_shot": []}
    for pair in pairs:
        user, reply = pair["messages"][-2]["content"], pair["messages"][-1]["content"]
        assert pair["messages"][-1]["role"] == "assistant"
        kind = (
            "intra"
            if "earlier attempts" in user
            else "inter"
            if "lessons learned" in user
            else "summary"
            if "Distil" in user
            else "zero_shot"
        )
        by_kind[kind].append(reply)
    assert {k: len(v) for k, v in by_kind.items()} == {"intra": 3, "inter": 3, "summary": 3, "zero_shot": 3}
    assert all(format_ok(r, "intra") for r in by_kind["intra"])
    assert all(format_ok(r, "inter") for r in by_kind["inter"])
    assert all(prompts.has_headers(r, prompts.SUMMARY_HEADERS) for r in by_kind["summary"])
    assert len(sft_pairs(problems, skill_problems=1)) == 3 + 3


def _summary_and_inter_pairs(pairs: list[dict]) -> tuple[dict[str, str], dict[str, str]]:
    """question -> summary target, question -> the lesson its exploration pair shows."""
    summaries, shown = {}, {}
    for pair in pairs:
        user, reply = pair["messages"][-2]["content"], pair["messages"][-1]["content"]
        if user.startswith("Problem:\n"):
            summaries[user.split("\n")[1]] = reply
        elif "lessons learned" in user:
            shown[user.split("\n\n")[0]] = user.split("### Lesson 1\n")[1].split("\n\nDecide")[0]
    return summaries, shown


def test_each_summary_target_is_its_own_problems_lesson_with_none_of_its_numbers() -> None:
    from lanpo.data.generate import generate_problems

    # the learning recipe's task (two terms of one or two digits), the way `problems_for_sft` builds them
    records = generate_problems("chain_sum", n=64, seed=1000, options={"min_terms": 2, "max_terms": 2,
                                                                        "min_digits": 1, "max_digits": 2})  # fmt: skip
    problems = [{"question": r["question"], "answer": r["answer"], "metadata": r} for r in records]
    summaries, shown = _summary_and_inter_pairs(sft_pairs(problems, seed=0))
    answers = {p["question"]: str(p["answer"]) for p in problems}
    assert len(summaries) == len({p["question"] for p in problems}) >= 60
    assert len(set(summaries.values())) == len(summaries)  # no target is a copy of another
    for question, target in summaries.items():
        assert prompts.has_summary_format(target), target
        assert prompts.repeated_numbers(target, question, answers[question]) == [], (question, target)
        assert "\n\n" not in target  # a scaffolded section ends at a blank line: the targets have none
    # the exploration pairs show lessons of other problems, as the store does, never the problem's own
    assert set(shown) == set(summaries)
    assert all(shown[q] != summaries[q] and shown[q] in summaries.values() for q in shown)
    # what the lessons say follows the solution: an addition with a carry and a subtraction below zero differ
    carry = summaries[
        next(
            q
            for q in summaries
            if "+" in q and sum(int(t) % 10 for t in q.split("=")[0].split(":")[1].split("+")) >= 10
        )
    ]
    below = summaries[next(q for q in summaries if answers[q].startswith("-"))]
    assert "carr" in carry.lower() and "minus sign" in below.lower() and "carr" not in below.lower()


def test_pairs_jsonl_round_trip_and_bad_lines(tmp_path: Path) -> None:
    pairs = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\\boxed{1}"}]}]
    write_pairs(pairs, tmp_path / "p.jsonl")
    assert read_pairs(tmp_path / "p.jsonl") == pairs
    (tmp_path / "bad.jsonl").write_text(json.dumps(pairs[0]) + "\n" + json.dumps({"messages": [{"role": "user"}]}))
    with pytest.raises(InputError, match=r"bad\.jsonl:2"):
        read_pairs(tmp_path / "bad.jsonl")


def _tiny(tmp_path: Path) -> TrainConfig:
    return TrainConfig(
        run_name="sft-tiny",
        output_dir=str(tmp_path / "out"),
        model=ModelConfig(name="tiny-random", threads=1),
        lora=LoraConfig(r=4, alpha=8),
        sft=SFTConfig(enabled=True, max_steps=3, batch_size=2, max_length=128, learning_rate=1e-2),
    )


def test_run_sft_trains_the_adapter_and_records_the_loss_curve(db, tmp_path: Path) -> None:
    pairs = [
        {"messages": [{"role": "user", "content": f"{i}+1?"}, {"role": "assistant", "content": f"\\boxed{{{i + 1}}}"}]}
        for i in range(6)
    ]
    result = run_sft(_tiny(tmp_path), pairs, db=db)
    assert len(result.losses) == 3 and result.losses[-1] < result.losses[0]
    assert (result.adapter_dir / "adapter_config.json").exists()
    with db.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT r.kind, count(m.*) FROM runs r JOIN run_metrics m ON m.run_id = r.id GROUP BY r.kind"
        ).all()
    assert [tuple(r) for r in rows] == [("sft", 3)]


def test_sft_cli_on_a_pairs_file(run_cli, tmp_path: Path) -> None:
    pairs = [{"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "\\boxed{2}"}]}] * 4
    write_pairs(pairs, tmp_path / "pairs.jsonl")
    config = tmp_path / "c.toml"
    config.write_text(
        f'run_name = "cli-sft"\noutput_dir = "{tmp_path / "out"}"\n[model]\nname = "tiny-random"\nthreads = 1\n'
        "[lora]\nr = 4\nalpha = 8\n[sft]\nmax_steps = 2\nbatch_size = 2\n"
    )
    result = run_cli("sft", "--config", config, "--data", tmp_path / "pairs.jsonl", "--no-db")
    assert result.code == 0, result.err
    assert "4 pairs, 2 steps" in result.out and "adapter:" in result.out
    assert (tmp_path / "out" / "sft" / "adapter" / "adapter_config.json").exists()


def test_micro_batches_accumulate_to_the_whole_batch(tmp_path: Path) -> None:
    """sft.micro_batch_size (Table 5's per-GPU micro-batch of 1) changes memory, not the update: one pair per
    forward with gradients accumulated gives the adapter and the loss curve of each batch taken whole."""
    from tests.train import multirank_workers as w

    whole, whole_losses = w.sft(0, 1, tmp_path / "whole", ddp=False)
    micro, micro_losses = w.sft(0, 1, tmp_path / "micro", ddp=False, micro_batch_size=1)
    assert micro_losses == pytest.approx(whole_losses, rel=1e-5) and len(whole_losses) == 6
    start = {n: p.detach() for n, p in w.policy()[0].named_parameters() if p.requires_grad}
    for name in whole:
        assert torch.allclose(micro[name], whole[name], rtol=1e-4, atol=1e-6), name
    assert any(not torch.equal(whole[n], start[n]) for n in whole)


def test_the_learning_recipes_sft_file_is_what_its_command_writes() -> None:
    from lanpo.train.config import load_config
    from lanpo.train.sft.pairs import problems_for_sft

    root = Path(__file__).resolve().parents[2]
    recipe = root / "train/configs/learn-cpu.toml"
    assert "--set sft.n_problems=160 --set sft.skill_problems=16" in recipe.read_text()
    cfg = load_config(recipe, ["sft.n_problems=160", "sft.skill_problems=16"])
    built = sft_pairs(problems_for_sft(cfg), seed=cfg.sft.seed, skill_problems=cfg.sft.skill_problems)
    assert read_pairs(root / cfg.sft.data) == built
