"""Every `lanpo plan` figure a reference page quotes (docs/*.md, a recipe's comments), recomputed from the code now.

docs/scaling.md's recipe tables are `recipe_report`'s text, whole (tests/train/test_plan.py). Every other figure is
a `Claim` here: the page, the `lanpo plan` command lines its figures come from (parsed by the click command itself,
then planned by the functions its body calls: load_config or map_verl, model_shape, make_plan), and the page's
words with `{i.fact}` where the i-th plan's figure stands (`{min.fact}`: the least over the claim's plans). The test
finds the words on the page exactly once (runs of whitespace, and the `#` that opens a TOML comment line, read as
one space), reads each figure out of them, and compares it with the plan's as `lanpo plan` prints it: GiB to one
decimal, the phase of the peak, the verdict word, whether the engine sleeps through the update.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from lanpo.cli.plan import command as plan_command
from lanpo.rollout.config import AUTO_MEMORY_FRACTION
from lanpo.train.config import TrainConfig, load_config
from lanpo.train.forward.chunking import Chunking
from lanpo.train.plan import GiB, Options, Plan, make_plan
from lanpo.train.plan_shapes import model_shape
from lanpo.train.plan_tokens import generation_line, step_generation
from lanpo.train.plan_verdict import gib, margin, verdict_word
from lanpo.train.plan_verl import map_verl

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "train" / "configs"
BEFORE = Options(unshard_generating=True, streamed_sync=False)  # the code before the streamed sync (docs/scaling.md)
SEVEN_B = [
    "grpo-baseline", "lanpo-intra", "lanpo-inter", "lanpo-both",
    "grpo-baseline-lora", "lanpo-intra-lora", "lanpo-inter-lora", "lanpo-both-lora",
    "table2/grpo-retrieval", "table2/lanpo-inter-nofilter", "table2/lanpo-inter-raw",
    "table3/lanpo-intra-pt025", "table3/lanpo-intra-pt050",
]  # fmt: skip
PAPER_AND_MEL = [*SEVEN_B, "mel-qwen3-4b", "mel-qwen3-8b", "mel-qwen3-14b"] + [
    f"qwen3-14b/{name}" for name in ("grpo-baseline", "lanpo-intra", "lanpo-inter", "lanpo-both")
]
ENGINE_TABLE = ["grpo-baseline", "grpo-baseline-lora", "mel-qwen3-4b", "mel-qwen3-8b", "mel-qwen3-14b"]


def recipe(name: str, *sets: str, memory: float = 79) -> str:
    """`lanpo plan`'s arguments for a shipped recipe on 8 GPUs, as the pages run it."""
    overrides = "".join(f" --set {s}" for s in sets)
    return f"--config train/configs/{name}.toml --gpus 8 --gpu-memory {memory:g}{overrides}"


AWAKE = "rollout.vllm.sleep_during_update=false"
FP32 = "grpo.autocast=off"
NO_BUDGET = "grpo.max_tokens_per_micro_batch=0"
PER_PROBLEM = "summarizer.max_total_per_step=0"
VERL = "--verl examples/verl/lanpo_paper.yaml --gpu-memory 79"


@dataclass(frozen=True)
class Claim:
    page: str  # relative to the repository's root
    commands: tuple[str, ...]  # `lanpo plan` arguments, one plan each
    words: str  # the page's words, `{i.fact}` or `{min.fact}` where a figure stands
    options: Options = field(default_factory=Options)  # the code the plans count (BEFORE: as the page says)


