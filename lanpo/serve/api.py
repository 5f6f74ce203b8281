"""The request and response shapes of `lanpo serve`: OpenAI's chat completions, and lanpo's extension fields.

A stock `openai` client sends lanpo's settings in `extra_body={"lanpo": {...}}` and reads them back from the
response's `lanpo` field (`completion.model_extra["lanpo"]`, or `completion.lanpo`). What the messages may hold, and
which of OpenAI's other fields are honoured, ignored or refused, is `lanpo.serve.messages`'s; a top-level field
OpenAI does not have either is ignored. Unknown fields inside `lanpo` are refused (a typo must not pass silently).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lanpo.inference.config import INFERENCE_MODES
from lanpo.retrieval import STAGE1

MODES = tuple(INFERENCE_MODES) + tuple(m.replace("_", "-") for m in INFERENCE_MODES if "_" in m)
SEED_RANGE = 2**63


class ContentPart(BaseModel):
    """One part of a message's content: lanpo reads `text` parts (`lanpo.serve.messages` refuses the others)."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class Message(BaseModel):
    """One message as a client sends it, tool fields included so that `lanpo.serve.messages` can refuse them."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[Any] | None = None
    function_call: Any = None
    audio: Any = None


class LanpoOptions(BaseModel):
    """Per-request overrides of the server's settings (`lanpo serve --help` names their defaults)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal[MODES] | None = None  # type: ignore[valid-type]
    gamma: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    m: Annotated[int, Field(ge=1, le=32)] | None = None
    top_k: Annotated[int, Field(ge=1, le=256)] | None = None
    judge: Literal["policy", "none"] | None = None
    stage1: Literal[STAGE1] | None = None  # type: ignore[valid-type]
    scope: str | None = None  # the request's scope (lanpo.serve.scopes checks the name)


class ChatRequest(BaseModel):
    """OpenAI's request; its other fields are kept in `model_extra`, where `lanpo.serve.messages` finds the ones
    it ignores and the ones it refuses."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    # vLLM's extension (its OpenAI server reads it too; the `openai` client sends it in `extra_body`): EOS is held
    # back until the answer has this many tokens (at most max_tokens; not beside stop strings, which vLLM also holds
    # back and lanpo's cut would not). Benchmarks set it to max_tokens: every server writes answers of one length.
    min_tokens: Annotated[int, Field(ge=0)] = 0
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | None = None
    n: Annotated[int, Field(ge=1, le=16)] = 1
    seed: Annotated[int, Field(ge=-SEED_RANGE, lt=SEED_RANGE)] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    lanpo: LanpoOptions | None = None

    @model_validator(mode="after")
    def _one_limit(self) -> ChatRequest:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return self

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class FeedbackRequest(BaseModel):
    """The outcome of a served answer: a reward, a verdict, or a gold answer to grade it against (at least one)."""

    model_config = ConfigDict(extra="forbid")

    answer_id: Annotated[int, Field(ge=1, lt=SEED_RANGE)]
    reward: Annotated[float, Field(allow_inf_nan=False)] | None = None
    verdict: Literal["correct", "incorrect"] | None = None
    gold_answer: Annotated[str, Field(min_length=1, max_length=10_000)] | None = None

    @model_validator(mode="after")
    def _something(self) -> FeedbackRequest:
        if self.reward is None and self.verdict is None and self.gold_answer is None:
            raise ValueError("give a reward, a verdict or a gold_answer")
        return self


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
