"""The soniq_django worker (``manage.py soniq_worker``) and what handlers can ask of it.

The worker is built from parts (loop.py says which thread writes what):
``planner`` decides each round, the ``completer`` owns every final write
(inline or batched), ``writes`` makes the fenced calls (one claim path),
``heartbeat`` renews leases, ``wakeup`` listens, ``flight`` and
``capacity`` keep the running jobs, slots and ``max_jobs``, and
``execution`` runs a handler without touching the database.
"""

from .context import JobContext, current_job
from .loop import Worker

__all__ = ["JobContext", "Worker", "current_job"]
