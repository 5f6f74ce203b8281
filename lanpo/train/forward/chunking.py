"""How large a chunk of positions the log-prob head takes at once: sized by memory, from the vocabulary.

A position's logits cost V x bytes, whatever the token count, so the settings name a byte budget
(`grpo.logprob_chunk_mb`, B) and the chunk follows from V and what each path holds a position (measured peaks, in
units of a position's fp32 logits, 4 V bytes):

  fused         `lanpo.rl.head_logprobs` (the default, for a plain linear head): 8 V bytes a position, the fp32
                logits and their exp in the forward with the entropy (backward: 4, + 2 for a bf16 copy).
  checkpointed  the head's own forward under activation checkpointing (`grpo.logprob_fused = false`, or a head
                that is not a plain linear layer, e.g. LoRA on the head): 16 V bytes, the fp32 logits and the
                entropy's log-softmax, exp and product.
  full          the model's logits of every position at once: at most 24 V bytes a position (the model's output,
                its fp32 and tempered copies, the entropy's three; 3.97 copies, 15.9 bytes, measured at T = 1 in fp32).

A micro-batch of N completion positions (rows x columns, padded) takes the full logits while N x V x 24 <= B, and
chunks of B / (V x the path's bytes) positions beyond: the head's logits never hold more than B, at any shape.
`grpo.logprob_chunk_tokens` > 0 fixes the chunk instead (C positions, and the full logits at or under C), as before
the budget existed. Pure arithmetic (no torch): `lanpo plan` sizes its logits terms with the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lanpo.train.config import GRPOConfig

MiB = 2**20
FUSED_BYTES = 8  # a position's fp32 logits and their exp (the fused forward with the entropy: its largest moment)
CHECKPOINTED_BYTES = 16  # fp32 logits, and the entropy's log-softmax, exp and product (`chunked._chunk_logprobs`)
FULL_BYTES = 24  # the full logits' path at most: model output, fp32 copy, tempered copy, the entropy's three


@dataclass(frozen=True)
class Chunking:
    """The log-prob head's chunking: `budget` bytes (`grpo.logprob_chunk_mb` x 2^20; 0: none), or `tokens`
    positions a chunk (`grpo.logprob_chunk_tokens`, > 0 overrides the budget), through the fused head when `fused`
    (`grpo.logprob_fused`). Chunking() (NO_CHUNKS) chunks nothing: the full logits at every shape."""

    budget: int = 0
    tokens: int = 0
    fused: bool = True

    @classmethod
    def of(cls, cfg: GRPOConfig) -> Chunking:
        return cls(cfg.logprob_chunk_mb * MiB, cfg.logprob_chunk_tokens, cfg.logprob_fused)

    @property
    def on(self) -> bool:
        return bool(self.tokens or self.budget)

    def sizes(self, vocab: int, fused: bool) -> tuple[float, int]:
        """(the most completion positions a micro-batch takes through the full logits, the positions of a chunk
        beyond that) at vocabulary `vocab`, through the fused head or not (`fused`); (inf, 0) when off."""
        if self.tokens:
            return self.tokens, self.tokens
        if not self.budget:
            return math.inf, 0
        per_position = vocab * (FUSED_BYTES if fused else CHECKPOINTED_BYTES)
        return self.budget // (vocab * FULL_BYTES), max(1, self.budget // per_position)

    def chunk(self, positions: int, vocab: int, fused: bool) -> int:
        """Positions a chunk for a micro-batch of `positions` completion positions (rows x columns); 0: the full
        logits."""
        full, chunk = self.sizes(vocab, fused)
        return chunk if positions > full else 0


NO_CHUNKS = Chunking()  # the full logits at every shape: the default of the functions that take a Chunking
