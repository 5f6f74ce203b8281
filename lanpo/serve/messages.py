"""What `lanpo serve` makes of a request's messages, and of the OpenAI fields it cannot honour.

A request is read as a `Conversation`: the client's system text, the turns before the question, and the question.

- **System.** The `system` and `developer` messages before the first turn, joined by a blank line in their order,
  are the client's system text. One after a turn is refused: a chat template puts the system text first, so a
  later one could only be moved, and moving it would change what the client wrote.
- **Turns.** `user` and `assistant` messages follow, ending with a `user` message: the question. The earlier
  turns reach the prompt as the client sent them. A message's content is a string, or a list of text parts
  joined by a newline (vLLM's join); any other part (`image_url`, `input_audio`, `file`, ...) is refused by type.
- **Where lanpo's text goes** (`Conversation.around`). The mode's template renders the question as it renders a
  question of `lanpo infer`: the zero-shot, lesson (inter) or reflection template of `lanpo.prompts` wraps the
  last user turn, so a lesson sits where it sits in training, in the user turn after the question. The system
  message is the client's system text, a blank line, then lanpo's own (`prompts.SYSTEM`): the client's text
  comes first and stays byte for byte what it sent; lanpo's follows because the policy was trained under it and
  its templates (a boxed answer, the lesson headers the format check reads) lean on it. The earlier turns go
  between the system message and the question. A request of one user message is a conversation of nothing but
  the question, and its prompt is the very prompt of `lanpo infer`.
- **Retrieval keys on the question** (the last user turn): it is what is asked now, and what a lesson must help
  with; the earlier turns are context the model reads in the prompt, not the thing to find lessons for. Keying on
  the whole conversation would let an old topic pull lessons for a question about another. The question is also
  what the store keeps as the served problem; the prompt stored with the answer is the whole rendered text.
- **Tools** are refused with code `unsupported_tools`: lanpo answers in text and calls nothing, so a request
  with `tools`, `tool_choice`, `functions` or `function_call`, or a message with role `tool` or `function` or
  with `tool_calls`, is a 400 rather than an answer that silently ignores them.
- **Other fields** (`FIELDS`): each of OpenAI's request fields is honoured, ignored (it changes nothing in the
  answer, such as `user` or `store`), or refused with code `unsupported_parameter` when set to ask for something
  lanpo cannot do (`response_format` other than text, `logprobs`, penalties, audio, ...). Of vLLM's extensions,
  `min_tokens` is honoured (EOS held back until the answer is that long; not beside stop strings), and the
  sampling ones lanpo does not apply (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `use_beam_search`,
  `best_of`) are refused the same way; any other field is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lanpo.prompts import Message
from lanpo.serve.api import ChatRequest
from lanpo.serve.api import Message as RequestMessage
from lanpo.serve.http import ApiError, shown

SYSTEM_ROLES = ("system", "developer")
TURN_ROLES = ("user", "assistant")
TOOL_ROLES = ("tool", "function")
PART_JOIN = "\n"  # between a message's text parts, as vLLM's chat parser joins them
SYSTEM_JOIN = "\n\n"  # between system texts: the client's, then lanpo's

# OpenAI's chat-completion fields, by what lanpo does with them. A refused field is refused only when it asks for
# something: absent, null, or one of the values after it (which ask for what lanpo does anyway).
HONOURED = (
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",  # vLLM's extension, not OpenAI's
    "temperature",
    "top_p",
    "n",
    "seed",
    "stop",
    "stream",
    "stream_options",
)
IGNORED = (  # hints about billing, caching, logging and tools that are absent: the answer is the same without them
    "user",
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_options",
    "prompt_cache_retention",
    "prediction",
    "parallel_tool_calls",
)
TOOL_FIELDS: dict[str, tuple[Any, ...]] = {
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
}
REFUSED: dict[str, tuple[str, tuple[Any, ...]]] = {  # field -> (why, values that ask for nothing)
    "response_format": ("lanpo answers in free text", ({"type": "text"},)),
    "logprobs": ("lanpo returns no log-probabilities", (False,)),
    "top_logprobs": ("lanpo returns no log-probabilities", (0,)),
    "logit_bias": ("lanpo does not bias tokens", ({},)),
    "presence_penalty": ("lanpo samples without penalties", (0,)),
    "frequency_penalty": ("lanpo samples without penalties", (0,)),
    "modalities": ("lanpo answers in text", (["text"],)),
    "audio": ("lanpo answers in text", ()),
    "reasoning_effort": ("lanpo has no reasoning setting", ()),
    "verbosity": ("lanpo has no verbosity setting", ()),
    "web_search_options": ("lanpo does not search the web", ()),
    "moderation": ("lanpo runs no moderation", ()),
    # vLLM's sampling extensions (its OpenAI server takes them at the top level) that lanpo does not apply: a client
    # moved over from `vllm serve` is told, not answered under other sampling than it asked for
    "top_k": ("lanpo samples with temperature and top_p only", (-1, 0)),
    "min_p": ("lanpo samples with temperature and top_p only", (0,)),
    "repetition_penalty": ("lanpo samples without penalties", (1,)),
    "ignore_eos": ("lanpo ends an answer at EOS (min_tokens holds EOS back)", (False,)),
    "use_beam_search": ("lanpo samples, it does not search beams", (False,)),
    "best_of": ("lanpo returns every sample it draws (n)", (1,)),
}
FIELDS = (*HONOURED, *IGNORED, *TOOL_FIELDS, *REFUSED)


@dataclass(frozen=True)
class Conversation:
    """A request's messages as lanpo reads them: the question (the last user turn), the client's system text (None:
    none) and the turns before the question, as (role, text)."""

    question: str
    system: str | None = None
    history: tuple[tuple[str, str], ...] = ()

    def around(self, messages: list[Message]) -> list[Message]:
        """lanpo's `messages` for the mode (its system message, then the template's turns on the question) inside
        the client's conversation: one system message (the client's text, then lanpo's), the earlier turns, then
        the template's turns. Without a system text or earlier turns, `messages` themselves."""
        if self.system is None and not self.history:
            return messages
        first, *rest = messages
        if first["role"] != "system":
            raise ValueError("lanpo's messages for a mode start with its system message")
        system = first["content"] if self.system is None else f"{self.system}{SYSTEM_JOIN}{first['content']}"
        turns = [{"role": role, "content": text} for role, text in self.history]
        return [{"role": "system", "content": system}, *turns, *rest]

    def texts(self) -> list[str]:
        """Every text the client sent: what the server's token limit counts."""
        return [*([self.system] if self.system is not None else []), *(t for _, t in self.history), self.question]


