"""MEL's NLL term in the update: J = J_GRPO + lambda * J_NLL, exact against a hand-computed loss on the tiny model,
nothing at all when lambda = 0 (the update is plain GRPO, bit for bit), and the same at two ranks as in one process
when the ranks hold different numbers of NLL examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from lanpo.rl.loss import nll_sum_of
from lanpo.train.config import GRPOConfig
from lanpo.train.consumer.update import NLLTerm, update_policy, warmup_schedule
from lanpo.train.forward.batch import build_batch
from lanpo.train.forward.logprobs import completion_logprobs
from lanpo.train.policy import LoraPolicy
from tests.mel import nll_workers as w
from tests.train import multirank_workers as grpo

# no clipping (it would rescale the gradients compared), two minibatches, micro-batches that split unevenly
CFG = GRPOConfig(
    learning_rate=1e-2, warmup_ratio=0.0, beta=0.05, minibatch_size=16, micro_batch_size=2, max_grad_norm=1e9
)


class CaptureGrad(torch.optim.SGD):
    """Records each optimizer step's gradient (after clipping) and moves nothing (lr 0)."""

    captured: list[torch.Tensor]

    def step(self, closure=None):  # type: ignore[override]
        grads = torch.cat([p.grad.flatten() for p in self.param_groups[0]["params"]])
        self.captured = [*getattr(self, "captured", []), grads]


