"""`lanpo worker`: serve a training run's rollout queue (asynchronous GRPO) from this machine."""

from __future__ import annotations

import click

from lanpo.cli.params import field_option
from lanpo.train.config import WorkersConfig


@click.command("worker")
@click.option("--run", "run_name", required=True, help="The training run to serve (see `lanpo runs`).")
@field_option(
    WorkersConfig,
    "threads",
    type=click.IntRange(min=0),
    help="CPU threads of this worker's generation backend (0: every core).",
)
@click.option(
    "--lease-s",
    type=click.FloatRange(min=3),
    default=None,
    help="Seconds a claim lives unrenewed before another worker redoes it [default: the run's workers.lease_s].",
)
@click.option(
    "--model",
    default=None,
    help="Refuse unless the run trains this model (a check; the run's own model is what loads).",
)
@click.option(
    "--max-claims",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Stop after this many finished claims (0: when the run ends).",
)
def command(run_name: str, threads: int, lease_s: float | None, model: str | None, max_claims: int) -> None:
    """Generate, grade and summarise the steps a trainer queues in the store, with the newest committed policy.

    \b
    A worker needs LANPO_DATABASE_URL (the trainer's database) and the run's folder at the same path (its
    committed checkpoints are the policy versions it serves). It claims one step at a time with
    FOR UPDATE SKIP LOCKED under a lease it renews; if it dies, the claim is redone by another worker, and
    every finished step is written once. Start the run with workers.external = true (or `lanpo train
    --workers N` for local workers), then as many `lanpo worker --run NAME` as you like, on any machine.
    """
    from lanpo.db.connection import connect
    from lanpo.train.producer.worker import run_worker

    result = run_worker(connect(), run_name, threads, lease_s, model, max_claims)
    versions = ", ".join(map(str, result.versions)) or "none"
    click.echo(f"worker: {result.claims} steps generated, {result.lost} claims lost; policy steps served: {versions}")
