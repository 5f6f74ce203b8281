"""`lanpo plan`: the peak memory per GPU of each phase of a training step, from a TrainConfig and a model's shape
alone (`lanpo.train.plan_shapes`; no weights loaded), the disk of a checkpoint, and whether it all fits.

It counts what lanpo's code holds, phase by phase (bytes; GiB = 2^30 bytes). Notation: P parameters (shape),
P_l LoRA parameters, L layers, H hidden, I intermediate, Dq = heads x head_dim, Dkv = kv_heads x head_dim,
V vocabulary; W GPUs; s = W when full fine-tuning is FSDP-sharded (W > 1), else 1; M the GPU's memory.
Rows m = `grpo.micro_batch_size` (fewer when `grpo.max_tokens_per_micro_batch` caps m x S), S = P_tok + T
positions a row (`rollout.max_prompt_tokens` + the longest completion limit: padded batches reach it).
Weight bytes b = 4 (full fine-tuning: fp32 master weights, `lanpo.train.policy.FullPolicy`) or the loaded
dtype (LoRA: bf16 on a GPU); compute bytes a = 2 under `grpo.autocast` bf16 (auto is bf16 on a GPU), else b.

Held the whole run (every phase):
- engine = f x M, f = `rollout.vllm.memory_fraction` (0.45 on CUDA): vLLM reserves it at start and lanpo never
  puts it to sleep. None with `rollout.backend = hf`. Plus 0.5 GiB for the trainer's CUDA context.
- resident: full 4P/s weights + 8P/s AdamW moments (fp32); LoRA b x P base + 12 P_l (fp32 adapter, moments).
  The full fine-tuning reference lives on the CPU (alone) or as CPU-offloaded FSDP shards (torchrun).
- `device = "cpu"` (the validation's own plan, `make_plan(..., device="cpu")`): no CUDA context, no engine, and
  the full fine-tuning reference resident (4P): the rest is the same arithmetic.
- the step's batch on the device: 3 x 8 bytes x (rows of this rank) x S (ids, mask, positions).

Phases (each adds to the above):
- generate: with `rollout.backend = hf` the policy generates itself, and FSDP unshards the whole fp32 model on
  every rank (`fsdp.full_weights`) +4P, plus the KV cache of 64 rows (`HFBackend.max_batch`) x S x L x 2 Dkv x a;
  with an engine nothing is gathered (`FullPolicy.generating`; `Options.unshard_generating = True` counts the
  unshard lanpo did before issue 37).
- old / reference log-probs (no grad; old only when `ppo_epochs` > 1 or several minibatches): the reference
  visits the GPU whole (alone: +4P) or unit by unit (FSDP: root 4 x (V x H (x2 untied) + H) + 2 layers);
  one layer's working set m S (3I + 2Dq + 2H) a; the shared-prompt KV cache m P_tok L 2 Dkv a; the logits
  N x V x (a + 4 + 4) (model output, fp32 copy when a = 2, logsumexp's exp; + 4 for logits / temperature when
  the temperature is not 1), N = m x T positions; chunked (`lanpo.train.consumer.chunking`: N x V x 24 over
  `grpo.logprob_chunk_mb` B, chunks of C = B / (V x 8) positions, B / (V x 16) unfused; or
  `grpo.logprob_chunk_tokens` C when N > C): fused, C x V x (4 + 2 when a = 2) (the fp32 logits, exponentiated in
  place, beside the matmul's bf16 output); unfused, C x V x 8 (the fp32 copy and the tempered one replace the
  head's output in `_chunk_logprobs` instead of sitting beside it).
- update: + grads (full 4P/s, LoRA 4 P_l, +4 P_l DDP buckets); FSDP units gathered (root + 2 layers) + one
  layer's gradient; autocast's bf16 weight casts 2 (P - V H) (full fine-tuning: autocast caches the cast of
  every trainable leaf a matmul reads until the forward ends; the input embedding is looked up, not cast, unless
  the head shares it); activations per position per layer
  A = a (4I + 5 Dq + 2H) + 8H (+ (a + 4)(Dq + Dkv) for Qwen3's q/k norms): m S L A without
  `model.gradient_checkpointing`, m S (L H a + A) with it (layer inputs + one layer recomputed); logits
  N x V x (a + 4 + 12) at the forward's end (model output, fp32 copy, the entropy's log-softmax, exp and product)
  or N x V x 12 in backward (saved fp32 logits, softmax, gather's gradient), whichever is larger. Chunked (as for
  the log-probs), C in place of N, one chunk's logits at a time, recomputed in backward: fused, C x V x 8 (fp32
  logits and their exp, for the entropy; backward 4 + 2 when a = 2); unfused, C x V x 16 (fp32 logits and the
  entropy's three).
- sync (full weights into vLLM: full fine-tuning, or `lora_sync = merged`): one tensor at a time
  (`lanpo.rollout.weights.gathered`): FSDP gathers it in fp32 and casts it to the engine's dtype, + 6 V x H for the
  largest; alone the state dict is the model's own, + 2 V x H for the cast (`Options.streamed_sync = False`
  counts the full fp32 state gathered on every rank, +4P, as before issue 37). Host RAM: the engine stages every
  bucket in its dtype (2P), plus one `sync_bucket_mb` bucket and the hashed tensor's fp32 copy (4 V x H). Merged
  LoRA: the merged copies of the adapted weights.
- checkpoint: FSDP gathers each tensor to rank 0's CPU in turn: + the largest tensor (V x H x 4) on the GPU,
  12P of host RAM on rank 0.
- disk a checkpoint: full 4P (fp32 safetensors) + 8P (AdamW moments); LoRA 4 P_l + 8 P_l. On disk at once:
  `checkpoint.keep` of them, plus step 0.

Validated against measured peaks on a CPU at small shapes with a 152,064-token vocabulary (bench/plan_check.py;
docs/scaling.md, "Planning memory: lanpo plan").
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

from lanpo.errors import InputError
from lanpo.rollout.config import AUTO_MEMORY_FRACTION
from lanpo.train.config import TrainConfig
from lanpo.train.consumer.chunking import FUSED_BYTES, Chunking
from lanpo.train.plan_shapes import ModelShape

log = logging.getLogger(__name__)

GiB = 2**30
CUDA_CONTEXT = 0.5 * GiB  # the trainer process's CUDA context and allocator slack
HF_MAX_BATCH = 64  # lanpo.rollout.hf.HFBackend's default max_batch: rows of one decode loop


@dataclass
class Phase:
    name: str
    terms: dict[str, float]  # what this phase holds on a GPU, bytes by what

    @property
    def peak(self) -> float:
        return sum(self.terms.values())


@dataclass
class Plan:
    shape: ModelShape
    gpus: int
    gpu_memory: float  # bytes per GPU
    phases: list[Phase]
    checkpoint_disk: float  # bytes a checkpoint
    checkpoints_on_disk: int
    host_peak: float  # bytes of host RAM at the peak (rank 0)
    held: dict[str, float]  # the terms every phase holds (bytes by what)
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.peak)

    @property
    def fits(self) -> bool:
        return self.peak.peak <= self.gpu_memory


@dataclass(frozen=True)
class Options:
    """The code the plan counts. Defaults: lanpo's code now; the older behaviours stay countable, so that a plan can
    say what the change bought (docs/scaling.md)."""

    # FSDP's full_weights around generation: None counts lanpo now, which unshards only for `rollout.backend = hf`
    # (the policy generates itself; with an engine nothing is gathered, `FullPolicy.generating`); True, every backend
    unshard_generating: bool | None = None
    # the weight sync gathers one tensor at a time (`lanpo.rollout.weights.gathered`); False: the full fp32 state on
    # every rank at once, as lanpo did before issue 37
    streamed_sync: bool = True


def micro_positions(cfg: TrainConfig) -> tuple[int, int, int, int]:
    """(rows a micro-batch, positions a row S, prompt positions, completion positions T)."""
    prompt = cfg.rollout.max_prompt_tokens
    completion = max(cfg.rollout.max_new_tokens, cfg.rollout.feedback_max_new_tokens)
    row = prompt + completion
    rows = cfg.grpo.micro_batch_size
    budget = cfg.grpo.max_tokens_per_micro_batch
    if budget > 0:
        rows = max(1, min(rows, budget // row))
    return rows, row, prompt, completion


def activation_per_position(shape: ModelShape, a: int) -> float:
    """Bytes one decoder layer saves for backward per position (see the module docstring: A)."""
    H, I, q, kv = shape.hidden_size, shape.intermediate_size, shape.q_dim, shape.kv_dim  # noqa: E741
    saved = a * (4 * I + 5 * q + 2 * H) + 8 * H
    return saved + ((a + 4) * (q + kv) if shape.qk_norm else 0)


def make_plan(
    cfg: TrainConfig,
    shape: ModelShape,
    gpus: int = 1,
    gpu_memory_gib: float = 80.0,
    options: Options = Options(),
    device: str = "cuda",
) -> Plan:
    """The memory plan of `cfg` on `gpus` GPUs of `gpu_memory_gib` GiB each (formulas: the module docstring).

    `device = "cpu"`: the same phases in a CPU process's memory, as bench/plan_check.py measures them: no CUDA
    context and no engine reservation, and the full fine-tuning reference resident (lanpo moves it off the GPU
    only)."""
    W, M = gpus, gpu_memory_gib * GiB
    cuda = device == "cuda"
    full = not cfg.lora.enabled
    fsdp = full and W > 1
    s = W if fsdp else 1
    P, L, V, H = shape.params, shape.num_hidden_layers, shape.vocab_size, shape.hidden_size
    P_l = 0 if full else shape.lora_params(cfg.lora.r, cfg.lora.target_modules)
    b = 4 if full or cfg.model.dtype == "float32" else 2
    a = 2 if cfg.grpo.autocast in ("bf16", "auto") else b
    rows, S, prompt, T = micro_positions(cfg)
    share = cfg.grpo.share_prompts and not fsdp and not cfg.model.gradient_checkpointing
    n = cfg.rollout.n
    distinct = min(rows, math.ceil(rows / n) + (1 if rows % n else 0))
    engine = cfg.rollout.backend == "vllm" and cuda
    f = cfg.rollout.vllm.memory_fraction or AUTO_MEMORY_FRACTION["cuda"]
    notes: list[str] = []

    held: dict[str, float] = {"CUDA context": CUDA_CONTEXT} if cuda else {}
    if engine:
        held[f"vLLM engine ({f:g} of the GPU)"] = f * M
    if full:
        held["fp32 weights" + (" (shard)" if fsdp else "")] = 4 * P / s
        held["AdamW moments" + (" (shard)" if fsdp else "")] = 8 * P / s
    else:
        held["base weights"] = b * P
        held["LoRA weights + AdamW"] = 12 * P_l
    if full and not fsdp and not cuda:
        held["reference (fp32, resident)"] = 4 * P
    local_rows = math.ceil(cfg.batch_size * n / W)
    held["step batch (ids, masks)"] = 3 * 8 * local_rows * S

    # ---- generate
    gen = dict(held)
    unshard = cfg.rollout.backend == "hf" if options.unshard_generating is None else options.unshard_generating
    if fsdp and unshard:
        gen["FSDP unshard (whole fp32 model)"] = 4 * P
    if cfg.rollout.backend == "hf":
        gen["hf KV cache"] = HF_MAX_BATCH * S * L * 2 * shape.kv_dim * a

    # ---- log-probs (no grad): the reference's, and the old policy's
    chunking = Chunking.of(cfg.grpo)
    fused = chunking.fused and not (cfg.lora.enabled and "lm_head" in cfg.lora.target_modules)
    chunk = chunking.chunk(rows * T, V, fused)
    logit_positions = chunk or rows * T
    if chunk and fused:  # `head_logprobs`: fp32 logits beside the bf16 output, in place; + their exp (entropy)
        ref_bytes, forward_bytes, backward_bytes = 4 + (2 if a == 2 else 0), FUSED_BYTES, 4 + (2 if a == 2 else 0)
    elif chunk:  # `_chunk_logprobs`: the fp32 copy and the tempered one replace the head's output, not beside it
        ref_bytes, forward_bytes, backward_bytes = 4 + 4, 4 + 12, 12  # fp32 logits + logsumexp's exp (+ entropy)
    else:  # the model's output stays referenced while its fp32 copy (bf16) and the tempered copy are made
        fp32_copy = 4 if a == 2 else 0
        tempered = 4 if cfg.rollout.temperature != 1.0 else 0
        ref_bytes, forward_bytes = a + fp32_copy + tempered + 4, a + fp32_copy + tempered + 12
        backward_bytes = 12
    positions = distinct * prompt + rows * T if share else rows * S
    working = {
        "one layer's working set": positions * (3 * shape.intermediate_size + 2 * shape.q_dim + 2 * H) * a,
        "logits (model, fp32, logsumexp)": logit_positions * V * ref_bytes,
    }
    if share:
        working["shared-prompt KV cache"] = rows * prompt * L * 2 * shape.kv_dim * a
    units = 4 * (shape.outer_params + 2 * shape.layer_params)
    ref = dict(held) | working
    if fsdp:
        ref["reference FSDP units"] = units
    elif full and cuda:
        ref["reference visiting (fp32)"] = 4 * P
    on_policy = cfg.grpo.ppo_epochs == 1 and _minibatches(cfg) == 1
    old = None if on_policy else dict(held) | working

    # ---- update
    upd = dict(held)
    if full:
        upd["grads" + (" (shard)" if fsdp else "")] = 4 * P / s
        if a == 2:  # autocast caches its cast of every weight a matmul reads (not the input embedding's lookup)
            upd["autocast bf16 weight casts"] = 2 * (P - (0 if shape.tie_word_embeddings else V * H))
    else:
        upd["LoRA grads"] = 4 * P_l * (2 if W > 1 else 1)
    if fsdp:
        upd["FSDP units gathered"] = units + 4 * shape.layer_params
    A = activation_per_position(shape, a)
    if cfg.model.gradient_checkpointing:
        upd["activations (checkpointed)"] = positions * (L * H * a + A)
    else:
        upd["activations"] = positions * L * A
    if share:
        upd["shared-prompt KV cache"] = rows * prompt * L * 2 * shape.kv_dim * a
    upd["logits (+ entropy, backward)"] = logit_positions * V * max(forward_bytes, backward_bytes)

    # ---- sync and checkpoint
    sync_needed = engine and (full or cfg.rollout.vllm.lora_sync_on("cuda") == "merged")
    sync = None
    host = 0.0
    if sync_needed:
        sync = dict(held)
        if full and fsdp and not options.streamed_sync:
            sync["full fp32 state gathered"] = 4 * P
        elif full:  # one tensor at a time, the largest V x H: gathered in fp32 (FSDP), cast to the engine's dtype
            sync["largest tensor gathered and cast"] = (6 if fsdp else 2) * V * H
        else:
            sync["merged adapted weights"] = b * _adapted_weights(shape, cfg.lora.target_modules)
        # host: the engine's staged copy in its dtype, one packed bucket, the hashed tensor's fp32 copy
        host = 2 * P + cfg.rollout.vllm.sync_bucket_mb * 2**20 + 4 * V * H
    ckpt = dict(held)
    if fsdp:
        ckpt["largest tensor gathered"] = 4 * V * H
        host = max(host, 12 * P)
    disk = (12 * P) if full else (12 * P_l)

    phases = [Phase("generate", gen), Phase("reference log-probs", ref)]
    if old is not None:
        phases.append(Phase("old log-probs", old))
    phases.append(Phase("update", upd))
    if sync is not None:
        phases.append(Phase("weight sync", sync))
    phases.append(Phase("checkpoint", ckpt))
    if fsdp:
        notes.append(
            "generate: FSDP unshards the whole model on every rank (the policy generates itself)"
            if unshard
            else "generate: no FSDP unshard (the engine generates)"
        )
        if sync is not None:
            notes.append(
                "weight sync: one tensor gathered at a time"
                if options.streamed_sync
                else "weight sync: the full fp32 state gathered on every rank (lanpo before issue 37)"
            )
    keep = cfg.checkpoint.keep
    return Plan(shape, W, M, phases, disk, keep + 1, host, held, notes)


def _minibatches(cfg: TrainConfig) -> int:
    from lanpo.train.consumer.update import minibatches_per_epoch

    return minibatches_per_epoch(cfg.batch_size * cfg.rollout.n, cfg.grpo)


def _adapted_weights(shape: ModelShape, target_modules: list[str]) -> int:
    H, I, q, kv = shape.hidden_size, shape.intermediate_size, shape.q_dim, shape.kv_dim  # noqa: E741
    sizes = {"q_proj": H * q, "k_proj": H * kv, "v_proj": H * kv, "o_proj": q * H}
    sizes |= {"gate_proj": H * I, "up_proj": H * I, "down_proj": I * H}
    return shape.num_hidden_layers * sum(sizes.get(m, 0) for m in target_modules)


# --------------------------------------------------------------------------- what to change


def _candidates(cfg: TrainConfig, gpus: int) -> list[tuple[str, TrainConfig, int]]:
    """Changes that trade time or quality for memory, the cheapest first: (the key = value, the changed config,
    gpus). Smaller micro-batches first (memory only: the same loss), then a smaller vLLM reservation, more GPUs,
    LoRA instead of every weight."""
    out: list[tuple[str, TrainConfig, int]] = []
    rows, S, _, _ = micro_positions(cfg)
    m = rows
    while m > 1:
        m //= 2
        out.append(
            (f"grpo.max_tokens_per_micro_batch = {m * S}", _with(cfg, "grpo", max_tokens_per_micro_batch=m * S), gpus)
        )
    f = cfg.rollout.vllm.memory_fraction or AUTO_MEMORY_FRACTION["cuda"]
    if cfg.rollout.backend == "vllm" and f > 0.3:
        vllm = replace(cfg.rollout.vllm, memory_fraction=0.3)
        out.append(("rollout.vllm.memory_fraction = 0.3", _with(cfg, "rollout", vllm=vllm), gpus))
    for more in (2 * gpus, 4 * gpus):
        out.append((f"{more} GPUs (--gpus {more})", cfg, more))
    if not cfg.lora.enabled:
        out.append(("lora.enabled = true", _with(cfg, "lora", enabled=True), gpus))
    return out


def _with(cfg: TrainConfig, section: str, **changes: Any) -> TrainConfig:
    return replace(cfg, **{section: replace(getattr(cfg, section), **changes)})


def suggestion(
    cfg: TrainConfig, shape: ModelShape, gpus: int, gpu_memory_gib: float, options: Options = Options()
) -> tuple[str, Plan] | None:
    """The first change in `_candidates`' order that makes `cfg` fit, and its plan; None when none does.
    Gradient checkpointing comes first when it is off, and stays on under every later change (memory only, and
    every long-sequence recipe needs it)."""
    if cfg.model.gradient_checkpointing:
        base, first = cfg, []
    else:
        base, first = _with(cfg, "model", gradient_checkpointing=True), ["model.gradient_checkpointing = true"]
        plan = make_plan(base, shape, gpus, gpu_memory_gib, options)
        if plan.fits:
            return first[0], plan
    for label, changed, more in _candidates(base, gpus):
        plan = make_plan(changed, shape, more, gpu_memory_gib, options)
        if plan.fits:
            return " and ".join([*first, label]), plan
    return None


# --------------------------------------------------------------------------- printing


def gib(value: float) -> str:
    return f"{value / GiB:.1f}"


def table(plan: Plan) -> str:
    """The plan as printed by `lanpo plan`: one row a phase, then the checkpoint's disk and the verdict."""
    s = plan.shape
    lines = [
        f"model {s.name}: {s.params / 1e9:.2f} B parameters, {s.num_hidden_layers} layers, vocabulary "
        f"{s.vocab_size:,} (shape: {s.source})",
        f"{plan.gpus} x {plan.gpu_memory / GiB:g} GiB",
        "",
        "held in every phase: "
        + ", ".join(f"{k} {gib(v)}" for k, v in plan.held.items() if v >= GiB / 20)
        + f" = {gib(sum(plan.held.values()))} GiB",
        "",
        f"{'phase':<20} {'GiB/GPU':>8}  its largest term beyond those",
    ]
    for phase in plan.phases:
        own = {k: v for k, v in phase.terms.items() if k not in plan.held}
        top = max(own, key=lambda k: own[k]) if own else None
        lines.append(f"{phase.name:<20} {gib(phase.peak):>8}  " + (f"{top} {gib(own[top])}" if top else "-"))
    lines.append("")
    lines.append(
        f"checkpoint disk: {plan.checkpoint_disk / 1e9:.1f} GB each, {plan.checkpoints_on_disk} on disk at once "
        f"({plan.checkpoint_disk * plan.checkpoints_on_disk / 1e9:.0f} GB)"
    )
    if plan.host_peak:
        lines.append(f"host RAM beyond the trainer's own: {gib(plan.host_peak)} GiB (staging, gathered checkpoints)")
    lines.extend(f"note: {n}" for n in plan.notes)
    lines.append(f"verdict: {verdict(plan)}")
    return "\n".join(lines)


