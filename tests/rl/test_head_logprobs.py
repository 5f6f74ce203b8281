"""`lanpo.rl.head_logprobs`: the fused head + log-softmax against a loop, one position at a time through a plain
linear layer and `torch.log_softmax`, in value, entropy and the gradients of the states, weight and bias; and what
it keeps for backward (no logits)."""

from __future__ import annotations

import pytest
import torch

from lanpo.rl.head_logprobs import head_logprobs

N, H, V = 13, 6, 40


def _inputs(bias: bool = True, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(N, H, generator=g).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 2).requires_grad_()  # * 2: peaked rows, as a trained head's
    b = torch.randn(V, generator=g).requires_grad_() if bias else None
    return states, weight, b, torch.randint(0, V, (N,), generator=g)


def _loop(
    states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) log p and entropy, each position alone through torch.nn.functional.linear and log_softmax."""
    logp, entropy = [], []
    for i in range(len(ids)):
        dist = torch.log_softmax(torch.nn.functional.linear(states[i], weight, bias) / temperature, dim=-1)
        logp.append(dist[ids[i]])
        entropy.append(-(dist.exp() * dist).sum().detach())
    return torch.stack(logp), torch.stack(entropy)


def _grads(logp: torch.Tensor, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Gradients of a weighted sum (weights off 1: every position counts differently)."""
    leaves = [t for t in tensors if t is not None and t.requires_grad]
    got = torch.autograd.grad((logp * torch.linspace(0.5, 1.5, len(logp))).sum(), leaves)
    it = iter(got)
    return [next(it) if t is not None and t.requires_grad else None for t in tensors]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 4, N - 1, N, N + 1])
@pytest.mark.parametrize("bias", [True, False])
def test_head_logprobs_equal_the_loop_in_value_entropy_and_gradient(
    temperature: float, chunk: int, bias: bool
) -> None:
    states, weight, b, ids = _inputs(bias)
    want, want_entropy = _loop(states, weight, b, ids, temperature)
    got, entropy = head_logprobs(states, weight, b, ids, temperature, chunk, with_entropy=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, want_entropy, rtol=1e-5, atol=1e-5)
    assert entropy is not None and not entropy.requires_grad
    names = ("states", "weight", "bias")
    for name, g, w in zip(names, _grads(got, states, weight, b), _grads(want, states, weight, b), strict=True):
        assert (g is None) == (w is None), name
        if g is not None and w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, msg=name)


def test_a_frozen_head_gets_no_gradient_and_its_states_do() -> None:
    """LoRA's case: the head's weight is frozen; only the hidden states need a gradient (and without the entropy
    the forward exponentiates in place: the same values)."""
    states, weight, _, ids = _inputs(bias=False)
    weight.requires_grad_(False)
    got, entropy = head_logprobs(states, weight, None, ids, 0.7, chunk=5)
    want, _ = _loop(states, weight, None, ids, 0.7)
    assert entropy is None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (grad,) = torch.autograd.grad(got.sum(), [states])
    (ref,) = torch.autograd.grad(want.sum(), [states])
    torch.testing.assert_close(grad, ref, rtol=1e-4, atol=1e-5)
    assert weight.grad is None


def test_bf16_matmuls_match_autocast() -> None:
    """`dtype` bf16: the head's matmuls as torch.autocast runs a linear layer, the log-softmax in fp32."""
    states, weight, b, ids = _inputs()
    got, _ = head_logprobs(states, weight, b, ids, 0.7, chunk=4, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = torch.nn.functional.linear(states, weight, b)
    dist = torch.log_softmax(logits.float() / 0.7, dim=-1)
    want = dist.gather(1, ids[:, None]).squeeze(1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # the same bf16 logits, upcast alike
    for g, w in zip(_grads(got, states, weight, b), _grads(want, states, weight, b), strict=True):
        assert g is not None and w is not None
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)  # bf16 rounding of the gradients' matmuls


def test_backward_keeps_no_logits() -> None:
    """What the forward saves for backward: the states, weight, bias, ids and one logsumexp a position (N + 1
    tensors' worth), never a (positions, V) tensor, whatever the chunk."""
    states, weight, b, ids = _inputs()
    saved: list[torch.Size] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        head_logprobs(states, weight, b, ids, 0.7, chunk=N, with_entropy=True)
    assert sorted(saved) == sorted([states.shape, weight.shape, b.shape, ids.shape, torch.Size([N])])  # type: ignore[union-attr]


def test_chunk_must_be_positive() -> None:
    states, weight, b, ids = _inputs()
    with pytest.raises(ValueError, match="chunk"):
        head_logprobs(states, weight, b, ids, chunk=0)
