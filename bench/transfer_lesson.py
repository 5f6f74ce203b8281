"""Check: can the policy apply a correct lesson on `hidden_rule`? Zero-shot against a hand-written lesson.

On held-out `hidden_rule` problems (lanpo.data.hidden_rule: the question names a land whose rule for `⊙` it never
states), each problem is answered `--k` times in three ways, through `Answerer.solve`, the path `lanpo infer` takes:

  zero-shot         the actor prompt, the question alone
  right lesson      retrieval mode's prompt (`prompts.inter_messages`) carrying one hand-written lesson that states
                    the problem's own family's rule ("In Zorvia, a ⊙ b = a * b", a worked example on operands
                    outside the task's range, so no held-out answer is given away)
  other lesson      the same prompt carrying the lesson of another family (the next one): a distractor control, as
                    long as the right lesson, whose rule is wrong for this problem

mean@k (the mean over problems of each problem's share of correct samples) with its standard error over problems,
and how many answers carried a `\\boxed{}` at all. The lessons are written here, in the three sections of the
summary template, not retrieved: this isolates whether the model can use a correct lesson from whether the loop
finds and writes one.

    python bench/transfer_lesson.py --adapter $LANPO_HOME/runs/demo/sft/adapter      # SmolLM2 + the demo's SFT
    python bench/transfer_lesson.py --model tiny-random --n 2 --k 1 --max-new-tokens 4  # the smoke test's size
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lanpo.data.generate import generate_problems  # after the offline switch
from lanpo.data.hidden_rule import FAMILIES, SYMBOL, TASK, Family
from lanpo.db.repo.problems import Question
from lanpo.inference.answerer import Answerer
from lanpo.inference.results import UsedExperience

ARMS = ("zero-shot", "right lesson", "other lesson")


def lesson(family: Family) -> str:
    """A correct lesson of `family`, as a summariser would write it: the rule, one example off the task's range."""
    a, b = 12, 10  # operands outside hidden_rule's default range (1..9): the example answers no held-out question
    value = family.apply(a, b)
    return (
        f"## Flow\nSee which land the question names, recall that land's rule for {SYMBOL}, put the two numbers "
        f"into the rule, compute.\n"
        f"## Principles\nIn {family.name}, a {SYMBOL} b = {family.rule}. For example, in {family.name} "
        f"{a} {SYMBOL} {b} = {family.rule.replace('a', str(a)).replace('b', str(b))} = {value}.\n"
        f"## Pitfalls\n{SYMBOL} is not plain addition or multiplication: use {family.name}'s rule exactly."
    )


class HandLessons(Answerer):
    """The answerer with retrieval replaced by a fixed lesson per question (no store, no judge)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lessons: dict[str, str] = {}

    def active_experiences(self) -> int:
        return 1

    def retrieve(self, chunk: Any) -> list[list[UsedExperience]]:
        return [[UsedExperience(0, 0, self.lessons[q.external_id], 0.0, None)] for q in chunk]


def mean_se(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny-random, an HF folder or hub id")
    parser.add_argument("--adapter", default=None, help="a LoRA adapter folder (the SFT warm start), or none")
    parser.add_argument("--n", type=int, default=24, help="held-out problems (families in turn)")
    parser.add_argument("--k", type=int, default=4, help="samples per problem (mean@k)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0, help="the problems' seed and the sampling seed")
    parser.add_argument("--batch-size", type=int, default=8, help="questions generated together")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: every core)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"which prompts, comma-separated: {', '.join(ARMS)}")
    parser.add_argument("--show", type=int, default=0, help="print the first sample of the first N problems per arm")
    args = parser.parse_args()
    arms = [arm for arm in ARMS if arm in args.arms.split(",")]
    if "zero-shot" not in arms or len(arms) != len(args.arms.split(",")):
        parser.error(f"--arms takes zero-shot (always) and any of {', '.join(ARMS[1:])}, got {args.arms!r}")

    import torch

    from lanpo.inference.config import SamplingSettings

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    print("command: python bench/transfer_lesson.py " + shlex.join(sys.argv[1:]))
    records = generate_problems(TASK, args.n, seed=args.seed, split="test")
    questions = [Question(r["id"], r["question"], r["answer"]) for r in records]
    by_name = {f.name: i for i, f in enumerate(FAMILIES)}
    own = {r["id"]: FAMILIES[by_name[r["family"]]] for r in records}
    families = sorted({r["family"] for r in records}, key=by_name.__getitem__)
    sampling = SamplingSettings(args.max_new_tokens, args.temperature, args.top_p, args.seed)
    answerer = HandLessons(args.model, args.adapter, sampling=sampling, batch_size=args.batch_size, notify=print)
    scores: dict[str, list[float]] = {}
    boxed: dict[str, float] = {}
    for arm in arms:
        started = time.perf_counter()
        if arm == "zero-shot":
            solutions = answerer.solve(questions, "zero_shot", args.k)
        else:
            step = 0 if arm == "right lesson" else 1
            answerer.lessons = {
                q.external_id: lesson(FAMILIES[(FAMILIES.index(own[q.external_id]) + step) % len(families)])
                for q in questions
            }
            solutions = answerer.solve(questions, "retrieval", args.k)
        scores[arm] = [statistics.fmean(bool(s.final.correct) for s in sol.samples) for sol in solutions]
        boxed[arm] = statistics.fmean(s.final.answer is not None for sol in solutions for s in sol.samples)
        print(f"{arm}: {time.perf_counter() - started:.0f}s", flush=True)
        for sol in solutions[: args.show]:
            final = sol.samples[0].final
            print(f"--- {arm}, {sol.question.question} (gold {sol.question.answer}, read {final.answer})")
            print(final.response)

    start = f" + {args.adapter}" if args.adapter else ""
    print(f"\n{args.model}{start}: {args.n} held-out {TASK} problems ({len(families)} families), mean@{args.k}")
    print(f"| prompt | mean@{args.k} | SE | boxed | vs zero-shot (paired SE) |\n| --- | ---: | ---: | ---: | ---: |")
    for arm in arms:
        mean, se = mean_se(scores[arm])
        diff, diff_se = mean_se([x - z for x, z in zip(scores[arm], scores["zero-shot"], strict=True)])
        vs = "" if arm == "zero-shot" else f"{diff:+.3f} ({diff_se:.3f})"
        print(f"| {arm} | {mean:.3f} | {se:.3f} | {boxed[arm]:.2f} | {vs} |")
    print("\nper family, mean@k: " + ", ".join(arms))
    for name in families:
        rows = [i for i, q in enumerate(questions) if own[q.external_id].name == name]
        cells = " / ".join(f"{statistics.fmean(scores[arm][i] for i in rows):.2f}" for arm in arms)
        print(f"  {name} ({len(rows)}): {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
