"""`lanpo pool retire` and `lanpo pool history` end to end against the test database: a retirement shows in the
lesson's history; every refused retirement exits 2 with one error line and a hint, and writes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from lesson_helpers import MERGE_SIMILARITY, USEFULNESS, fill_lesson_life
from sqlalchemy.orm import Session
from store_helpers import fill_history, make_pool

LESSONS = sa.text("SELECT * FROM experiences ORDER BY id")


@pytest.fixture
def life(session: Session) -> dict[str, int]:
    ids = fill_history(session)
    life = fill_lesson_life(session, ids)
    make_pool(session, "other")
    session.commit()
    return {**ids, **life}


def test_retire_then_history(session: Session, run_cli: Callable, life: dict[str, int]) -> None:
    lesson = life["lesson"]
    before = run_cli("pool", "history", str(lesson))
    assert before.code == 0, before.err
    assert before.out.splitlines()[:2] == [
        f"lesson {lesson}: pool hist, problem {life['b']}, kind summary, 3 version(s)", "state: active"
    ]  # fmt: skip
    done = run_cli("pool", "retire", str(lesson), "--reason", "too vague to help", "--pool", "hist")
    assert done.code == 0, done.err
    assert done.out.startswith(f"retired lesson {lesson} of pool hist at ") and done.out.rstrip().endswith(
        ": too vague to help"
    )
    row = session.execute(sa.text("SELECT evicted_by, evicted_note, evicted_run_id FROM experiences WHERE id = :e"),
                          {"e": lesson}).one()  # fmt: skip
    assert tuple(row) == ("manual:retired", "too vague to help", None)
    assert lesson not in session.scalars(sa.text("SELECT experience_id FROM pool_current")).all()

    shown = run_cli("pool", "history", str(lesson)).out.splitlines()
    assert shown[1].startswith("state: retired by hand (manual:retired) at ")
    assert shown[1].endswith(': "too vague to help"')
    assert shown[2].split() == ["v", "reason", "sim", "author", "policy", "run/step", "uses", "helped", "hurt",
                                "even", "unknown", "lift", "95%", "CI", "probation", "text"]  # fmt: skip
    v1, v2, v3 = shown[3].split(), shown[4].split(), shown[5].split()
    assert v1[:2] == ["1", "new"] and v1[-12:-6] + v1[-3:] == ["6", "1", "3", "1", "1", "-0.250", "lesson", "of", "b"]
    var = session.scalar(sa.text("SELECT credit_var FROM lesson_usefulness WHERE version_id = :v"), {"v": life["v1"]})
    half = 1.96 * var**0.5 / 6  # lift -+ 1.96 standard errors over 6 graded attempts
    assert v1[-6:-4] == [f"[{-0.25 - half:+.3f},", f"{-0.25 + half:+.3f}]"]
    # the interval lies below 0; a retirement by hand ('manual:retired') leaves each version's evidence state
    assert -0.25 + half < 0 and v1[-4] == "hurts"
    assert v2[0] == "2" and v2[-7:-4] == ["-", "-", "untried"] and shown[4].endswith("lesson of b, rewritten")
    assert v3[:5] == ["*3", "merge:newer", "0.930", "m", "-"] and v3[5] == f"{life['run']}/2"
    assert v3[6:12] == ["2", "2", "0", "0", "0", "+0.500"] and shown[5].endswith("lesson of b, merged")
    assert v3[12:15] == ["[+0.500,", "+0.500]", "helps"]  # its usefulness row written by hand: no variance

    data = json.loads(run_cli("pool", "history", str(lesson), "--json").out)
    assert (data["experience_id"], data["active"], data["evicted_by"], data["evicted_note"]) == (
        lesson, False, "manual:retired", "too vague to help"
    )  # fmt: skip
    versions = data["versions"]
    columns = set(session.execute(sa.text("SELECT * FROM lesson_history LIMIT 0")).keys())
    assert {k for k in data if k != "versions"} | set(versions[0]) == columns  # every column of the view
    assert [v["source_attempt_id"] is not None for v in versions] == [
        r is not None for r in session.scalars(
            sa.text("SELECT source_attempt_id FROM experience_versions WHERE experience_id = :e ORDER BY version"),
            {"e": lesson})
    ]  # fmt: skip
    assert [(v["version"], v["version_id"], v["is_current"]) for v in versions] == [
        (1, life["v1"], False), (2, life["v2"], False), (3, life["v3"], True)
    ]  # fmt: skip
    assert [(v["uses"], v["helped"], v["hurt"], v["even"], v["unknown"], v["graded"], v["credit"])
            for v in versions] == [USEFULNESS[1], (0, 0, 0, 0, 0, 0, 0.0), USEFULNESS[3]]  # fmt: skip
    assert [v["lift"] for v in versions] == [-0.25, None, 0.5]
    assert [v["probation"] for v in versions] == ["hurts", "untried", "helps"]
    assert versions[2]["similarity"] == MERGE_SIMILARITY and versions[2]["summary"] == "lesson of b, merged"


def test_history_of_an_evicted_lesson_and_of_none(run_cli: Callable, life: dict[str, int]) -> None:
    evicted = run_cli("pool", "history", str(life["evicted"]))
    assert evicted.code == 0, evicted.err
    state = evicted.out.splitlines()[1]
    assert state.startswith("state: evicted (per_problem:oldest) at ")
    assert state.endswith(f" in run {life['run']} step 1")
    expired = run_cli("pool", "history", str(life["lesson_c"])).out.splitlines()[1]
    assert "expired:policy_age" in expired and expired.endswith(" step 2")
    missing = run_cli("pool", "history", "987654")
    assert missing.code == 2 and missing.err.splitlines()[0] == "error: no lesson with id 987654"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["987654", "--reason", "x"], "error: no lesson with id 987654"),
        (["0", "--reason", "x"], "error: lesson id 0 is out of range"),
        (["{lesson}", "--reason", "  "], "error: the reason is empty"),
        (["{lesson}"], "error: missing option '--reason'"),
        (["{lesson}", "--reason", "x", "--pool", "other"], "error: lesson {lesson} is in pool 'hist', not the pool"),
        (["{lesson}", "--reason", "x", "--pool", "nope"], "error: no pool named 'nope'"),
        (["{lesson_a}", "--reason", "x"], "error: lesson {lesson_a} already left pool 'hist' at "),
        (["{evicted}", "--reason", "x"], "error: lesson {evicted} already left pool 'hist' at "),
    ],
)
def test_refused_retirements_write_nothing(
    session: Session, run_cli: Callable, life: dict[str, int], args: list[str], error: str
) -> None:
    before = session.execute(LESSONS).all()
    session.rollback()
    result = run_cli("pool", "retire", *(a.format(**life) for a in args))
    assert result.code == 2 and result.out == ""
    lines = result.err.splitlines()
    assert lines[0].startswith(error.format(**life)), result.err
    assert [line.startswith("error:") for line in lines] == [True, False] and lines[1].startswith("  hint: ")
    assert session.execute(LESSONS).all() == before
