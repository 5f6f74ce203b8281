"""`lanpo plan` (lanpo.train.plan): the refusal, the shipped recipes' verdicts, the arithmetic of one phase by hand,
and the shipped model shapes against the parameter counts their model cards publish.

The published counts, read with the search tools (model cards as public repositories mirror them):
- Qwen2.5-7B: "Number of Parameters: 7.61B", "Number of Paramaters (Non-Embedding): 6.53B" (the Qwen2.5-7B
  family's card, e.g. Qwen/Qwen2.5-7B-Instruct, same shape); 7,615,616,512 exactly from the hub's
  safetensors parameter count of Qwen/Qwen2.5-7B-Instruct.
- Qwen3-4B-Base: "Number of Parameters: 4.0B", "Number of Paramaters (Non-Embedding): 3.6B" (its card).
- Qwen3-8B: "Number of Parameters: 8.2B" (huggingface.co/Qwen/Qwen3-8B; the Base checkpoint shares the shape).
- Qwen3-14B: "Number of Parameters: 14.8B", "Number of Paramaters (Non-Embedding): 13.2B" (its card; the Base
  checkpoint shares the shape).
The cards round to the digits they print, so each count is held to those digits.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lanpo.cli import main
from lanpo.errors import InputError
from lanpo.train.config import TrainConfig, load_config
from lanpo.train.plan import Options, make_plan
from lanpo.train.plan_shapes import model_shape, shape_from_config, shipped_shapes
from lanpo.train.plan_verdict import check_training, margin, recipe_report, suggestion, verdict, verdict_word

CONFIGS = Path(__file__).resolve().parents[2] / "train" / "configs"
PAPER_RECIPES = [
    "grpo-baseline", "lanpo-intra", "lanpo-inter", "lanpo-both",
    "grpo-baseline-lora", "lanpo-intra-lora", "lanpo-inter-lora", "lanpo-both-lora",
    "table2/grpo-retrieval", "table2/lanpo-inter-nofilter", "table2/lanpo-inter-raw",
    "table3/lanpo-intra-pt025", "table3/lanpo-intra-pt050", "mel-qwen3-4b", "mel-qwen3-8b", "mel-qwen3-14b",
    "qwen3-14b/grpo-baseline", "qwen3-14b/lanpo-intra", "qwen3-14b/lanpo-inter", "qwen3-14b/lanpo-both",
]  # fmt: skip
GPU_80 = 79.0  # GiB an "80 GB" card reports (torch.cuda.get_device_properties: A100 / H100 80 GB, 79.2-79.6)


def _recipe(name: str, overrides: list[str] | None = None) -> TrainConfig:
    return load_config(CONFIGS / f"{name}.toml", overrides or [])


def test_plan_refuses_a_7b_full_fine_tune_on_one_24_gb_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["plan", "--config", str(CONFIGS / "grpo-baseline.toml"), "--gpus", "1", "--gpu-memory", "24"])
    out, err = capsys.readouterr()
    assert status == 2
    assert "verdict: does not fit" in out  # the table printed, then the refusal
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not fit" in errors[0], err
    hints = [line.strip() for line in err.splitlines() if line.strip().startswith("hint:")]
    assert len(hints) == 1 and len(hints[0]) < 200 and "model.name" in hints[0], err
    assert "Traceback" not in out + err


def test_the_hint_names_the_key_that_makes_it_fit(capsys: pytest.CaptureFixture[str]) -> None:
    """The recipe without its token budget (8 full-length rows a micro-batch) on 8 x 80 GB: the hint gives the
    budget that fits (whole rows of 3,072 + 8,192 tokens, fewer than the recipe's 8), and the recipe with it fits,
    in bf16 compute (as it ships) and in fp32, on 8 x 48 GB GPUs (on 80 GB, asleep and in bf16, the 8 rows fit);
    and with the engine awake through the update, the hint puts it to sleep first (a sleep and a wake a step,
    before any smaller micro-batch)."""
    recipe = ["--config", str(CONFIGS / "grpo-baseline.toml"), "--gpus", "8", "--gpu-memory", "48"]
    for autocast in ("bf16", "off"):
        args = [*recipe, "--set", f"grpo.autocast='{autocast}'"]
        assert main(["plan", *args, "--set", "grpo.max_tokens_per_micro_batch=0"]) == 2
        err = capsys.readouterr().err
        found = re.search(r"hint: set grpo\.max_tokens_per_micro_batch = (\d+) \(peak", err)
        assert found, err
        budget = int(found.group(1))
        assert budget % 11264 == 0 and 0 < budget < 8 * 11264, budget
        assert main(["plan", *args, "--set", f"grpo.max_tokens_per_micro_batch={budget}"]) == 0
        assert "verdict: fits" in capsys.readouterr().out
    awake = [*recipe, "--set", "rollout.vllm.sleep_during_update=false"]
    assert main(["plan", *awake]) == 0  # tight: it fits by less than the plan's error, and says what to set
    out = capsys.readouterr().out
    assert "verdict: tight" in out and "set rollout.vllm.sleep_during_update = true (peak" in out, out


@pytest.mark.parametrize("name", PAPER_RECIPES)
def test_the_shipped_recipes_fit_8_x_80_gb(name: str) -> None:
    """Every paper and MEL recipe fits 8 x 80 GB in bf16 compute with at least 15 % of the GPU to spare, more than
    the plan's own measured error needs (the verdict says "fits", not "tight")."""
    cfg = _recipe(name)
    assert cfg.grpo.autocast == "bf16"
    plan = make_plan(cfg, model_shape(cfg.model.name), 8, GPU_80)
    assert margin(plan) >= 0.15 and verdict_word(plan) == "fits", verdict(plan)


def test_mel_14b_fits_8_x_80_gb_only_without_the_whole_model_gathered() -> None:
    """What docs/scaling.md says of mel-qwen3-14b: it fits 8 x 80 GB in fp32 compute, because generation beside
    the engine gathers nothing under FSDP and the sync gathers one tensor at a time; counted as the code was before
    (the whole fp32 model on every rank for both, 55 GiB at 14B), it fits only 8 x 141 GB."""
    cfg = _recipe("mel-qwen3-14b", ["grpo.autocast='off'"])  # the code before issue 37 computed in fp32
    shape = model_shape(cfg.model.name)
    assert make_plan(cfg, shape, 8, GPU_80).fits
    before = Options(unshard_generating=True, streamed_sync=False)
    old = make_plan(cfg, shape, 8, GPU_80, before)
    assert not old.fits and old.peak.name in ("generate", "weight sync")
    assert old.phases[0].terms["FSDP unshard (whole fp32 model)"] == 4 * shape.params  # generate
    assert make_plan(cfg, shape, 8, 139.0, before).fits


def test_the_paper_recipes_compute_in_bf16_through_fsdp_mixed_precision() -> None:
    """The paper's full fine-tuning recipes compute in bf16 as verl does (FSDP2 mixed precision), which leaves more
    room on 8 x 80 GB than fp32 compute; under autocast (every weight's bf16 cast cached) grpo-baseline would not
    fit (84.1 GiB before mixed precision)."""
    for name in ("grpo-baseline", "lanpo-both", "mel-qwen3-8b", "mel-qwen3-14b"):
        cfg = _recipe(name)
        assert cfg.grpo.autocast == "bf16" and not cfg.lora.enabled, name
        shape = model_shape(cfg.model.name)
        mixed = make_plan(cfg, shape, 8, GPU_80)
        fp32 = make_plan(_recipe(name, ["grpo.autocast='off'"]), shape, 8, GPU_80)
        mixed_update, fp32_update = (next(p for p in plan.phases if p.name == "update") for plan in (mixed, fp32))
        assert mixed.fits and mixed_update.peak < fp32_update.peak, name  # the peak may be another phase's
        assert "autocast bf16 weight casts" not in mixed_update.terms, name
        assert any("FSDP2 mixed precision" in note for note in mixed.notes), name


TINY = {  # bench/plan_check.py's shape: Qwen2, 152,064-token vocabulary, untied head
    "model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 152064, "tie_word_embeddings": False,
}  # fmt: skip


def test_reference_phase_by_hand() -> None:
    """One row of 64 prompt + 2,048 completion tokens, fp32, unchunked, on the CPU: the reference log-probs phase
    holds, above what every phase holds, one layer's working set, the shared prompt's KV cache and the logits."""
    cfg = load_config(CONFIGS / "demo-cpu.toml", [])
    cfg = replace(cfg, batch_size=1, lora=replace(cfg.lora, enabled=False))
    cfg.model.gradient_checkpointing, cfg.rollout.n, cfg.rollout.temperature = False, 2, 1.0
    cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens, cfg.rollout.feedback_max_new_tokens = 64, 2048, 0
    cfg.grpo.micro_batch_size, cfg.grpo.autocast, cfg.grpo.share_prompts = 1, "off", True
    cfg.grpo.logprob_chunk_mb, cfg.grpo.max_tokens_per_micro_batch = 0, 0
    plan = make_plan(cfg, shape_from_config(TINY, "tiny", "test"), 1, 80.0, device="cpu")
    ref = next(p for p in plan.phases if p.name == "reference log-probs")
    # positions 64 + 2,048 = 2,112; working set 2,112 x (3 x 512 + 2 x 256 + 2 x 256) x 4 B = 21,626,880
    # logits 2,048 x 152,064 x (4 model output + 4 logsumexp's exp) = 2,491,416,576
    # KV cache of the prompt: 64 x 4 layers x 2 x 128 x 4 B = 262,144
    assert ref.peak - sum(plan.held.values()) == 21_626_880 + 2_491_416_576 + 262_144
    # held: P = 4 x 590,848 + 2 x 152,064 x 256 + 256 = 80,220,416; weights 4P, moments 8P, reference 4P;
    # the batch: 3 x 8 B x 2 rows x 2,112 positions
    assert sum(plan.held.values()) == 16 * 80_220_416 + 3 * 8 * 2 * 2112
    key = "logits (model, fp32, logsumexp)"
    for grpo, want in (
        (replace(cfg.grpo, logprob_chunk_tokens=512, logprob_fused=False), 512 * 152064 * 8),  # fp32 + its exp
        (replace(cfg.grpo, logprob_chunk_tokens=512), 512 * 152064 * 4),  # fused: exponentiated in place
        (replace(cfg.grpo, logprob_chunk_mb=256), 220 * 152064 * 4),  # the default: 256 MiB / (V x 8) = 220
    ):
        chunked = make_plan(replace(cfg, grpo=grpo), plan.shape, device="cpu")
        assert next(p for p in chunked.phases if p.name == "reference log-probs").terms[key] == want, grpo


def test_the_logits_terms_at_below_and_above_the_full_logits_limit() -> None:
    """The default budget (256 MiB) at 152,064 tokens takes the full logits up to 73 positions (N x V x 24 <= B):
    at 73 the full logits' terms, at 74 one fused chunk of 220 positions, however many positions beyond."""
    cfg = load_config(CONFIGS / "demo-cpu.toml", [])
    cfg = replace(cfg, batch_size=1, lora=replace(cfg.lora, enabled=False))
    cfg.rollout.n, cfg.rollout.max_prompt_tokens, cfg.rollout.feedback_max_new_tokens = 1, 64, 0
    cfg.rollout.temperature, cfg.grpo.micro_batch_size, cfg.grpo.autocast = 1.0, 1, "off"
    shape = shape_from_config(TINY, "tiny", "test")
    for T, ref, forward, backward in (
        (72, 72 * 8, 72 * 16, 72 * 12),
        (73, 73 * 8, 73 * 16, 73 * 12),
        (74, 220 * 4, 220 * 8, 220 * 4),
        (8192, 220 * 4, 220 * 8, 220 * 4),
    ):
        cfg.rollout.max_new_tokens = T
        phases = {p.name: p.terms for p in make_plan(cfg, shape, 1, 80.0, device="cpu").phases}
        assert phases["reference log-probs"]["logits (model, fp32, logsumexp)"] == ref * 152064, T
        assert update_logits(phases["update"], forward * 152064, backward * 152064), T


def test_bf16_update_terms_by_hand() -> None:
    """Under bf16 autocast with chunks of the head's own forward (the H200 measured both, bench/gpu_check.py): a
    chunk's logits cost 16 bytes a position and vocabulary entry in the update (fp32 logits and the entropy's
    three; the head's bf16 output is replaced by its fp32 copy, not kept beside it) and 8 in the reference pass;
    fused, 8 (fp32 logits and their exp) and 6 (the bf16 output beside its fp32 copy); autocast caches a bf16 copy
    of every weight a matmul reads, which leaves out an untied input embedding."""
    cfg = load_config(CONFIGS / "demo-cpu.toml", [])
    cfg = replace(cfg, batch_size=1, lora=replace(cfg.lora, enabled=False))
    cfg.rollout.n, cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens = 2, 64, 2048
    cfg.rollout.feedback_max_new_tokens, cfg.rollout.temperature = 0, 0.7
    cfg.grpo.micro_batch_size, cfg.grpo.autocast, cfg.grpo.logprob_chunk_tokens = 2, "bf16", 512
    cfg.grpo.logprob_fused = False
    shape = shape_from_config(TINY, "tiny", "test")
    phases = {p.name: p.terms for p in make_plan(cfg, shape, 1, 80.0).phases}
    assert update_logits(phases["update"], 512 * 152064 * 16, 512 * 152064 * 16)
    assert phases["reference log-probs"]["logits (model, fp32, logsumexp)"] == 512 * 152064 * 8
    assert phases["update"]["autocast bf16 weight casts"] == 2 * (shape.params - 152064 * 256)
    fused = {p.name: p.terms for p in make_plan(_with_grpo(cfg, logprob_fused=True), shape, 1, 80.0).phases}
    assert update_logits(fused["update"], 512 * 152064 * 8, 512 * 152064 * 6)
    assert fused["reference log-probs"]["logits (model, fp32, logsumexp)"] == 512 * 152064 * 6
    unchunked = replace(cfg, grpo=replace(cfg.grpo, logprob_chunk_tokens=0, logprob_chunk_mb=0))
    terms = {p.name: p.terms for p in make_plan(unchunked, shape, 1, 80.0).phases}["update"]
    # the full logits: bf16 output, its fp32 copy, the tempered copy and the entropy's three stay alive together
    assert update_logits(terms, 2 * 2048 * 152064 * (2 + 4 + 4 + 12), 2 * 2048 * 152064 * 12)


def test_the_engine_term_asleep_by_hand() -> None:
    """grpo-baseline on 8 x 79 GiB, the engine awake through the update against asleep: its share, 0.45 x 79 GiB,
    leaves every phase's `held` and stays in generate and in the checkpoint (the sync woke it whole); the log-prob
    passes and the update keep 2 GiB of it (CUDA graphs, context); the weight sync keeps that and its weights,
    woken in bf16 for the load: 2 x 7,615,616,512 bytes. Under an adapter sync (LoRA) it sleeps at level 1, its
    weights in host RAM."""
    share, asleep, weights = 0.45 * 79 * 2**30, 2 * 2**30, 2 * 7_615_616_512
    shape = model_shape("Qwen/Qwen2.5-7B")
    plans = {
        sleeps: make_plan(_recipe("grpo-baseline", [f"rollout.vllm.sleep_during_update={sleeps}"]), shape, 8, 79.0)
        for sleeps in ("false", "true")
    }
    awake, slept = ({p.name: p for p in plans[k].phases} for k in ("false", "true"))
    assert sum(plans["false"].held.values()) - sum(plans["true"].held.values()) == share
    phases = ["generate", "reference log-probs", "old log-probs", "update", "optimizer step", "weight sync"]
    assert list(awake) == list(slept) == [*phases, "checkpoint"]
    for name in ("generate", "checkpoint"):
        assert slept[name].terms == awake[name].terms
    for name in ("reference log-probs", "old log-probs", "update", "optimizer step"):
        assert slept[name].peak == pytest.approx(awake[name].peak - share + asleep, abs=1)
        assert slept[name].terms["vLLM engine asleep"] == asleep
    assert slept["weight sync"].peak == pytest.approx(awake["weight sync"].peak - share + asleep + weights, abs=1)
    assert slept["weight sync"].terms["vLLM weights woken for the sync"] == weights
    lora = _recipe("grpo-baseline-lora")  # shipped asleep: level 1, the bf16 weights offloaded to the host
    lora_plan = make_plan(lora, shape, 8, 79.0)
    assert lora.rollout.vllm.sleep_during_update and "weight sync" not in [p.name for p in lora_plan.phases]
    assert lora_plan.host_peak == weights


def update_logits(terms: dict[str, float], forward: float, backward: float) -> bool:
    """The update phase is the larger of two moments: its logits term is the forward's end's or a backward
    chunk's; True when it is the expected one of the moment the plan chose."""
    if "logits (+ entropy), the forward's end" in terms:
        return terms["logits (+ entropy), the forward's end"] == forward
    return terms["logits (+ entropy), backward"] == backward


def _with_grpo(cfg: TrainConfig, **changes: object) -> TrainConfig:
    return replace(cfg, grpo=replace(cfg.grpo, **changes))


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_shape_params_equal_transformers_model(model_type: str) -> None:
    """ModelShape.params counts what transformers builds from the same config (meta device: no memory)."""
    import transformers

    config = dict(TINY, model_type=model_type, head_dim=64, tie_word_embeddings=model_type == "qwen3")
    cls = transformers.Qwen2ForCausalLM if model_type == "qwen2" else transformers.Qwen3ForCausalLM
    conf = (transformers.Qwen2Config if model_type == "qwen2" else transformers.Qwen3Config)(**config)
    with torch.device("meta"):
        model = cls(conf)
    assert shape_from_config(config, "t", "test").params == sum(p.numel() for p in model.parameters())


def _non_embedding(name: str) -> float:
    s = shipped_shapes()[name]
    return s.params - s.vocab_size * s.hidden_size * (1 if s.tie_word_embeddings else 2)


def test_shipped_shapes_match_the_published_parameter_counts() -> None:
    shapes = shipped_shapes()
    assert set(shapes) == {"Qwen/Qwen2.5-7B", "Qwen/Qwen3-4B-Base", "Qwen/Qwen3-8B-Base", "Qwen/Qwen3-14B-Base"}
    assert shapes["Qwen/Qwen2.5-7B"].params == 7_615_616_512
    assert round(_non_embedding("Qwen/Qwen2.5-7B") / 1e9, 2) == 6.53
    assert round(shapes["Qwen/Qwen3-4B-Base"].params / 1e9, 1) == 4.0
    assert round(_non_embedding("Qwen/Qwen3-4B-Base") / 1e9, 1) == 3.6
    assert round(shapes["Qwen/Qwen3-8B-Base"].params / 1e9, 1) == 8.2
    assert round(shapes["Qwen/Qwen3-14B-Base"].params / 1e9, 1) == 14.8
    assert round(_non_embedding("Qwen/Qwen3-14B-Base") / 1e9, 1) == 13.2
    assert all(s.source for s in shapes.values())


def test_any_other_model_is_read_from_its_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "model.safetensors").write_bytes(b"")  # a model folder (never read: no weights are loaded)
    assert model_shape(str(tmp_path)).params == shape_from_config(TINY, "t", "t").params
    with pytest.raises(InputError, match="no shape for model"):
        model_shape("someone/not-a-model-here")


