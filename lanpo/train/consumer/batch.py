"""Rollouts -> padded tensors, and the batched forward that turns them into per-token log-probs.

Layout (as TRL): prompts left-padded to P, completions right-padded to T, so every completion starts at column
P. The forward keeps logits for the completion positions only (`logits_to_keep`), which skips the vocabulary
projection over prompt tokens -- on a 135M model with a 49k vocabulary that projection is a large share of the
cost.

A GRPO group is n completions of one prompt, so a micro-batch holds few distinct prompts. The forward runs each
distinct prompt once, keeps its keys and values (a transformers cache), repeats them for the rows that share it
and runs only the completions on top: the same attention over the same tokens at the same positions, so the
same log-probs and gradients (to float rounding: ~1e-5 in fp32), at a fraction of the cost when prompts are long
(a LANPO feedback prompt carries its context: ~250 tokens in the learning experiment, in front of ~50-token
completions). Columns that pad every row of the micro-batch are dropped first: a step's batch is padded to its
longest prompt, a micro-batch need not be.

`autocast` (`grpo.autocast`): the model's forwards run under `torch.autocast` in that dtype (bf16), the weights
staying fp32; the logits are upcast to fp32 before the log-softmax and the entropy, and backward runs outside the
autocast context, as PyTorch recommends. Faster where bf16 matmuls are (AVX512-BF16 or AMX CPUs, GPUs); the
log-probs differ from fp32 by bf16 rounding.

`temperature` (`rollout.temperature`): the log-probs (and the entropy) are those of softmax(logits / T), the
distribution the rollouts were sampled from, as verl computes them (`logits.div_(temperature)` in
`DataParallelPPOActor._forward_micro_batch`, for the policy's, the old and the reference log-probs alike) and TRL
(`logits / self.temperature` in `GRPOTrainer._get_per_token_logps`). At T = 1 nothing is divided: the numbers are
bit for bit those of a run before the setting existed. The division runs in fp32 on the upcast logits, out of
place (a model's own ops may have saved its logits for backward). `rollout.top_p` is not applied, as in verl and
TRL: below 1 the rollouts come from the renormalised nucleus of softmax(logits / T), not from all of it.

Chunked log-probs (`grpo.logprob_chunk_tokens`, C): the fp32 logits of a micro-batch are rows x T x V (the paper's
8 rows of 8,192 tokens over Qwen2.5's 152,064 tokens: 39.9 GB a copy, and the logsumexp's backward and the entropy
each add one). Above C positions (rows x T), the model's head is swapped, for the one forward, for a function that
takes the hidden states of the real (unpadded) completion positions C at a time through the head's own forward,
then the same fp32 upcast, division by the temperature, logsumexp, gather and (no gradient) entropy, each chunk under
`torch.utils.checkpoint` (`use_reentrant=False`): backward recomputes a chunk's logits instead of keeping them
(verl bounds the same memory with `entropy_from_logits_with_chunking`, `entropy_checkpointing` and
`use_fused_kernels`). Peak memory grows as C x V, not rows x T x V. The head is
called from inside the model's own forward, so it works unchanged under PEFT (LoRA), DDP, tied embeddings and FSDP2
(the head's weights are in the root unit, gathered for its forward and again for its backward, where the
recompute runs). With shared prompts, the prompts' forward keeps its (U, 1, V) logits (the first completion token
of each row) and the completions' forward goes through the chunks. Completion columns that pad every row are
dropped first, and padded positions give 0 (masked everywhere). The result equals the full logits' to float
rounding (tests/train/test_chunked_logprobs.py: against a per-token loop, in value and in gradient). At or under C
positions, or C = 0, the full-logits path runs as before, bit for bit.

Token-budgeted micro-batches (`grpo.max_tokens_per_micro_batch`, `micro_batches`): consecutive rows up to a
budget of real prompt + completion tokens (verl's `ppo_max_token_len_per_gpu` with `use_dynamic_bsz`), never more
than `micro_batch_size` rows. The update weighs each micro-batch by its tokens, so the minibatch's loss is the same
token-mean (or seq-mean) whatever the split; under FSDP the ranks run as many micro-batches as the busiest, the
others zero-weight fillers (`lanpo.train.consumer.update`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from lanpo.models import bf16_pays, cache_kwarg, default_device, returned_cache
from lanpo.rl.logprobs import entropy_from_logits, token_logprobs
from lanpo.train.plumbing import fsdp
from lanpo.train.plumbing.dist import Dist


@dataclass
class RolloutBatch:
    """B sequences = prompt (left-padded to P) + completion (right-padded to T)."""

    input_ids: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T)
    position_ids: torch.Tensor  # (B, P + T)
    completion_ids: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T) 1 = a generated token (EOS included)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, index: torch.Tensor | slice) -> RolloutBatch:
        return RolloutBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.position_ids[index],
            self.completion_ids[index],
            self.completion_mask[index],
        )


def build_batch(
    prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> RolloutBatch:
    """Pad prompts on the left and completions on the right (an empty completion keeps one masked pad)."""
    P = max(len(p) for p in prompt_ids)
    T = max(1, max(len(c) for c in completion_ids))
    B = len(prompt_ids)
    input_ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, P + T), dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        input_ids[b, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attention[b, P - len(p) : P] = 1
        if c:
            input_ids[b, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
            attention[b, P : P + len(c)] = 1
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)  # (B, P + T)
    completion_mask = attention[:, P:].clone()  # (B, T)
    return RolloutBatch(
        input_ids.to(device),
        attention.to(device),
        position_ids.to(device),
        input_ids[:, P:].to(device),
        completion_mask.to(device),
    )


AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"off": None, "bf16": torch.bfloat16}  # grpo.autocast


def autocast_dtype(setting: str, device: torch.device | None = None) -> torch.dtype | None:
    """`grpo.autocast` ("off" | "bf16" | "auto") as the dtype the forwards autocast to (None: none, plain fp32);
    "auto" is bf16 where a bf16 matmul measures faster than fp32 on `device`, where the forwards run (`bf16_pays`;
    default: the device the trainer would pick)."""
    if setting == "auto":
        return torch.bfloat16 if bf16_pays(device or default_device()) else None
    return AUTOCAST_DTYPES[setting]


def _forward_precision(batch: RolloutBatch, autocast: torch.dtype | None) -> AbstractContextManager[Any]:
    """Around a model forward: `torch.autocast` to `autocast` on the batch's device, or nothing (None)."""
    if autocast is None:  # not even a disabled autocast: a caller's own autocast context stays in force
        return nullcontext()
    return torch.autocast(device_type=batch.input_ids.device.type, dtype=autocast)


