"""Helpers shared by the tests/test_sql_*.py files. This module holds no tests.

The SQL API tests talk to PostgreSQL in two ways:

- through Django's connection, inside the test's transaction (fast; rolled
  back afterwards). A statement that fails there is wrapped in a savepoint by
  :func:`fails` so the transaction stays usable;
- through raw psycopg connections to the same test database (:func:`raw`),
  for real concurrency, LISTEN/NOTIFY and other roles. What those commit is
  removed by the :func:`committed_db` fixture (or, for tests that also need
  Django's connection outside a transaction, by ``django_db(transaction=True)``).
"""

import contextlib
import time
import subprocess
import shutil
import os
import glob
import re
import secrets
import uuid

import psycopg
from urllib.parse import quote
from django.db import DatabaseError, connection, transaction

from soniq_django.sql import SQL_DIR

#: The functions a producer is granted, by name.
PUBLIC_FUNCTIONS = ("soniq_enqueue", "soniq_get_job", "soniq_args_hash", "soniq_enqueue_many",
                    "soniq_enqueue_after", "soniq_enqueue_after_many", "soniq_enqueue_keyed",
                    "soniq_enqueue_keyed_after", "soniq_enqueue_keyed_many")

#: The columns soniq_get_job returns, in the seed's order.
GET_JOB_COLUMNS = (
    "id", "job_name", "status", "queue", "attempts", "max_attempts", "result", "last_error",
    "dead_letter_reason", "scheduled_at", "created_at", "updated_at",
)


PRODUCER_API_FILES = ("producer_api_v1.sql", "producer_api_v2.sql", "producer_api_v3.sql",
                      "producer_api_v4.sql", "producer_api_v5.sql", "producer_api_v6.sql")


def producer_api_functions() -> list[str]:
    """Names of every function the producer API files define, in file order, each once."""
    names: dict[str, None] = {}
    for name in PRODUCER_API_FILES:
        text = (SQL_DIR / name).read_text(encoding="utf-8")
        for found in re.findall(r"^CREATE (?:OR REPLACE )?FUNCTION \{schema\}\.(\w+)\(",
                                text, flags=re.MULTILINE):
            names[found] = None
    names["soniq_enqueue_keyed"] = None  # claim_protocol_v12.sql (0029): a producer's too
    names["soniq_enqueue_keyed_after"] = None  # key_park_v1.sql (0032): and these two
    names["soniq_enqueue_keyed_many"] = None
    return list(names)


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def schema() -> str:
    """The schema holding the soniq tables and functions (unquoted)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        return cursor.fetchone()[0]


def conninfo(**overrides) -> dict:
    """psycopg connection parameters for the test database (Django's settings)."""
    settings = connection.settings_dict
    params = {
        "host": settings.get("HOST") or None,
        "port": str(settings["PORT"]) if settings.get("PORT") else None,
        "user": settings.get("USER") or None,
        "password": settings.get("PASSWORD") or None,
        "dbname": settings["NAME"],
        "application_name": "soniq-tests",
    }
    params.update(overrides)
    return {key: value for key, value in params.items() if value is not None}


@contextlib.contextmanager
def raw(*, autocommit: bool = True, **overrides):
    """A psycopg connection of its own to the test database, closed afterwards."""
    conn = psycopg.connect(autocommit=autocommit, **conninfo(**overrides))
    try:
        yield conn
    finally:
        conn.close()


def wait_for_older_transactions(conn: psycopg.Connection, within: float = 90) -> None:
    """Wait until every transaction that held back vacuum's horizon when called has ended.

    A test that needs dead rows removable (no pin) runs on a server other
    sessions use too: the other lane of scripts/run-tests, in its own
    database. A snapshot there holds nothing of ours, but a transaction that
    wrote (it has a transaction id) holds every database's horizon until it
    ends. Fails after ``within`` seconds, naming how long the oldest has run.
    """
    mark = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()[0]
    older = """SELECT max(now() - xact_start) FROM pg_stat_activity
                WHERE pid <> pg_backend_pid()
                  AND (age(backend_xid) > age(%(mark)s::text::xid)
                       OR (datname = current_database()
                           AND age(backend_xmin) > age(%(mark)s::text::xid)))"""
    deadline = time.monotonic() + within
    while (running := conn.execute(older, {"mark": str(int(mark) % 2**32)}).fetchone()[0]):
        assert time.monotonic() < deadline, (
            f"another session's transaction held the horizon for {within} s (oldest: {running})")
        time.sleep(0.1)


def pg_error(exc: BaseException) -> psycopg.Error:
    """The psycopg error behind ``exc`` (Django wraps it; raw connections do not)."""
    error = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    assert isinstance(error, psycopg.Error), f"not a PostgreSQL error: {exc!r}"
    return error


def state_and_hint(exc: BaseException) -> tuple[str, str | None]:
    error = pg_error(exc)
    return error.sqlstate, error.diag.message_hint


def fetch(sql: str, params=()) -> list[tuple]:
    """Rows of one statement on Django's connection."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def value(sql: str, params=()):
    rows = fetch(sql, params)
    assert len(rows) == 1 and len(rows[0]) == 1, rows
    return rows[0][0]


def fails(sql: str, params=()) -> psycopg.Error:
    """Run ``sql`` on Django's connection, expect it to fail, return the psycopg error.

    A savepoint keeps the test's transaction usable afterwards.
    """
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
    except DatabaseError as exc:
        return pg_error(exc)
    raise AssertionError(f"expected {sql!r} to fail, and it succeeded")


def raw_fails(conn: psycopg.Connection, sql: str, params=()) -> psycopg.Error:
    """Like :func:`fails`, on a raw autocommit connection."""
    try:
        conn.execute(sql, params)
    except psycopg.Error as exc:
        return exc
    raise AssertionError(f"expected {sql!r} to fail, and it succeeded")


def job_count() -> int:
    return value("SELECT count(*) FROM soniq_jobs")


def unique_name(prefix: str) -> str:
    """A lowercase identifier no other test run uses (roles are cluster-wide)."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


class Roles:
    """Creates LOGIN roles for one test and drops them (and what they own) afterwards."""

    def __init__(self):
        self.created: list[str] = []
        self._passwords: dict[str, str] = {}

    def create(self, prefix: str = "soniq_t", *, name: str | None = None) -> str:
        role = name or unique_name(prefix)
        password = secrets.token_hex(16)  # works whatever the server's auth method
        with raw() as admin:
            admin.execute(f"CREATE ROLE {quote_ident(role)} LOGIN PASSWORD '{password}'")
        self.created.append(role)
        self._passwords[role] = password
        return role

    def connect(self, role: str, *, autocommit: bool = True, **overrides) -> psycopg.Connection:
        return psycopg.connect(
            autocommit=autocommit,
            **conninfo(user=role, password=self._passwords[role], **overrides),
        )

    def url(self, role: str) -> str:
        """A postgres:// URL logging in as ``role`` to the test database. Never print it."""
        params = conninfo(user=role, password=self._passwords[role])
        host = params.get("host", "127.0.0.1")
        port = params.get("port", "5432")
        return (f"postgres://{quote(role, safe='')}:{quote(params['password'], safe='')}"
                f"@{quote(host, safe='')}:{port}/{quote(params['dbname'], safe='')}")

    def drop_all(self):
        with raw() as admin:
            for role in reversed(self.created):
                quoted = quote_ident(role)
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    [role],
                )
                admin.execute(f"DROP OWNED BY {quoted} CASCADE")
                admin.execute(f"DROP ROLE {quoted}")
        self.created.clear()


