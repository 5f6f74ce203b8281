"""Distilling successful rollouts into experiences: choose which to summarise (over the whole step, across ranks),
then one batched generation.

The summariser is the policy itself (paper default) or a separate model named in `summarizer.model`. It sees the
problem and the successful response, never a reward; the template asks for an abstract lesson (flow of thought,
principles, pitfalls) rather than a copy of the problem's steps.

Scaffolded summaries (`summarizer.scaffold`): the code writes each header of the lesson (## Flow, ## Principles,
## Pitfalls) into the assistant's turn, and the model writes only that section's body, which ends at the next
header or a blank line (stop strings). One batched generation per section, each prompt continuing the turn as it
stands. The format is then the code's, the content the model's: the same admission check decides, so a section
that echoes the prompt or is empty is still refused. This is for weak summarisers (a 135M policy writes no header
of its own, or the prompt's placeholder hints under them); a model that writes the lesson whole needs none.

Admission (`check_summary`; the reasons, in the order they are checked, are `REJECTIONS`): a summary shorter than
MIN_SUMMARY_CHARS is never a lesson (`short`); one that repeats its problem's final answer or its numbers of two or
more digits (the summary prompt's own rule: "do not repeat this problem's numbers or its final result";
`lanpo.prompts.repeated_numbers`) is not admitted (`repeats`). With `summarizer.require_format` on (the default) the
text must also be a lesson, language about its problem's method, and is refused when:
- `format`: it lacks the three headers, each with words of its own under it (`lanpo.prompts.has_summary_format`);
- `loop`: a section body is caught in a repetition loop (a phrase, line or list item again and again, "the the the
  ..."): LOOP_SHARE or more of its runs of LESSON_RUN words repeat an earlier run of it;
- `copied`: a body is a copy: COPIED_SHARE or more of its words in runs of the summary prompt's own text (hints,
  instructions, labels) or in runs of BODY_COPY_RUN words of one other body, the same words as another body, or
  nothing but parenthesised text (the template's placeholder form);
- `restates`: it is its question given back: RESTATES_SHARE or more of all its bodies' words in runs of the question.
Words are lower-cased runs of letters, each number one word (`lesson_words`), so a loop that counts ("step 1, step
2, ...") is still a loop and a question restated with other numbers is still the question; each threshold is argued
where it is defined. With `require_format = false` (for a model that writes no lesson: random test models, plumbing
recipes) any text that is not `short` and does not `repeat` its problem is admitted. Every generated summary says
whether it had the format, so a step can report the share that did and how many were turned away, by reason
(`summary/rejected/<reason>`).

`summaries_of` does it all for one process's rollouts of a step; lanpo's trainer hands it the cross-rank choice
(`lanpo.train.producer.summarize.choose_for_step`), any other trainer lets it choose among its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lanpo.feedback.config import SummarizerConfig
from lanpo.feedback.contexts import StepPrompts, per_rollout
from lanpo.models import apply_chat
from lanpo.prompts import (
    SUMMARY,
    SUMMARY_HEADERS,
    SUMMARY_SYSTEM,
    has_summary_format,
    repeated_numbers,
    summary_messages,
    summary_sections,
)
from lanpo.rewards import Graded
from lanpo.rollout import Completion, GenerationBackend, SamplingParams
from lanpo.seeds import mix_seed

MIN_SUMMARY_CHARS = 20
# why a generated summary is not admitted to the pool, checked in this order: the cheap and the problem's own rule
# first, then whether it is a lesson at all (format), then what its bodies say (loop, copied, restates)
REJECTIONS = ("short", "repeats", "format", "loop", "copied", "restates")
SECTION_STOP = ("\n\n", "\n#")  # a scaffolded section's body ends at a blank line or the next heading


@dataclass(frozen=True)
class Candidate:
    """A successful rollout: its index in the step's flat rollout list, problem, and texts."""

    index: int
    problem_id: int
    question: str
    response: str
    reward: float
    answer: str | None = None  # the problem's final answer: a summary that repeats it is not admitted


