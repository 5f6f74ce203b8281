"""Log-probs without the full logits (`lanpo.train.forward.chunked`): the head's logits a chunk of positions at a
time (`grpo.logprob_chunk_mb`, `grpo.logprob_chunk_tokens`, through the fused head or the checkpointed one), and
token-budgeted micro-batches (`grpo.max_tokens_per_micro_batch`).

The reference is a loop: every completion token's log p (and entropy) from a plain forward of its own row, unpadded,
up to that token, and a log_softmax of the last position's logits. The chunked path must give the same values and,
after a backward of a weighted sum, the same parameter gradients: LoRA and full fine-tuning, prompts shared or not,
temperature 1 and 0.7, fused or not, the tiny model's 101-token vocabulary and Qwen2.5's 152,064 at a small hidden
size. The chunk sizes follow the byte budget at, below and above each of its limits. The budgeted micro-batches
must give the same update as `micro_batch_size` rows each, every micro-batch within budget.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

import lanpo.rl.head_logprobs as fused_module
import lanpo.train.forward.chunked as chunked_module
from lanpo.train.config import GRPOConfig, LoraConfig, ModelConfig
from lanpo.train.consumer import update as update_module
from lanpo.train.consumer.update import update_policy, warmup_schedule
from lanpo.train.forward.batch import RolloutBatch, build_batch
from lanpo.train.forward.chunking import CHECKPOINTED_BYTES, FULL_BYTES, FUSED_BYTES, Chunking
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import chunked_logprobs, completion_logprobs, micro_batches
from lanpo.train.policy import FullPolicy, LoraPolicy, load_base, load_policy

QWEN_VOCAB = 152_064  # Qwen2.5's vocabulary (config.json "vocab_size")


def _rollouts(vocab: int, prompt_lengths: tuple[int, ...] = (4, 2, 6), seed: int = 3) -> RolloutBatch:
    """A group of 2 rows per prompt, completions of 1..6 tokens (uneven: left and right padding)."""
    g = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for length in prompt_lengths:
        prompt = torch.randint(3, vocab, (length,), generator=g).tolist()
        for _ in range(2):
            prompts.append(prompt)
            completions.append(torch.randint(3, vocab, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g))
    return build_batch(prompts, [c.tolist() for c in completions], 0, torch.device("cpu"))


def _lora() -> Any:
    model, _ = load_policy(ModelConfig(name="tiny-random", threads=1), LoraConfig(r=4, alpha=8), seed=0)
    with torch.no_grad():  # LoRA B off zero, so A gets a gradient too
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    return model


def _full(checkpointing: bool = False) -> Any:
    model, _ = load_base(ModelConfig(name="tiny-random", threads=1, gradient_checkpointing=checkpointing))
    return model.requires_grad_(True)


def _qwen_shaped() -> Any:
    """Qwen2-shaped, random weights, the real vocabulary, hidden 16, untied head (as Qwen2.5-7B)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=QWEN_VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def _loop_reference(model: Any, batch: RolloutBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log p and entropy, each token from a plain forward of its row's real tokens up to it (0 at pads)."""
    T = batch.completion_ids.shape[1]
    P = batch.input_ids.shape[1] - T
    logp = [[torch.zeros(()) for _ in range(T)] for _ in range(batch.size)]
    entropy = torch.zeros(batch.size, T)
    for b in range(batch.size):
        prompt = batch.input_ids[b, :P][batch.attention_mask[b, :P].bool()]
        for t in range(int(batch.completion_mask[b].sum())):
            ids = torch.cat([prompt, batch.completion_ids[b, :t]])[None]
            logits = model(input_ids=ids, use_cache=False).logits[0, -1].float() / temperature
            dist = torch.log_softmax(logits, dim=-1)
            logp[b][t] = dist[batch.completion_ids[b, t]]
            entropy[b, t] = -(dist.exp() * dist).sum().detach()
    return torch.stack([torch.stack(row) for row in logp]), entropy


def _grads(model: Any, logp: torch.Tensor, batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """The parameter gradients of a weighted sum of the log-probs (weights off 1: each token counts differently)."""
    weights = torch.linspace(0.5, 1.5, logp.numel()).view_as(logp) * batch.completion_mask
    model.zero_grad(set_to_none=True)
    (logp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _assert_close(got: torch.Tensor, want: torch.Tensor, rel: float, name: str) -> None:
    """Equal to float rounding at the tensor's own scale (elementwise tolerances fail on its near-zero entries)."""
    scale = float(want.abs().max())
    assert scale > 0, f"{name}: nothing to compare (all zero)"
    assert float((got - want).abs().max()) <= rel * scale, f"{name}: {float((got - want).abs().max())} vs {scale}"


class ChunkCount:
    """The chunks the chunked path ran, forward only (so a test knows it was engaged, and through which head), and
    their sizes: the fused head's (`fused`) and the checkpointed one's (`checkpointed`, a checkpoint's recompute
    included)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fused: list[int] = []
        self.checkpointed: list[int] = []
        own, logits = chunked_module._chunk_logprobs, fused_module._logits

        def counted(head: Any, states: torch.Tensor, *args: Any) -> Any:
            self.checkpointed.append(int(states.shape[0]))
            return own(head, states, *args)

        def fused(x: torch.Tensor, *args: Any) -> torch.Tensor:
            if torch._C._current_graph_task_id() == -1:  # a forward's chunk, not backward's recompute
                self.fused.append(int(x.shape[0]))
            return logits(x, *args)

        monkeypatch.setattr(chunked_module, "_chunk_logprobs", counted)
        monkeypatch.setattr(fused_module, "_logits", fused)

    @property
    def sizes(self) -> list[int]:
        return self.fused + self.checkpointed


def _assert_matches_loop(model: Any, batch: RolloutBatch, share: bool, temperature: float, chunking: Chunking) -> None:
    model.train()
    ref_logp, ref_entropy = _loop_reference(model, batch, temperature)
    ref_grads = _grads(model, ref_logp, batch)
    logp, entropy = completion_logprobs(
        model, batch, True, LogprobSettings(share_prompts=share, temperature=temperature, chunking=chunking)
    )
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(logp[mask], ref_logp[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy[mask], ref_entropy[mask], rtol=1e-5, atol=1e-5)  # type: ignore[index]
    grads = _grads(model, logp, batch)
    assert grads.keys() == ref_grads.keys() and grads
    for name, grad in grads.items():
        _assert_close(grad, ref_grads[name], 1e-4, name)


@pytest.mark.parametrize("kind", ["lora", "full", "full-checkpointing"])
@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("fused", [True, False])
def test_chunked_logprobs_equal_the_per_token_loop_in_value_and_gradient(
    kind: str, share: bool, temperature: float, fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _lora() if kind == "lora" else _full(checkpointing=kind == "full-checkpointing")
    batch = _rollouts(vocab=100)
    share = share and kind != "full-checkpointing"  # a checkpointed model in training returns no cache: rows whole
    chunks = ChunkCount(monkeypatch)
    _assert_matches_loop(model, batch, share, temperature, Chunking(tokens=4, fused=fused))  # chunks across rows
    ran, other = (chunks.fused, chunks.checkpointed) if fused else (chunks.checkpointed, chunks.fused)
    assert ran and max(ran) == 4 and not other
    real = int(batch.completion_mask.sum()) - (batch.size if share else 0)  # shared: each row's first via the prompt
    assert len(ran) >= (1 if fused else 2) * real // 4  # checkpointed: each chunk again in backward


@pytest.mark.parametrize("fused", [True, False])
def test_chunked_logprobs_at_qwens_152064_token_vocabulary(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Full fine-tuning of an untied head over the real vocabulary: value, entropy and every gradient, the chunks
    sized by a byte budget (5 positions a chunk at the fused head's 8 bytes, or the checkpointed head's 16)."""
    chunks = ChunkCount(monkeypatch)
    budget = 5 * QWEN_VOCAB * (FUSED_BYTES if fused else CHECKPOINTED_BYTES)
    _assert_matches_loop(_qwen_shaped(), _rollouts(vocab=QWEN_VOCAB), True, 0.7, Chunking(budget, fused=fused))
    assert max(chunks.fused if fused else chunks.checkpointed) == 5


def test_the_old_path_is_untouched_at_or_under_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunking off, a micro-batch of at most `tokens` positions, or one whose full logits fit the byte budget
    (N x V x 24 bytes) keeps today's path, bit for bit; one position more chunks."""
    model, batch = _lora(), _rollouts(vocab=100)
    N, V = batch.completion_ids.numel(), model.get_output_embeddings().out_features
    chunks = ChunkCount(monkeypatch)
    plain = completion_logprobs(model, batch, True, LogprobSettings(temperature=0.7))
    for unchunked in (Chunking(), Chunking(tokens=N), Chunking(tokens=N + 1), Chunking(N * V * FULL_BYTES)):
        logp, entropy = completion_logprobs(model, batch, True, LogprobSettings(temperature=0.7, chunking=unchunked))
        assert torch.equal(logp, plain[0]) and torch.equal(entropy, plain[1])  # type: ignore[arg-type]
    assert chunks.sizes == []
    for chunking in (Chunking(tokens=N - 1), Chunking(N * V * FULL_BYTES - 1)):
        logp, _ = completion_logprobs(model, batch, True, LogprobSettings(temperature=0.7, chunking=chunking))
        assert chunks.sizes, chunking
        mask = batch.completion_mask.bool()  # the full logits score pads too, the chunks give them 0
        torch.testing.assert_close(logp[mask], plain[0][mask], rtol=1e-5, atol=1e-5)
        chunks.fused.clear()


@pytest.mark.parametrize("fused", [True, False])
def test_a_micro_batch_at_below_and_above_the_chunk_size(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget sets C = budget / (V x bytes a position): a micro-batch of exactly C real positions is one chunk,
    C - 1 one chunk, C + 1 two (C and 1); every one equal to the full logits."""
    model, batch = _full(), _rollouts(vocab=100)
    model.train()
    V, R = model.get_output_embeddings().out_features, int(batch.completion_mask.sum())
    mask = batch.completion_mask.bool()
    plain = completion_logprobs(model, batch, True, LogprobSettings(share_prompts=False, temperature=0.7))
    chunks = ChunkCount(monkeypatch)
    for C, want in ((R, [R]), (R + 1, [R]), (R - 1, [R - 1, 1])):  # rows whole: every real position in the chunks
        chunking = Chunking(C * V * (FUSED_BYTES if fused else CHECKPOINTED_BYTES), fused=fused)
        assert chunking.sizes(V, fused)[1] == C
        with torch.no_grad():  # forward only: each chunk counted once
            logp, entropy = completion_logprobs(
                model, batch, True, LogprobSettings(share_prompts=False, temperature=0.7, chunking=chunking)
            )
        assert (chunks.fused if fused else chunks.checkpointed) == want, C
        assert not (chunks.checkpointed if fused else chunks.fused)
        chunks.fused.clear(), chunks.checkpointed.clear()
        torch.testing.assert_close(logp[mask], plain[0][mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(entropy[mask], plain[1][mask], rtol=1e-5, atol=1e-5)  # type: ignore[index]


def test_the_default_budget_at_qwens_vocabulary() -> None:
    """`grpo.logprob_chunk_mb`'s default at 152,064 tokens: chunks of 220 positions (fused; 110 unfused), the full
    logits only up to 73 positions; so a micro-batch of 4 x 1,024 positions holds at most 220 / 4,096 of its full
    fp32 logits in chunk logits (a quarter copy would be 1,024 x 4 bytes a position; the fused head holds 8), and
    8 x 8,192 the same 256 MiB."""
    chunking = Chunking.of(GRPOConfig())
    assert chunking.budget == 256 * 2**20 and chunking.fused and chunking.tokens == 0
    assert chunking.sizes(QWEN_VOCAB, True) == (73, 220)
    assert chunking.sizes(QWEN_VOCAB, False) == (73, 110)
    for positions in (4 * 1024, 8 * 8192):
        chunk = chunking.chunk(positions, QWEN_VOCAB, True)
        assert chunk * QWEN_VOCAB * FUSED_BYTES <= chunking.budget
        assert chunk * QWEN_VOCAB * FUSED_BYTES <= 0.25 * 4 * 1024 * QWEN_VOCAB * 4
    assert chunking.chunk(73, QWEN_VOCAB, True) == 0 and chunking.chunk(74, QWEN_VOCAB, True) == 220


@pytest.mark.parametrize("fused", [True, False])
def test_chunked_logprobs_under_bf16_autocast_match_the_full_logits(fused: bool) -> None:
    """Under bf16 autocast the chunked path and the full logits round alike (a looser tolerance than fp32)."""
    model, batch = _lora(), _rollouts(vocab=100)
    model.train()
    mask = batch.completion_mask.bool()
    plain, plain_entropy = completion_logprobs(
        model, batch, True, LogprobSettings(autocast=torch.bfloat16, temperature=0.7)
    )
    chunking = Chunking(tokens=4, fused=fused)
    logp, entropy = completion_logprobs(
        model, batch, True, LogprobSettings(autocast=torch.bfloat16, temperature=0.7, chunking=chunking)
    )
    torch.testing.assert_close(logp[mask], plain[mask], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(entropy[mask], plain_entropy[mask], rtol=2e-2, atol=2e-2)  # type: ignore[index]
    plain_grads, grads = _grads(model, plain, batch), _grads(model, logp, batch)
    for name, grad in grads.items():
        _assert_close(grad, plain_grads[name], 5e-2, name)


def test_micro_batches_hold_the_budget_and_every_row_once() -> None:
    lengths = torch.tensor([5, 9, 3, 20, 4, 4, 4, 1, 7])
    assert micro_batches(lengths, 4) == [slice(0, 4), slice(4, 8), slice(8, 12)]  # 0: rows, as before
    groups = micro_batches(lengths, 3, max_tokens=12)
    assert [i for g in groups for i in range(len(lengths))[g]] == list(range(len(lengths)))  # in order, once each
    for g in groups:
        rows = lengths[g]
        assert len(rows) <= 3 and (int(rows.sum()) <= 12 or len(rows) == 1)
    assert groups == [slice(0, 1), slice(1, 3), slice(3, 4), slice(4, 7), slice(7, 9)]


def _lora_update(cfg: GRPOConfig, sizes: list[int] | None = None) -> dict[str, torch.Tensor]:
    """One update (two minibatches, PPO ratio on old log-probs) by SGD at lr 1 and no clipping: each weight moves
    by exactly its summed gradient. `sizes`: the real tokens of each micro-batch, appended."""
    model = _lora()
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    policy = LoraPolicy(model)
    g = torch.Generator().manual_seed(5)
    batch = _rollouts(vocab=100, prompt_lengths=(4, 2, 6, 3, 5, 2))  # 12 rows
    advantages = torch.randn(batch.size, generator=g)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
    update_policy(policy, optimizer, warmup_schedule(optimizer, 10, 0.0), batch, advantages, cfg, seed=0)
    return {n: p.detach() - start[n] for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean"])
def test_token_budgeted_micro_batches_give_the_row_micro_batches_update(
    loss_agg: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = GRPOConfig(
        learning_rate=1.0, warmup_ratio=0.0, beta=0.05, minibatch_size=6, micro_batch_size=4, max_grad_norm=1e9,
        loss_agg=loss_agg, logprob_chunk_mb=0,
    )  # fmt: skip
    rows = _lora_update(cfg)
    seen: list[torch.Tensor] = []
    own = update_module.micro_batch_loss

    def recorded(model: Any, sub: RolloutBatch, *args: Any, **kwargs: Any) -> Any:
        seen.append(sub.attention_mask.sum(dim=1))
        return own(model, sub, *args, **kwargs)

    monkeypatch.setattr(update_module, "micro_batch_loss", recorded)
    budget = replace(cfg, max_tokens_per_micro_batch=14)
    budgeted = _lora_update(budget)
    assert sum(len(s) for s in seen) == 12 and len(seen) > 12 // 4  # every row once, in more micro-batches
    assert all(len(s) <= 4 and (int(s.sum()) <= 14 or len(s) == 1) for s in seen)
    assert any(len(s) > 1 for s in seen)
    for name, moved in rows.items():
        _assert_close(budgeted[name], moved, 1e-4, name)  # weight deltas: fp32 rounding of the weights


def test_reference_logprobs_with_a_budget_and_chunks_equal_the_plain_ones() -> None:
    model = _full()
    batch = _rollouts(vocab=100)
    plain = chunked_logprobs(model, batch, LogprobSettings(micro_batch_size=4))
    both = chunked_logprobs(
        model, batch, LogprobSettings(micro_batch_size=4, max_tokens=9, chunking=Chunking(tokens=3))
    )
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(both[mask], plain[mask], rtol=1e-5, atol=1e-6)
    policy = FullPolicy(_full())
    chunking = Chunking(tokens=3, fused=False)
    torch.testing.assert_close(
        policy.reference_logprobs(batch, LogprobSettings(micro_batch_size=4, max_tokens=9, chunking=chunking))[mask],
        plain[mask],
    )
