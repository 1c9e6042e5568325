"""The owned, fenced queue: every claim carries a fence that every later write must present.

Public names (SPEC §5): ``OwnedJobSource``, ``JobRequest``, ``ClaimedJob``,
``QueueClaimFence``, ``OwnedJobState``. The modules behind them:

- ``source``: ``OwnedJobSource``, the methods and their async twins;
- ``types``: the frozen values (fence, claimed job, state snapshot) and
  their validation bounds;
- ``_submit`` (private): owned submissions, their fingerprint and replay;
- ``_store`` (private): where owned operations touch the database, one
  class per backend (the PostgreSQL claim-protocol functions, and their
  SQLite twin under a write lock).

Names are imported lazily, so importing ``soniq_django.owned.types`` (or
this package) never loads the models before the app registry is ready.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers
    from ..producer.request import JobRequest
    from .source import OwnedJobSource
    from .types import ClaimedJob, OwnedJobState, QueueClaimFence

__all__ = ["ClaimedJob", "JobRequest", "OwnedJobSource", "OwnedJobState", "QueueClaimFence"]

_HOMES = {
    "ClaimedJob": "soniq_django.owned.types",
    "JobRequest": "soniq_django.producer.request",
    "OwnedJobSource": "soniq_django.owned.source",
    "OwnedJobState": "soniq_django.owned.types",
    "QueueClaimFence": "soniq_django.owned.types",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'soniq_django.owned' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