def nested(depth: int, kind: str = "object", leaf: str = "") -> str:
    """JSON text of an args object whose containers nest ``depth`` levels (the args are level 1).

    ``kind`` is the type of levels 2 and up: "object", "array" or "mixed"
    (alternating). ``leaf``, if given, is a scalar put in the innermost container.
    """
    assert depth >= 1

    def kind_at(level):
        if level == 1:
            return "object"
        if kind == "mixed":
            return "array" if level % 2 else "object"
        return kind

    def wrap(level, inner):
        if kind_at(level) == "object":
            return '{"k":' + inner + "}" if inner else "{}"
        return "[" + inner + "]"

    text = wrap(depth, leaf)
    for level in range(depth - 1, 0, -1):
        text = wrap(level, text)
    return text


FLOAT64_OVERFLOW = 2**1024 - 2**970  # the smallest magnitude that rounds to infinity


def psql_binary() -> str:
    found = shutil.which("psql") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"), reverse=True)), None)
    assert found, "the psql client is needed to test docs/sql-api.md (install postgresql-client)"
    return found


def run_psql(sql: str) -> subprocess.CompletedProcess:
    settings = connection.settings_dict
    command = [psql_binary(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose",
               "-d", settings["NAME"]]
    if settings.get("HOST"):
        command += ["-h", settings["HOST"]]
    if settings.get("PORT"):
        command += ["-p", str(settings["PORT"])]
    if settings.get("USER"):
        command += ["-U", settings["USER"]]
    env = {**os.environ, "PGCLIENTENCODING": "UTF8", "PGAPPNAME": "psql"}
    if settings.get("PASSWORD"):
        env["PGPASSWORD"] = settings["PASSWORD"]
    return subprocess.run(command, input=sql, env=env, capture_output=True, text=True, timeout=60)
