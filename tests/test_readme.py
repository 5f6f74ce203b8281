"""The README's SQL recipes run: every `lanpo sql "..."` and `lanpo sql --file F` it shows, on a filled store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db.readonly import query_readonly
from tests.db.store_helpers import make_attempts, make_experiences, make_problems, relevance

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _sql_commands() -> list[str]:
    """Each `lanpo sql ...` invocation in a README code block (a quoted statement may span lines)."""
    found = []
    for match in re.finditer(r'lanpo sql (?:"(?P<q>[^"]+)"|--file (?P<f>[^\s`]+))', README):
        if match.group("q"):
            found.append(" ".join(match.group("q").split()))
        else:
            found.append((ROOT / match.group("f")).read_text())
    return found


def test_readme_shows_at_least_five_sql_recipes() -> None:
    assert len(_sql_commands()) >= 5


def _fill(session: Session) -> None:
    first, second = make_problems(session, 2)
    make_attempts(session, first, 3, reward=1.0)
    make_attempts(session, second, 2, reward=0.0)
    make_experiences(session, first, 2)
    relevance(session, second, first, 0.95)
    session.commit()


@pytest.mark.parametrize("statement", _sql_commands(), ids=lambda s: " ".join(s.split()[:3])[:40])
def test_readme_sql_runs(db: Engine, session: Session, statement: str) -> None:
    _fill(session)
    result = query_readonly(db, statement)
    assert result.columns  # a SELECT: it returned a result set
