"""Full fine-tuning (`lora.enabled = false`): every weight trains, the reference is a frozen copy of the start.

One update equals a loop written out sequence by sequence and token by token (loss, gradient, clipping, AdamW);
the reference holds the start's weights bit for bit; a run starts from the merged SFT start with KL 0 to float
rounding, and its checkpoints are whole model folders that `lanpo infer --model` loads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import torch
from sqlalchemy.engine import Engine

from lanpo.errors import InputError
from lanpo.models import model_dir_sha256, tiny_causal_lm
from lanpo.rewards import Graded
from lanpo.rl.loss import kl_k3
from lanpo.train.config import FeedbackConfig, GRPOConfig, LoraConfig, SFTConfig
from lanpo.train.consumer.update import update_policy, warmup_schedule
from lanpo.train.forward.batch import build_batch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import chunked_logprobs, completion_logprobs
from lanpo.train.loop import train
from lanpo.train.policy import FullPolicy
from lanpo.train.sft.warm_start import write_pairs
from tests.numerics import assert_rounding_close, kl_rounding_bound, misaligned_copy
from tests.train import multirank_workers as w
from tests.train.conftest import tiny_config
from tests.train.test_start import PAIRS

CFG = GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, beta=0.1, micro_batch_size=3, max_grad_norm=0.5)


def _perturb(model: Any) -> None:
    """Move the policy off its start (the same way every time), so the KL term has a gradient of its own."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)


def _hand_written_loss(policy: Any, reference: Any, prompts: list, completions: list, advantages: torch.Tensor):
    """The token-mean GRPO loss, one unpadded sequence and one token at a time (on-policy: ratio 1)."""
    terms = []
    for prompt, completion, advantage in zip(prompts, completions, advantages.tolist(), strict=True):
        ids = torch.tensor([prompt + completion])
        logits = policy(input_ids=ids, use_cache=False).logits[0]  # (L, V)
        with torch.no_grad():
            ref_logits = reference(input_ids=ids, use_cache=False).logits[0]
        for t, token in enumerate(completion):
            position = len(prompt) + t - 1  # the position that predicts completion token t
            logp = torch.log_softmax(logits[position].float(), dim=-1)[token]
            ref = torch.log_softmax(ref_logits[position].float(), dim=-1)[token]
            ratio = torch.exp(logp - logp.detach())
            clipped = torch.clamp(ratio, 1 - CFG.eps_low, 1 + CFG.eps_high)
            pg = torch.maximum(-advantage * ratio, -advantage * clipped)
            kl = torch.exp(ref - logp) - (ref - logp) - 1
            terms.append(pg + CFG.beta * kl)
    return torch.stack(terms).mean()


class Recording(torch.optim.AdamW):
    """AdamW that keeps the gradient it was given (after clipping) before it steps."""

    grads: list[torch.Tensor]

    def step(self, closure: Any = None) -> Any:
        self.grads = [p.grad.detach().clone() for p in self.param_groups[0]["params"]]
        return super().step(closure)


