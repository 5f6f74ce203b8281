"""The intra gate (`feedback.intra.gate = "value"` or `"thompson"`): a run serves its own earlier attempts only while
they are not known to hurt, or in proportion to the chance that they help.

The value rule puts each inter lesson on probation (docs/concepts.md, "Lessons on probation"); the intra contexts
have no lesson to judge: an intra item is the run's own earlier attempt, new each step. What can be judged is the
mode itself, in this run: does answering with one's earlier attempts in the prompt do better than answering alone?
Modes are drawn at random per problem (`lanpo.feedback.schedule.choose_modes`), so among the problems that could
have been served intra at a step (the run had attempted them before), the groups served zero-shot are a randomised
control share for the groups served intra. The gate's evidence (sql/queries/intra_gate_groups.sql) is the run's
graded intra and control groups over the baseline window of the run's pool, the steps step - 4h .. version_step
(h: `store.baseline_half_life`, what the store already uses to estimate a lesson use's baseline; version_step: the
newest step whose training has finished, so its groups are committed and a resumed step reads the same evidence),
each group weighted 0.5 ^ ((step - its step) / h). Per side (intra I, control C), over its groups' accuracies a_g:

    mean = sum w a / sum w,     var = max(sum w^2 (a - mean)^2 / (sum w)^2 * G / (G - 1), sum w^2 v_g / (sum w)^2)

(v_g: the Beta(hits + 1, misses + 1) variance of a group's accuracy; the spread between groups, problems of
different difficulty, is the honest error of a mean over problems, and the Beta term its floor when there are one or
two). The intra mode's lift is mean_I - mean_C, variance var_I + var_C; its value is the value rule's
(`lanpo.db.repo.sampling.lesson_value`, prior N(0, feedback.inter.prior_sd^2), its mean plus 1.96 posterior standard
deviations): with no evidence (h = 0, a side with no group) it is untried and worth 1.96 prior_sd, so the gate is
open. While the value is below `feedback.inter.value_bound` the gate is closed: a prompt that asks for intra is
rendered zero-shot and counted as `feedback/missed/intra_hurts`. A closed gate gathers no new intra evidence, so it
opens again once the last intra groups have left the window (4 half-lives), and the run tries intra again under the
policy it has become.

`"thompson"` serves intra in proportion to the chance that it helps: Thompson sampling between two arms, zero-shot
(its lift over itself is 0, known) and intra (its lift unknown, posterior N(m, s^2) under the same prior and
evidence: m and s are the value rule's at z = 0 and its step per unit z). Each prompt that asks for intra draws a
lift from that posterior and is served intra iff the draw is at least `value_bound`: served with probability
share = Phi((m - value_bound) / s), decided by a uniform keyed by (the step's draw seed, the problem), so a rerun and
the arms of one seed decide alike. Untried (the prior alone, bound 0) it serves half the prompts that ask, where the
value rule serves all of them; as evidence that intra hurts comes in its share falls towards 0 without ever
reaching it, so it keeps gathering evidence at a cost that shrinks with the evidence. `"value"` is the same rule
with the share 1 or 0 (the upper bound at or above the bound, or not).

Bias: the control groups include problems whose intra draw would have found attempts, so they are comparable; but
the comparison is of the mode as drawn (its k items, its template) against zero-shot, not of any one attempt. And
it is what the mode did to accuracy, not to learning: a mode whose rollouts score lower may still teach. The gate is
lanpo's, not the paper's (LANPO serves intra at p_t regardless); the paper's recipes keep it off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.repo.sampling import VALUE_Z, lesson_value
from lanpo.seeds import mix_seed

GATES = ("none", "value", "thompson")  # feedback.intra.gate
WINDOW_HALF_LIVES = 4  # the evidence window, in half-lives: the store's baseline window (usefulness_uses_recompute)


@dataclass(frozen=True)
class GroupGrade:
    """One graded rollout group of the gate's evidence."""

    mode: str  # intra | zero_shot
    step: int
    n: int  # graded attempts
    hits: int


