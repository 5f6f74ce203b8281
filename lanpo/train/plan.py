"""`lanpo plan`: the peak memory per GPU of each phase of a training step, from a TrainConfig and a model's shape
alone (`lanpo.train.plan_shapes`; no weights loaded), the disk of a checkpoint, and whether it all fits.

It counts what lanpo's code holds, phase by phase (bytes; GiB = 2^30 bytes). Notation: P parameters (shape),
P_l LoRA parameters, L layers, H hidden, I intermediate, Dq = heads x head_dim, Dkv = kv_heads x head_dim,
V vocabulary; W GPUs; s = W when full fine-tuning is FSDP-sharded (W > 1), else 1; M the GPU's memory.
Rows m = `grpo.micro_batch_size` (fewer when `grpo.max_tokens_per_micro_batch` caps m x S), S = P_tok + T
positions a row (`rollout.max_prompt_tokens` + the longest completion limit: padded batches reach it).
Weight bytes b = 4 (full fine-tuning: fp32 master weights, `lanpo.train.policy.FullPolicy`) or the loaded
dtype (LoRA: bf16 on a GPU); compute bytes a = 2 under `grpo.autocast` bf16 (auto is bf16 on a GPU), else b.
bf16 compute runs two ways (`lanpo.train.policy`): sharded full fine-tuning (FSDP, W > 1) through FSDP2 mixed
precision, whose units are gathered in bf16 and whose gradients are reduced in fp32 into fp32 shards, so a gathered
weight takes g = 2 bytes (else g = 4) and no weight is ever cast by autocast; everything else (full fine-tuning
alone, LoRA) under `torch.autocast`.

Held the whole run (every phase):
- engine = f x M, f = `rollout.vllm.memory_fraction` (0.45 on CUDA): vLLM reserves it at start. None with
  `rollout.backend = hf`. With `rollout.vllm.sleep_during_update` it is held only while it generates and from the
  end of the weight sync (the checkpoint): asleep through the old / reference log-probs and the update it keeps
  2 GiB (`ENGINE_ASLEEP`: its CUDA graphs and context, an estimate), and in the weight sync it holds its woken
  weights (2P in bf16) beside that, its KV cache still asleep; under an adapter sync it sleeps at level 1, its
  weights (2P) in host RAM. Plus 0.5 GiB for the trainer's CUDA context.
- resident: full 4P/s weights + 8P/s AdamW moments (fp32); LoRA b x P base + 12 P_l (fp32 adapter, moments).
  The full fine-tuning reference lives on the CPU (alone) or as CPU-offloaded FSDP shards (torchrun).
- `device = "cpu"` (the validation's own plan, `make_plan(..., device="cpu")`): no CUDA context, no engine, and
  the full fine-tuning reference resident (4P): the rest is the same arithmetic.
- the step's batch on the device: 3 x 8 bytes x (rows of this rank) x S (ids, mask, positions).

Phases (each adds to the above):
- generate: with `rollout.backend = hf` the policy generates itself, and FSDP unshards the whole model on
  every rank (`fsdp.full_weights`) + g P, plus the KV cache of 64 rows (`HFBackend.max_batch`) x S x L x 2 Dkv x a,
  or of the summaries after them when larger (the policy summarises through the same backend: min(64, a rank's
  summaries at most) rows of S + `summarizer.max_new_tokens`); with an engine, summaries take the engine's own
  cache, and nothing is gathered (`FullPolicy.generating`; `Options.unshard_generating = True` counts the
  whole model unsharded for generation).
- old / reference log-probs (no grad; old only when `ppo_epochs` > 1 or several minibatches): the reference
  visits the GPU whole (alone: +4P) or unit by unit (FSDP: root g x (V x H (x2 untied) + H) + 2 layers);
  one layer's working set m S (3I + 2Dq + 2H) a; the shared-prompt KV cache m P_tok L 2 Dkv a; the logits
  N x V x (a + 4 + 4) (model output, fp32 copy when a = 2, logsumexp's exp; + 4 for logits / temperature when
  the temperature is not 1), N = m x T positions; chunked (`lanpo.train.forward.chunking`: N x V x 24 over
  `grpo.logprob_chunk_mb` B, chunks of C = B / (V x 8) positions, B / (V x 16) unfused; or
  `grpo.logprob_chunk_tokens` C when N > C): fused, C x V x (4 + 2 when a = 2) (the fp32 logits, exponentiated in
  place, beside the matmul's bf16 output); unfused, C x V x 8 (the fp32 copy and the tempered one replace the
  head's output in `_chunk_logprobs` instead of sitting beside it). Under FSDP the reference pass is also the
  larger of that and the moment the root unit is all-gathered: its output buffer beside the parameters copied out
  of it, + g x (the root's weights).
- update: the larger of two moments, the forward's end and a chunk's backward. Both hold the FSDP units gathered
  (root + 2 layers, g bytes a weight) + one layer's gradient (4 bytes a weight; mixed precision: its bf16 gradient
  and the fp32 copy the reduce-scatter takes, 2 + 4); autocast's bf16 weight casts 2 (P - V H) (full fine-tuning
  alone: autocast caches the cast of every trainable leaf a matmul reads until the forward ends; the input
  embedding is looked up, not cast, unless the head shares it; under FSDP mixed precision the weights already are
  bf16: nothing is cast; LoRA: the fp32 adapter's casts 2 P_l, the frozen base's casts are not cached); and the
  activations, per position per layer A = a (4I + 5 Dq + 2H) + 8H (+ (a + 4)(Dq + Dkv) for Qwen3's q/k norms):
  m S L A without `model.gradient_checkpointing`, m S (L H a + A) with it (layer inputs + one layer recomputed).
  The forward's end holds the logits N x V x (a + 4 + 12) (model output, fp32 copy, the entropy's log-softmax, exp
  and product), and the gradients (full 4P/s, LoRA 4 P_l, +4 P_l DDP buckets) only from a minibatch's second
  micro-batch on. A backward holds N x V x 12 (saved fp32 logits, softmax, gather's gradient), every gradient, and
  a trained untied head's fp32 gradient while backward sums it: 4 V H, or 8 V H over chunks through the head's own
  forward (autograd's running sum and the next chunk's). Chunked (as for the log-probs), C in place of N, one
  chunk's logits at a time, recomputed in backward: fused, C x V x 8 at the forward's end (fp32 logits and their
  exp, for the entropy) and 4 (+ 2 when a = 2) in backward; unfused, 16 and 16 (the recomputed 12 and their
  gradient).
- optimizer step: every gradient and AdamW's temporaries, as torch runs it by default: on CUDA the multi-tensor
  implementation takes the sqrt of every second moment at once (4P/s; LoRA 4 P_l), on a CPU one tensor at a time
  (the largest tensor's sqrt and quotient, 2 x 4 V H / s).
- sync (full weights into vLLM: full fine-tuning, or `lora_sync = merged`): one tensor at a time
  (`lanpo.rollout.weights.gathered`): FSDP gathers it in fp32 and casts it to the engine's dtype, + 6 V x H for the
  largest; alone the state dict is the model's own, + 2 V x H for the cast (`Options.streamed_sync = False`
  counts the full fp32 state gathered on every rank, +4P). Host RAM: the engine stages every
  bucket in its dtype (2P), plus one `sync_bucket_mb` bucket and the hashed tensor's fp32 copy (4 V x H). Merged
  LoRA: the merged copies of the adapted weights.
- checkpoint: FSDP gathers each tensor to rank 0's CPU in turn: + the largest tensor (V x H x 4) on the GPU,
  12P of host RAM on rank 0.
- disk a checkpoint: full 4P (fp32 safetensors) + 8P (AdamW moments); LoRA 4 P_l + 8 P_l. On disk at once:
  `checkpoint.keep` of them, plus step 0.

Validated against measured peaks (live tensor bytes) on a CPU and an H200 at small shapes with a 152,064-token
vocabulary (bench/plan_check.py; docs/scaling.md, "Planning memory: lanpo plan"); the lowest ratio measured is the
verdict's margin (`lanpo.train.plan_verdict.WORST_RATIO`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lanpo.rollout.config import AUTO_MEMORY_FRACTION
from lanpo.train.config import TrainConfig
from lanpo.train.forward.chunking import CHECKPOINTED_BYTES, FUSED_BYTES, Chunking
from lanpo.train.plan_shapes import ModelShape
from lanpo.train.plan_tokens import summaries_per_step

GiB = 2**30
CUDA_CONTEXT = 0.5 * GiB  # the trainer process's CUDA context and allocator slack
HF_MAX_BATCH = 64  # lanpo.rollout.hf.HFBackend's default max_batch: rows of one decode loop
# What a vLLM engine keeps on its GPU asleep (`rollout.vllm.sleep_during_update`), an estimate: its sleep releases
# only the memory it allocated for weights and KV cache (CuMemAllocator's pools); its CUDA graph pools and CUDA
# context stay (vLLM PR 56373: "Level-1 cuMem sleep releases weights and KV cache, but leaves graph executables and
# native CUDA graph pools resident"). vLLM issue 47654 measured 1.5 GB of CUDA graphs on one such engine; with a
# CUDA context of ~0.5 GiB, 2 GiB. Not measured here (no GPU): bench/gpu_check.py's row "engine asleep during the
# update" prints it.
ENGINE_ASLEEP = 2 * GiB


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
    # every rank at once
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


@dataclass(frozen=True)
class _Step:
    """What every phase's arithmetic reads (the module docstring's notation), computed once from the recipe."""

    cfg: TrainConfig
    shape: ModelShape
    options: Options
    W: int  # GPUs
    M: float  # bytes a GPU
    cuda: bool
    full: bool  # every weight trains (else LoRA)
    fsdp: bool
    s: int  # shards of the trained state
    P_l: int  # LoRA parameters
    b: int  # bytes a base weight
    bf16: bool
    a: int  # compute bytes
    mixed: bool  # FSDP2 mixed precision (`fsdp.shard(..., compute=bf16)`), not autocast's casts
    g: int  # bytes a weight FSDP gathers
    rows: int
    S: int
    prompt: int
    T: int
    share: bool  # shared-prompt forwards
    positions: int  # positions a micro-batch's forward runs
    engine: bool
    fused: bool
    chunk: int  # positions a chunk of the head's logits (0: the full logits)
    ref_bytes: int  # a position and vocabulary entry: the no-grad passes
    forward_bytes: int  # the update's forward's end
    backward_bytes: int  # a chunk's backward

    @property
    def logit_positions(self) -> int:
        return self.chunk or self.rows * self.T

    @property
    def units(self) -> int:
        """FSDP's units gathered at once: the root and two layers."""
        return self.g * (self.shape.outer_params + 2 * self.shape.layer_params)

    def engine_in(self, phase: str) -> dict[str, float]:
        """The engine's term in `phase` ("held": in every phase)."""
        return _engine_terms(self.cfg, self.shape.params, self.M, phase) if self.engine else {}