def test_train_runs_the_check_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`lanpo train`'s check before loading (lanpo.train.state.check_before_loading): refused on a CUDA device
    that is too small, skipped on the CPU and with memory_check = false."""
    cfg = _recipe("grpo-baseline")

    class Props:
        total_memory = 24 * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    with pytest.raises(InputError, match="does not fit") as refused:
        check_training(cfg, "cuda")
    assert refused.value.hint and "model.name" in refused.value.hint
    assert check_training(cfg, "cpu") is None
    assert check_training(replace(cfg, memory_check=False), "cuda") is None
    Props.total_memory = 80 * 2**30
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert check_training(cfg, "cuda").fits  # type: ignore[union-attr]


def test_suggestion_keeps_gradient_checkpointing_on_under_later_changes() -> None:
    cfg = _recipe("grpo-baseline", ["model.gradient_checkpointing=false", "grpo.max_tokens_per_micro_batch=0"])
    change, plan = suggestion(cfg, model_shape(cfg.model.name), 8, 48.0)  # type: ignore[misc]
    assert change.startswith("model.gradient_checkpointing = true and grpo.max_tokens_per_micro_batch = ")
    assert plan.fits


DOCUMENTED = ["grpo-baseline", "grpo-baseline-lora", "mel-qwen3-4b", "mel-qwen3-8b", "mel-qwen3-14b"]


@pytest.mark.parametrize("name", DOCUMENTED)
def test_the_docs_tables_are_the_plans_own(name: str) -> None:
    """docs/scaling.md, "Planning memory": each recipe's table and verdicts, as `lanpo plan` prints them now."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "scaling.md").read_text()
    assert recipe_report(str(CONFIGS / f"{name}.toml")) in docs, f"regenerate {name}'s entry: recipe_report()"


