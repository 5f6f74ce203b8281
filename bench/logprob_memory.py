"""Benchmark: peak memory of the log-probs with the full logits against the chunked head (`grpo.logprob_chunk_tokens`).

A Qwen2-shaped model built from a config (random weights, the real 152,064-token vocabulary, a tiny hidden size and
2 layers, every weight trained), one micro-batch of `--rows` rows of one `--prompt-tokens` prompt and
`--response-tokens`-token responses. Two phases, each as the trainer runs it:

  update      `micro_batch_loss` (log-prob, entropy, the clipped GRPO loss) and its backward: the policy's micro-step
  reference   `chunked_logprobs` without gradients: the reference and the old log-probs

and two arms: `full` (`grpo.logprob_chunk_mb = 0`, the logits of every position at once) and `chunked`
(`--chunk` positions a time, through the head's own forward under checkpointing; `--fused`: through the fused head,
`lanpo.rl.head_logprobs`); bench/logprob_train.py measures the default settings through `lanpo train`. The
measure: peak resident memory (Linux VmHWM) above the process's resident memory
just before the phase, in a fresh process per (arm, phase, round), the peak reset (`/proc/self/clear_refs` 5)
after the model and the batch are built; with `--device cuda`, torch.cuda.max_memory_allocated above
memory_allocated at the same point (an arm that runs out of the GPU's memory says so). The arms run interleaved,
the order turning every round; medians over the rounds, and the ratio full / chunked. The log-probs of the two arms
are compared too (the largest |difference| on real tokens). Wall seconds are printed beside: the chunked backward
recomputes each chunk's logits.

    python bench/logprob_memory.py                     # 1 row x 1,024-token response, chunk 128, 3 rounds
    python bench/logprob_memory.py --response-tokens 2048 --chunk 256 --rounds 2
    python bench/logprob_memory.py --rows 1 --response-tokens 64 --chunk 16 --rounds 1 --phases update  # smoke
    python bench/logprob_memory.py --device cuda --rows 8 --response-tokens 8192 --chunk 4096 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import rotated

ARMS = ("full", "chunked")
PHASES = ("update", "reference")
VOCAB = 152_064  # Qwen2.5 (config.json "vocab_size")


def _status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", text).group(1)) * 1024  # type: ignore[union-attr]


def child(args: argparse.Namespace) -> None:
    """One (arm, phase): build, reset the peak, run the phase, print its peak above the start as JSON."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lanpo.train.config import GRPOConfig
    from lanpo.train.consumer.update import micro_batch_loss
    from lanpo.train.forward.batch import build_batch
    from lanpo.train.forward.chunking import NO_CHUNKS, Chunking
    from lanpo.train.forward.logprob_settings import LogprobSettings
    from lanpo.train.forward.logprobs import chunked_logprobs

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=args.prompt_tokens + args.response_tokens,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).float().train().to(device)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, VOCAB, (args.prompt_tokens,), generator=g).tolist()
    completions = [torch.randint(3, VOCAB, (args.response_tokens,), generator=g).tolist() for _ in range(args.rows)]
    batch = build_batch([prompt] * args.rows, completions, 0, device)
    chunking = Chunking(tokens=args.chunk, fused=args.fused) if args.arm == "chunked" else NO_CHUNKS
    cfg = GRPOConfig(
        micro_batch_size=args.rows, logprob_chunk_mb=0, logprob_chunk_tokens=chunking.tokens, logprob_fused=args.fused
    )
    advantages = torch.linspace(-1.0, 1.0, args.rows, device=device)
    reference = torch.zeros(batch.completion_ids.shape, device=device)

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
        before = _status("VmRSS")
    started = time.perf_counter()
    try:
        if args.phase == "update":
            loss, _, _ = micro_batch_loss(model, batch, advantages, None, reference, None, cfg)
            loss.backward()
            logp = None
        else:
            logp = chunked_logprobs(model, batch, LogprobSettings(micro_batch_size=args.rows, chunking=chunking))
    except torch.OutOfMemoryError:  # the arm does not fit this device: a result, not a failure
        print(json.dumps({"peak": None, "seconds": time.perf_counter() - started, "logp": None}))
        return
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = (torch.cuda.max_memory_allocated() if cuda else _status("VmHWM")) - before
    if logp is None:  # the update's log-probs, for the comparison (after the measure)
        with torch.no_grad():
            logp = chunked_logprobs(model, batch, LogprobSettings(micro_batch_size=args.rows, chunking=chunking))
    print(json.dumps({"peak": peak, "seconds": seconds, "logp": logp[batch.completion_mask.bool()].cpu().tolist()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1, help="rows of the micro-batch (one shared prompt)")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=128, help="grpo.logprob_chunk_tokens of the chunked arm")
    parser.add_argument("--fused", action="store_true", help="the chunked arm through the fused head")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu: peak RSS; cuda: allocated")
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # a child process
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        child(args)
        return
    if args.rows * args.response_tokens <= args.chunk:
        parser.error(f"--chunk {args.chunk} must be below rows x response tokens, or nothing is chunked")
    shape = f"{args.rows} x {args.response_tokens} positions, vocabulary {VOCAB:,}, hidden {args.hidden}"
    measure = "peak RSS" if args.device == "cpu" else "peak CUDA memory allocated"
    head = "the fused head" if args.fused else "the head's own forward, checkpointed"
    print(
        f"log-prob memory: {shape}, chunk {args.chunk} ({head}); {measure} above the phase's start, fresh process each"
    )
    peaks: dict[tuple[str, str], list[int | None]] = {}
    seconds: dict[tuple[str, str], list[float]] = {}
    logps: dict[tuple[str, str], list[float] | None] = {}
    own = [sys.executable, str(Path(__file__).resolve())]
    common = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("rows", "prompt_tokens", "response_tokens")]
    common += [
        f"--hidden={args.hidden}",
        f"--chunk={args.chunk}",
        f"--threads={args.threads}",
        f"--device={args.device}",
        *(["--fused"] * args.fused),
    ]
    for round_ in range(args.rounds):
        for arm in rotated(ARMS, round_):
            for phase in args.phases:
                out = subprocess.run(
                    [*own, *common, f"--arm={arm}", f"--phase={phase}"], capture_output=True, text=True
                )
                if out.returncode != 0:
                    sys.exit(f"{arm} {phase} exited {out.returncode}:\n{out.stderr[-3000:]}")
                got = json.loads(out.stdout.strip().splitlines()[-1])
                peaks.setdefault((arm, phase), []).append(got["peak"])
                seconds.setdefault((arm, phase), []).append(got["seconds"])
                logps[(arm, phase)] = got["logp"]
    print(
        f"\n| phase | full logits, MiB | chunked, MiB | full / chunked | full s | chunked s | rounds {args.rounds} |"
    )
    print("|---|---|---|---|---|---|---|")
    oom = "out of memory"
    for phase in args.phases:
        full, chunked = (_median_mib(peaks[(arm, phase)]) for arm in ARMS)
        full_s, chunked_s = (statistics.median(seconds[(arm, phase)]) for arm in ARMS)
        a, b = logps[("full", phase)], logps[("chunked", phase)]
        diff = "-" if a is None or b is None else f"{max(abs(x - y) for x, y in zip(a, b, strict=True)):.1e}"
        ratio = f"{full / chunked:.1f}x" if full is not None and chunked is not None else "-"
        print(
            f"| {phase} | {oom if full is None else f'{full:.0f}'} | {oom if chunked is None else f'{chunked:.0f}'} "
            f"| {ratio} | {full_s:.2f} | {chunked_s:.2f} | max abs logp diff {diff} |"
        )
    for phase in args.phases:
        full, chunked = (_median_mib(peaks[(arm, phase)]) for arm in ARMS)
        if chunked is None:
            print(f"target: {phase} peak full / chunked >= 4x -> the chunked arm ran out of memory")
        elif full is None:
            print(f"target: {phase} peak full / chunked >= 4x -> the full arm ran out of memory ({chunked:.0f} MiB)")
        else:
            print(f"target: {phase} peak full / chunked >= 4x -> {full / chunked:.1f}x")


def _median_mib(peaks: list[int | None]) -> float | None:
    """The median peak in MiB, None when any round ran out of memory."""
    return None if any(p is None for p in peaks) else statistics.median(peaks) / 2**20  # type: ignore[type-var]


if __name__ == "__main__":
    main()
