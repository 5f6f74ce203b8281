"""bf16 compute as verl does it: full fine-tuning under torchrun in FSDP2 mixed precision (units gathered in bf16,
gradients reduce-scattered in fp32 into fp32 master shards), on 2 gloo ranks against two unsharded references.

- The same precision: a plain module whose parameters are the bf16 cast of fp32 master weights, its bf16
  gradients added in fp32 to the masters', AdamW on the masters (`HandMixedPrecision`, FSDP's arithmetic without
  FSDP). One row a micro-batch, so that each row's bf16 gradient is the same computation on a rank and in the
  reference; what is left between them is the order of fp32 sums, as between the fp32 FSDP update and the single
  process (tests/train/test_multirank.py), and is held to the same tolerance.
- fp32: the single process's update in fp32, with SGD on both sides, so that the update is -lr x the clipped
  gradient and its error is the gradient's (Adam's first step is lr x sign(g): at a gradient near 0 it can flip
  by 2 lr in any precision). The tolerance is derived in `BF16_GRADIENT_ERROR`.

One spawn of 2 ranks runs both sharded updates (about 15 s); the references run here.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from lanpo.train.consumer.update import UpdateStats
from lanpo.train.forward.batch import RolloutBatch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import chunked_logprobs
from lanpo.train.plumbing.dist import Dist
from tests.train import multirank_workers as w

BF16 = torch.bfloat16

# bf16 keeps 8 significant bits (7 stored, 1 implied): a value rounded to it is off by at most u = 2^-8 of itself
# (half an ulp of 2^-7). A weight's gradient is a sum over positions of (its input activation) x (the backward
# signal at its output); in bf16 compute each of the two reached it through tensors stored in bf16, one rounding
# each: on the tiny model's longest path, the embedding, 2 decoder layers of about 10 stored tensors each
# (normed input, q/k/v, attention, o, residual, normed, gate/up, product) and the head forward, as many backward:
# K = 2 x (1 + 2 x 10 + 1) = 44 roundings. Independent roundings add as a random walk, sqrt(K) u; summed over
# thousands of positions and weights, the gradient's relative error in norm is that, not K u (the worst case,
# 0.17, which only correlated roundings reach). So the update (SGD: -lr x the clipped gradient, the clip's scale
# off by as much as the norm) is held to 2 sqrt(K) u = 0.052 of its size; with 2 steps of at most lr x
# max_grad_norm each, every weight to within 0.052 x 2 x 1e-3 x 1.0 = 1.0e-4 in norm.
ROUNDINGS = 2 * (1 + 2 * 10 + 1)
BF16_GRADIENT_ERROR = 2 * math.sqrt(ROUNDINGS) * 2.0**-8
# ... and at least what fp32 compute leaves (tests/train/test_multirank.py: 1e-6 in weights that moved by ~1e-2,
# 1e-4 relative), 100 times over: bf16 compute did run.
FP32_GRADIENT_ERROR = 1e-4


class HandMixedPrecision:
    """FSDP2 mixed precision by hand, unsharded: the compute module is the start with its parameters (not its
    buffers: FSDP casts none) cast to bf16 before every forward, as FSDP casts a shard before gathering it; each bf16
    gradient a backward leaves is added, upcast, to its fp32 master's and dropped, as FSDP reduces a unit's bf16
    gradients in fp32 into its fp32 shards. The optimizer steps the masters. The reference is the bf16 start."""

    kind = "full"
    collective_forwards = False
    engine_generates = False

    def __init__(self, start: Any) -> None:
        self.masters = list(start.parameters())  # fp32
        self.model = self.trained = copy.deepcopy(start)
        self.reference = copy.deepcopy(start).requires_grad_(False).eval()
        for module in (self.model, self.reference):
            for p in module.parameters():
                p.data = p.data.to(BF16)
        for p, master in zip(self.model.parameters(), self.masters, strict=True):
            p.register_post_accumulate_grad_hook(lambda p, master=master: self._reduce(p, master))
        self.model.register_forward_pre_hook(lambda *_: self._cast())

    @staticmethod
    def _reduce(p: torch.Tensor, master: torch.Tensor) -> None:
        grad = p.grad.float()  # type: ignore[union-attr]
        master.grad = grad if master.grad is None else master.grad + grad
        p.grad = None

    @torch.no_grad()
    def _cast(self) -> None:
        for p, master in zip(self.model.parameters(), self.masters, strict=True):
            p.copy_(master)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.masters

    def reference_logprobs(self, batch: RolloutBatch, logprob_settings: LogprobSettings) -> Any:
        return chunked_logprobs(self.reference, batch, logprob_settings)

    def no_sync(self) -> Any:
        from contextlib import nullcontext

        return nullcontext()


def _single(policy: Any, cfg: Any, sgd: bool) -> tuple[dict[str, torch.Tensor], UpdateStats]:
    stats, steps = w._update(policy, 0, 1, cfg, sgd=sgd)
    assert steps == 2
    names = [n for n, _ in w.full_policy(Dist()).model.named_parameters()]
    return dict(zip(names, [p.detach().clone() for p in policy.trainable_parameters()], strict=True)), stats


def _flat(state: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([state[n].flatten() for n in names])


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder: Path = tmp_path_factory.mktemp("mixed")
    out = folder / "full-mixed-2.pt"
    mp.start_processes(
        w.worker, args=(2, str(folder / "store"), "full-mixed", str(out)), nprocs=2, start_method="spawn", join=True
    )
    return torch.load(out, weights_only=False)


def test_a_sharded_forward_computes_with_the_bf16_cast_of_the_weights(sharded: dict[str, Any]) -> None:
    """Bit for bit the logits of the unsharded start with its parameters cast to bf16: the units are gathered in
    bf16 and nothing else changes (the buffers stay fp32)."""
    assert sharded["forward_exact"]


def test_the_sharded_mixed_precision_update_equals_an_unsharded_one_in_the_same_precision(
    sharded: dict[str, Any],
) -> None:
    multi, multi_stats, multi_steps = sharded["adamw"]
    single, single_stats = _single(HandMixedPrecision(w.full_policy(Dist()).model), w.MIXED, sgd=False)
    start = w.full_policy(Dist()).model.state_dict()
    names = list(single)
    assert multi_steps == 2
    for name in names:  # the fp32 FSDP test's tolerance (test_multirank._assert_same)
        assert torch.allclose(multi[name], single[name], rtol=1e-4, atol=1e-6), name
        assert multi[name].dtype == torch.float32, name  # the master shards stay fp32
    assert all(not torch.equal(single[n], start[n]) for n in names), "every weight trains"
    for key in ("loss", "kl", "grad_norm"):
        assert getattr(multi_stats, key) == pytest.approx(getattr(single_stats, key), rel=1e-4, abs=1e-9), key
    # ... and the same precision matters: the fp32 single process is further away than the tolerance above
    fp32, _ = _single(w.full_policy(Dist()), replace(w.MIXED, autocast="off"), sgd=False)
    assert any(not torch.allclose(fp32[n], single[n], rtol=1e-4, atol=1e-6) for n in names)


def test_the_sharded_mixed_precision_update_is_the_fp32_one_to_bf16_rounding(sharded: dict[str, Any]) -> None:
    multi, multi_stats, _ = sharded["sgd"]
    fp32, fp32_stats = _single(w.full_policy(Dist()), replace(w.MIXED, autocast="off"), sgd=True)
    start = w.full_policy(Dist()).model.state_dict()
    names = list(fp32)
    step_32 = _flat(fp32, names) - _flat(start, names)
    step_mixed = _flat(multi, names) - _flat(start, names)
    error = float((step_mixed - step_32).norm() / step_32.norm())
    assert FP32_GRADIENT_ERROR < error <= BF16_GRADIENT_ERROR, error
    assert float(step_32.norm()) <= 2 * w.SGD_LR * w.MIXED.max_grad_norm * (1 + 1e-6)  # the update's size, as derived
    assert multi_stats.grad_norm == pytest.approx(fp32_stats.grad_norm, rel=BF16_GRADIENT_ERROR)
    # The masters hold what bf16 weights would lose: most of this update is under half a bf16 ulp of its weight
    # (the paper's lr 1e-6 puts nearly every AdamW step there; measured: 93 % of the weights here), yet the fp32
    # masters moved nearly everywhere (not quite: a step under half an fp32 ulp of its weight is lost in fp32 too,
    # and the fp32 update leaves about as many where they were: 48 of 21,824 here).
    start_flat = _flat(start, names)
    lost = (start_flat + step_mixed).to(BF16) == start_flat.to(BF16)
    assert float(lost.float().mean()) > 0.5
    assert float((step_mixed != 0).float().mean()) > 0.99
    print(f"against fp32: {error:.4f} of the update in norm; under half a bf16 ulp: {float(lost.float().mean()):.0%}")
