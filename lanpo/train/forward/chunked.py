"""The log-prob head in chunks (`grpo.logprob_chunk_mb`, `grpo.logprob_chunk_tokens`; sizes in
`lanpo.train.forward.chunking`): the head's logits of a micro-batch never exist whole.

The fp32 logits of a micro-batch are rows x T x V (the paper's 8 rows of 8,192 tokens over Qwen2.5's 152,064 tokens:
39.9 GB a copy, and the logsumexp's backward and the entropy each add one). Beyond the full-logits limit, the model's
head is swapped, for the one forward, for a function that takes the hidden states of the real (unpadded)
completion positions a chunk at a time:

- fused (the default, `grpo.logprob_fused`, for a plain `torch.nn.Linear` head): `lanpo.rl.head_logprobs`, one
  autograd function over every chunk that saves the hidden states and each position's logsumexp, never logits, and
  recomputes a chunk's logits in backward (Liger-Kernel's fused linear cross-entropy; verl bounds the same memory
  with `entropy_from_logits_with_chunking` and `use_fused_kernels`). Its matmuls run in the forward's autocast dtype.
- checkpointed (`grpo.logprob_fused = false`, or a head that is not a plain linear layer: LoRA on the head, a
  wrapper's forward): the head's own forward, the fp32 upcast, division by the temperature, logsumexp, gather and
  (no gradient) entropy, each chunk under `torch.utils.checkpoint` (`use_reentrant=False`): backward recomputes a
  chunk's logits instead of keeping them, at about twice the fused path's memory a position.

The head is called from inside the model's own forward, so it works unchanged under PEFT (LoRA), DDP, tied
embeddings and FSDP2 (the head's weights are in the root unit, gathered for its forward and again for its
backward, where the recompute runs). With shared prompts, the prompts' forward keeps its (U, 1, V) logits (the
first completion token of each row) and the completions' forward goes through the chunks. Completion columns that
pad every row are dropped first, and padded positions give 0 (masked everywhere). The result equals the full
logits' to float rounding (tests/train/test_chunked_logprobs.py: against a per-token loop, in value and in
gradient).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from lanpo.models import cache_kwarg, returned_cache
from lanpo.rl.head_logprobs import head_logprobs
from lanpo.rl.logprobs import entropy_from_logits, token_logprobs
from lanpo.train.forward.batch import RolloutBatch, forward_precision, prompts_forward, shared_prompts
from lanpo.train.forward.chunking import Chunking
from lanpo.train.forward.logprob_settings import LogprobSettings


def head_chunk(model: Any, positions: int, chunking: Chunking) -> tuple[int, bool]:
    """(positions a chunk, whether the fused head runs) for a micro-batch of `positions` completion positions (rows
    x columns) through `model`; a chunk of 0: the full logits (chunking off, within its full-logits limit, or a
    model whose head cannot be stood in for)."""
    if not chunking.on:
        return 0, False
    head = chunkable_head(model)
    vocab = getattr(head, "out_features", None)
    if head is None or not isinstance(vocab, int):
        return 0, False
    fused = chunking.fused and fusable(head)
    return chunking.chunk(positions, vocab, fused), fused


def chunkable_head(model: Any) -> torch.nn.Module | None:
    """The output embedding (the head) of `model`, under a DDP, PEFT or FSDP wrapper, when the chunked path can
    stand in for it: the model hands the head's output back as its logits, untouched (None where it would not:
    Gemma-2's final soft-capping; and where the model names no output embedding)."""
    inner = getattr(model, "module", model)  # DistributedDataParallel
    if getattr(getattr(inner, "config", None), "final_logit_softcapping", None) is not None:
        return None
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, torch.nn.Module) else None


def fusable(head: torch.nn.Module) -> bool:
    """Whether `head` is a plain linear layer whose weight and bias are all its forward reads (so the fused head
    computes exactly its output): not LoRA's or another wrapper's layer, no forward of its own set on the instance,
    no hooks (which its own forward, called inside the model's, would skip too)."""
    return (
        isinstance(head, torch.nn.Linear)
        and type(head).forward is torch.nn.Linear.forward
        and "forward" not in head.__dict__
        and not (head._forward_hooks or head._forward_pre_hooks)
    )


