"""One inference run in the store: how `lanpo infer`, `lanpo eval` and the demo's held-out answers each keep theirs.

1. check: `InferenceRun.check(db, name, kind, model, ...)` tries what the store would refuse (a taken or bad run
   name, questions that clash with their dataset's stored problems) in a transaction it rolls back, and
   `pool_id(db, name)` finds the pool retrieval reads: bad input is an InputError before a model loads, and
   nothing is written.
2. open: `run.open(config, adapter_sha256, questions)` stores the questions as problems of the run's dataset, the
   run (reading its pool) and, when an adapter is served, its policy version, in one transaction.
3. record: `run.record(solutions)` stores every turn as an attempt (`lanpo.inference.store.record_solutions`), each
   retrieval group with the lesson versions its prompt read; a zero-shot fallback reads none (the reason is the
   solution's `fallback`). One transaction per call: a batch, or a single answer (with its question, when that is
   not a problem yet), is kept once recorded; the final attempts' ids come back.
4. finish: `with run.running():` around the answering: the run beats while it works (`lanpo.db.heartbeat`), is
   marked finished when the body returns and failed when it raises (Ctrl-C too); each mark is its own
   transaction, so nothing recorded is lost. `run.record_metrics` stores its figures. `answering(run, ...)` is
   that under a progress bar, with the `on_batch` callback that records each batch as the answerer ends it.

A caller that answers one request at a time (a server) checks at start-up, opens once, records each answer as it
is sent and finishes on shutdown.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from lanpo.db.connection import session_factory, transaction
from lanpo.db.repo.pools import resolve_pool
from lanpo.db.repo.runs import record_metrics, run_lifecycle
from lanpo.inference import store

if TYPE_CHECKING:
    from sqlalchemy import Engine as Database

    from lanpo.db.repo.problems import Question
    from lanpo.inference.results import Solution

OnBatch = Callable[[list["Solution"]], None]


def default_name(kind: str) -> str:
    """A run's name when none is given: `<kind>-<UTC time>`."""
    return f"{kind}-{datetime.now(UTC):%Y%m%d-%H%M%S}"


def default_dataset(input_path: Path) -> str:
    """The dataset an input file's questions are stored under when none is named: `infer-<file stem>`."""
    return "infer-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", input_path.stem).strip("-") or "input")


def pool_id(db: Database | None, name: str | None) -> int:
    """The id of the pool retrieval reads (`name`, else the store's only pool): an unknown or ambiguous name is an
    InputError here, before any model loads."""
    assert db is not None, "retrieval reads the store"
    with transaction(db) as session:
        return resolve_pool(session, name).id


@dataclass
class InferenceRun:
    """An `infer` or `eval` run: its store, name and settings, and its ids once opened."""

    db: Database
    name: str
    kind: str
    model: str
    pool_id: int | None = None  # the pool its retrieval reads
    dataset: str | None = None  # where `open` stores questions that are not problems yet
    run_id: int | None = None
    version_id: int | None = None  # the policy version of the served adapter

    @classmethod
    def check(
        cls,
        db: Database | None,
        name: str | None,
        kind: str,
        model: str,
        *,
        pool_id: int | None = None,
        dataset: str | None = None,
        questions: Sequence[Question] = (),
    ) -> InferenceRun:
        """The run to open (named `name`, else `<kind>-<UTC time>`), after a dry run of opening it: what the store
        refuses fails here, and nothing is written."""
        assert db is not None, "a run is recorded in the store"
        name = default_name(kind) if name is None else name
        with session_factory(db)() as session:
            if dataset is not None:
                store.import_questions(session, dataset, questions)
            store.start_run(session, name, kind, {}, model, None, pool_id=pool_id)
            session.rollback()
        return cls(db, name, kind, model, pool_id, dataset)

    def open(
        self, config: dict[str, Any], adapter_sha256: str | None, questions: Sequence[Question] = ()
    ) -> list[Question]:
        """Store `questions` as problems of the run's dataset and start the run; the questions come back with their
        problem ids."""
        stored = list(questions)
        with transaction(self.db) as session:
            if self.dataset is not None:
                stored = store.import_questions(session, self.dataset, questions)
            self.run_id, self.version_id = store.start_run(
                session, self.name, self.kind, config, self.model, adapter_sha256, pool_id=self.pool_id
            )
        return stored

    @contextmanager
    def running(self) -> Iterator[InferenceRun]:
        """The run's work: failed if the body raises, finished if it returns; what was recorded stays either way."""
        with run_lifecycle(self.db, self._opened()):
            yield self

    def record(self, solutions: list[Solution]) -> list[int]:
        """Every turn of `solutions` as an attempt of the run, in one transaction; the final-turn attempt ids. A
        question not stored yet (one request to a server) becomes a problem of the run's dataset in it too."""
        with transaction(self.db) as session:
            new = [s.question for s in solutions if s.question.problem_id is None]
            if new and self.dataset is not None:
                stored = {q.external_id: q for q in store.import_questions(session, self.dataset, new)}
                solutions = [
                    s if s.question.problem_id is not None else replace(s, question=stored[s.question.external_id])
                    for s in solutions
                ]
            # a server's run may not evict (its role's privileges): its evidence retires lessons at the next training
            # or evaluation write of them
            retire = self.kind != "serve"
            return store.record_solutions(session, solutions, self._opened(), self.version_id, retire)

    def record_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        """Store the run's figures (`name -> value` at `step`)."""
        with transaction(self.db) as session:
            record_metrics(session, self._opened(), step, metrics)

    def _opened(self) -> int:
        if self.run_id is None:
            raise RuntimeError(f"run {self.name!r} is not open: call open() first")
        return self.run_id


@contextmanager
def answering(run: InferenceRun | None, total: int, desc: str, show: bool = True) -> Iterator[tuple[tqdm, OnBatch]]:
    """The work of `run` (None: nothing is recorded) under a progress bar over `total` problems on stderr: yields the
    bar and the `on_batch` callback that records each batch in the run and moves the bar. The run is marked failed
    if the body raises, finished if it returns."""
    bar = tqdm(total=total, unit="problem", desc=desc, file=sys.stderr, disable=not show, dynamic_ncols=True)

    def keep(batch: list[Solution]) -> None:
        if run is not None:
            run.record(batch)
        bar.update(len(batch))

    try:
        with run.running() if run is not None else nullcontext():
            yield bar, keep
    finally:
        bar.close()