def _step(cfg: TrainConfig, shape: ModelShape, gpus: int, memory: float, options: Options, device: str) -> _Step:
    full = not cfg.lora.enabled
    fsdp = full and gpus > 1
    b = 4 if full or cfg.model.dtype == "float32" else 2
    bf16 = cfg.grpo.autocast in ("bf16", "auto")
    a = 2 if bf16 else b
    rows, S, prompt, T = micro_positions(cfg)
    share = cfg.grpo.share_prompts and not fsdp and not cfg.model.gradient_checkpointing
    n = cfg.rollout.n
    distinct = min(rows, math.ceil(rows / n) + (1 if rows % n else 0))
    chunking = Chunking.of(cfg.grpo)
    fused = chunking.fused and not (cfg.lora.enabled and "lm_head" in cfg.lora.target_modules)
    chunk = chunking.chunk(rows * T, shape.vocab_size, fused)
    if chunk and fused:  # `head_logprobs`: fp32 logits beside the bf16 output, in place; + their exp (entropy)
        ref_bytes, forward_bytes, backward_bytes = 4 + (2 if a == 2 else 0), FUSED_BYTES, 4 + (2 if a == 2 else 0)
    elif chunk:  # `_chunk_logprobs`: the fp32 copy and the tempered one replace the head's output, not beside it
        # backward: the recomputed 12 and their gradient
        ref_bytes, forward_bytes, backward_bytes = 4 + 4, CHECKPOINTED_BYTES, CHECKPOINTED_BYTES
    else:  # the model's output stays referenced while its fp32 copy (bf16) and the tempered copy are made
        copies = (4 if a == 2 else 0) + (4 if cfg.rollout.temperature != 1.0 else 0)
        ref_bytes, forward_bytes, backward_bytes = a + copies + 4, a + copies + 12, 12
    return _Step(
        cfg,
        shape,
        options,
        gpus,
        memory,
        device == "cuda",
        full,
        fsdp,
        gpus if fsdp else 1,
        0 if full else shape.lora_params(cfg.lora.r, cfg.lora.target_modules),
        b,
        bf16,
        a,
        fsdp and bf16,
        2 if fsdp and bf16 else 4,
        rows,
        S,
        prompt,
        T,
        share,
        distinct * prompt + rows * T if share else rows * S,
        cfg.rollout.backend == "vllm" and device == "cuda",
        fused,
        chunk,
        ref_bytes,
        forward_bytes,
        backward_bytes,
    )


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
    st = _step(cfg, shape, gpus, gpu_memory_gib * GiB, options, device)
    held = _held(st)
    ref, old = _logprob_passes(st, held)
    upd, grads = _update(st, held)
    sync, ckpt, host = _sync_and_checkpoint(st, held)
    phases = [Phase("generate", _generate(st, held)), Phase("reference log-probs", ref)]
    if old is not None:
        phases.append(Phase("old log-probs", old))
    phases += [Phase("update", upd), Phase("optimizer step", _optimizer_step(st, held, grads))]
    if sync is not None:
        phases.append(Phase("weight sync", sync))
    phases.append(Phase("checkpoint", ckpt))
    disk = 12 * shape.params if st.full else 12 * st.P_l
    return Plan(shape, gpus, st.M, phases, disk, cfg.checkpoint.keep + 1, host, held, _notes(st, sync is not None))


