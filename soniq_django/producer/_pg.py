"""Python calls to the PostgreSQL producer functions, and their errors.

On PostgreSQL, ``enqueue``/``bulk_enqueue``/``get_job`` go through
``soniq_enqueue``/``soniq_enqueue_many``/``soniq_get_job`` so that one
implementation of the rules (in ``sql/producer_api_v*.sql``) serves every
language. SQLSTATE and HINT come back as the same ``SoniqError`` codes the
SQLite path raises, and every other database error becomes a ``SoniqError``
too (``errors.translate``): the caller never sees a ``django.db`` error.

The enqueue calls run on a server-binding psycopg cursor on Django's own
connection (same transaction, same adapters), as a prepared statement when
``SONIQ["PREPARED_STATEMENTS"]`` allows it. ``None`` (the default) prepares
only on a connection straight to the server: not when the database sets
``DISABLE_SERVER_SIDE_CURSORS`` (Django's sign of a transaction pooler), nor
when the connection turns out to go through a pooler (``pooled()``). Behind
a transaction pooler a statement is parsed on one server connection and may
be bound on another, or on one where another client's statement has the
same name and runs instead. ``True`` prepares anyway (for a pooler that
keeps prepared statements); a prepared call that fails because its
statement is missing or taken is sent again unprepared, and that
connection prepares nothing from then on (``_stop_preparing``).

Django leaves psycopg's ``prepare_threshold`` off for its own queries; only
soniq's statement is prepared. Errors go through Django's error wrapper.
Django's cursor checks (connection, health check, thread, broken
transaction) run when one of them could act, and whether to prepare (with
the cursor) is worked out once per psycopg connection and settings
(``_state``; docs/decisions/0028).
While Django logs queries (``DEBUG``, ``CaptureQueriesContext``) or an
execute wrapper is installed, the call goes through Django's cursor
instead, so that they see it.
"""

import _thread
import asyncio
import json
import logging
import uuid
import weakref
from typing import Any, cast

import psycopg
from django.db import DatabaseError, transaction

from ..conf import get_settings
from ..errors import translate, translating
from ..pooling import pooled
from .request import SERVER_MADE_ID, PreparedJob

logger = logging.getLogger("soniq_django.producer")

# Positional, every parameter cast: one statement text and one parameter
# type list whatever the values, so a prepared statement is reused.
_ENQUEUE = (
    "SELECT soniq_enqueue(%s::text, %s::jsonb, %s::text, %s::integer, %s::timestamptz, "
    "%s::integer, %s::boolean, %s::text, %s::text, %s::uuid)"
)

_ENQUEUE_MANY = "SELECT soniq_enqueue_many(%s::jsonb)"

# An enqueue under a recording span (soniq_django/tracing.py): the same call, and the job's
# trace context in soniq_job_trace, in one statement. A unique or dedup job whose queued
# twin's id came back keeps the context it has (ON CONFLICT DO NOTHING). The CTE that calls
# soniq_enqueue is read twice, so it runs once (a CTE with side effects always does).
_ENQUEUE_TRACED = (
    "WITH job AS (" + _ENQUEUE + " AS id), "
    "trace AS (INSERT INTO soniq_job_trace (job_id, traceparent, tracestate) "
    "SELECT job.id, %s::text, %s::text FROM job ON CONFLICT (job_id) DO NOTHING) "
    "SELECT id FROM job"
)

# psycopg's default; any value works, prepare=True prepares at the first call.
_PREPARE_THRESHOLD = 5

#: A prepared call failed because the server connection at hand does not hold
#: this client's statement: it is missing (26000), its name is taken (42P05),
#: or another statement has the name and another number of parameters (08P01,
#: "bind message supplies ..."). Each fails before anything runs.
_NOT_OURS = frozenset({"26000", "42P05", "08P01"})

# psycopg connections that prepare nothing more, and the aliases warned about.
_unprepared: "weakref.WeakSet[Any]" = weakref.WeakSet()
_warned: set[str] = set()

GET_JOB = (
    "SELECT g.id, g.job_name, g.status, g.queue, g.attempts, g.max_attempts, g.result, "
    "g.last_error, g.dead_letter_reason, g.scheduled_at, g.created_at, g.updated_at, "
    "p.done, p.total, p.note, p.updated_at, "
    "ARRAY(SELECT s.name FROM soniq_job_steps AS s WHERE s.job_id = g.id "
    "ORDER BY s.recorded_at, s.name) FROM soniq_get_job(%s) AS g "
    "LEFT JOIN soniq_job_progress AS p ON p.job_id = g.id"
)
"""``soniq_get_job``'s row, then the job's progress (four NULLs when it reported none), then
the names of its recorded steps (docs/steps.md)."""


