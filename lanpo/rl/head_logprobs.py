"""log p of chosen tokens through a linear head, a chunk of positions at a time: the logits never exist whole.

`head_logprobs(states, weight, bias, ids, ...)` is log_softmax(states @ weight.T + bias)[ids] (and the entropy of
each row's distribution) as one autograd function (the fused linear cross-entropy of Liger-Kernel, in plain torch,
so it runs on a CPU as on a GPU). Forward takes `chunk` positions at a time through the head; a chunk's fp32 logits
are scaled by 1 / temperature in place, shifted by their row's max in place, and exponentiated into one second
buffer (only when the entropy is wanted; else in place too): at most 8 bytes a position x V, then dropped. It saves
the hidden states, the ids and each position's logsumexp, never logits. Backward recomputes each chunk's logits and
turns them in place into the gradient of log p, (onehot - softmax) / temperature, at most 4 bytes a position x V
(+ 2 for its bf16 copy when the matmuls run in bf16), then multiplies back through the head. The head's gradient
sums over chunks in fp32, as autograd's accumulation of per-chunk gradients does.

`dtype` (bf16): the head's matmuls in that dtype, the weight cast once a pass, the logits upcast to fp32 before
anything else, as `torch.autocast` runs a linear layer and lanpo's fp32 log-softmax after it; the gradients'
matmuls in that dtype too, as autograd runs an autocast linear's backward. None: in the weight's dtype.

The entropy has no gradient (lanpo logs it, the loss does not use it).
"""

from __future__ import annotations

from typing import Any

import torch


def head_logprobs(
    states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    ids: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = 1024,
    dtype: torch.dtype | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N,) fp32 log p of `ids` (N,) under softmax((states (N, H) @ weight (V, H).T + bias) / temperature), and the
    entropy (N,), detached (None unless `with_entropy`). Differentiable in `states`, `weight` and `bias`."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    logp, entropy = _HeadLogprobs.apply(states, weight, bias, ids, temperature, chunk, dtype, with_entropy)
    return logp, (entropy if with_entropy else None)


def _logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """(C, V) fp32 logits / temperature of hidden states `x` (C, H), already in the matmul's dtype."""
    z = torch.nn.functional.linear(x, weight, bias).float()  # fp32 in: no copy; bf16 in: the bf16 output is dropped
    if temperature != 1.0:
        z.div_(temperature)
    return z


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype)


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        states: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        ids: torch.Tensor,
        temperature: float,
        chunk: int,
        dtype: torch.dtype | None,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        compute = dtype or weight.dtype
        N = states.shape[0]
        logp = torch.empty(N, dtype=torch.float32, device=states.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty_like(logp) if with_entropy else logp.new_empty(0)
        with torch.no_grad(), torch.autocast(states.device.type, enabled=False):
            w, b = weight.to(compute), _cast(bias, compute)  # one cast a pass (none when the dtypes agree)
            for start in range(0, N, chunk):
                end = min(N, start + chunk)
                z = _logits(states[start:end].to(compute), w, b, temperature)  # (C, V)
                top = z.amax(dim=1, keepdim=True)  # (C, 1)
                z.sub_(top)  # every logit <= 0: exp cannot overflow
                picked = z.gather(1, ids[start:end, None]).squeeze(1)  # (C,)
                if with_entropy:  # H = lse' - sum(p z'), z' = z - top, p = exp(z') / s
                    e = torch.exp(z)
                    s = e.sum(dim=1)
                    dot = torch.bmm(e.unsqueeze(1), z.unsqueeze(2)).view(-1)  # sum(e z') without a product copy
                    del e
                    entropy[start:end] = s.log() - dot / s
                else:
                    s = z.exp_().sum(dim=1)
                del z
                shifted = s.log()  # log sum exp(z') = lse - top
                logp[start:end] = picked - shifted
                lse[start:end] = shifted + top.squeeze(1)
        ctx.save_for_backward(states, weight, bias, ids, lse)
        ctx.temperature, ctx.chunk, ctx.compute = temperature, chunk, compute
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor) -> tuple[Any, ...]:
        states, weight, bias, ids, lse = ctx.saved_tensors
        need_states, need_weight, need_bias = ctx.needs_input_grad[:3]
        T, chunk, compute = ctx.temperature, ctx.chunk, ctx.compute
        grad_states = torch.empty_like(states) if need_states else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_bias else None
        g = grad_logp.float() / T  # d log p / d raw logit = (onehot - softmax) / temperature
        with torch.autocast(states.device.type, enabled=False):
            w, b = weight.to(compute), _cast(bias, compute)
            for start in range(0, states.shape[0], chunk):
                end = min(states.shape[0], start + chunk)
                x = states[start:end].to(compute)
                p = _logits(x, w, b, T).sub_(lse[start:end, None]).exp_()  # (C, V) the softmax, in place
                gc = g[start:end, None]
                p.mul_(-gc).scatter_add_(1, ids[start:end, None], gc)  # g (onehot - softmax) / T, in place
                if grad_bias is not None:
                    grad_bias.add_(p.sum(dim=0))
                p = p.to(compute)  # bf16 matmuls: the copy (the fp32 one goes); fp32: the same tensor
                if grad_states is not None:
                    grad_states[start:end] = (p @ w).to(states.dtype)
                if grad_weight is not None:
                    if p.dtype == torch.float32:
                        grad_weight.addmm_(p.T, x)  # (V, H) accumulated without a per-chunk copy
                    else:
                        grad_weight.add_(p.T @ x)
                del p
        return (
            grad_states,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )
