"""Alembic environment: lanpo's models as target metadata; the URL comes from lanpo (never from alembic.ini)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from lanpo.db.connection import database_url, make_db
from lanpo.db.models import Base

config = context.config
target_metadata = Base.metadata


def _include_object(obj, name, type_, reflected, compare_to):
    # Views and the immutability trigger live in SQL the revisions carry; nothing else is excluded.
    return not (type_ == "table" and name == "alembic_version")


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url") or database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        include_object=_include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    db = make_db(config.get_main_option("sqlalchemy.url") or None, poolclass=pool.NullPool)
    with db.connect() as connection:
        _run(connection)
    db.dispose()


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_object=_include_object,
        compare_type=True,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