_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def prepares_statements(connection: Any) -> bool:
    """Whether soniq's enqueue statements are prepared on ``connection`` (connected, psycopg).

    Raises the driver's error if finding out whether a pooler is in between fails.
    """
    raw = connection.connection
    if raw in _unprepared:
        return False
    wanted = get_settings().PREPARED_STATEMENTS
    if wanted is None:
        return not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS") and not pooled(raw)
    return wanted


def _state(connection: Any, raw: "psycopg.Connection[Any]") -> tuple[bool, "psycopg.Cursor[Any]"]:
    """``prepares_statements`` and soniq's cursor (``_cursor``) for ``raw``, worked out once.

    Kept on Django's ``connection`` with what the answer depends on: the
    psycopg connection, the settings snapshot and ``DISABLE_SERVER_SIDE_CURSORS``;
    a change of any of them works it out again, and ``_stop_preparing`` drops it.
    """
    config, disabled = get_settings(), connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
    kept: tuple[Any, ...] | None = getattr(connection, "_soniq_state", None)
    if kept is not None and kept[0] is raw and kept[1] is config and kept[2] is disabled:
        return kept[3], kept[4]
    prepare = prepares_statements(connection)
    cursor = _cursor(connection, raw)
    connection._soniq_state = (raw, config, disabled, prepare, cursor)
    return prepare, cursor


def _stop_preparing(connection: Any, alias: str, sqlstate: str) -> None:
    """Prepare nothing more on this connection, and have psycopg forget what it prepared.

    Forgetting sends nothing to the server. psycopg would send DEALLOCATE ALL
    at the next rollback while it remembers a statement, and behind a
    transaction pooler that lands on whichever server connection the pooler
    picks, dropping statements another client owns there. psycopg has no
    public call to forget without deallocating: its cache is emptied directly.
    """
    raw = connection.connection
    _unprepared.add(raw)
    connection._soniq_state = None
    cache = getattr(raw, "_prepared", None)
    for part in ("_names", "_counts", "_to_flush"):
        getattr(cache, part, []).clear()
    if alias not in _warned:
        _warned.add(alias)
        logger.warning(
            "a prepared enqueue statement failed on database %r (SQLSTATE %s): sent again "
            "unprepared; this connection prepares nothing more. Behind a pooler that does not "
            "keep prepared statements set SONIQ['PREPARED_STATEMENTS'] to None or False "
            "(docs/deployment.md).", alias, sqlstate)


def _fetchone(connection: Any, alias: str, sql: str, params: list[Any]
              ) -> tuple[Any, ...] | None:
    """Run one statement on Django's connection and return its one row.

    None when a prepared call failed on a statement that is not ours
    (``_NOT_OURS``): nothing ran, the connection prepares nothing more, and
    inside ``atomic()`` the savepoint ``_call`` made is marked for rollback.
    """
    row: tuple[Any, ...] | None
    if connection.queries_logged or connection.execute_wrappers:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
            return row
    raw = connection.connection
    # What Django's cursor() checks, each a no-op in the usual case tested first:
    # connected, no health check due, in the thread that made it, no broken
    # transaction, no event loop (ensure_connection is async_unsafe).
    if (raw is None or connection.needs_rollback
            or connection._thread_ident != _thread.get_ident()
            or (connection.health_check_enabled and not connection.health_check_done)
            or asyncio._get_running_loop() is not None):
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        connection.validate_thread_sharing()
        connection.validate_no_broken_transaction()
        raw = connection.connection
    if not isinstance(raw, psycopg.Connection):  # pragma: no cover - psycopg 2
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
            return row
    with connection.wrap_database_errors:
        prepare, cursor = _state(connection, raw)
        # psycopg prepares nothing while prepare_threshold is None (Django's
        # default): lift it for this statement only. Django's own cursors bind
        # client-side and are never prepared, whatever the threshold.
        lifted = prepare and raw.prepare_threshold is None
        if lifted:
            raw.prepare_threshold = _PREPARE_THRESHOLD
        try:
            try:
                cursor.execute(sql, params, prepare=prepare)
            except psycopg.Error as error:
                if not (prepare and error.sqlstate in _NOT_OURS):
                    raise
                if connection.in_atomic_block:
                    transaction.set_rollback(True, using=alias)
                _stop_preparing(connection, alias, error.sqlstate)
                return None
            return cursor.fetchone()
        finally:
            if lifted:
                raw.prepare_threshold = None


