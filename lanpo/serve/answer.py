"""One request of `lanpo serve`, answered as `lanpo infer` answers a question: the same prompts, the same modes.

The prompt is built by `lanpo.inference.modes` (`retrieval_prompt`, `reflection_prompt`, the actor prompt): a
lesson reaches the prompt exactly as `lanpo infer --mode retrieval` puts it, under the same leakage rules (the
prompt reads the question, model-written text and lesson summaries; never a gold answer, reward or verdict). The
question is the request's last user turn; the client's system text and earlier turns are placed around lanpo's
messages at rendering (`lanpo.serve.messages.Conversation.around`), so each mode's template is the one it has in
`lanpo infer`, and the text rendered is the text the engine is given and the store keeps.
Retrieval (stage 1 in the store, then the judge on the engine's weights for the candidates `judge_cache` has no
score of) runs in a worker thread, with the serving role's database connection; generation goes to the engine, which
batches it with other requests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from lanpo import prompts
from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question
from lanpo.errors import InputError
from lanpo.inference.answerer import experiences_for
from lanpo.inference.config import RetrievalSettings
from lanpo.inference.io import question_id
from lanpo.inference.modes import Prepared, grade_turn, reflection_prompt, retrieval_prompt
from lanpo.inference.results import Sample, Solution, Turn
from lanpo.models import apply_chat
from lanpo.rollout import Completion, SamplingParams
from lanpo.serve.messages import Conversation

NO_POOL = "no pool: the server has no default pool and the request named none, answered zero-shot"


@dataclass(frozen=True)
class Ask:
    """A parsed request: the conversation (its last user turn the question), how to answer it, and the pool it
    reads (None: none)."""

    conversation: Conversation
    mode: str
    n: int
    params: SamplingParams
    retrieval: RetrievalSettings
    pool_id: int | None
    pool_name: str | None
    scope: str | None = None  # the request's scope: its lessons and the shared ones are read (lanpo.serve.scopes)

    @property
    def question(self) -> str:
        return self.conversation.question


@dataclass
class Timings:
    """Where a request's time went: `retrieval_ms` (stage 1, the judge and the store), of it `judge_ms` (waiting
    on the judge) with `judged` (pairs the judge scored; pairs `judge_cache` held are not judged), `generate_ms`."""

    started: float = field(default_factory=time.perf_counter)
    retrieval_ms: float = 0.0
    judge_ms: float = 0.0
    judged: int = 0
    generate_ms: float = 0.0

    def of(self) -> dict[str, float]:
        total = (time.perf_counter() - self.started) * 1000
        return {
            "retrieval_ms": round(self.retrieval_ms, 3),
            "judge_ms": round(self.judge_ms, 3),
            "judged": self.judged,
            "generate_ms": round(self.generate_ms, 3),
            "total_ms": round(total, 3),
        }


class _TimedJudge:
    """The judge of one request, its time and pairs added to the request's `Timings`."""

    def __init__(self, judge: Any, timings: Timings) -> None:
        self._judge, self._timings = judge, timings

    @property
    def identity(self) -> str:
        return self._judge.identity

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        started = time.perf_counter()
        try:
            return self._judge.score(pairs)
        finally:
            self._timings.judge_ms += (time.perf_counter() - started) * 1000
            self._timings.judged += len(pairs)


class _Prompter:
    """What `lanpo.inference.modes` reads of an answerer, for one request: it renders lanpo's messages for the
    mode inside the request's conversation."""

    def __init__(self, tokenizer: Any, ask: Ask) -> None:
        self.tokenizer, self.retrieval, self.conversation = tokenizer, ask.retrieval, ask.conversation

    def render(self, messages: list[dict[str, str]]) -> str:
        from jinja2 import TemplateError

        try:
            return apply_chat(self.tokenizer, self.conversation.around(messages))
        except TemplateError as exc:  # the model's chat template refuses the conversation (roles that must alternate)
            raise InputError(f"the model's chat template refuses these messages: {exc}") from None


