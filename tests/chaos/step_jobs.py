"""The steps scenario's handler (``python -m tests.chaos --steps``): five durable steps.

``chaos.steps`` records its execution as ``chaos.work`` does (tests/chaos/jobs.py),
then takes five steps, ``current_job().step(f"s{k}", ..., atomic=True)``. Each
step's function:

1. notes the call in ``chaos_step_calls`` over the handler's own autocommit
   connection (counted whatever becomes of the step's transaction);
2. inserts its effect row into ``chaos_step_effects`` (job, step, the run's
   generation, its execution) through Django's connection -- inside the step's
   transaction, whose last statement is the step's fenced record;
3. notes its backend and how long it will sleep (the driver's SIGSTOPs and
   ``pg_terminate_backend`` aim with these: runs stopped or cut inside a
   step, at its COMMIT), then sleeps.

A flaky job (``fail_first``) fails its first attempt after its third step: a
crash between steps. Loaded by the steps run's processes only (``SONIQ_IMPORTS``).
``SONIQ_CHAOS_STEPS_CONTROL=1`` takes the steps without ``atomic=True``
(``--steps --control``): their effects commit on their own, and the checker
(tests/chaos/steps.py) must find the duplicates.
"""

import os
import time
import uuid

from django.db import connection

from soniq_django import job
from soniq_django.worker import current_job
from tests.chaos.effects import NOTE_SQL
from tests.chaos.jobs import _HOST, FINISH_SQL, RECORD_SQL, execute_own

from tests.chaos.steps import STEPS

CONTROL = os.environ.get("SONIQ_CHAOS_STEPS_CONTROL") == "1"

CALL_SQL = ("INSERT INTO chaos_step_calls (job_id, step, generation, exec_id) "
            "VALUES (%s, %s, %s, %s)")
EFFECT_SQL = ("INSERT INTO chaos_step_effects (job_id, step, generation, exec_id, backend_pid) "
              "VALUES (%s, %s, %s, %s, pg_backend_pid()) RETURNING backend_pid")


def _step(k: int, exec_id: str, seconds: float) -> dict:
    context = current_job()
    generation = context.attempts
    if not execute_own(CALL_SQL, (context.job_id, k, generation, exec_id),
                       time.monotonic() + 120):
        raise RuntimeError("the step's call was not noted")  # never run an unnoted step
    with connection.cursor() as cursor:
        cursor.execute(EFFECT_SQL, (context.job_id, k, generation, exec_id))
        backend_pid = cursor.fetchone()[0]
    execute_own(NOTE_SQL, (backend_pid, seconds, exec_id), time.monotonic() + 5)
    time.sleep(seconds)
    return {"k": k, "generation": generation}


@job(name="chaos.steps")
def steps(n: int, seconds: float, fail_first: bool = False) -> dict:
    context = current_job()
    generation = context.attempts
    exec_id = str(uuid.uuid4())
    recorded = execute_own(RECORD_SQL, {
        "exec": exec_id, "job": context.job_id, "attempt": generation, "pid": os.getpid(),
        "host": _HOST,
    }, time.monotonic() + 120)
    if not recorded:
        raise RuntimeError(f"chaos-failure gen={generation}: execution not recorded")
    try:
        for k in range(STEPS):
            context.step(f"s{k}", _step, k, exec_id, seconds / STEPS, atomic=not CONTROL)
            if k == 2 and fail_first and generation == 1:
                raise ValueError("the first attempt of this job fails on purpose")
    except Exception as error:
        raise RuntimeError(f"chaos-failure gen={generation} exec={exec_id}") from error
    execute_own(FINISH_SQL, (exec_id,), time.monotonic() + 10)
    return {"job": context.job_id, "generation": generation, "exec": exec_id,
            "pid": os.getpid(), "n": n}