def verdict(plan: Plan) -> str:
    """`fits (peak 75.8 GiB in generate, of 79 GiB)` or `does not fit (...)`."""
    peak = plan.peak
    said = "fits" if plan.fits else "does not fit"
    return f"{said} (peak {gib(peak.peak)} GiB in {peak.name}, of {plan.gpu_memory / GiB:g} GiB)"


def recipe_report(path: str, gpus: int = 8, memories: tuple[float, ...] = (79.0, 95.0, 139.0)) -> str:
    """docs/scaling.md's entry for the recipe at `path`: `lanpo plan`'s table on `gpus` x memories[0] GiB, then the
    verdict on each other memory (tests/train/test_plan.py holds the docs to it)."""
    from lanpo.train.config import load_config
    from lanpo.train.plan_shapes import model_shape

    cfg = load_config(path, [])
    shape = model_shape(cfg.model.name)
    first, *others = memories
    lines = ["```", table(make_plan(cfg, shape, gpus, first)), "```", ""]
    lines += [f"- {gpus} x {m:g} GiB: {verdict(make_plan(cfg, shape, gpus, m))}" for m in others]
    return "\n".join(lines)


# --------------------------------------------------------------------------- refusing


def check_fits(
    cfg: TrainConfig, shape: ModelShape, gpus: int, gpu_memory_gib: float, plan: Plan | None = None
) -> Plan:
    """`plan` (made when None); InputError when its peak exceeds the GPU, the hint naming the key to change."""
    plan = plan or make_plan(cfg, shape, gpus, gpu_memory_gib)
    if plan.fits:
        return plan
    peak = plan.peak
    top = max(peak.terms, key=lambda k: peak.terms[k])
    message = (
        f"{shape.name} on {gpus} x {gpu_memory_gib:g} GiB does not fit: {peak.name} peaks at {gib(peak.peak)} GiB "
        f"a GPU (the largest part: {top}, {gib(peak.terms[top])} GiB)"
    )
    found = suggestion(cfg, shape, gpus, gpu_memory_gib)
    if found is None:
        hint = "no single change fits it: a smaller model.name, or larger GPUs; `lanpo plan` prints every phase"
    else:
        change, fixed = found
        hint = f"set {change} (peak {gib(fixed.peak.peak)} GiB); `lanpo plan` prints every phase"
    raise InputError(message, hint=hint)


def check_training(cfg: TrainConfig, device: Any) -> Plan | None:
    """`lanpo train`'s check before loading: on CUDA (and `memory_check` on), `check_fits` on this machine's GPUs
    (WORLD_SIZE ranks of the device's memory). None where it does not run: another device, the check off, or no
    shape for the model on this machine (a hub id not yet downloaded: logged, then loading goes on)."""
    import os

    import torch

    if not cfg.memory_check or torch.device(device).type != "cuda":
        return None
    from lanpo.train.plan_shapes import model_shape

    try:
        shape = model_shape(cfg.model.name)
    except InputError as exc:
        log.warning("no memory plan before loading: %s", exc.message)
        return None
    index = torch.device(device).index or 0
    memory = torch.cuda.get_device_properties(index).total_memory / GiB
    return check_fits(cfg, shape, int(os.environ.get("WORLD_SIZE", "1")), memory)
