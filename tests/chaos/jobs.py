"""The chaos run's handler, autodiscovered in worker processes (tests.chaos.settings).

Before any work it records its execution in ``chaos_executions`` over its own
autocommit connection (one per job thread, separate from Django's), retrying
through database restarts: the record exists even if the job's completion is
later lost. That connection goes to ``SONIQ_CHAOS_RECORD_URL`` when set (the
run through PgBouncer records straight to the server: the instrument does
not go through what it tests), else to the worker's database. It records
the generation of its claim twice: the context's ``attempts`` (every claim
raises attempts and generation by one, and chaos jobs start at 0, so the two
are equal -- the checker verifies that on every row) and the row's
``claim_generation`` as read by job id at that moment.

Then it does its "work" -- touches Django's connection like a real handler
(which fails while the database is down, and the failure is the attempt's)
and sleeps -- and returns a result naming its job, generation and execution.
A handler failure raises ``chaos-failure gen=<generation>`` so the failure's
write names its generation too.

It notes on its execution row the backend of Django's connection and until
when it sleeps (how the driver aims ``pg_terminate_backend`` at a job
connection mid-run or at its completion). In the workflows scenario
(tests/chaos/workflows.py) a job with ``fail_always`` fails every attempt,
and a batch's callback (``callback=True``) reads ``current_job().batch()``
and returns how many members it saw and how many of them unfinished.
"""

import os
import socket
import threading
import time
import uuid

import psycopg

from soniq_django import job
from soniq_django.worker import current_job

#: The recording connections' application_name: the driver never terminates them.
RECORDER_NAME = "soniq-chaos-recorder"

_local = threading.local()
_HOST = socket.gethostname()[:255]

RECORD_SQL = """
INSERT INTO chaos_executions (exec_id, job_id, attempt, pid, worker_id, row_generation,
                              row_owner, row_status, row_lease, started_at)
SELECT %(exec)s, %(job)s, %(attempt)s, %(pid)s,
       (SELECT w.id::text FROM soniq_workers AS w
         WHERE w.pid = %(pid)s AND w.hostname = %(host)s
         ORDER BY w.started_at DESC LIMIT 1),
       j.claim_generation, j.claim_owner, j.status, j.lease_expires_at, clock_timestamp()
  FROM (SELECT 1) AS one LEFT JOIN soniq_jobs AS j ON j.id = %(job)s
ON CONFLICT (exec_id) DO NOTHING
"""
FINISH_SQL = "UPDATE chaos_executions SET finished_at = clock_timestamp() WHERE exec_id = %s"
NOTE_SQL = ("UPDATE chaos_executions SET backend_pid = %s, "
            "sleep_until = clock_timestamp() + make_interval(secs => %s) WHERE exec_id = %s")
FINISHED = ("done", "cancelled", "dead_letter")


def execute_own(sql: str, params, deadline: float) -> bool:
    """Run one autocommit statement on this thread's own connection, through outages."""
    delay = 0.05
    while True:
        try:
            conn = getattr(_local, "conn", None)
            if conn is None or conn.closed:
                url = (os.environ.get("SONIQ_CHAOS_RECORD_URL")
                       or os.environ["SONIQ_WORKER_DATABASE_URL"])
                conn = _local.conn = psycopg.connect(url, autocommit=True, connect_timeout=3,
                                                     application_name=RECORDER_NAME)
            conn.execute(sql, params)
            return True
        except psycopg.Error:
            conn = getattr(_local, "conn", None)
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass
            _local.conn = None
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


@job(name="chaos.work")
def work(n: int, seconds: float, fail_first: bool = False, fail_always: bool = False,
         callback: bool = False) -> dict:
    context = current_job()
    generation = context.attempts
    exec_id = str(uuid.uuid4())
    recorded = execute_own(RECORD_SQL, {
        "exec": exec_id, "job": context.job_id, "attempt": generation, "pid": os.getpid(),
        "host": _HOST,
    }, time.monotonic() + 120)
    if not recorded:  # never run unrecorded work
        raise RuntimeError(f"chaos-failure gen={generation}: execution not recorded")
    try:
        if fail_first and generation == 1:
            raise ValueError("the first attempt of this job fails on purpose")
        if fail_always:
            raise ValueError("this job fails every attempt on purpose")
        from django.db import connection

        with connection.cursor() as cursor:  # a real handler's query
            cursor.execute("SELECT pg_backend_pid()")
            backend_pid = cursor.fetchone()[0]
        execute_own(NOTE_SQL, (backend_pid, seconds, exec_id), time.monotonic() + 5)
        seen = None
        if callback:
            members = context.batch() or []
            seen = {"members": len(members),
                    "members_unfinished": sum(1 for m in members if m.status not in FINISHED)}
        time.sleep(seconds)
    except Exception as error:
        raise RuntimeError(f"chaos-failure gen={generation} exec={exec_id}") from error
    execute_own(FINISH_SQL, (exec_id,), time.monotonic() + 10)
    return {"job": context.job_id, "generation": generation, "exec": exec_id,
            "pid": os.getpid(), "n": n, **(seen or {})}
