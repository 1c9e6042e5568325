"""Large bulk enqueues on PostgreSQL: the plain jobs loaded with COPY.

``bulk_enqueue`` sends a batch to ``soniq_enqueue_many`` as one JSON array
(``_pg.enqueue_many``). From ``COPY_MIN_JOBS`` plain jobs on (not unique, no
``dedup_key``) it loads them with COPY instead, which spares the server the
JSON and spares Python building it (decision 0022). It writes the rows
``soniq_enqueue_many`` writes, with its errors, in one transaction (a
savepoint inside ``atomic()``):

1. two queries find out whether this path may run: the role may ``INSERT``
   into ``soniq_jobs`` itself (a role that may only execute the SQL API may
   not), read ``soniq_dead_letter_jobs`` and call
   ``soniq_task_name_pattern_v1()``; every job name matches the database's
   task-name pattern (that function's, the pattern ``soniq_enqueue`` reads);
   no requested ``job_id`` is held by a dead-lettered job. The first also
   reads the ``producer_id`` default, ``application_name`` or else the
   session user. When any answer is no, nothing has been written and the
   batch goes to ``soniq_enqueue_many``, which refuses it as it always has;
2. COPY of the plain jobs into ``soniq_jobs``: the columns
   ``soniq_enqueue_many``'s ``INSERT`` writes, every other one its default.
   ``prepare()`` has checked every other rule ``soniq_enqueue_many`` checks,
   and more strictly (``normalize_args``). A taken or repeated ``job_id``
   fails the COPY on ``soniq_jobs_pkey``: DUPLICATE_JOB_ID, as before;
3. one NOTIFY per queue that got a job due now (by the transaction's
   ``now()``, as ``soniq_enqueue_many`` compares);
4. the unique and dedup jobs, if any, through ``soniq_enqueue_many`` in
   request order: that function, too, inserts its plain jobs first and
   resolves the others one by one after them.

While Django logs queries or an execute wrapper is installed the batch goes
to ``soniq_enqueue_many`` (a COPY is no ``execute`` they could see).
"""

import uuid
from typing import Any

from django.db import transaction

from ..errors import translating
from ..models import DeadLetterJob, Job
from . import _pg
from .request import PreparedJob

#: The fewest plain jobs in one ``bulk_enqueue`` that are loaded with COPY.
#: Measured (docs/enqueue.md, decision 0022): from 50 to 300 jobs the two
#: paths were even, the extra round trips costing what the JSON saves; from
#: 500 on COPY was ahead.
COPY_MIN_JOBS = 500

#: The columns ``soniq_enqueue_many``'s INSERT writes, in COPY order: first those that
#: many jobs of a batch share (their text is made once per distinct combination, see
#: ``_copy``), then the id and the args.
COLUMNS = ("job_name", "status", "attempts", "max_attempts", "queue", "priority", "unique_job",
           "args_hash", "dedup_key", "scheduled_at", "producer_id", "id", "args")

#: How many rows ``_copy`` formats before it hands them to psycopg as one block.
ROWS_PER_WRITE = 1000

#: What COPY's text format escapes in a field (a NUL never gets here: ``prepare()`` refuses
#: it in args, queue, dedup_key and producer_id, and psycopg in the names ``_CHECK`` sends).
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})

# Privileges first, in a statement of their own: a statement that reads a
# table the role may not read fails, whatever it would do with the rows.
_MAY = (
    "SELECT pg_catalog.has_table_privilege(%s, 'INSERT') "
    "       AND pg_catalog.has_table_privilege(%s, 'SELECT') "
    "       AND pg_catalog.has_function_privilege('soniq_task_name_pattern_v1()', 'EXECUTE'), "
    "       coalesce(NULLIF(pg_catalog.current_setting('application_name'), ''), session_user)"
)

_CHECK = (
    "SELECT NOT EXISTS (SELECT 1 FROM pg_catalog.unnest(%s::text[]) AS n(name) "
    "                    WHERE NOT n.name OPERATOR(pg_catalog.~) soniq_task_name_pattern_v1()), "
    "       NOT EXISTS (SELECT 1 FROM {dead} AS d WHERE d.id = ANY(%s::uuid[]))"
)

_NOTIFY = (
    "SELECT pg_catalog.pg_notify('soniq_new_job', q.queue) "
    "  FROM ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::timestamptz[])) "
    "       AS q(queue, first_run_at) "
    " WHERE q.first_run_at IS NULL OR q.first_run_at <= pg_catalog.now() "
    " ORDER BY q.queue"
)