def test_fsdp_mixed_precision_terms_by_hand() -> None:
    """Full fine-tuning on 2 ranks in bf16: FSDP2 mixed precision gathers units in bf16 (2 bytes a weight, 4 in
    fp32), reduces a layer's bf16 gradient through an fp32 copy (2 + 4 bytes a weight), keeps fp32 gradient shards,
    and casts no weight (no autocast term); alone, the same recipe runs under autocast, which caches its casts."""
    cfg = load_config(CONFIGS / "demo-cpu.toml", [])
    cfg = replace(cfg, batch_size=2, lora=replace(cfg.lora, enabled=False))
    cfg.rollout.backend, cfg.rollout.n, cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens = "hf", 2, 64, 1024
    cfg.grpo.micro_batch_size, cfg.grpo.autocast, cfg.grpo.logprob_chunk_tokens = 2, "bf16", 512
    shape = shape_from_config(TINY, "tiny", "test")
    P, layer, outer = shape.params, 590_848, 2 * 152_064 * 256 + 256  # a layer (see above); embedding, head, norm
    assert (shape.layer_params, shape.outer_params, P) == (layer, outer, outer + 4 * layer)
    mixed = make_plan(cfg, shape, 2, 80.0)
    phases = {p.name: p.terms for p in mixed.phases}
    assert phases["generate"]["FSDP unshard (whole bf16 model)"] == 2 * P  # the hf backend generates on the policy
    assert phases["reference log-probs"]["reference FSDP units"] == 2 * (outer + 2 * layer)
    assert phases["update"]["FSDP units gathered"] == 2 * (outer + 2 * layer) + (2 + 4) * layer
    assert phases["update"]["grads (shard)"] == 4 * P / 2
    assert "autocast bf16 weight casts" not in phases["update"]
    fp32 = {p.name: p.terms for p in make_plan(replace(cfg, grpo=replace(cfg.grpo, autocast="off")), shape, 2).phases}
    assert fp32["generate"]["FSDP unshard (whole fp32 model)"] == 4 * P
    assert fp32["update"]["FSDP units gathered"] == 4 * (outer + 2 * layer) + 4 * layer
    alone = {p.name: p.terms for p in make_plan(cfg, shape, 1, 80.0).phases}
    assert alone["update"]["autocast bf16 weight casts"] == 2 * (P - 152_064 * 256)
    assert "FSDP units gathered" not in alone["update"]
    # LoRA keeps autocast (DDP): it caches the casts of the fp32 adapter only, 2 bytes an adapter weight
    lora = replace(cfg, lora=replace(cfg.lora, enabled=True))
    terms = {p.name: p.terms for p in make_plan(lora, shape, 2, 80.0).phases}["update"]
    assert terms["autocast bf16 weight casts"] == 2 * shape.lora_params(lora.lora.r, lora.lora.target_modules) > 0
    assert "FSDP units gathered" not in terms


