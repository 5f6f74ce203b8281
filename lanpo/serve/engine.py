"""The engines `lanpo serve` answers with: requests that arrive together are generated together.

- `vllm` (`lanpo.serve.vllm_engine.AsyncVLLMEngine`): vLLM's AsyncLLM. Continuous batching: a request joins the
  running batch at the next engine step and leaves it when done; streaming sends tokens as they are decoded.
- `hf` (`BatchingEngine`, here): transformers' `generate` behind a dynamic batcher. One thread owns the model; a
  request waits while a batch runs, and every request that arrived meanwhile (same sampling settings, up to
  `max_batch`) goes into the next batch together. A batch runs to its longest answer, so a short answer waits
  for the long ones: dynamic, not continuous, batching. Streaming sends an answer in one piece when it is done.

Both answer `generate(prompt, params, n)` with `lanpo.rollout.Completion`s, so the server grades and records the
same objects `lanpo infer` does, and both carry the relevance judge on the same weights (`judge()`).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lanpo.rollout import Completion, SamplingParams


class Engine(Protocol):
    tokenizer: Any
    model_id: str
    adapter_sha256: str | None

    async def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Completion]: ...

    def stream(self, prompt: str, params: SamplingParams) -> AsyncIterator[tuple[str, Completion | None]]: ...

    def judge(self, loop: asyncio.AbstractEventLoop) -> Any: ...

    def stats(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


@dataclass
class _Job:
    prompt: str
    params: SamplingParams
    n: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued_at: float = field(default_factory=time.perf_counter)


class BatchingEngine:
    """`backend.generate` (an HFBackend) in one thread, over batches of the requests waiting for it.

    `window_s`: how long the thread waits for more requests after the first of an idle spell (a request that
    arrives while a batch runs never waits on the window: it is already queued when the batch ends).
    """

    def __init__(
        self,
        backend: Any,
        model: Any,
        tokenizer: Any,
        model_id: str,
        adapter_sha256: str | None,
        *,
        max_batch: int = 8,
        window_s: float = 0.01,
    ) -> None:
        self.backend, self.model, self.tokenizer = backend, model, tokenizer
        self.model_id, self.adapter_sha256 = model_id, adapter_sha256
        self.max_batch, self.window_s = max_batch, window_s
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()  # the model: generation and the judge take turns
        self.peak_batch = 0
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name="lanpo-serve-batcher", daemon=True)
        self._thread.start()

    async def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Completion]:
        loop = asyncio.get_running_loop()
        job = _Job(prompt, params, n, loop.create_future(), loop)
        self._jobs.put(job)
        return await job.future

    async def stream(self, prompt: str, params: SamplingParams) -> AsyncIterator[tuple[str, Completion | None]]:
        (completion,) = await self.generate(prompt, params, 1)
        yield completion.text, completion

    def judge(self, loop: asyncio.AbstractEventLoop) -> Any:
        """The policy as relevance judge (`HFJudge`), scoring under the model's lock."""
        from lanpo.retrieval.judge import HFJudge

        judge = HFJudge(self.model, self.tokenizer, model_id=self.judge_id)
        return _Locked(judge, self._lock)

    @property
    def judge_id(self) -> str:
        return judge_id(self.model_id, self.adapter_sha256)

    def stats(self) -> dict[str, Any]:
        return {"backend": "hf", "batching": "dynamic", "peak_batch": self.peak_batch, "batches": self.batches}

    async def aclose(self) -> None:
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join)

    # ------------------------------------------------------------------ the batcher thread

    def _run(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            jobs, stop = [first], False
            deadline = time.perf_counter() + self.window_s
            while len(jobs) < self.max_batch:
                try:
                    job = self._jobs.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                jobs.append(job)
            for batch in _batches(jobs):
                self._generate(batch)
            if stop:
                return

    def _generate(self, jobs: list[_Job]) -> None:
        live = [j for j in jobs if not j.future.cancelled()]  # a client that went away is not answered
        if not live:
            return
        self.peak_batch = max(self.peak_batch, len(live))
        self.batches += 1
        try:
            with self._lock:
                groups = self.backend.generate([j.prompt for j in live], live[0].n, live[0].params)
        except BaseException as exc:  # every waiting request learns of it; the thread goes on
            for j in live:
                j.loop.call_soon_threadsafe(settle, j.future, None, exc)
            return
        for j, group in zip(live, groups, strict=True):
            j.loop.call_soon_threadsafe(settle, j.future, group, None)


def judge_id(model_id: str, adapter_sha256: str | None) -> str:
    """The model id the served policy is known by as a relevance judge (other weights, other scores)."""
    return model_id + (f"+{adapter_sha256[:12]}" if adapter_sha256 else "")


def _batches(jobs: list[_Job]) -> list[list[_Job]]:
    """Jobs grouped by what one `generate` call shares (sampling settings and n), in arrival order."""
    groups: dict[tuple[SamplingParams, int], list[_Job]] = {}
    for job in jobs:
        groups.setdefault((job.params, job.n), []).append(job)
    return list(groups.values())


def settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    """Resolve `future` (from its loop's thread, `call_soon_threadsafe`) unless its waiter has gone."""
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class _Locked:
    """A judge whose `score` holds the model's lock (the batcher generates with the same weights)."""

    def __init__(self, judge: Any, lock: threading.Lock) -> None:
        self._judge, self._lock = judge, lock

    @property
    def identity(self) -> str:
        return self._judge.identity

    def score(self, pairs: Sequence[tuple[str, str]], *args: Any, **kwargs: Any) -> list[float]:
        with self._lock:
            return self._judge.score(pairs, *args, **kwargs)


class BlockingJudge:
    """An async judge (`async score(pairs)`) seen as the sync one retrieval calls, from a worker thread."""

    def __init__(self, judge: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._judge, self._loop = judge, loop

    @property
    def identity(self) -> str:
        return self._judge.identity

    def score(self, pairs: Sequence[tuple[str, str]], *args: Any, **kwargs: Any) -> list[float]:
        return asyncio.run_coroutine_threadsafe(self._judge.score(pairs), self._loop).result()


def load_hf(model: str, adapter: str | None, dtype: str | None, device: str | None, max_batch: int) -> BatchingEngine:
    """The hf engine: the model (and adapter, with its SFT start) loaded as `lanpo infer` loads it."""
    from pathlib import Path

    from lanpo.models import adapter_sha256, load_adapter_stack, load_causal_lm, prepare_tokenizer
    from lanpo.rollout.hf import HFBackend

    hf_model, tokenizer = load_causal_lm(model, dtype=dtype, device=device)
    tokenizer = prepare_tokenizer(tokenizer)
    sha = None
    if adapter is not None:
        hf_model, _ = load_adapter_stack(hf_model, Path(adapter))
        sha = adapter_sha256(hf_model)
    hf_model.eval()
    backend = HFBackend(hf_model, tokenizer, max_batch=max(8, max_batch))
    return BatchingEngine(backend, hf_model, tokenizer, model, sha, max_batch=max_batch)