def chunked_completion_logprobs(
    model: Any,
    batch: RolloutBatch,
    with_entropy: bool,
    logprob_settings: LogprobSettings,
    chunk: int,
    fused: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`completion_logprobs` with the head's logits a `chunk` of positions at a time, through the fused head or
    the checkpointed one (`fused`; the module docstring): the same forwards (rows whole, or shared prompts), the
    completion columns that pad every row dropped first, the padded positions 0. Of `logprob_settings`, the
    prompts' sharing, the autocast and the temperature count here (its chunking chose `chunk` and `fused`)."""
    T = batch.completion_ids.shape[1]
    P = batch.input_ids.shape[1] - T
    columns = batch.attention_mask[:, P:].sum(dim=0).nonzero()
    keep = int(columns.max()) + 1 if columns.numel() else 1  # completion columns up to the longest row's end
    sub = RolloutBatch(
        batch.input_ids[:, : P + keep],
        batch.attention_mask[:, : P + keep],
        batch.position_ids[:, : P + keep],
        batch.completion_ids[:, :keep],
        batch.completion_mask[:, :keep],
    )
    cut, prompts, rows = shared_prompts(model, sub, logprob_settings.share_prompts)
    if prompts is not None and rows is not None:
        logp, entropy = _shared_prompt_chunks(
            model, sub, cut, prompts, rows, with_entropy, logprob_settings, chunk, fused
        )
    else:
        logp, entropy = _head_chunks(
            model,
            sub,
            sub.completion_ids,
            sub.completion_mask,
            with_entropy,
            logprob_settings,
            chunk,
            fused,
            input_ids=sub.input_ids[:, cut:],
            attention_mask=sub.attention_mask[:, cut:],
            position_ids=sub.position_ids[:, cut:],
            logits_to_keep=keep + 1,
            use_cache=False,
        )
    pad = (0, T - keep)
    return torch.nn.functional.pad(logp, pad), None if entropy is None else torch.nn.functional.pad(entropy, pad)


def _shared_prompt_chunks(
    model: Any,
    batch: RolloutBatch,
    cut: int,
    prompts: torch.Tensor,
    rows: torch.Tensor,
    with_entropy: bool,
    logprob_settings: LogprobSettings,
    chunk: int,
    fused: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_shared_prompt_logits` in chunks: the prompts' forward keeps its (U, 1, V) logits, which predict each row's
    first completion token; the completions' forward on the repeated cache goes through the chunked head."""
    T = batch.completion_ids.shape[1]
    P = batch.input_ids.shape[1] - T
    out = prompts_forward(model, batch, cut, prompts, logprob_settings.autocast)
    first = out.logits[rows].float()  # (B, 1, V): small, one position a row
    if logprob_settings.temperature != 1.0:
        first = first / logprob_settings.temperature
    logp = token_logprobs(first, batch.completion_ids[:, :1])  # (B, 1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(first.detach())
    del first
    if T == 1:
        return logp, entropy
    cache = returned_cache(out)
    cache.batch_select_indices(rows)  # (U, ...) -> (B, ...); autograd sums the rows' gradients back
    rest, rest_entropy = _head_chunks(
        model,
        batch,
        batch.completion_ids[:, 1:],
        batch.completion_mask[:, 1:],
        with_entropy,
        logprob_settings,
        chunk,
        fused,
        input_ids=batch.completion_ids[:, :-1],
        attention_mask=batch.attention_mask[:, cut : P + T - 1],
        position_ids=batch.position_ids[:, P : P + T - 1],
        **{cache_kwarg(model): cache},
        logits_to_keep=T - 1,
        use_cache=True,
    )
    logp = torch.cat([logp, rest], dim=1)
    if entropy is not None and rest_entropy is not None:
        entropy = torch.cat([entropy, rest_entropy], dim=1)
    return logp, entropy


def _head_chunks(
    model: Any,
    batch: RolloutBatch,
    targets: torch.Tensor,
    mask: torch.Tensor,
    with_entropy: bool,
    logprob_settings: LogprobSettings,
    chunk: int,
    fused: bool,
    **forward: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward of `model` (keywords `forward`) whose head, for its kept positions (the first n =
    targets.shape[1] of them predicting `targets` (B, n)), returns log p of the targets instead of logits: the
    hidden states of the `mask`ed positions, a `chunk` at a time, through the fused head (`fused`) or the head's
    own forward under activation checkpointing (either way backward recomputes a chunk's logits rather than
    keeping them). The head runs inside the model's forward, so an FSDP root unit has its weights gathered for it
    as for its logits. Returns (B, n) log p and entropy (detached), 0 at the positions `mask` leaves out; of
    `logprob_settings`, the autocast and the temperature count here."""
    temperature = logprob_settings.temperature
    head = chunkable_head(model)
    assert head is not None
    own = head.forward  # the head's forward (a bound method, or a wrapper's instance attribute)
    entropies: list[torch.Tensor] = []

    def chunked(hidden: torch.Tensor) -> torch.Tensor:  # (B, K, H), K >= n
        B, n = targets.shape
        flat = hidden[:, :n].reshape(B * n, hidden.shape[-1])
        where = mask.reshape(-1).nonzero().squeeze(1)  # (N,) the real positions
        if where.numel() == 0:  # nothing to score: zeros, still in the graph (a backward runs through them)
            entropies.append(torch.zeros(B, n, device=hidden.device))
            return (flat[:, 0].float() * 0.0).view(B, n)
        states, ids = flat.index_select(0, where), targets.reshape(-1).index_select(0, where)
        if fused:  # the matmuls in the forward's autocast dtype, as the head's own forward would run them
            device = hidden.device.type
            dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
            logp, ent = head_logprobs(states, head.weight, head.bias, ids, temperature, chunk, dtype, with_entropy)
        else:
            logp, ent = _checkpointed_chunks(own, states, ids, temperature, chunk, with_entropy)
        out = torch.zeros(B * n, dtype=torch.float32, device=hidden.device).index_copy(0, where, logp)
        if ent is not None:
            full = torch.zeros(B * n, dtype=torch.float32, device=hidden.device)
            entropies.append(full.index_copy_(0, where, ent).view(B, n))
        return out.view(B, n)

    with _head_forward(head, chunked), forward_precision(batch, logprob_settings.autocast):
        logp = model(**forward).logits  # (B, n): what `chunked` returned
    return logp, (entropies[-1] if with_entropy else None)


def _checkpointed_chunks(
    head: Callable[[torch.Tensor], torch.Tensor],
    states: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    chunk: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N,) log p of `ids` (N,) from hidden `states` (N, H) through `head`, and the entropy (detached; None unless
    `with_entropy`): `chunk` positions at a time, each under activation checkpointing when a backward may come."""
    parts, ents = [], []
    for start in range(0, len(ids), chunk):
        part = (head, states[start : start + chunk], ids[start : start + chunk], temperature, with_entropy)
        if torch.is_grad_enabled():
            logp, ent = checkpoint(_chunk_logprobs, *part, use_reentrant=False)
        else:  # no backward, nothing to recompute (the reference and the old log-probs)
            logp, ent = _chunk_logprobs(*part)
        parts.append(logp)
        ents.append(ent)
    return torch.cat(parts), (torch.cat(ents) if with_entropy else None)


def _chunk_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    states: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p of `ids` (C,) from hidden `states` (C, H) through `head`, and the entropy (no gradient): the same ops
    on the same fp32 logits as `completion_logprobs`, on C positions. The entropy comes last, so a checkpoint's
    recompute (which stops once it has what backward saved) never recomputes it."""
    logits = head(states)  # (C, V), under the forward's autocast
    with torch.autocast(states.device.type, enabled=False):  # the log-softmax in fp32, as on the full logits
        logits = logits.float()
        if temperature != 1.0:
            logits = logits / temperature
        logp = token_logprobs(logits, ids)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach())
    return logp, entropy


@contextmanager
def _head_forward(head: torch.nn.Module, forward: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Inside, `head`'s forward is `forward` (an instance attribute shadowing the class's); restored after."""
    had, before = "forward" in head.__dict__, head.__dict__.get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if had:
            head.forward = before
        else:
            del head.forward
