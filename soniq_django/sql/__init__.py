"""The SQL that soniq_django installs on PostgreSQL, one file per migration step.

Files use ``{schema}`` where the schema holding the soniq tables goes; it is
filled in with the connection's ``current_schema()``, quoted, when a
migration loads the file.
"""

from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent


def table_schema(connection) -> str:
    """The schema the soniq tables live in: the connection's current schema."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        (schema,) = cursor.fetchone()
    if schema is None:
        raise RuntimeError("search_path names no existing schema; cannot place soniq functions")
    return schema


def render(name: str, connection) -> str:
    """The text of ``sql/<name>`` with ``{schema}`` filled in for ``connection``."""
    quoted = connection.ops.quote_name(table_schema(connection))
    return (SQL_DIR / name).read_text(encoding="utf-8").replace("{schema}", quoted)


def run_file(name: str):
    """A ``RunPython`` callable that executes ``sql/<name>`` on PostgreSQL only.

    SQLite has no SQL functions; there the step does nothing.
    """

    def apply(apps, schema_editor):
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            cursor.execute(render(name, connection))

    apply.sql_file = name  # lets the tests map files to migrations
    return apply
