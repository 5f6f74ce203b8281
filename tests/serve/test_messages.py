"""The messages real clients send, through a running `lanpo serve`: the request bodies LangChain and the OpenAI Agents
SDK build (tests/serve/fixtures, captured by fixtures/capture.py from their own code) are served with the client's
system text and turns in the stored prompt, retrieval keys on the last user turn, and what lanpo cannot do (tools,
images, a JSON response format) is a 400 that says so and writes nothing."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import completion_create_params

from lanpo import prompts
from lanpo.models import apply_chat
from lanpo.serve import messages
from lanpo.serve.messages import Conversation
from tests.serve.conftest import TOPICS, Served
from tests.serve.test_serve import written

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SERVED = (
    "langchain_system_prompt",
    "langchain_conversation",
    "langchain_text_parts",
    "agents_instructions",
    "agents_conversation",
)


def fixture(name: str, model: str) -> dict[str, Any]:
    """A captured request body, sent to the server under the name it serves."""
    body = json.loads((FIXTURES / f"{name}.json").read_text())
    del body["_source"]
    return {**body, "model": model}


def stored(server: Served, answer_id: int) -> Any:
    """The stored answer's prompt (the group's), its problem's question, and the prompt tokens the engine counted."""
    (row,) = server.rows(
        "SELECT g.prompt, p.question, g.prompt_tokens FROM attempts a JOIN rollout_groups g ON g.id = a.group_id "
        "JOIN problems p ON p.id = g.problem_id WHERE a.id = :id",
        id=answer_id,
    )
    return row


@functools.cache
def tokenizer_of(model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


# --------------------------------------------------------------------------- the rules, without a server


def test_a_plain_question_keeps_lanpos_own_prompt_and_a_conversation_goes_around_it() -> None:
    question, lessons = "What is 1/2 + 1/3?", [prompts.Lesson("Add fractions over a common denominator.")]
    per_mode = [
        prompts.actor_messages(question),
        prompts.inter_messages(question, lessons),
        prompts.intra_messages(question, [prompts.Attempt("5/6")]),
        prompts.self_correct_messages(question, prompts.Attempt("5/6")),
    ]
    for ours in per_mode:
        assert Conversation(question).around(ours) == ours  # a one-message request: lanpo infer's very prompt
        history = (("user", "Hi"), ("assistant", "Hello."))
        merged = Conversation(question, "Be brief.", history).around(ours)
        assert merged[0] == {"role": "system", "content": f"Be brief.\n\n{prompts.SYSTEM}"}
        assert merged[1:3] == [{"role": r, "content": t} for r, t in history]
        assert merged[3:] == ours[1:]  # the template's turns, lessons in the question's turn, untouched
        assert Conversation(question, history=history).around(ours)[0] == ours[0]


def test_every_openai_request_field_is_honoured_ignored_or_refused() -> None:
    """A field the installed `openai` client can send that lanpo has not decided on fails here, so a new one is
    never ignored by accident."""
    fields = set(completion_create_params.CompletionCreateParamsBase.__annotations__)
    assert fields <= set(messages.FIELDS), sorted(fields - set(messages.FIELDS))
    assert len(messages.FIELDS) == len(set(messages.FIELDS))


# --------------------------------------------------------------------------- through the server


@pytest.mark.parametrize("name", SERVED)
def test_each_client_request_shape_is_served_with_its_system_text(server: Served, name: str) -> None:
    """Each captured body, posted as the library sent it, in retrieval mode (the server's): a 200, and the stored
    prompt is lanpo's lesson prompt on the last user turn inside the client's conversation, to the byte, as many
    tokens as the engine counted. The conversations asked about percentages before (three times in their turns)
    and ask about fractions last: the one lesson read (m = 1) is the fractions lesson, as retrieval keys on the
    last user turn; keyed on the whole conversation, BM25 would pick the percentages lesson."""
    body = fixture(name, server.model)
    response = server.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    lanpo = response.json()["lanpo"]
    assert lanpo["mode"] == "retrieval" and lanpo["fallback"] is None
    (lesson,) = lanpo["lessons"]
    (summary,) = server.rows("SELECT summary FROM experience_versions WHERE id = :v", v=lesson["version_id"])[0]
    (system, *history), last = body["messages"][:-1], body["messages"][-1]["content"]
    question = last if isinstance(last, str) else "\n".join(p["text"] for p in last)  # text parts, joined
    assert next(t for t in TOPICS if t in question) in summary  # the lesson on the last turn's topic
    turns = tuple((m["role"], m["content"]) for m in history)
    expected = Conversation(question, system["content"], turns).around(
        prompts.inter_messages(question, [prompts.Lesson(summary)])
    )
    tokenizer = tokenizer_of(server.model)
    row = stored(server, lanpo["answer_ids"][0])
    assert row.prompt == apply_chat(tokenizer, expected) and row.question == question
    assert row.prompt.index(system["content"]) < row.prompt.index(prompts.SYSTEM)  # the client's text, then lanpo's
    assert row.prompt_tokens == len(tokenizer.encode(row.prompt, add_special_tokens=False))
    assert response.json()["usage"]["prompt_tokens"] == row.prompt_tokens


def test_self_correction_continues_the_clients_conversation(server: Served) -> None:
    """Through the stock client: both turns of two-turn self-correction carry the client's system text and turns."""
    body = fixture("langchain_conversation", server.model)
    reply = server.client().chat.completions.create(
        model=server.model, messages=body["messages"], max_tokens=2, extra_body={"lanpo": {"mode": "self_correct"}}
    )
    (answer_id,) = reply.model_extra["lanpo"]["answer_ids"]
    prompts_of = [
        r.prompt
        for r in server.rows(
            "SELECT g.prompt FROM attempts a JOIN rollout_groups g ON g.id = a.group_id WHERE a.id = :id OR a.id IN "
            "(SELECT gc.context_attempt_id FROM group_contexts gc JOIN attempts f ON f.group_id = gc.group_id "
            "WHERE f.id = :id) ORDER BY a.id",
            id=answer_id,
        )
    ]
    system, first = body["messages"][0]["content"], body["messages"][1]["content"]
    assert len(prompts_of) == 2 and all(system in p and first in p for p in prompts_of)
    assert any(prompts.REFLECT in p for p in prompts_of)


def _request(**changes: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "What is 2+2?"}], **changes}


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}


