"""A lesson's life in a short run (docs/concepts.md, "Lessons that live"): three steps of a scripted policy on two
chain-sum problems through the store API, with a pool that merges near-duplicates (store.merge_threshold = 0.9).

    python examples/api/lesson_life.py

Step 1 solves problem A and its lesson enters the pool. Step 2 answers problem B twice, once with A's lesson in the
prompt (inter) and once zero-shot, the lesson's first use and its baseline; A is solved again, and its new lesson,
the same advice in other words, becomes version 2 of the first. Step 3 uses version 2 the same way. Then
`lanpo pool history` prints the chain and each version's uses. Every row is written by the path a trainer's rows
take (`StoreClient.prompts`, `grade`, `record`: the merge, its embeddings, the usefulness counts); only the policy is
scripted, so that what the store does with its answers can be judged: a 135M model's own lessons of one problem lie
far apart (docs/concepts.md), and a random one's are noise.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys

import sqlalchemy as sa

from lanpo.config import StoreConfig
from lanpo.errors import LanpoError
from lanpo.feedback import DataConfig, FeedbackConfig, InterConfig, StoreClient, StoreRunConfig, SummarizerConfig
from lanpo.feedback.summarize import check_summary
from lanpo.models import load_causal_lm
from lanpo.rollout import Completion

LESSON = """## Flow
Read the numbers from left to right and keep a running total.
## Principles
Add each new term to the total before moving on; carry tens into the next column.
## Pitfalls
Do not drop a term that follows a minus sign; check the total once at the end."""
PARAPHRASE = """## Flow
Go through the numbers left to right, keeping a running total.
## Principles
Before moving on, add every new term to the total and carry the tens to the next column.
## Pitfalls
Never skip a term after a minus sign; check the total again at the end."""

# per step: the problems asked (A = 0, B = 1), their modes, and per group which of its two rollouts are right
SCRIPT = {
    1: ([0, 1], ["zero_shot", "zero_shot"], [(True, True), (False, False)]),
    2: ([1, 1, 0], ["inter", "zero_shot", "zero_shot"], [(True, True), (False, False), (True, False)]),
    3: ([1, 1], ["inter", "zero_shot"], [(True, False), (True, False)]),
}
LESSON_OF_STEP = {1: LESSON, 2: PARAPHRASE}  # the lesson the summariser writes of A's first right rollout


def rollout(tokenizer, prompt: str, right: bool, answer: str) -> Completion:  # type: ignore[no-untyped-def]
    """The scripted policy's response, tokenised as an engine returns it."""
    text = f"Adding from left to right gives \\boxed{{{answer if right else int(answer) + 1}}}."
    ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
    return Completion(text, ids, tuple(tokenizer(prompt, add_special_tokens=False)["input_ids"]), "stop")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-name", default="lesson-life", help="the run's name (unique in the store)")
    args = parser.parse_args(argv)
    config = StoreRunConfig(
        run_name=args.run_name,
        data=DataConfig(dataset="lesson-life", task="chain_sum", n=2, task_options={"min_terms": 2, "max_terms": 2}),
        feedback=FeedbackConfig(mode="inter", p_t=1.0, k=1, candidates=4, inter=InterConfig(gamma=0.0)),
        summarizer=SummarizerConfig(max_new_per_step=1),
        store=StoreConfig(merge_threshold=0.9),
    )
    try:
        client = StoreClient(config)
        _, tokenizer = load_causal_lm("tiny-random")  # only its tokenizer: the prompts are counted in its tokens
        run = client.start("scripted")
        problems = client.problem_ids[:2]
        for step, (which, modes, rights) in SCRIPT.items():
            policy = hashlib.sha256(f"scripted policy, step {step}".encode()).hexdigest()  # its weights' hash
            prompts = client.prompts(run, step, [problems[i] for i in which], tokenizer, policy, asked=modes)
            groups = [
                [rollout(tokenizer, text, right, answer) for right in pair]
                for text, answer, pair in zip(prompts.texts, prompts.answers, rights, strict=True)
            ]
            graded = client.grade(prompts, groups)
            lessons = {}
            if step in LESSON_OF_STEP:  # A's first right rollout: the summariser's lesson, under its admission check
                index = 2 * which.index(0)
                lessons[index] = check_summary(LESSON_OF_STEP[step], True, prompts.questions[index // 2])
            written = client.record(run, step, prompts, groups, graded, lessons)
            print(f"step {step}: modes {prompts.modes}; {written.added} lesson(s) added, {written.merged} merged")
        client.finish(run)
    except LanpoError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        return 2
    with client.db.connect() as conn:
        (lesson,) = conn.execute(
            sa.text("SELECT e.id FROM experiences e JOIN runs r ON r.pool_id = e.pool_id WHERE r.name = :run"),
            {"run": args.run_name},
        ).one()
    print(f"\n$ lanpo pool history {lesson}", flush=True)
    return subprocess.run([sys.executable, "-m", "lanpo", "pool", "history", str(lesson)]).returncode


if __name__ == "__main__":
    sys.exit(main())
