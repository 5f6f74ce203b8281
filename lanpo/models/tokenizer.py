"""A loaded tokenizer made ready for generation, and chat messages turned into the prompt the model sees."""

from __future__ import annotations

from typing import Any


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Left padding (generation appends on the right) and a pad token."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def apply_chat(
    tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = True, prefill: str = ""
) -> str:
    """Messages -> the prompt string the model sees (its own chat template); `prefill`: the start of the assistant's
    turn, written for the model, which continues it (needs `add_generation_prompt`)."""
    if prefill and not add_generation_prompt:
        raise ValueError("an assistant prefill continues the generation prompt: add_generation_prompt must be set")
    return (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt) + prefill
    )
