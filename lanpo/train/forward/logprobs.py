"""The batched forward that turns rollouts (`lanpo.train.forward.batch.RolloutBatch`) into per-token log-probs.

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

The settings below travel as one value, `LogprobSettings` (`lanpo.train.forward.logprob_settings`), built once
from `[grpo]` and the rollouts' temperature.

`autocast` (`grpo.autocast`): the forwards under `torch.autocast`, the log-softmax in fp32 on upcast logits
(`lanpo.train.forward.batch`).

`temperature` (`rollout.temperature`): the log-probs (and the entropy) are those of softmax(logits / T), the
distribution the rollouts were sampled from, as verl computes them (`logits.div_(temperature)` in
`DataParallelPPOActor._forward_micro_batch`, for the policy's, the old and the reference log-probs alike) and TRL
(`logits / self.temperature` in `GRPOTrainer._get_per_token_logps`). At T = 1 nothing is divided: the numbers are
bit for bit those of a run before the setting existed. The division runs in fp32 on the upcast logits, out of
place (a model's own ops may have saved its logits for backward). `rollout.top_p` is not applied, as in verl and
TRL: below 1 the rollouts come from the renormalised nucleus of softmax(logits / T), not from all of it.

Chunked log-probs (`chunking`: `grpo.logprob_chunk_mb`, `grpo.logprob_chunk_tokens`, `grpo.logprob_fused`): above
a limit that the vocabulary sets (`lanpo.train.forward.chunking`), the head's logits exist a chunk of positions at
a time, recomputed in backward (`lanpo.train.forward.chunked`), so that they never hold more than the budget. At or
under the limit, or with chunking off, the full-logits path runs as before, bit for bit.

Token-budgeted micro-batches (`grpo.max_tokens_per_micro_batch`, `micro_batches`): consecutive rows up to a
budget of real prompt + completion tokens (verl's `ppo_max_token_len_per_gpu` with `use_dynamic_bsz`), never more
than `micro_batch_size` rows. The update weighs each micro-batch by its tokens, so the minibatch's loss is the same
token-mean (or seq-mean) whatever the split; under FSDP the ranks run as many micro-batches as the busiest, the
others zero-weight fillers (`lanpo.train.consumer.update`).
"""

from __future__ import annotations

from typing import Any

import torch

from lanpo.models import cache_kwarg, returned_cache
from lanpo.rl.logprobs import entropy_from_logits, token_logprobs
from lanpo.train.forward import chunked
from lanpo.train.forward.batch import RolloutBatch, forward_precision, prompts_forward, shared_prompts
from lanpo.train.forward.logprob_settings import PLAIN_LOGPROBS, LogprobSettings
from lanpo.train.plumbing.dist import Dist


def completion_logprobs(
    model: Any,
    batch: RolloutBatch,
    with_entropy: bool = False,
    logprob_settings: LogprobSettings = PLAIN_LOGPROBS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log p of the completion tokens (B, T), and optionally the entropy (B, T, detached); float32.

    Of `logprob_settings` (`LogprobSettings.from_grpo`; its micro-batching is `chunked_logprobs`'): `share_prompts`
    runs each distinct prompt once (see the module docstring); False runs every row whole, the reference the shared
    forward is tested against. Either way columns that pad every row are skipped. `autocast`: the forwards run
    under `torch.autocast` in this dtype (None: as the weights are); the log-softmax runs in fp32 on upcast logits
    either way. `temperature`: of softmax(logits / temperature), the sampling distribution (see the module
    docstring); 1 divides nothing. `chunking` (`Chunking.of(grpo config)`): above its limit of B x T positions at
    the head's vocabulary, the head's logits exist a chunk of positions at a time (see the module docstring), and
    the padded positions give 0; the default, NO_CHUNKS: never.
    """
    autocast, temperature = logprob_settings.autocast, logprob_settings.temperature
    if logprob_settings.chunking.on:
        chunk, fused = chunked.head_chunk(model, batch.completion_ids.numel(), logprob_settings.chunking)
        if chunk:
            return chunked.chunked_completion_logprobs(model, batch, with_entropy, logprob_settings, chunk, fused)
    T = batch.completion_ids.shape[1]
    cut, prompts, rows = shared_prompts(model, batch, logprob_settings.share_prompts)
    if prompts is not None and rows is not None:
        logits = _shared_prompt_logits(model, batch, cut, prompts, rows, autocast)
    else:
        with forward_precision(batch, autocast):
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
    out = prompts_forward(model, batch, cut, prompts, autocast)
    first = out.logits[rows]  # (B, 1, V): the prompt's last position predicts completion token 0
    if T == 1:
        return first
    cache = returned_cache(out)
    cache.batch_select_indices(rows)  # (U, ...) -> (B, ...); autograd sums the rows' gradients back
    with forward_precision(batch, autocast):
        rest = model(
            input_ids=batch.completion_ids[:, :-1],
            attention_mask=batch.attention_mask[:, cut : P + T - 1],
            position_ids=batch.position_ids[:, P : P + T - 1],
            **{cache_kwarg(model): cache},
            logits_to_keep=T - 1,
            use_cache=True,
        ).logits  # (B, T - 1, V): completion token t predicts token t + 1
    return torch.cat([first, rest], dim=1)


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
    logprob_settings: LogprobSettings,
    dist: Dist | None = None,
) -> torch.Tensor:
    """log p of the completion tokens (B, T) without gradients, `logprob_settings.micro_batch_size` sequences per
    forward (or fewer: its `max_tokens`, `grpo.max_tokens_per_micro_batch`, see `micro_batches`; the rest:
    `completion_logprobs`).

    The reference's log-probs (`Policy.reference_logprobs` runs it on the reference), and old_logp when several
    updates reuse the rollouts; both at the rollouts' temperature, as the policy's own (verl does the same).
    `dist` (where the forwards are collectives, FSDP): with a token budget the ranks' counts of micro-batches
    differ, so every rank runs as many as the busiest, a short one repeating its first row and dropping it.
    """
    max_tokens = logprob_settings.max_tokens
    groups = micro_batches(batch.attention_mask.sum(dim=1), logprob_settings.micro_batch_size, max_tokens)
    rounds = lockstep_rounds(groups, max_tokens, dist)
    parts = []
    for r in range(rounds):
        sub = batch.select(groups[r] if r < len(groups) else slice(0, 1))
        logp, _ = completion_logprobs(model, sub, False, logprob_settings)
        if r < len(groups):
            parts.append(logp)
    return torch.cat(parts)
