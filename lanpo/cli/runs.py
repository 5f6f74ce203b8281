"""`lanpo runs`: every run, its status as its heartbeat tells it; `lanpo runs fail` for runs whose process died.

A process killed outright (SIGKILL, a lost machine, the OOM killer) cannot mark its run failed: the run stays
`running` and its heartbeat stops (`lanpo.db.heartbeat`). Here such a run reads `stale` (silent past the bound) or
`dead` (its pid is gone on this machine), with the command that marks it failed. `lanpo train --resume` takes such a
run over without it. `lanpo runs workers` shows the rollout workers of asynchronous runs (`[workers]`), as the
queue sees them: a worker's liveness is its claim's lease.
"""

from __future__ import annotations

from collections.abc import Sequence

import click
from sqlalchemy.orm import Session

from lanpo.cli.params import Float
from lanpo.db.connection import connect, transaction
from lanpo.db.heartbeat import STALE_AFTER_S
from lanpo.db.models import RUN_KINDS
from lanpo.db.repo import queue as queue_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.errors import InputError

STALE_OPTION = click.option(
    "--stale-after",
    "stale_after",
    default=STALE_AFTER_S,
    show_default=True,
    type=Float(1),
    help="Seconds without a heartbeat after which a running run counts as lost.",
)


@click.group("runs", invoke_without_command=True)
@click.option("--kind", default=None, type=click.Choice(RUN_KINDS), help="Only runs of this kind.")
@click.option("--running", "only_running", is_flag=True, help="Only runs still marked running (alive, stale or dead).")
@STALE_OPTION
@click.pass_context
def command(ctx: click.Context, kind: str | None, only_running: bool, stale_after: float) -> None:
    """Every run: kind, status (a running run's as its heartbeat tells it), last committed step, start, heartbeat.

    A run whose process died reads `stale` or `dead`; `lanpo runs fail NAME` marks it failed (`lanpo train
    --resume` continues it without that)."""
    if ctx.invoked_subcommand is not None:
        return
    with transaction(connect()) as session:
        rows = runs_repo.list_runs(session)
    rows = [r for r in rows if (kind is None or r.kind == kind) and (not only_running or r.status == "running")]
    if not rows:
        click.echo("no runs" + (" matching" if kind or only_running else " yet (lanpo train starts one)"))
        return
    width = max(4, *(len(r.name) for r in rows))
    click.echo(f"{'id':>5}  {'name':<{width}}  {'kind':<6} {'status':<8} {'step':>5}  {'started':<16}  heartbeat")
    lost = []
    for r in rows:
        state = r.liveness(stale_after)
        status = r.status if state.state == "done" else state.state if state.lost else "running"
        beat = "-" if state.state == "done" else state.why
        step = "-" if r.last_step is None else str(r.last_step)
        started = r.started_at.strftime("%Y-%m-%d %H:%M")
        click.echo(f"{r.id:>5}  {r.name:<{width}}  {r.kind:<6} {status:<8} {step:>5}  {started:<16}  {beat}")
        if state.lost:
            lost.append(r.name)
    if lost:
        names = " ".join(_quoted(n) for n in lost)
        click.echo(f"\n{len(lost)} run(s) lost their process: `lanpo runs fail {names}` marks them failed", err=True)


@command.command("fail")
@click.argument("names", nargs=-1)
@click.option("--stale", "all_lost", is_flag=True, help="Every running run that lost its process.")
@STALE_OPTION
def fail_cmd(names: Sequence[str], all_lost: bool, stale_after: float) -> None:
    """Mark runs NAMES (or, with --stale, every lost one) failed. Refused for a run whose process is alive."""
    if not names and not all_lost:
        raise InputError("name the runs to mark failed, or pass --stale", hint="lanpo runs lists them")
    with transaction(connect()) as session:
        rows = _named_runs(session, names) if names else runs_repo.list_runs(session)
        chosen = []
        for r in rows:
            state = r.liveness(stale_after)
            if state.state == "done":
                if names:
                    raise InputError(f"run {r.name!r} already {r.status}", hint="only a running run can be marked")
                continue
            if not state.lost:
                if names:
                    raise InputError(
                        f"run {r.name!r} is alive: {state.why}",
                        hint=f"stop its process first, or wait until it has been silent {stale_after:.0f} s",
                    )
                continue
            chosen.append((r, state))
        for r, _ in chosen:  # all or nothing: one transaction
            runs_repo.finish_run(session, r.id, "failed")
    for r, state in chosen:
        click.echo(f"run {r.name!r} marked failed ({state.why}; last committed step {r.last_step or '-'})")
    if not chosen:
        click.echo("no run lost its process")


@command.command("workers")
@click.argument("names", nargs=-1)
def workers_cmd(names: Sequence[str]) -> None:
    """The rollout workers of runs NAMES (default: every run): the step each holds, the seconds left on its lease
    (a lease that ran out reads `lapsed`: the next claim redoes that step), the steps it finished, and how long ago
    its last one was. A worker appears once it has claimed a step."""
    with transaction(connect()) as session:
        if names:
            _named_runs(session, names)
        rows = queue_repo.workers(session, list(names) or None)
    if not rows:
        click.echo(
            "no rollout workers" + (" for these runs" if names else " yet") + " (lanpo worker --run NAME starts one)"
        )
        return
    run_w = max(3, *(len(r.run) for r in rows))
    worker_w = max(6, *(len(r.worker) for r in rows))
    click.echo(f"{'run':<{run_w}}  {'worker':<{worker_w}}  {'holds':>5}  {'lease':>8}  {'finished':>8}  last finished")
    for r in rows:
        holds = "-" if r.holding is None else str(r.holding)
        lease = "-" if r.lease_left_s is None else "lapsed" if r.lease_left_s < 0 else f"{r.lease_left_s:.0f}s"
        last = "-" if r.last_finished_age_s is None else f"{r.last_finished_age_s:.0f}s ago"
        click.echo(f"{r.run:<{run_w}}  {r.worker:<{worker_w}}  {holds:>5}  {lease:>8}  {r.finished:>8}  {last}")


def _named_runs(session: Session, names: Sequence[str]) -> list[runs_repo.RunRow]:
    """The runs `names` names; InputError for the first name no run has."""
    rows = runs_repo.list_runs(session, names)
    missing = sorted(set(names) - {r.name for r in rows})
    if missing:
        raise InputError(f"no run named {missing[0]!r}", hint=runs_repo.LIST_RUNS)
    return rows


def _quoted(name: str) -> str:
    return name if name.replace("-", "").replace("_", "").replace(".", "").isalnum() else repr(name)
