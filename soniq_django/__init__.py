"""soniq_django: background jobs in your Django database, Soniq format 1.

The public names are imported lazily so that listing ``soniq_django`` in
``INSTALLED_APPS`` does not import models before the app registry is ready.
Type checkers see them through the ``TYPE_CHECKING`` imports below.
"""

from importlib import import_module
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy names are, for type checkers (the package ships py.typed)
    from .encoding import args_hash
    from .flow import pause_queue, resume_queue
    from .periodic_jobs import periodic
    from .producer.aio import abulk_enqueue, aenqueue, aget_job
    from .producer.api import bulk_enqueue, enqueue, get_job
    from .producer.request import JobRequest
    from .registry import job
    from .waiting import await_job, wait_for_job
    from .workflows import BatchInfo, batch, batch_on_commit, chain, chain_on_commit

__all__ = [
    "BatchInfo", "JobRequest", "abulk_enqueue", "aenqueue", "aget_job", "args_hash",
    "await_job", "batch", "batch_on_commit", "bulk_enqueue", "chain", "chain_on_commit",
    "enqueue", "get_job", "job", "pause_queue", "periodic", "resume_queue", "wait_for_job",
]

_HOMES = {
    "BatchInfo": "soniq_django.workflows",
    "batch": "soniq_django.workflows",
    "batch_on_commit": "soniq_django.workflows",
    "chain": "soniq_django.workflows",
    "chain_on_commit": "soniq_django.workflows",
    "JobRequest": "soniq_django.producer",
    "abulk_enqueue": "soniq_django.producer",
    "aenqueue": "soniq_django.producer",
    "aget_job": "soniq_django.producer",
    "args_hash": "soniq_django.encoding",
    "bulk_enqueue": "soniq_django.producer",
    "enqueue": "soniq_django.producer",
    "get_job": "soniq_django.producer",
    "job": "soniq_django.registry",
    "pause_queue": "soniq_django.flow",
    "periodic": "soniq_django.periodic_jobs",
    "resume_queue": "soniq_django.flow",
    "await_job": "soniq_django.waiting",
    "wait_for_job": "soniq_django.waiting",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'soniq_django' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
