"""Would a summariser's lessons merge? Its admitted lessons of one problem, pairwise: cosine under all-MiniLM-L6-v2,
whether they pass the merge's guard (`lanpo.merging.same_terms`), and the share of pairs that would merge at a
threshold, against pairs of lessons of different problems as the reference.

    python bench/lesson_similarity.py                                   # SmolLM2, scaffolded, as the CPU demo
    python bench/lesson_similarity.py --adapter $LANPO_HOME/runs/demo/sft/adapter --per-problem 12

Each problem's candidates are right answers in a few wordings, summarised as `lanpo.feedback.summarize.summarise`
does in training (one batched generation, the admission check). docs/concepts.md ("Lessons that live") quotes it.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDINGS = ("{a} = {s}. The answer is \\boxed{{{s}}}.", "Adding: {a} = {s}, so \\boxed{{{s}}}.",
            "We compute {a} = {s}. \\boxed{{{s}}}", "Step by step, {a} gives {s}. Final: \\boxed{{{s}}}.")  # fmt: skip
PROBLEMS = (("9 + 3", 12), ("7 - 3", 4), ("5 + 8", 13), ("6 + 2", 8))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--adapter", default=None, help="a PEFT adapter folder (the demo's warm start)")
    parser.add_argument("--per-problem", type=int, default=8, help="candidates summarised per problem")
    parser.add_argument("--temperature", type=float, default=0.7, help="summarizer.temperature (default 0.7)")
    parser.add_argument("--threshold", type=float, default=0.9)
    args = parser.parse_args()

    import torch

    from lanpo.feedback.summarize import Candidate, summarise
    from lanpo.merging import same_terms
    from lanpo.models import load_causal_lm
    from lanpo.retrieval.embeddings import shared_embedder
    from lanpo.rollout.hf import HFBackend

    torch.manual_seed(0)
    model, tokenizer = load_causal_lm(args.model, dtype="float32")
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
    backend, embedder = HFBackend(model, tokenizer), shared_embedder()
    lessons: list[list[str]] = []
    for number, (sum_, total) in enumerate(PROBLEMS):
        question = f"State the final answer to the following arithmetic problem: {sum_} ="
        candidates = [
            Candidate(i, number, question, WORDINGS[i % len(WORDINGS)].format(a=sum_, s=total), 1.0, str(total))
            for i in range(args.per_problem)
        ]
        summaries = summarise(backend, tokenizer, candidates, 96, args.temperature, number, True, True)
        lessons.append([s.text for s in summaries if s.admitted])
        print(f"problem {sum_}: {len(lessons[-1])} of {args.per_problem} admitted")

    def pairs(same: bool) -> list[tuple[float, bool]]:
        out = []
        for (p, a), (q, b) in itertools.combinations([(p, t) for p, texts in enumerate(lessons) for t in texts], 2):
            if (p == q) == same:
                va, vb = embedder.encode([a, b])
                out.append((float(va @ vb), same_terms(a, b)))
        return out

    for title, found in (("same problem", pairs(True)), ("different problems", pairs(False))):
        if not found:
            print(f"{title}: no pair")
            continue
        cosines = [c for c, _ in found]
        merge = sum(1 for c, guard in found if c >= args.threshold and guard)
        print(
            f"{title}: {len(found)} pairs, cosine median {statistics.median(cosines):.2f} "
            f"(min {min(cosines):.2f}, max {max(cosines):.2f}), guard passed {sum(g for _, g in found)}, "
            f"would merge at {args.threshold}: {merge}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
