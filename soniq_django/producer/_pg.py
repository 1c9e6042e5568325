"""Python calls to the PostgreSQL producer functions, and their errors.

On PostgreSQL, ``enqueue``/``bulk_enqueue``/``get_job`` go through
``soniq_enqueue``/``soniq_enqueue_many``/``soniq_get_job`` so that one
implementation of the rules (in ``sql/producer_api_v*.sql``) serves every
language. SQLSTATE and HINT come back as the same ``SoniqError`` codes the
SQLite path raises, and every other database error becomes a ``SoniqError``
too (``errors.translate``): the caller never sees a ``django.db`` error.

The enqueue calls run on a server-binding psycopg cursor on Django's own
connection (same transaction, same adapters), as a prepared statement when
``SONIQ["PREPARED_STATEMENTS"]`` allows it: by default unless the database
sets ``DISABLE_SERVER_SIDE_CURSORS`` (Django's sign of a transaction-pooling
PgBouncer, which would lose them between transactions). Django leaves
psycopg's ``prepare_threshold`` off for its own queries; only soniq's
statement is prepared. Errors go through Django's error wrapper. While
Django logs queries (``DEBUG``, ``CaptureQueriesContext``) or an execute
wrapper is installed, the call goes through Django's cursor instead, so that
they see it.
"""

import json
import uuid
from contextlib import contextmanager, nullcontext

import psycopg
from django.db import transaction

from ..conf import get_settings
from ..errors import translating
from .request import PreparedJob

# Positional, every parameter cast: one statement text and one parameter
# type list whatever the values, so a prepared statement is reused.
_ENQUEUE = (
    "SELECT soniq_enqueue(%s::text, %s::jsonb, %s::text, %s::integer, %s::timestamptz, "
    "%s::integer, %s::boolean, %s::text, %s::text, %s::uuid)"
)

_ENQUEUE_MANY = "SELECT soniq_enqueue_many(%s::jsonb)"

# psycopg's default; any value works, prepare=True prepares at the first call.
_PREPARE_THRESHOLD = 5

GET_JOB = (
    "SELECT id, job_name, status, queue, attempts, max_attempts, result, last_error, "
    "dead_letter_reason, scheduled_at, created_at, updated_at FROM soniq_get_job(%s)"
)


_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


@contextmanager
def _translated(connection, alias: str):
    """Run a call so that its failure leaves an enclosing transaction usable.

    Inside ``atomic()`` the call gets a savepoint; in autocommit mode the
    statement is its own transaction and needs none. Any database error
    becomes its ``SoniqError`` (``errors.translate``).
    """
    guard = transaction.atomic(using=alias) if connection.in_atomic_block else nullcontext()
    with translating(), guard:
        yield


def prepares_statements(connection) -> bool:
    """Whether soniq's enqueue statements are prepared on ``connection``."""
    wanted = get_settings().PREPARED_STATEMENTS
    if wanted is None:
        return not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
    return wanted


def _fetchone(connection, sql: str, params: list) -> tuple:
    """Run one statement on Django's connection and return its one row."""
    if connection.queries_logged or connection.execute_wrappers:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):  # pragma: no cover - psycopg 2
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    prepare = prepares_statements(connection)
    # psycopg prepares nothing while prepare_threshold is None (Django's
    # default): lift it for this statement only. Django's own cursors bind
    # client-side and are never prepared, whatever the threshold.
    lifted = prepare and raw.prepare_threshold is None
    if lifted:
        raw.prepare_threshold = _PREPARE_THRESHOLD
    try:
        with connection.wrap_database_errors, psycopg.Cursor(raw) as cursor:
            cursor.execute(sql, params, prepare=prepare)
            return cursor.fetchone()
    finally:
        if lifted:
            raw.prepare_threshold = None


def enqueue(job: PreparedJob, connection, alias: str) -> uuid.UUID:
    """Call ``soniq_enqueue`` for one validated job; return the id it gives."""
    params = [
        job.job_name, _json(job.args), job.queue, job.priority, job.scheduled_at,
        job.max_attempts, job.unique_job, job.dedup_key, job.producer_id, job.job_id,
    ]
    with _translated(connection, alias):
        (job_id,) = _fetchone(connection, _ENQUEUE, params)
    return job_id


def enqueue_many(jobs: list[PreparedJob], connection, alias: str) -> list[uuid.UUID]:
    """Call ``soniq_enqueue_many`` once for all jobs; ids in input order.

    Optional keys that are unset are left out, and so is a job_id
    ``prepare`` generated (the server makes one).
    """
    rows = []
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
    with _translated(connection, alias):
        (ids,) = _fetchone(connection, _ENQUEUE_MANY, [_json(rows)])
    return ids


def get_job_row(job_id: uuid.UUID, connection) -> tuple | None:
    """The ``soniq_get_job`` row for ``job_id``, or None."""
    with translating(), connection.cursor() as cursor:
        cursor.execute(GET_JOB, [job_id])
        row = cursor.fetchone()
    if row is None:
        return None
    # Django's psycopg setup hands jsonb over as text, for JSONField to parse.
    result = row[6]
    if isinstance(result, str):
        row = row[:6] + (json.loads(result),) + row[7:]
    return row
