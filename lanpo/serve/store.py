"""What `lanpo serve` keeps in the store: one serving run per pool, and every answer before its response is sent.

- Runs: the first request that reads a pool opens the server's run for it (`<run name>` for the default pool,
  `<run name>@<pool>` for another; kind `serve`), through `lanpo.inference.run.InferenceRun`. Each request's
  question becomes a problem of dataset `serve` (its id: a hash of the text, so one question asked twice is one
  problem), its answers attempts of the run, and one `served_answers` row says how it was served (mode, the
  fallback, sampling settings, timings, the key's name, streamed or not).
- Writes are group commits: one writer thread takes every answer waiting and stores them in one transaction, a
  savepoint each, so one bad answer fails alone. A request awaits its commit before the last bytes of its
  response go out: an answer a client received is in the store, whatever happens to the server afterwards; a
  request the server never finished is not. The `served_answers.request_id` is unique, so no answer is stored
  twice.
- Shutdown: the writer finishes what is queued, then the runs are marked finished.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from lanpo.db.connection import transaction
from lanpo.inference import store as answers
from lanpo.inference.results import Solution
from lanpo.inference.run import InferenceRun
from lanpo.serve.engine import settle

log = logging.getLogger(__name__)

DATASET = "serve"


@dataclass
class Served:
    """How one request was served: the row of `served_answers` besides its ids."""

    request_id: str
    mode: str
    fallback: str | None
    sampling: dict[str, Any]
    timings: dict[str, float]
    key_name: str | None
    streamed: bool
    scope: str | None = None  # the scope the request named


@dataclass
class _Pending:
    run: InferenceRun
    solution: Solution
    served: Served
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class Runs:
    """The server's runs, one per pool read (None: zero-shot with no pool), opened on first use."""

    def __init__(
        self,
        db: Any,
        name: str,
        model: str,
        config: dict[str, Any],
        adapter_sha256: str | None,
        default_pool: str | None,
    ) -> None:
        self.db, self.name, self.model, self.config, self.adapter_sha256 = db, name, model, config, adapter_sha256
        self.default_pool = default_pool
        self._runs: dict[int | None, InferenceRun] = {}
        self._lock = threading.Lock()
        self._open = ExitStack()

    def of(self, pool_id: int | None, pool_name: str | None) -> InferenceRun:
        """The run of `pool_id`'s answers, opened by the first one (so a refused request writes nothing)."""
        with self._lock:
            run = self._runs.get(pool_id)
            if run is None:
                name = self.name if pool_name in (None, self.default_pool) else f"{self.name}@{pool_name}"
                run = InferenceRun.check(self.db, name, "serve", self.model, pool_id=pool_id, dataset=DATASET)
                run.open({**self.config, "pool": pool_name}, self.adapter_sha256)
                self._open.enter_context(run.running())  # beats while the server runs; finished on close
                self._runs[pool_id] = run
                log.info("opened serving run %s (id %s) for pool %s", name, run.run_id, pool_name)
            return run

    def close(self) -> None:
        self._open.close()


class Recorder:
    """The writer thread: `await record(run, solution, served)` returns the answer ids once committed."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="lanpo-serve-writer", daemon=True)
        self.commits = 0  # transactions committed, each holding every answer that waited for it
        self.stored = 0
        self._thread.start()

    async def record(self, run: InferenceRun, solution: Solution, served: Served) -> list[int]:
        loop = asyncio.get_running_loop()
        pending = _Pending(run, solution, served, loop.create_future(), loop)
        self._queue.put(pending)
        return await asyncio.shield(pending.future)  # a client that leaves does not cancel its write

    def close(self) -> None:
        """Store what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[_Pending]) -> None:
        results: list[tuple[_Pending, list[int] | None, BaseException | None]] = []
        try:
            with transaction(self.db) as session:
                for item in batch:
                    try:
                        with session.begin_nested():
                            results.append((item, _store(session, item), None))
                    except Exception as exc:  # this answer alone fails; the rest commit
                        log.exception("an answer could not be stored (request %s)", item.served.request_id)
                        results.append((item, None, exc))
        except Exception as exc:  # the commit itself failed: nothing of the batch is stored
            log.exception("a commit of %d answer(s) failed", len(batch))
            results = [(item, None, exc) for item in batch]
        else:
            self.commits += 1
            self.stored += sum(1 for _, ids, _ in results if ids is not None)
        for item, ids, exc in results:
            item.loop.call_soon_threadsafe(settle, item.future, ids, exc)


def _store(session: Any, item: _Pending) -> list[int]:
    from lanpo.db.repo.serving import ServedAnswer, record_served

    run, solution = item.run, item.solution
    if solution.question.problem_id is None:
        (question,) = answers.import_questions(session, DATASET, [solution.question])
        solution = Solution(question, solution.mode, solution.samples, solution.experiences, solution.fallback)
    assert run.run_id is not None
    # retire=False: the serving role may not evict a lesson; its verdicts count at the next training or evaluation
    ids = answers.record_solutions(session, [solution], run.run_id, run.version_id, retire=False)
    s = item.served
    record_served(
        session,
        ServedAnswer(
            request_id=s.request_id,
            run_id=run.run_id,
            group_id=None,  # the turn-0 group, found from the first answer
            answer_ids=ids,
            mode=s.mode,
            fallback=s.fallback,
            sampling=s.sampling,
            timings=s.timings,
            key_name=s.key_name,
            streamed=s.streamed,
            scope=s.scope,
        ),
    )
    return ids
