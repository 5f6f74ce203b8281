"""A multi-rank update equals the single-process one: W gloo ranks on CPU (W = 2, 4 and the paper's 8) each take
their strided share of the same rollouts; after one GRPO update (two minibatches, uneven micro-batches) and after
an SFT warm start, the LoRA weights match a single process's on all the rollouts. Sizes are global, so every
world size takes the same number of optimizer steps; shapes the ranks cannot split fail when the config loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from lanpo.errors import ConfigError
from lanpo.train.config import GRPOConfig, RolloutConfig, TrainConfig, load_config
from lanpo.train.plumbing.dist import Dist
from tests.train import multirank_workers as w


def _spawn(world: int, job: str, tmp_path: Path) -> object:
    out = tmp_path / f"{job}-{world}.pt"
    mp.start_processes(
        w.worker, args=(world, str(tmp_path / f"store-{job}-{world}"), job, str(out)), nprocs=world,
        start_method="spawn", join=True,
    )  # fmt: skip
    return torch.load(out, weights_only=False)


def _assert_same(
    multi: dict[str, torch.Tensor], single: dict[str, torch.Tensor], start: dict[str, torch.Tensor], atol: float = 1e-6
):
    assert multi.keys() == single.keys()
    for name in single:
        assert torch.allclose(multi[name], single[name], rtol=1e-4, atol=atol), name
    assert any(not torch.equal(single[n], start[n]) for n in single), "the update moved nothing"


EIGHT_RANKS = "8 gloo ranks (the paper's world size, 8 GPUs) on 2 cores, each a torch process of its own"
# The world-4 and world-8 rows run in the full lane (bash .ci/run --full): 37 s, 77 s and 67 s on one core of two,
# and nothing in them that 2 ranks miss (the same split of the batch into global minibatches, the same uneven
# shards: the tiny model's 101-row embedding divides unevenly by 2 as by 4 and 8). Their twins stay here: GRPO at 2
# ranks (which fails on each rank cutting minibatches from its own share: other optimizer steps, other weights),
# FSDP2 full weights at 2. Two rows at 2 ranks went to the full lane too when a fresh clone's CI ran past its budget
# (16-21 s each on one core of two): full fine-tuning with gradient checkpointing (twins: the plain FSDP2 row here,
# which shards the same weights, and tests/train/test_update.py, where checkpointing changes no loss or gradient) and
# SFT one pair a forward (twins: the whole-batch SFT row here, and tests/train/test_sft.py, where micro-batches
# accumulate to the whole batch's update).
EIGHT = [pytest.mark.full, pytest.mark.long(EIGHT_RANKS)]


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.full), pytest.param(8, marks=EIGHT)])
def test_grpo_update_at_world_size_equals_single_process(world: int, tmp_path: Path) -> None:
    single, single_steps = w.grpo_update(0, 1)
    multi, multi_steps = _spawn(world, "grpo", tmp_path)  # type: ignore[misc]
    start = {n: p.detach() for n, p in w.policy()[0].named_parameters() if p.requires_grad}
    _assert_same(multi, single, start)
    assert multi_steps == single_steps == 2  # 32 sequences / minibatch 16, at every world size


def test_chunked_logprobs_and_token_budgets_at_two_ranks_equal_the_plain_single_process(tmp_path: Path) -> None:
    """Under DDP, log-probs in chunks and micro-batches by a token budget (the ranks running different numbers of
    them, the shorter one fillers) give the single process's plain update (full logits, rows)."""
    single, _ = w.grpo_update(0, 1)
    multi, multi_steps = _spawn(2, "grpo-chunked", tmp_path)  # type: ignore[misc]
    start = {n: p.detach() for n, p in w.policy()[0].named_parameters() if p.requires_grad}
    _assert_same(multi, single, start)
    assert multi_steps == 2


