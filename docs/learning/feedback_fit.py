"""Dropping vs truncating feedback items at the paper's lengths: how many intra prompts keep k items, fewer, none.

Builds the intra prompts of a run's second step as the trainer builds them: `--problems` chain_sum questions get
`--n` zero-shot rollouts each (recipe sampling: temperature 1.0, top-p 1.0) from the large-vocabulary tiny random
model (`lanpo.models.tiny_causal_lm(large_vocab=True)`: ~32k single-character tokens, so it writes to its
`--max-new-tokens` limit as long real rollouts do); then each problem's intra prompt draws k of its attempts (a
seeded uniform draw: with one step of history the store's recency ranks tie) and is fitted to `--cap` tokens twice,
by the old loop (drop the last item until the prompt fits, nothing cut) and by
`lanpo.feedback.contexts.fit_prompt`
(every item kept, cut to a water-filled share). Prints, per fitter, prompts served with all k items / fewer / none
(zero-shot, `feedback/missed/too_long`), prompts with a cut item, and the mean prompt length. No database needed:

    python docs/learning/feedback_fit.py                          # paper: cap 3,072, k = 2, ~1,500-token attempts
    python docs/learning/feedback_fit.py --max-new-tokens 4000    # longer attempts: one alone overflows the cap
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from typing import Any

import torch

from lanpo import prompts
from lanpo.data.generate import generate_problems
from lanpo.db.repo.contexts import IntraItem
from lanpo.feedback.contexts import fit_prompt
from lanpo.models import apply_chat, tiny_causal_lm
from lanpo.rollout import SamplingParams
from lanpo.rollout.hf import HFBackend


def count(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def dropping(tokenizer: Any, question: str, found: list[Any], cap: int) -> tuple[str, list[Any], int]:
    """The old `fit_prompt`: drop items, last drawn first, until the prompt fits; nothing is ever cut."""
    while True:
        text = apply_chat(tokenizer, prompts.build_messages("intra", question, found))
        if not found or count(tokenizer, text) <= cap:
            return text, found, 0
        found = found[:-1]


def truncating(tokenizer: Any, question: str, found: list[Any], cap: int) -> tuple[str, list[Any], int]:
    """`fit_prompt`: every item kept, cut to a water-filled share of the budget around the omission marker."""
    fit = fit_prompt(tokenizer, "intra", question, found, cap)
    return fit.text, fit.items, fit.truncated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=16, help="intra prompts (one per problem)")
    parser.add_argument("--n", type=int, default=4, help="zero-shot rollouts per problem in step 1 (the history)")
    parser.add_argument("--k", type=int, default=2, help="items per intra prompt (feedback.k)")
    parser.add_argument("--cap", type=int, default=3072, help="rollout.max_prompt_tokens (paper: 3,072)")
    parser.add_argument("--max-new-tokens", type=int, default=1500, help="attempt length limit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.time()
    model, tokenizer = tiny_causal_lm(seed=args.seed, large_vocab=True, max_positions=args.cap + args.max_new_tokens)
    questions = [p["question"] for p in generate_problems("chain_sum", n=args.problems, seed=args.seed)]
    zero_shot = [fit_prompt(tokenizer, "zero_shot", q, [], args.cap).text for q in questions]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, seed=args.seed)
    history = HFBackend(model.eval(), tokenizer).generate(zero_shot, args.n, params)
    lengths = [len(c.token_ids) for group in history for c in group]
    print(
        f"{args.problems} problems x {args.n} attempts of {min(lengths)}-{max(lengths)} tokens "
        f"(mean {sum(lengths) / len(lengths):.0f}, limit {args.max_new_tokens}); k = {args.k}, cap {args.cap}; "
        f"generated in {time.time() - start:.0f} s"
    )
    rng = random.Random(args.seed)
    drawn = [
        [IntraItem(p * args.n + j, group[j].text) for j in rng.sample(range(len(group)), min(args.k, len(group)))]
        for p, group in enumerate(history)
    ]
    print(f"{'fitter':<12} {'all k':>6} {'fewer':>6} {'none':>6} {'cut':>6} {'mean prompt tokens':>19}")
    for name, fit in (("dropping", dropping), ("truncating", truncating)):
        served: Counter[str] = Counter()
        tokens = []
        for question, found in zip(questions, drawn, strict=True):
            text, kept, cut = fit(tokenizer, question, found, args.cap)
            served["all k" if len(kept) == args.k else "fewer" if kept else "none"] += 1
            served["cut"] += cut > 0
            tokens.append(count(tokenizer, text))
            assert count(tokenizer, text) <= args.cap or not kept
        row = " ".join(f"{served[c]:>6}" for c in ("all k", "fewer", "none", "cut"))
        print(f"{name:<12} {row} {sum(tokens) / len(tokens):>19.0f}")


if __name__ == "__main__":
    main()