def completion_logprobs(
    model: Any,
    batch: RolloutBatch,
    with_entropy: bool = False,
    share_prompts: bool = True,
    autocast: torch.dtype | None = None,
    temperature: float = 1.0,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log p of the completion tokens (B, T), and optionally the entropy (B, T, detached); float32.

    `share_prompts`: run each distinct prompt once (see the module docstring); False runs every row whole, the
    reference the shared forward is tested against. Either way columns that pad every row are skipped.
    `autocast`: the forwards run under `torch.autocast` in this dtype (None: as the weights are); the log-softmax
    runs in fp32 on upcast logits either way. `temperature`: of softmax(logits / temperature), the sampling
    distribution (see the module docstring); 1 divides nothing. `chunk_tokens` (`grpo.logprob_chunk_tokens`):
    above B x T = this many positions, the head's logits exist a chunk of this many positions at a time (see the
    module docstring), and the padded positions give 0; 0: never.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens and batch.completion_ids.numel() > chunk_tokens and _chunkable_head(model) is not None:
        return _chunked_completion_logprobs(
            model, batch, with_entropy, share_prompts, autocast, temperature, chunk_tokens
        )
    T = batch.completion_ids.shape[1]
    P = batch.input_ids.shape[1] - T
    cut = _padding_columns(batch.attention_mask[:, :P])
    prompts, rows = None, None
    if share_prompts and _can_share(model):  # only then is it worth finding the distinct prompts
        prompts, rows = _distinct_prompts(batch.input_ids[:, cut:P], batch.attention_mask[:, cut:P])
    if prompts is not None and rows is not None and len(prompts) < batch.size:
        logits = _shared_prompt_logits(model, batch, cut, prompts, rows, autocast)
    else:
        with _forward_precision(batch, autocast):
            out = model(
                input_ids=batch.input_ids[:, cut:],
                attention_mask=batch.attention_mask[:, cut:],
                position_ids=batch.position_ids[:, cut:],
                logits_to_keep=T + 1,
                use_cache=False,
            )
        logits = out.logits[:, :-1, :]  # (B, T, V): position P-1+t predicts completion token t
    logits = logits.float()  # outside autocast, which would run the log-softmax in bf16 (fp32 logits: no copy)
    if temperature != 1.0:  # the sampled policy; skipped at 1, so a T = 1 run keeps its numbers bit for bit
        logits = logits / temperature
    logp = token_logprobs(logits, batch.completion_ids)  # (B, T)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())  # (B, T)
    return logp, entropy


