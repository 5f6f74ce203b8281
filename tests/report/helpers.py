"""An experiment written the way the trainer writes it: one row per metric per step, steps 0..STEPS, arms x seeds.

Training metrics come from the trainer's own functions (`record.rollout_metrics` on the step's groups,
`UpdateStats.as_metrics`) plus the names `loop.grpo_step` adds (lr, pool/*, time/*), so a renamed metric shows up
here. Validation (`val/<dataset>/mean@4`, pass@4, format) is written at step 0 and every VAL_EVERY steps with the
values of FINAL and START, which the table tests compute by hand.
"""

from __future__ import annotations

import math

import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.feedback.record import GroupRecord, RolloutRecord, rollout_metrics
from lanpo.train.consumer.update import UpdateStats

STEPS = 4
VAL_EVERY = 2
SEEDS = (0, 1, 2)
DATASETS = ("gsm", "math")
ARMS = {"grpo": ("none", 0.5), "lanpo-both": ("both", 0.5)}  # arm -> (feedback.mode, p_t)
# held-out mean@4 at the last validated step, per (arm, dataset), one value per seed
FINAL = {
    ("grpo", "gsm"): (0.40, 0.50, 0.45),
    ("grpo", "math"): (0.20, 0.30, 0.25),
    ("lanpo-both", "gsm"): (0.50, 0.55, 0.60),
    ("lanpo-both", "math"): (0.30, 0.30, 0.36),
}
START = {"gsm": (0.10, 0.11, 0.12), "math": (0.05, 0.05, 0.05)}  # step 0, the same start for every arm
PHASES = ("context", "generate", "reward", "summarize", "prepare", "ref_logp", "update", "gather", "checkpoint")


def make_experiment(session: Session, name: str = "exp") -> int:
    return int(session.scalar(sa.text("INSERT INTO experiments (name) VALUES (:n) RETURNING id"), {"n": name}))


def make_run(
    session: Session,
    name: str,
    seed: int = 0,
    mode: str = "both",
    p_t: float = 0.5,
    experiment_id: int | None = None,
    arm: str | None = None,
) -> int:
    config = {"seed": seed, "batch_size": 4, "rollout": {"n": 2}, "feedback": {"mode": mode, "p_t": p_t}}
    run_id = runs_repo.create_run(session, name, "train", config).id
    session.execute(
        sa.text("UPDATE runs SET experiment_id = :e, arm = :a WHERE id = :r"),
        {"e": experiment_id, "a": arm, "r": run_id},
    )
    return run_id


def step_groups(step: int, seed: int, mode: str) -> list[GroupRecord]:
    """4 prompts x 2 rollouts; with feedback, prompts 2 and 3 were served intra and inter contexts.

    Rollout j of prompt g has 20 + step + g + seed completion tokens, so a step generates 172 + 8 step + 8 seed
    (`tokens/completion`) and its prompts carry 8 x 10 tokens (`tokens/prompt`)."""
    modes = ["zero_shot"] * 4 if mode == "none" else ["zero_shot", "zero_shot", "intra", "inter"]
    groups = []
    for g, m in enumerate(modes):
        rollouts = []
        for j in range(2):
            correct = (step + seed + g + j) % 3 == 0
            rollouts.append(
                RolloutRecord(
                    "\\boxed{7}" if (step + g + j) % 2 == 0 else f"r{j}",  # answer-only every other rollout
                    float(correct) + 0.1 * (m != "zero_shot"),
                    correct,
                    j == 0,
                    20 + step + g + seed,
                    g == 3,
                )
            )
        groups.append(GroupRecord(g + 1, m, "prompt", 10, [], rollouts))
    return groups


def train_metrics(step: int, seed: int, mode: str) -> dict[str, float]:
    """What `grpo_step` records for one step (values are made up; the names are the trainer's)."""
    update = UpdateStats(0.1 / step, 1e-3 * step, 1.5 - 0.1 * step, 0.5, 0.02 * seed, 0.25, None, 1, 0.4, 1.2)
    metrics = {**update.as_metrics(), "lr": 1e-4 * math.cos(step / 10)}
    metrics.update(rollout_metrics(step_groups(step, seed, mode)))
    feedback = mode != "none"
    metrics |= {"pool/added": 2.0 * feedback, "pool/evicted": float(feedback and step > 2), "pool/active": 2.0 * step}
    metrics |= {f"time/{p}": 0.1 * (i + 1) + 0.01 * seed for i, p in enumerate(PHASES)}
    metrics |= {"time/db_write": 0.05, "time/step": 5.0 + seed, "time/cpu_step": 9.0, "time/pool_share": 0.03}
    # coming in parallel with the report: what was asked for, what was served, why not
    metrics |= {"feedback/asked/intra": 2.0 * feedback, "feedback/asked/inter": 1.0 * feedback}
    metrics |= {"feedback/served/intra": 1.0 * feedback, "feedback/served/inter": 1.0 * feedback}
    metrics |= {"feedback/missed/empty_pool": 1.0 * feedback}
    return metrics


def val_metrics(arm: str, seed_index: int, step: int) -> dict[str, float]:
    """val/<dataset>/mean@4 moving from START to FINAL; pass@4 and boxed alongside."""
    out = {}
    for dataset in DATASETS:
        start, final = START[dataset][seed_index], FINAL[(arm, dataset)][seed_index]
        value = start + (final - start) * step / STEPS
        out |= {f"val/{dataset}/mean@4": value, f"val/{dataset}/pass@4": min(1.0, 2 * value)}
        out[f"val/{dataset}/boxed"] = 0.9
    return out


def write_run(session: Session, run_id: int, arm: str, seed_index: int, mode: str, steps: int = STEPS) -> None:
    """Step 0 (validation only, before any update), then each step's metrics, committed as the trainer does."""
    runs_repo.record_metrics(session, run_id, 0, val_metrics(arm, seed_index, 0))
    for step in range(1, steps + 1):
        metrics = train_metrics(step, SEEDS[seed_index], mode)
        if step % VAL_EVERY == 0:
            metrics |= val_metrics(arm, seed_index, step)
        runs_repo.record_metrics(session, run_id, step, metrics)
        steps_repo.commit_step(session, run_id, step)


def fill_experiment(session: Session, name: str = "exp") -> dict[tuple[str, int], int]:
    """Experiment `name`: ARMS x SEEDS, runs named `<name>-<arm>-s<seed>`; returns (arm, seed) -> run id."""
    experiment_id = make_experiment(session, name)
    ids = {}
    for arm, (mode, p_t) in ARMS.items():
        for index, seed in enumerate(SEEDS):
            run_id = make_run(session, f"{name}-{arm}-s{seed}", seed, mode, p_t, experiment_id, arm)
            write_run(session, run_id, arm, index, mode)
            ids[(arm, seed)] = run_id
    session.commit()
    return ids