def choose_candidates(candidates: Sequence[Candidate], per_problem: int, total: int = 0) -> list[Candidate]:
    """Distinct responses, at most `per_problem` per problem, then at most `total` overall (0: no limit); in index
    order.

    Within a problem the best reward comes first, then the earlier rollout. The total cap takes problems
    round-robin in the step's order (a problem's place is its first candidate's index: rollouts are numbered in
    prompt order, and the step's batch is a seeded shuffle of the training set): one lesson of each problem before
    a second of any, so that one easy problem does not fill the cap, and no problem is favoured step after step by
    its id.
    """
    by_problem: dict[int, list[Candidate]] = {}
    for cand in sorted(candidates, key=lambda c: (-c.reward, c.index)):
        picked = by_problem.setdefault(cand.problem_id, [])
        if len(picked) < per_problem and all(p.response.strip() != cand.response.strip() for p in picked):
            picked.append(cand)
    first: dict[int, int] = {}  # problem -> the index of its first rollout: its place in the step
    for cand in candidates:
        first[cand.problem_id] = min(first.get(cand.problem_id, cand.index), cand.index)
    queues = [list(by_problem[pid]) for pid in sorted(by_problem, key=first.__getitem__)]
    out: list[Candidate] = []
    while any(queues) and (total == 0 or len(out) < total):
        for queue in queues:
            if queue and (total == 0 or len(out) < total):
                out.append(queue.pop(0))
    return sorted(out, key=lambda c: c.index)


@dataclass(frozen=True)
class Summary:
    """A generated summary: its stripped text, whether it has the lesson's format, and why it is not admitted."""

    text: str
    format_ok: bool
    rejected: str | None = None  # None: admitted to the pool; else one of REJECTIONS
    # what writing it cost (the step's cost/* metrics): the tokens generated, and the prompt tokens each generation
    # call read (scaffolded: one call per section, each reading the prompt and the sections before it)
    generated_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def admitted(self) -> str | None:
        """The text the pool takes, or None when the summary was turned away."""
        return None if self.rejected else self.text


# --------------------------------------------------------------------------- what a lesson's bodies may not be
# The content checks read a lesson's section bodies (`lanpo.prompts.summary_sections`) as words (`lesson_words`) and
# compare them in runs of consecutive words; a run never spans two bodies. Each threshold below is argued from the
# junk it names; the labelled lessons of tests/feedback/lesson_labels.py show where good lessons fall
# (tests/feedback/test_admission.py prints the precision and recall of the rule on them).

LESSON_RUN = 4
# A loop, a copy of the template and a restated question are read in runs of four words: a phrase ("carry into the
# tens", "the flow of thought"), long enough that two good sentences rarely share one by chance, short enough that a
# one-sentence body has runs to compare.
BODY_COPY_RUN = 8
# A copy of another body is read in runs of eight words, a clause: a pitfall often turns a principle round in a
# phrase of its words ("carry into the tens" / "forgetting to carry into the tens"), and that is a lesson; a body
# that copies another copies its clauses ("... that can be solved by applying the principles of math. This is a").
LOOP_SHARE = 1 / 3
# A loop: the share of a body's runs that repeat an earlier run of the same body. A phrase of L words written k times
# in a row repeats (k - 1) L - 3 of its k L - 3 runs: a third or more once it is written three times (L >= 2; one
# word, five times), or twice when it has 6 words or more. A good body says a phrase twice at most, among words of
# its own: well under a third.
COPIED_SHARE = 1 / 2
# A copied body: the share of its words inside runs of its source (the summary prompt's own text, or one other body).
# Half: the body is more copy than its own. A hint with a few words after it ("(the flow of thought, in abstract
# steps) add them up") is over; a good body that names its header ("mistakes to avoid: ...") or mirrors another
# section is far under.
RESTATES_SHARE = 1 / 2
# A restated question: the share of the lesson's words (all bodies) inside runs of its question. Half: more of the
# lesson is the question than the method. A good lesson that names the question's terms ("the sum of the numbers",
# "the final answer to") has one or two such runs among dozens of words.

_LESSON_WORD = re.compile(r"[a-z]+|[0-9]+")
_PARENTHESISED = re.compile(r"\([^()]*\)")