@pytest.mark.parametrize(
    ("request_", "code", "param", "names"),
    [
        ("langchain_tools", "unsupported_tools", "tools", "tools"),
        ("agents_tools", "unsupported_tools", "tools", "tools"),
        (_request(tool_choice="required"), "unsupported_tools", "tool_choice", "tools"),
        (_request(functions=[{"name": "add"}], function_call="auto"), "unsupported_tools", "functions", "tools"),
        (
            {
                "messages": [
                    {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "4"},
                    {"role": "user", "content": "And 3+3?"},
                ]
            },
            "unsupported_tools",
            "messages[1]",
            "tools",
        ),
        (
            {"messages": [{"role": "function", "name": "add", "content": "4"}]},
            "unsupported_tools",
            "messages[0]",
            "tools",
        ),
        ("langchain_image", "unsupported_content", "messages[0]", "image_url"),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
            "unsupported_content",
            "messages[0]",
            "input_audio",
        ),
        (_request(response_format={"type": "json_object"}), "unsupported_parameter", "response_format", "free text"),
        (_request(logprobs=True), "unsupported_parameter", "logprobs", "logprobs"),
        (_request(presence_penalty=0.5), "unsupported_parameter", "presence_penalty", "penalties"),
        (_request(top_k=5), "unsupported_parameter", "top_k", "top_p only"),  # vLLM's extensions, as vllm serve takes
        (_request(repetition_penalty=1.2), "unsupported_parameter", "repetition_penalty", "penalties"),
        (_request(ignore_eos=True), "unsupported_parameter", "ignore_eos", "min_tokens"),
        (_request(max_tokens=4, min_tokens=5), "invalid_min_tokens", "min_tokens", "above max_tokens (4)"),
        (_request(min_tokens=5_000), "invalid_min_tokens", "min_tokens", "above max_tokens"),  # the server's default
        (_request(max_tokens=4, min_tokens=2, stop=["."]), "unsupported", "stop", "min_tokens and stop"),
        (
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be brief."}]},
            "unsupported_messages",
            "messages[1]",
            "come first",
        ),
        (
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},
            "unsupported_messages",
            "messages",
            "last message",
        ),
        ({"messages": [{"role": "narrator", "content": "Once"}]}, "unsupported_messages", "messages[0]", "narrator"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_what_lanpo_cannot_do_is_a_400_that_names_it(
    server: Served, request_: str | dict[str, Any], code: str, param: str, names: str
) -> None:
    body = fixture(request_, server.model) if isinstance(request_, str) else {"model": server.model, **request_}
    before = written(server)
    response = server.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param) and names in error["message"]
    assert len(error["message"]) < 300
    assert written(server) == before


def test_fields_that_ask_for_nothing_are_served(server: Served) -> None:
    """Empty tools, a text response format, logprobs off and the hints lanpo ignores change nothing: a 200."""
    body = _request(
        model=server.model,
        max_tokens=2,
        tools=[],
        tool_choice="none",
        response_format={"type": "text"},
        logprobs=False,
        presence_penalty=0,
        top_k=-1,
        min_p=0.0,
        repetition_penalty=1.0,
        ignore_eos=False,
        min_tokens=0,
        user="u-1",
        store=True,
        metadata={"app": "acme"},
        parallel_tool_calls=True,
        lanpo={"mode": "zero_shot"},
    )
    body["messages"] = [{"role": "developer", "content": "Be brief."}, *body["messages"]]
    response = server.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    row = stored(server, response.json()["lanpo"]["answer_ids"][0])
    assert row.prompt.count(f"Be brief.\n\n{prompts.SYSTEM}") == 1


def test_min_tokens_holds_eos_back_until_every_answer_is_that_long(server: Served) -> None:
    """vLLM's `min_tokens`, through the stock client's `extra_body` (bench/serve.py sets it to max_tokens on both
    servers, for answers of one length): 16 seeded samples end early by EOS without it and run to 24 tokens with it,
    and the stored sampling says so."""

    def ask(**extra: Any) -> tuple[list[int], list[str], dict[str, Any]]:
        reply = server.client().chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "What is 2+2?"}],
            max_tokens=24,
            n=16,
            temperature=1.0,
            seed=1,
            extra_body={"lanpo": {"mode": "zero_shot"}, **extra},
        )
        ids = reply.model_extra["lanpo"]["answer_ids"]
        rows = server.rows("SELECT completion_tokens FROM attempts WHERE id = ANY(:ids) ORDER BY id", ids=ids)
        (sampling,) = server.rows("SELECT sampling FROM served_answers WHERE request_id = :r", r=reply.id)[0]
        return [r.completion_tokens for r in rows], [c.finish_reason for c in reply.choices], sampling

    free, free_reasons, free_sampling = ask()
    assert min(free) < 24 and "stop" in free_reasons  # without it some answers end early: the test can tell
    held, held_reasons, held_sampling = ask(min_tokens=24)
    assert held == [24] * 16 and set(held_reasons) == {"length"}
    assert (free_sampling["min_tokens"], held_sampling["min_tokens"]) == (0, 24)