def test_update_moments_and_the_optimizer_step_by_hand() -> None:
    """The update is the larger of two moments. A chunk's backward holds every gradient and, for a trained untied
    head, its fp32 gradient while backward sums it over the chunks: the running sum and the next chunk's (8 V H)
    through the head's own forward, the fused head's accumulator (4 V H). The forward's end holds the gradients
    only from a minibatch's second micro-batch on (LoRA here, whose forward's end is the larger moment). The
    optimizer step holds every gradient and AdamW's temporaries: one tensor at a time on a CPU (the largest
    one's sqrt and quotient, 2 x 4 V H), every tensor's sqrt at once on CUDA (torch's multi-tensor AdamW, 4P)."""
    cfg = load_config(CONFIGS / "demo-cpu.toml", [])
    cfg = replace(cfg, batch_size=1, lora=replace(cfg.lora, enabled=False))
    cfg.rollout.n, cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens = 2, 64, 2048
    cfg.rollout.feedback_max_new_tokens, cfg.rollout.temperature = 0, 1.0
    cfg.grpo.micro_batch_size, cfg.grpo.autocast, cfg.grpo.minibatch_size = 2, "off", 0
    shape = shape_from_config(TINY, "tiny", "test")
    V, H, P = 152064, 256, shape.params
    for fused, head in ((False, 8 * V * H), (True, 4 * V * H)):
        plan = make_plan(_with_grpo(cfg, logprob_fused=fused, logprob_chunk_tokens=512), shape, 1, 80.0, device="cpu")
        phases = {p.name: p.terms for p in plan.phases}
        assert phases["update"]["head gradient being summed"] == head, fused
        assert phases["update"]["grads"] == 4 * P
        assert phases["optimizer step"]["AdamW temporaries"] == 2 * 4 * V * H
        assert phases["optimizer step"]["grads"] == 4 * P
    on_cuda = {p.name: p.terms for p in make_plan(cfg, shape, 1, 80.0).phases}
    assert on_cuda["optimizer step"]["AdamW temporaries"] == 4 * P
    lora = replace(cfg, lora=replace(cfg.lora, enabled=True))
    for rows, grads in ((2, False), (1, True)):  # 2 rows: one micro-batch; 1 row: two, the second after the first's
        plan = make_plan(_with_grpo(lora, micro_batch_size=rows), shape, 1, 80.0, device="cpu")
        update = next(p for p in plan.phases if p.name == "update").terms
        assert "logits (+ entropy), the forward's end" in update and "head gradient being summed" not in update
        assert ("LoRA grads" in update) is grads, rows
