"""The effects scenario's handler: an atomic job whose one database write must land once.

Loaded only by the effects run's processes (``SONIQ_IMPORTS``, set by the
driver), so the plain run never imports it. ``chaos.effect`` is
``@job(atomic=True)``: the worker opens a transaction on the jobs database
before the handler runs, and the job's fenced completion commits in that same
transaction. Each execution:

1. records itself in ``chaos_executions`` over its own autocommit connection,
   exactly as ``chaos.work`` does (tests/chaos/jobs.py), so executions beyond
   one per job are counted whatever becomes of their writes;
2. inserts its effect row into ``chaos_effects`` (job id, the run's
   generation, its execution id, its server backend) through Django's
   connection, inside the job's transaction;
3. notes over its own connection that it wrote the effect, from which
   backend, and how long it will sleep (the driver's SIGSTOP and
   pg_terminate_backend aim with these notes);
4. fails on purpose if it is a flaky job's first attempt -- after writing its
   effect, so that effect must be rolled back;
5. sleeps its 50-500 ms and returns a result naming its job, generation and
   execution.

With ``SONIQ_CHAOS_EFFECTS_CONTROL=1`` the handler is registered *without*
``atomic=True`` (``python -m tests.chaos --effects --control``): its effect
rows then commit on their own, and the checker must find the duplicates and
the rows of refused runs. That is the control that shows the scenario can fail.
"""

import os
import time
import uuid

from django.db import connection

from soniq_django import job
from soniq_django.worker import current_job
from tests.chaos.jobs import _HOST, FINISH_SQL, RECORD_SQL, execute_own

CONTROL = os.environ.get("SONIQ_CHAOS_EFFECTS_CONTROL") == "1"

EFFECT_SQL = ("INSERT INTO chaos_effects (job_id, generation, exec_id, backend_pid) "
              "VALUES (%s, %s, %s, pg_backend_pid()) RETURNING backend_pid")
NOTE_SQL = ("UPDATE chaos_executions SET effect_at = clock_timestamp(), backend_pid = %s, "
            "sleep_until = clock_timestamp() + make_interval(secs => %s) WHERE exec_id = %s")


def _effect(n: int, seconds: float, fail_first: bool = False) -> dict:
    context = current_job()
    generation = context.generation  # the run's claim generation
    exec_id = str(uuid.uuid4())
    recorded = execute_own(RECORD_SQL, {
        "exec": exec_id, "job": context.job_id, "attempt": generation, "pid": os.getpid(),
        "host": _HOST,
    }, time.monotonic() + 120)
    if not recorded:  # never run unrecorded work
        raise RuntimeError(f"chaos-failure gen={generation}: execution not recorded")
    try:
        with connection.cursor() as cursor:
            cursor.execute(EFFECT_SQL, (context.job_id, generation, exec_id))
            backend_pid = cursor.fetchone()[0]
        execute_own(NOTE_SQL, (backend_pid, seconds, exec_id), time.monotonic() + 5)
        if fail_first and generation == 1:
            raise ValueError("the first attempt of this job fails on purpose")
        time.sleep(seconds)
    except Exception as error:
        raise RuntimeError(f"chaos-failure gen={generation} exec={exec_id}") from error
    execute_own(FINISH_SQL, (exec_id,), time.monotonic() + 10)
    return {"job": context.job_id, "generation": generation, "exec": exec_id,
            "pid": os.getpid(), "n": n}


if CONTROL:
    effect = job(_effect, name="chaos.effect")
else:
    effect = job(_effect, name="chaos.effect", atomic=True)
