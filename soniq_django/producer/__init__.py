"""Producers: what a caller asks to enqueue, and the Python twins of the SQL API.

- ``request``: ``JobRequest`` and its validation (the same rules and codes
  as ``soniq_enqueue``), ``prepare()`` into a ``PreparedJob``;
- ``api``: ``enqueue``, ``bulk_enqueue``, ``get_job`` and ``JobInfo``;
- ``aio``: their async twins ``aenqueue``, ``abulk_enqueue``, ``aget_job``;
- ``_pg`` (private): the calls to the PostgreSQL producer functions (their
  errors go through ``errors.translate``, as every database error does).

Names are imported lazily (see ``soniq_django/__init__.py``).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers
    from .aio import abulk_enqueue, aenqueue, aget_job
    from .api import JobInfo, bulk_enqueue, enqueue, get_job
    from .request import JobRequest

__all__ = [
    "JobInfo", "JobRequest", "abulk_enqueue", "aenqueue", "aget_job", "bulk_enqueue", "enqueue",
    "get_job",
]

_HOMES = {
    "JobInfo": "soniq_django.producer.api",
    "JobRequest": "soniq_django.producer.request",
    "abulk_enqueue": "soniq_django.producer.aio",
    "aenqueue": "soniq_django.producer.aio",
    "aget_job": "soniq_django.producer.aio",
    "bulk_enqueue": "soniq_django.producer.api",
    "enqueue": "soniq_django.producer.api",
    "get_job": "soniq_django.producer.api",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'soniq_django.producer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
