"""The modes an attempt is made in, declared once: what each may show the model, whether its context is drawn from the
store, its prompt, and the metrics it is counted under.

Training prompts are `zero_shot` (no context), `intra` (the run's own earlier responses to the same problem: never
their reward, correctness or gold answer) and `inter` (lessons of other problems in the run's pool whose relevance is
at least `feedback.inter.gamma`, paper GAMMA = 0.9; never the same problem, never the relevance score). Held-out
validation answers `val` with the zero-shot prompt; MEL's `replay` re-answers a problem with a lesson as working
memory; test time answers `retrieval` (the inter prompt over retrieved lessons) and `self_correct` (a second turn
after the model's own first answer). `replayed` groups hold stored trajectories trained on again beside a step's
fresh rollouts (lanpo.feedback.replay_draw; never generated, so never a fresh rollout in any curve or cost).
`leaked_intra` is the paper's Fig. 2b arm (`feedback.mode = "leaked-intra"`), which shows the gold answer on purpose
to show leakage: never a default, reached through that setting alone, and skipped by every leakage check by its name
(`LEAKED_MODE`) and no other.

Three tuples, three meanings: `ATTEMPT_MODES` is every mode a stored attempt or group may carry (the schema's CHECKs);
`PROMPT_MODES` the modes a training step's prompt is built in; `CONTEXT_MODES` those whose prompt carries a context
drawn from the store. `FEEDBACK_SETTINGS` is something else again: the values of `feedback.mode` (which context
modes a run asks for, `SETTING_MODES`).

This table is pure (it imports no store: `import lanpo.rewards` loads no SQLAlchemy). The samplers that draw a
context mode's items from the store sit one floor down, beside it: `lanpo.feedback.draw`, one per mode of
`CONTEXT_MODES`.

Adding a mode means an entry in `MODES` here plus a migration that widens the `mode` CHECK of `rollout_groups`
(tests/db/test_feedback_modes_schema.py holds the live schema, and lanpo.db.models' copy of the tuple, which the
store's models keep so that the store imports nothing above it, equal to `ATTEMPT_MODES`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lanpo import prompts
from lanpo.prompts import Message

GAMMA = 0.9  # the paper's minimum relevance r(p, c) of an experience shown, training and test time alike


PromptBuilder = Callable[[str, Sequence[Any], bool], list[Message]]


def _actor(question: str, items: Sequence[Any] = (), shows_response: bool = False) -> list[Message]:
    return prompts.actor_messages(question)


def _intra(question: str, items: Sequence[Any], shows_response: bool = False) -> list[Message]:
    return prompts.intra_messages(question, items)


def _leaked_intra(question: str, items: Sequence[Any], shows_response: bool = False) -> list[Message]:
    return prompts.leaked_intra_messages(question, items)  # `question` already carries the gold answer


LEAKED_MODE = "leaked_intra"  # Fig. 2b's arm: the one mode whose prompt carries the gold answer (by this name only)


@dataclass(frozen=True)
class Mode:
    """One mode: what it may show, how its context is drawn, its prompt, its headers, its metrics."""

    name: str
    shows: str  # what its prompt may show the model
    never: str  # what it must never show
    prompt: PromptBuilder | None  # builds its prompt from (question, context items, shows_response); None: elsewhere
    template: str  # the prompt's version stored with its groups
    drawn: bool = False  # its context is drawn from the store (by its sampler in lanpo.feedback.draw)
    context_field: str | None = None  # the one field of a context item its prompt reads
    headers: tuple[str, ...] = ()  # its prompt asks for these: the format bonus (paper 10.3), use/sections/<mode>
    training: bool = False  # a training step's prompt mode
    metrics: tuple[str, ...] = ()  # the run_metrics names it is counted under
    opt_in: bool = False  # only a run that asks for it counts it: no other run's metrics, figures or reports list it
    served_without_items: bool = False  # its prompt is its own with no item drawn: never re-labelled zero-shot

    @property
    def title(self) -> str:
        """Its name in a figure or a table: zero-shot, intra, inter, ..."""
        return self.name.replace("_", "-")

    def version(self, shows_response: bool = False) -> str:
        """The template version of a prompt in this mode (`shows_response`: inter items are raw solutions)."""
        return prompts.INTER_RAW_VERSION if shows_response and self.name == "inter" else self.template


_STEP_METRICS = ("count/{mode}", "reward/{mode}", "accuracy/{mode}")
_FEEDBACK_METRICS = (
    "feedback/asked/{mode}",
    "feedback/served/{mode}",
    "feedback/truncated/{mode}",
    "feedback/items/all_k/{mode}",
    "feedback/items/fewer_drawn/{mode}",
    "feedback/items/fewer_fitted/{mode}",
)

# lanpo.diagnostics: does a response use its context (the mean over the mode's rollouts; zero_shot: answer_only alone)
_USE_METRICS = ("use/sections/{mode}", "use/echo/{mode}", "use/answer_only/{mode}", "use/answer_copied/{mode}")


def _named(mode: str, patterns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p.format(mode=mode) for p in patterns)


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode(
            "zero_shot",
            "the question only",
            "any context",
            _actor,
            prompts.ACTOR_VERSION,
            training=True,
            metrics=(*_named("zero_shot", _STEP_METRICS), "use/answer_only/zero_shot"),
        ),
        Mode(
            "intra",
            "the model's own earlier responses to the same problem, from this run",
            "their reward, correctness or gold answer; any judgement of them",
            _intra,
            prompts.INTRA_VERSION,
            drawn=True,
            context_field="response",
            headers=prompts.INTRA_HEADERS,
            training=True,
            metrics=_named("intra", _STEP_METRICS + _FEEDBACK_METRICS + _USE_METRICS),
        ),
        Mode(
            "inter",
            "lessons (or, feedback.inter.shows = response, rollouts) of OTHER problems in the run's pool "
            "whose relevance passes gamma",
            "the same problem; the relevance score; any reward",
            prompts.inter_messages,
            prompts.INTER_VERSION,
            drawn=True,
            context_field="summary",
            headers=prompts.INTER_HEADERS,
            training=True,
            metrics=_named("inter", _STEP_METRICS + _FEEDBACK_METRICS + _USE_METRICS),
        ),
        Mode(
            LEAKED_MODE,
            "the gold answer of the same problem, and the model's own earlier responses to it (Fig. 2b's arm, built "
            "to show leakage: feedback.mode = leaked-intra only)",
            "their reward or correctness; any other problem",
            _leaked_intra,
            prompts.LEAKED_VERSION,
            drawn=True,
            context_field="response",
            headers=prompts.INTRA_HEADERS,
            training=True,
            metrics=_named(LEAKED_MODE, _STEP_METRICS + _FEEDBACK_METRICS),
            opt_in=True,  # to be compared, never a default: every other run leaves it out
            served_without_items=True,  # the gold answer is its context, earlier attempts or none
        ),
        Mode(
            "val",
            "the held-out question only (the zero-shot prompt)",
            "any context",
            _actor,
            prompts.ACTOR_VERSION,
            metrics=("val/{dataset}/mean@{k}", "val/{dataset}/pass@{k}"),
        ),
        Mode(
            "replay",
            "the question and one MEL lesson as working memory (lanpo.mel.prompts.replay_messages)",
            "the lesson's source responses; the gold answer (numbers masked in the lesson)",
            None,
            "replay",
            metrics=("mel/replays",),
        ),
        Mode(
            "retrieval",
            "lessons retrieved at test time with relevance >= gamma (the inter prompt)",
            "the same problem; the relevance score",
            prompts.inter_messages,
            prompts.INTER_VERSION,
            context_field="summary",
            headers=prompts.INTER_HEADERS,
            metrics=_named("retrieval", _USE_METRICS),
        ),
        Mode(
            "self_correct",
            "the model's own first answer, then one fixed reflection request",
            "the first answer's grade or the gold answer",
            None,
            prompts.REFLECT_VERSION,
            context_field="response",
            headers=prompts.INTRA_HEADERS,  # the reflection request asks for them; test time: no format bonus
            metrics=_named("self_correct", _USE_METRICS),
        ),
        Mode(
            "replayed",
            "a stored trajectory of the same problem, trained on again: its prompt and response as generated",
            "a fresh generation; it is never generated",
            None,
            "replayed",
            metrics=("replay/count", "replay/tokens"),
        ),
    )
}

ATTEMPT_MODES = tuple(MODES)  # every mode a stored attempt or rollout group carries (the schema's CHECKs)
PROMPT_MODES = tuple(m.name for m in MODES.values() if m.training)  # a training step's prompt modes
CONTEXT_MODES = tuple(m.name for m in MODES.values() if m.training and m.drawn)  # prompts with a store context
SETTING_MODES = {
    "none": (),
    "intra": ("intra",),
    "inter": ("inter",),
    "both": ("intra", "inter"),
    "leaked-intra": (LEAKED_MODE,),  # Fig. 2b's arm: the only setting that reaches LEAKED_MODE
}
FEEDBACK_SETTINGS = tuple(SETTING_MODES)  # the values of feedback.mode: which context modes a run asks for


def mode(name: str) -> Mode:
    """The mode called `name`; ValueError naming the modes for any other."""
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r}; expected one of {', '.join(MODES)}")
    return MODES[name]


def asks_inter(setting: str) -> bool:
    """Whether `feedback.mode = setting` asks for inter contexts (and so reads relevance and lessons)."""
    return "inter" in SETTING_MODES[setting]


def version_of(name: str, shows_response: bool = False) -> str:
    """The template version stored with a group made in `name` (`shows_response`: inter items are raw solutions)."""
    return mode(name).version(shows_response)


def build_messages(name: str, question: str, items: Sequence[Any] = (), shows_response: bool = False) -> list[Message]:
    """Messages for a training prompt in `name`; a context mode with no items falls back to the zero-shot prompt
    (the caller re-labels it), except a mode `served_without_items` (`LEAKED_MODE`, whose `question` the caller has
    made carry the gold answer: `lanpo.feedback.draw.leaked_questions`)."""
    found = mode(name)
    if name not in PROMPT_MODES or found.prompt is None:
        raise ValueError(f"unknown prompt mode {name!r}; expected one of {', '.join(PROMPT_MODES)}")
    own = items or found.served_without_items
    return found.prompt(question, items, shows_response) if own else prompts.actor_messages(question)


def render_context(name: str, items: Sequence[Any]) -> str:
    """The exact context block injected into a prompt for `name` (used by `lanpo pool context`)."""
    if name in ("intra", LEAKED_MODE):
        return prompts.format_intra(items)
    if name == "inter":
        return prompts.format_inter(items)
    raise ValueError(f"mode {name!r} has no context; expected one of {', '.join(CONTEXT_MODES)}")


def required_headers(name: str) -> tuple[str, ...]:
    """Headers the prompt of `name` asks a response to carry (none for zero_shot): the format bonus pays for them in
    the training context modes (lanpo.rewards.format_ok), the use diagnostics read them in every mode."""
    return MODES[name].headers if name in MODES else ()


def context_text(name: str, item: Any) -> str:
    """The text of `item` the prompt for `name` shows (intra: `response`, inter: `summary`)."""
    return str(getattr(item, str(mode(name).context_field)))


def with_context_text(name: str, item: Any, text: str) -> Any:
    """`item` (a dataclass) showing `text` instead: every other field, its ids included, is kept."""
    return dataclasses.replace(item, **{str(mode(name).context_field): text})
