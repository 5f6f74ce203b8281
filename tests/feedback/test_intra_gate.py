"""The intra gate (`feedback.intra.gate = "value"`, lanpo.feedback.intra_gate): its estimate against a direct numpy
computation, its decision at, below and above the value bound, and a scripted run through the store API (the path
every trainer's rows take) whose intra groups do worse than its zero-shot ones: the gate closes and the run's next
intra prompts go zero-shot, counted as `feedback/missed/intra_hurts`; where intra does better, or with the gate off,
they are served."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from sqlalchemy.engine import Engine

from lanpo.errors import ConfigError
from lanpo.feedback import DataConfig, FeedbackConfig, StoreClient, StoreRunConfig
from lanpo.feedback.config import IntraConfig
from lanpo.feedback.intra_gate import GroupGrade, estimate
from lanpo.models import load_causal_lm
from lanpo.rollout import Completion
from lanpo.seeds import mix_seed

PRIOR_SD = 0.1

# (mode, step, graded, hits): two steps of two intra and two control groups, of problems of unequal difficulty
GROUPS = [
    GroupGrade("intra", 2, 4, 1),
    GroupGrade("intra", 2, 4, 0),
    GroupGrade("zero_shot", 2, 4, 3),
    GroupGrade("zero_shot", 2, 4, 2),
    GroupGrade("intra", 3, 4, 2),
    GroupGrade("zero_shot", 3, 4, 4),
    GroupGrade("zero_shot", 3, 4, 1),
]


def _reference(groups: list[GroupGrade], step: int, h: float) -> tuple[float, float]:
    """The lift and its variance by numpy: weighted means, the between-group spread (ddof 1 in effective terms) and
    the Beta floor, side by side."""
    out = []
    for mode in ("intra", "zero_shot"):
        side = [g for g in groups if g.mode == mode]
        w = np.array([2.0 ** (-(step - g.step) / h) for g in side])
        a = np.array([g.hits / g.n for g in side])
        alpha, beta = np.array([g.hits + 1.0 for g in side]), np.array([g.n - g.hits + 1.0 for g in side])
        v = alpha * beta / ((alpha + beta) ** 2 * (alpha + beta + 1))
        mean = np.average(a, weights=w)
        floor = float(np.sum(w**2 * v) / w.sum() ** 2)
        spread = float(np.sum(w**2 * (a - mean) ** 2) / w.sum() ** 2 * len(side) / (len(side) - 1))
        out.append((mean, max(floor, spread)))
    (mi, vi), (mc, vc) = out
    return mi - mc, vi + vc


def test_the_estimate_matches_a_direct_computation() -> None:
    gate = estimate(GROUPS, step=4, h=2.0, prior_sd=PRIOR_SD, bound=0.0)
    lift, var = _reference(GROUPS, 4, 2.0)
    assert gate.lift == pytest.approx(lift) and gate.sd == pytest.approx(math.sqrt(var))
    assert (gate.intra_groups, gate.control_groups) == (3, 4)
    precision = 1 / PRIOR_SD**2 + 1 / var  # the value rule: posterior mean + 1.96 sd under N(0, prior_sd^2)
    assert gate.value == pytest.approx(lift / var / precision + 1.96 / math.sqrt(precision))
    # intra did worse by a third, but over problems this unequal seven groups leave the bound above 0: still served
    assert lift < -0.3 and gate.value > 0 and gate.open


def test_no_evidence_is_an_untried_mode_and_the_gate_is_open() -> None:
    for groups, h in ((GROUPS, 0.0), ([g for g in GROUPS if g.mode == "intra"], 2.0), ([], 2.0)):
        gate = estimate(groups, step=4, h=h, prior_sd=PRIOR_SD, bound=0.0)
        assert gate.lift is None and gate.open and gate.value == pytest.approx(1.96 * PRIOR_SD)
        assert "feedback/intra_gate/lift" not in gate.metrics()


def test_the_gate_at_below_and_above_its_bound() -> None:
    value = estimate(GROUPS, step=4, h=2.0, prior_sd=PRIOR_SD, bound=0.0).value
    assert estimate(GROUPS, 4, 2.0, PRIOR_SD, bound=value).open  # at the bound: served, as a lesson at it is drawn
    assert estimate(GROUPS, 4, 2.0, PRIOR_SD, bound=value - 1e-9).open
    assert not estimate(GROUPS, 4, 2.0, PRIOR_SD, bound=value + 1e-9).open


def test_an_unknown_gate_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"feedback\.intra\.gate must be one of none, value, thompson, got 'ucb'"):
        IntraConfig(gate="ucb")


def test_thompson_serves_intra_with_the_posterior_chance_that_it_helps() -> None:
    """The share is P(lift >= bound) under the value rule's posterior, computed here from the prior and the
    estimate by hand; untried (the prior alone) it is a half at bound 0, less above it, more below."""
    value = estimate(GROUPS, step=4, h=2.0, prior_sd=PRIOR_SD, bound=0.0)
    lift, var = value.lift, value.sd**2
    precision = 1 / PRIOR_SD**2 + 1 / var
    mean, sd = lift / var / precision, 1 / math.sqrt(precision)
    for bound in (-0.1, 0.0, 0.05):
        gate = estimate(GROUPS, 4, 2.0, PRIOR_SD, bound, rule="thompson")
        assert gate.share == pytest.approx(0.5 * math.erfc((bound - mean) / (sd * math.sqrt(2))))
        assert (gate.lift, gate.value) == (value.lift, value.value) and gate.open
    untried = [estimate([], 4, 2.0, PRIOR_SD, bound, rule="thompson").share for bound in (-0.05, 0.0, 0.05)]
    assert untried[1] == pytest.approx(0.5) and untried[0] > 0.5 > untried[2]
    assert value.share == 1.0 and estimate(GROUPS, 4, 2.0, PRIOR_SD, 1.0).share == 0.0  # the value rule: all or none


def test_thompson_decides_each_problem_by_its_own_key_at_the_share() -> None:
    """Each problem's decision is keyed by (draw seed, problem): the same on a rerun, a new draw at another step, and
    over many problems served at the share's rate; the value rule's share of 1 or 0 serves all or none."""
    gate = estimate(GROUPS, 4, 2.0, PRIOR_SD, 0.0, rule="thompson")
    problems = range(4000)
    served = [gate.serves(11, p) for p in problems]
    assert served == [gate.serves(11, p) for p in problems]
    assert served != [gate.serves(12, p) for p in problems]
    rate, se = sum(served) / len(served), math.sqrt(gate.share * (1 - gate.share) / len(served))
    assert 0.05 < gate.share < 0.95 and abs(rate - gate.share) < 4 * se
    assert all(estimate(GROUPS, 4, 2.0, PRIOR_SD, 0.0).serves(11, p) for p in problems)
    assert not any(estimate(GROUPS, 4, 2.0, PRIOR_SD, 1.0).serves(11, p) for p in problems)


def _scripted_run(db: Engine, name: str, gate: str, intra_right: bool) -> list[dict[str, object]]:
    """Four chain-sum problems, each step's modes scripted: step 1 all zero-shot, steps 2-4 problems 0-1 asking
    for intra and 2-3 zero-shot; the scripted policy answers intra prompts right iff `intra_right` and zero-shot
    ones the other way (three of four rollouts). Per step from 2: the modes served and the feedback metrics."""
    config = StoreRunConfig(
        run_name=name,
        data=DataConfig(dataset="gate-toy", task="chain_sum", n=4, task_options={"min_terms": 2, "max_terms": 2}),
        feedback=FeedbackConfig(mode="intra", p_t=1.0, k=1, candidates=4, intra=IntraConfig(gate=gate)),
    )
    client = StoreClient(config, db)
    _, tokenizer = load_causal_lm("tiny-random")
    run = client.start("scripted")
    problems = client.problem_ids[:4]
    seen = []
    for step in (1, 2, 3, 4):
        asked = ["zero_shot"] * 4 if step == 1 else ["intra", "intra", "zero_shot", "zero_shot"]
        policy = hashlib.sha256(f"{name} {step}".encode()).hexdigest()
        prompts = client.prompts(run, step, problems, tokenizer, policy, asked=asked)
        groups = []
        for text, answer, mode in zip(prompts.texts, prompts.answers, prompts.modes, strict=True):
            good = (mode == "intra") == intra_right
            rights = [good, good, good, not good]
            groups.append([_rollout(tokenizer, text, r, str(answer)) for r in rights])
        client.record(run, step, prompts, groups, client.grade(prompts, groups))
        if step > 1:
            seen.append({"modes": prompts.modes, **prompts.feedback_metrics(4)})
    client.finish(run)
    return seen


def _rollout(tokenizer, prompt: str, right: bool, answer: str) -> Completion:  # type: ignore[no-untyped-def]
    text = f"The sum is \\boxed{{{answer if right else int(answer) + 1}}}."
    ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
    return Completion(text, ids, tuple(tokenizer(prompt, add_special_tokens=False)["input_ids"]), "stop")


def test_intra_that_hurts_stops_being_served(db: Engine) -> None:
    step2, step3, step4 = _scripted_run(db, "gate-hurts", "value", intra_right=False)
    assert step2["modes"][:2] == ["intra", "intra"]  # no intra group yet: untried, served
    assert step2["feedback/intra_gate/open"] == 1.0 and "feedback/intra_gate/lift" not in step2
    assert step3["feedback/intra_gate/lift"] == pytest.approx(-0.5)  # 1/4 right against 3/4
    # two groups a side say little: the bound is still above 0, intra served; by step 4 it is known to hurt
    assert step3["modes"][:2] == ["intra", "intra"] and step3["feedback/intra_gate/value"] > 0
    assert step4["modes"] == ["zero_shot"] * 4 and step4["feedback/intra_gate/open"] == 0.0
    assert step4["feedback/missed/intra_hurts"] == 8 and step4["feedback/missed/no_history"] == 0
    assert step4["feedback/asked/intra"] == 8 and step4["feedback/served/intra"] == 0


def test_thompson_serves_intra_that_hurts_less_and_less(db: Engine) -> None:
    """The same scripted run under Thompson: untried, about half the intra prompts are served (each by its own key);
    once intra is known to hurt its share falls, the prompts it does not serve counted as intra_hurts."""
    steps = _scripted_run(db, "thompson-hurts", "thompson", intra_right=False)
    assert [s["feedback/intra_gate/share"] for s in steps[:2]] == [0.5, 0.5]  # no intra group graded yet
    assert sum(s["feedback/served/intra"] for s in steps[:2]) > 0  # some prompts were served: evidence came in
    # one intra group right 1 in 4 against control groups right 3 in 4: a lift of -0.5 at sd 0.19, share 0.11
    assert steps[2]["feedback/intra_gate/lift"] == pytest.approx(-0.5) and steps[2]["feedback/intra_gate/share"] < 0.2
    for step in steps:
        assert step["feedback/served/intra"] + step["feedback/missed/intra_hurts"] == step["feedback/asked/intra"] == 8


def test_a_prompt_the_gate_keeps_back_with_nothing_to_show_is_counted_as_no_history(db: Engine) -> None:
    """A new run's first step asks intra for eight problems under Thompson: the gate keeps back about half (share
    0.5), but no problem has an earlier attempt, so each is missed as `no_history`, never `intra_hurts`."""
    config = StoreRunConfig(
        run_name="thompson-first",
        data=DataConfig(dataset="gate-toy-8", task="chain_sum", n=8, task_options={"min_terms": 2, "max_terms": 2}),
        feedback=FeedbackConfig(mode="intra", p_t=1.0, k=1, candidates=4, intra=IntraConfig(gate="thompson")),
    )
    client = StoreClient(config, db)
    _, tokenizer = load_causal_lm("tiny-random")
    run = client.start("scripted")
    prompts = client.prompts(run, 1, client.problem_ids, tokenizer, "1" * 64, asked=["intra"] * 8)
    assert prompts.gate is not None and prompts.gate.share == 0.5
    draw_seed = mix_seed(config.seed, "contexts", 1)  # the seed contexted_prompts draws the step with
    assert 0 < sum(not prompts.gate.serves(draw_seed, p) for p in client.problem_ids) < 8  # some kept back
    assert prompts.missed == {"no_history": 8} and prompts.modes == ["zero_shot"] * 8
    client.finish(run)


def test_intra_that_helps_or_an_open_gate_keeps_being_served(db: Engine) -> None:
    *_, helps = _scripted_run(db, "gate-helps", "value", intra_right=True)
    assert helps["modes"][:2] == ["intra", "intra"] and helps["feedback/intra_gate/lift"] == pytest.approx(0.5)
    *_, off = _scripted_run(db, "gate-off", "none", intra_right=False)
    assert off["modes"][:2] == ["intra", "intra"] and "feedback/intra_gate/open" not in off
    assert off["feedback/missed/intra_hurts"] == 0
