"""The ``--database`` option of soniq's commands: without it, the routers pick the alias.

A project that keeps soniq_django's tables in a database of their own (a
router, see docs/deployment.md) runs ``soniq_worker`` and the rest without
naming it, as it runs ``manage.py shell`` without naming ``default``.
"""

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import connections

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