def _padding_columns(prompt_mask: torch.Tensor) -> int:
    """How many leading columns pad every row (prompts are left-padded)."""
    return int((prompt_mask.sum(dim=0) == 0).long().cumprod(dim=0).sum())


def _distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(U,) the first row of each distinct prompt, and (B,) which of them each row holds."""
    keys = torch.cat([prompt_ids, prompt_mask], dim=1)  # the mask too: a prompt may begin with the pad token
    _, rows = torch.unique(keys, dim=0, return_inverse=True)  # (B,) into the U sorted distinct rows
    first = torch.full((int(rows.max()) + 1,), keys.shape[0], dtype=torch.long, device=rows.device)
    first = first.scatter_reduce(0, rows, torch.arange(keys.shape[0], device=rows.device), "amin")
    order = torch.argsort(first)  # the distinct prompts in the order they first appear
    return first[order], torch.argsort(order)[rows]


def _can_share(model: Any) -> bool:
    """Whether prompts can run apart from their completions. The forward must return a key/value cache (not in
    training mode under gradient checkpointing). And not on an FSDP-sharded model: two forwards of its units
    before one backward gave other weights than the single process at 2 ranks (tests/train/test_multirank.py),
    so sharded full fine-tuning runs rows whole, its reference too (one rule, which a single process can match
    with `grpo.share_prompts = false`)."""
    if fsdp.is_sharded(model):
        return False
    return not (model.training and any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()))


def _prompts_forward(
    model: Any, batch: RolloutBatch, cut: int, prompts: torch.Tensor, autocast: torch.dtype | None
) -> Any:
    """The U distinct prompts (`prompts` (U,) row indices) in one forward, their cache kept and the logits of their
    last position alone (each predicts its rows' first completion token)."""
    P = batch.input_ids.shape[1] - batch.completion_ids.shape[1]
    with _forward_precision(batch, autocast):
        return model(
            input_ids=batch.input_ids[prompts, cut:P],
            attention_mask=batch.attention_mask[prompts, cut:P],
            position_ids=batch.position_ids[prompts, cut:P],
            logits_to_keep=1,
            use_cache=True,
        )


def _shared_prompt_logits(
    model: Any,
    batch: RolloutBatch,
    cut: int,
    prompts: torch.Tensor,
    rows: torch.Tensor,
    autocast: torch.dtype | None = None,
) -> torch.Tensor:
    """(B, T, V) logits predicting the completion tokens: the U distinct prompts in one forward (cache kept), the
    cache repeated to the B rows, then the completions but their last token (which predicts nothing) on top."""
    T = batch.completion_ids.shape[1]
    P = batch.input_ids.shape[1] - T
    out = _prompts_forward(model, batch, cut, prompts, autocast)
    first = out.logits[rows]  # (B, 1, V): the prompt's last position predicts completion token 0
    if T == 1:
        return first
    cache = returned_cache(out)
    cache.batch_select_indices(rows)  # (U, ...) -> (B, ...); autograd sums the rows' gradients back
    with _forward_precision(batch, autocast):
        rest = model(
            input_ids=batch.completion_ids[:, :-1],
            attention_mask=batch.attention_mask[:, cut : P + T - 1],
            position_ids=batch.position_ids[:, P : P + T - 1],
            **{cache_kwarg(model): cache},
            logits_to_keep=T - 1,
            use_cache=True,
        ).logits  # (B, T - 1, V): completion token t predicts token t + 1
    return torch.cat([first, rest], dim=1)


def _chunkable_head(model: Any) -> torch.nn.Module | None:
    """The output embedding (the head) of `model`, under a DDP, PEFT or FSDP wrapper, when the chunked path can
    stand in for it: the model hands the head's output back as its logits, untouched (None where it would not:
    Gemma-2's final soft-capping; and where the model names no output embedding)."""
    inner = getattr(model, "module", model)  # DistributedDataParallel
    if getattr(getattr(inner, "config", None), "final_logit_softcapping", None) is not None:
        return None
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, torch.nn.Module) else None


