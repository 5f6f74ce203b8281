"""Tiny randomly initialised models for tests: a character-level tokenizer and a Llama-shaped model, built offline."""

from __future__ import annotations

from typing import Any

import torch

from lanpo.models.tokenizer import prepare_tokenizer

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# Single-character tokens a large-vocabulary tiny model adds: CJK ideographs and Hangul syllables (32,164 of them).
# Every one is a token of its own, so decoded text re-encodes to exactly as many tokens as were generated, and with
# ~32k tokens against one EOS a random model writes to its length limit as a real model's long rollouts do.
LARGE_VOCAB_RANGES = ((0x4E00, 0x9FFF), (0xAC00, 0xD7A3))


def tiny_tokenizer(large_vocab: bool = False) -> Any:
    """A character-level tokenizer with a ChatML template, built offline (for unit tests).

    `large_vocab`: ~32k extra single-character tokens (`LARGE_VOCAB_RANGES`) beside the ~100 printable ASCII ones.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    if large_vocab:
        chars += [chr(c) for first, last in LARGE_VOCAB_RANGES for c in range(first, last + 1)]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    return prepare_tokenizer(tokenizer)


def tiny_causal_lm(
    seed: int = 0, hidden: int = 32, layers: int = 2, large_vocab: bool = False, max_positions: int = 2048
) -> tuple[Any, Any]:
    """A randomly initialised Llama-shaped model + tiny tokenizer: real code paths, milliseconds per step.

    The default vocabulary is ~100 characters, so a random model ends a row early (EOS at ~1% a token);
    `large_vocab` (~32k tokens, `tiny_tokenizer`) and a `max_positions` above prompt + completion make it write
    rollouts at the paper's lengths (3,072-token prompts, thousands of generated tokens).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer(large_vocab=large_vocab)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer
