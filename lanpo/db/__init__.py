"""The experience store: connection, embedded server, ORM models, migrations and repositories."""