def applies(jobs: list[PreparedJob], connection: Any) -> bool:
    """Whether ``jobs`` on ``connection`` are worth the COPY path (enough plain jobs, no logging)."""
    if connection.queries_logged or connection.execute_wrappers:
        return False
    plain = 0
    for job in jobs:
        if not (job.unique_job or job.dedup_key is not None):  # job.deduplicates, inline
            plain += 1
            if plain >= COPY_MIN_JOBS:
                return True
    return False


def enqueue_many(jobs: list[PreparedJob], connection: Any, alias: str
                 ) -> list[uuid.UUID] | None:
    """Enqueue validated, due-resolved ``jobs``; their ids in order.

    None when step 1 (see the module) says no: nothing was written, and
    ``_pg.enqueue_many`` is to take the batch. Raises ``SoniqError``.
    """
    plain: list[PreparedJob] = []
    others: list[PreparedJob] = []
    names: set[str] = set()
    requested: list[uuid.UUID] = []
    for job in jobs:  # one pass over the batch
        (others if job.unique_job or job.dedup_key is not None else plain).append(job)
        names.add(job.job_name)
        if not job.job_id_generated:
            requested.append(job.job_id)
    quote = connection.ops.quote_name
    jobs_table, dead_table = quote(Job._meta.db_table), quote(DeadLetterJob._meta.db_table)
    with translating(alias), transaction.atomic(using=alias):
        with connection.cursor() as cursor:
            cursor.execute(_MAY, [jobs_table, dead_table])
            may, producer = cursor.fetchone()
            if not may:
                return None
            cursor.execute(_CHECK.format(dead=dead_table), [sorted(names), requested])
            names_ok, ids_free = cursor.fetchone()
            if not (names_ok and ids_free):
                return None
            _copy(cursor.cursor, connection, jobs_table, plain, producer)
            queues, firsts = _first_run_per_queue(plain)
            cursor.execute(_NOTIFY, [queues, firsts])
        resolved = iter(_pg.enqueue_many(others, connection, alias) if others else ())
    if not others:
        return [job.job_id for job in jobs]
    return [next(resolved) if job.deduplicates else job.job_id for job in jobs]


def _copy(cursor: Any, connection: Any, table: str, jobs: list[PreparedJob],
          producer: str) -> None:
    """COPY ``jobs`` into ``table`` on the psycopg ``cursor`` (its errors as Django's).

    The rows are formatted here, as COPY's text format, and written
    ``ROWS_PER_WRITE`` at a time: what psycopg's ``write_row`` would send,
    without its per-field dumping. The fields that jobs of a batch share are
    formatted once per distinct combination.
    """
    sql = f"COPY {table} ({', '.join(COLUMNS)}) FROM STDIN"
    heads: dict[tuple[Any, ...], str] = {}
    rows: list[str] = []
    with connection.wrap_database_errors, cursor.copy(sql) as copy:
        for job in jobs:
            key = (job.job_name, job.max_attempts, job.queue, job.priority, job.scheduled_at,
                   job.producer_id)
            head = heads.get(key)
            if head is None:
                head = heads[key] = _head(job, producer)
            args = job.args_json
            if "\\" in args:  # JSON text holds no tab, newline or CR: it escapes them
                args = args.replace("\\", "\\\\")
            rows.append(f"{head}{job.job_id.hex}\t{args}\n")
            if len(rows) == ROWS_PER_WRITE:
                copy.write("".join(rows))
                rows.clear()
        if rows:
            copy.write("".join(rows))


def _head(job: PreparedJob, producer: str) -> str:
    """The text of ``job``'s row up to its id: the fields that jobs of a batch share."""
    at = job.scheduled_at
    return "\t".join((
        _text(job.job_name), "queued", "0",
        "\\N" if job.max_attempts is None else str(job.max_attempts),
        _text(job.queue), str(job.priority), "f", "\\N", "\\N",
        "\\N" if at is None else str(at),  # as psycopg's text dumper writes it
        _text(job.producer_id if job.producer_id is not None else producer), ""))


def _text(value: str) -> str:
    """``value`` as a field of COPY's text format."""
    return value.translate(_ESCAPES)


def _first_run_per_queue(jobs: list[PreparedJob]) -> tuple[list[str], list[Any]]:
    """Each queue of ``jobs`` with its earliest ``scheduled_at`` (None: one runs at once)."""
    first: dict[str, Any] = {}
    for job in jobs:
        queue, at = job.queue, job.scheduled_at
        if queue not in first:
            first[queue] = at
        elif first[queue] is not None and (at is None or at < first[queue]):
            first[queue] = at
    return list(first), list(first.values())
