"""What "equal" means for two computations of one value, and a copy of a model that lives in other memory.

Two forwards of the same weights held in different memory need not round alike: the CPU's matrix kernels pick
their blocking by their operands' addresses. Measured on the tiny model (`python -m tests.numerics`): a copy whose
parameters start 4 bytes past a 16-byte boundary gives log-probs up to 9.5e-7 (8 float32 ulps of 1) away from
the original's, a copy 16-byte aligned gives them bit for bit, and which one an allocator hands out is the
machine's business. So a test that compares two computations holds them to the rounding of their dtype; bit
equality stays for a value compared with itself or with stored bits (a checkpoint, the start's weights), and
for computations that share their weights' memory (a LoRA policy and its reference, the adapter disabled).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

# Units in the last place that two orders of summation may leave between them, at the value's magnitude: a
# reduction over n terms rounds at most ~log2(n) times on a tree, and the measured difference is 8.
ULPS = 64


def rounding_tolerance(dtype: torch.dtype, magnitude: float = 1.0) -> float:
    """The largest |difference| allowed between two computations, in `dtype`, of values of up to |`magnitude`|."""
    return ULPS * torch.finfo(dtype).eps * max(1.0, float(magnitude))


def assert_rounding_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """`got` equals `want` to the rounding of `dtype` (default: want's own), element by element."""
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.numel() == 0:
        return
    tolerance = rounding_tolerance(dtype or want.dtype, float(want.abs().max()))
    worst = float((got - want).abs().max())
    assert worst <= tolerance, f"max |difference| {worst:.3g} is more than rounding ({tolerance:.3g})"


def kl_rounding_bound(dtype: torch.dtype = torch.float32) -> float:
    """How far from 0 the k3 KL of log-probs that agree to rounding may read: its second-order term is ~1e-9 at
    `rounding_tolerance`, and evaluating exp(d) - d - 1 in `dtype` rounds at about one eps."""
    return 4 * torch.finfo(dtype).eps


def misaligned_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy whose every parameter starts one element past the allocator's alignment (same values, bit for
    bit): the memory an unlucky allocator could have handed the copy."""
    twin = copy.deepcopy(module)
    with torch.no_grad():
        for p in twin.parameters():
            storage = torch.empty(p.numel() + 1, dtype=p.dtype, device=p.device)
            p.data = storage[1:].view(p.shape).copy_(p.data)
    return twin


def main() -> None:  # the measurement quoted above
    from lanpo.models import tiny_causal_lm
    from lanpo.train.forward.batch import build_batch
    from lanpo.train.forward.logprob_settings import LogprobSettings
    from lanpo.train.forward.logprobs import chunked_logprobs
    from tests.train import multirank_workers as w

    prompts, completions, _ = w.global_rollouts()
    batch = build_batch(prompts, completions, 0, torch.device("cpu"))
    model: Any = tiny_causal_lm(seed=0)[0]
    with torch.no_grad():
        want = chunked_logprobs(model, batch, LogprobSettings(micro_batch_size=5))
        for name, twin in (("aligned copy", copy.deepcopy(model)), ("misaligned copy", misaligned_copy(model))):
            got = chunked_logprobs(twin, batch, LogprobSettings(micro_batch_size=5))
            print(f"{name}: max |difference| {float((got - want).abs().max()):.3g}, equal {torch.equal(got, want)}")


if __name__ == "__main__":
    main()
