"""Deprecated home of ``JobRequest``: it moved to ``soniq_django.producer.request``.

Import it from ``soniq_django`` (``from soniq_django import JobRequest``).
Every name the module had still resolves here, with a ``DeprecationWarning``
naming the new path, for one release; then this module goes.
"""

import warnings
from typing import Any

from .producer import request as _request

#: Where each name went: the one module this alias stands for.
MOVED_TO = "soniq_django.producer.request"


def __getattr__(name: str) -> Any:
    value = getattr(_request, name)  # AttributeError for a name the module never had
    warnings.warn(
        f"soniq_django.job_request is deprecated: import {name} from "
        f"{'soniq_django' if name == 'JobRequest' else MOVED_TO} instead",
        DeprecationWarning, stacklevel=2)
    return value