def lesson_words(text: str) -> list[str]:
    """The words of `text` as the admission checks read them: lower-cased runs of letters, each number one word "0"
    (a loop that counts, "step 1, step 2, ...", still repeats itself; a question restated with other numbers is
    still the question)."""
    return ["0" if w[0].isdigit() else w for w in _LESSON_WORD.findall(text.lower())]


def runs_of(words: Sequence[str], length: int = LESSON_RUN) -> list[tuple[str, ...]]:
    """The runs of `length` consecutive `words`, in order (none when there are fewer words)."""
    return [tuple(words[i : i + length]) for i in range(len(words) - length + 1)]


# the runs of the summary prompt's own text: its system line, instructions, headers and placeholder hints
TEMPLATE_RUNS = frozenset(runs_of(lesson_words(f"{SUMMARY_SYSTEM}\n{SUMMARY.format(question='', response='')}")))


def loop_share(words: Sequence[str]) -> float:
    """The share of the runs of `words` that repeat an earlier run of them (0 with fewer than two runs)."""
    runs = runs_of(words)
    return (len(runs) - len(set(runs))) / len(runs) if len(runs) > 1 else 0.0


def copied_share(words: Sequence[str], held: frozenset[tuple[str, ...]], length: int = LESSON_RUN) -> float:
    """The share of `words` inside a run of `length` words that `held` (runs of the source) holds (0 with no
    words)."""
    covered = [False] * len(words)
    for start, run in enumerate(runs_of(words, length)):
        if run in held:
            covered[start : start + length] = [True] * length
    return sum(covered) / len(words) if words else 0.0


def copied_body(bodies: Sequence[str]) -> bool:
    """True when a body is a copy: of the summary prompt's own text, of another body (or the same words as a short
    one), or of the template's placeholder form (nothing but parenthesised text, as "(transferable rules)")."""
    words = [lesson_words(body) for body in bodies]
    held = [frozenset(runs_of(w, BODY_COPY_RUN)) for w in words]
    for i, (body, mine) in enumerate(zip(bodies, words, strict=True)):
        if not lesson_words(_PARENTHESISED.sub(" ", body)) or copied_share(mine, TEMPLATE_RUNS) >= COPIED_SHARE:
            return True
        others = [j for j in range(len(bodies)) if j != i]
        if any(mine == words[j] or copied_share(mine, held[j], BODY_COPY_RUN) >= COPIED_SHARE for j in others):
            return True
    return False


def restated_share(bodies: Sequence[str], question: str) -> float:
    """The share of the words of all `bodies` inside runs of `question` (0 with no words)."""
    held = frozenset(runs_of(lesson_words(question)))
    words = [lesson_words(body) for body in bodies]
    total = sum(len(w) for w in words)
    return sum(copied_share(w, held) * len(w) for w in words) / total if total else 0.0


def check_summary(text: str, require_format: bool = True, question: str = "", answer: str | None = None) -> Summary:
    """Strip a generated summary and decide its admission (the first of `REJECTIONS` that holds): too short never,
    repeating its problem (`question`, `answer`) never; when `require_format`, only a lesson: the format, and no
    body a loop or a copy, and not its question restated."""
    text = text.replace("\x00", "").strip()
    format_ok = has_summary_format(text)
    bodies = [body for _, body in summary_sections(text)] if require_format and format_ok else []
    rejected = None
    if len(text) < MIN_SUMMARY_CHARS:
        rejected = "short"
    elif repeated_numbers(text, question, answer):
        rejected = "repeats"
    elif require_format and not format_ok:
        rejected = "format"
    elif any(loop_share(lesson_words(body)) >= LOOP_SHARE for body in bodies):
        rejected = "loop"
    elif copied_body(bodies):
        rejected = "copied"
    elif restated_share(bodies, question) >= RESTATES_SHARE:
        rejected = "restates"
    return Summary(text, format_ok, rejected)


