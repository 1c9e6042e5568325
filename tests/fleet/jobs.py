"""The Python side of the fleet tests: fleet.effect, the twin of the Node worker's handler.

Loaded by the Python worker processes of tests/fleet (``SONIQ_IMPORTS``).
``@job(atomic=True)``: its effect row commits with its fenced completion, or
not at all, as the Node worker's transactional handler does
(tests/fleet/node_handlers.js). It knows nothing of ``fleet.node_only``.
"""

import time

from django.db import connection

from soniq_django import job
from soniq_django.worker import current_job


@job(name="fleet.effect", atomic=True)
def effect(ms: int = 0) -> dict:
    context = current_job()
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO fleet_effects (job_id, generation, runner) "
                       "VALUES (%s, %s, 'python')", [context.job_id, context.generation])
    time.sleep(ms / 1000)
    return {"by": "python", "generation": context.generation}
