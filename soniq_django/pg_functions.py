"""Python calls to the PostgreSQL producer functions, and their errors.

On PostgreSQL, ``enqueue``/``bulk_enqueue``/``get_job`` go through
``soniq_enqueue``/``soniq_get_job`` so that one implementation of the rules
(in ``sql/producer_api_v1.sql``) serves every language. SQLSTATE and HINT
come back as the same ``SoniqError`` codes the SQLite path raises.
"""

import json
import uuid
from contextlib import contextmanager, nullcontext

from django.db import Error as DatabaseError
from django.db import transaction

from .errors import ConfigValidationError, ErrorCode, SoniqError
from .job_request import PreparedJob

# HINT codes of SQLSTATE 22023, with the reason Python callers are given.
_HINTED = {
    ErrorCode.INVALID_TASK_NAME: "the job name does not match the database's task-name pattern",
    ErrorCode.TASK_ARGS_INVALID: "the database refused the job args",
    ErrorCode.INVALID_MAX_ATTEMPTS: "max_attempts must be at least 1",
    ErrorCode.INVALID_OPTION: "the database refused an enqueue option",
}

_ENQUEUE = (
    "SELECT soniq_enqueue(%s, %s::jsonb, queue => %s, priority => %s, run_at => %s, "
    "max_attempts => %s, unique_job => %s, dedup_key => %s, producer_id => %s, job_id => %s)"
)

_ENQUEUE_MANY = (
    "SELECT r.ord, soniq_enqueue(r.job_name, r.args, queue => r.queue, priority => r.priority, "
    "run_at => r.run_at, max_attempts => r.max_attempts, unique_job => r.unique_job, "
    "dedup_key => r.dedup_key, producer_id => r.producer_id, job_id => r.job_id) "
    "FROM ROWS FROM (jsonb_to_recordset(%s::jsonb) AS ("
    "job_name text, args jsonb, queue text, priority integer, run_at timestamptz, "
    "max_attempts integer, unique_job boolean, dedup_key text, producer_id text, job_id uuid)"
    ") WITH ORDINALITY AS r(job_name, args, queue, priority, run_at, max_attempts, unique_job, "
    "dedup_key, producer_id, job_id, ord)"
)

GET_JOB = (
    "SELECT id, job_name, status, queue, attempts, max_attempts, result, last_error, "
    "dead_letter_reason, scheduled_at, created_at, updated_at FROM soniq_get_job(%s)"
)


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def translate(error: DatabaseError) -> SoniqError | None:
    """The ``SoniqError`` a producer-function failure stands for, or None."""
    cause = error.__cause__
    sqlstate = getattr(cause, "sqlstate", None)
    diag = getattr(cause, "diag", None)
    if sqlstate == "22023" and diag is not None:
        try:
            code = ErrorCode(diag.message_hint)
        except ValueError:
            return None
        if code is ErrorCode.INVALID_OPTION:
            return ConfigValidationError(_HINTED[code], code=code)
        if code in _HINTED:
            return SoniqError(code, _HINTED[code])
    if sqlstate == "23505" and diag is not None and diag.constraint_name == "soniq_jobs_pkey":
        return SoniqError(ErrorCode.DUPLICATE_JOB_ID, "a job with the requested job_id already exists")
    return None


@contextmanager
def _translated(connection, alias: str):
    """Run a call so that its failure leaves an enclosing transaction usable.

    Inside ``atomic()`` the call gets a savepoint; in autocommit mode the
    statement is its own transaction and needs none.
    """
    guard = transaction.atomic(using=alias) if connection.in_atomic_block else nullcontext()
    try:
        with guard:
            yield
    except DatabaseError as error:
        translated = translate(error)
        if translated is None:
            raise
        raise translated from None


def _params(job: PreparedJob) -> list:
    return [
        job.job_name, _json(job.args), job.queue, job.priority, job.scheduled_at,
        job.max_attempts, job.unique_job, job.dedup_key, job.producer_id, job.job_id,
    ]


def enqueue(job: PreparedJob, connection, alias: str) -> uuid.UUID:
    """Call ``soniq_enqueue`` for one validated job; return the id it gives."""
    with _translated(connection, alias), connection.cursor() as cursor:
        cursor.execute(_ENQUEUE, _params(job))
        (job_id,) = cursor.fetchone()
    return job_id


def enqueue_many(jobs: list[PreparedJob], connection, alias: str) -> list[uuid.UUID]:
    """Call ``soniq_enqueue`` once per job in one statement; ids in input order."""
    rows = [
        {
            "job_name": job.job_name,
            "args": job.args,
            "queue": job.queue,
            "priority": job.priority,
            "run_at": job.scheduled_at.isoformat() if job.scheduled_at else None,
            "max_attempts": job.max_attempts,
            "unique_job": job.unique_job,
            "dedup_key": job.dedup_key,
            "producer_id": job.producer_id,
            "job_id": str(job.job_id),
        }
        for job in jobs
    ]
    with _translated(connection, alias), connection.cursor() as cursor:
        cursor.execute(_ENQUEUE_MANY, [_json(rows)])
        found = dict(cursor.fetchall())
    return [found[index] for index in range(1, len(jobs) + 1)]


def get_job_row(job_id: uuid.UUID, connection) -> tuple | None:
    """The ``soniq_get_job`` row for ``job_id``, or None."""
    with connection.cursor() as cursor:
        cursor.execute(GET_JOB, [job_id])
        row = cursor.fetchone()
    if row is None:
        return None
    # Django's psycopg setup hands jsonb over as text, for JSONField to parse.
    result = row[6]
    if isinstance(result, str):
        row = row[:6] + (json.loads(result),) + row[7:]
    return row