CLAIMS = [
    Claim(
        "docs/scaling.md",
        (
            recipe("grpo-baseline"),
            recipe("grpo-baseline", FP32),
            recipe("mel-qwen3-14b"),
            recipe("mel-qwen3-14b", FP32),
        ),
        "the plan puts {0.recipe}'s update at {0.update} GiB in bf16 mixed precision and {1.update} in fp32 "
        "(`--set grpo.autocast=off`), with the engine {0.engine} as the recipe ships; {2.recipe}'s at {2.update} "
        "against {3.update}.",
    ),
    Claim(
        "docs/scaling.md",
        (recipe("grpo-baseline"), recipe("grpo-baseline", "grpo.logprob_fused=false")),
        "(at most {0.full logits} positions at {0.vocabulary} tokens; the full path",
    ),
    Claim(
        "docs/scaling.md",
        (recipe("grpo-baseline"), recipe("grpo-baseline", "grpo.logprob_fused=false")),
        "take the head's logits a chunk at a time: {0.chunk budget} MiB / (V x 8) = {0.chunk} positions at "
        "{0.vocabulary} tokens, at 4 x 1,024 positions",
    ),
    Claim(
        "docs/scaling.md",
        (recipe("grpo-baseline"), recipe("grpo-baseline", "grpo.logprob_fused=false")),
        "16 bytes a position (the fp32 logits and the entropy's three), so {1.chunk} positions a chunk at the same",
    ),
    Claim(
        "docs/scaling.md",
        (recipe("grpo-baseline", FP32), recipe("mel-qwen3-14b", FP32)),
        "the whole fp32 model on every rank, {0.generate/FSDP unshard (whole fp32 model)} GiB at 7B, "
        "{1.generate/FSDP unshard (whole fp32 model)} GiB at 14B).",
        BEFORE,
    ),
    Claim(
        "docs/scaling.md",
        (recipe("grpo-baseline", NO_BUDGET), recipe("mel-qwen3-14b", NO_BUDGET)),
        "the update holds 8 rows' activations, {0.update/activations (checkpointed)} GiB a GPU at 7B even under "
        "gradient checkpointing: {0.recipe} would plan {0.peak} GiB in {0.phase}, which {0.verdict} with the engine "
        "{0.engine}, and {1.recipe} {1.peak} GiB in {1.phase}, which {1.verdict}.",
    ),
    Claim(
        "docs/scaling.md",
        tuple(recipe(name) for name in PAPER_AND_MEL),
        "fits 8 x 80 GB as it ships, in bf16 compute with the engine {0.engine} through the update, with at least "
        "{min.spare} of the GPU to spare (the Qwen3-14B ones;",
    ),
    Claim("docs/scaling.md", tuple(recipe(name) for name in SEVEN_B), "the 7B ones at least {min.spare}):"),
    Claim(
        "docs/scaling.md",
        (recipe("grpo-baseline"), recipe("grpo-baseline-lora")),
        "The largest phase is not the update but the {0.phase} (the engine whole again beside one gathered tensor) "
        "or, under LoRA, the {1.phase} phase",
    ),
    Claim(
        "docs/scaling.md",
        (recipe("mel-qwen3-14b", FP32), recipe("mel-qwen3-14b", FP32, memory=139)),
        "({1.generate/FSDP unshard (whole fp32 model)} GiB at 14B; `make_plan(..., options=Options("
        "unshard_generating=True, streamed_sync=False))`), {0.recipe} in fp32 compute (`--set grpo.autocast=off`) "
        "would plan {0.peak} GiB in {0.phase} on {0.gpus} x {0.memory} GiB, which {0.verdict}, and {1.peak} GiB on "
        "{1.gpus} x {1.memory} GiB, {1.verdict}: it fits by less than",
        BEFORE,
    ),
    Claim(
        "docs/scaling.md",
        (recipe("grpo-baseline"),),
        "({0.share} on CUDA: {0.generate/vLLM engine (0.45 of the GPU)} GiB of an 80 GB card)",
    ),
    Claim(
        "docs/scaling.md",
        (recipe("grpo-baseline"),),
        "(2 bytes a weight in bf16: {0.weight sync/vLLM weights woken for the sync} GiB at Qwen2.5-7B)",
    ),
    *(
        Claim(
            "docs/scaling.md",
            (recipe(name), recipe(name, AWAKE)),
            f"| {name} | " + "{0.engine}: {0.peak} GiB in {0.phase}, {0.verdict} "
            "| {1.engine}: {1.peak} GiB in {1.phase}, {1.verdict} |",
        )
        for name in ENGINE_TABLE
    ),
    Claim(
        "docs/scaling.md",
        (recipe("grpo-baseline"),),
        "(at 7B, 4 bytes x {0.parameters} B parameters = 30.5 GB a step against the {0.disk} GB checkpoint "
        "`lanpo plan` prints for {0.recipe};",
    ),
    Claim(
        "docs/verl.md",
        (VERL, f"{VERL} actor_rollout_ref.rollout.free_cache_engine=False"),
        "For the paper's recipe on {0.gpus} GPUs of {0.memory} GiB the plan {0.verdict} with the engine {0.engine} "
        "through the update (the file's `free_cache_engine: True`): its peak is {0.peak} GiB a GPU in {0.phase}, "
        "where the engine holds its whole share ({0.share} of the GPU) again. With the engine {1.engine} through "
        "the update (`actor_rollout_ref.rollout.free_cache_engine=False`), the peak is {1.peak} GiB in {1.phase}, "
        "which {1.verdict}.",
    ),
    Claim(
        "docs/papers.md",
        (recipe("grpo-baseline"),),
        "else one chunk at a time through a fused head + log-softmax that keeps no logits for backward "
        "({0.chunk} positions at {0.vocabulary} tokens)",
    ),
    Claim(
        "docs/papers.md",
        (recipe("lanpo-inter", PER_PROBLEM),),
        "Read per problem, 512 prompts allow {0.summary count} summaries of up to {0.summary max} tokens a step "
        "({0.summary tokens} tokens beside the rollouts' {0.rollout tokens} at most:",
    ),
    Claim(
        "docs/papers.md",
        (recipe("grpo-baseline"),),
        "a full checkpoint of the 7B is fp32 weights and AdamW moments, {0.disk} GB (`lanpo plan`'s disk line)",
    ),
    Claim(
        "docs/papers.md",
        (recipe("lanpo-inter"),),
        "`lanpo plan --config train/configs/lanpo-inter.toml --gpus 8 --gpu-memory 79` ends on `{0.generation}`",
    ),
    Claim(
        "train/configs/grpo-baseline.toml",
        (recipe("grpo-baseline"),),
        "the log-probs' chunks are sized by memory (grpo.logprob_chunk_mb, {0.chunk budget} MiB of logits by "
        "default; lanpo.train.forward.chunking): at Qwen2.5's {0.vocabulary}-token vocabulary a micro-batch of at "
        "most {0.full logits} completion positions takes the full logits, a longer one goes through the fused head "
        "{0.chunk} positions at a time.",
    ),
    Claim(
        "train/configs/grpo-baseline.toml",
        (recipe("lanpo-inter", PER_PROBLEM),),
        "reads it per problem instead: up to 512 x 8 = {0.summary count} summaries of {0.summary max} tokens a step",
    ),
    Claim(
        "train/configs/grpo-baseline.toml",
        (recipe("grpo-baseline"),),
        "the papers state no cadence; {0.disk} GB a checkpoint at 7B,",
    ),
]


