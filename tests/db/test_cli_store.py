"""`lanpo pool ...` and `lanpo sql` end to end against the test database."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from store_helpers import fill_history, relevance


def test_pool_stats(session: Session, run_cli: Callable) -> None:
    fill_history(session)
    session.commit()
    out = run_cli("pool", "stats").out
    assert "problems:              3" in out
    assert "experiences active:    1" in out and "experiences evicted:   1" in out
    assert "attempts:              6" in out
    assert "pool size per problem: min 0, median 0, max 1" in out


def test_pool_sample_and_context(session: Session, run_cli: Callable) -> None:
    ids = fill_history(session)
    relevance(session, ids["a"], ids["b"], 0.97)
    session.commit()
    inter = run_cli("pool", "sample", "--problem", "d:0", "--mode", "inter", "--k", "2", "--scorer", "s", "--json")
    assert inter.code == 0, inter.err
    row = json.loads(inter.out)
    assert row["problem_id"] == ids["a"]
    assert [i["summary"] for i in row["items"]] == ["lesson of b"] and row["items"][0]["score"] == 0.97
    intra = run_cli("pool", "sample", "--problem", str(ids["a"]), "--mode", "intra", "--k", "3", "--seed", "4")
    assert intra.out.startswith(f"problem {ids['a']}: 3 item(s)")
    ctx = run_cli("pool", "context", "--problem", "d:0", "--mode", "inter", "--scorer", "s")
    assert ctx.code == 0 and "lesson of b" in ctx.out
    full = run_cli("pool", "context", "--problem", "d:0", "--mode", "inter", "--scorer", "s", "--messages")
    assert "question 0?" in full.out and "lesson of b" in full.out
    empty = run_cli("pool", "context", "--problem", "d:2", "--mode", "inter", "--scorer", "s")
    assert "no inter context" in empty.out
    no_scorer = run_cli("pool", "sample", "--problem", "d:0", "--mode", "inter")
    assert no_scorer.code == 2 and "--scorer" in no_scorer.err and "scorers in the store: s" in no_scorer.err
    unknown = run_cli("pool", "sample", "--problem", "d:999", "--mode", "intra")
    assert unknown.code == 2 and "no problem '999' in dataset 'd'" in unknown.err
    bad = run_cli("pool", "sample", "--problem", "12345", "--mode", "intra")
    assert bad.code == 2 and "unknown problem id: 12345" in bad.err


def test_sql_cli_formats_and_refuses_writes(session: Session, run_cli: Callable, tmp_path: Path) -> None:
    fill_history(session)
    session.commit()
    table = run_cli("sql", "SELECT dataset, count(*) AS n FROM problems GROUP BY dataset")
    assert table.code == 0 and "dataset | n" in table.out and "(1 row)" in table.out
    as_json = run_cli("sql", "SELECT external_id, metadata FROM problems ORDER BY id LIMIT 1", "--format", "json")
    assert json.loads(as_json.out) == [{"external_id": "0", "metadata": {"i": 0}}]
    as_csv = run_cli("sql", "SELECT step, mode, attempts FROM run_rewards ORDER BY step, mode", "--format", "csv")
    assert as_csv.out.splitlines()[:2] == ["step,mode,attempts", "0,all,4"]
    percent = run_cli("sql", "SELECT 'a%b' AS x, now() AS t, CAST(1.5 AS numeric) AS n", "--format", "json")
    row = json.loads(percent.out)[0]
    assert row["x"] == "a%b" and row["n"] == 1.5 and row["t"][:2] == "20"
    f = tmp_path / "q.sql"
    f.write_text("-- a comment\nSELECT count(*) AS pool FROM pool_current;\n")
    assert "1" in run_cli("sql", "--file", f).out
    refused = run_cli("sql", "DELETE FROM attempts")
    assert refused.code == 2 and "read-only" in refused.err and "nothing was changed" in refused.err
    assert session.scalar(sa.text("SELECT count(*) FROM attempts")) == 6
    neither = run_cli("sql")
    assert neither.code == 2 and "either a STATEMENT or --file" in neither.err


def test_sql_cli_limits_and_refusals(
    session: Session, run_cli: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_history(session)
    session.commit()
    note = "showing the first 3 rows; the query returned more (use LIMIT or --max-rows)"
    table = run_cli("sql", "SELECT generate_series(1, 10) AS n", "--max-rows", "3")
    assert table.code == 0 and table.out.rstrip().endswith(f"(3 rows)\n{note}") and table.err == ""
    as_csv = run_cli("sql", "SELECT generate_series(1, 10) AS n", "--max-rows", "3", "--format", "csv")
    assert as_csv.out.split() == ["n", "1", "2", "3"] and as_csv.err.strip() == note
    as_json = run_cli("sql", "SELECT generate_series(1, 10) AS n", "--max-rows", "3", "--format", "json")
    assert json.loads(as_json.out) == [{"n": 1}, {"n": 2}, {"n": 3}] and as_json.err.strip() == note
    whole = run_cli("sql", "SELECT generate_series(1, 1500) AS n", "--max-rows", "0", "--format", "csv")
    assert len(whole.out.split()) == 1501 and whole.err == ""

    slow = run_cli("sql", "SELECT pg_sleep(3)", "--timeout", "0.3")
    assert slow.code == 2 and slow.err.startswith("error: the statement ran past 0.3 s and was cancelled")
    assert "--timeout SECONDS (or LANPO_SQL_TIMEOUT)" in slow.err
    monkeypatch.setenv("LANPO_SQL_TIMEOUT", "0.2")
    assert "ran past 0.2 s" in run_cli("sql", "SELECT pg_sleep(3)").err
    bad = run_cli("sql", "SELECT 1", "--timeout", "0")
    assert bad.code == 2 and "above 0 s" in bad.err

    comments = tmp_path / "empty.sql"
    comments.write_text("-- just a note\n\n")
    only = run_cli("sql", "--file", comments)
    assert only.code == 2 and only.err.startswith(f"error: no SQL statement in {comments}: only comments")

    attack = run_cli("sql", f"COPY (SELECT 1) TO PROGRAM 'touch {tmp_path / 'pwned'}'")
    lines = attack.err.splitlines()
    assert attack.code == 2 and len(lines) == 2 and attack.out == ""
    assert lines[0].startswith("error: refused: ") and lines[0].endswith("nothing was changed")
    assert lines[1].startswith("  hint: ")
    assert not (tmp_path / "pwned").exists()


def test_unreachable_and_not_migrated(
    run_cli: Callable, monkeypatch: pytest.MonkeyPatch, db: Engine, pg_url: str
) -> None:
    from lanpo.db import migrate

    monkeypatch.setenv("LANPO_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    for args in (("pool", "stats"), ("sql", "SELECT 1"), ("data", "import", "x.jsonl", "--dataset", "d")):
        result = run_cli(*args)
        assert result.code == 2 and "cannot reach the database" in result.err, args
    monkeypatch.setenv("LANPO_DATABASE_URL", pg_url)
    migrate.downgrade(db, "0001")
    try:
        result = run_cli("pool", "stats")
        assert result.code == 2 and "lanpo db upgrade" in result.err
    finally:
        migrate.upgrade(db)
