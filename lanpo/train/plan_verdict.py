"""`lanpo plan`'s verdict on a memory plan (`lanpo.train.plan`), the change that makes a recipe fit, the printed
table, and the refusal `lanpo plan` and `lanpo train` share.

A plan is arithmetic checked against measured peaks (bench/plan_check.py, docs/scaling.md "Planning memory"): on the
cases measured, the predicted peak was at worst `WORST_RATIO` of the measured one. A plan can therefore under-count
by that much, and the verdict says so:

    fits          peak <= WORST_RATIO x M   the GPU holds even the worst measured under-count
    tight         peak <= M                 it fits on paper, by less than the plan's own error (exit 0, with
                                            the key that makes it fit with margin)
    does not fit  peak >  M                 refused: exit 2, one `error:` line and the key to change

M is the memory of one GPU as torch reports it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any

from lanpo.errors import InputError
from lanpo.rollout.config import AUTO_MEMORY_FRACTION
from lanpo.train.config import TrainConfig
from lanpo.train.plan import GiB, Options, Plan, make_plan, micro_positions
from lanpo.train.plan_shapes import ModelShape

log = logging.getLogger(__name__)

# The lowest predicted / measured peak of the cases bench/plan_check.py measured, on a CPU and on an H200 (the
# tables in docs/scaling.md; tests/train/test_plan_verdict.py holds this value to them).
WORST_RATIO = 0.94


def margin(plan: Plan) -> float:
    """The share of a GPU the plan's peak leaves free (negative: over)."""
    return 1.0 - plan.peak.peak / plan.gpu_memory


def needed_margin() -> float:
    """The share of a GPU a plan must leave free to hold even its worst measured under-count."""
    return 1.0 - WORST_RATIO


def is_safe(plan: Plan) -> bool:
    """Fits with the plan's own error to spare."""
    return plan.peak.peak <= WORST_RATIO * plan.gpu_memory


def verdict_word(plan: Plan) -> str:
    """fits | tight | does not fit."""
    return "fits" if is_safe(plan) else "tight" if plan.fits else "does not fit"


def verdict(plan: Plan) -> str:
    """`fits (peak 60.1 GiB in update, of 79 GiB: 24% to spare, 7% needed for the plan's measured error)`, or
    `tight (...)`, or `does not fit (...)`."""
    peak = plan.peak
    spare = f"{margin(plan):.0%} to spare" if plan.fits else f"{-margin(plan):.0%} over"
    return (
        f"{verdict_word(plan)} (peak {gib(peak.peak)} GiB in {peak.name}, of {plan.gpu_memory / GiB:g} GiB: "
        f"{spare}, {needed_margin():.0%} needed for the plan's measured error)"
    )


# --------------------------------------------------------------------------- what to change


def _candidates(cfg: TrainConfig, gpus: int) -> list[tuple[str, TrainConfig, int]]:
    """Changes that trade time or quality for memory, the cheapest first: (the key = value, the changed config,
    gpus). The engine asleep through the update first (the same run, a sleep and a wake a step: seconds), then
    smaller micro-batches (memory only: the same loss), a smaller vLLM reservation, more GPUs, LoRA instead of every
    weight."""
    out: list[tuple[str, TrainConfig, int]] = []
    if cfg.rollout.backend == "vllm" and not cfg.rollout.vllm.sleep_during_update:
        vllm = replace(cfg.rollout.vllm, sleep_during_update=True)
        out.append(("rollout.vllm.sleep_during_update = true", _with(cfg, "rollout", vllm=vllm), gpus))
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
    cfg: TrainConfig, shape: ModelShape, gpus: int, gpu_memory_gib: float, options: Options | None = None
) -> tuple[str, Plan] | None:
    """The first change in `_candidates`' order that makes `cfg` fit with the plan's error to spare (`is_safe`),
    and its plan; None when none does. Gradient checkpointing comes first when it is off, and stays on under every
    later change (memory only, and every long-sequence recipe needs it)."""
    options = options or Options()
    if cfg.model.gradient_checkpointing:
        base, first = cfg, []
    else:
        base, first = _with(cfg, "model", gradient_checkpointing=True), ["model.gradient_checkpointing = true"]
        plan = make_plan(base, shape, gpus, gpu_memory_gib, options)
        if is_safe(plan):
            return first[0], plan
    for label, changed, more in _candidates(base, gpus):
        plan = make_plan(changed, shape, more, gpu_memory_gib, options)
        if is_safe(plan):
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


def _change_hint(cfg: TrainConfig, shape: ModelShape, gpus: int, gpu_memory_gib: float) -> str:
    found = suggestion(cfg, shape, gpus, gpu_memory_gib)
    if found is None:
        return "no single change fits it: a smaller model.name, or larger GPUs; `lanpo plan` prints every phase"
    change, fixed = found
    return f"set {change} (peak {gib(fixed.peak.peak)} GiB); `lanpo plan` prints every phase"


def tight_hint(cfg: TrainConfig, shape: ModelShape, gpus: int, gpu_memory_gib: float, plan: Plan) -> str | None:
    """For a tight plan, what `lanpo plan` prints after its verdict: the key that makes it fit with margin."""
    if is_safe(plan) or not plan.fits:
        return None
    return (
        f"{margin(plan):.0%} to spare is less than the {needed_margin():.0%} the plan can under-count by: "
        + _change_hint(cfg, shape, gpus, gpu_memory_gib)
    )


def check_fits(
    cfg: TrainConfig,
    shape: ModelShape,
    gpus: int,
    gpu_memory_gib: float,
    plan: Plan | None = None,
    warn: bool = True,
) -> Plan:
    """`plan` (made when None); InputError when its peak exceeds the GPU, the hint naming the key to change. A tight
    plan is returned, after a warning naming the key (`warn`; `lanpo plan` prints `tight_hint` instead)."""
    plan = plan or make_plan(cfg, shape, gpus, gpu_memory_gib)
    if plan.fits:
        hint = tight_hint(cfg, shape, gpus, gpu_memory_gib, plan) if warn else None  # `lanpo plan` printed it
        if hint:
            log.warning("%s on %d x %g GiB is tight: %s", shape.name, gpus, gpu_memory_gib, hint)
        return plan
    peak = plan.peak
    top = max(peak.terms, key=lambda k: peak.terms[k])
    message = (
        f"{shape.name} on {gpus} x {gpu_memory_gib:g} GiB does not fit: {peak.name} peaks at {gib(peak.peak)} GiB "
        f"a GPU (the largest part: {top}, {gib(peak.terms[top])} GiB)"
    )
    raise InputError(message, hint=_change_hint(cfg, shape, gpus, gpu_memory_gib))


def check_training(cfg: TrainConfig, device: Any) -> Plan | None:
    """`lanpo train`'s check before loading: on CUDA (and `memory_check` on), `check_fits` on this machine's GPUs
    (WORLD_SIZE ranks of the device's memory). None where it does not run: another device, the check off, or no
    shape for the model on this machine (a hub id not yet downloaded: logged, then loading goes on)."""
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
