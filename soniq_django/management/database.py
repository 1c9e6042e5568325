"""The ``--database`` option of soniq's commands (without it, the routers pick the alias), and
what the commands say about a database whose soniq_django migrations have not run.

A project that keeps soniq_django's tables in a database of their own (a
router, see docs/deployment.md) runs ``soniq_worker`` and the rest without
naming it, as it runs ``manage.py shell`` without naming ``default``.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from ..errors import MigrationsNotApplied, translate
from ..producer.api import read_alias, write_alias


def add_database_argument(parser: CommandParser, *, reads: bool = False) -> None:
    """Add ``--database ALIAS``; its default is the routers' write (or ``reads``: read) alias."""
    which = "read" if reads else "write"
    parser.add_argument(
        "--database", default=None,
        help=f"Database alias (default: the database routers' {which} alias for soniq's "
             "jobs; 'default' without routers).")


def database_alias(options: dict[str, Any], *, reads: bool = False) -> str:
    """The alias a command runs on: ``--database``, else the routers' choice.

    Raises ``CommandError`` when the alias is not in ``DATABASES``.
    """
    chosen = options["database"]
    alias = read_alias(chosen) if reads else write_alias(chosen)
    if alias not in connections.settings:
        raise CommandError(f"--database: {alias!r} is not in settings.DATABASES")
    return alias


@contextmanager
def migrations_required(alias: str) -> Iterator[None]:
    """Run a command's work; soniq's tables or functions missing on ``alias`` is a ``CommandError``.

    Its text is the ``MigrationsNotApplied`` that ``enqueue()`` raises (which
    migrate to run), printed without a traceback. Nothing is checked before:
    the error is recognized when the database reports it. Any other error
    goes on as it was.
    """
    try:
        yield
    except MigrationsNotApplied as error:
        raise CommandError(str(MigrationsNotApplied(alias, error.what))) from None
    except DatabaseError as error:
        found = translate(error, alias)
        if not isinstance(found, MigrationsNotApplied):
            raise
        raise CommandError(str(found)) from None


def require_migrated(alias: str) -> None:
    """Refuse to start on a database whose soniq_django migrations are not all applied.

    For the long-running commands (``soniq_worker``, ``soniq_scheduler``): they
    call what the newest migration made, and on an older schema every call
    would fail and be retried as if the database were down.
    """
    executor = MigrationExecutor(connections[alias])
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "soniq_django"]
    pending = [migration.name for migration, _ in executor.migration_plan(targets)]
    if pending:
        raise CommandError(
            f"soniq_django migrations are not all applied on database {alias!r} (pending: "
            f"{', '.join(pending)}). Run: python manage.py migrate soniq_django "
            f"--database {alias}")
