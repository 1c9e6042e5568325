"""The worker's own row in soniq_workers, and the task registry it publishes."""

import os
import socket
import uuid

from django.utils import timezone

from ..models import TaskRegistration, Worker, WorkerState
from ..registry import registered_handlers


def register(using: str, worker_id: str, queues: list[str] | None, concurrency: int) -> None:
    """Insert (or revive) this worker's row as running."""
    Worker.objects.using(using).update_or_create(
        id=uuid.UUID(worker_id),
        defaults={
            "hostname": socket.gethostname()[:255], "pid": os.getpid(), "queues": queues,
            "concurrency": concurrency, "status": WorkerState.RUNNING,
            "started_at": timezone.now(), "last_heartbeat_at": timezone.now(),
            "stopped_at": None,
        },
    )


def beat(using: str, worker_id: str, state: str = WorkerState.RUNNING) -> None:
    """Record that the worker is alive (and whether it is draining)."""
    Worker.objects.using(using).filter(id=uuid.UUID(worker_id)).update(
        last_heartbeat_at=timezone.now(), status=state
    )


def unregister(using: str, worker_id: str) -> None:
    """Mark the worker stopped."""
    Worker.objects.using(using).filter(id=uuid.UUID(worker_id)).update(
        status=WorkerState.STOPPED, stopped_at=timezone.now(), last_heartbeat_at=timezone.now()
    )


def publish_registry(using: str) -> None:
    """Write every handler this process knows to soniq_task_registry."""
    for name, handler in registered_handlers().items():
        TaskRegistration.objects.using(using).update_or_create(
            job_name=name,
            defaults={
                "queue": handler.queue or "default",
                "max_attempts": handler.max_attempts,
                "unique_job": handler.unique,
                "args_model_repr": f"{handler.__qualname__}{handler.signature}"[:2000],
                "updated_at": timezone.now(),
            },
        )
