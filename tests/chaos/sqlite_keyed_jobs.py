"""The SQLite limits-per-key chaos run's handler (tests/chaos/sqlite_keys.py), loaded by its
workers only (``SONIQ_IMPORTS``).

``chaos.keyed`` as tests/chaos/keyed_jobs.py has it, recording on SQLite: before any
work it inserts its execution into ``chaos_executions`` over its own autocommit
``sqlite3`` connection (one per job thread, separate from Django's, waiting for the
write lock as long as the busy timeout allows, retried), and stamps ``finished_at``
when it returns, however it returns: the interval its key's slot must cover. Times
are the process's UTC clock in Django's SQLite format, as the worker's own writes.
"""

import datetime as dt
import os
import sqlite3
import threading
import time
import uuid

from soniq_django import job
from soniq_django.worker import current_job

from .keys import KEY_TIMEOUT

_local = threading.local()


def stamp() -> str:
    """Now, as Django stores a datetime on SQLite (UTC, microseconds)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def execute_own(sql: str, params: tuple, deadline: float) -> bool:
    """Run one autocommit statement on this thread's own connection, through busy spells."""
    while True:
        try:
            conn = getattr(_local, "conn", None)
            if conn is None:
                conn = _local.conn = sqlite3.connect(
                    os.environ["SONIQ_CHAOS_SQLITE_PATH"], timeout=20, isolation_level=None,
                    check_same_thread=False)
            conn.execute(sql, params)
            return True
        except sqlite3.Error:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


@job(name="chaos.keyed", timeout=KEY_TIMEOUT, concurrency_key="key", key_concurrency=1)
def keyed(n: int, seconds: float, key: str, fail_first: bool = False,
          overrun: bool = False) -> dict:
    context = current_job()
    generation = context.attempts
    exec_id = str(uuid.uuid4())
    if not execute_own("INSERT INTO chaos_executions (exec_id, job_id, attempt, pid, started_at)"
                       " VALUES (?, ?, ?, ?, ?)",
                       (exec_id, str(context.job_id).replace("-", ""), generation, os.getpid(),
                        stamp()), time.monotonic() + 120):
        raise RuntimeError(f"chaos-failure gen={generation}: execution not recorded")
    try:
        if fail_first and generation == 1:
            raise RuntimeError(f"chaos-failure gen={generation} exec={exec_id}")
        time.sleep(KEY_TIMEOUT + 0.5 if overrun and generation == 1 else seconds)
    finally:  # the run's end, however it ends: the key's slot may go after this
        execute_own("UPDATE chaos_executions SET finished_at = ? WHERE exec_id = ?",
                    (stamp(), exec_id), time.monotonic() + 30)
    return {"job": context.job_id, "generation": generation, "exec": exec_id,
            "pid": os.getpid(), "n": n}