def refuse_unsupported(body: ChatRequest) -> None:
    """A 400 for a field of `body` that asks for what lanpo cannot do: tools first, then the rest of `REFUSED`."""
    extra = body.model_extra or {}
    for field, nothing in TOOL_FIELDS.items():
        if _asks(extra.get(field), nothing):
            raise _tools(f"`{field}`", field)
    for field, (why, nothing) in REFUSED.items():
        if _asks(extra.get(field), nothing):
            raise ApiError(
                400,
                f"lanpo serve cannot honour `{field}`: {why}; send the request without it",
                "unsupported_parameter",
                field,
            )


def conversation(body: ChatRequest) -> Conversation:
    """`body`'s messages as a Conversation, or a 400 that names what lanpo cannot read (rules: the module's doc)."""
    system: list[str] = []
    turns: list[tuple[str, str]] = []
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        if message.role in TOOL_ROLES or message.tool_calls or _asks(message.function_call, ()):
            raise _tools(f"a tool message or a tool call ({where}, role {shown(message.role)})", where)
        if message.role not in SYSTEM_ROLES + TURN_ROLES:
            raise ApiError(
                400,
                f"{where} has role {shown(message.role)}; lanpo serve reads system, developer, user and assistant "
                "messages",
                "unsupported_messages",
                where,
            )
        text = _text(message, where)
        if "\x00" in text:
            raise ApiError(400, f"{where} holds a NUL character", "invalid_messages", where)
        if message.role in TURN_ROLES:
            turns.append((message.role, text))
        elif turns:
            raise ApiError(
                400,
                f"{where} is a {message.role} message after the conversation began: system and developer messages "
                "come first",
                "unsupported_messages",
                where,
            )
        elif text:
            system.append(text)
    if not turns or turns[-1][0] != "user":
        last = body.messages[-1].role
        raise ApiError(
            400,
            f"the last message must be the user's question (a user message after any system text); it is {last!r}",
            "unsupported_messages",
            "messages",
        )
    question = turns[-1][1]
    if not question.strip():
        raise ApiError(400, "the question (the last user message) is empty", "invalid_question", "messages")
    return Conversation(question, SYSTEM_JOIN.join(system) if system else None, tuple(turns[:-1]))


def _text(message: RequestMessage, where: str) -> str:
    if message.audio is not None:
        raise _content("audio", where)
    if not isinstance(message.content, list):
        return message.content or ""
    texts = []
    for part in message.content:
        if part.type != "text":
            raise _content(part.type, where)
        if part.text is None:
            raise ApiError(400, f"{where} holds a text part without its text", "invalid_messages", where)
        texts.append(part.text)
    return PART_JOIN.join(texts)


def _asks(value: Any, nothing: tuple[Any, ...]) -> bool:
    return value is not None and not any(value == n for n in nothing)


def _tools(what: str, param: str) -> ApiError:
    return ApiError(
        400,
        f"lanpo serve answers in text and calls no tools: {what} is not supported; send the request without tools",
        "unsupported_tools",
        param,
    )


def _content(kind: str, where: str) -> ApiError:
    return ApiError(
        400,
        f"{where} holds a content part of type {shown(kind)}; lanpo serve reads text parts only",
        "unsupported_content",
        where,
    )
