"""The pools' lesson-effect fit after `lanpo serve`'s verdicts, as a group commit.

A verdict moves the fit of its answer's pool (`lanpo.db.repo.usefulness`: every graded use of the pool in one normal
model), and that fit reads all of the pool's graded uses. A training step pays it once a step; a server that refit
inside each verdict's transaction held the pool's lock for the whole fit, so it took one verdict of a pool per fit
time, each waiting on all the fits queued before it. So a verdict's transaction recomputes only its own use rows
(`record_feedback(fit=False)`), and after its commit the request awaits `Refitter.settle`: one refit runs at a time,
in a transaction of its own, for every pool asked for since the last one began. A refit that began after a verdict
committed fits that verdict's use, so when `settle` returns what the next request reads (`lesson_history`, the
value rule) counts the verdict, as before; a burst of verdicts shares a refit (each waits at most the running fit
and its own) instead of queueing a fit apiece.

A failed refit leaves its pools asked for (the next refit takes them again) and raises in each request it was to
cover (a request that asked after it began waits for the next): their verdicts are committed, and the next refit of
their pools counts them. Everything but the fit itself
runs on the event loop, so no lock is needed; a cancelled request leaves the fit it waited on running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from concurrent.futures import Executor
from typing import Any

from lanpo.db.connection import transaction
from lanpo.db.repo import usefulness
from lanpo.serve.http import ApiError


class Refitter:
    """Group commit of pool refits: `await settle(pools)` returns once a refit of them, begun after the call, ended."""

    def __init__(self, db: Any, executor: Executor) -> None:
        self.db = db
        self.executor = executor
        self._asked: set[int] = set()  # pools asked for since the running refit began
        self._started = 0  # refits begun, numbered 1, 2, ...
        self._done = 0  # the number of the last refit that ended well (one runs at a time: they end in order)
        self._running: tuple[asyncio.Future[None], int] | None = None  # the running refit, and its number
        self.refits = 0  # refits that ended well
        self.settled = 0  # settle calls answered

    async def settle(self, pool_ids: Iterable[int]) -> None:
        """Wait for a refit that covers `pool_ids` and began after this call; the caller's writes have committed."""
        pools = {int(p) for p in pool_ids}
        if not pools:
            return
        self._asked |= pools
        wanted = self._started + 1  # the next refit to begin takes every pool asked for, these among them
        while self._done < wanted:
            running, number = self._running if self._running is not None else self._begin()
            await asyncio.wait([running])  # our cancellation does not cancel the refit
            if number < wanted:
                continue  # begun before our call: whatever became of it, ours is the next
            if running.cancelled():
                raise asyncio.CancelledError("the refit was cancelled (the server is stopping)")
            failure = running.exception()
            if failure is not None:
                raise failure
        self.settled += 1

    async def counted(self, feedback_id: int, pool_id: int) -> None:
        """`settle([pool_id])` for a verdict's request: a 503 that says the feedback is stored when the refit fails."""
        try:
            await self.settle([pool_id])
        except Exception as exc:
            raise ApiError(
                503,
                f"the feedback is stored (id {feedback_id}), but its pool's lesson fit failed ({type(exc).__name__}); "
                "the next verdict's refit counts it",
                "store_unavailable",
            ) from None

    def _begin(self) -> tuple[asyncio.Future[None], int]:
        batch, self._asked = sorted(self._asked), set()
        self._started += 1
        number = self._started
        running = asyncio.get_running_loop().run_in_executor(self.executor, self._refit, batch)

        def ended(future: asyncio.Future[None]) -> None:  # runs before any waiter resumes (added first)
            self._running = None
            if future.cancelled() or future.exception() is not None:
                self._asked |= set(batch)
            else:
                self._done, self.refits = number, self.refits + 1

        running.add_done_callback(ended)
        self._running = running, number
        return self._running

    def _refit(self, pools: list[int]) -> None:
        with transaction(self.db) as session:
            usefulness.refit_after(session, pools)

    def stats(self) -> dict[str, int]:
        """`/health`'s `refits`: refits run, and the verdicts they covered."""
        return {"refits": self.refits, "verdicts": self.settled}