# --------------------------------------------------------------------------- the plan's figures


@cache
def planned(args: str, options: Options) -> tuple[TrainConfig, Plan, str]:
    """`lanpo plan ARGS`'s config, plan and recipe (relative to train/configs, no suffix), as the command plans."""
    params = plan_command.make_context("plan", shlex.split(args)).params
    if params["verl_path"] is not None:
        inputs = map_verl(ROOT / params["verl_path"], list(params["verl_overrides"]))
        cfg, gpus, path = load_config(inputs.recipe, inputs.overrides, world=1), inputs.gpus, inputs.recipe
    else:
        path = ROOT / params["config_path"]
        cfg, gpus = load_config(path, list(params["overrides"])), params["gpus"] or 1
    plan = make_plan(cfg, model_shape(params["model"] or cfg.model.name), gpus, params["gpu_memory"], options)
    return cfg, plan, Path(path).resolve().relative_to(CONFIGS).with_suffix("").as_posix()


def facts(args: str, options: Options) -> dict[str, str]:
    """Each figure of `lanpo plan ARGS`, printed as the command prints it."""
    cfg, plan, name = planned(args, options)
    full, chunk = Chunking.of(cfg.grpo).sizes(plan.shape.vocab_size, cfg.grpo.logprob_fused)
    out = {
        "recipe": name,
        "gpus": str(plan.gpus),
        "memory": f"{plan.gpu_memory / GiB:g}",
        "parameters": f"{plan.shape.params / 1e9:.2f}",
        "vocabulary": f"{plan.shape.vocab_size:,}",
        "engine": "asleep" if cfg.rollout.vllm.sleep_during_update else "awake",
        "share": f"{cfg.rollout.vllm.memory_fraction or AUTO_MEMORY_FRACTION['cuda']:g}",  # as the plan reads it
        "peak": gib(plan.peak.peak),
        "phase": plan.peak.name,
        "verdict": verdict_word(plan),
        "spare": f"{margin(plan):.0%}",
        "disk": f"{plan.checkpoint_disk / 1e9:.1f}",
        "chunk budget": str(cfg.grpo.logprob_chunk_mb),
        "full logits": f"{full:,}",
        "chunk": f"{chunk:,}",
        "generation": generation_line(cfg),
    }
    for phase in plan.phases:
        out[phase.name] = gib(phase.peak)
        out |= {f"{phase.name}/{term}": gib(value) for term, value in phase.terms.items()}
    for source in step_generation(cfg):
        out[f"{source.source} count"] = f"{source.count:,}"
        out[f"{source.source} max"] = f"{source.max_tokens:,}"
        out[f"{source.source} tokens"] = f"{source.tokens / 1e6:.1f} M"
    return out