def _chunked_completion_logprobs(
    model: Any,
    batch: RolloutBatch,
    with_entropy: bool,
    share_prompts: bool,
    autocast: torch.dtype | None,
    temperature: float,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`completion_logprobs` with the head's logits a `chunk` of positions at a time (the module docstring): the
    same forwards (rows whole, or shared prompts), the completion columns that pad every row dropped first, the
    padded positions 0."""
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
    cut = _padding_columns(sub.attention_mask[:, :P])
    prompts, rows = None, None
    if share_prompts and _can_share(model):
        prompts, rows = _distinct_prompts(sub.input_ids[:, cut:P], sub.attention_mask[:, cut:P])
    if prompts is not None and rows is not None and len(prompts) < sub.size:
        logp, entropy = _shared_prompt_chunks(
            model, sub, cut, prompts, rows, with_entropy, autocast, temperature, chunk
        )
    else:
        logp, entropy = _head_chunks(
            model, sub, sub.completion_ids, sub.completion_mask, with_entropy, autocast, temperature, chunk,
            input_ids=sub.input_ids[:, cut:], attention_mask=sub.attention_mask[:, cut:],
            position_ids=sub.position_ids[:, cut:], logits_to_keep=keep + 1, use_cache=False,
        )  # fmt: skip
    pad = (0, T - keep)
    return torch.nn.functional.pad(logp, pad), None if entropy is None else torch.nn.functional.pad(entropy, pad)


def _shared_prompt_chunks(
    model: Any,
    batch: RolloutBatch,
    cut: int,
    prompts: torch.Tensor,
    rows: torch.Tensor,
    with_entropy: bool,
    autocast: torch.dtype | None,
    temperature: float,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_shared_prompt_logits` in chunks: the prompts' forward keeps its (U, 1, V) logits, which predict each row's
    first completion token; the completions' forward on the repeated cache goes through the chunked head."""
    T = batch.completion_ids.shape[1]
    P = batch.input_ids.shape[1] - T
    out = _prompts_forward(model, batch, cut, prompts, autocast)
    first = out.logits[rows].float()  # (B, 1, V): small, one position a row
    if temperature != 1.0:
        first = first / temperature
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
        model, batch, batch.completion_ids[:, 1:], batch.completion_mask[:, 1:], with_entropy, autocast,
        temperature, chunk, input_ids=batch.completion_ids[:, :-1],
        attention_mask=batch.attention_mask[:, cut : P + T - 1], position_ids=batch.position_ids[:, P : P + T - 1],
        **{cache_kwarg(model): cache}, logits_to_keep=T - 1, use_cache=True,
    )  # fmt: skip
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
    autocast: torch.dtype | None,
    temperature: float,
    chunk: int,
    **forward: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward of `model` (keywords `forward`) whose head, for its kept positions (the first n =
    targets.shape[1] of them predicting `targets` (B, n)), returns log p of the targets instead of logits: the
    hidden states of the `mask`ed positions, a `chunk` at a time, through the head's own forward, each chunk under
    activation checkpointing (backward recomputes its logits rather than keeping them). The head runs inside the
    model's forward, so an FSDP root unit has its weights gathered for it as for its logits. Returns (B, n) log p
    and entropy (detached), 0 at the positions `mask` leaves out."""
    head = _chunkable_head(model)
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
        parts, ents = [], []
        for start in range(0, len(where), chunk):
            part = (own, states[start : start + chunk], ids[start : start + chunk], temperature, with_entropy)
            if torch.is_grad_enabled():
                logp, ent = checkpoint(_chunk_logprobs, *part, use_reentrant=False)
            else:  # no backward, nothing to recompute (the reference and the old log-probs)
                logp, ent = _chunk_logprobs(*part)
            parts.append(logp)
            ents.append(ent)
        out = torch.zeros(B * n, dtype=torch.float32, device=hidden.device).index_copy(0, where, torch.cat(parts))
        if with_entropy:
            full = torch.zeros(B * n, dtype=torch.float32, device=hidden.device)
            entropies.append(full.index_copy_(0, where, torch.cat(ents)).view(B, n))
        return out.view(B, n)

    with _head_forward(head, chunked), _forward_precision(batch, autocast):
        logp = model(**forward).logits  # (B, n): what `chunked` returned
    return logp, (entropies[-1] if with_entropy else None)


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


def micro_batches(lengths: torch.Tensor, rows: int, max_tokens: int = 0) -> list[slice]:
    """Consecutive micro-batches over rows of `lengths` (B,) real tokens each: `rows` rows each (max_tokens 0, as
    before the setting), else as many consecutive rows as `max_tokens` tokens hold, at most `rows` (a row longer
    than the budget alone). Consecutive, so a group's rows stay together and share their prompt's forward."""
    if not max_tokens:
        return [slice(start, start + rows) for start in range(0, len(lengths), rows)]
    out, start, total = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        if i > start and (i - start == rows or total + n > max_tokens):
            out.append(slice(start, i))
            start, total = i, 0
        total += n
    if len(lengths) > start:
        out.append(slice(start, len(lengths)))
    return out


def lockstep_rounds(groups: list[slice], max_tokens: int, dist: Dist | None) -> int:
    """How many micro-batches a rank runs over its `groups`: all of them, or, under a token budget (`max_tokens`)
    across ranks whose forwards or backwards are collectives (`dist`: FSDP, DDP), as many as the busiest rank's,
    the ones past its own fillers (the ranks' counts differ only under a budget)."""
    if not max_tokens or dist is None or dist.world == 1:
        return len(groups)
    return int(dist.all_reduce_max(torch.tensor([len(groups)])).item())


@torch.no_grad()
def chunked_logprobs(
    model: Any,
    batch: RolloutBatch,
    micro_batch_size: int,
    share_prompts: bool = True,
    autocast: torch.dtype | None = None,
    temperature: float = 1.0,
    max_tokens: int = 0,
    chunk_tokens: int = 0,
    dist: Dist | None = None,
) -> torch.Tensor:
    """log p of the completion tokens (B, T) without gradients, `micro_batch_size` sequences per forward (or
    fewer: `max_tokens`, `grpo.max_tokens_per_micro_batch`, see `micro_batches`; `chunk_tokens`:
    `completion_logprobs`).

    The reference's log-probs (`Policy.reference_logprobs` runs it on the reference), and old_logp when several
    updates reuse the rollouts; both at the rollouts' `temperature`, as the policy's own (verl does the same).
    `dist` (where the forwards are collectives, FSDP): with a token budget the ranks' counts of micro-batches
    differ, so every rank runs as many as the busiest, a short one repeating its first row and dropping it.
    """
    groups = micro_batches(batch.attention_mask.sum(dim=1), micro_batch_size, max_tokens)
    rounds = lockstep_rounds(groups, max_tokens, dist)
    parts = []
    for r in range(rounds):
        sub = batch.select(groups[r] if r < len(groups) else slice(0, 1))
        logp, _ = completion_logprobs(model, sub, False, share_prompts, autocast, temperature, chunk_tokens)
        if r < len(groups):
            parts.append(logp)
    return torch.cat(parts)