def _update(nll: NLLTerm | None, optimizer_cls: type = CaptureGrad, model: Any = None) -> tuple[object, object, dict]:
    """One update of the tiny policy (`model`: that policy, put back to its start in place, in its own memory)."""
    if model is None:
        model, _ = grpo.policy()
    else:
        start = grpo.policy()[0].state_dict()
        with torch.no_grad():
            for name, p in model.state_dict().items():
                p.copy_(start[name])
    prompts, completions, advantages = grpo.global_rollouts()
    batch = build_batch(prompts, completions, 0, torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = optimizer_cls(params, lr=0.0) if optimizer_cls is CaptureGrad else optimizer_cls(params, lr=1e-2)
    schedule = warmup_schedule(optimizer, 4, 0.0)
    stats = update_policy(LoraPolicy(model), optimizer, schedule, batch, advantages, CFG, seed=0, nll=nll)
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return optimizer, stats, weights


def _nll_batch():
    return build_batch(*w.nll_examples(), 0, torch.device("cpu"))


def nll_loop_reference(model, prompts: list[list[int]], targets: list[list[int]]) -> torch.Tensor:
    """-log p(target token | prompt and the target tokens before it), one sequence at a time, no padding, summed
    token by token; divided by the number of target tokens."""
    total, count = torch.zeros(()), 0
    for prompt, target in zip(prompts, targets, strict=True):
        ids = torch.tensor([prompt + target])
        logits = model(input_ids=ids).logits[0]  # (P + T, V)
        for t, token in enumerate(target):
            total = total - torch.log_softmax(logits[len(prompt) + t - 1], dim=-1)[token]
            count += 1
    return total / count


def test_nll_sum_against_a_loop() -> None:
    logp = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    looped = -sum(float(logp[b, t]) for b in range(3) for t in range(5) if mask[b, t])
    assert torch.allclose(nll_sum_of(logp, mask), torch.tensor(looped))


def test_batched_nll_equals_the_loop_reference() -> None:
    model, _ = grpo.policy()
    prompts, targets = w.nll_examples()
    batch = _nll_batch()
    logp, _ = completion_logprobs(model, batch)
    mean = nll_sum_of(logp, batch.completion_mask) / batch.completion_mask.sum()
    assert torch.allclose(mean, nll_loop_reference(model, prompts, targets), atol=1e-5)


def test_nll_term_is_lambda_times_the_hand_computed_gradient() -> None:
    lam = 0.5
    plain, plain_stats, _ = _update(None)
    joint, joint_stats, _ = _update(NLLTerm(_nll_batch(), lam))
    prompts, targets = w.nll_examples()
    # the examples split over the two minibatches in order: [0, 1] then [2]
    model, _ = grpo.policy()
    params = [p for p in model.parameters() if p.requires_grad]
    for step, idx in enumerate(([0, 1], [2])):
        hand = nll_loop_reference(model, [prompts[i] for i in idx], [targets[i] for i in idx])
        expected = torch.cat([g.flatten() for g in torch.autograd.grad(lam * hand, params)])
        assert torch.allclose(joint.captured[step] - plain.captured[step], expected, atol=1e-6, rtol=1e-4), step
    assert plain_stats.nll is None and "mel/nll" not in plain_stats.as_metrics()
    everything = nll_loop_reference(model, prompts, targets)
    # the reported J_NLL is the mean over the two optimizer steps of each one's token-mean
    per_step = [
        float(nll_loop_reference(model, [prompts[i] for i in idx], [targets[i] for i in idx]).detach())
        for idx in ([0, 1], [2])
    ]
    assert joint_stats.nll == pytest.approx(sum(per_step) / 2, rel=1e-5)
    assert joint_stats.nll_tokens == sum(len(t) for t in targets) and float(everything) > 0
    assert joint_stats.as_metrics()["mel/nll_tokens"] == 12.0
    assert joint_stats.loss == pytest.approx(plain_stats.loss, rel=1e-6)  # `loss` stays the GRPO part


def test_lambda_zero_or_no_examples_is_plain_grpo_bit_for_bit() -> None:
    """Every update runs on one model put back to its start in place: the same computation on the same memory, so
    bit-equality says that the term ran nothing, not where an allocator put the weights (tests/numerics.py)."""
    model, _ = grpo.policy()
    _, stats, plain = _update(None, torch.optim.AdamW, model)
    for nll in (NLLTerm(_nll_batch(), 0.0), NLLTerm(None, 0.0)):
        _, same_stats, same = _update(nll, torch.optim.AdamW, model)
        assert all(torch.equal(plain[n], same[n]) for n in plain)
        assert same_stats.as_metrics() == stats.as_metrics()
    _, empty_stats, empty = _update(NLLTerm(None, 0.5), torch.optim.AdamW, model)  # a rank without examples
    assert all(torch.equal(plain[n], empty[n]) for n in plain)
    assert empty_stats.nll_tokens == 0.0 and empty_stats.nll is None  # no examples anywhere: no J_NLL, not NaN
    assert empty_stats.as_metrics()["mel/nll_tokens"] == 0.0 and "mel/nll" not in empty_stats.as_metrics()
    _, _, moved = _update(NLLTerm(_nll_batch(), 0.5), torch.optim.AdamW, model)
    assert any(not torch.equal(plain[n], moved[n]) for n in plain), "the NLL term trained nothing"


def test_two_ranks_with_uneven_nll_examples_equal_one_process(tmp_path: Path) -> None:
    single = w.update(0, 1, ddp=False)
    out = tmp_path / "nll-2.pt"
    args = (2, str(tmp_path / "store"), str(out))
    mp.start_processes(w.worker, args=args, nprocs=2, start_method="spawn", join=True)
    multi = torch.load(out, weights_only=False)
    for name in single:
        assert torch.allclose(multi[name], single[name], rtol=1e-4, atol=1e-6), name


def test_the_step_line_says_no_term_rather_than_nan() -> None:
    from lanpo.train.plumbing.step_line import step_line as _line

    metrics = {"reward/mean": 0.5, "accuracy/mean": 0.5, "response_len/mean": 30.0, "time/step": 1.0, "kl": 0.0}
    metrics |= {"mel/pairs": 4.0, "mel/candidates": 2.0, "mel/validated": 0.0, "mel/nll_tokens": 0.0}
    assert "mel 4->2->0 nll -" in _line(3, metrics) and "nan" not in _line(3, metrics)
    assert "mel 4->2->1 nll 1.25" in _line(3, metrics | {"mel/validated": 1.0, "mel/nll": 1.25})


# The full lane (bash .ci/run --full; 25 s of a main-lane worker, moved when a fresh clone's CI ran past its budget).
# Twin: test_two_ranks_with_uneven_nll_examples_equal_one_process above, where DDP's backward is a collective too: a
# rank without NLL examples that skipped its zero-weight forwards hangs or differs there as it would under FSDP;
# FSDP2's sharded update itself has tests/train/test_multirank.py (2-full).
@pytest.mark.full
def test_full_fine_tuning_at_two_ranks_with_uneven_nll_examples_equals_one_process(tmp_path: Path) -> None:
    """FSDP: every forward is a collective, and rank 0 holds all three NLL examples (three micro-batches of one),
    rank 1 none; rank 1 runs three zero-weight forwards, and the sharded update equals one unsharded process's."""
    single = w.update_full(0, 1)
    out = tmp_path / "nll-full-2.pt"
    args = (2, str(tmp_path / "store"), str(out), "full")
    mp.start_processes(w.worker, args=args, nprocs=2, start_method="spawn", join=True)
    multi = torch.load(out, weights_only=False)
    start = grpo.full_policy(grpo.Dist()).model.state_dict()
    for name in single:
        assert torch.allclose(multi[name], single[name], rtol=1e-4, atol=1e-6), name
    assert any(not torch.equal(single[n], start[n]) for n in single)