def _held(st: _Step) -> dict[str, float]:
    """What every phase holds: the CUDA context, the engine's share, the weights and their AdamW state, the batch."""
    P, cfg = st.shape.params, st.cfg
    held: dict[str, float] = {"CUDA context": CUDA_CONTEXT} if st.cuda else {}
    held |= st.engine_in("held")
    shard = " (shard)" if st.fsdp else ""
    if st.full:
        held["fp32 weights" + shard] = 4 * P / st.s
        held["AdamW moments" + shard] = 8 * P / st.s
    else:
        held["base weights"] = st.b * P
        held["LoRA weights + AdamW"] = 12 * st.P_l
    if st.full and not st.fsdp and not st.cuda:
        held["reference (fp32, resident)"] = 4 * P
    held["step batch (ids, masks)"] = 3 * 8 * math.ceil(cfg.batch_size * cfg.rollout.n / st.W) * st.S
    return held


def _unshards(st: _Step) -> bool:
    """FSDP gathers the whole model to generate: only when the policy generates itself (the hf backend)."""
    unshard = st.options.unshard_generating
    return st.cfg.rollout.backend == "hf" if unshard is None else unshard


def _generate(st: _Step, held: dict[str, float]) -> dict[str, float]:
    cfg, shape = st.cfg, st.shape
    gen = dict(held) | st.engine_in("generate")
    if st.fsdp and _unshards(st):
        gen[f"FSDP unshard (whole {'bf16' if st.mixed else 'fp32'} model)"] = st.g * shape.params
    if cfg.rollout.backend == "hf":  # the rollouts' rows, then the summaries' (prompt, response, summary): the larger
        summary_rows = min(HF_MAX_BATCH, summaries_per_step(cfg, st.W)[1])
        kv_rows = max(HF_MAX_BATCH * st.S, summary_rows * (st.S + cfg.summarizer.max_new_tokens))
        gen["hf KV cache"] = kv_rows * shape.num_hidden_layers * 2 * shape.kv_dim * st.a
    return gen