def _cursor(connection: Any, raw: "psycopg.Connection[Any]") -> "psycopg.Cursor[Any]":
    """soniq's own psycopg cursor on ``raw``, kept on Django's ``connection`` while ``raw`` lives.

    A plain (server-binding) cursor: made once per psycopg connection rather
    than once per call. It is closed with its connection.
    """
    kept: tuple[Any, psycopg.Cursor[Any]] | None = getattr(connection, "_soniq_cursor", None)
    if kept is not None and kept[0] is raw:
        return kept[1]
    cursor = psycopg.Cursor(raw)
    connection._soniq_cursor = (raw, cursor)
    return cursor


def _call(connection: Any, alias: str, sql: str, params: list[Any]) -> tuple[Any, ...]:
    """The one row of ``sql``; a prepared call that met a statement not ours is sent again.

    Inside ``atomic()`` the call gets a savepoint, so that its failure leaves
    the enclosing transaction usable; in autocommit mode the statement is its
    own transaction and needs none. The failed attempt ran nothing
    (``_NOT_OURS``) and its savepoint is rolled back; the second attempt is
    unprepared. Raises ``SoniqError`` for any database error (``errors.translate``).
    """
    for _attempt in range(2):  # the second call cannot be None: nothing is prepared then
        try:
            if connection.in_atomic_block:
                with transaction.atomic(using=alias):
                    row = _fetchone(connection, alias, sql, params)
            else:
                row = _fetchone(connection, alias, sql, params)
        except DatabaseError as error:
            raise translate(error, alias) from None
        if row is not None:
            break
    return cast("tuple[Any, ...]", row)


def enqueue(job: PreparedJob, connection: Any, alias: str,
            trace: tuple[str, str | None] | None = None) -> uuid.UUID:
    """Call ``soniq_enqueue`` for one validated job; return the id it gives.

    ``trace`` (``tracing.Carrier``): the job's trace context, written to
    soniq_job_trace by the same statement.
    """
    params = [
        job.job_name, job.args_json, job.queue, job.priority, job.scheduled_at,
        job.max_attempts, job.unique_job, job.dedup_key, job.producer_id,
        None if job.job_id is SERVER_MADE_ID else job.job_id,  # NULL: the server makes it
    ]
    job_id: uuid.UUID
    if trace is None:
        (job_id,) = _call(connection, alias, _ENQUEUE, params)
    else:
        (job_id,) = _call(connection, alias, _ENQUEUE_TRACED, [*params, *trace])
    return job_id


def enqueue_many(jobs: list[PreparedJob], connection: Any, alias: str) -> list[uuid.UUID]:
    """Call ``soniq_enqueue_many`` once for all jobs; ids in input order.

    Optional keys that are unset are left out, and so is a job_id
    ``prepare`` generated (the server makes one).
    """
    rows: list[dict[str, Any]] = []
    append = rows.append
    for job in jobs:
        row = {"job_name": job.job_name, "args": job.args, "queue": job.queue,
               "priority": job.priority, "max_attempts": job.max_attempts}
        if job.scheduled_at is not None:
            row["run_at"] = job.scheduled_at.isoformat()
        if job.unique_job:
            row["unique_job"] = True
        if job.dedup_key is not None:
            row["dedup_key"] = job.dedup_key
        if job.producer_id is not None:
            row["producer_id"] = job.producer_id
        if not job.job_id_generated:
            row["job_id"] = str(job.job_id)
        append(row)
    ids: list[uuid.UUID]
    (ids,) = _call(connection, alias, _ENQUEUE_MANY, [_json(rows)])
    return ids


def get_job_row(job_id: uuid.UUID, connection: Any) -> tuple[Any, ...] | None:
    """The ``soniq_get_job`` row for ``job_id``, or None."""
    row: tuple[Any, ...] | None
    with translating(connection.alias), connection.cursor() as cursor:
        cursor.execute(GET_JOB, [job_id])
        row = cursor.fetchone()
    if row is None:
        return None
    # Django's psycopg setup hands jsonb over as text, for JSONField to parse.
    result = row[6]
    if isinstance(result, str):
        row = row[:6] + (json.loads(result),) + row[7:]
    return row