@pytest.mark.parametrize("share_prompts", [False, True], ids=["rows-whole", "shared-prompts"])
def test_one_full_update_equals_a_hand_written_loop(share_prompts: bool) -> None:
    """The hand-written loop runs each sequence whole; the update runs micro-batches, sharing prompts or not."""
    cfg = replace(CFG, share_prompts=share_prompts)
    prompts, completions, advantages = w.global_rollouts()
    model, tokenizer = tiny_causal_lm(seed=0)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    policy = FullPolicy(model, tokenizer)  # the reference is copied here: the start
    _perturb(policy.model)
    batch = build_batch(prompts, completions, 0, torch.device("cpu"))
    optimizer = Recording(policy.trainable_parameters(), lr=CFG.learning_rate, weight_decay=0.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stats = update_policy(policy, optimizer, warmup_schedule(optimizer, 10, 0.0), batch, advantages, cfg, seed=0)

    hand, reference = tiny_causal_lm(seed=0)[0], tiny_causal_lm(seed=0)[0]
    _perturb(hand)
    loss = _hand_written_loss(hand, reference, prompts, completions, advantages)
    loss.backward()
    names = [n for n, _ in hand.named_parameters()]
    grads = [p.grad for p in hand.parameters()]
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    clipped = [g * min(1.0, CFG.max_grad_norm / (float(norm) + 1e-6)) for g in grads]

    assert stats.loss == pytest.approx(loss.item(), rel=1e-5)
    assert stats.grad_norm == pytest.approx(float(norm), rel=1e-5) and stats.grad_norm > CFG.max_grad_norm
    assert stats.kl > 0
    assert [n for n, _ in model.named_parameters()] == names
    for name, got, want in zip(names, optimizer.grads, clipped, strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), name
    # AdamW's first step from zero moments, no weight decay: p - lr * g / (|g| + eps), with the gradient it was
    # given (just shown equal to the loop's; a near-zero component's sign is float rounding, and decides the step)
    for name, p in model.named_parameters():
        g = dict(zip(names, optimizer.grads, strict=True))[name]
        want = before[name] - CFG.learning_rate * g / (g.abs() + 1e-8)
        assert torch.allclose(p.detach(), want, rtol=1e-5, atol=1e-6), name
        assert not torch.equal(p.detach(), before[name]), f"{name} did not move"
    # the reference is still the start, frozen
    for name, p in policy.reference.named_parameters():
        assert torch.equal(p, start[name]) and not p.requires_grad and p.grad is None, name


def test_the_reference_is_the_start_bit_for_bit() -> None:
    """The reference holds the start's weights bit for bit, in memory of its own; its log-probs are the start's
    to float rounding (two copies in different memory need not round alike: tests/numerics.py), so the KL before
    any step is 0 to rounding. The same holds for a copy in the worst memory an allocator could give it."""
    prompts, completions, _ = w.global_rollouts()
    batch = build_batch(prompts, completions, 0, torch.device("cpu"))
    policy = FullPolicy(*tiny_causal_lm(seed=0))
    assert policy.reference is not policy.model
    start = policy.model.state_dict()
    assert all(torch.equal(p, start[n]) for n, p in policy.reference.state_dict().items())
    shared = {p.data_ptr() for p in policy.reference.parameters()} & {p.data_ptr() for p in policy.model.parameters()}
    assert not shared
    five = LogprobSettings(micro_batch_size=5)  # the same micro-batches: the same sums in the same order
    logp = chunked_logprobs(policy.model, batch, five)
    for reference in (policy.reference, misaligned_copy(policy.reference)):
        policy.reference = reference
        ref = policy.reference_logprobs(batch, five)
        assert_rounding_close(ref, logp)
        assert float((kl_k3(logp, ref) * batch.completion_mask).sum() / batch.completion_mask.sum()) <= (
            kl_rounding_bound()
        )
    moved = tiny_causal_lm(seed=1)[0]
    assert not torch.allclose(chunked_logprobs(moved, batch, five), logp, atol=1e-3)  # the check can tell models apart


def _moved_share(policy_model: Any, trained: Any, lr: float) -> float:
    """The share of `trained`'s weights that one GRPO update at `lr` (bf16 autocast) moves."""
    prompts, completions, advantages = w.global_rollouts()
    batch = build_batch(prompts, completions, 0, torch.device("cpu"))
    before = {n: p.detach().float().clone() for n, p in policy_model.named_parameters()}
    optimizer = torch.optim.AdamW(trained.trainable_parameters(), lr=lr, weight_decay=0.0)
    cfg = replace(CFG, learning_rate=lr, autocast="bf16")
    update_policy(trained, optimizer, warmup_schedule(optimizer, 10, 0.0), batch, advantages, cfg, seed=0)
    moved = sum(int((p.detach().float() != before[n]).sum()) for n, p in policy_model.named_parameters())
    return moved / sum(p.numel() for p in policy_model.parameters())


class _Bf16Weights(FullPolicy):
    """The policy as it was before master weights: it trains the bf16 weights it was given (the reference)."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        super().__init__(model, tokenizer)
        self.model.to(torch.bfloat16)


def test_full_fine_tuning_of_bf16_weights_trains_fp32_master_weights_at_the_papers_lr() -> None:
    """A start loaded in bf16 (model.dtype auto on a GPU) trains fp32 weights, as verl's actor does: at the
    paper's lr (LANPO appendix 9.2, Table 6: "Actor Learning Rate 1e-6"; MEL section 4: "a learning rate of
    1×10^-6") an AdamW step is below half a bf16 ulp of nearly every weight, so bf16 weights stay put. The
    upcast is exact: the policy computes as the loaded start did, and the reference is that start."""
    model, tokenizer = tiny_causal_lm(seed=0)
    loaded = {n: p.detach().to(torch.bfloat16).clone() for n, p in model.named_parameters()}
    policy = FullPolicy(model.to(torch.bfloat16), tokenizer)
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    for name, p in [*policy.model.named_parameters(), *policy.reference.named_parameters()]:
        assert torch.equal(p.detach(), loaded[name].float()), name
    assert _moved_share(policy.model, policy, 1e-6) > 0.99
    bf16 = _Bf16Weights(*tiny_causal_lm(seed=0))
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    assert _moved_share(bf16.model, bf16, 1e-6) < 0.1  # the check can tell: bf16 weights hardly move


def _alternating_rewards(completions: list[str], answers: list, modes: list, format_rule: str = "") -> list[Graded]:
    """A reward with spread in every group (the tiny random model never answers right), so the weights move."""
    return [Graded(float(i % 2), bool(i % 2), False) for i in range(len(completions))]


def _full_config(tmp_path: Path, **overrides: Any) -> Any:
    data = tmp_path / "pairs.jsonl"
    write_pairs(PAIRS, data)
    values: dict[str, Any] = {
        "steps": 2,
        "lora": LoraConfig(enabled=False, r=4, alpha=8),
        "sft": SFTConfig(enabled=True, data=str(data), learning_rate=5e-2, max_steps=3, batch_size=2, max_length=64),
        "feedback": FeedbackConfig(mode="none"),
        **overrides,
    }
    return tiny_config(tmp_path, **values)


def test_a_full_run_starts_from_the_merged_sft_start_and_checkpoints_whole_models(
    db: Engine, toy_problems: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("lanpo.train.producer.produce.grade", _alternating_rewards)
    result = train(_full_config(tmp_path), db=db, progress=False)
    first, second = result.metrics
    assert abs(first["kl"]) <= kl_rounding_bound()  # the reference is the merged SFT start = the policy before step 1
    assert first["grad_norm"] > 0 and second["kl"] > 0  # step 1 moved the weights away from the reference
    start = json.loads((result.checkpoint_dir / "start.json").read_text())
    assert start["adapter"] == str((result.checkpoint_dir / "sft" / "adapter").resolve())

    from transformers import AutoModelForCausalLM

    step = result.checkpoint_dir / "step-000002"
    assert not (step / "adapter").exists()
    files = {p.name for p in (step / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= files  # a model folder of its own
    assert torch.load(step / "trainer_state.pt", weights_only=False)["policy"] == "full"
    AutoModelForCausalLM.from_pretrained(step / "model")  # transformers loads it as it is
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT s.step, pv.adapter_sha256, s.checkpoint FROM run_steps s "
                "JOIN policy_versions pv ON pv.id = s.policy_version_id ORDER BY s.step"
            )
        ).all()
    assert [r.step for r in rows] == [0, 1, 2] and rows[2].checkpoint == str(step)
    assert rows[2].adapter_sha256 == model_dir_sha256(step / "model")  # the version: the hash of all the weights
    assert len({r.adapter_sha256 for r in rows}) == 3

    # step 0 is the merged start: the base with the SFT adapter merged in, not the raw base
    from lanpo.models import merge_adapter

    merged, _ = merge_adapter(tiny_causal_lm(seed=0)[0], start["adapter"])
    merged.save_pretrained(tmp_path / "merged")
    tiny_causal_lm(seed=0)[0].save_pretrained(tmp_path / "raw")
    assert rows[0].adapter_sha256 == model_dir_sha256(tmp_path / "merged") != model_dir_sha256(tmp_path / "raw")


def test_inference_loads_a_full_fine_tuning_checkpoint(
    db: Engine, toy_problems: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lanpo infer --model step-NNNNNN` (or its model/) answers with the trained weights; --adapter says to use it."""
    from lanpo.inference.answerer import Answerer
    from lanpo.train.state import setup

    monkeypatch.setattr("lanpo.train.producer.produce.grade", _alternating_rewards)
    cfg = _full_config(tmp_path, sft=SFTConfig(enabled=False), steps=1)
    train(cfg, db=db, progress=False)
    trainer, first = setup(cfg, db, resume=True)  # the trained policy, resumed from the database's last step
    assert first == 2
    step = trainer.checkpoint_root / "step-000001"
    batch = build_batch([[5, 6, 7, 8]], [[9, 10, 11]], 0, torch.device("cpu"))
    with torch.no_grad():
        want, _ = completion_logprobs(trainer.policy.model, batch)
        trained = trainer.policy.model.state_dict()
        for folder in (step, step / "model"):
            loaded = Answerer(str(folder)).model
            assert all(torch.equal(p, trained[n]) for n, p in loaded.state_dict().items())  # the weights, bit for bit
            got, _ = completion_logprobs(loaded, batch)
            assert_rounding_close(got, want)  # the same weights in other memory
        start, _ = completion_logprobs(tiny_causal_lm(seed=0)[0], batch)
    assert not torch.allclose(start, want)
    with pytest.raises(InputError, match="holds a whole model") as info:
        Answerer("tiny-random", adapter=step)
    assert info.value.hint == f"pass it as the model: --model {step}"


def test_resuming_with_the_other_kind_of_policy_is_refused(
    db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    cfg = tiny_config(tmp_path, steps=1, feedback=FeedbackConfig(mode="none"))
    train(cfg, db=db, progress=False)
    cfg.steps, cfg.lora = 2, LoraConfig(enabled=False)
    with pytest.raises(InputError, match="holds a LoRA adapter, but this config trains every weight") as info:
        train(cfg, db=db, resume=True, progress=False)
    assert "lora.enabled = true" in str(info.value.hint)


def test_a_gpu_policy_keeps_its_reference_on_the_cpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here: the reference is offloaded only when the policy is on a GPU")
    model, tokenizer = tiny_causal_lm(seed=0)
    policy = FullPolicy(model.to("cuda"), tokenizer)
    prompts, completions, _ = w.global_rollouts()
    batch = build_batch(prompts, completions, 0, torch.device("cuda"))
    assert next(policy.reference.parameters()).device.type == "cpu"
    with torch.no_grad():
        logp, _ = completion_logprobs(policy.model, batch)
    ref = policy.reference_logprobs(batch, LogprobSettings(micro_batch_size=5))
    assert_rounding_close(ref, logp)  # the GPU's kernels against the CPU's copy
    assert next(policy.reference.parameters()).device.type == "cpu"
