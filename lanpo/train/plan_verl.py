"""`lanpo plan --verl FILE [KEY=VALUE ...]`: a verl config's shapes as the planner's inputs, without importing verl.

The YAML (examples/verl/lanpo_paper.yaml, or a user's own) is read with OmegaConf, Hydra's `key=value` overrides
applied over it (`+key=value` and `++key=value` too), and each key the plan needs is taken from it or, where the file
leaves it out, from verl 0.9.1's default (`VERL_DEFAULTS`, the values of verl's `_generated_ppo_trainer.yaml`). The
lanpo recipe it names (`lanpo.config`, with `lanpo.overrides`) gives what verl has no key for (the summariser, the
log-prob chunking); the verl keys then override the recipe's, since verl's trainer is what runs.

What the plan is: lanpo's trainer's memory model (`lanpo.train.plan`) for the same shapes (model, group size,
batch, lengths, micro-batches, LoRA or full, dtype, GPUs, the engine's share), not verl's. verl's FSDP wraps,
shards and offloads on its own terms (`param_offload`, `optimizer_offload`, `fsdp_size`, Ulysses sequence
parallelism), packs sequences without padding (`use_remove_padding`) and sizes dynamic micro-batches by real
tokens; lanpo counts padded rows at the full length. Keys like these, which change verl's memory and have no
counterpart in lanpo's trainer, are listed as not mapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lanpo.errors import InputError

ROLLOUT = "actor_rollout_ref.rollout"
ACTOR = "actor_rollout_ref.actor"
MODEL = "actor_rollout_ref.model"
# verl 0.9.1's defaults (verl/trainer/config/_generated_ppo_trainer.yaml) of every key the mapping reads.
VERL_DEFAULTS: dict[str, Any] = {
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.total_training_steps": None,  # None: total_epochs x the dataloader's batches
    f"{MODEL}.path": "~/models/deepseek-llm-7b-chat",
    f"{MODEL}.lora_rank": 0,
    f"{MODEL}.lora_alpha": 16,
    f"{MODEL}.target_modules": "all-linear",
    f"{MODEL}.enable_gradient_checkpointing": True,
    f"{ACTOR}.fsdp_config.model_dtype": "fp32",
    f"{ACTOR}.fsdp_config.dtype": "bfloat16",
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    f"{ROLLOUT}.n": 1,
    f"{ACTOR}.ppo_mini_batch_size": 256,
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": None,
    f"{ACTOR}.use_dynamic_bsz": False,
    f"{ACTOR}.ppo_max_token_len_per_gpu": 16384,
    f"{ACTOR}.ppo_epochs": 1,
    f"{ROLLOUT}.name": None,  # `???` in verl: it has no default, main_ppo refuses to start without one
    f"{ROLLOUT}.temperature": 1.0,
    f"{ROLLOUT}.gpu_memory_utilization": 0.5,
    f"{ROLLOUT}.free_cache_engine": True,
    f"{ROLLOUT}.tensor_model_parallel_size": 2,
}
# Keys that decide nothing the plan counts (the loss, the optimizer, the data's files, validation, logging, lanpo's
# own block): read by verl's trainer, not by the plan, and not reported as unmapped.
NOT_MEMORY = (
    "algorithm.",
    "data.train_files",
    "data.val_files",
    "data.prompt_key",
    "data.shuffle",
    f"{ACTOR}.optim.",
    f"{ACTOR}.clip_ratio",
    f"{ACTOR}.use_kl_loss",
    f"{ACTOR}.kl_loss",
    f"{ACTOR}.loss_agg_mode",
    f"{ACTOR}.entropy_coeff",
    f"{ACTOR}.grad_clip",
    f"{ACTOR}.strategy",  # fsdp or fsdp2: lanpo's full fine-tuning is FSDP-sharded too (megatron is refused)
    f"{ROLLOUT}.top_p",
    f"{ROLLOUT}.val_kwargs.",
    f"{ROLLOUT}.agent.",
    "trainer.",
    "lanpo.",
)
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Mapped:
    """One line of the mapping: verl's key and value -> the planner's key and value."""

    verl_key: str
    verl_value: Any
    lanpo_key: str
    lanpo_value: Any
    default: bool  # the value is verl's default: the file does not set it


@dataclass
class VerlInputs:
    recipe: Path  # lanpo.config, resolved
    lanpo_overrides: list[str]  # lanpo.overrides
    gpus: int
    mapped: list[Mapped] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)  # set by the file, changes verl's memory, no lanpo counterpart

    @property
    def overrides(self) -> list[str]:
        """`a.b=value` on the lanpo recipe: lanpo.overrides, then the verl keys' values (verl's trainer runs)."""
        mapped = [f"{m.lanpo_key}={_toml(m.lanpo_value)}" for m in self.mapped if not m.lanpo_key.startswith("--")]
        return [*self.lanpo_overrides, *mapped]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def read_verl(path: Path, overrides: list[str]) -> tuple[dict[str, Any], set[str]]:
    """The verl config at `path` with Hydra-style overrides applied, resolved, as a plain mapping; and the dotted
    keys the file and the overrides set (the rest are verl's defaults)."""
    OmegaConf, OmegaConfBaseException = _omegaconf()
    try:
        own = OmegaConf.load(path)
        for key in ("defaults", "hydra"):
            own.pop(key, None)
        for text in overrides:
            if text.startswith("~") or "=" not in text:
                raise InputError(
                    f"override {text!r} must look like key=value", hint="e.g. actor_rollout_ref.rollout.n=8"
                )
        given = OmegaConf.merge(own, OmegaConf.from_dotlist([text.lstrip("+") for text in overrides]))
        defaults = OmegaConf.from_dotlist([f"{k}={_yaml(v)}" for k, v in VERL_DEFAULTS.items()])
        merged = OmegaConf.to_container(OmegaConf.merge(defaults, given), resolve=True)
        set_keys = set(_leaves(OmegaConf.to_container(given, resolve=False)))
    except OmegaConfBaseException as exc:
        raise InputError(f"{path}: {exc}".splitlines()[0], hint="check the YAML and the overrides") from exc
    if not isinstance(merged, dict):
        raise InputError(f"{path} is not a verl config (a YAML mapping)", hint="see examples/verl/lanpo_paper.yaml")
    return merged, set_keys


def _omegaconf() -> tuple[Any, type[Exception]]:
    """OmegaConf and its base exception; InputError when it is missing, or when it is a version below 2.4 beside an
    antlr4 runtime other than 4.9 (math-verify's 4.13: such an omegaconf cannot load its own grammar)."""
    try:
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException
    except ImportError as exc:
        raise InputError(
            "lanpo plan --verl reads the YAML with OmegaConf, which is not installed",
            hint="pip install 'lanpo[verl]' (or pip install omegaconf)",
        ) from exc
    except Exception as exc:
        if "deserialize ATN" not in str(exc):
            raise
        raise InputError(
            f"omegaconf cannot load its grammar with this antlr4 runtime: {exc}",
            hint="pip install 'omegaconf>=2.4' (it vendors its own antlr), or antlr4-python3-runtime==4.9.*",
        ) from exc
    return OmegaConf, OmegaConfBaseException


def _yaml(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    return [prefix[:-1]]


def _get(cfg: dict[str, Any], key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _int(cfg: dict[str, Any], key: str) -> int:
    """`key` as a whole number; InputError naming it otherwise (a string, a float, a list)."""
    value = _get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{key} must be a whole number, got {value!r}", hint=f"set {key}=N")
    return value


def map_verl(path: Path, overrides: list[str]) -> VerlInputs:
    """The planner's inputs from the verl config at `path` (see the module docstring)."""
    cfg, set_keys = read_verl(path, overrides)
    recipe = _recipe(path, _get(cfg, "lanpo.config"))
    lanpo_overrides = _get(cfg, "lanpo.overrides") or []
    if not isinstance(lanpo_overrides, list) or not all(isinstance(o, str) for o in lanpo_overrides):
        raise InputError("lanpo.overrides must be a list of a.b=value strings", hint='e.g. ["feedback.p_t=0.75"]')
    nodes, per_node = _int(cfg, "trainer.nnodes"), _int(cfg, "trainer.n_gpus_per_node")
    out = VerlInputs(recipe, list(lanpo_overrides), nodes * per_node)

    def add(verl_key: str, lanpo_key: str, lanpo_value: Any = None, verl_value: Any = None) -> None:
        value = _get(cfg, verl_key) if verl_value is None else verl_value
        default = not any(k in set_keys for k in verl_key.split(" x "))
        out.mapped.append(Mapped(verl_key, value, lanpo_key, value if lanpo_value is None else lanpo_value, default))

    add("trainer.nnodes x trainer.n_gpus_per_node", "--gpus", out.gpus, f"{nodes} x {per_node}")
    add(f"{MODEL}.path", "model.name", str(Path(str(_get(cfg, f"{MODEL}.path"))).expanduser()))
    rank = _int(cfg, f"{MODEL}.lora_rank")
    add(f"{MODEL}.lora_rank", "lora.enabled", rank > 0)
    if rank > 0:
        modules = _get(cfg, f"{MODEL}.target_modules")
        add(f"{MODEL}.lora_rank", "lora.r", rank)
        add(f"{MODEL}.lora_alpha", "lora.alpha")
        add(f"{MODEL}.target_modules", "lora.target_modules", ALL_LINEAR if modules == "all-linear" else modules)
        add(f"{MODEL}.lora_rank", "rollout.vllm.max_lora_rank", max(16, 1 << (rank - 1).bit_length()))
    add(f"{MODEL}.enable_gradient_checkpointing", "model.gradient_checkpointing")
    master = str(_get(cfg, f"{ACTOR}.fsdp_config.model_dtype"))
    add(f"{ACTOR}.fsdp_config.model_dtype", "model.dtype", "float32" if master in ("fp32", "float32") else "bfloat16")
    compute = str(_get(cfg, f"{ACTOR}.fsdp_config.dtype"))
    add(f"{ACTOR}.fsdp_config.dtype", "grpo.autocast", "bf16" if compute in ("bfloat16", "bf16") else "off")
    add("data.train_batch_size", "batch_size")
    add("data.max_prompt_length", "rollout.max_prompt_tokens")
    add("data.max_response_length", "rollout.max_new_tokens")
    add("data.max_response_length", "rollout.feedback_max_new_tokens", 0)  # one response limit in verl: 0 = the same
    n = _int(cfg, f"{ROLLOUT}.n")
    add(f"{ROLLOUT}.n", "rollout.n")
    add(f"{ACTOR}.ppo_mini_batch_size", "grpo.minibatch_size", _int(cfg, f"{ACTOR}.ppo_mini_batch_size") * n)
    add(f"{ACTOR}.ppo_epochs", "grpo.ppo_epochs")
    if _get(cfg, "trainer.total_training_steps") is not None:  # else verl counts total_epochs over the data
        _int(cfg, "trainer.total_training_steps")
        add("trainer.total_training_steps", "steps")
    _micro_batches(cfg, add)
    _engine(cfg, add)
    mapped = {part for m in out.mapped for part in m.verl_key.split(" x ")}
    mapped |= {f"{ACTOR}.ppo_max_token_len_per_gpu", f"{ACTOR}.ppo_micro_batch_size_per_gpu"}
    out.unmapped = sorted(k for k in set_keys if k not in mapped and not k.startswith(NOT_MEMORY))
    return out


def _micro_batches(cfg: dict[str, Any], add: Any) -> None:
    """verl's micro-batches: by tokens (use_dynamic_bsz: lanpo's token budget, as many full-length rows as fit) or
    by rows a GPU."""
    row = _int(cfg, "data.max_prompt_length") + _int(cfg, "data.max_response_length")
    if _get(cfg, f"{ACTOR}.use_dynamic_bsz"):
        budget = _int(cfg, f"{ACTOR}.ppo_max_token_len_per_gpu")
        add(f"{ACTOR}.use_dynamic_bsz", "grpo.micro_batch_size", max(1, budget // row))
        add(f"{ACTOR}.ppo_max_token_len_per_gpu", "grpo.max_tokens_per_micro_batch")
        return
    rows = _get(cfg, f"{ACTOR}.ppo_micro_batch_size_per_gpu")
    if rows is None:
        raise InputError(
            f"{ACTOR}.ppo_micro_batch_size_per_gpu is not set and use_dynamic_bsz is off: verl needs one of them",
            hint=f"set {ACTOR}.ppo_micro_batch_size_per_gpu=N, or {ACTOR}.use_dynamic_bsz=true",
        )
    add(f"{ACTOR}.ppo_micro_batch_size_per_gpu", "grpo.micro_batch_size")
    add(f"{ACTOR}.use_dynamic_bsz", "grpo.max_tokens_per_micro_batch", 0)


def _engine(cfg: dict[str, Any], add: Any) -> None:
    """verl's rollout engine as lanpo's: vLLM (SGLang and TensorRT-LLM counted as vLLM: a server beside the policy
    with its share of the GPU), or the policy generating itself (hf)."""
    name = _get(cfg, f"{ROLLOUT}.name")
    if name is None:
        raise InputError(f"{ROLLOUT}.name is not set: verl has no default", hint=f"set {ROLLOUT}.name=vllm")
    add(f"{ROLLOUT}.name", "rollout.backend", "hf" if name == "hf" else "vllm")
    add(f"{ROLLOUT}.temperature", "rollout.temperature")
    if name != "hf":
        add(f"{ROLLOUT}.gpu_memory_utilization", "rollout.vllm.memory_fraction")
        add(f"{ROLLOUT}.free_cache_engine", "rollout.vllm.sleep_during_update")
        add(f"{ROLLOUT}.tensor_model_parallel_size", "rollout.vllm.tensor_parallel_size")


def _recipe(path: Path, named: Any) -> Path:
    """lanpo.config as a file: as written (from where the command runs), else from each folder above the YAML (a
    repository's examples/verl/ names train/configs/... from the repository's root, where main_ppo starts)."""
    if not named:
        raise InputError(
            f"{path} has no lanpo.config: the lanpo recipe whose feedback, summaries and store settings the run uses",
            hint="add `lanpo: {config: train/configs/lanpo-both.toml}`, or pass +lanpo.config=FILE",
        )
    recipe = Path(str(named)).expanduser()
    if recipe.is_file() or recipe.is_absolute():
        return recipe
    for folder in path.resolve().parents:
        if (folder / recipe).is_file():
            return folder / recipe
    return recipe  # read_toml says it does not exist
