"""The SQL that soniq_django installs on PostgreSQL, one file per migration step.

Files use ``{schema}`` where the schema holding the soniq tables goes; it is
filled in with the connection's ``current_schema()``, quoted, when a
migration loads the file. ``{schema_literal}`` is the same quoted name as a
SQL string literal (for a relation named at run time, e.g.
``({schema_literal} || '.soniq_jobs')::regclass``): never put ``{schema}``
inside quotes, where a quote in the name would end the string.
"""

import re
from pathlib import Path
from collections.abc import Callable
from typing import Any

SQL_DIR = Path(__file__).resolve().parent

# The start of one definition in a released file.
_DEFINITION = re.compile(
    r"^CREATE (?:OR REPLACE )?(?P<kind>FUNCTION|TRIGGER) (?:\{schema\}\.)?(?P<name>\w+)",
    re.MULTILINE)
_CREATE = re.compile(r"^CREATE (?:OR REPLACE )?")


def table_schema(connection: Any) -> str:
    """The schema the soniq tables live in: the connection's current schema."""
    schema: str | None
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        (schema,) = cursor.fetchone()
    if schema is None:
        raise RuntimeError("search_path names no existing schema; cannot place soniq functions")
    return schema


def render(name: str, connection: Any) -> str:
    """The text of ``sql/<name>`` with ``{schema}`` filled in for ``connection``."""
    return _fill((SQL_DIR / name).read_text(encoding="utf-8"), connection)


def _fill(text: str, connection: Any) -> str:
    return fill_schema(text, connection.ops.quote_name(table_schema(connection)))


def fill_schema(text: str, schema: str) -> str:
    """``text`` with ``{schema}`` and ``{schema_literal}`` filled in for the quoted ``schema``."""
    literal = "'" + schema.replace("'", "''") + "'"
    return text.replace("{schema_literal}", literal).replace("{schema}", schema)


def definitions(text: str) -> list[tuple[str, str]]:
    """``(name, statement)`` for each function and trigger a SQL file creates, in file order.

    A function's statement runs from its CREATE to the closing ``$fn$;`` of
    its body (every file quotes bodies with ``$fn$``), a trigger's to its
    first ``;``. The one parser of released files: reverses and
    ``sql/current.sql`` both read definitions through it.
    """
    found = []
    for match in _DEFINITION.finditer(text):
        start = match.start()
        if match["kind"] == "FUNCTION":
            body = text.index("AS $fn$", start) + len("AS $fn$")
            end = text.index("$fn$;", body) + len("$fn$;")
        else:
            end = text.index(";", start) + 1
        found.append((match["name"], text[start:end]))
    return found


def released_function(name: str, function: str) -> str:
    """``function``'s definition in the released file ``sql/<name>``, as CREATE OR REPLACE.

    A later version's reverse puts a released body back from the very file
    that released it, so the restored text cannot drift from it.
    """
    text = (SQL_DIR / name).read_text(encoding="utf-8")
    statements = [statement for found, statement in definitions(text) if found == function]
    if len(statements) != 1:
        raise ValueError(f"{name} does not define the function {function} exactly once")
    return _CREATE.sub("CREATE OR REPLACE ", statements[0], count=1)


def run_file(name: str, *, restore: tuple[tuple[str, str], ...] = (),
             adopt: tuple[str, ...] = ()) -> Callable[[Any, Any], None]:
    """A ``RunPython`` callable that executes ``sql/<name>`` on PostgreSQL only.

    ``restore`` names ``(released file, function)`` pairs whose released
    definitions are executed afterwards (see ``released_function``).
    ``adopt`` names functions the file creates that another program may have
    created already under the same name and signature (Soniq 0.2's
    ``soniq setup`` makes its own ``soniq_enqueue``, ``soniq_get_job`` and
    ``soniq_args_hash``): those are created with CREATE OR REPLACE, so
    adopting such a database replaces them -- keeping their grants -- instead
    of failing. SQLite has no SQL functions; there the step does nothing.
    """

    def apply(apps: Any, schema_editor: Any) -> None:
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            return
        text = render(name, connection)
        schema = connection.ops.quote_name(table_schema(connection))
        for function in adopt:
            created = f"CREATE FUNCTION {schema}.{function}("
            if text.count(created) != 1:
                raise ValueError(f"{name} does not create {function} once")
            text = text.replace(created, f"CREATE OR REPLACE FUNCTION {schema}.{function}(")
        with connection.cursor() as cursor:
            cursor.execute(text)
            for released, function in restore:
                cursor.execute(_fill(released_function(released, function), connection))

    apply.sql_file = name  # type: ignore[attr-defined]  # lets the tests map files to migrations
    return apply


def sqlite_statements(text: str) -> list[str]:
    """The statements of a SQLite file, each whole (a trigger's body and all)."""
    import sqlite3

    statements, pending = [], ""
    for line in text.splitlines(keepends=True):
        if not pending and (not line.strip() or line.lstrip().startswith("--")):
            continue
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError("a SQLite file ends inside a statement")
    return statements


def released_sqlite_trigger(name: str, trigger: str) -> str:
    """``trigger``'s CREATE TRIGGER statement in the released file ``sql/sqlite/<name>``
    (a later version's reverse puts it back from there, as ``released_function`` does)."""
    text = (SQL_DIR / "sqlite" / name).read_text(encoding="utf-8")
    statements = [statement for statement in sqlite_statements(text)
                  if statement.startswith(f"CREATE TRIGGER {trigger} ")]
    if len(statements) != 1:
        raise ValueError(f"sqlite/{name} does not create the trigger {trigger} exactly once")
    return statements[0]


def run_sqlite_file(name: str, *, restore: tuple[tuple[str, str], ...] = ()
                    ) -> Callable[[Any, Any], None]:
    """A ``RunPython`` callable that executes ``sql/sqlite/<name>`` on SQLite only.

    The SQLite twins of the PostgreSQL files whose behaviour SQLite can have
    too (triggers); on PostgreSQL the step does nothing. ``restore`` names
    ``(released file, trigger)`` pairs created afterwards from those files
    (``released_sqlite_trigger``).
    """

    def apply(apps: Any, schema_editor: Any) -> None:
        connection = schema_editor.connection
        if connection.vendor != "sqlite":
            return
        text = (SQL_DIR / "sqlite" / name).read_text(encoding="utf-8")
        with connection.cursor() as cursor:
            for statement in sqlite_statements(text):
                cursor.execute(statement)
            for released, trigger in restore:
                cursor.execute(released_sqlite_trigger(released, trigger))

    apply.sqlite_file = name  # type: ignore[attr-defined]
    return apply