def _kv_cache(st: _Step) -> float:
    """The shared prompts' KV cache a micro-batch's forward keeps."""
    return st.rows * st.prompt * st.shape.num_hidden_layers * 2 * st.shape.kv_dim * st.a


def _logprob_passes(st: _Step, held: dict[str, float]) -> tuple[dict[str, float], dict[str, float] | None]:
    """The reference pass and (off-policy only) the old policy's: no gradient, one layer's working set, the logits."""
    shape = st.shape
    layer = 3 * shape.intermediate_size + 2 * shape.q_dim + 2 * shape.hidden_size  # a position's working bytes / a
    working = {
        "one layer's working set": st.positions * layer * st.a,
        "logits (model, fp32, logsumexp)": st.logit_positions * shape.vocab_size * st.ref_bytes,
    }
    if st.share:
        working["shared-prompt KV cache"] = _kv_cache(st)
    ref = dict(held) | working | st.engine_in("reference log-probs")
    if st.fsdp:
        ref["reference FSDP units"] = st.units
        # the root unit's all-gather: its output buffer beside the parameters copied out of it, before any
        # forward of the unit's own (the larger of that moment and the logits')
        gathering = dict(held) | st.engine_in("reference log-probs")
        gathering["reference FSDP units"] = st.units
        gathering["the root unit's all-gather buffer"] = st.g * shape.outer_params
        ref = max(ref, gathering, key=lambda terms: sum(terms.values()))
    elif st.full and st.cuda:
        ref["reference visiting (fp32)"] = 4 * shape.params
    on_policy = st.cfg.grpo.ppo_epochs == 1 and _minibatches(st.cfg) == 1
    return ref, None if on_policy else dict(held) | working | st.engine_in("old log-probs")


