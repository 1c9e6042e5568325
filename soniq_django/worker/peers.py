"""What the other workers know, read from their rows: reads only.

- ``knowers``: how many live workers registered a handler for a job name
  and serve its queue (soniq_workers + soniq_task_registry, Soniq's own
  workers included) -- the unknown-job rule of unknown.py asks it.

A worker never counts itself. A database failure raises SoniqError
(``errors.translate``), never a django.db error.
"""

from django.utils import timezone

from ..models import TaskRegistration, Worker, WorkerState
from ..overview import live_window
from ..owned._store import guarded


def knowers(using: str, job_name: str, queue: str, *, exclude: str) -> int:
    """Live workers other than ``exclude`` that registered ``job_name`` and serve ``queue``.

    Live: active, with a heartbeat within the dashboard's live window
    (``overview.live_window``). A worker of every queue registers an empty list.
    """
    heard_after = timezone.now() - live_window()
    with guarded(using, atomic=False):
        live = Worker.objects.using(using).filter(
            status=WorkerState.ACTIVE, last_heartbeat__gte=heard_after,
        ).values_list("id", "queues")
        serving = [str(worker) for worker, queues in live
                   if str(worker) != exclude and (not queues or queue in queues)]
        if not serving:
            return 0
        return TaskRegistration.objects.using(using).filter(
            task_name=job_name, worker_id__in=serving).count()

