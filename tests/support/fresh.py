"""A database with nothing in it, as a project has before its first ``migrate``.

``fresh_database(alias, tmp_dir)`` adds ``alias`` to Django's connections for
the block, pointing at a new, empty database beside the test database: a
SQLite file in ``tmp_dir``, or a PostgreSQL database of its own on the test
server (a unique name, dropped at the end). Nothing is migrated there, not
even ``django_migrations``. The test's own database is never touched.
"""

import os
import secrets
from contextlib import contextmanager
from pathlib import Path

from django.db import connections

from tests.support.ci import unavailable


@contextmanager
def fresh_database(alias: str, tmp_dir: Path):
    """Run the block with ``connections[alias]`` on an empty database; remove both after."""
    base = connections["default"].settings_dict
    if connections["default"].vendor == "sqlite":
        name = str(tmp_dir / f"{alias}.sqlite3")
        drop = lambda: Path(name).unlink(missing_ok=True)  # noqa: E731
    else:
        name = f"soniq_fresh_{os.getpid()}_{secrets.token_hex(4)}"
        _server(f'CREATE DATABASE "{name}"')
        drop = lambda: _server(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # noqa: E731
    connections.settings[alias] = {**base, "NAME": name, "TEST": {"NAME": name}}
    try:
        yield alias
    finally:
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]
        drop()


def _server(sql: str) -> None:
    """Run one statement on the test server's maintenance database, outside any transaction."""
    import psycopg

    params = connections["default"].get_connection_params()
    params["dbname"] = "postgres"
    try:
        with psycopg.connect(**params, autocommit=True) as server:
            server.execute(sql)
    except psycopg.OperationalError:
        unavailable("no PostgreSQL server to make an empty database on")
