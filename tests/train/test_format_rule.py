"""`reward.format_rule` from the config to the producer's grading, and the recipes' rules against the papers' text.

The model is scripted (a tiny random one never writes a header); the rest is the real producer: the step's prompts,
`produce` generating, grading with the run's rule, and the graded rewards the update would read. The recipes' values
are tied to the papers' words in lanpo/papers.toml, and those words are checked against the paper texts.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest

from lanpo import papers
from lanpo.errors import ConfigError
from lanpo.feedback.contexts import StepPrompts
from lanpo.rollout import Completion, SamplingParams
from lanpo.train.config import RewardConfig, load_config
from lanpo.train.parts import Sampler
from lanpo.train.plumbing.dist import Dist
from lanpo.train.plumbing.timing import Phases
from lanpo.train.producer.produce import produce
from tests.train.conftest import tiny_config

CONFIGS = Path(__file__).resolve().parents[2] / "train" / "configs"
PAPER_TEXTS = Path(__file__).resolve().parents[3] / "shared" / "papers"
WRONG_FORMATTED = "## Review\nthe sum was off\n## Solution\n44 + 27 = 61 \\boxed{61}"  # intra's headers, wrong
RIGHT_PLAIN = "44 + 27 = 71 \\boxed{71}"


class ScriptedModel:
    """Stands in for the model only: every prompt's n rollouts are one formatted wrong answer and one plain right."""

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        texts = [WRONG_FORMATTED, RIGHT_PLAIN][:n]
        return [[Completion(t, (1,) * len(t.split()), (2, 3), "stop") for t in texts] for _ in prompts]


@pytest.mark.parametrize(("rule", "wrong_formatted"), [("paper", 0.1), ("correct_only", 0.0)])
def test_the_rule_reaches_the_producers_grading(tmp_path: Path, rule: str, wrong_formatted: float) -> None:
    cfg = tiny_config(tmp_path, reward=RewardConfig(format_rule=rule))
    prompts = StepPrompts(
        problem_ids=[1, 2], questions=["What is 44 + 27?"] * 2, answers=["71"] * 2, asked=["intra", "zero_shot"],
        modes=["intra", "zero_shot"], texts=["p1", "p2"], items=[[], []], policy_version_id=1,
    )  # fmt: skip
    phase = Phases(SimpleNamespace(generating=nullcontext), step=1)
    got = produce(cfg, Sampler(ScriptedModel(), None, Dist()), None, 1, prompts, phase)
    # intra: the wrong answer in intra's format, then the right one unformatted; zero_shot: no bonus under any rule
    assert [g.reward for g in got.graded] == pytest.approx([wrong_formatted, 1.0, 0.0, 1.0])
    assert [g.format_ok for g in got.graded] == [True, False, False, False]


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"reward.format_rule must be one of paper, correct_only"):
        RewardConfig(format_rule="headers")


def _in_paper(paper: str, quote: str) -> bool:
    name = {"lanpo": "000_", "mel": "002_"}[paper]
    (text,) = [p.read_text(encoding="utf-8") for p in PAPER_TEXTS.glob(f"{name}*.txt")]
    return " ".join(quote.split()) in " ".join(text.split())


@pytest.mark.skipif(not PAPER_TEXTS.exists(), reason="the paper texts are not beside the repository")
def test_the_format_entries_quote_the_papers() -> None:
    """The words lanpo/papers.toml cites for the format reward are the papers' own (Table 6, appendix 10.3; MEL
    Section 4)."""
    for paper, key in (("lanpo", "format_rule"), ("lanpo", "format_bonus"), ("mel", "reward")):
        entry = next(e for e in papers.entries(paper) if e.key == key)
        assert _in_paper(paper, entry.quote), (paper, key)
    assert _in_paper("lanpo", "Reward Function\tCorrectness Reward Plus Format Reward")  # Table 6


PAPER_RULE = ["grpo-baseline", "lanpo-intra", "lanpo-inter", "lanpo-both", "grpo-baseline-lora", "lanpo-both-lora",
              "table2/grpo-retrieval", "table2/lanpo-inter-nofilter", "table2/lanpo-inter-raw",
              "table3/lanpo-intra-pt025", "table3/lanpo-intra-pt050"]  # fmt: skip
MEL_RECIPES = ["mel-qwen3-4b", "mel-qwen3-8b", "mel-qwen3-14b"]
CPU_RECIPES = ["demo-cpu", "learn-cpu", "mel-demo-cpu", "sft-demo"]


@pytest.mark.parametrize("name", PAPER_RULE + MEL_RECIPES + CPU_RECIPES)
def test_recipes_use_the_papers_rule_and_the_cpu_ones_correct_only(name: str) -> None:
    cfg = load_config(CONFIGS / f"{name}.toml", world=8 if name not in CPU_RECIPES else 1)
    if name in CPU_RECIPES:
        assert cfg.reward.format_rule == "correct_only"  # the paper's rule was gamed there (docs/results.md)
        return
    assert cfg.reward.format_rule == papers.values("lanpo")["format_rule"] == "paper"
    if name in MEL_RECIPES:  # MEL's 0/1 reward: zero-shot rollouts, which no rule pays a bonus
        assert cfg.feedback.mode == "none" and papers.values("mel")["reward"] == "correctness"
