"""`lanpo pool ...`: the named experience pools, what is in one, and what a feedback context would look like.

Problem ids on the command line are the numeric `problems.id` or `dataset:external_id`. `--pool NAME` picks the
pool; it may be left out when the store holds only one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from statistics import median

import click
from sqlalchemy.orm import Session

from lanpo import feedback_modes
from lanpo.cli import pool_history
from lanpo.cli.params import SEED, Float, Int, field_option
from lanpo.db import sqlfiles
from lanpo.db.connection import connect, transaction
from lanpo.db.repo import contexts, pools, problems
from lanpo.errors import InputError, listing
from lanpo.feedback.config import FeedbackConfig, InterConfig

PROBLEM_HELP = "Problem: numeric problems.id or dataset:external_id (repeatable)."
POOL_HELP = "Experience pool (default: the only pool in the store; `lanpo pool list` names them)."


def render(mode: str, items: Sequence[object]) -> str:
    """The context text of `items`, exactly as a prompt in `mode` shows it."""
    return feedback_modes.render_context(mode, items)


@click.group("pool")
def command() -> None:
    """Experience pools: list them; statistics, weighted draws and rendered feedback contexts of one; a lesson's
    history, and its retirement by hand."""


command.add_command(pool_history.retire_cmd)
command.add_command(pool_history.history_cmd)


@command.command("list")
def list_cmd() -> None:
    """Every pool with its capacity settings, active / evicted experiences and the runs that use it."""
    with transaction(connect()) as session:
        found = pools.list_pools(session)
    if not found:
        click.echo("no pools yet (a training run creates one named after it)")
        return
    header = f"{'pool':<24} {'active':>7} {'evicted':>8}  {'caps (problem/step/global)':<27} {'eviction':<16} runs"
    click.echo(header)
    for s in found:
        p = s.pool
        caps = f"{p.per_problem_cap}/{p.per_step_cap}/{p.global_cap if p.global_cap is not None else '-'}"
        click.echo(f"{p.name:<24} {s.active:>7} {s.evicted:>8}  {caps:<27} {p.eviction:<16} {s.runs}")


@command.command("stats")
@click.option("--dataset", default=None, help="Only problems of this dataset (default: all).")
@click.option("--pool", "pool_name", default=None, help="Only this pool's experiences (default: every pool).")
def stats_cmd(dataset: str | None, pool_name: str | None) -> None:
    """Problems, active / evicted experiences, attempts, and per-problem pool sizes (min / median / max)."""
    with transaction(connect()) as session:
        if dataset is not None:
            problems.problem_ids(session, dataset)  # unknown dataset -> clear error
        pool_id = None if pool_name is None else pools.get_pool(session, pool_name).id
        params = {"dataset": dataset, "pool_id": pool_id}
        row = session.execute(sqlfiles.load("queries/pool_stats"), params).one()
        sizes = list(session.scalars(sqlfiles.load("queries/pool_sizes"), params))
    if pool_name is not None:
        click.echo(f"pool:                  {pool_name}")
    click.echo(f"problems:              {row.problems}")
    click.echo(f"experiences active:    {row.active}")
    click.echo(f"experiences evicted:   {row.evicted}")
    click.echo(f"attempts:              {row.attempts}")
    if sizes:
        click.echo(f"pool size per problem: min {min(sizes)}, median {median(sizes):g}, max {max(sizes)}")


@dataclasses.dataclass(frozen=True)
class DrawRequest:
    """What `pool sample` and `pool context` draw from: the problems, the mode and the trainer's draw settings."""

    refs: tuple[str, ...]
    mode: str
    k: int
    seed: int
    candidates: int
    gamma: float
    scorer: str | None
    pool_name: str | None
    run_id: int | None


