"""Learning from traffic (`lanpo serve --learn`): an answer a client marks good becomes a candidate lesson.

ReasoningBank's loop (retrieve, answer, judge, distil, append) and Training-Free GRPO's library grown at test time,
on lanpo's store and under its rules:

- **Good** is a verdict `correct`, a gold answer the response matches (the verdict the feedback route grades), or,
  with no verdict, a reward at or over `min_reward` (`--learn-min-reward`, training's `summarizer.min_reward`).
- **Summarised by the served model** with training's summary prompt (`lanpo.prompts.summary_messages`: the question
  and the answer; never the reward, the verdict or the gold answer), through `lanpo.feedback.summarize.summarise`:
  the same admission (`check_summary`: short, repeats, format, loop, copied, restates) and the same scaffold.
- **Admitted under the pool's caps** (`lanpo.db.repo.serving.add_served_lesson`: the per-step cap and the capacity
  policies, in one transaction), never merged into another lesson, with its provenance: the served answer
  (`source_attempt_id`), the feedback row (`feedback_id`, whose `key_name` names the key), the serving run, and the
  request's scope (`lanpo.serve.scopes`): a lesson learned in a scope is read by that scope only.
- **On probation** like any new lesson: untried, worth `z * prior_sd` to value-aware retrieval (`--rank value`)
  until answers that read it are graded; one that hurts is ranked below the bound and no longer read.
- One lesson per answer: a second good feedback on it adds none (the answer's attempt row is locked while its
  lesson is written, so two at once add one).
- The feedback's response waits for the lesson's commit and says what became of it; this process's BM25 index of
  the pool is dropped at that commit, so the next request reads the lesson (another process: within the cache's
  staleness, `lanpo.retrieval.corpus.DEFAULT_CACHE`).
- Written with the store owner's connection, as the server's embeddings are: admission may evict (an UPDATE of
  `experiences`), which the serving role may not do. Every statement is lanpo's; the text is the model's, checked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lanpo import prompts
from lanpo.errors import ConfigError
from lanpo.feedback.config import SummarizerConfig
from lanpo.feedback.summarize import Candidate, Summary, summarise
from lanpo.rewards import extract_boxed
from lanpo.rollout import Completion, SamplingParams

log = logging.getLogger("lanpo.serve")


@dataclass(frozen=True)
class LearnPolicy:
    """Which pools learn from their traffic (None: every pool; empty: none), and how a lesson is written."""

    pools: frozenset[str] | None = frozenset()
    summarizer: SummarizerConfig = field(default_factory=SummarizerConfig)

    @classmethod
    def parse(cls, text: str, summarizer: SummarizerConfig | None = None) -> LearnPolicy:
        """`off`, `on`, or pool names separated by commas."""
        summarizer = summarizer or SummarizerConfig()
        value = text.strip()
        if value == "off":
            return cls(frozenset(), summarizer)
        if value == "on":
            return cls(None, summarizer)
        names = [n.strip() for n in value.split(",")]
        if not all(names):
            raise ConfigError(f"--learn {text!r}: an empty pool name", hint="e.g. --learn on, or --learn demo,docs")
        return cls(frozenset(names), summarizer)

    @property
    def enabled(self) -> bool:
        return self.pools is None or bool(self.pools)

    def learns(self, pool: str | None) -> bool:
        return pool is not None and (self.pools is None or pool in self.pools)

    def good(self, correct: bool | None, reward: float | None) -> bool:
        """Whether feedback marks an answer good: a verdict decides; without one, the reward against min_reward."""
        if correct is not None:
            return correct
        return reward is not None and reward >= self.summarizer.min_reward


@dataclass(frozen=True)
class Learned:
    """What became of an answer's feedback as a lesson: `status` one of off (the pool does not learn), not_good,
    exists (learned before), rejected (admission refused it: `reason`), dropped (a cap), admitted (`id`)."""

    status: str
    id: int | None = None
    reason: str | None = None

    def body(self) -> dict[str, Any]:
        return {"status": self.status, "id": self.id, "reason": self.reason}


class _EngineBackend:
    """The serving engine as the `GenerationBackend` `summarise` calls, from a worker thread: each prompt's
    generation is submitted to the server's event loop, where the engine batches it with the requests."""

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.engine, self.loop = engine, loop

    def generate(self, prompts: Sequence[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        futures = [asyncio.run_coroutine_threadsafe(self.engine.generate(p, params, n), self.loop) for p in prompts]
        return [f.result() for f in futures]


class Learner:
    """Writes a lesson from a served answer's good feedback (`learn`), as the module docstring says."""

    def __init__(self, engine: Any, owner_db: Any, policy: LearnPolicy, author: str, cache: Any = None) -> None:
        from lanpo.retrieval.corpus import DEFAULT_CACHE

        self.engine, self.owner_db, self.policy, self.author = engine, owner_db, policy, author
        self.cache = DEFAULT_CACHE if cache is None else cache

    def learn(
        self,
        target: Any,
        feedback_id: int,
        correct: bool | None,
        reward: float | None,
        gold_answer: str | None,
        loop: asyncio.AbstractEventLoop,
    ) -> Learned:
        """The lesson of `target` (a `lanpo.db.repo.serving.FeedbackTarget`) after feedback `feedback_id`; runs in a
        worker thread (the summary's generation goes to the engine on `loop`)."""
        from lanpo.db.connection import transaction
        from lanpo.db.repo import serving

        if not self.policy.learns(target.pool_name):
            return Learned("off")
        if not self.policy.good(correct, reward):
            return Learned("not_good")
        with transaction(self.owner_db) as session:
            existing = serving.learned_from(session, target.attempt_id)
        if existing is not None:
            return Learned("exists", existing)
        summary = self._summarise(target, gold_answer, loop)
        if summary.rejected is not None:
            log.info("served answer %s: its lesson was not admitted (%s)", target.attempt_id, summary.rejected)
            return Learned("rejected", reason=summary.rejected)
        learned = self._write(target, feedback_id, reward, summary)
        if learned.status == "admitted":
            self.cache.forget(target.pool_id)
        return learned

    def _summarise(self, target: Any, gold_answer: str | None, loop: asyncio.AbstractEventLoop) -> Summary:
        cfg = self.policy.summarizer
        answer = gold_answer if gold_answer is not None else extract_boxed(target.response)
        candidate = Candidate(0, target.problem_id, target.question, target.response, 1.0, answer)
        backend = _EngineBackend(self.engine, loop)
        (summary,) = summarise(
            backend,  # type: ignore[arg-type]
            self.engine.tokenizer,
            [candidate],
            cfg.max_new_tokens,
            cfg.temperature,
            seed=target.attempt_id,
            require_format=cfg.require_format,
            scaffold=cfg.scaffold,
        )
        return summary

    def _write(self, target: Any, feedback_id: int, reward: float | None, summary: Summary) -> Learned:
        from lanpo.db.connection import transaction
        from lanpo.db.repo import serving
        from lanpo.db.repo.experiences import NewExperience
        from lanpo.db.repo.pools import resolve_pool

        with transaction(self.owner_db) as session:
            serving.lock_served_attempt(session, target.attempt_id)  # two good feedbacks at once: one lesson
            existing = serving.learned_from(session, target.attempt_id)
            if existing is not None:
                return Learned("exists", existing)
            pool = resolve_pool(session, target.pool_name)
            lesson = NewExperience(
                target.problem_id,
                summary.text,
                reward=1.0 if reward is None else reward,
                source_attempt_id=target.attempt_id,
                run_id=target.run_id,
                author=self.author,
                prompt_version=prompts.SUMMARY_VERSION,
            )
            result = serving.add_served_lesson(session, pool, lesson, target.scope, feedback_id)
        if not result.experience_ids:
            return Learned("dropped", reason="the pool's per-step cap")
        eid = result.experience_ids[0]
        if eid in result.evicted_ids:
            return Learned("dropped", eid, reason="evicted at once by the pool's capacity policy")
        return Learned("admitted", eid)