def summarise(
    backend: GenerationBackend,
    tokenizer: Any,
    candidates: Sequence[Candidate],
    max_new_tokens: int,
    temperature: float,
    seed: int,
    require_format: bool = True,
    scaffold: bool = False,
) -> list[Summary]:
    """One checked summary per candidate, batched: one generation call, or one per section when `scaffold`
    (`Summary.admitted` is what the pool takes), each with the tokens it generated and read."""
    if not candidates:
        return []
    prompts = [apply_chat(tokenizer, summary_messages(c.question, c.response)) for c in candidates]
    if scaffold:
        texts, generated, read = scaffolded(backend, prompts, SUMMARY_HEADERS, max_new_tokens, temperature, seed)
    else:
        params = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=seed, logprobs=False
        )
        outputs = [group[0] for group in backend.generate(prompts, 1, params)]
        texts = [c.text for c in outputs]
        generated, read = [len(c.token_ids) for c in outputs], [len(c.prompt_token_ids) for c in outputs]
    return [
        replace(check_summary(t, require_format, c.question, c.answer), generated_tokens=g, prompt_tokens=r)
        for t, c, g, r in zip(texts, candidates, generated, read, strict=True)
    ]


def scaffolded(
    backend: GenerationBackend,
    prompts: Sequence[str],
    headers: Sequence[str],
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> tuple[list[str], list[int], list[int]]:
    """Each prompt's reply written section by section: the code writes a header, the model its body (up to
    `SECTION_STOP`, `max_new_tokens // len(headers)` tokens at most), and the next header follows on a line of its
    own. One batched call per section; the bodies are the model's, stripped. Returns the replies, and per prompt
    the tokens its calls generated and the prompt tokens they read (the headers are prompt, not generated)."""
    budget = max(1, max_new_tokens // len(headers))
    written = ["" for _ in prompts]
    generated, read = [0 for _ in prompts], [0 for _ in prompts]
    for number, header in enumerate(headers):
        written = [f"{w}{header}\n" for w in written]
        params = SamplingParams(
            max_new_tokens=budget,
            temperature=temperature,
            top_p=1.0,
            seed=seed + number,
            stop=SECTION_STOP,
            logprobs=False,
        )
        groups = backend.generate([p + w for p, w in zip(prompts, written, strict=True)], 1, params)
        written = [f"{w}{group[0].text.strip()}\n" for w, group in zip(written, groups, strict=True)]
        generated = [g + len(group[0].token_ids) for g, group in zip(generated, groups, strict=True)]
        read = [r + len(group[0].prompt_token_ids) for r, group in zip(read, groups, strict=True)]
    return [w.rstrip("\n") for w in written], generated, read


Chooser = Callable[[list[Candidate], int, int], list[Candidate]]  # (candidates, per problem, total) -> chosen


def summaries_of(
    cfg: SummarizerConfig,
    backend: GenerationBackend,
    tokenizer: Any,
    seed: int,
    step: int,
    prompts: StepPrompts,
    rollouts: list[Completion],
    graded: list[Graded],
    rank: int = 0,
    world: int = 1,
    choose: Chooser = choose_candidates,
) -> dict[int, Summary]:
    """Summaries of this process's successful rollouts (reward >= `cfg.min_reward`), chosen by `choose` and checked
    for admission (flat rollout index -> summary). `rollouts` are n per prompt of `prompts`, group by group; `rank`
    of `world` processes numbers them within the step (prompt g of rank r is the step's prompt r + world * g)."""
    n = len(rollouts) // max(len(prompts.problem_ids), 1)
    step_index = [(rank + world * (i // n)) * n + i % n for i in range(len(rollouts))]  # in the whole step
    pids, questions, answers = (per_rollout(v, n) for v in (prompts.problem_ids, prompts.questions, prompts.answers))
    candidates = [
        Candidate(step_index[i], pids[i], questions[i], c.text, g.reward, answers[i])
        for i, (c, g) in enumerate(zip(rollouts, graded, strict=True))
        if g.reward >= cfg.min_reward
    ]
    chosen = choose(candidates, cfg.max_new_per_step, cfg.max_total_per_step)
    local = {j: i for i, j in enumerate(step_index)}
    checked = summarise(
        backend,
        tokenizer,
        chosen,
        cfg.max_new_tokens,
        cfg.temperature,
        mix_seed(seed, "summarize", step, rank),
        cfg.require_format,
        cfg.scaffold,
    )
    return {local[c.index]: s for c, s in zip(chosen, checked, strict=True)}
