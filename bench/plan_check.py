"""Bench: `lanpo plan`'s predicted peaks (lanpo.train.plan) against measured ones, phase by phase, at small shapes.

Each case is a Qwen2-shaped decoder built from its config (transformers' Qwen2ForCausalLM, random weights, no
download) with the real 152,064-token vocabulary (Qwen2.5's; untied head, as Qwen2.5-7B) and a tiny hidden size,
fully fine-tuned over fp32 weights (`lanpo.train.policy.FullPolicy`, AdamW) on one batch of 1-2K-token responses,
alone or (the `fsdp-*` cases) sharded with FSDP2 over 2 gloo ranks, each with its share of the rows (`fsdp-bf16-*`:
in FSDP2 mixed precision, bf16 units and fp32 reduction). Each case runs in a
fresh subprocess (`--case NAME`; a sharded case spawns its ranks there), which measures one phase of lanpo's own
code:

  reference  `FullPolicy.reference_logprobs` (`chunked_logprobs` under no_grad: the reference and old log-probs)
  update     `update_policy` (the reference pass, then forward + backward + AdamW step)

The measure, taken after the model, its reference, the AdamW moments (initialised by one zero-lr step), the batch
and the advantages are in memory: on CUDA (`--device cuda`), torch.cuda.max_memory_allocated above
memory_allocated, after reset_peak_memory_stats at that point; on a CPU the same quantity, the peak of live tensor
bytes the phase allocated, from torch's memory profiler (`live_peak`). `PLAN_CHECK_MEASURE=rss` measures the peak
resident set instead (VmHWM after the phase minus VmRSS when `echo 5 > /proc/self/clear_refs` reset it), which also
counts what the C allocator keeps after a free. A sharded case reports its largest rank's.

The prediction: `make_plan(cfg, shape, ranks, device=...)` for the same recipe at the same shape (the shape read from
the same config), the phase's peak less the terms every phase holds (`Plan.held`: weights, reference, moments,
batch; on CUDA also the context and the engine's reservation, which the measure does not see); for update, the
largest of the reference's, the update's and the optimizer step's (update_policy runs all three). `--device cpu`
plans without the CUDA-only terms (`make_plan(..., device="cpu")`: no context, no engine, the reference resident,
AdamW one tensor at a time); the CPU has no CUDA.

    python bench/plan_check.py                    # every case, CPU (about 3 GiB at most, a few minutes)
    python bench/plan_check.py --case chunked-update
    python bench/plan_check.py --device cuda      # on a GPU (bench/gpu_check.py runs it)

Exit 0 when every case's ratio (predicted / measured) is in the band: at least the worst under-prediction the
verdict of `lanpo plan` allows for (`lanpo.train.plan_verdict.WORST_RATIO`: below it, "fits" would be promised with
too little margin) and at most --over (1.5: a plan that wastes half a GPU). `--small` checks the same band at the
smoke's sizes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lanpo.train.config import TrainConfig
from lanpo.train.plan_verdict import WORST_RATIO

VOCAB = 152_064  # Qwen2.5's vocabulary (its config.json: vocab_size 152064)


@dataclass(frozen=True)
class Case:
    phase: str  # reference | update
    rows: int  # grpo.micro_batch_size
    n: int  # rollouts a prompt (the batch: one prompt x n)
    completion: int  # tokens each response (every row full length)
    chunk: int = 0  # grpo.logprob_chunk_tokens: positions a chunk (0: chunks sized by `mb`)
    mb: int = 0  # grpo.logprob_chunk_mb (0, with chunk 0: the full logits; 256: the default)
    fused: bool = True  # grpo.logprob_fused: the fused head (false: the head's own forward under checkpointing)
    budget_rows: int = 0  # grpo.max_tokens_per_micro_batch = this many full rows (0: off)
    checkpointing: bool = False  # model.gradient_checkpointing
    autocast: str = "off"  # grpo.autocast: "bf16" counts a = 2 (bf16 activations, fp32 logit copies, weight casts)
    world: int = 1  # ranks: > 1 shards the policy with FSDP2 over gloo (each rank its share of the rows; with
    # autocast bf16 in FSDP2 mixed precision: bf16 units, fp32 reduction, no weight casts); the measure is the
    # largest rank's


PROMPT = 64
UNFUSED = {"fused": False}  # chunks of a fixed count through the head's own forward (the code before issue 50)
CASES = {
    "full-reference": Case("reference", rows=1, n=2, completion=2048),
    "full-update": Case("update", rows=1, n=2, completion=1024),
    "chunked-reference": Case("reference", rows=2, n=2, completion=2048, chunk=1024, **UNFUSED),
    "chunked-update": Case("update", rows=2, n=2, completion=2048, chunk=512, **UNFUSED),
    "default-reference": Case("reference", rows=2, n=2, completion=2048, mb=256),
    "default-update": Case("update", rows=2, n=2, completion=2048, mb=256),
    "budget-update": Case("update", rows=4, n=4, completion=1024, chunk=512, budget_rows=2, **UNFUSED),
    "checkpointed-update": Case("update", rows=2, n=2, completion=2048, chunk=512, checkpointing=True, **UNFUSED),
    "bf16-update": Case(
        "update", rows=2, n=2, completion=2048, chunk=512, checkpointing=True, autocast="bf16", **UNFUSED
    ),
    "fsdp-update": Case("update", rows=2, n=4, completion=1024, chunk=512, world=2, **UNFUSED),
    "fsdp-reference": Case("reference", rows=2, n=4, completion=2048, chunk=1024, world=2, **UNFUSED),
    "fsdp-bf16-update": Case("update", rows=2, n=4, completion=1024, chunk=512, world=2, autocast="bf16", **UNFUSED),
}
# On a GPU (bench/gpu_check.py's row "plan vs measured"): the paper recipe's micro-batch as it ships, one row of a
# 8,192-token response under the 11,264-token budget with the default chunks (256 MiB, fused) and bf16 autocast, and
# a budget of 2 rows at 4,096 tokens with chunks of 4,096; each needs several GiB, more than the CPU check's machine
# should hold.
GPU_CASES = {
    "paper-row-update": Case(
        "update", rows=8, n=2, completion=8192, mb=256, budget_rows=1, checkpointing=True, autocast="bf16"
    ),
    "bf16-budget-update": Case(
        "update",
        rows=4,
        n=4,
        completion=4096,
        chunk=4096,
        budget_rows=2,
        checkpointing=True,
        autocast="bf16",
        **UNFUSED,
    ),
}
ALL_CASES = CASES | GPU_CASES
SHAPE = {  # Qwen2.5-7B's config.json with the sizes cut down: the vocabulary, untied head and qkv biases stay
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
    "tie_word_embeddings": False, "max_position_embeddings": 4096, "torch_dtype": "float32",
}  # fmt: skip


def small(case: Case) -> Case:
    """The case at 128-token responses and chunks of at most 64 positions or 64 MiB (the smoke's size)."""
    return replace(case, completion=128, chunk=min(case.chunk, 64), mb=min(case.mb, 64))


def recipe(case: Case) -> TrainConfig:
    cfg = TrainConfig()
    cfg.batch_size, cfg.lora.enabled = 1, False
    cfg.model.gradient_checkpointing = case.checkpointing
    cfg.rollout.backend, cfg.rollout.n = "hf", case.n
    cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens, cfg.rollout.temperature = PROMPT, case.completion, 1.0
    cfg.grpo.micro_batch_size, cfg.grpo.minibatch_size, cfg.grpo.ppo_epochs = case.rows, 0, 1
    cfg.grpo.autocast, cfg.grpo.share_prompts, cfg.grpo.beta = case.autocast, True, 5e-4
    cfg.grpo.logprob_chunk_tokens, cfg.grpo.logprob_chunk_mb, cfg.grpo.logprob_fused = case.chunk, case.mb, case.fused
    cfg.grpo.max_tokens_per_micro_batch = case.budget_rows * (PROMPT + case.completion)
    return cfg


def predicted(case: Case, device: str) -> float:
    """The plan's bytes for the case's phase above what every phase holds."""
    from lanpo.train.plan import make_plan
    from lanpo.train.plan_shapes import shape_from_config

    shape = shape_from_config(SHAPE, "qwen2-tiny-152k", "bench/plan_check.py SHAPE")
    plan = make_plan(recipe(case), shape, case.world, 1000.0, device=device)
    held = sum(plan.held.values())
    own = {p.name: p.peak - held for p in plan.phases}
    if case.phase == "reference":
        return own["reference log-probs"]
    return max(own["reference log-probs"], own["update"], own["optimizer step"])


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def measure(case: Case, device: str, dist: Any = None) -> float:
    """Bytes the phase took above the baseline (this process: run it in a fresh one); `dist` (a joined
    `lanpo.train.plumbing.dist.Dist`): this rank's, the policy sharded and the rows shared."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lanpo.rl.advantages import group_advantages
    from lanpo.train.consumer.update import update_policy
    from lanpo.train.forward.batch import autocast_dtype, build_batch
    from lanpo.train.forward.logprob_settings import LogprobSettings
    from lanpo.train.policy import FullPolicy, enable_checkpointing
    from lanpo.train.state import optimizer_and_schedule

    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("PLAN_CHECK_THREADS", "2")))
    cfg = recipe(case)
    dev = torch.device(device)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE)).to(dev)
    if case.checkpointing:
        enable_checkpointing(model)
    compute = autocast_dtype(case.autocast, dev)  # sharded: FSDP2 mixed precision, as `lanpo train` builds it
    policy = FullPolicy(model, dist=dist, compute=compute)  # FSDP2-sharded when `dist` is joined
    optimizer, scheduler = optimizer_and_schedule(cfg, policy)
    for p in policy.trainable_parameters():  # the AdamW moments exist from the first step on: allocate them now
        p.grad = torch.zeros_like(p)
    lr = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, value in zip(optimizer.param_groups, lr, strict=True):
        g["lr"] = value
    optimizer.zero_grad(set_to_none=True)
    prompt = torch.randint(0, VOCAB, (PROMPT,)).tolist()
    rows = [torch.randint(0, VOCAB, (case.completion,)).tolist() for _ in range(case.n)]
    advantages = group_advantages(torch.tensor([float(i % 2) for i in range(case.n)]), case.n).to(dev)
    mine = list(range(case.n)) if dist is None else dist.share(list(range(case.n)))  # this rank's rows
    batch = build_batch([prompt] * len(mine), [rows[i] for i in mine], 0, dev)
    advantages = advantages[mine]
    gc.collect()
    g = cfg.grpo

    def phase() -> None:
        if case.phase == "reference":
            policy.reference_logprobs(batch, LogprobSettings.from_grpo(g, temperature=1.0, device=dev))
        else:
            update_policy(policy, optimizer, scheduler, batch, advantages, g, seed=0, dist=dist)

    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        phase()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - base)
    if os.environ.get("PLAN_CHECK_MEASURE", "live") == "live":
        return live_peak(phase)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    base = _status("VmRSS")
    phase()
    return float(_status("VmHWM") - base)


def live_peak(phase: Any) -> float:
    """The peak of live tensor bytes that `phase()` allocated above those alive when it began: every allocation and
    free of the CPU allocator that torch's profiler records, summed in order (on a CPU, what
    torch.cuda.max_memory_allocated is on CUDA)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        phase()

    def walk(nodes: Any) -> Any:
        for node in nodes:
            yield node
            yield from walk(node.children)

    tree = prof.profiler.kineto_results.experimental_event_tree()  # type: ignore[union-attr]
    events = sorted((n for n in walk(tree) if n.tag == _EventType.Allocation), key=lambda n: n.start_time_ns)
    live = peak = 0
    for event in events:
        live += event.extra_fields.alloc_size  # negative for a free
        peak = max(peak, live)
    return float(peak)