@pytest.mark.parametrize(
    ("world", "job"),
    [
        (2, "full"),
        pytest.param(2, "full-checkpointing", marks=pytest.mark.full),
        (2, "full-chunked"),  # the chunked head inside FSDP's root unit, token budgets with fillers
        pytest.param(8, "full", marks=[pytest.mark.slow, *EIGHT]),
    ],
)
def test_full_fine_tuning_with_fsdp_at_world_size_equals_single_process(world: int, job: str, tmp_path: Path) -> None:
    """Every weight, FSDP2-sharded over gloo ranks (with gradient checkpointing too; or with chunked log-probs and
    token-budgeted micro-batches), equals one unsharded process's plain update."""
    single, single_stats, single_steps = w.full_update(0, 1)
    multi, multi_stats, multi_steps = _spawn(world, job, tmp_path)  # type: ignore[misc]
    start = w.full_policy(Dist()).model.state_dict()
    # Chunked against full logits: other float rounding of the gradient (1e-7 relative, the loss and grad norm
    # agree to 1e-8), which AdamW's first step (lr 1e-2: every weight moves by about 1e-2) turns into up to 6e-6
    # on weights whose gradient is near 0, as a single process chunking does too.
    _assert_same(multi, single, start, atol=2e-5 if job == "full-chunked" else 1e-6)
    assert multi_steps == single_steps == 2
    for key in ("loss", "kl", "grad_norm"):
        assert getattr(multi_stats, key) == pytest.approx(getattr(single_stats, key), rel=1e-4, abs=1e-9), key
    assert single_stats.kl > 0  # the second minibatch's policy has left the reference
    moved = [n for n in single if not torch.equal(single[n], start[n])]
    assert len(moved) == len(single), "every weight trains"


@pytest.mark.parametrize("job", ["sft", pytest.param("sft-micro", marks=pytest.mark.full)])
def test_sft_warm_start_at_two_ranks_equals_single_process(job: str, tmp_path: Path) -> None:
    """The whole batch in one forward per rank, or one pair per forward with gradients accumulated (Table 5's
    per-GPU micro-batch of 1): the same adapter as one process taking each batch whole."""
    single, single_losses = w.sft(0, 1, tmp_path / "single", ddp=False)
    (tmp_path / "multi").mkdir()
    multi, multi_losses = _spawn(2, job, tmp_path / "multi")  # type: ignore[misc]
    start = {n: p.detach() for n, p in w.policy()[0].named_parameters() if p.requires_grad}
    _assert_same(multi, single, start)
    assert len(multi_losses) == len(single_losses) == 6  # 2 epochs x ceil(9 / 4)
    assert multi_losses == pytest.approx(single_losses, rel=1e-4)


def test_shapes_the_ranks_cannot_split_fail_at_config_load(tmp_path: Path) -> None:
    paper = TrainConfig(batch_size=128, rollout=RolloutConfig(n=16), grpo=GRPOConfig(minibatch_size=512))
    for world in (1, 2, 4, 8):
        paper.check_world(world)  # 2048 rollouts, 4 minibatches of 512 = 32 prompts, 4 per rank at 8
    with pytest.raises(ConfigError, match=r"batch_size \(6\) must be divisible by the world size \(4\)"):
        TrainConfig(batch_size=6, rollout=RolloutConfig(n=2)).check_world(4)
    with pytest.raises(ConfigError, match=r"grpo.minibatch_size \(512\) must be a multiple of rollout.n x world"):
        TrainConfig(batch_size=256, rollout=RolloutConfig(n=16), grpo=GRPOConfig(minibatch_size=512)).check_world(64)
    with pytest.raises(ConfigError, match="skip_zero_spread works in a single process only"):
        TrainConfig(grpo=GRPOConfig(skip_zero_spread=True)).check_world(2)
    recipe = tmp_path / "r.toml"
    recipe.write_text("batch_size = 6\n[rollout]\nn = 2\n")
    with pytest.raises(ConfigError, match=r"r.toml: batch_size \(6\) must be divisible by the world size \(4\)"):
        load_config(recipe, world=4)
    assert load_config(recipe, world=3).batch_size == 6
