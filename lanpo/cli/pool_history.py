"""`lanpo pool retire` and `lanpo pool history`: retire a lesson by hand; show a lesson's chain of versions, its
state and each version's usefulness (the `lesson_history` view). Registered on the `lanpo pool` group."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime

import click

from lanpo.db.connection import connect, transaction
from lanpo.db.repo import lessons, pools


@click.command("retire")
@click.argument("lesson", type=int)
@click.option("--reason", required=True, help="Why it goes, in your words (kept as experiences.evicted_note).")
@click.option("--pool", "pool_name", default=None, help="Refuse unless the lesson is in this pool.")
def retire_cmd(lesson: int, reason: str, pool_name: str | None) -> None:
    """Retire the active lesson LESSON by hand: it leaves its pool now, with `evicted_by = 'manual:retired'` and
    the reason, and is never drawn again; its versions and their history stay. An unknown id, a lesson already
    retired or evicted, an empty reason or a lesson of another pool than `--pool` change nothing. No run or step
    names the retirement, so a resumed run's rollback does not bring the lesson back.

    LESSON: the lesson's experiences.id (`SELECT * FROM pool_current` lists the active ones).
    """
    with transaction(connect()) as session:
        pool_id = None if pool_name is None else pools.get_pool(session, pool_name).id
        done = lessons.retire(session, lesson, reason, pool_id)
    click.echo(f"retired lesson {done.experience_id} of pool {done.pool} at {_when(done.evicted_at)}: {done.note}")


@click.command("history")
@click.argument("lesson", type=int)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the lesson, its state and every version.")
def history_cmd(lesson: int, as_json: bool) -> None:
    """A lesson's chain: every version, oldest first, with why it exists, who wrote it and how it did, and the
    lesson's state (active, or evicted by what and when, with a person's note for a hand retirement).

    \b
    Columns, one row per version (* marks the current one, the text a prompt shows):
      v        the version number (1 is the lesson as first written)
      reason   new | rewrite | merge:newer | merge:higher_reward (a near-duplicate merged in, keeping that text)
      sim      a merge's cosine similarity to the version it supersedes (- for the others)
      author   the model that wrote the text
      policy   the step of the policy version whose weights wrote it
      run/step the run and training step whose transaction wrote the version
      uses     rollout groups whose prompt carried the version
      helped / hurt / even   uses whose graded correctness beat / fell below / matched the problem's zero-shot
               success under the same policy (exact, or in training estimated: docs/concepts.md)
      unknown  uses with no baseline or nothing graded
      lift     the version's own gain in the chance of a right answer over that baseline, the lessons drawn beside
               it integrated out (lesson_history.lift, docs/concepts.md; - with none graded)
      95% CI   lift's interval, lift -+ 1.96 standard errors (- with none graded)
      probation  the version's state (lesson_history.probation): retired (the lesson was retired by its record,
               retired:harmful), untried (nothing graded yet), helps (the interval lies above 0), hurts (below 0),
               trying (the interval spans 0: on probation still)
      text     the version's text, shortened (--json gives it whole, with every column of lesson_history)

    LESSON: the lesson's experiences.id (`SELECT * FROM pool_current` lists the active ones).
    """
    with transaction(connect()) as session:
        rows = lessons.history(session, lesson)
    if as_json:
        click.echo(json.dumps(_as_json(rows)))
        return
    first = rows[0]
    click.echo(
        f"lesson {first.experience_id}: pool {first.pool}, problem {first.source_problem_id}, kind {first.kind}, "
        f"{len(rows)} version(s)"
    )
    click.echo(f"state: {_state(first)}")
    header = (
        f"{'v':>3}  {'reason':<19} {'sim':>5}  {'author':<16} {'policy':>6} {'run/step':>9} "
        f"{'uses':>5} {'helped':>6} {'hurt':>5} {'even':>5} {'unknown':>7} {'lift':>7} {'95% CI':>16}  "
        f"{'probation':<9}  text"
    )
    click.echo(header)
    for r in rows:
        v = ("*" if r.is_current else " ") + str(r.version)
        click.echo(
            f"{v:>3}  {r.reason:<19} {_num(r.similarity, 3):>5}  {_short(r.author or '-', 16):<16} "
            f"{_num(r.policy_step):>6} {_run_step(r.run_id, r.step):>9} {r.uses:>5} {r.helped:>6} {r.hurt:>5} "
            f"{r.even:>5} {r.unknown:>7} {_num(r.lift, 3, signed=True):>7} {_interval(r):>16}  {r.probation:<9}  "
            f"{_short(r.summary, 60)}"
        )


def _state(r: lessons.HistoryRow) -> str:
    if r.active:
        return "active"
    assert r.evicted_at is not None
    where = f" in run {r.evicted_run_id} step {r.evicted_step}" if r.evicted_run_id is not None else ""
    note = f': "{r.evicted_note}"' if r.evicted_note else ""
    what = "retired by hand" if r.evicted_by == lessons.RETIRED_BY else "evicted"
    return f"{what} ({r.evicted_by}) at {_when(r.evicted_at)}{where}{note}"


def _interval(r: lessons.HistoryRow) -> str:
    if r.lift_low is None or r.lift_high is None:
        return "-"
    return f"[{r.lift_low:+.3f}, {r.lift_high:+.3f}]"


# the lesson's columns of lesson_history (they repeat on each version's row); every other column is the version's
LESSON_COLUMNS = ("experience_id", "pool_id", "pool", "source_problem_id", "kind", "active", "evicted_by",
                  "evicted_at", "evicted_run_id", "evicted_step", "evicted_note")  # fmt: skip


def _as_json(rows: list[lessons.HistoryRow]) -> dict[str, object]:
    """The lesson's columns once, and each version with every other column of lesson_history."""
    first = rows[0]
    version = [f.name for f in dataclasses.fields(lessons.HistoryRow) if f.name not in LESSON_COLUMNS]
    out: dict[str, object] = {name: _plain(getattr(first, name)) for name in LESSON_COLUMNS}
    out["versions"] = [{name: _plain(getattr(r, name)) for name in version} for r in rows]
    return out


def _plain(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value


def _when(at: datetime) -> str:
    return at.isoformat(sep=" ", timespec="seconds")


def _num(value: float | int | None, places: int = 0, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{places}f}" if signed else f"{value:.{places}f}"


def _run_step(run_id: int | None, step: int | None) -> str:
    return "-" if run_id is None and step is None else f"{run_id if run_id is not None else '-'}/{_num(step)}"


def _short(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."
