"""Does a longer completion budget let the policy use inter-sample feedback? A probe, not a training run.

Takes the inter-context prompts a training run really served (steps 1-10, as stored in `rollout_groups`) and has
a policy answer each 8 times at two budgets, with the recipe's sampling (temperature 1.0, top-p 1.0); prints
accuracy, boxed rate and how many were cut at the budget. Run from $LANPO_HOME after the learning experiment:

    python docs/learning/feedback_budget.py --run grpo-vs-lanpo-lanpo-both-s0 --adapter <the SFT start adapter>
"""

from __future__ import annotations

import argparse
import time

import sqlalchemy as sa
import torch
from peft import PeftModel

from lanpo.db.connection import connect
from lanpo.models import load_causal_lm, prepare_smollm2
from lanpo.rewards import grade
from lanpo.rollout import SamplingParams
from lanpo.rollout.hf import HFBackend

BOX = "\\boxed{"
SERVED = (
    "SELECT g.prompt, p.answer FROM rollout_groups g JOIN runs r ON r.id = g.run_id "
    "JOIN problems p ON p.id = g.problem_id "
    "WHERE r.name = :run AND g.mode = 'inter' AND g.step BETWEEN 1 AND 10 ORDER BY g.id"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="the training run whose inter prompts to replay")
    parser.add_argument("--adapter", required=True, help="the LoRA adapter folder of the policy that answers")
    parser.add_argument("--budgets", default="64,160", help="completion budgets to compare (tokens)")
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with connect().connect() as conn:
        rows = conn.execute(sa.text(SERVED), {"run": args.run}).all()
    if not rows:
        raise SystemExit(f"error: run {args.run!r} served no inter-context prompt in steps 1-10")
    prompts, answers = [r[0] for r in rows], [r[1] for r in rows]
    model, tokenizer = load_causal_lm(prepare_smollm2(), device="cpu", dtype="float32")
    backend = HFBackend(PeftModel.from_pretrained(model, args.adapter).eval(), tokenizer)
    k = args.samples
    for budget in (int(b) for b in args.budgets.split(",")):
        start = time.time()
        params = SamplingParams(max_new_tokens=budget, temperature=1.0, top_p=1.0, seed=0)
        flat = [c for group in backend.generate(prompts, k, params) for c in group]
        graded = grade([c.text for c in flat], [a for a in answers for _ in range(k)], ["inter"] * len(flat))
        n = len(flat)
        boxed = sum(BOX in c.text for c in flat) / n
        print(
            f"budget {budget}: {len(prompts)} prompts x {k}, accuracy {sum(g.correct for g in graded) / n:.3f}, "
            f"boxed {boxed:.2f}, "
            f"cut {sum(c.finish_reason == 'length' for c in flat) / n:.2f}, "
            f"mean tokens {sum(len(c.token_ids) for c in flat) / n:.1f}, {time.time() - start:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
