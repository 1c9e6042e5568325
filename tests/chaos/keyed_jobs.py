"""The limits-per-key chaos run's handler (tests/chaos/keys.py), loaded by its workers only.

``chaos.keyed`` records its execution before any work, as ``chaos.work`` does
(tests/chaos/jobs.py), and stamps ``finished_at`` when it returns, however it
returns: the interval its key's slot must cover.
"""

import os
import socket
import time
import uuid

from soniq_django import job
from soniq_django.worker import current_job

from .jobs import RECORD_SQL, execute_own
from .keys import KEY_TIMEOUT

END_SQL = "UPDATE chaos_executions SET finished_at = clock_timestamp() WHERE exec_id = %s"
_HOST = socket.gethostname()[:255]


@job(name="chaos.keyed", timeout=KEY_TIMEOUT, concurrency_key="key", key_concurrency=1)
def keyed(n: int, seconds: float, key: str, fail_first: bool = False,
          overrun: bool = False) -> dict:
    context = current_job()
    generation = context.attempts
    exec_id = str(uuid.uuid4())
    if not execute_own(RECORD_SQL, {"exec": exec_id, "job": context.job_id,
                                    "attempt": generation, "pid": os.getpid(), "host": _HOST},
                       time.monotonic() + 120):
        raise RuntimeError(f"chaos-failure gen={generation}: execution not recorded")
    try:
        if fail_first and generation == 1:
            raise RuntimeError(f"chaos-failure gen={generation} exec={exec_id}")
        time.sleep(KEY_TIMEOUT + 0.5 if overrun and generation == 1 else seconds)
    finally:  # the run's end, however it ends: the key's slot may go after this
        execute_own(END_SQL, (exec_id,), time.monotonic() + 10)
    return {"job": context.job_id, "generation": generation, "exec": exec_id,
            "pid": os.getpid(), "n": n}