def _mode_options(f: Callable[..., None]) -> Callable[..., None]:
    """The draw's options on a command, handed to it bundled as its first argument, a `DrawRequest`."""
    names = [field.name for field in dataclasses.fields(DrawRequest)]

    @functools.wraps(f)
    def bundled(**kwargs: object) -> None:
        f(DrawRequest(**{name: kwargs.pop(name) for name in names}), **kwargs)  # type: ignore[arg-type]

    for option in reversed(
        [
            click.option("--problem", "refs", multiple=True, required=True, help=PROBLEM_HELP),
            click.option(
                "--mode",
                type=click.Choice(["intra", "inter"]),
                required=True,
                help="intra: own earlier attempts; inter: lessons of other relevant problems.",
            ),
            # defaults and help are the trainer's feedback.* and feedback.inter.* (k >= 1 as there: a draw of nothing
            # shows nothing)
            field_option(FeedbackConfig, "k", type=Int(1)),
            click.option("--seed", default=0, show_default=True, type=SEED, help="Seed (same seed, same draw)."),
            field_option(FeedbackConfig, "candidates", type=Int(1)),
            field_option(
                InterConfig, "gamma", type=Float(0, 1), help="inter: minimum relevance (0: no relevance filter)."
            ),
            click.option("--scorer", default=None, help="inter: relevance scorer whose scores to use."),
            click.option("--pool", "pool_name", default=None, help="inter: " + POOL_HELP),
            click.option("--run", "run_id", default=None, type=int, help="intra: only attempts of this run id."),
        ]
    ):
        bundled = option(bundled)
    return bundled


Items = dict[int, list[contexts.IntraItem]] | dict[int, list[contexts.InterItem]]


def _draw(session: Session, draw: DrawRequest) -> tuple[list[int], Items]:
    ids = problems.resolve_refs(session, list(draw.refs))
    k, candidates, seed = draw.k, draw.candidates, draw.seed
    if draw.mode == "intra":
        return ids, contexts.intra_contexts(session, ids, k=k, candidates=candidates, seed=seed, run_id=draw.run_id)
    pool = pools.resolve_pool(session, draw.pool_name)
    if not draw.scorer:
        known = contexts.scorers(session)
        raise InputError(
            "--mode inter needs --scorer",
            hint=f"scorers in the store: {listing(known)}" if known else "compute relevance first (lanpo relevance)",
        )
    return ids, contexts.inter_contexts(
        session, ids, k=k, candidates=candidates, seed=seed, gamma=draw.gamma, scorer=draw.scorer, pool_id=pool.id
    )


@command.command("sample")
@_mode_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per problem instead of a table.")
def sample_cmd(draw: DrawRequest, as_json: bool) -> None:
    """Draw K feedback items per problem, exactly as the trainer would (weighted, without replacement)."""
    with transaction(connect()) as session:
        ids, drawn = _draw(session, draw)
    for pid in ids:
        items = drawn.get(pid, [])
        if as_json:
            click.echo(json.dumps({"problem_id": pid, "items": [dataclasses.asdict(i) for i in items]}))
            continue
        click.echo(f"problem {pid}: {len(items)} item(s)")
        for pos, item in enumerate(items):
            if isinstance(item, contexts.IntraItem):
                line = f"  [{pos}] attempt {item.attempt_id}: {_short(item.response)}"
            else:
                line = (
                    f"  [{pos}] version {item.experience_version_id} (problem {item.source_problem_id}, "
                    f"relevance {item.score:.3f}): {_short(item.summary)}"
                )
            click.echo(line)


def _short(text: str, width: int = 80) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


@command.command("context")
@_mode_options
@click.option("--messages", is_flag=True, help="Print the whole chat prompt (lanpo.prompts), not only the context.")
def context_cmd(draw: DrawRequest, messages: bool) -> None:
    """Print the exact context text that would go into the prompt of each problem."""
    with transaction(connect()) as session:
        ids, drawn = _draw(session, draw)
        rows = {p.id: p for p in problems.problems_by_ids(session, ids)}
    for n, pid in enumerate(ids):
        if len(ids) > 1:
            click.echo(("\n" if n else "") + f"=== problem {pid} ({rows[pid].dataset}:{rows[pid].external_id}) ===")
        items = drawn.get(pid, [])
        if messages:
            from lanpo.feedback_modes import build_messages

            for message in build_messages(draw.mode, rows[pid].question, items):
                click.echo(f"--- {message['role']} ---\n{message['content']}")
        elif items:
            click.echo(render(draw.mode, items))
        else:
            why = _no_candidates(draw.mode, draw.run_id, draw.gamma, draw.scorer)
            click.echo(f"(no {draw.mode} context for problem {pid}: {why})")


def _no_candidates(mode: str, run_id: int | None, gamma: float, scorer: str | None) -> str:
    """Why a draw came back empty, in the terms the draw used (the pool itself may hold plenty)."""
    if mode == "intra":
        where = f" in run {run_id}" if run_id is not None else ""
        return f"no earlier attempt on it{where}; the prompt would be zero-shot"
    return (
        f"no active experience of another problem has relevance >= {gamma:g} by scorer {scorer!r}; "
        "the prompt would be zero-shot"
    )