class Answering:
    """Requests -> Solutions: prompts from the store (retrieval in `executor`), answers from `engine`."""

    def __init__(self, engine: Any, db: Any, owner_db: Any, executor: Executor, judge: Any) -> None:
        self.engine, self.db, self.owner_db, self.executor, self.judge = engine, db, owner_db, executor, judge
        self._embedder_lock = threading.Lock()

    def question(self, text: str) -> Question:
        return Question(question_id(text), text)

    async def prepare(self, ask: Ask, timings: Timings) -> Prepared:
        """The prompt of `ask`'s first turn (retrieval: its experiences, or the zero-shot prompt and why)."""
        prompter = _Prompter(self.engine.tokenizer, ask)
        if ask.mode != "retrieval":
            text = prompter.render(prompts.actor_messages(ask.question))
            return Prepared(text, prompts.ACTOR_VERSION, "zero_shot", [], None)
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, self._retrieve, ask, prompter, timings)
        finally:
            timings.retrieval_ms = (time.perf_counter() - started) * 1000

    def _retrieve(self, ask: Ask, prompter: _Prompter, timings: Timings) -> Prepared:
        from lanpo.db.repo.pools import active_size
        from lanpo.retrieval.testtime import retrieve

        q = self.question(ask.question)
        if ask.pool_id is None:
            return replace(retrieval_prompt(prompter, q, [], True), fallback=NO_POOL)
        rater = None if ask.retrieval.judge == "none" else _TimedJudge(self.judge, timings)
        retriever = partial(retrieve, scope=ask.scope)
        if ask.retrieval.stage1 != "bm25":
            retriever = partial(retriever, embedder=self._embedded(ask.pool_id), embed=False)
        with transaction(self.db) as session:
            if active_size(session, ask.pool_id) == 0:
                return retrieval_prompt(prompter, q, [], True)
            exps = experiences_for(session, retriever, q, ask.pool_id, ask.retrieval, rater)
        return retrieval_prompt(prompter, q, exps, False)

    def _embedded(self, pool_id: int) -> Any:
        """The embedder, after the pool's lessons that have no embedding yet (a trainer writes them without) got
        one: derived data the serving role may not write, so the owner writes it, before the role's search."""
        from lanpo.retrieval.embeddings import embed_pool
        from lanpo.retrieval.testtime import default_embedder

        with self._embedder_lock:
            embedder = default_embedder()
            with transaction(self.owner_db) as session:
                embed_pool(session, pool_id, embedder)
        return embedder

    async def answer(self, ask: Ask, prepared: Prepared, timings: Timings) -> Solution:
        """All n samples of `ask` (self-correction: both turns of each)."""
        started = time.perf_counter()
        first = await self.engine.generate(prepared.prompt, ask.params, ask.n)
        turns = [[self._turn(prepared.prompt, c, prepared.version, prepared.grade_mode)] for c in first]
        if ask.mode in ("self_correct", "self_correct_single"):
            q = self.question(ask.question)
            two_turn = ask.mode == "self_correct"
            version = prompts.REFLECT_VERSION if two_turn else prompts.INTRA_VERSION
            texts = [reflection_prompt(_Prompter(self.engine.tokenizer, ask), q, c.text, two_turn) for c in first]
            seconds = await asyncio.gather(*(self.engine.generate(t, ask.params, 1) for t in texts))
            for sample, text, (c,) in zip(turns, texts, seconds, strict=True):
                sample.append(self._turn(text, c, version, "intra"))
        timings.generate_ms = (time.perf_counter() - started) * 1000
        return self.solution(ask, prepared, turns)

    async def stream(
        self, ask: Ask, prepared: Prepared, timings: Timings
    ) -> AsyncIterator[tuple[str, Solution | None]]:
        """Text deltas of the answer (n = 1; self-correction streams its second turn), then the Solution."""
        started = time.perf_counter()
        prompt, version, grade_mode = prepared.prompt, prepared.version, prepared.grade_mode
        turns: list[Turn] = []
        if ask.mode in ("self_correct", "self_correct_single"):
            (c,) = await self.engine.generate(prompt, ask.params, 1)
            turns.append(self._turn(prompt, c, version, grade_mode))
            two_turn = ask.mode == "self_correct"
            prompt = reflection_prompt(
                _Prompter(self.engine.tokenizer, ask), self.question(ask.question), c.text, two_turn
            )
            version, grade_mode = (prompts.REFLECT_VERSION if two_turn else prompts.INTRA_VERSION), "intra"
        final: Completion | None = None
        async for delta, completion in self.engine.stream(prompt, ask.params):
            if delta:
                yield delta, None
            final = completion or final
        assert final is not None, "the engine's stream ends with the whole completion"
        turns.append(self._turn(prompt, final, version, grade_mode))
        timings.generate_ms = (time.perf_counter() - started) * 1000
        yield "", self.solution(ask, prepared, [turns])

    def solution(self, ask: Ask, prepared: Prepared, turns: list[list[Turn]]) -> Solution:
        return Solution(
            self.question(ask.question),
            ask.mode,
            [Sample(t) for t in turns],
            list(prepared.experiences),
            prepared.fallback if ask.mode == "retrieval" else None,
        )

    @staticmethod
    def _turn(prompt: str, completion: Completion, version: str, grade_mode: str) -> Turn:
        return grade_turn(prompt, completion, version, grade_mode, None)  # no gold at serving time