def _rank(rank: int, case: Case, device: str, folder: str) -> None:
    """One spawned rank of a sharded case: join a gloo group, measure, write this rank's bytes."""
    import torch.distributed as torch_dist

    from lanpo.train.plumbing.dist import Dist

    os.environ["PLAN_CHECK_THREADS"] = "1"  # the ranks share the machine's cores
    torch_dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=case.world)
    try:
        got = measure(case, device, Dist(rank=rank, world=case.world))
        Path(folder, f"rank{rank}.json").write_text(json.dumps(got))
    finally:
        torch_dist.destroy_process_group()


def measure_ranks(case: Case, device: str) -> float:
    """The largest rank's measure of a sharded case (`case.world` spawned ranks)."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="plan-check-") as folder:
        mp.spawn(_rank, args=(case, device, folder), nprocs=case.world)
        return max(json.loads(Path(folder, f"rank{r}.json").read_text()) for r in range(case.world))


def _chunk(case: Case) -> str:
    """The case's chunks as the table prints them: positions or MiB, fused or not; "-" for the full logits."""
    if not (case.chunk or case.mb):
        return "-"
    size = f"{case.chunk}" if case.chunk else f"{case.mb} MiB"
    return f"{size}{' fused' if case.fused else ''}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--case", choices=list(ALL_CASES), action="append", help="cases to run (default: all but the GPU-sized ones)"
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--over", type=float, default=1.5, help="the largest predicted / measured allowed")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--small", action="store_true", help="128-token responses, chunks of at most 64: the smoke's sizes"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # by default every CPU-sized case; sharded ones on the CPU only (gloo cannot reduce-scatter CUDA tensors)
    names = args.case or [n for n, c in CASES.items() if args.device == "cpu" or c.world == 1]
    cases = {name: small(ALL_CASES[name]) if args.small else ALL_CASES[name] for name in names}
    if args.child:  # one case, this process: print the measure
        case = cases[names[0]]
        got = measure(case, args.device) if case.world == 1 else measure_ranks(case, args.device)
        print(json.dumps({"measured": got}))
        return 0
    print(
        f"shape: {SHAPE['num_hidden_layers']} layers, hidden {SHAPE['hidden_size']}, intermediate "
        f"{SHAPE['intermediate_size']}, vocabulary {VOCAB:,} (untied); full fine-tuning, fp32 weights; "
        f"prompt {PROMPT} tokens; device {args.device}; measure: "
        + (
            "max_memory_allocated above the baseline"
            if args.device == "cuda"
            else "peak RSS above the baseline"
            if os.environ.get("PLAN_CHECK_MEASURE") == "rss"
            else "peak live tensor bytes above the baseline (torch's memory profiler)"
        )
    )
    print(
        "| case | phase | ranks | rows x response | chunk | budget | ckpt | autocast | predicted MiB | measured MiB "
        "| ratio |"
    )
    print("| --- | --- | ---: | --- | ---: | ---: | --- | --- | ---: | ---: | ---: |")
    rows, ok = [], True
    for name in names:
        case = cases[name]
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--case",
            name,
            "--device",
            args.device,
            *(["--small"] * args.small),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        measured = json.loads(done.stdout.strip().splitlines()[-1])["measured"]
        plan = predicted(case, args.device)
        ratio = plan / measured
        ok &= WORST_RATIO <= ratio <= args.over
        budget = f"{case.budget_rows} rows" if case.budget_rows else "-"
        print(
            f"| {name} | {case.phase} | {case.world} | {case.rows} x {case.completion} | {_chunk(case)} | "
            f"{budget} | "
            f"{'yes' if case.checkpointing else 'no'} | {case.autocast} | {plan / 2**20:,.0f} | "
            f"{measured / 2**20:,.0f} | {ratio:.2f} |",
            flush=True,
        )
        rows.append({"case": name, "predicted": plan, "measured": measured, "ratio": ratio})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"within {WORST_RATIO:.2f} to {args.over:.2f}: {'yes' if ok else 'NO'}" + (" (--small sizes)" * args.small))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