# --------------------------------------------------------------------------- the page's figures

PLACEHOLDER = re.compile(r"\{(\d+|min)\.([^{}]+)\}")
WORDS = {"phase", "verdict", "engine"}  # facts printed as words
SHAPES = {"recipe": r"[\w/.-]+", "generation": r"[^`|]+?"}  # two of their own; every other fact is a number
NUMBER = r"\d[\d,]*(?:\.\d+)?%?(?: [kMB](?!\w))?"


def page_text(page: str) -> str:
    """The page with its whitespace folded to single spaces; a TOML file's comment marks read as whitespace."""
    text = (ROOT / page).read_text(encoding="utf-8")
    if page.endswith(".toml"):
        text = re.sub(r"(?m)^[ \t]*#", " ", text)
    return re.sub(r"\s+", " ", text)


def pattern(words: str) -> tuple[re.Pattern[str], list[tuple[str, str]]]:
    """The regex of a claim's words, one group a figure, and each group's (plan index or "min", fact)."""
    out, fields, at = [], [], 0
    for match in PLACEHOLDER.finditer(words):
        out.append(re.escape(re.sub(r"\s+", " ", words[at : match.start()])))
        fact = match.group(2)
        shape = r"[a-z][a-z -]*?" if fact in WORDS else SHAPES.get(fact, NUMBER)
        out.append(f"({shape})")
        fields.append((match.group(1), fact))
        at = match.end()
    out.append(re.escape(re.sub(r"\s+", " ", words[at:])))
    return re.compile("".join(out)), fields


def _number(printed: str) -> float:
    return float(re.sub(r"[^\d.]", "", printed))


def expected(claim: Claim, index: str, fact: str) -> tuple[str, str]:
    """The plan's figure for a placeholder, and the command it comes from."""
    if index == "min":
        values = [(facts(args, claim.options)[fact], args) for args in claim.commands]
        return min(values, key=lambda value: _number(value[0]))
    args = claim.commands[int(index)]
    return facts(args, claim.options)[fact], args


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: f"{c.page}:{re.sub(r'[^a-z0-9]+', '-', c.words[:40].lower())}")
def test_each_plan_figure_a_page_quotes_is_the_plans(claim: Claim) -> None:
    """The claim's words are on its page once, and each figure in them is the plan's."""
    regex, fields = pattern(claim.words)
    assert fields and not claim.words.startswith("{"), "a claim names a figure, after words of the page"
    found = list(regex.finditer(page_text(claim.page)))
    assert len(found) == 1, (
        f"{claim.page}: these words are there {len(found)} times, not once (reworded? then reword the claim):\n"
        f"  {claim.words}"
    )
    problems = []
    code = "" if claim.options == Options() else f" (counting {claim.options})"
    for (index, fact), said in zip(fields, found[0].groups(), strict=True):
        want, args = expected(claim, index, fact)
        if said != want:
            problems.append(f"  {{{index}.{fact}}}: the page says {said!r}, `lanpo plan {args}`{code} gives {want!r}")
    assert not problems, f"{claim.page}: {found[0].group(0)[:160]!r}\n" + "\n".join(problems)