def _update(st: _Step, held: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """The update's peak, the larger of the forward's end and a chunk's backward, and the gradients it holds."""
    shape, P, V, H = st.shape, st.shape.params, st.shape.vocab_size, st.shape.hidden_size
    upd = dict(held) | st.engine_in("update")
    grads: dict[str, float] = {}
    if st.full:
        grads["grads" + (" (shard)" if st.fsdp else "")] = 4 * P / st.s
        if st.bf16 and not st.mixed:  # autocast caches its cast of every weight a matmul reads (not the lookup's)
            upd["autocast bf16 weight casts"] = 2 * (P - (0 if shape.tie_word_embeddings else V * H))
    else:
        grads["LoRA grads"] = 4 * st.P_l * (2 if st.W > 1 else 1)
        if st.bf16:  # the fp32 adapter's casts (a frozen base's are not cached)
            upd["autocast bf16 weight casts"] = 2 * st.P_l
    if st.fsdp:  # + one layer's gradient: fp32, or (mixed) bf16 beside the fp32 copy its reduce-scatter takes
        upd["FSDP units gathered"] = st.units + (2 + 4 if st.mixed else 4) * shape.layer_params
    A, L = activation_per_position(shape, st.a), shape.num_hidden_layers
    if st.cfg.model.gradient_checkpointing:
        upd["activations (checkpointed)"] = st.positions * (L * H * st.a + A)
    else:
        upd["activations"] = st.positions * L * A
    if st.share:
        upd["shared-prompt KV cache"] = _kv_cache(st)
    # the forward's end: the gradients exist only from a minibatch's second micro-batch on
    forward_end = dict(upd) | (grads if _micro_batches(st.cfg, st.W) > 1 else {})
    forward_end["logits (+ entropy), the forward's end"] = st.logit_positions * V * st.forward_bytes
    # a chunk's backward: every gradient (the layers' come after, as the activations go: counted together), the
    # head's fp32 gradient while backward sums it over the chunks (autograd's sum and the next chunk's; the fused
    # head's own accumulator), and the chunk's logits turned into their gradient
    backward = dict(upd) | grads
    backward["logits (+ entropy), backward"] = st.logit_positions * V * st.backward_bytes
    if st.full and not shape.tie_word_embeddings:
        backward["head gradient being summed"] = (4 if st.fused or not st.chunk else 8) * V * H  # whole, FSDP too
    return max(forward_end, backward, key=lambda terms: sum(terms.values())), grads


def _optimizer_step(st: _Step, held: dict[str, float], grads: dict[str, float]) -> dict[str, float]:
    """Every gradient, and AdamW's temporaries as torch runs it by default: on CUDA `_multi_tensor_adam`, whose sqrt
    of every second moment is a copy of them all; elsewhere one tensor at a time, its sqrt and the quotient."""
    shape = st.shape
    opt = dict(held) | st.engine_in("update") | grads
    trained = 4 * shape.params / st.s if st.full else 4 * st.P_l
    largest = (
        4 * shape.vocab_size * shape.hidden_size / st.s
        if st.full
        else 4 * st.cfg.lora.r * max(shape.hidden_size, shape.intermediate_size)
    )
    opt["AdamW temporaries"] = trained if st.cuda else 2 * largest
    return opt


def _sync_and_checkpoint(st: _Step, held: dict[str, float]) -> tuple[dict[str, float] | None, dict[str, float], float]:
    """The weight sync into the engine (None: no full-weight sync), the checkpoint, and the host RAM at the peak."""
    cfg, P, VH = st.cfg, st.shape.params, st.shape.vocab_size * st.shape.hidden_size
    sync_needed = st.engine and (st.full or cfg.rollout.vllm.lora_sync_on("cuda") == "merged")
    sync = None
    host = 0.0
    if sync_needed:
        sync = dict(held) | st.engine_in("weight sync")
        if st.full and st.fsdp and not st.options.streamed_sync:
            sync["full fp32 state gathered"] = 4 * P
        elif st.full:  # one tensor at a time, the largest V x H: gathered in fp32 (FSDP), cast to the engine's dtype
            sync["largest tensor gathered and cast"] = (6 if st.fsdp else 2) * VH
        else:
            sync["merged adapted weights"] = st.b * _adapted_weights(st.shape, cfg.lora.target_modules)
        # host: the engine's staged copy in its dtype, one packed bucket, the hashed tensor's fp32 copy
        host = 2 * P + cfg.rollout.vllm.sync_bucket_mb * 2**20 + 4 * VH
    ckpt = dict(held) | st.engine_in("checkpoint")
    if st.engine and cfg.rollout.vllm.sleep_during_update and not sync_needed:  # level 1: weights in host RAM
        host = max(host, 2 * P / cfg.rollout.vllm.tensor_parallel_size)
    if st.fsdp:
        ckpt["largest tensor gathered"] = 4 * VH
        host = max(host, 12 * P)
    return sync, ckpt, host


def _notes(st: _Step, syncs: bool) -> list[str]:
    cfg = st.cfg
    notes = []
    if summaries_per_step(cfg, st.W)[0] and cfg.summarizer.model != "policy":
        notes.append(f"generate: the summariser {cfg.summarizer.model} is not counted (its weights, its KV cache)")
    if st.mixed:
        notes.append("bf16 compute: FSDP2 mixed precision (units gathered in bf16, gradients reduced in fp32)")
    elif st.full and st.bf16:
        notes.append("bf16 compute: torch.autocast, which caches a bf16 copy of every trained weight it casts")
    if st.fsdp:
        notes.append(
            "generate: FSDP unshards the whole model on every rank (the policy generates itself)"
            if _unshards(st)
            else "generate: no FSDP unshard (the engine generates)"
        )
        if syncs:
            notes.append(
                "weight sync: one tensor gathered at a time"
                if st.options.streamed_sync
                else "weight sync: the full fp32 state gathered on every rank"
            )
    return notes


def _engine_terms(cfg: TrainConfig, params: int, memory: float, phase: str) -> dict[str, float]:
    """The vLLM engine's bytes on its GPU in `phase` (its share f x M when awake), or in "held" what every phase
    holds of it. Awake the whole run, it is all held. Asleep through the update (`sleep_during_update`): its share
    while it generates and from the sync's end (checkpoint); ENGINE_ASLEEP through the log-prob passes and the
    update; in the weight sync its weights (woken first, the KV cache after the load: `ServedPolicy.sync`)."""
    vllm = cfg.rollout.vllm
    f = vllm.memory_fraction or AUTO_MEMORY_FRACTION["cuda"]
    awake = {f"vLLM engine ({f:g} of the GPU)": f * memory}
    if not vllm.sleep_during_update:
        return awake if phase == "held" else {}
    if phase in ("generate", "checkpoint"):
        return awake
    if phase == "weight sync":  # the engine's dtype (auto: bf16 on a GPU), its tensor-parallel share
        weights = (4 if vllm.dtype == "float32" else 2) * params / vllm.tensor_parallel_size
        return {"vLLM engine asleep": ENGINE_ASLEEP, "vLLM weights woken for the sync": weights}
    return {"vLLM engine asleep": ENGINE_ASLEEP} if phase != "held" else {}


def _micro_batches(cfg: TrainConfig, world: int) -> int:
    """Micro-batches a rank runs for one minibatch (rows at the full length)."""
    local = math.ceil(cfg.batch_size * cfg.rollout.n / _minibatches(cfg) / world)
    return math.ceil(local / micro_positions(cfg)[0])


def _minibatches(cfg: TrainConfig) -> int:
    from lanpo.train.consumer.update import minibatches_per_epoch

    return minibatches_per_epoch(cfg.batch_size * cfg.rollout.n, cfg.grpo)


def _adapted_weights(shape: ModelShape, target_modules: list[str]) -> int:
    H, I, q, kv = shape.hidden_size, shape.intermediate_size, shape.q_dim, shape.kv_dim  # noqa: E741
    sizes = {"q_proj": H * q, "k_proj": H * kv, "v_proj": H * kv, "o_proj": q * H}
    sizes |= {"gate_proj": H * I, "up_proj": H * I, "down_proj": I * H}
    return shape.num_hidden_layers * sum(sizes.get(m, 0) for m in target_modules)