@dataclass(frozen=True)
class IntraGate:
    """The gate at one step: the intra mode's estimated lift over its control share, and whether intra is served."""

    lift: float | None  # None: no evidence (no window, or a side without a group)
    sd: float  # its standard error (0 with no evidence)
    intra_groups: int
    control_groups: int
    value: float  # the value rule's upper bound on the lift
    share: float  # the chance that a prompt asking for intra is served: 1 or 0 (value), Phi((m - bound) / s)

    @property
    def open(self) -> bool:
        """Whether any prompt that asks for intra may be served."""
        return self.share > 0.0

    def serves(self, draw_seed: int, problem_id: int) -> bool:
        """Whether the prompt of `problem_id` that asks for intra at the step drawn with `draw_seed` is served it: a
        uniform keyed by the two below `share` (always under value's 1, never under its 0)."""
        return mix_seed(draw_seed, "intra-gate", problem_id) / 2.0**63 < self.share

    def metrics(self) -> dict[str, float]:
        """`feedback/intra_gate/*`: the estimate the step's decision read (lift and its sd only with evidence)."""
        out = {
            "feedback/intra_gate/open": float(self.open),
            "feedback/intra_gate/share": self.share,
            "feedback/intra_gate/value": self.value,
            "feedback/intra_gate/intra_groups": float(self.intra_groups),
            "feedback/intra_gate/control_groups": float(self.control_groups),
        }
        if self.lift is not None:
            out |= {"feedback/intra_gate/lift": self.lift, "feedback/intra_gate/lift_sd": self.sd}
        return out


def _side(groups: Sequence[GroupGrade], step: int, h: float) -> tuple[float, float]:
    """The weighted mean accuracy of `groups` and its variance (module docstring)."""
    w = [0.5 ** ((step - g.step) / h) for g in groups]
    a = [g.hits / g.n for g in groups]
    total = sum(w)
    mean = sum(wi * ai for wi, ai in zip(w, a, strict=True)) / total
    beta = [(g.hits + 1.0) * (g.n - g.hits + 1.0) / ((g.n + 2.0) ** 2 * (g.n + 3.0)) for g in groups]
    within = sum(wi * wi * vi for wi, vi in zip(w, beta, strict=True)) / total**2
    if len(groups) < 2:
        return mean, within
    spread = sum(wi * wi * (ai - mean) ** 2 for wi, ai in zip(w, a, strict=True)) / total**2
    return mean, max(within, spread * len(groups) / (len(groups) - 1))


def estimate(
    groups: Sequence[GroupGrade],
    step: int,
    h: float,
    prior_sd: float,
    bound: float,
    z: float = VALUE_Z,
    rule: str = "value",
) -> IntraGate:
    """The gate at `step` from its evidence `groups` (already inside the window), under `rule` (value | thompson)."""
    intra = [g for g in groups if g.mode == "intra"]
    control = [g for g in groups if g.mode == "zero_shot"]
    lift, var, graded = None, 0.0, 0.0  # untried: the prior alone
    if h > 0 and intra and control:
        mi, vi = _side(intra, step, h)
        mc, vc = _side(control, step, h)
        lift, var, graded = mi - mc, vi + vc, 1.0
    mean = lesson_value(graded, lift or 0.0, var, prior_sd, 0.0)  # the posterior's mean and standard deviation
    sd = lesson_value(graded, lift or 0.0, var, prior_sd, 1.0) - mean
    value = mean + z * sd  # = lesson_value(graded, lift, var, prior_sd, z)
    thompson = NormalDist().cdf((mean - bound) / sd)  # P(lift >= bound) under the posterior
    share = thompson if rule == "thompson" else float(value >= bound)
    return IntraGate(lift, math.sqrt(var), len(intra), len(control), value, share)


def intra_gate(
    session: Session,
    run_id: int,
    step: int,
    version_step: int,
    h: float,
    prior_sd: float,
    bound: float,
    rule: str = "value",
) -> IntraGate:
    """The gate of run `run_id` at `step` under `rule`, from its groups at steps max(1, step - 4h) .. version_step
    (none read when h = 0: no window, the mode untried)."""
    if h <= 0:
        return estimate((), step, h, prior_sd, bound, rule=rule)
    lo = max(1, math.ceil(step - WINDOW_HALF_LIVES * h))
    rows = session.execute(
        sqlfiles.load("queries/intra_gate_groups"), {"run_id": run_id, "lo": lo, "hi": min(version_step, step - 1)}
    ).all()
    groups = [GroupGrade(r.mode, r.step, r.n, r.hits) for r in rows]
    return estimate(groups, step, h, prior_sd, bound, rule=rule)
