"""Connection poolers (PgBouncer and the like): telling them apart, and what the checks say.

A pooler cannot give its client the server's cancel key: the server
session behind the client may change with every transaction, so the pooler
makes a key of its own, and libpq reports the process id in it as the
backend pid (psycopg's ``info.backend_pid``). The server's
``pg_backend_pid()`` names the real process. The two differ exactly when
something sits in between (a random 32-bit key matches a real pid about
once in four billion connections). Session and transaction pooling look the
same from the client: both count as pooled.

``pooled()`` serves the producer (no prepared statements through a pooler
unless ``SONIQ["PREPARED_STATEMENTS"]`` says so) and the database check;
``settings_messages()`` and ``database_messages()`` are the system checks
soniq.E010 and W010-W012 (docs/deployment.md).
"""

import weakref
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core import checks
from django.db import connections

if TYPE_CHECKING:
    from .conf import Settings

_known: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def pooled(raw: Any) -> bool:
    """Whether the psycopg connection ``raw`` reaches its server through a pooler.

    One query the first time a connection is asked about, then remembered
    for as long as that connection lives. Raises the driver's error if the
    query fails.
    """
    known: bool | None = _known.get(raw)
    if known is None:
        (pid,) = raw.execute("SELECT pg_backend_pid()").fetchone()
        known = _known[raw] = pid != raw.info.backend_pid
    return known


def _advice(alias: str, config: "Settings") -> list[checks.CheckMessage]:
    """soniq.W010 and W011 for a database behind a (transaction) pooler."""
    messages = []
    if config.LISTEN_DATABASE in (None, alias):
        messages.append(checks.Warning(
            f"Workers on database {alias!r} would LISTEN through its pooler, where NOTIFY "
            "does not reach them.",
            hint="Set SONIQ['LISTEN_DATABASE'] to the alias of a direct or session-mode "
                 "connection to the same database; without it workers poll every 0.5 s "
                 "(docs/deployment.md).", id="soniq.W010"))
    if config.PREPARED_STATEMENTS is True:
        messages.append(checks.Warning(
            f"SONIQ['PREPARED_STATEMENTS'] is True but database {alias!r} goes through a "
            "pooler.",
            hint="Only a pooler that keeps prepared statements (PgBouncer 1.22 or later with "
                 "max_prepared_statements > 0) runs them safely; None, the default, prepares "
                 "none there (docs/deployment.md).", id="soniq.W011"))
    return messages


def settings_messages(config: "Settings") -> list[checks.CheckMessage]:
    """soniq.E003/E010 for LISTEN_DATABASE; W010/W011 for DISABLE_SERVER_SIDE_CURSORS databases.

    ``DISABLE_SERVER_SIDE_CURSORS`` is Django's setting for a transaction pooler.
    """
    listen = config.LISTEN_DATABASE
    if listen is not None and not isinstance(listen, str):
        return [checks.Error("SONIQ['LISTEN_DATABASE'] must be None or a database alias.",
                             id="soniq.E003")]
    if listen is not None and (listen not in settings.DATABASES
                               or connections[listen].vendor != "postgresql"):
        return [checks.Error(
            f"SONIQ['LISTEN_DATABASE'] is {listen!r}, which is no PostgreSQL database in "
            "DATABASES.", hint="Name the alias of a direct or session-mode connection to the "
                               "workers' database (docs/deployment.md).", id="soniq.E010")]
    messages = []
    for alias, entry in settings.DATABASES.items():
        if entry.get("DISABLE_SERVER_SIDE_CURSORS") and connections[alias].vendor == "postgresql":
            messages += _advice(alias, config)
    return messages


def database_messages(alias: str, config: "Settings") -> list[checks.CheckMessage]:
    """soniq.W012 (and W010/W011) when PostgreSQL database ``alias`` is reached through a pooler.

    A database that sets ``DISABLE_SERVER_SIDE_CURSORS`` was advised on by
    ``settings_messages`` already.
    """
    connection = connections[alias]
    connection.ensure_connection()
    if connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS") or not pooled(
            connection.connection):
        return []
    return [checks.Warning(
        f"Database {alias!r} is reached through a connection pooler.",
        hint="If it pools transactions (PgBouncer's pool_mode = transaction), set "
             "\"DISABLE_SERVER_SIDE_CURSORS\": True on it, as Django asks, and "
             "SONIQ['LISTEN_DATABASE'] (docs/deployment.md).", id="soniq.W012"),
        *_advice(alias, config)]
