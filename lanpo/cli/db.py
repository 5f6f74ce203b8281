"""`lanpo db ...`: where the store is, the embedded server's life cycle, and migrations."""

from __future__ import annotations

import click

from lanpo.config import lanpo_home
from lanpo.db import engine as db_engine
from lanpo.db import migrate, server


@click.group("db")
def command() -> None:
    """The experience store: server and schema."""


@command.command("url")
def url_cmd() -> None:
    """Print the database URL lanpo uses (starts the embedded server if needed)."""
    url = db_engine.database_url()
    click.echo(db_engine.make_engine(url).url.render_as_string(hide_password=True))


@command.command("start")
def start_cmd() -> None:
    """Start the embedded Postgres (a no-op when it runs, or when LANPO_DATABASE_URL is set)."""
    if not db_engine.is_embedded():
        click.echo("LANPO_DATABASE_URL is set: lanpo uses that server and starts none of its own")
        return
    server.start(lanpo_home())
    state = server.status(lanpo_home())
    click.echo(f"embedded Postgres running (pid {state.pid}, data in {state.pgdata})")


@command.command("stop")
def stop_cmd() -> None:
    """Stop the embedded Postgres (committed data stays in $LANPO_HOME/pgdata)."""
    if not db_engine.is_embedded():
        click.echo("LANPO_DATABASE_URL is set: lanpo does not manage that server")
        return
    stopped = server.stop(lanpo_home())
    click.echo("embedded Postgres stopped" if stopped else "embedded Postgres was not running")


@command.command("status")
def status_cmd() -> None:
    """Say which server is used, whether it answers, and the schema revision."""
    if db_engine.is_embedded():
        state = server.status(lanpo_home())
        click.echo(f"server:   embedded, data in {state.pgdata}")
        click.echo(f"running:  {'yes, pid ' + str(state.pid) if state.running else 'no (starts on first use)'}")
        if not state.running:
            return
    else:
        click.echo("server:   LANPO_DATABASE_URL")
    engine = db_engine.make_engine()
    revision = db_engine.current_revision(engine)
    head = migrate.head_revision()
    click.echo(f"url:      {engine.url.render_as_string(hide_password=True)}")
    click.echo(
        f"revision: {revision or 'none'} (head {head}){'' if revision == head else ' -> run `lanpo db upgrade`'}"
    )


@command.command("upgrade")
@click.argument("revision", default="head")
def upgrade_cmd(revision: str) -> None:
    """Migrate the schema up to REVISION (default: head). Safe to run again."""
    engine = db_engine.make_engine()
    before = db_engine.current_revision(engine)
    migrate.upgrade(engine, revision)
    after = db_engine.current_revision(engine)
    click.echo(f"schema at {after}" + ("" if before == after else f" (was {before or 'empty'})"))


@command.command("downgrade")
@click.argument("revision")
def downgrade_cmd(revision: str) -> None:
    """Migrate the schema down to REVISION ('base' drops every lanpo table and its data)."""
    engine = db_engine.make_engine()
    migrate.downgrade(engine, revision)
    click.echo(f"schema at {db_engine.current_revision(engine) or 'base (empty)'}")


@command.command("current")
def current_cmd() -> None:
    """Print the schema revision the database is at."""
    click.echo(db_engine.current_revision(db_engine.make_engine()) or "none")
