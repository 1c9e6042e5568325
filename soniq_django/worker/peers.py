"""What the other workers know and hold, read from their rows: two questions, reads only.

- ``knowers``: how many live workers registered a handler for a job name
  and serve its queue (soniq_workers joined to soniq_task_registry by
  worker id) -- the unknown-job rule of unknown.py asks it. Soniq's own
  workers register under an id of their own making, not their row's
  (docs/interop.md), so they never count;
- ``held``: how many jobs of some queues other workers' claims hold -- a
  burst worker's last log line says it, and ``--wait-for-leases`` waits
  while any of them is leased.

A worker never counts itself. A database failure raises SoniqError
(``errors.translate``), never a django.db error. Liveness is read by the
database's clock (``overview.live_since``), never this host's: a worker
whose host clock is off takes no live peer for dead, nor the reverse.
Both run on the connection the caller gives them (``connections[using]``
of its thread): the worker's calls are turns on its shared connection.
"""

from dataclasses import dataclass

from django.db.models import Count, Q

from ..models import Job, JobStatus, TaskRegistration, Worker, WorkerState
from ..overview import live_since
from ..owned._store import guarded


@dataclass(frozen=True)
class Held:
    """Processing jobs of some queues that other workers' claims hold."""

    jobs: int
    leased: int
    """Those under a lease: they end when their worker settles them or the lease lapses.

    The rest were claimed without one (Soniq's own workers): nothing here can end them.
    """


def knowers(using: str, job_name: str, queue: str, *, exclude: str) -> int:
    """Live workers other than ``exclude`` that registered ``job_name`` and serve ``queue``.

    Live: active, with a heartbeat within the dashboard's live window
    (``overview.live_window``) by the database's clock. A worker of every
    queue registers an empty list.
    """
    with guarded(using, atomic=False):
        live = Worker.objects.using(using).filter(
            status=WorkerState.ACTIVE, last_heartbeat__gte=live_since(using),
        ).values_list("id", "queues")
        serving = [str(worker) for worker, queues in live
                   if str(worker) != exclude and (not queues or queue in queues)]
        if not serving:
            return 0
        count: int = TaskRegistration.objects.using(using).filter(
            task_name=job_name, worker_id__in=serving).count()
        return count


def held(using: str, worker_id: str, queues: list[str] | None) -> Held:
    """The processing jobs of ``queues`` (None: every queue) not claimed by ``worker_id``."""
    rows = Job.objects.using(using).filter(status=JobStatus.PROCESSING).exclude(
        claim_owner=worker_id)
    if queues is not None:
        rows = rows.filter(queue__in=queues)
    with guarded(using, atomic=False):
        counts = rows.aggregate(
            jobs=Count("id"), leased=Count("id", filter=Q(lease_expires_at__isnull=False)))
    return Held(jobs=counts["jobs"], leased=counts["leased"])

