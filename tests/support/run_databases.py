"""The PostgreSQL databases one test run made, and dropping what a killed run left behind.

A run's test database is named ``SONIQ_TEST_DATABASE_NAME`` (see
tests/settings.py); the tests that make databases of their own name them
after it (``<name>_plugin``, ``<name>_m<pid>_<hex>``, ``<name>_x<pid>_<hex>``).
A run that ends normally has dropped them all; one that was killed has not.
``scripts/run-tests`` calls this at exit, for the name it chose for the run::

    python -m tests.support.run_databases drop POSTGRES_URL NAME

It never prints the URL, and fails quietly: a server that is gone has no
databases left to drop.
"""

import sys

import psycopg
from psycopg import sql


def run_databases(connection: psycopg.Connection, name: str) -> list[str]:
    """The databases on the server that belong to the run called ``name``."""
    pattern = name.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "\\_%"
    rows = connection.execute(
        "SELECT datname FROM pg_database WHERE datname = %s OR datname LIKE %s ORDER BY datname",
        [name, pattern]).fetchall()
    return [row[0] for row in rows]


def drop_run_databases(url: str, name: str) -> list[str]:
    """Drop every database of the run ``name`` (closing their connections); return their names."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
        dropped = run_databases(connection, name)
        for database in dropped:
            connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(database)))
    return dropped


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "drop" or not argv[2]:
        print("usage: python -m tests.support.run_databases drop POSTGRES_URL NAME",
              file=sys.stderr)
        return 2
    try:
        drop_run_databases(argv[1], argv[2])
    except psycopg.Error:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
